"""RPR phase loop end to end on built-in tasks with a tiny model: metrics and checkpoints,
bit-identical actor during critic warm-up, resume from an interrupted run."""

import json
import os

import jax
import numpy as np
import pytest

from configs.rpr_phase import get_config
from terminal_rsi.configuration import validate_config
from terminal_rsi.rpr import SCHEMA, run_phase

# module-scoped fixtures are expensive: keep this module on one xdist worker
pytestmark = pytest.mark.xdist_group("rpr_phase")


def _config():
    c = get_config()
    c.num_steps = 3
    c.model.d_model, c.model.d_ff, c.model.max_seq_len = 16, 32, 2048
    c.model.head_dim = 8
    c.tasks.families = ("create_file", "count_lines")
    c.harness.max_output_tokens = 8
    c.rollout.batch_size = c.rollout.concurrency = 2
    c.ppo.critic_warmup_steps = 2
    c.eval.every, c.eval.num_tasks = 3, 2
    c.checkpoint.every = 1
    validate_config(c, SCHEMA)
    return c


def _np(tree):
    return jax.tree.map(lambda x: np.array(x, copy=True), tree)


def _equal(a, b):
    return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b),
                                                     strict=True))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("rpr"))
    config = _config()
    first = {}

    def on_step(step, actor, critic, row):
        first[step] = (_np(actor.params), _np(critic.params), row)

    from terminal_rsi.rpr.phase import _states, model_config

    init_actor = _np(_states(config, model_config(config))[0].params)
    a = run_phase(config, workdir, stop_after=2, on_step=on_step)
    # a line of a step past the last checkpoint (written before a crash): must be discarded
    with open(os.path.join(workdir, "metrics.jsonl"), "a") as f:
        f.write(json.dumps({"step": 3, "stale": True}) + "\n")
    resumed = {}
    second = {}
    b = run_phase(config, workdir, on_resume=lambda rs: resumed.update(
        step=rs.step, actor=_np(rs.actor.params), critic=_np(rs.critic.params),
        data_position=rs.data_position),
        on_step=lambda s, ac, cr, row: second.update({s: (_np(ac.params), row)}))
    return dict(workdir=workdir, a=a, b=b, first=first, second=second, resumed=resumed,
                init_actor=init_actor)


def test_phase_writes_metrics_checkpoints_and_exports(runs):
    w = runs["workdir"]
    with open(os.path.join(w, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    assert [r["step"] for r in rows] == [1, 2, 3] and "stale" not in rows[2]
    assert [r["critic_only"] for r in rows] == [True, True, False]
    for r in rows:
        assert r["episodes"] == 2 and r["turns"] >= 1
        for k in ("reward_binary", "reward_dense", "critic/explained_variance",
                  "critic/value_clip_frac", "logprob_gap_mean_abs", "policy_lag_mean",
                  "value_ev_pre_update"):
            assert k in r, k
        # π_old recomputed by the training-side actor matches the sampler's logprobs
        assert r["logprob_gap_max_abs"] < 1e-2
    assert "actor/clip_frac_low" in rows[2] and "actor/clip_frac_low" not in rows[0]
    assert 0.0 <= rows[2]["eval/success"] <= 1.0 and rows[2]["eval/episodes"] == 2
    assert rows[2]["policy_version"] == 1 and rows[1]["policy_version"] == 0
    assert sorted(os.listdir(os.path.join(w, "checkpoints"))) == ["1", "2", "3"]
    assert sorted(os.listdir(os.path.join(w, "export"))) == ["actor", "critic"]


def test_actor_frozen_during_critic_warmup(runs):
    first, init = runs["first"], runs["init_actor"]
    assert _equal(first[1][0], init) and _equal(first[2][0], init)  # bit-identical
    assert not _equal(first[1][1], first[2][1])  # the critic did move
    actor_after_joint = runs["second"][3][0]
    assert not _equal(actor_after_joint, init)  # joint PPO step moves the actor


def test_resume_continues_from_the_interrupted_step(runs):
    a, b, res = runs["a"], runs["b"], runs["resumed"]
    assert a.step == 2 and a.resumed_from is None
    assert b.resumed_from == 2 and res["step"] == 2 and b.step == 3
    assert sorted(runs["second"]) == [3]  # only step 3 ran after the resume
    assert len(b.metrics) == 3 and b.metrics[:2] == a.metrics
    actor2, critic2, row2 = runs["first"][2]
    assert _equal(res["actor"], actor2) and _equal(res["critic"], critic2)
    assert res["data_position"] == row2["data_position"] == 4
    assert runs["second"][3][1]["data_position"] == 6


def test_warmup_critic_mode_one_pass_actor_frozen(tmp_path, runs):
    from terminal_rsi.rpr.phase import _states, model_config

    config = _config()
    config.mode = "warmup_critic"
    init_actor, init_critic = (_np(s.params) for s in _states(config, model_config(config)))
    res = run_phase(config, str(tmp_path))
    # 2 training tasks (2 families x 1), batch 2: one pass is one rollout step
    assert res.step == 1 and [m["critic_only"] for m in res.metrics] == [True]
    assert _equal(_np(res.actor.params), init_actor)
    assert not _equal(_np(res.critic.params), init_critic)
    assert sorted(os.listdir(tmp_path / "export")) == ["critic"]
