"""RPR update steps: alignment, exact accumulation, frozen actor, PPO improves the policy."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from terminal_rsi.credit import TokenGAE, TurnBoundaryGAE
from terminal_rsi.training import ppo_step as ps
from terminal_rsi.training.advantages import compute_advantages, prepare_ppo_batch
from terminal_rsi.training.alignment import predictable_mask, token_logprobs
from terminal_rsi.training.forward import actor_logprobs, make_logprob_fn, make_value_fn
from terminal_rsi.training.grad_accum import BatchError
from terminal_rsi.training.losses import Aggregation, PPOConfig
from tests.rpr.helpers import joint_step, states, toy_batch

# module-scoped fixtures are expensive: keep this module on one xdist worker
pytestmark = pytest.mark.xdist_group("rpr_ppo_step")


def _np(tree):
    return jax.tree.map(lambda x: np.array(x), tree)


def _copy(state):
    return jax.tree.map(jnp.copy, state)


# Compiled once per module (compilation dominates the test time on CPU).
LP_FN, V_FN = make_logprob_fn(), make_value_fn()
JOINT = {m: joint_step(m) for m in (1, 2)}


@pytest.fixture(scope="module")
def setup():
    actor, critic = states()
    batch = prepare_ppo_batch(actor, critic, toy_batch(),
                              estimator=TurnBoundaryGAE(gamma_turn=0.9, lambda_turn=0.8),
                              logprob_fn=LP_FN, value_fn=V_FN)
    # Non-trivial advantages regardless of the (zero-head) critic.
    rng = np.random.default_rng(0)
    batch["advantages"] = jnp.where(batch["gen_mask"], rng.normal(size=batch["gen_mask"].shape),
                                    0.0).astype(jnp.float32)
    batch["returns"] = batch["advantages"] + 2.0
    return actor, critic, batch


def test_token_logprobs_alignment_and_packing(setup):
    """logprob at t scores token t with the logits at t-1; a packed segment gives the same
    log-probs as the same trajectory alone in its own row."""
    actor, _, batch = setup
    lp = np.asarray(LP_FN(actor, batch))
    model = actor.model()
    logits, _ = model(batch["tokens"], batch["positions"], batch["segment_ids"])
    logits = np.asarray(logits, np.float64)
    seg = batch["segment_ids"]
    for b in range(seg.shape[0]):
        for t in range(seg.shape[1]):
            if t >= 1 and seg[b, t] != 0 and seg[b, t] == seg[b, t - 1]:
                row = logits[b, t - 1]
                want = row[batch["tokens"][b, t]] - np.log(np.exp(row - row.max()).sum()) \
                    - row.max()
                np.testing.assert_allclose(lp[b, t], want, rtol=1e-5, atol=1e-5)
            else:
                assert lp[b, t] == 0.0
    # Row 1, segment 2 (columns 5..11) alone in a row.
    alone = {k: np.zeros_like(np.asarray(batch[k][:1])) for k in ("tokens", "positions",
                                                                  "segment_ids")}
    alone["tokens"][0, :7] = batch["tokens"][1, 5:12]
    alone["positions"][0, :7] = np.arange(7)
    alone["segment_ids"][0, :7] = 1
    lp_alone = np.asarray(LP_FN(actor, alone))
    np.testing.assert_allclose(lp_alone[0, :7], lp[1, 5:12], rtol=1e-5, atol=1e-5)


def test_pre_token_values_are_shifted(setup):
    _, critic, batch = setup
    v = np.asarray(V_FN(critic, batch))
    out = np.asarray(critic.model()(batch["tokens"], batch["positions"], batch["segment_ids"]))
    ok = np.asarray(predictable_mask(jnp.asarray(batch["segment_ids"])))
    np.testing.assert_allclose(v[:, 1:][ok[:, 1:]], out[:, :-1][ok[:, 1:]], rtol=1e-6)
    assert np.all(v[~ok] == 0)


def test_unit_clock_advantages_are_reward_to_go_minus_value():
    raw = toy_batch()
    values = jnp.asarray(np.random.default_rng(1).normal(size=raw["rewards"].shape),
                         jnp.float32)
    adv, ret = compute_advantages(values, raw, estimator=TokenGAE(gamma=1.0, lam=1.0))
    adv2, _ = compute_advantages(values, raw)  # the default: TB-GAE, γ_turn = λ_turn = 1
    gen = raw["gen_mask"]
    for b in range(gen.shape[0]):
        for t in np.flatnonzero(gen[b]):
            seg = raw["segment_ids"][b]
            later = (seg == seg[t]) & (np.arange(len(seg)) >= t)
            want = raw["rewards"][b][later].sum() - values[b, t]
            np.testing.assert_allclose(adv[b, t], want, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(adv2[b, t], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret, np.where(gen, adv + values, 0.0), atol=1e-6)


def test_two_microbatches_equal_full_batch(setup):
    """Sample-mean over packed segments (the strict case; token-mean exactness is covered
    at the loss level in test_losses)."""
    actor, critic, batch = setup
    results = {}
    for m in (1, 2):
        a, c, metrics = JOINT[m](actor, critic, batch)
        results[m] = (_np(a.params), _np(c.params), _np(metrics))
    for i in range(2):
        jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5),
                     results[1][i], results[2][i])
    for k, v in results[1][2].items():
        np.testing.assert_allclose(results[2][2][k], v, rtol=1e-5, atol=1e-5, err_msg=k)


def test_critic_only_update_keeps_actor_bit_identical(setup):
    actor, critic, batch = setup
    actor, critic = _copy(actor), _copy(critic)
    before_a, before_c = _np(actor.params), _np(critic.params)
    step = ps.make_rpr_step(PPOConfig(), update_actor=False)
    for _ in range(2):
        actor, critic, metrics = step(actor, critic, batch)
    jax.tree.map(np.testing.assert_array_equal, before_a, _np(actor.params))
    assert int(actor.step) == 0 and int(critic.step) == 2
    assert not any(k.startswith("actor/") for k in metrics)
    moved = jax.tree.map(lambda x, y: float(np.abs(x - y).max()), before_c, _np(critic.params))
    assert max(jax.tree.leaves(moved)) > 0


def test_ppo_steps_raise_positive_advantage_logprobs_and_fit_critic(setup):
    actor, critic, batch = setup
    lp0 = np.asarray(LP_FN(actor, batch))
    _, _, m0 = JOINT[2](actor, critic, batch)
    for _ in range(6):
        actor, critic, metrics = JOINT[2](actor, critic, batch)
    lp1 = np.asarray(LP_FN(actor, batch))
    adv, gen = np.asarray(batch["advantages"]), np.asarray(batch["gen_mask"])
    pos, neg = gen & (adv > 0), gen & (adv < 0)
    assert (lp1 - lp0)[pos].mean() > 0.05
    assert (lp1 - lp0)[neg].mean() < -0.05
    assert float(metrics["actor/ratio_max"]) > 1.0
    chex.assert_tree_all_finite(metrics)
    assert float(metrics["critic/loss"]) < float(m0["critic/loss"])
    assert float(metrics["critic/explained_variance"]) > float(m0["critic/explained_variance"])


def test_check_batch_errors(setup):
    _, _, batch = setup
    ps.check_batch(batch, ps.ACTOR_KEYS, num_microbatches=2)
    with pytest.raises(BatchError, match="lacks"):
        ps.check_batch({"tokens": batch["tokens"]})
    with pytest.raises(BatchError, match="divisible"):
        ps.check_batch(batch, ps.ACTOR_KEYS, num_microbatches=3)
    bad = dict(batch)
    bad["gen_mask"] = np.array(batch["gen_mask"]).copy()
    bad["gen_mask"][1, 5] = True  # first token of segment 2
    with pytest.raises(BatchError, match=r"\[1, 5\]"):
        ps.check_batch(bad)


def test_chunked_logprobs_match_full_logits_values_and_gradients(setup, chunk=5):
    """The training-side path (`actor_logprobs`, chunked) equals log-softmax over the full
    [B, L, V] logits (`token_logprobs`), in value and in gradient w.r.t. the parameters."""
    actor, _, batch = setup
    keys = {k: batch[k] for k in ("tokens", "positions", "segment_ids")}
    w = jnp.asarray(np.random.default_rng(1).normal(size=batch["tokens"].shape), jnp.float32)

    def full(params):
        from flax import nnx

        logits, _ = nnx.merge(actor.graphdef, params)(keys["tokens"], keys["positions"],
                                                      keys["segment_ids"])
        return token_logprobs(logits, keys["tokens"], keys["segment_ids"])[0]

    def chunked(params):
        return actor_logprobs(params, actor.graphdef, keys, chunk_size=chunk)[0]

    # chunk 5 does not divide L = 12: the padded last chunk is exercised too
    np.testing.assert_allclose(chunked(actor.params), full(actor.params), rtol=1e-5, atol=1e-5)
    g_full = jax.jit(jax.grad(lambda p: jnp.sum(w * full(p))))(actor.params)
    g_chunk = jax.jit(jax.grad(lambda p: jnp.sum(w * chunked(p))))(actor.params)
    for a, b in zip(jax.tree.leaves(g_chunk), jax.tree.leaves(g_full), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("estimator", [TurnBoundaryGAE(gamma_turn=0.9, lambda_turn=0.8),
                                       TokenGAE(gamma=0.95, lam=0.7)])
def test_split_episode_continues_from_its_successor_row(estimator):
    """An episode split by summarization into three rows (next_row links 0 -> 2 -> 1) gets
    the advantages of the same episode in one row; without the links it does not."""
    rng = np.random.default_rng(3)
    # unsplit row: prompt 2, then turns 0..3 of 2 generated tokens with 2 observation tokens
    # between them; the split rows restart with a 2-token (summary) prompt before turns 2, 3.
    turns = [0, 1, 2, 3]
    full_gen = [0, 0] + sum(([1, 1, 0, 0] for _ in turns), [])[:-2]
    length = 20
    v = rng.normal(size=len(turns) * 2).astype(np.float32)

    def row(turn_list, prompt=2):
        gen, tid, val = [0] * prompt, [-1] * prompt, [0.0] * prompt
        for i, t in enumerate(turn_list):
            gen += [1, 1]
            tid += [t, t]
            val += [v[2 * t], v[2 * t + 1]]
            if i + 1 < len(turn_list):
                gen += [0, 0]
                tid += [t, t]
                val += [0.0, 0.0]
        pad = length - len(gen)
        return gen + [0] * pad, tid + [-1] * pad, val + [0.0] * pad, len(gen)

    def batch(rows, done_row):
        g, t, val, n = zip(*rows, strict=True)
        b = len(rows)
        seg = np.zeros((b, length), np.int32)
        for i in range(b):
            seg[i, :n[i]] = 1
        gen = np.array(g, bool)
        dones = np.zeros((b, length), bool)
        rewards = np.zeros((b, length), np.float32)
        last = np.flatnonzero(gen[done_row])[-1]
        dones[done_row, last], rewards[done_row, last] = True, 1.5
        return ({"gen_mask": gen, "turn_ids": np.array(t, np.int32), "segment_ids": seg,
                 "rewards": rewards, "dones": dones}, jnp.asarray(np.array(val, np.float32)))

    whole, v_whole = batch([row(turns)], 0)
    assert whole["gen_mask"][0, :len(full_gen)].tolist() == [bool(x) for x in full_gen]
    split, v_split = batch([row([0, 1]), row([3]), row([2])], 1)
    adv_w, ret_w = compute_advantages(v_whole, whole, estimator=estimator)
    adv_s, ret_s = compute_advantages(v_split, split, estimator=estimator,
                                      next_row=np.array([2, -1, 1]))
    adv_n, _ = compute_advantages(v_split, split, estimator=estimator)

    def gen_values(a, b):
        return np.asarray(a)[b["gen_mask"]]

    want = gen_values(adv_w, whole)  # turns 0,1,2,3 in order
    got = gen_values(adv_s, split)  # rows 0 (turns 0,1), 1 (turn 3), 2 (turn 2)
    got = np.concatenate([got[:4], got[6:8], got[4:6]])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    r_got = gen_values(ret_s, split)
    np.testing.assert_allclose(np.concatenate([r_got[:4], r_got[6:8], r_got[4:6]]),
                               gen_values(ret_w, whole), rtol=1e-6, atol=1e-6)
    assert not np.allclose(gen_values(adv_n, split)[:4], want[:4])


@pytest.mark.parametrize("temperature", [0.6, 1.0])
def test_logprobs_and_ratio_at_the_sampling_temperature(setup, temperature):
    """π_old recomputation and the PPO loss score tokens under softmax(logits / T) of the
    rollout temperature: the recomputed log-probs match NumPy, and an update whose old
    log-probs are those of π_T starts at ratio 1 exactly (no off-policy gap)."""
    actor, _, batch = setup
    lp = np.asarray(make_logprob_fn(temperature=temperature)(actor, batch))
    logits, _ = actor.model()(batch["tokens"], batch["positions"], batch["segment_ids"])
    z = np.asarray(logits, np.float64)[:, :-1] / temperature
    ref = np.take_along_axis(z, np.asarray(batch["tokens"])[:, 1:, None], -1)[..., 0] \
        - (np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1)) + z.max(-1))
    ok = np.asarray(predictable_mask(batch["segment_ids"]))
    np.testing.assert_allclose(lp[ok], np.pad(ref, ((0, 0), (1, 0)))[ok], rtol=1e-4, atol=1e-5)
    cfg = PPOConfig(temperature=temperature)
    parts = ps.actor_loss_parts(actor.params, actor.graphdef,
                                {**batch, "old_logprobs": jnp.asarray(lp)}, cfg)
    stats = jax.device_get(parts.stats)
    np.testing.assert_allclose([stats["ratio_min"], stats["ratio_max"]], 1.0, atol=1e-5)
    if temperature != 1.0:  # the untempered policy is not the sampling one: ratio != 1
        off = jax.device_get(ps.actor_loss_parts(
            actor.params, actor.graphdef, {**batch, "old_logprobs": jnp.asarray(lp)},
            PPOConfig()).stats)
        assert abs(off["ratio_max"] - 1.0) > 1e-3 or abs(off["ratio_min"] - 1.0) > 1e-3


def test_policy_temperature_must_be_positive():
    from terminal_rsi.settings import SettingError

    with pytest.raises(SettingError, match="temperature"):
        PPOConfig(temperature=0.0)


class PolicyMaskTest(chex.TestCase):
    """`policy_mask` in a batch restricts the policy loss to those positions: the same loss,
    statistics and gradient as the batch whose gen_mask is cut to them (with and without
    jit), while the critic's loss ignores it."""

    @chex.variants(with_jit=True, without_jit=True)
    def test_policy_mask_equals_a_cut_gen_mask(self):
        actor, critic = states()
        base = toy_batch()
        rng = np.random.default_rng(1)
        batch = {k: jnp.asarray(v) for k, v in base.items()}
        batch["old_logprobs"] = LP_FN(actor, batch) - 0.05
        batch["advantages"] = jnp.asarray(
            np.where(base["gen_mask"], rng.normal(size=base["gen_mask"].shape), 0.0),
            jnp.float32)
        batch["old_values"] = jnp.zeros(base["gen_mask"].shape, jnp.float32)
        batch["returns"] = batch["advantages"]
        keep = jnp.asarray(base["gen_mask"] & (rng.random(base["gen_mask"].shape) < 0.5))
        cfg = PPOConfig(aggregation=Aggregation.SAMPLE_MEAN, kl_coef=0.1)
        batch["ref_logprobs"] = batch["old_logprobs"] + 0.1

        def loss(params, b):
            parts = ps.actor_loss_parts(params, actor.graphdef, b, cfg)
            return parts.loss, parts.stats

        f = self.variant(jax.value_and_grad(loss, has_aux=True))
        (l_mask, s_mask), g_mask = f(actor.params, {**batch, "policy_mask": keep})
        (l_cut, s_cut), g_cut = f(actor.params, {**batch, "gen_mask": keep})
        (l_all, _), _ = f(actor.params, batch)
        np.testing.assert_allclose(l_mask, l_cut, rtol=1e-6)
        assert float(s_mask["tokens"]) == float(keep[:, 1:].sum()) == float(s_cut["tokens"])
        chex.assert_trees_all_close(g_mask, g_cut, rtol=1e-5, atol=1e-7)
        assert abs(float(l_all) - float(l_mask)) > 1e-4
        v = ps.critic_loss_parts(critic.params, critic.graphdef,
                                 {**batch, "policy_mask": keep}, cfg)
        v_ref = ps.critic_loss_parts(critic.params, critic.graphdef, batch, cfg)
        np.testing.assert_allclose(v.loss, v_ref.loss, rtol=1e-6)
