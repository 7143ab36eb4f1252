"""RPR update steps: actor PPO step and critic value step with exact gradient accumulation.

Built on `terminal_rsi.train_state` (separate actor/critic `TrainState`s with their own optax
chains) and `terminal_rsi.losses` (losses as (sum, denom, stats)). Lives next to
`train_state.py` because it is the same kind of thing (a jitted, donated `step(state, batch)
-> (state, metrics)`); the RPR phase loop (`terminal_rsi/rpr/`) calls these.

Token alignment (one rule for the whole module)
-----------------------------------------------
Every [B, L] array is indexed by the position t of the token it is about. The causal models
produce at position t an output that has seen tokens 0..t, so:

- `logprobs[b, t] = log π(tokens[b, t] | tokens[b, <t])` is read from logits[b, t-1]
  (the standard shift: the logit at t-1 scores token t);
- the pre-token value `values[b, t] = V(h_{u_j})` of a generated token at t is the critic
  output at t-1 (the history before the token was sampled, Eq. 5/9).

Both are only defined where t ≥ 1 and t-1 lies in the same non-zero segment
(`predictable_mask`); they are 0 elsewhere. `gen_mask[b, t]` marks tokens the policy
generated (as the packer writes it); the losses use `gen_mask & predictable_mask`. A
generated token at a segment start has no prefix and is dropped (`check_batch` rejects it).
Rows may be packed with several segments; with `Aggregation.SAMPLE_MEAN` each (row,
segment) is one sample. TB-GAE (`compute_advantages`) treats each row as one interaction
chain, so pack one trajectory per row, or end every packed trajectory with `dones`.

`actor_logprobs` (the training-side path: π_old recomputation and the PPO loss) uses the
chunked `terminal_rsi.logprobs.token_logprobs` (same [B, L] alignment, at most
[B, chunk, V] logits alive, forward and backward); `token_logprobs` below is the full
[B, L, V] reference, still used when the entropy bonus is on (it needs the full softmax).

Gradient accumulation: the batch [B, ...] is split into `num_microbatches` contiguous
slices along B; a `lax.scan` accumulates Σ ∇total_i, Σ total_i, Σ denom_i and the stats;
the applied gradient is Σ ∇total_i / Σ denom_i, exactly the full-batch gradient for every
`Aggregation` (a sample never straddles two microbatches).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from terminal_rsi import sharding as shd
from terminal_rsi.credit import empty_carry, gae, tb_gae
from terminal_rsi.losses import (
    LossParts,
    PPOConfig,
    clipped_value_loss,
    combine_stats,
    finalize_policy_stats,
    finalize_value_stats,
    ppo_policy_loss,
    safe_divide,
)
from terminal_rsi.train_state import TrainState

Array = jax.Array

ACTOR_KEYS = ("tokens", "positions", "segment_ids", "gen_mask", "old_logprobs", "advantages")
CRITIC_KEYS = ("tokens", "positions", "segment_ids", "gen_mask", "old_values", "returns")


class BatchError(ValueError):
    """A PPO batch is malformed (missing key, wrong shape, generated token without prefix)."""


# ----------------------------------------------------------------------------- alignment


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


def actor_logprobs(params, graphdef: nnx.GraphDef, batch: Mapping[str, Array],
                   with_entropy: bool = False, *, chunk_size: int | None = None,
                   temperature: float = 1.0) -> tuple[Array, Array | None]:
    """Token log-probs [B, L] (and entropy) of the DecoderLM `nnx.merge(graphdef, params)`
    sampled at `temperature`: log softmax(logits / T) (the policy π_θ,T that generated the
    rollouts; T = 1 is the paper's setting).

    Without entropy: the chunked `terminal_rsi.logprobs.token_logprobs` (chunk_size None:
    its default, 1024 as in Appendix A). With entropy: full [B, L, V] logits."""
    if not with_entropy:
        from terminal_rsi import logprobs as lpm

        chunk = lpm.DEFAULT_CHUNK_SIZE if chunk_size is None else chunk_size
        return lpm.token_logprobs(params, graphdef, batch["tokens"], batch["positions"],
                                  batch["segment_ids"], chunk_size=chunk,
                                  temperature=temperature), None
    model = nnx.merge(graphdef, params)
    logits, _ = model(batch["tokens"], batch["positions"], batch["segment_ids"])
    if temperature != 1.0:
        logits = logits.astype(jnp.float32) / temperature
    return token_logprobs(logits, batch["tokens"], batch["segment_ids"], with_entropy)


def critic_values(params, graphdef: nnx.GraphDef, batch: Mapping[str, Array]) -> Array:
    """Pre-token values [B, L] of the ValueModel: V at t-1 placed at t (0 where undefined)."""
    model = nnx.merge(graphdef, params)
    out = model(batch["tokens"], batch["positions"], batch["segment_ids"])
    return shift_to_next_token(out, batch["segment_ids"])


def check_batch(batch: Mapping[str, Any], keys=ACTOR_KEYS, num_microbatches: int = 1) -> None:
    """Host-side validation (BatchError): keys, equal [B, L] shapes, B % microbatches, and
    no generated token without a prefix in its segment."""
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


# ----------------------------------------------------------------------------- accumulation


def _split(batch: Mapping[str, Array], m: int) -> dict:
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

    Returns (grads = Σ∇total / Σdenom, LossParts(Σtotal, Σdenom, combined stats)).
    """

    def grad_parts(mb):
        def f(p):
            parts = parts_fn(p, mb)
            return parts.total, parts
        (_, parts), g = jax.value_and_grad(f, has_aux=True)(params)
        return g, parts

    if num_microbatches == 1:
        g, parts = grad_parts(dict(batch))
    else:
        mbs = _split(batch, num_microbatches)
        _, p_shape = jax.eval_shape(grad_parts, jax.tree.map(lambda x: x[0], mbs))
        init = (jax.tree.map(jnp.zeros_like, params),
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


def _apply(state: TrainState, grads) -> TrainState:
    updates, opt_state = state.tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state)


def _jit(fn, states: tuple[TrainState | None, ...], donate: bool, n_state_args: int):
    kwargs: dict[str, Any] = {"donate_argnums": tuple(range(n_state_args)) if donate else ()}
    if states and all(s is not None for s in states):
        mesh = states[0].step.sharding.mesh
        out = tuple(jax.tree.map(lambda x: x.sharding, s) for s in states)
        kwargs["out_shardings"] = (*out, shd.replicated(mesh))
    return jax.jit(fn, **kwargs)


# ----------------------------------------------------------------------------- steps


def actor_loss_parts(params, graphdef, batch, config: PPOConfig) -> LossParts:
    """Eq. 14 policy loss parts of one (micro)batch (keys ACTOR_KEYS, optional ref_logprobs
    and policy_mask: [B, L] bool, the positions the policy loss may use, e.g. all but the
    malformed replies of `agent.malformed_mask`; the critic ignores it)."""
    lp, ent = actor_logprobs(params, graphdef, batch, with_entropy=config.entropy_coef > 0,
                             temperature=config.temperature)
    mask = policy_mask(batch)
    return ppo_policy_loss(lp, batch["old_logprobs"], batch["advantages"], mask, config,
                           segment_ids=batch["segment_ids"],
                           ref_logprobs=batch.get("ref_logprobs"), entropy=ent)


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
    return _apply(state, grads), metrics


def _critic_update(state: TrainState, batch, config: PPOConfig, m: int):
    grads, parts = accumulate_gradients(
        lambda p, mb: critic_loss_parts(p, state.graphdef, mb, config), state.params, batch, m)
    metrics = {"loss": parts.loss, "grad_norm": optax.tree.norm(grads),
               **finalize_value_stats(parts.stats)}
    return _apply(state, grads), metrics


def make_actor_step(config: PPOConfig, num_microbatches: int = 1,
                    state: TrainState | None = None, donate: bool = True):
    """Jitted `step(actor_state, batch) -> (actor_state, metrics)` (Eq. 14 policy loss).

    batch: ACTOR_KEYS, all [B, L] (B divisible by num_microbatches), optional ref_logprobs.
    Metrics: loss, grad_norm (before the chain's clipping), `finalize_policy_stats`.
    Pass `state` to pin output shardings to its current shardings.
    """
    fn = lambda st, batch: _actor_update(st, batch, config, num_microbatches)
    return _jit(fn, (state,) if state is not None else (), donate, 1)


def make_critic_step(config: PPOConfig, num_microbatches: int = 1,
                     state: TrainState | None = None, donate: bool = True):
    """Jitted `step(critic_state, batch) -> (critic_state, metrics)` (Eq. 14 value loss).

    batch: CRITIC_KEYS, all [B, L]. Metrics: loss, grad_norm, `finalize_value_stats`
    (value clip fraction, explained variance, value/return moments).
    """
    fn = lambda st, batch: _critic_update(st, batch, config, num_microbatches)
    return _jit(fn, (state,) if state is not None else (), donate, 1)


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

    return _jit(fn, states if states is not None else (), donate, 2)


# ----------------------------------------------------------------------------- rollout side


def _map_microbatches(fn, batch: Mapping[str, Array], m: int) -> Array:
    if m == 1:
        return fn(dict(batch))
    out = jax.lax.map(fn, _split(batch, m))
    return out.reshape(-1, *out.shape[2:])


def make_logprob_fn(num_microbatches: int = 1, temperature: float = 1.0):
    """Jitted `fn(actor_state, batch) -> logprobs [B, L]`: π_old recomputation (§2.4: RPR
    recomputes π_old with the training-side old actor before the update), at the sampling
    `temperature` (the same as `PPOConfig.temperature` of the update)."""

    def fn(state: TrainState, batch):
        keys = {k: batch[k] for k in ("tokens", "positions", "segment_ids")}
        return _map_microbatches(
            lambda mb: actor_logprobs(state.params, state.graphdef, mb,
                                      temperature=temperature)[0], keys, num_microbatches)

    return jax.jit(fn)


def make_value_fn(num_microbatches: int = 1):
    """Jitted `fn(critic_state, batch) -> pre-token values [B, L]` (detached v_j)."""

    def fn(state: TrainState, batch):
        keys = {k: batch[k] for k in ("tokens", "positions", "segment_ids")}
        return _map_microbatches(lambda mb: critic_values(state.params, state.graphdef, mb),
                                 keys, num_microbatches)

    return jax.jit(fn)


def compute_advantages(values: Array, batch: Mapping[str, Array], *, estimator: str = "tb_gae",
                       gamma_turn: float = 1.0, lambda_turn: float = 1.0,
                       gamma: float = 1.0, lam: float = 1.0,
                       next_row: Array | None = None) -> tuple[Array, Array]:
    """(advantages, returns) [B, L] from pre-token values and batch rewards/turn_ids/dones.

    estimator "tb_gae": `credit.tb_gae` with (γ_turn, λ_turn) (Eq. 8-10); "gae": per-token
    `credit.gae` with (γ, λ) (the documented first phase used γ = λ = 1). Both skip
    observations (positions outside gen_mask) and return 0 there.
    batch: rewards [B, L] float, gen_mask [B, L] bool, dones [B, L] bool, turn_ids [B, L] int
    (tb_gae only). Without `next_row`, rows are independent chains (see the module docstring).

    next_row: [B] int (`PackedBatch.next_row`), the row holding the next summarization
    segment of the same episode (-1: none). A row with a successor then continues the
    recursion from its successor's first generated value and advantage (the successor
    row's `Carry` before position 0, Eq. 12), so a split episode gets the advantages of the
    unsplit one. Chains are resolved by repeated passes (as many as the longest chain).
    """
    if estimator not in ("tb_gae", "gae"):
        raise ValueError(f"unknown advantage estimator {estimator!r}; use 'tb_gae' or 'gae'")
    gen = trained_mask(batch["gen_mask"], batch["segment_ids"])
    rewards = jnp.asarray(batch["rewards"], jnp.float32)
    dones = jnp.asarray(batch["dones"], bool)
    turn_ids = jnp.asarray(batch["turn_ids"]) if estimator == "tb_gae" else None

    def run(carry):
        if estimator == "tb_gae":
            return tb_gae(rewards, values, turn_ids, gen, dones, gamma_turn=gamma_turn,
                          lambda_turn=lambda_turn, carry=carry)
        return gae(rewards, values, gen, dones, gamma=gamma, lam=lam, carry=carry)

    adv, ret, carry_out = run(None)
    if next_row is not None:
        nxt = np.asarray(next_row)
        depth, row = 0, nxt.copy()  # longest chain of successors
        while (row >= 0).any():
            depth += 1
            row = np.where(row >= 0, nxt[np.clip(row, 0, None)], -1)
        has = jnp.asarray(nxt >= 0)
        idx = jnp.asarray(np.clip(nxt, 0, None))
        empty = empty_carry(nxt.shape[0], jnp.float32)
        for _ in range(depth):
            carry = jax.tree.map(lambda c, e: jnp.where(has, c[idx], e), carry_out, empty)
            adv, ret, carry_out = run(carry)
    return adv, ret


def whiten_advantages(advantages: Array, gen_mask: Array, segment_ids: Array,
                      eps: float = 1e-4) -> Array:
    """Advantages standardized over the trained tokens (gen_mask & predictable) of the batch:
    (A - mean) / (std + eps) there, 0 elsewhere. Removes a common offset of the critic's
    errors (a critic lagging a changing policy biases every advantage the same way) and fixes
    the update's scale; the paper does not whiten (`ppo.normalize_advantages`, default off).
    `eps` keeps a batch of equal advantages (every episode failed and the critic agrees) at
    about 0 instead of blowing float32 rounding up to unit scale."""
    adv = jnp.asarray(advantages, jnp.float32)
    m = trained_mask(gen_mask, segment_ids).astype(jnp.float32)
    n = jnp.maximum(m.sum(), 1.0)
    mean = (adv * m).sum() / n
    std = jnp.sqrt((jnp.square(adv - mean) * m).sum() / n)
    return jnp.where(m > 0, (adv - mean) / (std + eps), 0.0)


def prepare_ppo_batch(actor: TrainState, critic: TrainState, batch: Mapping[str, Array], *,
                      num_microbatches: int = 1, logprob_fn=None, value_fn=None,
                      **advantage_kwargs) -> dict:
    # advantage_kwargs may hold next_row ([B], `compute_advantages`); it is not a batch key.
    """Add old_logprobs (recomputed), old_values, advantages, returns to a packed batch.

    batch: tokens, positions, segment_ids, gen_mask, rewards, dones (and turn_ids for
    TB-GAE), all [B, L]. advantage_kwargs go to `compute_advantages`.
    """
    logprob_fn = logprob_fn or make_logprob_fn(num_microbatches)
    value_fn = value_fn or make_value_fn(num_microbatches)
    old_lp = logprob_fn(actor, batch)
    values = value_fn(critic, batch)
    adv, ret = compute_advantages(values, batch, **advantage_kwargs)
    return {**batch, "old_logprobs": old_lp, "old_values": values, "advantages": adv,
            "returns": ret}
