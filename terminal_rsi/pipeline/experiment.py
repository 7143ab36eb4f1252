"""Experiment "pipeline": the Terminal-RSI stage graph end to end (paper Fig. 2-3, §3.1-3.4).

    python experiments/run.py --config=configs/rpr2_spr.py --workdir=runs/rsi   # the main job
    python experiments/run.py --config=configs/rpr2_spr.py --config.scale=ci    # CI-sized
    python experiments/run.py --config=configs/terminal_rsi.py                  # both RPR-2
    python experiments/run.py --config=configs/rpr2_spr.py --config.model=smollm2_135m

Runs the prerequisites of `pipeline.targets` in graph order (reusing finished stages),
evaluates every stage (k = 3, held-out instances and held-out families), and keeps
`<workdir>/ledger.json` and `<workdir>/plots/*.png` current. See terminal_rsi.pipeline.runner
and docs/pipeline.md.
"""

from __future__ import annotations

import sys

import ml_collections

from terminal_rsi.configuration import BASE_SCHEMA, SANDBOX_SCHEMA, Field
from terminal_rsi.pipeline.graph import BASES, STAGES
from terminal_rsi.pipeline.scales import SCALES

MODEL_DIMS = ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim",
              "d_ff", "max_seq_len")
MODELS = ("tiny", "smollm2_135m")


class _Schema(dict):
    """The pipeline schema: fixed fields, plus free `stages.<stage>.<path>` overrides that are
    validated later against the stage experiment's own schema (PipelineError names them)."""

    _FREE = Field(object, "override of any field of the stage's config file (checked by the "
                  "stage schema), e.g. --config.stages.rsr1.sft.steps=10", optional=True)

    def __contains__(self, key):
        return dict.__contains__(self, key) or self._free(key)

    def __getitem__(self, key):
        if dict.__contains__(self, key):
            return dict.__getitem__(self, key)
        if self._free(key):
            return self._FREE
        raise KeyError(key)

    def doc_group(self, key) -> str | None:
        """configdoc shows the free overrides as one row."""
        return None if dict.__contains__(self, key) or not self._free(key) else \
            "stages.<stage>.<field>"

    @staticmethod
    def _free(key) -> bool:
        parts = str(key).split(".")
        return len(parts) >= 3 and parts[0] == "stages" and parts[1] in STAGES


SCHEMA = _Schema({
    **BASE_SCHEMA,
    "model": Field(str, "model preset: tiny (trained base) or smollm2_135m (pretrained base)",
                   choices=MODELS),
    **{f"model_dims.{k}": Field(int, f"tiny model {k} (None: the scale's)", lo=1,
                                optional=True) for k in MODEL_DIMS},
    "scale": Field(str, "size preset (terminal_rsi.pipeline.scales)", choices=tuple(SCALES)),
    "tasks.suite": Field(str, "'builtin' or a directory of task dirs"),
    "tasks.families": Field(tuple, "training families (None: the scale's)", item_type=str,
                            optional=True),
    "tasks.n_per_family": Field(int, "training instances per family (None: the scale's)",
                                lo=1, optional=True),
    **SANDBOX_SCHEMA,
    "harness.max_turns": Field(int, "turn budget (None: the scale's)", lo=1, optional=True),
    "harness.max_output_tokens": Field(int, "tokens per turn (None: the scale's)", lo=1,
                                       optional=True),
    "harness.max_input_tokens": Field(int, "tokens per call (None: the scale's)", lo=1,
                                      optional=True),
    "harness.max_parse_errors": Field(int, "end an episode at this many unparseable replies "
                                      "(None: the scale's; 0: no limit, the paper's harness)",
                                      lo=0, optional=True),
    "eval.k": Field(int, "independent runs per task (Mean@k)", lo=1),
    "eval.n_per_family": Field(int, "eval instances per family (None: the scale's)", lo=1,
                               optional=True),
    "eval.heldout_families": Field(tuple, "held-out families evaluated (None: the scale's)",
                                   item_type=str, optional=True),
    "eval.concurrency": Field(int, "episodes in flight (None: the scale's)", lo=1,
                              optional=True),
    "eval.temperature": Field(float, "sampling temperature (paper: 0.6)", lo=0.0),
    "eval.top_p": Field(float, "nucleus (paper: 0.95)", lo=0.0, hi=1.0),
    "pipeline.targets": Field(tuple, "stages to produce (with their prerequisites)",
                              item_type=str),
    "pipeline.base": Field(str, "base stage: auto (tiny: base_sft, smollm2_135m: "
                           "base_weights from GGUF), base_sft or base_weights",
                           choices=("auto",) + tuple(BASES)),
    "pipeline.bypass": Field(tuple, "stages replaced by a pass-through (ablations)",
                             item_type=str),
    "pipeline.rpr2_lr_divisor": Field(float, "RPR-2 actor lr = RPR-1's / this (paper: 5)",
                                      lo=1e-9),
    "pipeline.divisor_samples": Field(int, "built-in instances per family whose check counts "
                                      "calibrate the frozen divisors D_f", lo=1),
    "pipeline.critic_warmup_steps": Field(int, "critic-only updates opening each RPR phase "
                                          "(paper: 4)", lo=0),
})


def resolved(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Resolve `pipeline.base = auto` and the pretrained-model settings."""
    c = ml_collections.ConfigDict(config.to_dict())
    if c.pipeline.base == "auto":
        c.pipeline.base = "base_sft" if c.model == "tiny" else "base_weights"
    return c


def run(config: ml_collections.ConfigDict, workdir: str):
    from terminal_rsi.pipeline.runner import Pipeline, PipelineError, StageFailed

    config = resolved(config)
    try:
        pipe = Pipeline(config, workdir)
        ledger = pipe.run()
    except (StageFailed, PipelineError) as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    from terminal_rsi.pipeline.table import stage_table

    print(stage_table([ledger.to_dict()]))
    print(f"[pipeline] ledger {ledger.path}; trained now: {', '.join(pipe.executed) or 'none'}")
    return ledger
