"""PPO update batches in the RPR phase: length-grouped minibatches (every row once; cutting a
minibatch to its own width changes no log-prob, value, loss or update) and advantage whitening."""

import chex
import jax
import numpy as np
import pytest

from terminal_rsi.credit import TurnBoundaryGAE
from terminal_rsi.rpr.update import grouped_forward, minibatch_rows, row_widths, take_rows
from terminal_rsi.training import ppo_step as ps
from terminal_rsi.training.advantages import prepare_ppo_batch, whiten_advantages
from terminal_rsi.training.alignment import predictable_mask
from terminal_rsi.training.forward import make_logprob_fn, make_value_fn
from terminal_rsi.training.losses import PPOConfig
from tests.rpr.helpers import states, toy_batch

pytestmark = pytest.mark.xdist_group("rpr_ppo_step")


def _padded(width=32, seed=0):
    """toy_batch rows (12 positions, unequal real lengths) padded on the right to `width`."""
    b = toy_batch(b=4, length=12, seed=seed)
    return {k: np.pad(v, ((0, 0), (0, width - v.shape[1]))) for k, v in b.items()}


def testrow_widths_round_up_and_cap():
    seg = np.zeros((4, 20), np.int32)
    seg[0, :3] = 1
    seg[1, :8] = 1
    seg[2, :20] = 1  # a full row stays at the packed width
    seg[3, 2:5] = 1  # a leading gap does not shorten the row
    np.testing.assert_array_equal(row_widths(seg, 4), [4, 8, 20, 8])
    np.testing.assert_array_equal(row_widths(np.zeros((1, 8), np.int32), 4), [4])


@pytest.mark.parametrize("grouping", [True, False])
def test_minibatch_rows_partition_every_row_once(grouping):
    rng = np.random.default_rng(0)
    widths = rng.choice([256, 512, 1536, 2048], size=12)
    parts = minibatch_rows(widths, 3, rng, grouping)
    assert len(parts) == 3 and all(len(p) == 4 for p in parts)
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(12))
    if grouping:  # runs of the width order: no row of a shorter run is longer than the next
        spans = sorted((widths[p].min(), widths[p].max()) for p in parts)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))


def test_length_grouping_is_reproducible_for_a_seed():
    widths = np.array([512, 256, 2048, 256, 1024, 512])
    a = minibatch_rows(widths, 2, np.random.default_rng(3), True)
    b = minibatch_rows(widths, 2, np.random.default_rng(3), True)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


def test_cut_forward_equals_full_width():
    """Old log-probs and values computed group by group at each group's width equal the
    full-width computation on the real positions, and are 0 on the cut padding."""
    actor, critic = states()
    batch = _padded(32)
    widths = row_widths(batch["segment_ids"], 4)
    assert widths.max() < 32
    groups = minibatch_rows(widths, 2, np.random.default_rng(0), True)
    for fn, st in ((make_logprob_fn(), actor), (make_value_fn(), critic)):
        full = np.asarray(fn(st, batch))
        cut = grouped_forward(fn, groups, widths)(st, batch)
        real = batch["segment_ids"] > 0
        np.testing.assert_allclose(cut[real], full[real], rtol=1e-5, atol=1e-6)
        assert not cut[~real].any()


def test_cut_minibatch_update_equals_full_width_update():
    """One actor and one critic update on a minibatch cut to its width give the same
    parameters and metrics as the same rows at the full width."""
    actor, critic = states()
    batch = prepare_ppo_batch(actor, critic, _padded(32),
                              estimator=TurnBoundaryGAE(gamma_turn=0.9, lambda_turn=0.8))
    batch = {k: np.asarray(v) for k, v in batch.items()}
    rng = np.random.default_rng(1)
    batch["advantages"] = np.where(batch["gen_mask"], rng.normal(size=batch["gen_mask"].shape),
                                   0.0).astype(np.float32)
    rows = np.array([0, 2])
    w = int(row_widths(batch["segment_ids"], 4)[rows].max())
    full, cut = take_rows(batch, rows, 32), take_rows(batch, rows, w)
    assert cut["tokens"].shape == (2, w) and w < 32
    cfg = PPOConfig()
    for make, st in ((ps.make_actor_step, actor), (ps.make_critic_step, critic)):
        step = make(cfg, 1, donate=False)
        st_full, m_full = step(st, full)
        st_cut, m_cut = step(st, cut)
        for a, b in zip(jax.tree.leaves(st_full.params), jax.tree.leaves(st_cut.params),
                        strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=1e-6)
        for k in ("loss", "grad_norm"):
            np.testing.assert_allclose(float(m_full[k]), float(m_cut[k]), rtol=1e-5, atol=1e-6)


class WhitenTest(chex.TestCase):
    """`whiten_advantages` against NumPy, with and without jit."""

    @chex.variants(with_jit=True, without_jit=True)
    def test_matches_numpy_on_trained_tokens(self):
        b = toy_batch(b=4, length=12, seed=3)
        rng = np.random.default_rng(0)
        adv = (rng.normal(size=b["gen_mask"].shape) * 0.3 - 0.2).astype(np.float32)
        out = np.asarray(self.variant(whiten_advantages)(adv, b["gen_mask"],
                                                            b["segment_ids"]))
        m = b["gen_mask"].astype(bool) & np.asarray(predictable_mask(b["segment_ids"]))
        a = adv[m].astype(np.float64)
        np.testing.assert_allclose(out[m], (a - a.mean()) / (a.std() + 1e-4), rtol=1e-4,
                                   atol=1e-5)
        assert not out[~m].any()
        np.testing.assert_allclose([out[m].mean(), out[m].std()], [0.0, 1.0], atol=1e-3)

    @chex.variants(with_jit=True, without_jit=True)
    def test_constant_advantages_become_zero(self):
        b = toy_batch(b=2, length=12)
        out = self.variant(whiten_advantages)(np.full(b["gen_mask"].shape, 0.7, np.float32),
                                                 b["gen_mask"], b["segment_ids"])
        np.testing.assert_allclose(np.asarray(out), 0.0, atol=1e-2)
