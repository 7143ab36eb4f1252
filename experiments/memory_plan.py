"""Where a scale's model fits: per-device memory of its actor and critic train states.

    python experiments/memory_plan.py --scale=paper
    python experiments/memory_plan.py --scale=paper --device_gib=141 \
        --meshes=fsdp=64,tensor=4 --meshes=fsdp=256

For each mesh (`sharding` axes data/fsdp/tensor) it prints the parameter and AdamW-moment
bytes per device of the actor (DecoderLM) and the critic (ValueModel) of the scale's model
(`terminal_rsi.pipeline.scales`: the `model` preset and dims, else the tiny model), using
`terminal_rsi.training.memory_plan` (abstract shapes only: nothing is allocated, any mesh size runs
on a laptop), and whether both fit `--device_gib` when actor and critic share the devices.
Activations, KV caches and the sampler's weights come on top of these numbers. One model on
one mesh, with the per-tensor table:
`python -m terminal_rsi.training.memory_plan --model ... --mesh ...`.
"""

from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from absl import app, flags, logging  # noqa: E402

from terminal_rsi.models.config import get_model_config  # noqa: E402
from terminal_rsi.pipeline.scales import SCALES  # noqa: E402
from terminal_rsi.runtime.sharding import MESH_AXES  # noqa: E402
from terminal_rsi.training.memory_plan import memory_plan  # noqa: E402

_SCALE = flags.DEFINE_enum("scale", "paper", list(SCALES), "pipeline scale whose model to plan")
_DEVICE_GIB = flags.DEFINE_float("device_gib", 80.0, "memory of one device in GiB")
_MESHES = flags.DEFINE_multi_string(
    "meshes", ["fsdp=4", "fsdp=8", "fsdp=32", "fsdp=64", "fsdp=128", "fsdp=64,tensor=4",
               "fsdp=256"],
    "meshes to plan, each as axis=size[,axis=size]")

GIB = 1024 ** 3


def parse_mesh(text: str) -> dict[str, int]:
    """{"fsdp": 64, "tensor": 4} of "fsdp=64,tensor=4" (ValueError naming the bad part)."""
    out = {}
    for part in text.split(","):
        axis, _, size = part.partition("=")
        if axis not in MESH_AXES or not size.isdigit() or int(size) < 1:
            raise ValueError(f"mesh {text!r}: {part!r} is not axis=size with an axis in "
                             f"{MESH_AXES} and a size >= 1")
        out[axis] = int(size)
    return out


def scale_model(scale: dict):
    """The ModelConfig a scale trains: its `model` preset and dims, else tiny with its dims."""
    model = dict(scale.get("model", {}))
    preset = model.pop("preset", "tiny")
    dims = model if "preset" in scale.get("model", {}) else dict(scale.get("model_dims", {}))
    return preset, get_model_config(preset, **dims)


def plan_rows(mcfg, meshes: list[dict[str, int]], device_gib: float) -> list[str]:
    rows = ["| mesh | devices | actor GiB/device | critic GiB/device | both | fits |",
            "|---|---|---|---|---|---|"]
    for mesh in meshes:
        actor = memory_plan(mcfg, mesh)["total_bytes"] / GIB
        critic = memory_plan(mcfg, mesh, critic=True)["total_bytes"] / GIB
        n = 1
        for v in mesh.values():
            n *= v
        name = " x ".join(f"{a}={s}" for a, s in mesh.items())
        fits = "yes" if actor + critic <= device_gib else "no"
        rows.append(f"| {name} | {n} | {actor:.1f} | {critic:.1f} | {actor + critic:.1f} | "
                    f"{fits} |")
    return rows


def main(argv: list[str]) -> None:
    del argv
    logging.set_verbosity(logging.WARNING)  # no JAX backend-probe chatter
    try:
        meshes = [parse_mesh(m) for m in _MESHES.value]
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    preset, mcfg = scale_model(SCALES[_SCALE.value])
    print(f"scale {_SCALE.value}: model preset {preset}, "
          f"{mcfg.num_params() / 1e9:.2f} B parameters (actor), "
          f"param dtype {mcfg.param_dtype}, device {_DEVICE_GIB.value:g} GiB")
    print("\n".join(plan_rows(mcfg, meshes, _DEVICE_GIB.value)))


if __name__ == "__main__":
    app.run(main)
