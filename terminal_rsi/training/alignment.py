"""Token alignment of packed [B, L] training arrays: which positions are trained, and the
shift from a model's per-position outputs to per-token quantities.

One rule for every training-side module (`terminal_rsi.training.forward`,
`terminal_rsi.training.advantages`, `terminal_rsi.training.ppo_step`, `terminal_rsi.rsr.sft`):
every [B, L] array is indexed by the position t of the token it is about. The causal models produce
at position t an output that has seen tokens 0..t, so:

- `logprobs[b, t] = log π(tokens[b, t] | tokens[b, <t])` is read from logits[b, t-1]
  (the standard shift: the logit at t-1 scores token t);
- the pre-token value `values[b, t] = V(h_{u_j})` of a generated token at t is the critic
  output at t-1 (the history before the token was sampled, Eq. 5/9).

Both are only defined where t ≥ 1 and t-1 lies in the same non-zero segment
(`predictable_mask`); they are 0 elsewhere. `gen_mask[b, t]` marks tokens the policy
generated (as the packer writes it); the losses use `gen_mask & predictable_mask`
(`trained_mask`). A generated token at a segment start has no prefix and is dropped
(`ppo_step.check_batch` rejects it). Rows may be packed with several segments; with
`Aggregation.SAMPLE_MEAN` each (row, segment) is one sample.

`token_logprobs` here is the full [B, L, V] reference from logits; the training path
(`forward.actor_logprobs`) uses `terminal_rsi.models.logprobs.chunked_token_logprobs` (from the
model's parameters, chunked along the sequence) with the same alignment.
"""

from __future__ import annotations

from collections.abc import Mapping

import chex
import jax
import jax.numpy as jnp

Array = jax.Array


def predictable_mask(segment_ids: Array) -> Array:
    """[B, L] bool: t ≥ 1 and segment_ids[t] == segment_ids[t-1] != 0."""
    chex.assert_rank(segment_ids, 2)
    same = (segment_ids[:, 1:] == segment_ids[:, :-1]) & (segment_ids[:, 1:] != 0)
    return jnp.pad(same, ((0, 0), (1, 0)))


def trained_mask(gen_mask: Array, segment_ids: Array) -> Array:
    """[B, L] bool: the positions the losses train and the diagnostics score, generated tokens
    that have a prefix in their segment (gen_mask & `predictable_mask`)."""
    return jnp.asarray(gen_mask, bool) & predictable_mask(segment_ids)


def policy_mask(batch: Mapping[str, Array]) -> Array:
    """The positions of the policy loss: `trained_mask`, and `batch["policy_mask"]` if given."""
    mask = trained_mask(batch["gen_mask"], batch["segment_ids"])
    if batch.get("policy_mask") is not None:
        mask = mask & jnp.asarray(batch["policy_mask"], bool)
    return mask


def shift_to_next_token(x: Array, segment_ids: Array) -> Array:
    """out[b, t] = x[b, t-1] where `predictable_mask`, else 0. x: [B, L, ...] -> same shape."""
    chex.assert_equal_shape_prefix([x, segment_ids], 2)
    pad = [(0, 0), (1, 0)] + [(0, 0)] * (x.ndim - 2)
    shifted = jnp.pad(x[:, :-1], pad)
    ok = predictable_mask(segment_ids).reshape(segment_ids.shape + (1,) * (x.ndim - 2))
    return jnp.where(ok, shifted, 0)


def token_logprobs(logits: Array, tokens: Array, segment_ids: Array,
                   with_entropy: bool = False) -> tuple[Array, Array | None]:
    """logits [B, L, V], tokens [B, L] -> (log π(tokens[t] | <t) [B, L], entropy [B, L] or None).

    logprobs[b, t] = logits[b, t-1, tokens[b, t]] - logsumexp(logits[b, t-1]) where
    `predictable_mask`, else 0; entropy[b, t] = H(softmax(logits[b, t-1])) likewise.
    """
    chex.assert_rank(logits, 3)
    chex.assert_equal_shape([tokens, segment_ids])
    prev = logits[:, :-1].astype(jnp.float32)  # [B, L-1, V] scores tokens 1..L-1
    lse = jax.nn.logsumexp(prev, axis=-1)
    picked = jnp.take_along_axis(prev, tokens[:, 1:, None], axis=-1)[..., 0]
    ok = predictable_mask(segment_ids)
    lp = jnp.where(ok, jnp.pad(picked - lse, ((0, 0), (1, 0))), 0.0)
    ent = None
    if with_entropy:
        p = jax.nn.softmax(prev, axis=-1)
        h = lse - jnp.sum(p * prev, axis=-1)
        ent = jnp.where(ok, jnp.pad(h, ((0, 0), (1, 0))), 0.0)
    return lp, ent
