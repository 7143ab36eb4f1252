"""Advantages and returns of a packed rollout batch, their whitening, and the PPO batch.

    batch = prepare_ppo_batch(actor, critic, packed_arrays,
                              estimator=TurnBoundaryGAE(gamma_turn=1.0, lambda_turn=1.0),
                              next_row=packed.next_row)

`compute_advantages` runs an advantage estimator (`credit.ESTIMATORS`: `TurnBoundaryGAE`,
TB-GAE of Eq. 8-10, or `TokenGAE`, per-token GAE) over the trained tokens
(`alignment.trained_mask`); TB-GAE treats each row as one interaction chain,
so pack one trajectory per row, end every packed trajectory with `dones`, or link the rows
of a split episode with `next_row`. `prepare_ppo_batch` adds what the PPO steps read
(`ppo_step.ACTOR_KEYS` / `CRITIC_KEYS`): π_old recomputed with the training-side actor, the
critic's pre-token values, advantages and returns.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from terminal_rsi.credit import AdvantageEstimator, TurnBoundaryGAE, empty_carry
from terminal_rsi.training.alignment import trained_mask
from terminal_rsi.training.forward import make_logprob_fn, make_value_fn
from terminal_rsi.training.train_state import TrainState

Array = jax.Array


def _chain_depth(next_row: np.ndarray) -> int:
    """Length of the longest chain of successors in `next_row` (-1: none)."""
    depth, row = 0, next_row.copy()
    while (row >= 0).any():
        depth += 1
        row = np.where(row >= 0, next_row[np.clip(row, 0, None)], -1)
    return depth


def compute_advantages(values: Array, batch: Mapping[str, Array], *,
                       estimator: AdvantageEstimator = TurnBoundaryGAE(),
                       next_row: Array | None = None) -> tuple[Array, Array]:
    """(advantages, returns) [B, L] from pre-token values and batch rewards/turn_ids/dones.

    estimator: a `credit.ESTIMATORS` object with its parameters, e.g.
    `TurnBoundaryGAE(gamma_turn, lambda_turn)` (Eq. 8-10; the default, γ_turn = λ_turn = 1)
    or `TokenGAE(gamma, lam)` (the documented first phase used γ = λ = 1). Both skip
    observations (positions outside gen_mask) and return 0 there.
    batch: rewards [B, L] float, gen_mask [B, L] bool, dones [B, L] bool, turn_ids [B, L] int
    (TB-GAE only). Without `next_row`, rows are independent chains (see the module docstring).

    next_row: [B] int (`PackedBatch.next_row`), the row holding the next summarization
    segment of the same episode (-1: none). A row with a successor then continues the
    recursion from its successor's first generated value and advantage (the successor
    row's `Carry` before position 0, Eq. 12), so a split episode gets the advantages of the
    unsplit one. Chains are resolved by repeated passes (as many as the longest chain).
    """
    gen = trained_mask(batch["gen_mask"], batch["segment_ids"])
    rewards = jnp.asarray(batch["rewards"], jnp.float32)
    dones = jnp.asarray(batch["dones"], bool)
    turn_ids = batch.get("turn_ids")
    turn_ids = None if turn_ids is None else jnp.asarray(turn_ids)

    def run(carry):
        return estimator.estimate(rewards, values, gen, dones, turn_ids=turn_ids, carry=carry)

    adv, ret, carry_out = run(None)
    if next_row is not None:
        nxt = np.asarray(next_row)
        has = jnp.asarray(nxt >= 0)
        idx = jnp.asarray(np.clip(nxt, 0, None))
        empty = empty_carry(nxt.shape[0], jnp.float32)
        for _ in range(_chain_depth(nxt)):
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
                      estimator: AdvantageEstimator = TurnBoundaryGAE(),
                      next_row: Array | None = None, num_microbatches: int = 1,
                      logprob_fn=None, value_fn=None) -> dict:
    """Add old_logprobs (recomputed), old_values, advantages, returns to a packed batch.

    batch: tokens, positions, segment_ids, gen_mask, rewards, dones (and turn_ids for
    TB-GAE), all [B, L]. estimator and next_row ([B], not a batch key): as in
    `compute_advantages`. logprob_fn / value_fn: `fn(state, batch) -> [B, L]`
    (default: `forward.make_logprob_fn` / `make_value_fn` over `num_microbatches`).
    """
    logprob_fn = logprob_fn or make_logprob_fn(num_microbatches)
    value_fn = value_fn or make_value_fn(num_microbatches)
    old_lp = logprob_fn(actor, batch)
    values = value_fn(critic, batch)
    adv, ret = compute_advantages(values, batch, estimator=estimator, next_row=next_row)
    return {**batch, "old_logprobs": old_lp, "old_values": values, "advantages": adv,
            "returns": ret}
