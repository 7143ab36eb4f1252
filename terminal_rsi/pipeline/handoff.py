"""The handoff between pipeline stages (contract C2): every stage leaves weights-only exports
`<stage>/export/{actor,critic}` that the next stages start from.

`check_handoff` checks a finished stage's exports and applies the pass-through rules (a base
stage without a critic gets `critic_params_from_actor` of its actor; an RSR stage passes its
input critic through unchanged, Δφ = 0); `copy_inputs` is a bypassed stage's "run" (its
exports are its inputs).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping

import jax
import numpy as np

from terminal_rsi.models.transformer import critic_params_from_actor
from terminal_rsi.pipeline.graph import StageSpec
from terminal_rsi.pipeline.resolve import PipelineError
from terminal_rsi.runtime import multihost
from terminal_rsi.runtime.exports import export_weights, read_weights


def restore_export(export_dir: str, role: str):
    """The params of `<export_dir>/<role>` as saved (no target tree, no model config), as a
    host copy on every process (`multihost.host_copy`: with several processes every one
    calls this together). Loads on any topology (`exports.read_weights`)."""
    return multihost.host_copy(read_weights(export_dir, role))


def same_params(a, b) -> bool:
    """Two param trees with the same paths and bit-equal leaves."""
    la, lb = jax.tree_util.tree_flatten_with_path(a)[0], jax.tree_util.tree_flatten_with_path(b)[0]
    if [p for p, _ in la] != [p for p, _ in lb]:
        return False
    return all(np.array_equal(np.asarray(x), np.asarray(y))
               for (_, x), (_, y) in zip(la, lb, strict=True))


def export_roles(kind: str) -> tuple[str, ...]:
    """The exports a stage of `kind` must leave (a critic warm-up trains no actor)."""
    return ("critic",) if kind == "warmup" else ("actor", "critic")


def exports_ok(export_dir: str, kind: str) -> bool:
    return all(os.path.isdir(os.path.join(export_dir, r)) for r in export_roles(kind))


def copy_inputs(spec: StageSpec, out: str, input_exports: Mapping[str, str]) -> None:
    """A bypassed stage (`pipeline.bypass`): each role's export is a copy of its input's
    (e.g. bypassing rsr1 gives the paper's direct-PPO control without rewriting)."""
    os.makedirs(out, exist_ok=True)
    for role in spec.inputs:
        dst = os.path.join(out, role)
        if os.path.isdir(dst):
            shutil.rmtree(dst)
        shutil.copytree(os.path.join(input_exports[role], role), dst)


def check_handoff(spec: StageSpec, out: str, input_exports: Mapping[str, str]) -> None:
    """Check stage `spec`'s weights-only exports in `out` and apply the pass-through rules
    (module doc); `input_exports`: role -> export dir of the input stage."""
    if spec.kind != "warmup" and not os.path.isdir(os.path.join(out, "actor")):
        raise PipelineError(f"stage {spec.name} wrote no actor export at {out}/actor")
    crit = os.path.join(out, "critic")
    had_critic = os.path.isdir(crit)
    # several processes take the same branches: each looks before any of them writes
    multihost.barrier(f"handoff_{spec.name}_looked")
    if spec.kind == "base" and not had_critic:
        export_weights(out, "critic", critic_params_from_actor(restore_export(out, "actor")))
    if spec.kind == "rsr":
        src = input_exports["critic"]
        if not had_critic:
            if multihost.is_writer():
                shutil.copytree(os.path.join(src, "critic"), crit)
            multihost.barrier(f"handoff_{spec.name}_copied")
        elif not same_params(restore_export(src, "critic"), restore_export(out, "critic")):
            raise PipelineError(f"stage {spec.name} changed the critic; RSR must pass it "
                                "through unchanged (Δφ = 0, Eq. 4)")
    if not os.path.isdir(crit):
        raise PipelineError(f"stage {spec.name} wrote no critic export at {crit}")
