"""Weights on disk: a role's params exported without optimizer or PRNG state, and a training
stage's candidate exports for model selection (orbax-checkpoint).

Weights-only handoff (`export_weights` / `import_weights`): params of one role (`actor` or
`critic`) without optimizer or PRNG state (App. A: RPR-2 is launched with weights-only
transfer), e.g. RSR -> RPR (actor) and RPR-1 -> RSR-2 -> RPR-2 (critic kept unchanged).
`read_weights` loads an export with no target tree, on any topology.

Atomicity is orbax's: an export is written under a tmp directory and renamed when complete;
a candidate directory is complete or absent. The full resume state of a training stage
(train states, PRNG keys, counters) is `terminal_rsi.training.checkpoint`.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping
from typing import Any

import jax

from terminal_rsi.runtime import multihost

ROLES = ("actor", "critic")
# a training stage's candidate exports for model selection: <workdir>/candidates/step_<n>/<role>
CANDIDATES = "candidates"
_CANDIDATE = re.compile(r"step_(\d+)")


class CheckpointError(RuntimeError):
    """No checkpoint where one was expected, or a checkpoint that does not fit its template."""


def abstract_like(tree):
    """Leaves -> ShapeDtypeStruct with the leaf's sharding; a leaf without one (a shape from
    `eval_shape`, host data) is restored whole onto this process's first device. Never the
    sharding the checkpoint was saved with: weights saved by a multi-process run (a pod
    slice) then load on one machine, and the other way round."""
    local = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])

    def f(x):
        sharding = getattr(x, "sharding", None)
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding or local)

    return jax.tree.map(f, tree)


def export_weights(directory: str | os.PathLike, role: str, params: Any, *,
                   force: bool = False) -> str:
    """Write `params` (a pure dict) of `role` to `<directory>/<role>` atomically.

    No optimizer or PRNG state. `force=True` replaces an existing export. Returns the path.
    """
    import orbax.checkpoint as ocp  # heavy (~1 s, pulls in tensorstore): on first use

    if role not in ROLES:
        raise CheckpointError(f"role {role!r}; use one of {ROLES}")
    path = os.path.join(os.path.abspath(os.fspath(directory)), role)
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(path, params, force=force)
        ckptr.wait_until_finished()
    return path


def _exported(directory: str | os.PathLike, role: str) -> str:
    """The path of `<directory>/<role>` written by `export_weights` (CheckpointError if none)."""
    path = os.path.join(os.path.abspath(os.fspath(directory)), role)
    if not os.path.isdir(path):
        raise CheckpointError(f"no {role} weights at {path}; export them with export_weights")
    return path


def import_weights(directory: str | os.PathLike, role: str, target: Any) -> Any:
    """Read `<directory>/<role>` into the structure, dtypes and shardings of `target`
    (params or abstract params, e.g. `state.params` of a freshly created TrainState)."""
    import orbax.checkpoint as ocp  # heavy (~1 s, pulls in tensorstore): on first use

    path = _exported(directory, role)
    with ocp.StandardCheckpointer() as ckptr:
        try:
            return ckptr.restore(path, abstract_like(target))
        except (ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"{role} weights at {path} do not fit the target: {e}") from e


def read_weights(directory: str | os.PathLike, role: str) -> Any:
    """`<directory>/<role>` as saved, with no target tree: structure, shapes and dtypes come
    from the checkpoint's own metadata, every leaf whole on this process's first device
    (`abstract_like`), so it loads on any topology (an export of a multi-process run on one
    machine, and the other way round)."""
    import orbax.checkpoint as ocp  # heavy (~1 s, pulls in tensorstore): on first use

    path = _exported(directory, role)
    with ocp.StandardCheckpointer() as ckptr:
        saved = ckptr.metadata(path).item_metadata.tree
        shapes = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), saved)
        return ckptr.restore(path, abstract_like(shapes))


# ---------------------------------------------------------------- candidates

def candidate_steps(first: int, last: int, count: int) -> tuple[int, ...]:
    """The steps after which a stage exports a candidate for model selection
    (`sections.Candidates`): `count` - 1 evenly spaced steps strictly between `first` (the
    last step that leaves the actor as it came in, e.g. the critic-only steps) and `last`
    (the final export, itself the last candidate). Fewer when the span is short."""
    span = last - first
    steps = {first + round(i * span / count) for i in range(1, max(int(count), 1))}
    return tuple(sorted(s for s in steps if first < s < last))


def export_candidate(workdir: str, step: int, params: Mapping[str, Any]) -> str:
    """Write the weights of each role in `params` (role -> params) as the candidate of `step`:
    `<workdir>/candidates/step_<step>/<role>`, complete or absent (written beside it, then
    renamed). Returns the directory."""
    root = os.path.join(workdir, CANDIDATES)
    final, tmp = os.path.join(root, f"step_{step}"), os.path.join(root, f".step_{step}.tmp")
    # several processes: all of them save (orbax's save is collective), process 0 alone
    # clears and renames
    if multihost.is_writer():
        for d in (tmp, final):
            if os.path.isdir(d):
                shutil.rmtree(d)
    multihost.barrier(f"candidate_{step}_cleared")
    for role, p in params.items():
        export_weights(tmp, role, p)
    if multihost.is_writer():
        os.replace(tmp, final)
    multihost.barrier(f"candidate_{step}_written")
    return final


def candidate_exports(workdir: str) -> list[tuple[int, str]]:
    """(step, directory) of the complete candidates a stage wrote, by step."""
    root = os.path.join(workdir, CANDIDATES)
    if not os.path.isdir(root):
        return []
    found = [(int(m.group(1)), os.path.join(root, n)) for n in os.listdir(root)
             if (m := _CANDIDATE.fullmatch(n))]
    return sorted(found)


def prune_candidates(workdir: str, after: int = -1) -> None:
    """Remove the candidates of steps > `after` and unfinished ones (a resumed stage writes
    them again; -1: all)."""
    root = os.path.join(workdir, CANDIDATES)
    if not os.path.isdir(root) or not multihost.is_writer():
        return
    for n in os.listdir(root):
        m = _CANDIDATE.fullmatch(n)
        if m is None or int(m.group(1)) > after:
            shutil.rmtree(os.path.join(root, n))
