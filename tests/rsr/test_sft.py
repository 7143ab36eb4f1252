"""The shared SFT step (Eq. 3) against a NumPy reference, with and without jit, and exact
gradient accumulation over microbatches."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from terminal_rsi.rsr.sft import make_nll_fn, make_sft_step, sft_loss_parts
from terminal_rsi.training.losses import Aggregation
from tests.rpr.helpers import states, toy_batch


def _reference(params, graphdef, batch):
    """Σ over generated, predictable positions of -log softmax(logits[t-1])[token t] (NumPy),
    per (row, segment) sample; returns (sequence_sum loss, token count)."""
    model = nnx.merge(graphdef, params)
    logits = np.asarray(model(batch["tokens"], batch["positions"], batch["segment_ids"])[0],
                        np.float64)
    tok, seg, gen = batch["tokens"], batch["segment_ids"], batch["gen_mask"]
    per_sample: dict = {}
    for b in range(tok.shape[0]):
        for t in range(1, tok.shape[1]):
            if gen[b, t] and seg[b, t] != 0 and seg[b, t] == seg[b, t - 1]:
                z = logits[b, t - 1]
                lse = np.log(np.sum(np.exp(z - z.max()))) + z.max()
                key = (b, int(seg[b, t]))
                per_sample[key] = per_sample.get(key, 0.0) - (z[tok[b, t]] - lse)
    total = sum(per_sample.values())
    return total / len(per_sample), sum(1 for b in range(tok.shape[0]) for t in
                                        range(1, tok.shape[1]) if gen[b, t] and seg[b, t]
                                        and seg[b, t] == seg[b, t - 1])


class SFTLossTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_matches_numpy_reference(self):
        actor, _ = states()
        batch = {k: jnp.asarray(v) for k, v in toy_batch().items()
                 if k in ("tokens", "positions", "segment_ids", "gen_mask")}
        fn = self.variant(lambda p, b: sft_loss_parts(p, actor.graphdef, b,
                                                      Aggregation.SEQUENCE_SUM))
        parts = fn(actor.params, batch)
        want, n = _reference(actor.params, actor.graphdef, jax.device_get(batch))
        np.testing.assert_allclose(float(parts.loss), want, rtol=1e-4)
        assert float(parts.stats["tokens"]) == n


def test_microbatch_accumulation_is_exact_and_step_lowers_nll():
    actor, _ = states()
    batch = {k: v for k, v in toy_batch().items()
             if k in ("tokens", "positions", "segment_ids", "gen_mask")}
    outs = []
    for m in (1, 2):
        st = jax.tree.map(jnp.copy, actor)
        st, mt = make_sft_step(Aggregation.SEQUENCE_SUM, m, donate=False)(st, batch)
        outs.append((st, mt))
    # same loss and gradient norm (Adam's first update is sign-like, so params are not the
    # place to compare: tiny float differences near zero flip it)
    for key in ("loss", "grad_norm", "tokens", "nll_per_token"):
        np.testing.assert_allclose(float(outs[0][1][key]), float(outs[1][1][key]), rtol=1e-4)
    nll = make_nll_fn(Aggregation.TOKEN_MEAN)
    before = float(nll(actor, batch)["nll_per_token"])
    st = jax.tree.map(jnp.copy, actor)
    step = make_sft_step(Aggregation.TOKEN_MEAN, donate=False)
    for _ in range(5):
        st, _ = step(st, batch)
    assert float(nll(st, batch)["nll_per_token"]) < before


def test_sft_steps_sized_by_q_clean():
    """sft.epochs sizes the RSR fine-tune by |Q_clean| + |rehearsal| (ceil, at least 1),
    capped at sft.steps; without it (None) the stage always runs sft.steps; an empty Q_clean
    is 0 steps whatever the rehearsal holds."""
    import ml_collections

    from terminal_rsi.rsr.stage import sft_steps

    s = ml_collections.ConfigDict({"steps": 60, "epochs": 2.0, "batch_size": 8})
    assert sft_steps(s, 13) == 4          # ceil(2 * 13 / 8)
    assert sft_steps(s, 1) == 1
    assert sft_steps(s, 1000) == 60       # capped
    assert sft_steps(s, 5, 8) == 4        # ceil(2 * (5 + 8) / 8)
    assert sft_steps(s, 0) == 0           # empty Q_clean: no SFT step
    assert sft_steps(s, 0, 40) == 0       # ... even with self-rehearsal successes
    s.epochs = None
    assert sft_steps(s, 13) == 60 and sft_steps(s, 13, 7) == 60
    assert sft_steps(s, 0, 7) == 0
