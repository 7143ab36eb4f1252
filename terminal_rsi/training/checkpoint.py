"""Full resume checkpoints of a training stage (orbax-checkpoint); weights-only exports are
`terminal_rsi.runtime.exports`.

Full resume (`RunCheckpointer`, one orbax `CheckpointManager` step per save) holds:

- `actor`, `critic`: each TrainState's {step, params, opt_state} (StandardSave),
- `rngs`: named PRNG keys (key data; typed keys are re-wrapped with their impl on restore),
- `meta` (JsonSave): policy_version, data_position, rng impls and a free JSON blob
  `extra` (e.g. the frozen divisor table `FamilyDivisors.to_dict()`).

Restore needs templates: TrainStates (concrete or `jax.eval_shape`-abstract) whose leaves
give shape, dtype and sharding; the restored state has exactly that structure, dtypes and
shardings, and the template's static graphdef / optax chain.

Atomicity is orbax's: a step is written under `<step>.orbax-checkpoint-tmp-*` and renamed
when complete, so a crash mid-save leaves a tmp directory that `latest_step` ignores (and
that `cleanup_tmp_directories` removes on the next start). Saves are synchronous by default
(`async_save=True` overlaps writing with training; call `wait()` before exiting).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from terminal_rsi.runtime.exports import CheckpointError, abstract_like
from terminal_rsi.training.train_state import TrainState


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
        items = {"actor": ocp.args.StandardRestore(abstract_like(state_tree(actor))),
                 "critic": ocp.args.StandardRestore(abstract_like(state_tree(critic)))}
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
