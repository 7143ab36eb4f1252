"""Train states: optimizer chain vs a hand-written AdamW step, losses vs NumPy, donation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from terminal_rsi.models.config import ModelConfig
from terminal_rsi.models.transformer import DecoderLM, ValueModel, critic_params_from_actor
from terminal_rsi.runtime import sharding as shd
from terminal_rsi.settings import SettingError, specs
from terminal_rsi.training import train_state as ts

# module-scoped fixtures are expensive: keep this module on one xdist worker
pytestmark = pytest.mark.xdist_group("train_state")

CFG = ModelConfig(vocab_size=40, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8,
                  d_ff=24, max_seq_len=32)


def make_batch(seed=0, b=2, length=8):
    rng = np.random.default_rng(seed)
    tok = rng.integers(0, CFG.vocab_size, (b, length + 1)).astype(np.int32)
    seg = np.ones((b, length), np.int32)
    seg[0, :2] = 0
    pos = np.maximum(np.cumsum(seg, axis=1) - 1, 0).astype(np.int32)
    return {"tokens": tok[:, :-1], "targets": tok[:, 1:], "positions": pos,
            "segment_ids": seg, "loss_mask": seg.astype(np.float32),
            "returns": rng.standard_normal((b, length)).astype(np.float32)}


@pytest.fixture(scope="module")
def mesh():
    return shd.make_mesh()


def _np(tree):
    return jax.tree.map(lambda x: np.asarray(x, np.float64), tree)


def test_update_matches_hand_written_adamw(mesh):
    opt = ts.OptimizerConfig(learning_rate=1e-2, b1=0.9, b2=0.98, eps=1e-8, weight_decay=0.1,
                             grad_clip=0.5)
    state = ts.create_train_state(DecoderLM, CFG, opt, mesh, seed=1)
    p0 = _np(state.params)
    batch = make_batch()
    grads = _np(jax.jit(jax.grad(lambda p: ts.lm_loss(p, state.graphdef, batch)[0]))(
        state.params))
    step = ts.make_update_step(ts.lm_loss, state)
    state, metrics = step(state, batch)
    # Reference: clip by global norm, first Adam step (bias-corrected), decoupled decay on
    # matrices only.
    gnorm = np.sqrt(sum(np.sum(g ** 2) for g in jax.tree.leaves(grads)))
    scale = min(1.0, 0.5 / gnorm)

    def ref(p, g):
        g = g * scale
        m, v = 0.1 * g / (1 - 0.9), 0.02 * g * g / (1 - 0.98)
        upd = m / (np.sqrt(v) + 1e-8) + (0.1 * p if p.ndim >= 2 else 0.0)
        return p - 1e-2 * upd

    want = jax.tree.map(ref, p0, grads)
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(_np(state.params)), strict=True):
        np.testing.assert_allclose(b, a, atol=2e-6)
    np.testing.assert_allclose(metrics["grad_norm"], gnorm, rtol=1e-5)
    assert int(state.step) == 1


def test_losses_match_numpy(mesh):
    graphdef, params = shd.init_params(DecoderLM, CFG, mesh, seed=2)
    batch = make_batch(1)
    model = nnx.merge(graphdef, params)
    logits = np.asarray(jax.jit(model)(batch["tokens"], batch["positions"],
                                       batch["segment_ids"])[0], np.float64)
    logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1,
                                                                                 keepdims=True)) \
        - logits.max(-1, keepdims=True)
    nll = -np.take_along_axis(logp, batch["targets"][..., None], -1)[..., 0]
    want = (nll * batch["loss_mask"]).sum() / batch["loss_mask"].sum()
    loss, aux = jax.jit(ts.lm_loss, static_argnums=1)(params, graphdef, batch)
    np.testing.assert_allclose(loss, want, rtol=1e-5)
    assert float(aux["tokens"]) == batch["loss_mask"].sum()

    critic_graphdef, _ = shd.abstract_model(ValueModel, CFG)
    vloss, _ = jax.jit(ts.value_regression_loss, static_argnums=1)(
        critic_params_from_actor(params), critic_graphdef, batch)
    want_v = 0.5 * (batch["returns"] ** 2 * batch["loss_mask"]).sum() / batch["loss_mask"].sum()
    np.testing.assert_allclose(vloss, want_v, rtol=1e-5)


def test_state_is_donated_and_training_reduces_loss(mesh):
    state = ts.create_train_state(ValueModel, CFG, ts.OptimizerConfig(3e-2, grad_clip=100.0),
                                  mesh, seed=3)
    step = ts.make_update_step(ts.value_regression_loss, state)
    batch = make_batch(2)
    old_leaf = state.params["value_head"]["w"]
    state, m0 = step(state, batch)
    assert old_leaf.is_deleted()
    for _ in range(10):
        state, m = step(state, batch)
    assert float(m["loss"]) < 0.5 * float(m0["loss"])
    assert int(state.step) == 11
    # Same sharding before and after (pinned out_shardings).
    assert state.params["backbone"]["embed"].sharding.mesh == mesh


def test_optimizer_config_from_config_and_decay_mask():
    opt = ts.OptimizerConfig.from_config({"learning_rate": 1e-5, "b2": 0.95})
    assert opt.learning_rate == 1e-5 and opt.b2 == 0.95
    with pytest.raises(SettingError, match="no setting 'unrelated'"):  # never dropped
        ts.OptimizerConfig.from_config({"learning_rate": 1e-5, "unrelated": 1})
    # a stage's section passes every setting it shares with the runtime class
    section = ts.Optimizer(learning_rate=2e-5, b1=0.8, b2=0.9, weight_decay=0.0,
                           grad_clip=None, warmup_steps=3)
    opt = ts.OptimizerConfig.from_config(section, eps=1e-6)
    assert {k: opt[k] for k in section} == dict(section) and opt.eps == 1e-6
    assert not set(vars(ts.OptimizerConfig)["__annotations__"]) & set(specs(ts.Optimizer))
    tx = ts.make_optimizer(ts.OptimizerConfig(1.0, weight_decay=1.0, grad_clip=None))
    params = {"matrix": jnp.ones((2, 2)), "vector": jnp.ones((2,))}
    zeros = jax.tree.map(jnp.zeros_like, params)
    updates, _ = tx.update(zeros, tx.init(params), params)
    np.testing.assert_allclose(updates["matrix"], -np.ones((2, 2)))  # decayed
    np.testing.assert_allclose(updates["vector"], np.zeros(2))  # not decayed


def _reference_lr(t, peak, warm, decay, ratio):
    """Closed form of the warm-up + cosine schedule (an independent reference)."""
    if warm and t < warm:
        return peak * t / warm
    if t >= decay:
        return peak * ratio
    frac = (t - warm) / (decay - warm)
    return peak * ratio + (peak - peak * ratio) * 0.5 * (1 + np.cos(np.pi * frac))


@pytest.mark.parametrize("warm", [0, 5])
def test_cosine_schedule_matches_closed_form(warm):
    opt = ts.OptimizerConfig(learning_rate=3e-3, warmup_steps=warm, decay_steps=40,
                             end_lr_ratio=0.1)
    sched = ts.lr_schedule(opt)
    got = np.array([float(sched(t)) for t in range(50)])
    want = np.array([_reference_lr(t, 3e-3, warm, 40, 0.1) for t in range(50)])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-12)
    assert got[-1] == pytest.approx(3e-4)
    # no decay: constant after the warm-up, as before
    assert ts.lr_schedule(ts.OptimizerConfig(learning_rate=1e-3)) == 1e-3
    with pytest.raises(SettingError, match="decay_steps = 8 must exceed warmup_steps = 8"):
        ts.OptimizerConfig(learning_rate=1e-3, warmup_steps=8, decay_steps=8)


def test_sft_stage_optimizer_spans_the_stage():
    from terminal_rsi.rsr.common import optimizer_config
    from terminal_rsi.rsr.config import SFTOptimizer

    sec = SFTOptimizer(learning_rate=5e-4, weight_decay=0.0, schedule="cosine",
                       end_lr_ratio=0.2)
    assert optimizer_config(sec, 12).decay_steps == 12
    assert optimizer_config(sec, 12).end_lr_ratio == 0.2
    assert optimizer_config(sec, 1).decay_steps == 0  # one step: nothing to decay
    assert optimizer_config(sec.replace(schedule="constant"), 12).decay_steps == 0
