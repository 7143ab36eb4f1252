"""The experiment registry: `config.experiment` name → module that runs it.

Each entry is a module path, imported only when its experiment is run, so
`import terminal_rsi` stays light. An experiment module defines

    SCHEMA: Mapping[str, configuration.Field]   # every config leaf, validated before work
    def run(config: ml_collections.ConfigDict, workdir: str) -> Any

To add an experiment, add one line here and one file under `configs/`.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from terminal_rsi.configuration import ConfigError

EXPERIMENTS: dict[str, str] = {
    "credit_diagnostic": "terminal_rsi.credit.diagnostic",
    "rollouts": "terminal_rsi.agent.rollout_experiment",
    "rescore": "terminal_rsi.rewards.rescore",
    "verify_tasks": "terminal_rsi.tasks.check_tasks",
    "rpr_phase": "terminal_rsi.rpr.phase",
    "rsr": "terminal_rsi.rsr.stage",
    "base_sft": "terminal_rsi.rsr.base_sft",
    "evaluate": "terminal_rsi.evaluation.evaluate",
    "pipeline": "terminal_rsi.pipeline.experiment",
    "base_weights": "terminal_rsi.pipeline.base_weights",
}


def get_experiment(name: str) -> ModuleType:
    """Return the module implementing experiment `name` (ConfigError if unknown)."""
    if name not in EXPERIMENTS:
        raise ConfigError(
            f"config.experiment = {name!r} is not a registered experiment; "
            f"choose one of: {', '.join(sorted(EXPERIMENTS))}"
        )
    module = importlib.import_module(EXPERIMENTS[name])
    for attr in ("SCHEMA", "run"):
        if not hasattr(module, attr):
            raise TypeError(f"experiment module {module.__name__} lacks {attr}")
    return module
