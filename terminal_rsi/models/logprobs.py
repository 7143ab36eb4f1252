"""Training-side per-token log-probabilities, computed in chunks along the sequence.

This module is the *training* half of the token-in/token-out contract (paper §2.1) and of
the π_old recomputation before PPO (§2.4): given the packed [B, L] arrays of a batch it
recomputes log π(token_j | prefix) with the same parameters the sampler used. The sampler
itself (`terminal_rsi.models.sampling`) returns the rollout-side log-probabilities; the mean
absolute difference of the two on generated tokens is `logprob_gap` (the paper reports a
train/rollout gap of 4.66e-3 to 4.98e-3, §3.3).

Memory: the backbone's hidden states [B, L, D] are computed once; the unembedding
[D, V] is then applied `chunk_size` positions at a time (`lax.map` over chunks, each chunk
under `jax.checkpoint`), so at most [B, chunk_size, V] logits exist at any time, in the
forward pass and in the backward pass (the chunk's logits are recomputed there instead of
being stored). Appendix A uses a log-probability chunk size of 1024, the default here.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from flax import nnx

from terminal_rsi.models.transformer import default_positions_and_segments

DEFAULT_CHUNK_SIZE = 1024


class LogprobError(ValueError):
    """Bad arguments to a log-probability function (shapes, chunk size, temperature)."""


def logprobs_from_hidden(hidden: jax.Array, unembedding: jax.Array, targets: jax.Array, *,
                         chunk_size: int = DEFAULT_CHUNK_SIZE,
                         temperature: float = 1.0) -> jax.Array:
    """log softmax(hidden · W / T)[target] per position, chunked along the sequence.

    hidden: [B, L, D] final-normed hidden states; unembedding W: [D, V]; targets: [B, L]
    int token ids (the token to score at each position). Returns [B, L] float32 with
    out[b, i] = (h_{b,i}·W)[targets[b, i]] / T - logsumexp_v((h_{b,i}·W)_v / T).

    L is padded up to a multiple of `chunk_size`; each chunk computes [B, chunk, V]
    float32 logits under `jax.checkpoint`, so peak memory grows with the chunk, not with
    L × V, also under `jax.grad`.
    """
    chex.assert_rank([hidden, unembedding, targets], [3, 2, 2])
    chex.assert_type(targets, int)
    b, length, d = hidden.shape
    chex.assert_shape(targets, (b, length))
    chex.assert_axis_dimension(unembedding, 0, d)
    if chunk_size <= 0:
        raise LogprobError(f"chunk_size = {chunk_size} must be a positive number of positions")
    if not temperature > 0:
        raise LogprobError(f"temperature = {temperature} must be > 0 for log-probabilities")
    chunk = min(chunk_size, length)
    n = -(-length // chunk)
    pad = n * chunk - length
    h = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
    t = jnp.pad(targets.astype(jnp.int32), ((0, 0), (0, pad)))
    h = h.reshape(b, n, chunk, d).swapaxes(0, 1)  # [n, B, C, D]
    t = t.reshape(b, n, chunk).swapaxes(0, 1)  # [n, B, C]

    @jax.checkpoint
    def one_chunk(args):
        hc, tc = args
        logits = jnp.einsum("bcd,dv->bcv", hc.astype(unembedding.dtype), unembedding,
                            preferred_element_type=jnp.float32)
        if temperature != 1.0:
            logits = logits / temperature
        picked = jnp.take_along_axis(logits, tc[..., None], axis=-1)[..., 0]
        return picked - jax.nn.logsumexp(logits, axis=-1)

    out = jax.lax.map(one_chunk, (h, t))  # [n, B, C]
    return out.swapaxes(0, 1).reshape(b, n * chunk)[:, :length]


def chunked_token_logprobs(params, graphdef: nnx.GraphDef, tokens: jax.Array,
                           positions: jax.Array | None = None,
                           segment_ids: jax.Array | None = None, *,
                           chunk_size: int = DEFAULT_CHUNK_SIZE,
                           temperature: float = 1.0) -> jax.Array:
    """Per-token log-probabilities of a (packed, padded) batch under a DecoderLM, chunked
    along the sequence (from the model's parameters; `alignment.token_logprobs` is the same
    quantity from full [B, L, V] logits).

    params: pure-dict parameters of a `DecoderLM` with graph `graphdef`.
    tokens, positions, segment_ids: [B, L] int32 in the models' calling convention
    (segment 0 = padding; packed rows hold several segments).
    Returns [B, L] float32 with out[b, j] = log p(tokens[b, j] | tokens of the same segment
    before j) = log softmax(logits_{j-1} / T)[tokens[b, j]], and 0 where token j has no
    prefix in its segment (the first token of each segment) or is padding. This is the
    π_old / π_θ term of the PPO ratio (paper Eq. 13) on the sampled ids (§2.1).

    Differentiable with respect to `params`; see `logprobs_from_hidden` for memory.
    """
    positions, segment_ids = default_positions_and_segments(tokens, positions, segment_ids)
    model = nnx.merge(graphdef, params)
    hidden, _ = model.hidden_states(tokens, positions, segment_ids)
    # Position i predicts token i + 1: score the next token, then shift right by one.
    nxt = jnp.concatenate([tokens[:, 1:], jnp.zeros_like(tokens[:, :1])], axis=1)
    lp_next = logprobs_from_hidden(hidden, model.unembedding(), nxt, chunk_size=chunk_size,
                                   temperature=temperature)
    valid = (segment_ids[:, 1:] == segment_ids[:, :-1]) & (segment_ids[:, 1:] != 0)
    shifted = jnp.where(valid, lp_next[:, :-1], 0.0)
    return jnp.concatenate([jnp.zeros_like(shifted[:, :1]), shifted], axis=1)


def logprob_gap(rollout_logprobs: jax.Array, train_logprobs: jax.Array,
                mask: jax.Array) -> dict[str, jax.Array]:
    """The train/rollout log-probability gap over masked tokens, d = lp_train - lp_rollout.

    rollout_logprobs (the sampler's), train_logprobs (recomputed on the packed arrays), mask
    (generated tokens, bool or 0/1): [B, L] each. Returns float32 scalars:
    "logprob_gap_mean_abs" Σ mask·|d| / Σ mask (the paper's "training–inference
    log-probability gap", 4.66e-3 to 4.98e-3 in §3.3), "logprob_gap_max_abs" max |d| and
    "logprob_gap_mean" Σ mask·d / Σ mask; all 0 without a masked token. Jit-able.
    """
    chex.assert_equal_shape([rollout_logprobs, train_logprobs, mask])
    m = jnp.asarray(mask).astype(bool)
    d = jnp.where(m, jnp.asarray(train_logprobs, jnp.float32)
                  - jnp.asarray(rollout_logprobs, jnp.float32), 0.0)
    n = jnp.maximum(jnp.sum(m.astype(jnp.float32)), 1.0)
    return {"logprob_gap_mean_abs": jnp.sum(jnp.abs(d)) / n,
            "logprob_gap_max_abs": jnp.max(jnp.abs(d), initial=0.0),
            "logprob_gap_mean": jnp.sum(d) / n}
