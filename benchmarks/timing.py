"""Timing helper shared by the benchmark scripts (run as `python benchmarks/<name>.py`)."""

from __future__ import annotations

import time
from collections.abc import Callable


def best_of(fn: Callable[[], object], repeats: int = 3) -> float:
    """Smallest wall-clock seconds of `repeats` calls of `fn` (the least noisy estimate)."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best
