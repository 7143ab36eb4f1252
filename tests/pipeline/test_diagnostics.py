"""The per-stage training diagnostics of the ledger (issue 51): aggregation from a synthetic
`metrics.jsonl` (RPR: critic-only and joint steps; SFT) and synthetic RSR shards,
per-family before/after, the probe's tasks, and the ledger's check of the field. Expected
values are written out by hand."""

import json
import os
from types import SimpleNamespace

import pytest

from terminal_rsi.agent import write_shard
from terminal_rsi.agent.trajectory import TerminalReason, Trajectory, Turn
from terminal_rsi.config.configuration import build
from terminal_rsi.evaluation.config import EvalConfig
from terminal_rsi.pipeline import diagnostics as Dg
from terminal_rsi.pipeline import ledger as L
from terminal_rsi.pipeline.runner import Pipeline
from terminal_rsi.tasks import get_suite
from tests.pipeline.helpers import small_config

# two critic-only steps, then three joint ones (the last without an EV: None in the file)
RPR_ROWS = [
    {"step": 1, "critic_only": True, "turns": 2.0, "critic/grad_norm": 1.0,
     "value_ev_pre_update": 0.1},
    {"step": 2, "critic_only": True, "turns": 4.0, "critic/grad_norm": 3.0,
     "value_ev_pre_update": 0.3},
    {"step": 3, "critic_only": False, "turns": 3.0, "critic/grad_norm": 2.0,
     "value_ev_pre_update": 0.5, "actor/clip_frac_low": 0.01, "actor/clip_frac_high": 0.03,
     "actor/approx_kl": 0.002, "actor/grad_norm": 0.5},
    {"step": 4, "critic_only": False, "turns": 3.0, "critic/grad_norm": 2.0,
     "value_ev_pre_update": 0.6, "actor/clip_frac_low": 0.0, "actor/clip_frac_high": 0.1,
     "actor/approx_kl": 0.004, "actor/grad_norm": 1.5},
    {"step": 5, "critic_only": False, "turns": 1.0, "critic/grad_norm": 2.0,
     "value_ev_pre_update": None, "actor/clip_frac_low": 0.2, "actor/clip_frac_high": 0.0,
     "actor/approx_kl": 0.009, "actor/grad_norm": 1.0},
]


def _write_rows(d, rows):
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))


def _episode(n_turns, family="f"):
    return Trajectory(f"t{n_turns}", family, "H0", 0, terminal_reason=TerminalReason.MAX_TURNS,
                      turns=[Turn([1], [2], [0.0]) for _ in range(n_turns)])


def test_rpr_diagnostics_from_metrics(tmp_path):
    _write_rows(tmp_path, RPR_ROWS)
    got = Dg.training_diagnostics(str(tmp_path), "rpr_phase")
    assert got == pytest.approx({
        "mean/turns": 13 / 5, "joint_steps": 3,
        "mean/actor/clip_frac": (0.04 + 0.1 + 0.2) / 3, "last/actor/clip_frac": 0.2,
        "mean/actor/approx_kl": 0.015 / 3, "last/actor/approx_kl": 0.009,
        "mean/actor/grad_norm": 1.0, "mean/critic/grad_norm": 2.0,
        "mean/value_ev_pre_update": 1.5 / 4, "last/value_ev_pre_update": 0.6})


def test_a_critic_warmup_has_no_actor_numbers():
    got = Dg.rpr_diagnostics(RPR_ROWS[:2])
    assert got == pytest.approx({"mean/turns": 3.0, "joint_steps": 0,
                                 "mean/critic/grad_norm": 2.0,
                                 "mean/value_ev_pre_update": 0.2,
                                 "last/value_ev_pre_update": 0.3})


def test_rsr_diagnostics_from_its_episodes_and_sft_steps(tmp_path):
    _write_rows(tmp_path, [{"step": k, "loss": 1.0, "grad_norm": g}
                           for k, g in ((1, 2.0), (2, 4.0))])
    write_shard(tmp_path / "trajectories" / "discovery.jsonl",
                [_episode(1), _episode(2), _episode(3)])
    write_shard(tmp_path / "trajectories" / "fresh.jsonl", [_episode(6)])
    got = Dg.training_diagnostics(str(tmp_path), "rsr")
    assert got == pytest.approx({"mean/actor/grad_norm": 3.0, "mean/turns": 3.0,
                                 "mean/discovery/turns": 2.0, "mean/fresh/turns": 6.0})


def test_a_stage_that_took_no_step_has_no_gradient_norm(tmp_path):
    _write_rows(tmp_path, [{"step": 0, "skipped": "empty Q_clean"}])
    assert Dg.training_diagnostics(str(tmp_path), "rsr") == {}
    assert Dg.training_diagnostics(str(tmp_path / "absent"), "base_sft") == {}


def test_per_family_before_and_after():
    before = {"heldout_instances": {"per_family": {"a": {"success": 0.25},
                                                   "b": {"success": 1.0}}}}
    after = {"heldout_instances": {"per_family": {"a": {"success": 0.5},
                                                  "c": {"success": 0.0}}},
             "heldout_families": {"per_family": {"z": {"success": 0.75}}},
             "critic_only": {"explained_variance": 0.3}}  # no per-family results
    assert Dg.family_change(before, after) == {
        "heldout_instances": {"a": {"before": 0.25, "after": 0.5},
                              "c": {"before": None, "after": 0.0}},
        "heldout_families": {"z": {"before": None, "after": 0.75}}}
    assert Dg.family_change(None, after)["heldout_instances"]["a"] == {"before": None,
                                                                       "after": 0.5}


def test_probe_tasks_are_spread_over_families():
    tasks = [SimpleNamespace(family=f, id=f"{f}{i}") for f in "abc" for i in range(3)]
    assert [t.id for t in Dg.spread(tasks, 5)] == ["a0", "b0", "c0", "a1", "b1"]
    assert len(Dg.spread(tasks, 100)) == 9


def test_probe_tasks_are_validation_instances_of_the_training_families(tmp_path):
    cfg = build(EvalConfig, Pipeline(small_config(), str(tmp_path)).eval_base_config())
    fams = cfg.tasks.families
    tasks = Dg.probe_tasks(cfg, validation_split=True)
    assert len(tasks) == min(Dg.PROBE_SIZE, Dg.PROBE_PER_FAMILY * len(fams)) > 0
    assert [t.family for t in tasks[:len(fams)]] == list(fams)  # round-robin
    validation = get_suite(cfg.tasks.suite, "validation", n_per_family=Dg.PROBE_PER_FAMILY,
                           families=fams)
    assert {t.id for t in tasks} == {t.id for t in validation}


def _ledger(tmp_path, diagnostics):
    led = L.Ledger(str(tmp_path), [("rpr1_fdr", "rpr_phase")])
    d = led.to_dict()
    d["stages"][0].update(status="done", diagnostics=diagnostics)
    return d


def test_ledger_accepts_diagnostics(tmp_path):
    L.validate_ledger(_ledger(tmp_path, {
        "mean/turns": 2.5, "joint_steps": 3, "last/value_ev_pre_update": None,
        "per_family": {"heldout_instances": {"a": {"before": None, "after": 0.5}}}}))
    L.validate_ledger(_ledger(tmp_path, {}))
    old = _ledger(tmp_path, {})
    del old["stages"][0]["diagnostics"]  # a ledger written before diagnostics existed
    L.validate_ledger(old)


@pytest.mark.parametrize("diagnostics,match", [
    ("high", r"diagnostics = 'high' has type str"),
    ({"mean/turns": "many"}, r"diagnostics\['mean/turns'\] = 'many' is not a number"),
    ({"joint_steps": True}, r"diagnostics\['joint_steps'\] = True is not a number"),
    ({"per_family": [1]}, r"diagnostics\['per_family'\] = \[1\] is not a dict"),
    ({"per_family": {"s": 0.5}}, r"diagnostics\['per_family'\]\['s'\] = 0.5 is not a dict"),
    ({"per_family": {"s": {"a": {"after": 0.5}}}},
     r"diagnostics\['per_family'\]\['s'\]\['a'\] = \{'after': 0.5\}; expected"),
    ({"per_family": {"s": {"a": {"before": "x", "after": 0.5}}}},
     r"diagnostics\['per_family'\]\['s'\]\['a'\]"),
])
def test_ledger_rejects_malformed_diagnostics(tmp_path, diagnostics, match):
    with pytest.raises(L.LedgerError, match=r"stage 'rpr1_fdr'.*" + match):
        L.validate_ledger(_ledger(tmp_path, diagnostics))
