"""Atomic file writes: a crash leaves the previous version of the file intact.

Every file that matters (trajectories, ledgers, divisor tables, reports,
experiment artifacts) is written through these helpers: the bytes go to a
temporary file in the same directory, are flushed and fsynced, and then
`os.replace` swaps it in.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` atomically (temp file in the same directory + os.replace)."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write UTF-8 `text` to `path` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


def read_json_lines(path: str | os.PathLike) -> list[Any]:
    """The JSON values of a JSON Lines file (e.g. a stage's `metrics.jsonl`), blank lines
    skipped; [] when the file does not exist."""
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def atomic_write_json(path: str | os.PathLike, obj: Any, *, indent: int | None = 2) -> None:
    """Serialize `obj` as strict JSON (sorted keys, no NaN/inf, trailing newline), atomically."""
    atomic_write_text(path, json.dumps(obj, indent=indent, sort_keys=True, allow_nan=False) + "\n")
