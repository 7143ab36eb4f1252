"""A small but real run directory for the report tests (and docs/img/report_heatmap.png).

Episodes are real: built-in tasks run through `terminal_rsi.agent.harness.run_episode` on the
local sandbox backend with the reference policy and a partly-wrong scripted policy (a
malformed reply, a command whose output is hostile HTML, a wrong answer). Credit arrays are
real: `pack_trajectories` + `tb_gae` on a seeded value array, saved per the C2 contract.
The ledger follows C5 (a done base stage without credit, a done RPR stage with step, eval and
validation shards, a failed and a pending stage); the two done stages carry the model
selection record (`validation`: the base, and an RPR stage whose actor was rejected) and
`eval_wall_s`, the other two do not (as in ledgers written before model selection).
"""

from __future__ import annotations

import json
import os
import pathlib

import numpy as np

from terminal_rsi.agent import HarnessConfig, ReferencePolicy, ScriptedPolicy, write_shard
from terminal_rsi.agent.harness import run_episode
from terminal_rsi.agent.packing import pack_trajectories
from terminal_rsi.credit import tb_gae
from terminal_rsi.models.sampling import Buckets
from terminal_rsi.models.tokenizer import ByteTokenizer
from terminal_rsi.rewards import EpisodeScorer
from terminal_rsi.tasks import get_suite

TOK = ByteTokenizer()
BUCKETS = Buckets(prefill_chunk=64, cache_multiple=64, batch_multiple=1, power_of_two=False)
HOSTILE = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>'
GAMMA_TURN, LAMBDA_TURN = 0.9, 0.8


def _task(family: str, seed: int = 0):
    return next(iter(get_suite("builtin", "train", families=[family], n_per_family=1,
                               start_seed=seed)))


def wrong_policy(task):
    """Turn 0: not JSON; turn 1: prints hostile HTML; turn 2: a wrong final step."""

    def script(r):
        if r.purpose == "summary":
            return "Summary: nothing useful yet."
        if r.turn == 0:
            return "I think I should <b>look</b> around first & then act."
        if r.turn == 1:
            return json.dumps({"analysis": "probe", "commands": [
                {"keystrokes": f"printf '%s\\n' '{HOSTILE}'", "timeout": 10}]})
        return json.dumps({"analysis": "guess", "commands": [
            {"keystrokes": "echo wrong > answer.txt", "timeout": 10}], "task_complete": True})

    return ScriptedPolicy(TOK, script)


def run_episodes() -> list:
    """Six real episodes over three families: the reference policy (S = 1), the wrong policy
    (hint_lookup: cut by max_turns; fix_script: declares completion with P = 1 of 4), and a
    summarized reference episode (two segments, so two credit rows)."""
    h = HarnessConfig(max_turns=4)
    out = []
    for fam in ("create_file", "hint_lookup", "fix_script"):
        task = _task(fam)
        out.append(run_episode(task, ReferencePolicy(TOK), harness=h))
        if fam != "create_file":
            turns = 2 if fam == "hint_lookup" else 3  # hint_lookup: cut by max_turns
            out.append(run_episode(task, wrong_policy(task),
                                   harness=HarnessConfig(max_turns=turns)))
    # a summarized episode: two segments, so two credit rows for one episode
    out.append(run_episode(_task("hint_lookup", 1), ReferencePolicy(TOK),
                           harness=HarnessConfig(max_turns=4, summarize_threshold=50)))
    score = EpisodeScorer("fdr")  # what an RPR phase with default divisors would give
    for i, t in enumerate(out):
        score(t)
        t.episode_id = f"ep{i}"
    return out


def without_checks(traj):
    """A copy without meta["checks"] (trajectories written before the harness recorded
    per-check outcomes: the page falls back to the report's counts)."""
    from terminal_rsi.agent import Trajectory

    d = traj.to_dict()
    d["meta"] = {k: v for k, v in d["meta"].items() if k != "checks"}
    return Trajectory.from_dict(d)


def credit_arrays(trajs, seed: int = 0) -> dict[str, np.ndarray]:
    """C2 credit arrays: packed rows, seeded critic values, TB-GAE advantages and returns;
    `row_episode` indexes the shard's trajectories (packing's kept index mapped back)."""
    packed = pack_trajectories(trajs, buckets=BUCKETS)
    rng = np.random.default_rng(seed)
    values = np.cumsum(rng.normal(size=packed.tokens.shape) * 0.04, axis=1).astype(np.float32)
    values = np.where(packed.segment_ids > 0, values, 0.0).astype(np.float32)
    adv, ret, _ = tb_gae(packed.rewards, values, packed.turn_ids, packed.gen_mask,
                         packed.dones, gamma_turn=GAMMA_TURN, lambda_turn=LAMBDA_TURN)
    kept = np.asarray(packed.kept + [-1], np.int32)
    row_episode = np.where(packed.row_episode >= 0, kept[packed.row_episode], -1)
    return {"row_episode": row_episode.astype(np.int32),
            "row_segment": packed.row_segment.astype(np.int32),
            "tokens": packed.tokens, "gen_mask": packed.gen_mask, "turn_ids": packed.turn_ids,
            "values": values, "advantages": np.asarray(adv, np.float32),
            "returns": np.asarray(ret, np.float32), "rewards": packed.rewards,
            "dones": packed.dones}


def _json(path: pathlib.Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1))


def _png(path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([0, 1, 2], [0.1, 0.4, 0.5])
    ax.set_title("critic EV (fixture)")
    fig.savefig(path)
    plt.close(fig)


def build_run(root: str | os.PathLike, trajs=None) -> dict:
    """Write the run dir under `root`; returns {"run": path, "trajs": ..., "credit": ...}."""
    run = pathlib.Path(root)
    trajs = run_episodes() if trajs is None else trajs
    tiny = {"preset": "tiny"}
    _json(run / "config.json", {"experiment": "pipeline", "seed": 0, "model": "tiny"})
    # stage 1: base_sft, discovery shard, no credit
    base = run / "base_sft"
    _json(base / "config.json", {"experiment": "base_sft", "seed": 0, "model": tiny})
    write_shard(base / "trajectories" / "discovery.jsonl", [without_checks(t) for t in trajs[:2]])
    (base / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "loss": 2.0 / s, "accuracy": 0.1 * s}) + "\n"
        for s in range(1, 6)))
    _json(base / "summary.json", {"episodes": 2})
    # stage 2: rpr1_fdr, a training step shard with credit, an eval shard
    rpr = run / "rpr1_fdr"
    _json(rpr / "config.json", {"experiment": "rpr_phase", "seed": 0, "model": tiny,
                                "rewards": {"fn": "fdr", "divisors_path": None}})
    write_shard(rpr / "trajectories" / "step_00001.jsonl", trajs)
    credit = credit_arrays(trajs)
    np.savez(rpr / "trajectories" / "step_00001.credit.npz", **credit)
    write_shard(rpr / "eval" / "heldout_instances.jsonl", trajs[1:3])
    write_shard(rpr / "validation" / "validation.jsonl", trajs[3:5])
    _json(rpr / "summary.json", {"episodes": 6, "per_family": {"fix_script": 0.5}})
    (rpr / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "reward_binary": 0.2 * s, "reward_dense": 0.3 * s,
                    "value_ev_pre_update": None if s == 1 else 0.1 * s,
                    "critic/loss": 1.0 / s}) + "\n" for s in range(1, 4)))
    _png(run / "plots" / "critic_ev.png")
    eval_suite = {
        "k": 1, "num_tasks": 2, "mean_at_k": 0.5, "pass_at_k": {"1": 0.5},
        "process_reward": 0.4, "explained_variance": None,
        "per_family": {"hint_lookup": {"n": 2, "success": 0.5, "mean_p_over_n": 0.75,
                                       "fdr": 0.5, "spr": 0.9}},
        "strata": {"Q1": {"n": 2, "success": 0.5}},
        "trajectories": "rpr1_fdr/eval/heldout_instances.jsonl"}
    ledger = {
        "format": "terminal_rsi.ledger/1", "run": str(run.resolve()),
        "updated": "2026-11-30T02:00:00Z", "stages": _stages(eval_suite),
        "plots": {"critic_ev": "plots/critic_ev.png", "reward_profile": "plots/absent.png"}}
    (run / "rpr2_spr").mkdir()
    (run / "rpr2_spr" / "error.txt").write_text("Traceback (most recent call last):\n"
                                                 "PhaseError: <b>no trainable episodes</b>\n")
    _json(run / "ledger.json", ledger)
    return {"run": run, "trajs": trajs, "credit": credit}


REJECTED = ("validation Mean@1 0.250 does not beat its input base_sft (0.500); base_sft's "
            "actor handed on unchanged")


def _validation(decision, score, source, source_score, chosen, reason, **extra):
    return {"metric": "mean_at_k", "k": 1, "num_tasks": 4, "score": score, "input": source,
            "input_score": source_score, "decision": decision, "chosen": chosen,
            "chosen_score": source_score if decision == "input" else score, "reason": reason,
            "per_family": {"create_file": 1.0, "hint_lookup": score}, **extra}


# the ledger's training diagnostics (terminal_rsi.pipeline.diagnostics) of the two done stages
BASE_DIAGNOSTICS = {"mean/actor/grad_norm": 0.8, "per_family": {
    "heldout_instances": {"hint_lookup": {"before": None, "after": 0.25}}}}
RPR_DIAGNOSTICS = {
    "mean/turns": 2.5, "joint_steps": 2, "mean/actor/clip_frac": 0.05,
    "last/actor/clip_frac": 0.125, "mean/actor/approx_kl": 2e-4, "last/actor/approx_kl": 3e-4,
    "mean/actor/grad_norm": 1.25, "mean/critic/grad_norm": 4.0,
    "mean/value_ev_pre_update": 0.2, "last/value_ev_pre_update": 0.3,
    "policy_movement": 0.0625, "probe_sequences": 4, "probe_tokens": 40,
    "per_family": {"heldout_instances": {"hint_lookup": {"before": 0.25, "after": 0.5},
                                         "fix_script": {"before": 1.0, "after": None}}}}


def _stages(eval_suite: dict) -> list[dict]:
    """The ledger's stages: base_sft and rpr1_fdr done (with validation records and
    eval_wall_s), rpr2_spr failed, final_eval pending (neither has the newer keys)."""
    base_eval = {"k": 1, "num_tasks": 2, "mean_at_k": 0.25, "pass_at_k": {"1": 0.25},
                 "explained_variance": 0.0}
    families = {"k": 1, "num_tasks": 1, "mean_at_k": 0.0, "pass_at_k": {"1": 0.0},
                "explained_variance": None}
    return [
        {"name": "base_sft", "experiment": "base_sft", "status": "done", "dir": "base_sft",
         "inputs": {}, "outputs": {"export": "base_sft/export"}, "config_hash": "ab" * 32,
         "started": "2026-11-30T01:00:00Z", "finished": "2026-11-30T01:10:00Z",
         "wall_s": 600.0, "train": {"loss": 0.4}, "eval": {"heldout_instances": base_eval},
         "eval_wall_s": 30.0, "error": None, "diagnostics": BASE_DIAGNOSTICS,
         "validation": _validation("base", 0.5, None, None, "base_sft",
                                   "the base: validation Mean@1 0.500", wall_s=12.0)},
        {"name": "rpr1_fdr", "experiment": "rpr_phase", "status": "done", "dir": "rpr1_fdr",
         "inputs": {"actor": "base_sft/export"}, "outputs": {"export": "rpr1_fdr/export"},
         "config_hash": "cd" * 32, "started": "2026-11-30T01:10:00Z",
         "finished": "2026-11-30T01:30:00Z", "wall_s": 1200.0,
         "train": {"reward_binary": 0.6, "explained_variance": 0.3, "final/actor/kl_ref": 2e-5,
                   "raw_counter": 7},
         "eval": {"heldout_instances": {**eval_suite, "explained_variance": 0.42},
                  "heldout_families": families},
         "eval_wall_s": 45.0, "error": None, "diagnostics": RPR_DIAGNOSTICS,
         "validation": _validation("input", 0.25, "base_sft", 0.5, "base_sft", REJECTED,
                                   wall_s=20.0,
                                   trajectories="rpr1_fdr/validation/validation.jsonl")},
        {"name": "rpr2_spr", "experiment": "rpr_phase", "status": "failed",
         "dir": "rpr2_spr", "inputs": {"actor": "rpr1_fdr/export"},
         "error": "PhaseError: <b>no trainable episodes</b>"},
        {"name": "final_eval", "experiment": "evaluate", "status": "pending",
         "dir": "final_eval"}]


def expected_spans(traj, credit, row):
    """Independent of the report code: where each turn's sampled ids lie in a credit row,
    from the trajectory's linear history (`prompt_at`), and the values found there."""
    seg = int(credit["row_segment"][row])
    out = []
    for t in traj.segment_turns(seg):
        start = len(traj.prompt_at(t))
        n = len(traj.turns[t].sampled_ids)
        out.append({"turn": t, "start": start, "n": n,
                    "adv": credit["advantages"][row, start:start + n].tolist(),
                    "val": credit["values"][row, start:start + n].tolist(),
                    "obs": len(traj.turns[t].observation_ids)})
    return out
