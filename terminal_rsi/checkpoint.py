"""Checkpoints: full RPR resume state and weights-only stage handoff (orbax-checkpoint).

Full resume (`RunCheckpointer`, one orbax `CheckpointManager` step per save) holds:

- `actor`, `critic`: each TrainState's {step, params, opt_state} (StandardSave),
- `rngs`: named PRNG keys (key data; typed keys are re-wrapped with their impl on restore),
- `meta` (JsonSave): policy_version, data_position, rng impls and a free JSON blob
  `extra` (e.g. the frozen divisor table `FamilyDivisors.to_dict()`).

Restore needs templates: TrainStates (concrete or `jax.eval_shape`-abstract) whose leaves
give shape, dtype and sharding; the restored state has exactly that structure, dtypes and
shardings, and the template's static graphdef / optax chain.

Weights-only handoff (`export_weights` / `import_weights`): params of one role (`actor` or
`critic`) without optimizer or PRNG state (App. A: RPR-2 is launched with weights-only
transfer), e.g. RSR -> RPR (actor) and RPR-1 -> RSR-2 -> RPR-2 (critic kept unchanged).

Atomicity is orbax's: a step is written under `<step>.orbax-checkpoint-tmp-*` and renamed
when complete, so a crash mid-save leaves a tmp directory that `latest_step` ignores (and
that `cleanup_tmp_directories` removes on the next start). Saves are synchronous by default
(`async_save=True` overlaps writing with training; call `wait()` before exiting).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from terminal_rsi import multihost
from terminal_rsi.train_state import TrainState

ROLES = ("actor", "critic")
# a training stage's candidate exports for model selection: <workdir>/candidates/step_<n>/<role>
CANDIDATES = "candidates"
_CANDIDATE = re.compile(r"step_(\d+)")


class CheckpointError(RuntimeError):
    """No checkpoint where one was expected, or a checkpoint that does not fit its template."""


@dataclasses.dataclass(frozen=True)
class ResumeState:
    """Everything a run restores: step, both train states, PRNG keys, counters, JSON extra."""

    step: int
    actor: TrainState
    critic: TrainState
    rngs: dict[str, jax.Array]
    policy_version: int
    data_position: int
    extra: dict


def _abstract(tree):
    """Leaves -> ShapeDtypeStruct with the leaf's sharding; a leaf without one (a shape from
    `eval_shape`, host data) is restored whole onto this process's first device. Never the
    sharding the checkpoint was saved with: weights saved by a multi-process run (a pod
    slice) then load on one machine, and the other way round."""
    local = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])

    def f(x):
        sharding = getattr(x, "sharding", None)
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding or local)

    return jax.tree.map(f, tree)


def state_tree(state: TrainState) -> dict:
    """The saved part of a train state: {"step", "params", "opt_state"}."""
    return {"step": state.step, "params": state.params, "opt_state": state.opt_state}


def _rng_split(rngs: Mapping[str, jax.Array]) -> tuple[dict, dict]:
    """({name: key data as a host NumPy array}, {name: key impl or None}). Keys are saved from
    the host: the same on every process, they need no global array in a multi-host run."""
    data, impls = {}, {}
    for name, key in rngs.items():
        if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
            data[name] = np.asarray(jax.random.key_data(key))
            impls[name] = str(jax.random.key_impl(key))
        else:
            data[name] = np.asarray(key)
            impls[name] = None
    return data, impls


class RunCheckpointer:
    """Full resume checkpoints in `directory` (one subdirectory per step)."""

    def __init__(self, directory: str | os.PathLike, *, max_to_keep: int | None = 3,
                 save_interval_steps: int = 1, async_save: bool = False):
        import orbax.checkpoint as ocp  # heavy (~1 s, pulls in tensorstore): on first use

        self._ocp = ocp
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, save_interval_steps=save_interval_steps,
            enable_async_checkpointing=async_save, cleanup_tmp_directories=True, create=True)
        self.directory = os.fspath(directory)
        self._manager = ocp.CheckpointManager(
            self.directory, options=options, item_names=("actor", "critic", "rngs", "meta"))

    def save(self, step: int, *, actor: TrainState, critic: TrainState,
             rngs: Mapping[str, jax.Array] | None = None, policy_version: int = 0,
             data_position: int = 0, extra: Mapping[str, Any] | None = None,
             force: bool = False) -> bool:
        """Save one step; returns False when `save_interval_steps` skips it."""
        ocp = self._ocp
        rng_data, rng_impls = _rng_split(rngs or {})
        meta = {"step": int(step), "policy_version": int(policy_version),
                "data_position": int(data_position), "rng_impls": rng_impls,
                "extra": dict(extra or {})}
        items = {"actor": ocp.args.StandardSave(state_tree(actor)),
                 "critic": ocp.args.StandardSave(state_tree(critic)),
                 "meta": ocp.args.JsonSave(meta)}
        if rng_data:  # orbax rejects empty items
            items["rngs"] = ocp.args.StandardSave(rng_data)
        return self._manager.save(int(step), args=ocp.args.Composite(**items), force=force)

    def restore(self, step: int | None = None, *, actor: TrainState, critic: TrainState,
                rngs: Mapping[str, jax.Array] | None = None) -> ResumeState:
        """Restore `step` (default: latest complete one) into the templates' structure.

        actor, critic: template TrainStates (concrete or abstract leaves). rngs: template
        keys (same names as saved; their sharding is used), or None to restore them on the
        default device.
        """
        ocp = self._ocp
        step = self.latest_step() if step is None else step
        if step is None:
            raise CheckpointError(f"no complete checkpoint in {self.directory}; "
                                  "start fresh or point the run at the right workdir")
        meta = self._manager.restore(step, args=ocp.args.Composite(
            meta=ocp.args.JsonRestore()))["meta"]
        impls = meta["rng_impls"]
        items = {"actor": ocp.args.StandardRestore(_abstract(state_tree(actor))),
                 "critic": ocp.args.StandardRestore(_abstract(state_tree(critic)))}
        if impls:
            target = None if rngs is None else _rng_split(rngs)[0]
            items["rngs"] = ocp.args.StandardRestore(target)
        try:
            out = self._manager.restore(step, args=ocp.args.Composite(**items))
        except (ValueError, KeyError, TypeError) as e:
            raise CheckpointError(
                f"checkpoint step {step} in {self.directory} does not fit the templates "
                f"(model/optimizer config changed?): {e}") from e
        keys = {}
        for name, data in (out["rngs"] if impls else {}).items():
            impl = impls.get(name)
            keys[name] = jax.random.wrap_key_data(data, impl=impl) if impl else data

        def fill(template: TrainState, tree: dict) -> TrainState:
            return template.replace(step=tree["step"], params=tree["params"],
                                    opt_state=tree["opt_state"])

        return ResumeState(step=int(step), actor=fill(actor, out["actor"]),
                           critic=fill(critic, out["critic"]), rngs=keys,
                           policy_version=int(meta["policy_version"]),
                           data_position=int(meta["data_position"]),
                           extra=dict(meta["extra"]))

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def wait(self) -> None:
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


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
            return ckptr.restore(path, _abstract(target))
        except (ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"{role} weights at {path} do not fit the target: {e}") from e


def read_weights(directory: str | os.PathLike, role: str) -> Any:
    """`<directory>/<role>` as saved, with no target tree: structure, shapes and dtypes come
    from the checkpoint's own metadata, every leaf whole on this process's first device
    (`_abstract`), so it loads on any topology (an export of a multi-process run on one
    machine, and the other way round)."""
    import orbax.checkpoint as ocp  # heavy (~1 s, pulls in tensorstore): on first use

    path = _exported(directory, role)
    with ocp.StandardCheckpointer() as ckptr:
        saved = ckptr.metadata(path).item_metadata.tree
        shapes = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), saved)
        return ckptr.restore(path, _abstract(shapes))


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
