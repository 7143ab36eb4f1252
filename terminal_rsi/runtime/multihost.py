"""Multi-process rollouts without mismatched collectives.

Generation is batched dynamically per process (the cross-episode batcher groups whatever
turns are ready), so two processes never issue the same sequence of jitted calls. A sampler
fed the global, sharded actor would compile cross-process collectives into every prefill and
decode block, and the processes would deadlock or abort (gloo: "Received data size doesn't
match expected size"). Instead, at one fixed point of the step every process calls:

- `local_replica(tree)`: a process-local, full copy of the (possibly sharded) parameters: one
  all-gather, issued in lockstep by every process, after which sampling touches only this
  process's devices;
- `process_share(n)`: which of the step's n episodes this process runs (a contiguous slice;
  the shares of all processes add up to n);
- `gather(objects)`: every process's JSON-serializable results, concatenated in process
  order on every process (two all-gathers: the lengths, then the padded bytes), so all of
  them pack the same update batch.

A process whose share raises would leave the others waiting at the next collective, so each
share runs inside `run_share(fn)`: after it, every process learns whether any failed, and all
of them raise `ShareFailed` together (the failing one from its own exception).

On one process each is the identity (no collective, no copy), so single-host code paths are
unchanged. `is_writer()` is true on the process that writes shared files (process 0);
`barrier(name)` holds every process until all reach it (orbax's own saves already do).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import jax
import numpy as np
from jax.experimental import multihost_utils

T = TypeVar("T")


class ShareFailed(RuntimeError):
    """A process's share of the work raised; raised on every process (`run_share`)."""


def is_multiprocess() -> bool:
    return jax.process_count() > 1


def is_writer() -> bool:
    """Whether this process writes the run's shared files (process 0)."""
    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Wait until every process reaches the barrier `name` (nothing on one process)."""
    if is_multiprocess():
        multihost_utils.sync_global_devices(name)


def local_replica(tree: Any) -> Any:
    """`tree` unchanged on one process; with several, a full host copy (NumPy) of every leaf
    on every process: one all-gather per leaf spread over other processes' devices (all
    processes must reach this together), a plain copy of the others (host data, or arrays
    this process holds whole)."""
    if not is_multiprocess():
        return tree

    def replica(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return np.asarray(x)

    return jax.tree.map(replica, tree)


def put(tree: Any, shardings: Any) -> Any:
    """`jax.device_put(tree, shardings)`, also where a leaf is process-local data (host
    arrays, weights loaded whole onto this process) and its sharding spans other processes'
    devices: each process then places its own shards of its (identical) copy."""
    if not is_multiprocess():
        return jax.device_put(tree, shardings)

    def one(x, sharding):
        if (isinstance(x, jax.Array) and not x.is_fully_addressable) or \
                sharding.is_fully_addressable:
            return jax.device_put(x, sharding)
        host = np.asarray(x)
        return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])

    return jax.tree.map(one, tree, shardings)


def host_copy(tree: Any) -> Any:
    """A NumPy copy of every leaf on this process (`jax.device_get` on one process; with
    several, through `local_replica`, so every process must call it together)."""
    return jax.device_get(local_replica(tree))


def process_seed(seed: int) -> int:
    """`seed` on one process (and on process 0); with several, a seed of its own for each
    process, so that processes sampling their shares of a batch draw independent streams."""
    index = jax.process_index()
    return seed if index == 0 else int(np.random.SeedSequence([seed, index]).generate_state(1)[0])


def process_share(n: int, index: int | None = None, count: int | None = None) -> tuple[int, int]:
    """(start, stop) of this process's share of n items: contiguous, sizes differ by at most
    one, earlier processes take the larger shares."""
    index = jax.process_index() if index is None else index
    count = jax.process_count() if count is None else count
    base, extra = divmod(n, count)
    start = index * base + min(index, extra)
    return start, start + base + (index < extra)


def gather(objects: list) -> list:
    """Every process's `objects` (JSON-serializable), concatenated in process order, on every
    process; `objects` unchanged on one process."""
    if not is_multiprocess():
        return list(objects)
    data = np.frombuffer(json.dumps(objects, allow_nan=False).encode(), np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.array([data.size], np.int64)))
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[:data.size] = data
    rows = np.asarray(multihost_utils.process_allgather(padded))
    out: list = []
    for row, size in zip(rows.reshape(len(sizes), -1), sizes.reshape(-1), strict=True):
        out.extend(json.loads(row[:int(size)].tobytes().decode()))
    return out


def run_share(fn: Callable[[], T]) -> T:
    """`fn()`, this process's share of some work that every process does together. With
    several processes (every one must call this at the same point) they then exchange whether
    it raised: if it did on any of them, every process raises `ShareFailed` naming the
    process(es) and the error, instead of the others waiting forever at the next collective.
    On one process `fn()` as is (its exception unchanged)."""
    if not is_multiprocess():
        return fn()
    out: Any = None
    error: BaseException | None = None
    try:
        out = fn()
    except Exception as e:  # reported to every process below
        error = e
    failed = [(i, msg) for i, msg in enumerate(
        gather([None if error is None else f"{type(error).__name__}: {error}"])) if msg]
    if failed:
        who = "; ".join(f"process {i}: {msg}" for i, msg in failed)
        raise ShareFailed(f"{len(failed)} of {jax.process_count()} processes failed in their "
                          f"share ({who}); every process stops here") from error
    return out
