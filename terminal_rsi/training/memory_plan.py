"""Per-device parameter and optimizer memory of a train state on a mesh, without allocating.

    python -m terminal_rsi.training.memory_plan --model qwen3_27b_class --mesh 1,64,4 [--critic]

`memory_plan` evaluates shapes only (`jax.eval_shape`), so any mesh size can be planned on
any machine; `format_memory_plan` prints it as a table. Shardings follow
`terminal_rsi.runtime.sharding` (logical-axis rules), the optimizer
`terminal_rsi.training.train_state`.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import PartitionSpec

from terminal_rsi.models.config import get_model_config
from terminal_rsi.models.transformer import DecoderLM, ValueModel
from terminal_rsi.runtime.sharding import (
    DEFAULT_RULES,
    MESH_AXES,
    MeshAxes,
    abstract_model,
    param_specs,
    resolve_mesh_shape,
)
from terminal_rsi.training.train_state import OptimizerConfig, make_optimizer


def shard_bytes(shape, dtype, spec: PartitionSpec, mesh_shape: Mapping[str, int]) -> int:
    """Bytes one device holds of an array of `shape` and `dtype` sharded by `spec`."""
    n = 1
    for dim, entry in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec)),
                          strict=True):
        axes = (entry,) if isinstance(entry, str) else tuple(entry or ())
        div = math.prod(mesh_shape[a] for a in axes) if axes else 1
        n *= -(-dim // div)
    return n * jnp.dtype(dtype).itemsize


def memory_plan(model_config, mesh_shape: Mapping[str, int], *, critic: bool = False,
                rules: Mapping[str, MeshAxes] | None = None, tx=None) -> dict:
    """Per-device parameter and optimizer bytes of an actor (or critic) train state.

    Uses `jax.eval_shape` only (nothing allocated, any mesh size on any machine).
    `tx` defaults to this project's AdamW chain (two f32-like moments per parameter).
    Returns {"params_bytes", "opt_bytes", "total_bytes", "num_params", "mesh", "rows"} with
    per-parameter rows (path, shape, spec, bytes per device).
    """
    mesh_shape = resolve_mesh_shape(dict(mesh_shape), math.prod(
        v for v in dict(mesh_shape).values() if v not in (None, -1)))
    rules = rules or DEFAULT_RULES
    cls = ValueModel if critic else DecoderLM
    _, state = abstract_model(cls, model_config)
    specs = param_specs(state, rules, mesh_shape)
    abstract = nnx.to_pure_dict(state)
    tx = tx or make_optimizer(OptimizerConfig(learning_rate=1e-5))
    abstract_opt = jax.eval_shape(tx.init, abstract)
    opt_specs = optax.tree_map_params(
        tx, lambda _, s: s, abstract_opt, specs,
        transform_non_params=lambda _: PartitionSpec(),
        is_leaf=lambda x: isinstance(x, PartitionSpec))
    rows = []
    flat_p = jax.tree_util.tree_flatten_with_path(abstract)[0]
    flat_s = jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, PartitionSpec))
    for (path, leaf), spec in zip(flat_p, flat_s, strict=True):
        rows.append((jax.tree_util.keystr(path), leaf.shape, spec,
                     shard_bytes(leaf.shape, leaf.dtype, spec, mesh_shape)))
    params_bytes = sum(r[3] for r in rows)
    opt_leaves = jax.tree.leaves(abstract_opt)
    opt_spec_leaves = jax.tree.leaves(opt_specs, is_leaf=lambda x: isinstance(x, PartitionSpec))
    opt_bytes = sum(shard_bytes(x.shape, x.dtype, s, mesh_shape)
                    for x, s in zip(opt_leaves, opt_spec_leaves, strict=True))
    return {"params_bytes": params_bytes, "opt_bytes": opt_bytes,
            "total_bytes": params_bytes + opt_bytes,
            "num_params": sum(math.prod(x.shape) for x in jax.tree.leaves(abstract)),
            "mesh": mesh_shape, "rows": rows}


def format_memory_plan(plan: dict, max_rows: int = 16) -> str:
    """A printable table of `memory_plan` output; layers are folded into one row per tensor."""
    gib = 1024 ** 3
    folded: dict[str, list] = {}
    for path, shape, spec, nbytes in plan["rows"]:
        key = re.sub(r"\['layers'\]\[\d+\]", "['layers'][*]", path)
        row = folded.setdefault(key, [shape, spec, 0, 0])
        row[2] += 1
        row[3] += nbytes
    mesh = " x ".join(f"{a}={n}" for a, n in plan["mesh"].items())
    lines = [f"mesh {mesh}: {plan['num_params'] / 1e9:.2f} B parameters",
             f"{'parameter':44s} {'shape':>16s} {'count':>5s} {'spec':>26s} {'MiB/dev':>9s}"]
    for key, (shape, spec, count, nbytes) in sorted(folded.items(),
                                                    key=lambda kv: -kv[1][3])[:max_rows]:
        lines.append(f"{key[:44]:44s} {str(shape):>16s} {count:5d} {str(tuple(spec)):>26s} "
                     f"{nbytes / 2**20:9.1f}")
    lines.append(f"{'params per device':>62s}: {plan['params_bytes'] / gib:8.2f} GiB")
    lines.append(f"{'optimizer (AdamW mu, nu) per device':>62s}: "
                 f"{plan['opt_bytes'] / gib:8.2f} GiB")
    lines.append(f"{'total per device':>62s}: {plan['total_bytes'] / gib:8.2f} GiB")
    return "\n".join(lines)


def main(argv=None) -> None:
    """`python -m terminal_rsi.training.memory_plan --model qwen3_27b_class --mesh 1,64,4`
    (`--critic` for the critic)."""
    ap = argparse.ArgumentParser(description="per-device parameter/optimizer memory plan")
    ap.add_argument("--model", default="qwen3_27b_class")
    ap.add_argument("--mesh", default="1,64,4", help="data,fsdp,tensor sizes")
    ap.add_argument("--critic", action="store_true")
    args = ap.parse_args(argv)
    mesh = dict(zip(MESH_AXES, (int(x) for x in args.mesh.split(",")), strict=True))
    plan = memory_plan(get_model_config(args.model), mesh, critic=args.critic)
    print(format_memory_plan(plan))


if __name__ == "__main__":
    main()
