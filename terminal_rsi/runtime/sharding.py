"""Device mesh, logical-axis sharding rules, sharded initialization, multi-host start-up.

Mesh axes are `("data", "fsdp", "tensor")`:

- data: pure data parallelism (parameters replicated across it);
- fsdp: batch *and* parameters sharded (ZeRO-3 style: the `embed` axis of every matrix);
- tensor: Megatron-style model parallelism (heads, MLP hidden, vocabulary).

Every model parameter carries `logical_axes` metadata (see `terminal_rsi.models.transformer`);
`rules` map each logical name to a mesh axis (or None = replicated). A dimension whose size
does not divide by its mesh axis size is replicated instead (e.g. SmolLM2's 3 KV heads on a
tensor axis of 2), so every preset works on every mesh. Parameters are created inside `jit`
with `out_shardings`, so they are never materialized unsharded; optimizer state is sharded
like its parameters; scalars (step, Adam count) are replicated.

Multi-host: `maybe_initialize_distributed(config)` calls `jax.distributed.initialize` when
`config.distributed.enabled` is true (address/count/id from the config, else from the
environment variables TERMINAL_RSI_COORDINATOR_ADDRESS / TERMINAL_RSI_NUM_PROCESSES /
TERMINAL_RSI_PROCESS_ID, else JAX's own auto-detection on TPU pods and SLURM); a no-op on
one host.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

MeshAxes = str | tuple[str, ...] | None

# logical axis name -> mesh axis (or tuple of mesh axes, or None = replicated).
DEFAULT_RULES: dict[str, MeshAxes] = {
    "batch": BATCH_AXES,
    "vocab": "tensor",
    "embed": "fsdp",
    "heads": "tensor",
    "kv_heads": "tensor",
    "mlp": "tensor",
    "head_dim": None,
    "norm": None,
    "lora": None,  # LoRA adapters (terminal_rsi.models.lora) are small: replicated
}

# Per-model rule tables (all presets currently use the defaults; override entries here).
MODEL_RULES: dict[str, dict[str, MeshAxes]] = {
    "tiny": dict(DEFAULT_RULES),
    "smollm2_135m": dict(DEFAULT_RULES),
    "qwen3_27b_class": dict(DEFAULT_RULES),
}


class MeshConfigError(ValueError):
    """The requested mesh shape does not match the devices (sizes, count, axis names)."""


def get_rules(model_name: str | None = None) -> dict[str, MeshAxes]:
    """The logical-axis rules for preset `model_name` (defaults for unknown or None)."""
    return dict(MODEL_RULES.get(model_name or "", DEFAULT_RULES))


def resolve_mesh_shape(shape: Mapping[str, int | None] | tuple | None,
                       n_devices: int) -> dict[str, int]:
    """Fill in mesh axis sizes. Missing / None / -1 sizes are inferred (at most one; if all
    three are missing, everything goes to fsdp). The product must equal `n_devices`."""
    if shape is None:
        shape = {}
    if isinstance(shape, tuple | list):
        if len(shape) != len(MESH_AXES):
            raise MeshConfigError(f"mesh shape {shape} must have {len(MESH_AXES)} entries "
                                  f"for axes {MESH_AXES}")
        shape = dict(zip(MESH_AXES, shape, strict=True))
    unknown = set(shape) - set(MESH_AXES)
    if unknown:
        raise MeshConfigError(f"unknown mesh axes {sorted(unknown)}; axes are {MESH_AXES}")
    sizes = {a: shape.get(a) for a in MESH_AXES}
    if all(v is None or v == -1 for v in sizes.values()):
        sizes = {"data": 1, "fsdp": None, "tensor": 1}
    free = [a for a, v in sizes.items() if v is None or v == -1]
    known = math.prod(v for v in sizes.values() if v not in (None, -1))
    if len(free) > 1:
        for a in free[1:]:
            sizes[a] = 1
        free = free[:1]
    if free:
        if n_devices % known:
            raise MeshConfigError(f"mesh sizes {shape} do not divide the {n_devices} devices")
        sizes[free[0]] = n_devices // known
    if math.prod(sizes.values()) != n_devices:
        raise MeshConfigError(f"mesh {sizes} has {math.prod(sizes.values())} devices but "
                              f"{n_devices} are available; make the product match or leave "
                              "one axis unset (None/-1) to infer it")
    return sizes


def make_mesh(shape: Mapping[str, int | None] | tuple | None = None,
              devices=None) -> Mesh:
    """A Mesh with axes (data, fsdp, tensor); sizes from `shape`, inferred where not given."""
    devices = jax.devices() if devices is None else list(devices)
    sizes = resolve_mesh_shape(shape, len(devices))
    dims = tuple(sizes[a] for a in MESH_AXES)
    if devices == jax.devices():
        return jax.make_mesh(dims, MESH_AXES,
                             axis_types=(jax.sharding.AxisType.Auto,) * len(MESH_AXES))
    return Mesh(np.asarray(devices).reshape(dims), MESH_AXES)


def logical_to_spec(logical_axes, shape, rules: Mapping[str, MeshAxes],
                    mesh_shape: Mapping[str, int]) -> PartitionSpec:
    """Map one parameter's logical axes to a PartitionSpec.

    A dimension stays replicated when its rule is None, when the mesh axes are size 1, when
    its size is not divisible by the mesh axes' product, or when a mesh axis is already used
    by an earlier dimension.
    """
    used: set[str] = set()
    spec = []
    for name, size in zip(logical_axes, shape, strict=True):
        target = rules.get(name) if name is not None else None
        axes = (target,) if isinstance(target, str) else tuple(target or ())
        axes = tuple(a for a in axes if mesh_shape.get(a, 1) > 1 and a not in used)
        n = math.prod(mesh_shape[a] for a in axes) if axes else 1
        if not axes or size % n:
            spec.append(None)
            continue
        used.update(axes)
        spec.append(axes[0] if len(axes) == 1 else axes)
    return PartitionSpec(*spec)


def _mesh_shape(mesh) -> dict[str, int]:
    if isinstance(mesh, Mapping):
        return dict(mesh)
    return dict(mesh.shape)


def param_specs(abstract_state: nnx.State, rules: Mapping[str, MeshAxes],
                mesh) -> dict:
    """Pure dict (like `nnx.to_pure_dict`) of PartitionSpecs from `logical_axes` metadata."""
    mesh_shape = _mesh_shape(mesh)

    def spec(var):
        meta = var.get_metadata() if hasattr(var, "get_metadata") else {}
        axes = meta.get("logical_axes")
        shape = var.get_value().shape
        if axes is None:
            return PartitionSpec()
        if len(axes) != len(shape):
            raise ValueError(f"logical_axes {axes} do not match parameter shape {shape}")
        return logical_to_spec(axes, shape, rules, mesh_shape)

    specs = jax.tree.map(spec, abstract_state, is_leaf=lambda x: isinstance(x, nnx.Variable))
    return nnx.to_pure_dict(specs)


def abstract_model(model_cls: Callable, config) -> tuple[nnx.GraphDef, nnx.State]:
    """(graphdef, abstract State with metadata) of `model_cls(config, rngs=...)`, no allocation."""
    model = nnx.eval_shape(lambda: model_cls(config, rngs=nnx.Rngs(0)))
    return nnx.split(model)


def param_shardings(model_cls: Callable, config, mesh: Mesh,
                    rules: Mapping[str, MeshAxes] | None = None) -> dict:
    """Pure dict of NamedShardings for the parameters of `model_cls(config)` on `mesh`."""
    _, state = abstract_model(model_cls, config)
    specs = param_specs(state, rules or DEFAULT_RULES, mesh)
    return jax.tree.map(lambda s: NamedSharding(mesh, s), specs,
                        is_leaf=lambda x: isinstance(x, PartitionSpec))


def init_params(model_cls: Callable, config, mesh: Mesh, seed: int = 0,
                rules: Mapping[str, MeshAxes] | None = None) -> tuple[nnx.GraphDef, dict]:
    """Initialize `model_cls(config)` directly into sharded arrays (jit with out_shardings).

    Returns (graphdef, params) with params a pure dict; the same seed gives the same values
    on any mesh (partitionable threefry).
    """
    graphdef, _ = abstract_model(model_cls, config)
    shardings = param_shardings(model_cls, config, mesh, rules)

    def init():
        return nnx.to_pure_dict(nnx.state(model_cls(config, rngs=nnx.Rngs(seed))))

    return graphdef, jax.jit(init, out_shardings=shardings)()


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def opt_state_shardings(tx, abstract_params, param_sh, mesh: Mesh):
    """Shardings for `tx.init(params)`: parameter-shaped leaves like their parameter,
    everything else (counts, scalars) replicated."""
    abstract_opt = jax.eval_shape(tx.init, abstract_params)
    return optax.tree_map_params(
        tx, lambda _, sh: sh, abstract_opt, param_sh,
        transform_non_params=lambda _: replicated(mesh),
        is_leaf=lambda x: isinstance(x, NamedSharding))


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
    """[B, ...] arrays: batch over (data, fsdp), the rest replicated."""
    return NamedSharding(mesh, PartitionSpec(BATCH_AXES, *([None] * (ndim - 1))))


def shard_batch(batch: Mapping[str, Any], mesh: Mesh) -> dict:
    """device_put every [B, ...] array of `batch` with its batch axis over (data, fsdp)."""
    return {k: jax.device_put(v, batch_sharding(mesh, np.ndim(v))) for k, v in batch.items()}


# ----------------------------------------------------------------------------- multi-host


def _get(section, key):
    if section is None:
        return None
    if isinstance(section, Mapping):
        return section.get(key)
    return getattr(section, key, None) if not hasattr(section, "get") else section.get(key)


def maybe_initialize_distributed(config) -> bool:
    """Call `jax.distributed.initialize` if `config.distributed.enabled`; return whether it ran.

    Sources, first found wins: config.distributed.{coordinator_address, num_processes,
    process_id}; env TERMINAL_RSI_COORDINATOR_ADDRESS / TERMINAL_RSI_NUM_PROCESSES /
    TERMINAL_RSI_PROCESS_ID; otherwise JAX auto-detection (TPU pods, SLURM, ...).
    A config without a `distributed` section, with enabled False, or with num_processes == 1
    is a no-op (one host), unless env TERMINAL_RSI_DISTRIBUTED=1 (set by the launchers in
    launch/) forces it for any experiment.
    """
    section = _get(config, "distributed")
    forced = os.environ.get("TERMINAL_RSI_DISTRIBUTED", "").lower() in ("1", "true", "yes")
    if forced and section is None:  # launchers (launch/*.py) set this for any experiment
        section = {}
    elif section is None or not _get(section, "enabled") and not forced:
        return False
    address = _get(section, "coordinator_address") or os.environ.get(
        "TERMINAL_RSI_COORDINATOR_ADDRESS")
    num = _get(section, "num_processes") or os.environ.get("TERMINAL_RSI_NUM_PROCESSES")
    pid = _get(section, "process_id")
    if pid is None:
        pid = os.environ.get("TERMINAL_RSI_PROCESS_ID")
    num = int(num) if num is not None else None
    pid = int(pid) if pid is not None else None
    if num == 1:
        return False
    jax.distributed.initialize(coordinator_address=address, num_processes=num, process_id=pid)
    return True

