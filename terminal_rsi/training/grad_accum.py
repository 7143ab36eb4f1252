"""Exact gradient accumulation over microbatches, and the jitted, donated update it feeds.

Generic over the loss: any `parts_fn(params, batch) -> LossParts` (`terminal_rsi.training.losses`:
a loss as (sum, denom, stats)). Used by the PPO steps (`terminal_rsi.training.ppo_step`) and the SFT
step (`terminal_rsi.rsr.sft`).

The batch [B, ...] is split into `num_microbatches` contiguous slices along B
(`split_microbatches`); a `lax.scan` accumulates Σ ∇total_i, Σ total_i, Σ denom_i and the
stats; the applied gradient is Σ ∇total_i / Σ denom_i, exactly the full-batch gradient for
every `Aggregation` (a sample never straddles two microbatches).

    grads, parts = accumulate_gradients(parts_fn, state.params, batch, num_microbatches)
    state = apply_gradients(state, grads)  # terminal_rsi.training.train_state: one optimizer step
    step = jit_update(update, (state,), donate=True, n_state_args=1)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from terminal_rsi.models.trainable import join, split_trainable
from terminal_rsi.runtime import sharding as shd
from terminal_rsi.training.losses import LossParts, combine_stats, safe_divide
from terminal_rsi.training.train_state import TrainState

Array = jax.Array


class BatchError(ValueError):
    """A training batch is malformed (missing key, wrong shape, a batch size the microbatch
    count does not divide, a generated token without prefix)."""


def split_microbatches(batch: Mapping[str, Array], m: int) -> dict:
    """Every [B, ...] array reshaped to [m, B / m, ...] (m contiguous slices along B)."""
    def f(x):
        if x.shape[0] % m:
            raise BatchError(f"batch size {x.shape[0]} not divisible by {m} microbatches")
        return x.reshape(m, x.shape[0] // m, *x.shape[1:])
    return {k: f(jnp.asarray(v)) for k, v in batch.items()}


def _identity_stats(stats_shape: dict) -> dict:
    big = jnp.finfo(jnp.float32).max
    out = {}
    for k, s in stats_shape.items():
        fill = big if k.endswith("_min") else (-big if k.endswith("_max") else 0.0)
        out[k] = jnp.full(s.shape, fill, s.dtype)
    return out


def accumulate_gradients(parts_fn: Callable[[Any, Mapping], LossParts], params,
                         batch: Mapping[str, Array], num_microbatches: int = 1):
    """Σ over microbatches of (∇total, total, denom, stats) via `lax.scan`.

    Returns (grads = Σ∇total / Σdenom, LossParts(Σtotal, Σdenom, combined stats)); the
    gradients are of the trainable part of `params` (`terminal_rsi.models.trainable`: all of it, or
    with LoRA adapters only they), None at frozen leaves.
    """

    trainable, frozen = split_trainable(params)

    def grad_parts(mb):
        def f(t):
            parts = parts_fn(join(t, frozen), mb)
            return parts.total, parts
        (_, parts), g = jax.value_and_grad(f, has_aux=True)(trainable)
        return g, parts

    if num_microbatches == 1:
        g, parts = grad_parts(dict(batch))
    else:
        mbs = split_microbatches(batch, num_microbatches)
        _, p_shape = jax.eval_shape(grad_parts, jax.tree.map(lambda x: x[0], mbs))
        init = (jax.tree.map(jnp.zeros_like, trainable),
                LossParts(jnp.zeros(p_shape.total.shape, jnp.float32),
                          jnp.zeros(p_shape.denom.shape, jnp.float32),
                          _identity_stats(p_shape.stats)))

        def body(carry, mb):
            g_acc, acc = carry
            g, parts = grad_parts(mb)
            g_acc = jax.tree.map(jnp.add, g_acc, g)
            acc = LossParts(acc.total + parts.total, acc.denom + parts.denom,
                            combine_stats(acc.stats, parts.stats))
            return (g_acc, acc), None

        (g, parts), _ = jax.lax.scan(body, init, mbs)
    scale = safe_divide(jnp.ones((), jnp.float32), parts.denom)
    grads = jax.tree.map(lambda x: (x * scale).astype(x.dtype), g)
    return grads, parts


def jit_update(fn, states: tuple[TrainState | None, ...], donate: bool, n_state_args: int):
    """`jax.jit(fn)` for an update `fn(*states, batch) -> (*states, metrics)`: the first
    `n_state_args` arguments donated when `donate`; when every state of `states` is given,
    the output states keep their current shardings and the metrics are replicated."""
    kwargs: dict[str, Any] = {"donate_argnums": tuple(range(n_state_args)) if donate else ()}
    if states and all(s is not None for s in states):
        mesh = states[0].step.sharding.mesh
        out = tuple(jax.tree.map(lambda x: x.sharding, s) for s in states)
        kwargs["out_shardings"] = (*out, shd.replicated(mesh))
    return jax.jit(fn, **kwargs)
