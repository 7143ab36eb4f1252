"""Checkpoints: full resume equality, weights-only roundtrip, partial (tmp) saves ignored."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from terminal_rsi.runtime import exports as ex
from terminal_rsi.training import checkpoint as ck
from terminal_rsi.training.advantages import prepare_ppo_batch
from tests.rpr.helpers import joint_step, states, toy_batch

# module-scoped fixtures are expensive: keep this module on one xdist worker
pytestmark = pytest.mark.xdist_group("rpr_checkpoint")


def _assert_same(a, b):
    la, ta = jax.tree.flatten(a)
    lb, tb = jax.tree.flatten(b)
    assert ta == tb
    for x, y in zip(la, lb, strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        if hasattr(x, "sharding") and hasattr(y, "sharding"):
            assert x.sharding.is_equivalent_to(y.sharding, x.ndim)
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture(scope="module")
def trained():
    """States after one real RPR step, so optimizer moments are non-trivial."""
    actor, critic = states()
    batch = prepare_ppo_batch(actor, critic, toy_batch())
    actor, critic, _ = joint_step(1)(actor, critic, batch)
    return actor, critic


def _other(state):
    """A template with the same structure/shardings but different values."""
    return jax.tree.map(lambda x: x * 0 + 1 if jnp.issubdtype(x.dtype, jnp.floating) else x,
                        state)


def test_resume_restores_identical_pytrees(tmp_path, trained):
    actor, critic = trained
    rngs = {"rollout": jax.random.key(3), "legacy": jax.random.PRNGKey(4)}
    extra = {"divisors": {"families": {"git": 12.0}, "fallback": 82.0}, "phase": "rpr1"}
    with ck.RunCheckpointer(tmp_path) as mgr:
        assert mgr.save(7, actor=actor, critic=critic, rngs=rngs, policy_version=5,
                        data_position=1234, extra=extra)
    fresh_actor, fresh_critic = _other(actor), _other(critic)
    with ck.RunCheckpointer(tmp_path) as mgr:
        assert mgr.latest_step() == 7
        r = mgr.restore(actor=fresh_actor, critic=fresh_critic, rngs=rngs)
    assert (r.step, r.policy_version, r.data_position, r.extra) == (7, 5, 1234, extra)
    _assert_same(ck.state_tree(r.actor), ck.state_tree(actor))
    _assert_same(ck.state_tree(r.critic), ck.state_tree(critic))
    assert r.actor.graphdef == actor.graphdef
    assert jnp.issubdtype(r.rngs["rollout"].dtype, jax.dtypes.prng_key)
    np.testing.assert_array_equal(jax.random.key_data(r.rngs["rollout"]),
                                  jax.random.key_data(rngs["rollout"]))
    np.testing.assert_array_equal(r.rngs["legacy"], rngs["legacy"])
    # The restored states train on: same next step as the originals.
    batch = prepare_ppo_batch(actor, critic, toy_batch())
    a1, _, _ = joint_step(1)(actor, critic, batch)
    a2, _, _ = joint_step(1)(r.actor, r.critic, batch)
    _assert_same(a1.params, a2.params)


def test_partial_tmp_checkpoint_is_ignored(tmp_path, trained):
    actor, critic = trained
    with ck.RunCheckpointer(tmp_path) as mgr:
        mgr.save(1, actor=actor, critic=critic)
    # A crash mid-save leaves orbax's tmp directory (never renamed to "2").
    junk = tmp_path / "2.orbax-checkpoint-tmp-1234567"
    (junk / "actor").mkdir(parents=True)
    (junk / "actor" / "garbage").write_bytes(b"\x00half-written")
    with ck.RunCheckpointer(tmp_path) as mgr:
        assert mgr.latest_step() == 1
        assert mgr.all_steps() == [1]
        r = mgr.restore(actor=actor, critic=critic)
    assert r.step == 1
    _assert_same(r.actor.params, actor.params)


def test_restore_without_checkpoint_is_typed(tmp_path, trained):
    actor, critic = trained
    with ck.RunCheckpointer(tmp_path / "empty") as mgr, pytest.raises(
            ex.CheckpointError, match="no complete checkpoint"):
        mgr.restore(actor=actor, critic=critic)


def test_weights_only_roundtrip(tmp_path, trained):
    actor, critic = trained
    ex.export_weights(tmp_path, "actor", actor.params)
    ex.export_weights(tmp_path, "critic", critic.params)
    assert sorted(os.listdir(tmp_path)) == ["actor", "critic"]
    fresh_actor, fresh_critic = _other(actor), _other(critic)
    got_a = ex.import_weights(tmp_path, "actor", fresh_actor.params)
    got_c = ex.import_weights(tmp_path, "critic", jax.eval_shape(lambda: fresh_critic.params))
    _assert_same(got_a, actor.params)
    _assert_same(got_c, critic.params)
    # A handoff: new optimizer state, imported weights.
    handed = states()[0].replace(params=got_a)  # fresh optimizer, imported weights
    assert int(handed.step) == 0
    _assert_same(handed.params, actor.params)
    with pytest.raises(ex.CheckpointError, match="no critic weights"):
        ex.import_weights(tmp_path / "nowhere", "critic", critic.params)
    with pytest.raises(ex.CheckpointError, match="role"):
        ex.export_weights(tmp_path, "reward_model", actor.params)
    # no target at all: the tree as saved, from the checkpoint's metadata (tests/test_multihost
    # reads a two-process export this way on one process)
    def by_path(tree):  # orbax saves integer dict keys (layer indices) as strings
        return {jax.tree_util.keystr(k).replace("'", ""): np.asarray(x)
                for k, x in jax.tree_util.tree_flatten_with_path(tree)[0]}

    got, want = by_path(ex.read_weights(tmp_path, "actor")), by_path(actor.params)
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k].dtype == want[k].dtype
        np.testing.assert_array_equal(got[k], want[k])
    with pytest.raises(ex.CheckpointError, match="no actor weights"):
        ex.read_weights(tmp_path / "nowhere", "actor")
