"""Training-side forward passes: the actor's token log-probabilities and the critic's
pre-token values of a packed [B, L] batch, aligned per token (`terminal_rsi.training.alignment`).

`actor_logprobs` (π_old recomputation and the PPO / SFT losses) uses the chunked
`terminal_rsi.models.logprobs.chunked_token_logprobs` (at most [B, chunk, V] logits alive, forward
and backward); with the entropy bonus on it computes the full [B, L, V] logits
(`alignment.token_logprobs`, the entropy needs the full softmax). `make_logprob_fn` /
`make_value_fn` jit them over `num_microbatches` slices without gradients (the values and
log-probs of a rollout batch before the update).
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
from flax import nnx

from terminal_rsi.models import logprobs as lpm
from terminal_rsi.training.alignment import shift_to_next_token, token_logprobs
from terminal_rsi.training.grad_accum import split_microbatches
from terminal_rsi.training.train_state import TrainState

Array = jax.Array

FORWARD_KEYS = ("tokens", "positions", "segment_ids")


def actor_logits(params, graphdef: nnx.GraphDef, batch: Mapping[str, Array]) -> Array:
    """Full next-token logits [B, L, V] of the DecoderLM `nnx.merge(graphdef, params)`."""
    logits, _ = nnx.merge(graphdef, params)(batch["tokens"], batch["positions"],
                                            batch["segment_ids"])
    return logits


def actor_logprobs(params, graphdef: nnx.GraphDef, batch: Mapping[str, Array],
                   with_entropy: bool = False, *, chunk_size: int | None = None,
                   temperature: float = 1.0) -> tuple[Array, Array | None]:
    """Token log-probs [B, L] (and entropy) of the DecoderLM `nnx.merge(graphdef, params)`
    sampled at `temperature`: log softmax(logits / T) (the policy π_θ,T that generated the
    rollouts; T = 1 is the paper's setting).

    Without entropy: `terminal_rsi.models.logprobs.chunked_token_logprobs` (chunk_size None:
    its default, 1024 as in Appendix A). With entropy: full [B, L, V] logits."""
    if not with_entropy:
        chunk = lpm.DEFAULT_CHUNK_SIZE if chunk_size is None else chunk_size
        return lpm.chunked_token_logprobs(params, graphdef, batch["tokens"],
                                          batch["positions"], batch["segment_ids"],
                                          chunk_size=chunk, temperature=temperature), None
    logits = actor_logits(params, graphdef, batch)
    if temperature != 1.0:
        logits = logits.astype(jnp.float32) / temperature
    return token_logprobs(logits, batch["tokens"], batch["segment_ids"], with_entropy)


def critic_values(params, graphdef: nnx.GraphDef, batch: Mapping[str, Array]) -> Array:
    """Pre-token values [B, L] of the ValueModel: V at t-1 placed at t (0 where undefined)."""
    model = nnx.merge(graphdef, params)
    out = model(batch["tokens"], batch["positions"], batch["segment_ids"])
    return shift_to_next_token(out, batch["segment_ids"])


def _map_microbatches(fn, batch: Mapping[str, Array], m: int) -> Array:
    if m == 1:
        return fn(dict(batch))
    out = jax.lax.map(fn, split_microbatches(batch, m))
    return out.reshape(-1, *out.shape[2:])


def make_logprob_fn(num_microbatches: int = 1, temperature: float = 1.0):
    """Jitted `fn(actor_state, batch) -> logprobs [B, L]`: π_old recomputation (§2.4: RPR
    recomputes π_old with the training-side old actor before the update), at the sampling
    `temperature` (the same as `PPOConfig.temperature` of the update)."""

    def fn(state: TrainState, batch):
        keys = {k: batch[k] for k in FORWARD_KEYS}
        return _map_microbatches(
            lambda mb: actor_logprobs(state.params, state.graphdef, mb,
                                      temperature=temperature)[0], keys, num_microbatches)

    return jax.jit(fn)


def make_value_fn(num_microbatches: int = 1):
    """Jitted `fn(critic_state, batch) -> pre-token values [B, L]` (detached v_j)."""

    def fn(state: TrainState, batch):
        keys = {k: batch[k] for k in FORWARD_KEYS}
        return _map_microbatches(lambda mb: critic_values(state.params, state.graphdef, mb),
                                 keys, num_microbatches)

    return jax.jit(fn)
