"""The typed config of the `pipeline` experiment (the Terminal-RSI stage graph): every
setting of the job itself, with its default, allowed values and doc, written once
(`terminal_rsi.settings`).

`SCHEMA` (what a pipeline ConfigDict is checked against) is this class's schema plus the
free `stages.<stage>.<field>` overrides; `resolved` fills in what the scale decides.

A shared setting left None here means "the scale's" (`terminal_rsi.pipeline.scales`, chosen by
`scale`), else the stage config file's. Per-stage overrides of any stage config field,
`stages.<stage>.<field>`, are not part of this class: they are checked against the stage's
own typed config when the stage is resolved (`terminal_rsi.pipeline.runner`).
"""

from __future__ import annotations

import dataclasses

import ml_collections

from terminal_rsi.config.configuration import schema_of
from terminal_rsi.config.sections import ACTION_FORMATS, TERMINALS, Seeded, TaskPool
from terminal_rsi.models.config import TOKENIZERS
from terminal_rsi.pipeline.graph import BASES, STAGES
from terminal_rsi.pipeline.scales import SCALES, get_scale
from terminal_rsi.settings import Section, Setting, setting

MODELS = ("tiny", "smollm2_135m")
STAGE_NAMES = tuple(STAGES)  # every stage of the graph, in graph order


def _dim(name: str) -> str:
    return f"tiny model {name} (None: the scale's)"


@dataclasses.dataclass(frozen=True)
class ModelDims(Section):
    """Shape and tokenizer of the tiny model (ignored for a pretrained model)."""

    tokenizer: str | None = setting(None, "tiny model tokenizer, 'byte' or 'bpe' (the shipped "
                                    "BPE; vocab_size follows it) (None: the scale's, else "
                                    "byte)", choices=TOKENIZERS)
    vocab_size: int | None = setting(None, _dim("vocab_size"), lo=1)
    d_model: int | None = setting(None, _dim("d_model"), lo=1)
    n_layers: int | None = setting(None, _dim("n_layers"), lo=1)
    n_heads: int | None = setting(None, _dim("n_heads"), lo=1)
    n_kv_heads: int | None = setting(None, _dim("n_kv_heads"), lo=1)
    head_dim: int | None = setting(None, _dim("head_dim"), lo=1)
    d_ff: int | None = setting(None, _dim("d_ff"), lo=1)
    max_seq_len: int | None = setting(None, _dim("max_seq_len"), lo=1)


@dataclasses.dataclass(frozen=True)
class PipelineTasks(TaskPool):
    families: tuple[str, ...] | None = setting(None, "training families (None: the scale's)")
    n_per_family: int | None = setting(None, "training instances per family (None: the "
                                       "scale's)", lo=1)


@dataclasses.dataclass(frozen=True)
class PipelineHarness(Section):
    max_turns: int | None = setting(None, "turn budget (None: the scale's)", lo=1)
    max_output_tokens: int | None = setting(None, "tokens per turn (None: the scale's)", lo=1)
    max_input_tokens: int | None = setting(None, "tokens per call (None: the scale's)", lo=1)
    max_parse_errors: int | None = setting(None, "end an episode at this many unparseable "
                                           "replies (None: the scale's; 0: no limit, the "
                                           "paper's harness)", lo=0)
    terminal: str | None = setting(None, "how every stage's commands run: 'exec' or "
                                   "'session' (a persistent tmux terminal per episode; None: "
                                   "the stage configs' default, exec)",
                                   choices=TERMINALS)
    action_format: str | None = setting(None, "how every stage's replies write actions: "
                                        "'json', 'xml' or 'bash' (None: the stage configs' "
                                        "default, json); trained, rewritten and evaluated "
                                        "alike", choices=ACTION_FORMATS)


@dataclasses.dataclass(frozen=True)
class PipelineEval(Section):
    """How every stage is evaluated (held-out instances and held-out families)."""

    k: int = setting(3, "independent runs per task (Mean@k)", lo=1)
    n_per_family: int | None = setting(None, "eval instances per family (None: the scale's)",
                                       lo=1)
    heldout_families: tuple[str, ...] | None = setting(None, "held-out families evaluated "
                                                       "(None: the scale's)")
    concurrency: int | None = setting(None, "episodes in flight (None: the scale's)", lo=1)
    temperature: float = setting(0.6, "sampling temperature (paper: 0.6)", lo=0.0)
    top_p: float = setting(0.95, "nucleus (paper: 0.95)", lo=0.0, hi=1.0)


@dataclasses.dataclass(frozen=True)
class PipelineValidation(Section):
    """Model selection between stages (`terminal_rsi.pipeline.validation`): every stage's
    actor is scored on validation instances (training families, seeds disjoint from the
    training and the held-out test instances) and kept only if it beats its input's; an RSR
    or RPR stage offers several actors from its training (`candidates`), the best of which
    is its actor."""

    enabled: bool = setting(True, "score each stage's actor on the validation split and hand "
                            "the input on unchanged when it does not beat it (built-in "
                            "suites; a task directory has no validation split)")
    n_per_family: int | None = setting(None, "validation instances per training family "
                                       "(None: the scale's)", lo=1)
    k: int | None = setting(None, "runs per validation task, Mean@k decides (None: the "
                            "scale's)", lo=1)
    candidates: int | None = setting(None, "actors scored per RSR and RPR stage: its final "
                                     "export and candidates - 1 evenly spaced earlier ones "
                                     "(the stage's candidates.count); the best is the stage's "
                                     "(None: the scale's)", lo=1)
    min_gain: float = setting(0.0, "a stage's actor is kept only if its validation Mean@k "
                              "exceeds its input's by more than this", lo=0.0, hi=1.0)


@dataclasses.dataclass(frozen=True)
class Graph(Section):
    """Which stages run and the handoff rules between them."""

    targets: tuple[str, ...] = setting(("rpr2_spr",), "stages to produce (with their "
                                       "prerequisites)")
    base: str = setting("base_sft", "base stage: base_sft (trained on rendered "
                        "demonstrations; for a pretrained model, from stage `pretrained`, its "
                        "shipped weights, evaluated zero-shot) or base_weights (the given "
                        "weights as they are)", choices=tuple(BASES))
    bypass: tuple[str, ...] = setting((), "stages replaced by a pass-through (ablations)")
    rpr2_lr_divisor: float = setting(5.0, "RPR-2 actor lr = RPR-1's / this (paper: 5)",
                                     lo=1e-9)
    critic_warmup_steps: int = setting(4, "critic-only updates opening each RPR phase "
                                       "(paper: 4)", lo=0)
    divisor_samples: int = setting(32, "built-in instances per family whose check counts "
                                   "calibrate the frozen divisors D_f", lo=1)


@dataclasses.dataclass(frozen=True)
class PipelineConfig(Seeded):
    """The stage graph end to end (paper Fig. 2-3)."""

    model: str = setting("tiny", "model preset: tiny (trained base) or smollm2_135m "
                         "(pretrained base)", choices=MODELS)
    model_dims: ModelDims = ModelDims()
    scale: str = setting("default", "size preset (terminal_rsi.pipeline.scales)",
                         choices=tuple(SCALES))
    tasks: PipelineTasks = PipelineTasks()
    harness: PipelineHarness = PipelineHarness()
    eval: PipelineEval = PipelineEval()
    validation: PipelineValidation = PipelineValidation()
    pipeline: Graph = Graph()


class _Schema(dict):
    """The pipeline schema: fixed fields, plus free `stages.<stage>.<path>` overrides that are
    validated later against the stage experiment's own schema (PipelineError names them)."""

    _FREE = Setting(object, "override of any field of the stage's config file (checked by the "
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


# the job's own fields come from its typed config (terminal_rsi.pipeline.config); the free
# `stages.<stage>.<path>` overrides are checked against the stage's config when resolved
SCHEMA = _Schema(schema_of(PipelineConfig))


def resolved(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """A copy of `config` with the settings left None for the scale filled from it
    (`validation.*`; the stage settings are filled per stage, terminal_rsi.pipeline.resolve)."""
    c = ml_collections.ConfigDict(config.to_dict())
    scale = get_scale(c.scale)
    for k, v in scale["validation"].items():
        if c.validation.get(k) is None:
            c.validation[k] = v
    return c
