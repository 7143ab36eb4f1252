"""RPR update steps: actor PPO step and critic value step with exact gradient accumulation.

Built on `terminal_rsi.training.train_state` (separate actor/critic `TrainState`s with their own
optax chains), `terminal_rsi.training.losses` (losses as (sum, denom, stats)),
`terminal_rsi.training.forward` (the log-probs and values the losses read, aligned by
`terminal_rsi.training.alignment`) and `terminal_rsi.training.grad_accum` (Σ∇ over
`num_microbatches` slices, exactly the full-batch gradient). Each step is a jitted, donated
`step(state, batch) -> (state, metrics)`; the RPR phase (`terminal_rsi.rpr.update.ppo_update`) runs
them over its minibatches. The batch they read comes from
`terminal_rsi.training.advantages.prepare_ppo_batch`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np
import optax

from terminal_rsi.training.alignment import policy_mask, predictable_mask, trained_mask
from terminal_rsi.training.forward import actor_logprobs, critic_values
from terminal_rsi.training.grad_accum import BatchError, accumulate_gradients, jit_update
from terminal_rsi.training.losses import (
    LossParts,
    PPOConfig,
    clipped_value_loss,
    finalize_policy_stats,
    finalize_value_stats,
    ppo_policy_loss,
)
from terminal_rsi.training.train_state import TrainState, apply_gradients

ACTOR_KEYS = ("tokens", "positions", "segment_ids", "gen_mask", "old_logprobs", "advantages")
CRITIC_KEYS = ("tokens", "positions", "segment_ids", "gen_mask", "old_values", "returns")


def check_batch(batch: Mapping[str, Any], keys=ACTOR_KEYS, num_microbatches: int = 1) -> None:
    """Host-side validation (`grad_accum.BatchError`): keys, equal [B, L] shapes,
    B % microbatches, and no generated token without a prefix in its segment."""
    missing = [k for k in keys if k not in batch]
    if missing:
        raise BatchError(f"PPO batch lacks {missing}; it needs {list(keys)} (all [B, L])")
    shape = np.shape(batch["tokens"])
    bad = {k: np.shape(batch[k]) for k in keys if np.shape(batch[k]) != shape}
    if len(shape) != 2 or bad:
        raise BatchError(f"PPO batch arrays must all be [B, L] = {shape}; got {bad}")
    if shape[0] % num_microbatches:
        raise BatchError(f"batch size {shape[0]} is not divisible by num_microbatches = "
                         f"{num_microbatches}; pad the batch or change the microbatch count")
    gen = np.asarray(batch["gen_mask"], bool)
    orphan = gen & ~np.asarray(predictable_mask(jnp.asarray(batch["segment_ids"])))
    if orphan.any():
        b, t = np.argwhere(orphan)[0]
        raise BatchError(f"gen_mask is set at [{b}, {t}], the first token of its segment (or "
                         "padding); a generated token needs at least one prompt token before it")


def actor_loss_parts(params, graphdef, batch, config: PPOConfig) -> LossParts:
    """Eq. 14 policy loss parts of one (micro)batch (keys ACTOR_KEYS, optional ref_logprobs,
    behavior_logprobs (the sampler's log-probs, for config.is_cap / is_band) and policy_mask:
    [B, L] bool, the positions the policy loss may use, e.g. all but the malformed replies of
    `agent.malformed_mask`; the critic ignores it)."""
    lp, ent = actor_logprobs(params, graphdef, batch, with_entropy=config.entropy_coef > 0,
                             temperature=config.temperature)
    mask = policy_mask(batch)
    return ppo_policy_loss(lp, batch["old_logprobs"], batch["advantages"], mask, config,
                           segment_ids=batch["segment_ids"],
                           ref_logprobs=batch.get("ref_logprobs"), entropy=ent,
                           behavior_logprobs=batch.get("behavior_logprobs"))


def critic_loss_parts(params, graphdef, batch, config: PPOConfig) -> LossParts:
    """Eq. 14 clipped value loss parts of one (micro)batch (keys CRITIC_KEYS)."""
    values = critic_values(params, graphdef, batch)
    mask = trained_mask(batch["gen_mask"], batch["segment_ids"])
    return clipped_value_loss(values, batch["old_values"], batch["returns"], mask, config,
                              segment_ids=batch["segment_ids"])


def _actor_update(state: TrainState, batch, config: PPOConfig, m: int):
    grads, parts = accumulate_gradients(
        lambda p, mb: actor_loss_parts(p, state.graphdef, mb, config), state.params, batch, m)
    metrics = {"loss": parts.loss, "grad_norm": optax.tree.norm(grads),
               **finalize_policy_stats(parts.stats)}
    return apply_gradients(state, grads), metrics


def _critic_update(state: TrainState, batch, config: PPOConfig, m: int):
    grads, parts = accumulate_gradients(
        lambda p, mb: critic_loss_parts(p, state.graphdef, mb, config), state.params, batch, m)
    metrics = {"loss": parts.loss, "grad_norm": optax.tree.norm(grads),
               **finalize_value_stats(parts.stats)}
    return apply_gradients(state, grads), metrics


def make_actor_step(config: PPOConfig, num_microbatches: int = 1,
                    state: TrainState | None = None, donate: bool = True):
    """Jitted `step(actor_state, batch) -> (actor_state, metrics)` (Eq. 14 policy loss).

    batch: ACTOR_KEYS, all [B, L] (B divisible by num_microbatches), optional ref_logprobs.
    Metrics: loss, grad_norm (before the chain's clipping), `finalize_policy_stats`.
    Pass `state` to pin output shardings to its current shardings.
    """
    fn = lambda st, batch: _actor_update(st, batch, config, num_microbatches)
    return jit_update(fn, (state,) if state is not None else (), donate, 1)


def make_critic_step(config: PPOConfig, num_microbatches: int = 1,
                     state: TrainState | None = None, donate: bool = True):
    """Jitted `step(critic_state, batch) -> (critic_state, metrics)` (Eq. 14 value loss).

    batch: CRITIC_KEYS, all [B, L]. Metrics: loss, grad_norm, `finalize_value_stats`
    (value clip fraction, explained variance, value/return moments).
    """
    fn = lambda st, batch: _critic_update(st, batch, config, num_microbatches)
    return jit_update(fn, (state,) if state is not None else (), donate, 1)


def make_rpr_step(config: PPOConfig, num_microbatches: int = 1, *, update_actor: bool = True,
                  states: tuple[TrainState, TrainState] | None = None, donate: bool = True):
    """Jitted `step(actor, critic, batch) -> (actor, critic, metrics)`; one RPR update.

    With `update_actor=False` (the phase's critic-only warm-up updates, §2.1 Eq. 4) the actor
    state is returned untouched (bit-identical) and only the critic moves. Metrics are
    prefixed `actor/` and `critic/`. batch: the union of ACTOR_KEYS and CRITIC_KEYS.
    """

    def fn(actor, critic, batch):
        critic, cm = _critic_update(critic, batch, config, num_microbatches)
        metrics = {f"critic/{k}": v for k, v in cm.items()}
        if update_actor:
            actor, am = _actor_update(actor, batch, config, num_microbatches)
            metrics.update({f"actor/{k}": v for k, v in am.items()})
        return actor, critic, metrics

    return jit_update(fn, states if states is not None else (), donate, 2)
