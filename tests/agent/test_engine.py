"""The rollout engine: every episode of a `run` in launch order, per-task harnesses, random
streams that make a run replay whatever the concurrency, errors that stop no run, and the
one background rollout."""

import threading
from types import SimpleNamespace as NS

import pytest

from terminal_rsi.agent import (
    HarnessConfig,
    ReferencePolicy,
    RolloutEngine,
    TrainingPolicy,
)
from terminal_rsi.agent.engine import cached_sampler, stream_namespace
from terminal_rsi.models.config import get_model_config
from terminal_rsi.models.loading import LoadedModel
from terminal_rsi.models.tokenizer import ByteTokenizer
from terminal_rsi.models.transformer import DecoderLM
from terminal_rsi.rewards import EpisodeScorer
from terminal_rsi.runtime import sharding as shd
from terminal_rsi.tasks import get_suite

TOK = ByteTokenizer()
MCFG = get_model_config("tiny", n_layers=1, d_model=32, n_heads=2, n_kv_heads=1,
                        head_dim=16, d_ff=64, max_seq_len=2048)
ROLLOUT = NS(decode_block=8, prefill_chunk=128, cache_multiple=64)
H = HarnessConfig(name="H0", max_turns=2, max_output_tokens=12, max_input_tokens=2048,
                  summarize_threshold=None, temperature=1.0)  # the tiny model's
REF = HarnessConfig(name="H0", max_turns=4)  # the reference policy's (full budgets)


def _tasks(n, family="create_file"):
    return list(get_suite("builtin", "train", families=[family], n_per_family=n))


@pytest.fixture(scope="module")
def model():
    graphdef, _ = shd.abstract_model(DecoderLM, MCFG)
    import flax.nnx as nnx

    params = nnx.to_pure_dict(nnx.split(DecoderLM(MCFG, rngs=nnx.Rngs(0)))[1])
    return LoadedModel(TOK, MCFG, graphdef, params)


def _engine(model, concurrency, **kw):
    return RolloutEngine(H, None, concurrency=concurrency, rollout=ROLLOUT, model=model, **kw)


def _sampled(episodes):
    return [[tuple(t.sampled_ids) for t in e.turns] for e in episodes.trajectories]


def test_run_keeps_every_episode_in_launch_order():
    engine = RolloutEngine(REF, None, concurrency=3, scorer=EpisodeScorer("binary"))
    tasks = _tasks(5)
    done = engine.run(ReferencePolicy(TOK), tasks)
    assert [t.meta["launch_index"] for t in done.trajectories] == list(range(5))
    assert [t.task_id for t in done.trajectories] == [t.id for t in tasks]
    assert all(t.S == 1 and t.reward == 1.0 for t in done.trajectories) and not done.errors


def test_run_takes_one_harness_per_task():
    engine = RolloutEngine(REF, None, concurrency=2)
    tasks = _tasks(3)
    hs = [HarnessConfig(name=f"h{i}", max_turns=2) for i in range(3)]
    done = engine.run(ReferencePolicy(TOK), tasks, harness=hs)
    assert [t.harness for t in done.trajectories] == ["h0", "h1", "h2"]
    with pytest.raises(ValueError, match="2 harnesses for 3 tasks"):
        engine.run(ReferencePolicy(TOK), tasks, harness=hs[:2])


def test_an_episode_that_raises_stops_no_run():
    """The scorer raises on one task: that episode is absent and named in `errors`; the
    others are kept in order."""
    tasks = _tasks(4)

    def scorer(traj):
        if traj.task_id == tasks[1].id:
            raise RuntimeError("verifier crashed")
        traj.reward = float(traj.S)

    done = RolloutEngine(REF, None, concurrency=2, scorer=scorer).run(ReferencePolicy(TOK),
                                                                    tasks)
    assert [t.meta["launch_index"] for t in done.trajectories] == [0, 2, 3]
    assert len(done.errors) == 1 and "verifier crashed" in done.errors[0]
    assert tasks[1].id in done.errors[0]


def test_dropped_episodes_are_kept_apart():
    tasks = _tasks(2)

    def factory(task):
        raise OSError("host down")

    done = RolloutEngine(REF, factory, concurrency=2).run(ReferencePolicy(TOK), tasks)
    assert len(done.dropped()) == 2 and done.trainable() == []
    assert all(t.training_policy == TrainingPolicy.DROP for t in done.trajectories)


def test_a_run_replays_whatever_the_concurrency(model):
    """Each episode samples from its own stream: one at a time or four at a time (other
    batch compositions), the same seed gives the same tokens; another stream namespace or
    seed gives others, and `first` samples episode i as `run` does."""
    engine1, engine4 = _engine(model, 1), _engine(model, 4)
    tasks = _tasks(4)
    a = engine1.run(engine1.policy(model.params, seed=3), tasks, streams="discovery/hot")
    b = engine4.run(engine4.policy(model.params, seed=3), tasks, streams="discovery/hot")
    assert _sampled(a) == _sampled(b) and len(a.trajectories) == 4
    c = engine4.run(engine4.policy(model.params, seed=3), tasks, streams="execution")
    d = engine4.run(engine4.policy(model.params, seed=4), tasks, streams="discovery/hot")
    assert _sampled(c) != _sampled(a) and _sampled(d) != _sampled(a)
    plain = engine4.run(engine4.policy(model.params, seed=3), tasks)
    first = engine4.first(engine4.policy(model.params, seed=3), tasks, 4)
    by_index = sorted(first.trajectories, key=lambda t: t.meta["launch_index"])
    assert [[tuple(t.sampled_ids) for t in e.turns] for e in by_index] == _sampled(plain)


def test_the_sampler_is_compiled_once_per_shape(model):
    s1 = cached_sampler(model.graphdef, MCFG, ROLLOUT, TOK.pad_id)
    assert cached_sampler(model.graphdef, MCFG, NS(**vars(ROLLOUT)), TOK.pad_id) is s1
    other = NS(**{**vars(ROLLOUT), "decode_block": 16})
    assert cached_sampler(model.graphdef, MCFG, other, TOK.pad_id) is not s1


def test_stream_namespaces_are_stable_and_distinct():
    assert stream_namespace("execution") == stream_namespace("execution")
    assert stream_namespace("execution") != stream_namespace("discovery/hot")
    assert 0 <= stream_namespace("x") < 2**31


def test_a_policy_needs_a_model():
    with pytest.raises(ValueError, match="no model"):
        RolloutEngine(H, None, concurrency=1).policy({}, seed=0)


def test_ahead_runs_one_rollout_in_the_background():
    """`ahead` returns at once; the batch rolls out with the version of its launch while the
    caller trains (bumps the version), on one background thread."""
    pol = ReferencePolicy(TOK)
    engine = RolloutEngine(REF, None, concurrency=2)
    gate = threading.Event()

    def rollout():
        gate.wait(10)
        return engine.first(pol, _tasks(2), 2, policy_version=0)

    try:
        fut = engine.ahead(rollout)
        assert not fut.done()
        pol.version = 1  # "train" on the previous batch
        gate.set()
        res = fut.result(timeout=60)
        assert {t.policy_version for t in res.trajectories} == {0}
    finally:
        engine.close()
