"""The PPO update of one rollout step (§2.4): the epochs of critic and actor steps over the
minibatches of the packed rows (`ppo_update`), each minibatch cut to its own width.

    widths = update_widths(batch["segment_ids"], cache_multiple, length_grouping=True)
    actor, critic, critic_metrics, actor_metrics = ppo_update(
        actor, critic, batch, widths, rng, actor_step=actor_step, critic_step=critic_step,
        epochs=1, num_minibatches=2)

Minibatches (`minibatch_rows`) are random (the textbook split), or with `length_grouping`
rows of similar width, so short single-turn episodes no longer pay for the longest multi-turn
one (bimodal lengths: about 2x less update compute on the tiny default,
docs/performance.md). Cutting a minibatch to its longest row (`take_rows`) is exact: causal
models and the per-position losses never read the dropped padding. `grouped_forward`
evaluates the pre-update log-probs and values the same way.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import numpy as np

from terminal_rsi.training.train_state import TrainState

# `step(state, minibatch) -> (state, metrics)`: `ppo_step.make_actor_step` / `make_critic_step`
Step = Callable[[TrainState, dict], tuple[TrainState, dict]]


def row_widths(segment_ids: np.ndarray, multiple: int) -> np.ndarray:
    """[B] real length of each row (1 + its last real position) rounded up to `multiple`,
    capped at the packed width."""
    seg = np.asarray(segment_ids) > 0
    last = np.where(seg.any(1), seg.shape[1] - np.argmax(seg[:, ::-1], axis=1), 1)
    return np.minimum(-(-last // multiple) * multiple, seg.shape[1])


def update_widths(segment_ids: np.ndarray, multiple: int, length_grouping: bool) -> np.ndarray:
    """[B] width each row is cut to in the update: `row_widths` with `length_grouping`, else
    the full packed width."""
    if length_grouping:
        return row_widths(segment_ids, multiple)
    return np.full(np.shape(segment_ids)[0], np.shape(segment_ids)[1])


def minibatch_rows(widths: np.ndarray, n: int, rng: np.random.Generator,
                   length_grouping: bool) -> list[np.ndarray]:
    """Row indices of the `n` minibatches of one epoch. Random (the textbook split), or
    `length_grouping`: rows sorted by width with random tie-breaks, split into n runs, the runs
    in random order; each minibatch is then cut to its longest row (`take_rows`)."""
    perm = rng.permutation(widths.shape[0])
    if length_grouping:
        perm = perm[np.argsort(widths[perm], kind="stable")]
        parts = np.split(perm, n)
        return [parts[i] for i in rng.permutation(n)]
    return np.split(perm, n)


def take_rows(batch: dict, rows: np.ndarray, width: int) -> dict:
    """Rows `rows` of a [B, L] batch, cut to the first `width` positions. Causal models and the
    per-position losses make the cut exact: the dropped positions are padding."""
    return {k: (v[rows, :width] if v.ndim == 2 else v[rows]) for k, v in batch.items()}


def grouped_forward(fn, groups: list[np.ndarray], widths: np.ndarray):
    """`fn(state, batch) -> [B, L]` evaluated group by group at each group's width, scattered
    back into a zero [B, L] array (old log-probs and values before the update)."""

    def run(state, batch):
        arrays = {k: np.asarray(batch[k]) for k in ("tokens", "positions", "segment_ids")}
        out = np.zeros(arrays["tokens"].shape, np.float32)
        for rows in groups:
            w = int(widths[rows].max())
            out[rows, :w] = np.asarray(fn(state, take_rows(arrays, rows, w)))
        return out

    return run


def ppo_update(actor: TrainState, critic: TrainState, batch: dict, widths: np.ndarray,
               rng: np.random.Generator, *, actor_step: Step, critic_step: Step, epochs: int,
               num_minibatches: int, critic_epochs: int | None = None,
               length_grouping: bool = True, update_actor: bool = True,
               ) -> tuple[TrainState, TrainState, list[dict], list[dict]]:
    """One PPO update: `max(epochs, critic_epochs)` passes over `num_minibatches` minibatches
    (fresh `minibatch_rows` from `rng` each pass), each cut to its widest row; a critic step
    on every minibatch of the first `critic_epochs` passes (None: `epochs`), then an actor
    step on every minibatch of the first `epochs` passes when `update_actor` (False: the
    critic-only warm-up, the actor is returned untouched).

    batch: the prepared PPO batch (`advantages.prepare_ppo_batch`), [B, L] arrays; widths: [B]
    (`update_widths`). Returns (actor, critic, critic metrics, actor metrics), one host dict
    per step taken, in order."""
    batch = {k: np.asarray(v) for k, v in batch.items()}
    critic_epochs = critic_epochs or epochs
    critic_metrics, actor_metrics = [], []
    for epoch in range(max(epochs, critic_epochs)):
        for rows in minibatch_rows(widths, num_minibatches, rng, length_grouping):
            mb = take_rows(batch, rows, int(widths[rows].max()))
            if epoch < critic_epochs:
                critic, metrics = critic_step(critic, mb)
                critic_metrics.append(jax.device_get(metrics))
            if update_actor and epoch < epochs:
                actor, metrics = actor_step(actor, mb)
                actor_metrics.append(jax.device_get(metrics))
    return actor, critic, critic_metrics, actor_metrics
