"""Files of an RPR phase workdir beyond checkpoints (contract C2), and TensorBoard scalars.

    <workdir>/trajectories/step_00001.jsonl         training episodes of rollout step 1
    <workdir>/trajectories/step_00001.credit.npz    the packed rows used for its update
    <workdir>/trajectories/eval_00003.jsonl         in-training eval episodes of step 3
    <workdir>/tensorboard/events.out.tfevents.*     the metrics.jsonl scalars (tensorboardX)
    <workdir>/summary.json                          final statistics of the phase

All files are written atomically (`terminal_rsi.runtime.atomic`). On resume, the files of steps
after the restored checkpoint are removed (`prune_after`), like the metric lines.
"""

from __future__ import annotations

import glob
import io
import os
import re
import struct
import sys
from collections.abc import Mapping

import numpy as np

from terminal_rsi.runtime import multihost
from terminal_rsi.runtime.atomic import atomic_write_bytes

# Keys and dtypes of `<step>.credit.npz` (contract C2).
CREDIT_KEYS = {
    "row_episode": np.int32, "row_segment": np.int32, "tokens": np.int32, "gen_mask": np.bool_,
    "turn_ids": np.int32, "values": np.float32, "advantages": np.float32,
    "returns": np.float32, "rewards": np.float32, "dones": np.bool_,
}
_STEP_FILE = re.compile(r"^(step|eval)_(\d{5,})\.(jsonl|credit\.npz)$")


def step_name(kind: str, step: int) -> str:
    """'step' | 'eval' and the 1-based rollout step -> 'step_00001'."""
    return f"{kind}_{step:05d}"


def credit_arrays(packed, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The C2 arrays of one update from the `PackedBatch` and the prepared PPO batch.

    `row_episode` [R] indexes the trajectories as passed to `pack_trajectories` (the list the
    sibling .jsonl holds; -1 on padding rows); values are the pre-update critic values used for
    the advantages; advantages/returns/rewards/dones [R, L] exactly as used by the update.
    """
    kept = np.asarray(packed.kept, np.int32)
    re_ = np.asarray(packed.row_episode)
    row_episode = np.where(re_ >= 0, kept[np.clip(re_, 0, max(len(kept) - 1, 0))]
                           if len(kept) else -1, -1)
    src = {"row_episode": row_episode, "row_segment": packed.row_segment,
           "tokens": packed.tokens, "gen_mask": packed.gen_mask, "turn_ids": packed.turn_ids,
           "values": batch["old_values"], "advantages": batch["advantages"],
           "returns": batch["returns"], "rewards": batch["rewards"], "dones": batch["dones"]}
    return {k: np.asarray(src[k]).astype(dt) for k, dt in CREDIT_KEYS.items()}


def write_credit(path: str, arrays: Mapping[str, np.ndarray]) -> None:
    """np.savez of exactly CREDIT_KEYS, atomically."""
    missing = set(CREDIT_KEYS) - set(arrays)
    if missing:
        raise ValueError(f"credit arrays lack {sorted(missing)}; need {sorted(CREDIT_KEYS)}")
    buf = io.BytesIO()
    np.savez(buf, **{k: np.asarray(arrays[k]) for k in CREDIT_KEYS})
    atomic_write_bytes(path, buf.getvalue())


def prune_after(traj_dir: str, step: int) -> list[str]:
    """Remove step_/eval_ files of rollout steps > `step` (a resumed run rewrites them; the
    writing process, 0, removes them)."""
    removed = []
    if not os.path.isdir(traj_dir) or not multihost.is_writer():
        return removed
    for name in sorted(os.listdir(traj_dir)):
        m = _STEP_FILE.match(name)
        if m and int(m.group(2)) > step:
            os.remove(os.path.join(traj_dir, name))
            removed.append(name)
    return removed


class ScalarWriter:
    """Per-step scalars to TensorBoard event files under `logdir` (tensorboardX, imported
    lazily). Without tensorboardX: one warning, and `write` does nothing (JSONL stays).
    `purge_step`: on resume, TensorBoard discards events of steps >= it from earlier runs.
    Only process 0 writes (the others' `write` does nothing)."""

    _warned = False

    def __init__(self, logdir: str, purge_step: int | None = None):
        self.logdir = logdir
        self._writer = None
        if not multihost.is_writer():
            return
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            if not ScalarWriter._warned:
                print("[rpr] tensorboardX is not installed (pip install 'terminal_rsi[metrics]')"
                      "; metrics go to metrics.jsonl only", file=sys.stderr)
                ScalarWriter._warned = True
            return
        self._writer = SummaryWriter(logdir, purge_step=purge_step, flush_secs=30)

    @property
    def enabled(self) -> bool:
        return self._writer is not None

    def write(self, step: int, row: Mapping[str, object]) -> None:
        if self._writer is None:
            return
        for k, v in row.items():
            if k != "step" and isinstance(v, (int, float)) and v is not None:
                self._writer.add_scalar(k, float(v), global_step=step)
        self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def read_scalars(logdir: str) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] from all event files under `logdir`, honouring purges (a
    SessionLog START at step s drops earlier-written values with step >= s). Reads the
    TFRecord framing directly and parses with tensorboardX's protobufs."""
    from tensorboardX.proto import event_pb2

    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(glob.glob(os.path.join(logdir, "**", "events.out.tfevents.*"),
                                 recursive=True)):
        with open(path, "rb") as f:
            data = f.read()
        pos = 0
        while pos + 12 <= len(data):
            (n,) = struct.unpack("<Q", data[pos:pos + 8])
            ev = event_pb2.Event.FromString(data[pos + 12:pos + 12 + n])
            pos += 12 + n + 4
            if ev.HasField("session_log") and ev.session_log.status == 1:  # START: purge
                out = {k: [(s, v) for s, v in vs if s < ev.step] for k, vs in out.items()}
            for val in ev.summary.value:
                out.setdefault(val.tag, []).append((int(ev.step), float(val.simple_value)))
    return out
