"""The experiment registry: `config.experiment` name → the module that runs it.

Each entry is a module path, imported only when its experiment runs, so `import
terminal_rsi` stays light. An experiment module defines its typed config and its entry point

    CONFIG: type[settings.Section]              # every setting, written once
    def run(config: CONFIG, workdir: str) -> Any

or (the `pipeline`, whose config also holds free per-stage overrides) a schema derived from
its typed config and its own `run` on the ConfigDict

    SCHEMA: Mapping[str, settings.Setting]      # every config leaf, validated before work
    def run(config: ml_collections.ConfigDict, workdir: str) -> Any

Where an experiment's config lives in a light module of its own, `CONFIGS` names it
("module:attribute"), so checking a config (`Experiment.check`, what `experiments/run.py` and
the pipeline do before any work) does not import the whole training stack; the run module
is imported when the experiment runs. `get_experiment` returns an `Experiment` with `SCHEMA`,
`check(config_dict)` (the typed config) and `run(config, workdir)`. To add an experiment, add
one line here and one file under `configs/`.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping
from typing import Any

from terminal_rsi.config.configuration import ConfigError, build, schema_of, validate_config
from terminal_rsi.settings import Section, Setting

# name -> the module with the experiment's `run`
EXPERIMENTS: dict[str, str] = {
    "credit_diagnostic": "terminal_rsi.experiments.credit_diagnostic",
    "report": "terminal_rsi.experiments.report",
    "rollouts": "terminal_rsi.experiments.rollouts",
    "rescore": "terminal_rsi.experiments.rescore",
    "export_hf": "terminal_rsi.experiments.export_hf",
    "verify_tasks": "terminal_rsi.experiments.verify_tasks",
    "rpr_phase": "terminal_rsi.rpr.phase",
    "rsr": "terminal_rsi.rsr.stage",
    "base_sft": "terminal_rsi.rsr.base_sft",
    "evaluate": "terminal_rsi.evaluation.evaluate",
    "pipeline": "terminal_rsi.pipeline.experiment",
    "base_weights": "terminal_rsi.pipeline.base_weights",
}
# name -> "module:attribute" of its typed config (a Section) or schema, where that is not the
# run module's CONFIG / SCHEMA
CONFIGS: dict[str, str] = {
    "rpr_phase": "terminal_rsi.rpr.config:PhaseConfig",
    "rsr": "terminal_rsi.rsr.config:RSRConfig",
    "base_sft": "terminal_rsi.rsr.config:BaseSFTConfig",
    "evaluate": "terminal_rsi.evaluation.config:EvalConfig",
    "pipeline": "terminal_rsi.pipeline.config:SCHEMA",
}


@dataclasses.dataclass(frozen=True)
class Experiment:
    """A registered experiment: the schema a ConfigDict is checked against, its typed config
    class (None for a schema-only experiment) and the module path of its `run`."""

    name: str
    SCHEMA: Mapping[str, Setting]
    config_type: type | None
    run_module: str

    def check(self, config: Any) -> Any:
        """`config` checked against SCHEMA (ConfigError naming the field) and, for a typed
        experiment, built into its config class: what `run` is given."""
        if self.config_type is None:
            validate_config(config, self.SCHEMA)
            return config
        if isinstance(config, self.config_type):
            return config
        return build(self.config_type, config)

    def run(self, config: Any, workdir: str) -> Any:
        """Run the experiment on `config` (a ConfigDict, or an instance of `config_type`)."""
        if self.config_type is not None:
            config = self.check(config)
        module = importlib.import_module(self.run_module)
        if not hasattr(module, "run"):
            raise TypeError(f"experiment module {self.run_module} defines no run")
        return module.run(config, workdir)


def get_experiment(name: str) -> Experiment:
    """The experiment `name` (ConfigError if unknown). Imports its config's module only."""
    if name not in EXPERIMENTS:
        raise ConfigError(
            f"config.experiment = {name!r} is not a registered experiment; "
            f"choose one of: {', '.join(sorted(EXPERIMENTS))}"
        )
    ref = CONFIGS.get(name)
    if ref is None:
        module = importlib.import_module(EXPERIMENTS[name])
        if not (hasattr(module, "CONFIG") or hasattr(module, "SCHEMA")):
            raise TypeError(f"experiment module {module.__name__} lacks CONFIG (or SCHEMA)")
        found = getattr(module, "CONFIG", None) or module.SCHEMA
    else:
        path, _, attr = ref.partition(":")
        found = getattr(importlib.import_module(path), attr)
    if isinstance(found, type) and issubclass(found, Section):
        return Experiment(name, schema_of(found), found, EXPERIMENTS[name])
    return Experiment(name, found, None, EXPERIMENTS[name])
