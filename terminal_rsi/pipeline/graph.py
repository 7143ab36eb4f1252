"""The Terminal-RSI stage graph (paper Fig. 2-3, §2.1 Eq. 4, §3.1) and its handoff rules.

```
[pretrained ──▶] base ──▶ rsr1 ──▶ warmup_critic (critic-only epoch, rsr1 actor frozen)
           │            │
           ▼            ▼
         rpr1_fdr (actor ← rsr1, critic ← warmup_critic; FDR; actor lr η)
           │
           ▼
         rsr2 (actor-only SFT; the rpr1 critic passes through unchanged, Δφ = 0)
           │
           ├──▶ rpr2_fdr (actor ← rsr2, critic ← rsr2 = rpr1 critic; FDR; actor lr η/5)
           └──▶ rpr2_spr (same, SPR: the retained Long-Reward branch)
```

With a pretrained model (`graph_for(..., pretrained=True)`) the graph opens with stage
`pretrained`: its weights as they ship (experiment base_weights), evaluated like every stage
(the zero-shot row), and the actor the base stage fine-tunes.

A stage is (experiment name, its config file, named inputs from other stages' export dirs,
graph-level overrides). Inputs are weights only (`<stage>/export/{actor,critic}`, contract
C2): `init.actor_weights` / `init.critic_weights` of the stage config point at them. The
pipeline adds the paper's phase rules: every RPR phase starts with its 4 critic-only
calibration updates (`ppo.critic_warmup_steps`), and RPR-2 uses the fivefold smaller actor
rate (`actor_opt.learning_rate` of rpr2_* = rpr1_fdr's / `pipeline.rpr2_lr_divisor`).

The issue lists the stages as base, warmup_critic, rsr1, ...; the paper prepares the warm-up
critic "with the RSR-1 actor frozen" (§2.1), so warmup_critic depends on rsr1 here and the
graph order is base, rsr1, warmup_critic, rpr1_fdr, rsr2, rpr2_fdr, rpr2_spr.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any


@dataclasses.dataclass(frozen=True)
class StageSpec:
    """name: stage (and its workdir under the run dir). experiment: registry name.
    config_file: `configs/<file>.py` (the package's terminal_rsi/configs/). inputs: role ("actor",
    "critic") -> producing stage. overrides: dotted config path -> value, set last.
    kind: "base" | "rsr" | "warmup" | "rpr" (the handoff rules that apply).
    evaluate: "actor" (evaluate the stage's own actor), "critic" (critic EV on the eval
    episodes of the stage its actor comes from)."""

    name: str
    experiment: str
    config_file: str
    inputs: Mapping[str, str]
    kind: str
    overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    evaluate: str = "actor"

    def __post_init__(self):
        object.__setattr__(self, "inputs", dict(self.inputs))
        object.__setattr__(self, "overrides", dict(self.overrides))


# a pretrained model's shipped weights: the zero-shot row and the base's starting actor
# (in the graph only with `graph_for(..., pretrained=True)`)
PRETRAINED = StageSpec("pretrained", "base_weights", "configs/base_weights.py", {}, "base")
GRAPH: tuple[StageSpec, ...] = (
    StageSpec("base", "base_sft", "configs/base_sft.py", {}, "base"),
    StageSpec("rsr1", "rsr", "configs/rsr1.py", {"actor": "base", "critic": "base"}, "rsr"),
    StageSpec("warmup_critic", "rpr_phase", "configs/warmup_critic.py",
              {"actor": "rsr1", "critic": "rsr1"}, "warmup",
              {"mode": "warmup_critic"}, evaluate="critic"),
    StageSpec("rpr1_fdr", "rpr_phase", "configs/rpr1_fdr.py",
              {"actor": "rsr1", "critic": "warmup_critic"}, "rpr",
              {"mode": "phase", "rewards.fn": "fdr"}),
    StageSpec("rsr2", "rsr", "configs/rsr2.py", {"actor": "rpr1_fdr", "critic": "rpr1_fdr"},
              "rsr"),
    StageSpec("rpr2_fdr", "rpr_phase", "configs/rpr2_fdr.py",
              {"actor": "rsr2", "critic": "rsr2"}, "rpr", {"mode": "phase", "rewards.fn": "fdr"}),
    StageSpec("rpr2_spr", "rpr_phase", "configs/rpr2_fdr.py",
              {"actor": "rsr2", "critic": "rsr2"}, "rpr", {"mode": "phase", "rewards.fn": "spr"}),
)
STAGES: dict[str, StageSpec] = {s.name: s for s in (PRETRAINED, *GRAPH)}
RPR1 = "rpr1_fdr"


class GraphError(ValueError):
    """An unknown stage, or a stage graph with a cycle or a missing producer."""


def stage(name: str) -> StageSpec:
    if name not in STAGES:
        raise GraphError(f"unknown stage {name!r}; the graph has {', '.join(STAGES)}")
    return STAGES[name]


def prerequisites(targets: Sequence[str], graph: Mapping[str, StageSpec] = STAGES) -> list[str]:
    """Every stage the targets need (themselves included), in graph (topological) order."""
    need: set[str] = set()

    def visit(n: str, path: tuple[str, ...]) -> None:
        if n in path:
            raise GraphError(f"stage graph has a cycle: {' -> '.join(path + (n,))}")
        if n not in graph:
            raise GraphError(f"unknown stage {n!r}; the graph has {', '.join(graph)}")
        if n in need:
            return
        for dep in graph[n].inputs.values():
            visit(dep, path + (n,))
        need.add(n)

    for t in targets:
        visit(t, ())
    order = [n for n in graph if n in need]
    pos = {n: i for i, n in enumerate(order)}
    for n in order:
        for dep in graph[n].inputs.values():
            if pos[dep] > pos[n]:
                raise GraphError(f"graph order puts {dep!r} after its consumer {n!r}")
    return order


BASES = {"base_sft": ("base_sft", "configs/base_sft.py"),
         "base_weights": ("base_weights", "configs/base_weights.py")}
UNBYPASSABLE = ("base", PRETRAINED.name)


def graph_for(base: str = "base_sft", bypass: Sequence[str] = (), *,
              pretrained: bool = False) -> dict[str, StageSpec]:
    """The graph with the base stage's experiment chosen: `base_sft` (trained on rendered
    demonstrations) or `base_weights` (given weights: a pretrained GGUF or HF model, an
    export dir, or a random init). `pretrained` (a pretrained model with the `base_sft`
    base): stage `pretrained` holds the shipped weights, is evaluated (the zero-shot row),
    and is the actor the base fine-tunes. `bypass`: stages whose exports are their inputs
    unchanged (ablations); the base stages cannot be bypassed."""
    if base not in BASES:
        raise GraphError(f"base stage {base!r}; choose one of {', '.join(BASES)}")
    for b in bypass:
        if b not in STAGES or b in UNBYPASSABLE:
            choices = [n for n in STAGES if n not in UNBYPASSABLE]
            raise GraphError(f"cannot bypass {b!r}; choose among {', '.join(choices)}")
    exp, cfg = BASES[base]
    g = {n: s for n, s in STAGES.items() if n != PRETRAINED.name}
    inputs = {}
    if pretrained and base == "base_sft":
        g = {PRETRAINED.name: PRETRAINED, **g}
        inputs = {"actor": PRETRAINED.name, "critic": PRETRAINED.name}  # base_sft: its
        # critic is critic_params_from_actor; the critic input lets a validation decision
        # hand both roles on
    g["base"] = dataclasses.replace(STAGES["base"], experiment=exp, config_file=cfg,
                                    inputs=inputs)
    return g
