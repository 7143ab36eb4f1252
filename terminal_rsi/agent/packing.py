"""The one packing function: trajectories → [B, L] training arrays (DESIGN.md data flow).

Each row is one summarization segment of one kept episode (its linear history: prompt,
then sampled ids and observation ids turn by turn), right-padded. Rewards are placed once,
on the episode's final generated token, and only for `keep_reward` episodes (which also get
done = 1 there). Non-final segments and `keep_bootstrap` episodes end in a cut-off: no
reward, no done, `truncated[row] = True`, and `next_row` links a segment to its successor
so the trainer continues the TB-GAE recursion from the next segment's first value
(`terminal_rsi.credit.bootstrap_carry`), never from an implied zero. `drop` episodes are
not packed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from terminal_rsi.agent.trajectory import TrainingPolicy, Trajectory
from terminal_rsi.credit import validate_tb_gae_inputs
from terminal_rsi.models.sampling import Buckets, StopReason


class PackingError(ValueError):
    """Trajectories cannot be packed (row longer than max_len, broken invariant)."""


@dataclasses.dataclass
class PackedBatch:
    """[B, L] arrays (B and L rounded up to the buckets; padding rows/positions are 0).

    tokens: int32 token ids.
    gen_mask: bool, True on sampled (policy-generated) positions.
    turn_ids: int32 episode turn index of each position (-1 on padding).
    dones: bool, True on the final generated token of a terminated (keep_reward) episode.
    rewards: float32, the episode reward on that same position, 0 elsewhere.
    logprobs: float32 sampling log-probabilities at generated positions, 0 elsewhere.
    positions: int32 position within the row (0 on padding).
    segment_ids: int32 1 on real tokens, 0 on padding (the model's attention convention).
    row_episode, row_segment: [B] int32 index into the kept trajectories / segment (-1 pad).
    next_row: [B] int32 row of the next segment of the same episode, -1 if none.
    truncated: [B] bool, the row ends in a cut-off that needs a bootstrap.
    policy_version: [B] int32 policy version of the episode (-1 on padding rows).
    num_rows: real rows (the rest is batch padding).
    kept: indices (into the input list) of the packed trajectories; dropped: the others.
    """

    tokens: np.ndarray
    gen_mask: np.ndarray
    turn_ids: np.ndarray
    dones: np.ndarray
    rewards: np.ndarray
    logprobs: np.ndarray
    positions: np.ndarray
    segment_ids: np.ndarray
    row_episode: np.ndarray
    row_segment: np.ndarray
    next_row: np.ndarray
    truncated: np.ndarray
    policy_version: np.ndarray
    num_rows: int
    kept: list[int]
    dropped: list[int]


def _segment_rows(trajectories: Sequence[Trajectory],
                  max_len: int | None) -> tuple[list[tuple], list[int], list[int]]:
    """(rows, kept, dropped): a row (kept-episode index, segment, tokens, generated mask,
    turn ids, logprobs) per segment with generated tokens; an episode with no such segment
    (or with training policy DROP) is dropped."""
    rows = []
    kept, dropped = [], []
    for e, traj in enumerate(trajectories):
        pol = traj.training_policy
        if pol == TrainingPolicy.DROP or traj.num_generated == 0:
            dropped.append(e)
            continue
        segs = sorted({t.segment for t in traj.turns})
        first_row = len(rows)
        for k in segs:
            toks, gen, tid, lp = traj.segment_tokens(k)
            if not (len(toks) == len(gen) == len(tid) == len(lp)):
                raise PackingError(f"episode {e} segment {k}: unequal lengths")
            if max_len is not None and len(toks) > max_len:
                raise PackingError(f"episode {e} ({traj.task_id}) segment {k} has {len(toks)} "
                                   f"tokens > max_len {max_len}; raise max_len or lower the "
                                   "harness summarization threshold")
            if not any(gen):
                continue  # a segment without generated tokens carries nothing to train
            rows.append((len(kept), k, toks, gen, tid, lp))
        if len(rows) == first_row:
            dropped.append(e)
            continue
        kept.append(e)
    return rows, kept, dropped


def pack_trajectories(trajectories: Sequence[Trajectory], *, buckets=None,
                      max_len: int | None = None) -> PackedBatch:
    """Pack trajectories into [B, L] arrays (see `PackedBatch`).

    Args:
      trajectories: finished episodes (each with a terminal reason).
      buckets: `terminal_rsi.models.sampling.Buckets` for B (`batch`) and L (`cache`) rounding;
        default `Buckets()`.
      max_len: longest allowed row (PackingError if a segment is longer).

    Invariants asserted: every row's arrays have equal length; rewards and dones only on
    generated positions (`validate_tb_gae_inputs`); each keep_reward episode has exactly one
    done and its reward on that position; no reward or done for cut-off rows.
    """
    if buckets is None:
        buckets = Buckets()
    rows, kept, dropped = _segment_rows(trajectories, max_len)
    n = len(rows)
    b = buckets.batch(max(n, 1))
    width = buckets.cache(max((len(r[2]) for r in rows), default=1))
    out = {
        "tokens": np.zeros((b, width), np.int32),
        "gen_mask": np.zeros((b, width), bool),
        "turn_ids": np.full((b, width), -1, np.int32),
        "dones": np.zeros((b, width), bool),
        "rewards": np.zeros((b, width), np.float32),
        "logprobs": np.zeros((b, width), np.float32),
        "positions": np.zeros((b, width), np.int32),
        "segment_ids": np.zeros((b, width), np.int32),
    }
    row_episode = np.full((b,), -1, np.int32)
    row_segment = np.full((b,), -1, np.int32)
    next_row = np.full((b,), -1, np.int32)
    truncated = np.zeros((b,), bool)
    version = np.full((b,), -1, np.int32)
    for i, (ke, k, toks, gen, tid, lp) in enumerate(rows):
        traj = trajectories[kept[ke]]
        m = len(toks)
        out["tokens"][i, :m] = toks
        out["gen_mask"][i, :m] = np.asarray(gen, bool)
        out["turn_ids"][i, :m] = tid
        out["logprobs"][i, :m] = lp
        out["positions"][i, :m] = np.arange(m)
        out["segment_ids"][i, :m] = 1
        row_episode[i], row_segment[i] = ke, k
        version[i] = traj.policy_version
        last_of_episode = i + 1 == n or rows[i + 1][0] != ke
        if not last_of_episode:
            next_row[i] = i + 1
            truncated[i] = True
        elif traj.training_policy == TrainingPolicy.KEEP_REWARD:
            j = int(np.flatnonzero(out["gen_mask"][i])[-1])
            out["dones"][i, j] = True
            out["rewards"][i, j] = np.float32(traj.reward)
        else:
            truncated[i] = True
    batch = PackedBatch(**out, row_episode=row_episode, row_segment=row_segment,
                        next_row=next_row, truncated=truncated, policy_version=version,
                        num_rows=n, kept=kept, dropped=dropped)
    check_packed(batch, [trajectories[e] for e in kept])
    return batch


def malformed_mask(batch: PackedBatch, trajectories: Sequence[Trajectory]) -> np.ndarray:
    """[B, L] bool: True on the generated tokens of turns whose reply held no valid action
    (`Turn.parse_error`) or was cut off by the output or context limit (`stop_reason`
    `StopReason.LENGTH` / `CONTEXT`). `trajectories` is the list `batch` was packed from.

    The RPR phase can leave these tokens out of the policy loss (`ppo.mask_malformed`; the
    critic still trains on them): the overlong filtering of DAPO (Yu et al., 2025) extended
    to replies that failed to parse. A malformed reply then costs its episode the reward, but
    its tokens never receive a negative advantage, which otherwise, on a small model whose
    replies are mostly malformed, pushes the whole reply distribution toward noise.
    """
    cut_off = (StopReason.LENGTH.value, StopReason.CONTEXT.value)
    out = np.zeros(batch.gen_mask.shape, bool)
    for i in range(batch.num_rows):
        traj = trajectories[batch.kept[int(batch.row_episode[i])]]
        bad = [ti for ti, t in enumerate(traj.turns)
               if t.parse_error is not None or t.stop_reason in cut_off]
        if bad:
            out[i] = batch.gen_mask[i] & np.isin(batch.turn_ids[i], bad)
    return out


def check_packed(batch: PackedBatch, kept: Sequence[Trajectory]) -> None:
    """Assert the packing invariants (PackingError / ValueError naming row and position)."""
    shapes = {k: getattr(batch, k).shape for k in
              ("tokens", "gen_mask", "turn_ids", "dones", "rewards", "logprobs", "positions",
               "segment_ids")}
    if len(set(shapes.values())) != 1:
        raise PackingError(f"unequal array shapes: {shapes}")
    validate_tb_gae_inputs(batch.rewards, batch.gen_mask, batch.dones, batch.turn_ids)
    if (batch.gen_mask & (batch.segment_ids == 0)).any():
        raise PackingError("a generated position lies in padding")
    for e, traj in enumerate(kept):
        rows = np.flatnonzero(batch.row_episode == e)
        n_done = int(batch.dones[rows].sum())
        if traj.training_policy == TrainingPolicy.KEEP_REWARD:
            if n_done != 1:
                raise PackingError(f"episode {e} ({traj.task_id}): {n_done} done flags; a "
                                   "terminated episode needs exactly one")
            got = float(batch.rewards[rows].sum())
            if not np.isclose(got, np.float32(traj.reward)):
                raise PackingError(f"episode {e}: packed reward {got} != {traj.reward}")
            if (batch.rewards[rows] != 0).sum() > 1:
                raise PackingError(f"episode {e}: reward placed on more than one position")
        elif n_done or (batch.rewards[rows] != 0).any():
            raise PackingError(f"episode {e} ({traj.terminal_reason}): a cut-off episode "
                               "must carry no done and no reward")
