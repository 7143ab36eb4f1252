"""Policy movement on a probe (`evaluation.movement`, issue 51) against a NumPy reference
computed from the models' full logits: log softmax, the shift (logit t-1 scores token t),
the mask of generated tokens with a prefix in their segment, the mean of |Δ log π|."""

import functools

import jax
import numpy as np
import pytest
from flax import nnx

from terminal_rsi.agent.trajectory import TerminalReason, Trajectory, Turn
from terminal_rsi.evaluation.movement import (
    movement_fn,
    policy_movement,
    probe_batch,
    probe_movement,
)
from terminal_rsi.models.config import ModelConfig
from terminal_rsi.models.sampling import Buckets
from terminal_rsi.models.transformer import DecoderLM
from terminal_rsi.training.forward import actor_logits

TINY = ModelConfig(vocab_size=32, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1,
                   head_dim=16, d_ff=64, max_seq_len=64)


@functools.cache
def _actor(seed):
    graphdef, state = nnx.split(DecoderLM(TINY, rngs=nnx.Rngs(seed)))
    return graphdef, nnx.to_pure_dict(state)


def _batch(seed=0, b=3, length=16):
    """Row 0: one segment; row 1: two packed segments (the second's first token is generated
    and has no prefix: not scored); row 2: one segment, then padding."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, TINY.vocab_size, (b, length)).astype(np.int32)
    seg = np.zeros((b, length), np.int32)
    pos = np.zeros((b, length), np.int32)
    gen = np.zeros((b, length), bool)
    for row, start, n, n_prompt, sid in ((0, 0, 16, 4, 1), (1, 0, 7, 3, 1), (1, 7, 9, 0, 2),
                                         (2, 0, 10, 5, 1)):
        seg[row, start:start + n] = sid
        pos[row, start:start + n] = np.arange(n)
        gen[row, start + n_prompt:start + n] = True
    return {"tokens": tokens, "positions": pos, "segment_ids": seg, "gen_mask": gen}


def _reference(params_in, params_out, graphdef, batch) -> float:
    def logp(params):
        z = np.asarray(actor_logits(params, graphdef, batch), np.float64)
        z = z - z.max(-1, keepdims=True)
        logsm = z - np.log(np.exp(z).sum(-1, keepdims=True))
        out = np.zeros(batch["tokens"].shape)
        out[:, 1:] = np.take_along_axis(logsm[:, :-1], batch["tokens"][:, 1:, None], -1)[..., 0]
        return out

    seg = batch["segment_ids"]
    mask = np.zeros(seg.shape, bool)
    mask[:, 1:] = (seg[:, 1:] == seg[:, :-1]) & (seg[:, 1:] != 0)
    mask &= batch["gen_mask"]
    return float(np.abs(logp(params_out) - logp(params_in))[mask].mean())


@pytest.mark.parametrize("jit", [False, True])
def test_movement_matches_numpy(jit):
    graphdef, a = _actor(0)
    _, b = _actor(1)
    batch = _batch()
    want = _reference(a, b, graphdef, batch)
    got = (movement_fn(graphdef)(a, b, batch) if jit
           else policy_movement(a, b, graphdef, batch))
    assert want > 0.01
    np.testing.assert_allclose(float(got), want, rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("jit", [False, True])
def test_no_movement_and_no_tokens(jit):
    graphdef, a = _actor(0)
    _, b = _actor(1)
    fn = movement_fn(graphdef) if jit else (lambda x, y, z: policy_movement(x, y, graphdef, z))
    assert float(fn(a, jax.tree.map(np.array, a), _batch())) == 0.0  # the same actor
    empty = {**_batch(), "gen_mask": np.zeros((3, 16), bool)}
    assert float(fn(a, b, empty)) == 0.0  # nothing to score: 0, not NaN


def test_probe_movement_of_trajectories():
    """Probe episodes are packed; one without generated tokens is left out; the count is of
    the scored (generated, predicted) tokens."""
    graphdef, a = _actor(0)
    _, b = _actor(1)
    done = TerminalReason.DECLARED_COMPLETE
    scored = Trajectory("t0", "f", "H0", 0, terminal_reason=done, turns=[
        Turn([1, 2, 3], [4, 5], [0.0, 0.0], [6, 7]), Turn([8], [9, 10, 11], [0.0] * 3)])
    silent = Trajectory("t1", "f", "H0", 0, terminal_reason=done, turns=[Turn([1, 2], [], [])])
    buckets = Buckets(cache_multiple=16)
    out = probe_movement(a, b, graphdef, [scored, silent], buckets)
    assert (out["probe_sequences"], out["probe_tokens"]) == (1, 5)
    batch = {k: np.asarray(v) for k, v in probe_batch([scored], buckets).items()}
    assert out["policy_movement"] == pytest.approx(_reference(a, b, graphdef, batch), rel=2e-5)
    assert probe_movement(a, b, graphdef, [silent], buckets) == {
        "policy_movement": None, "probe_sequences": 0, "probe_tokens": 0}
