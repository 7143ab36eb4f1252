"""Experiment "credit_diagnostic": the component-level CPU diagnostic of TB-GAE
(paper/component_review.md, "Local reproduction"; the measurements are
`terminal_rsi.credit.diagnostic`).

For each method and seed, the reference, insertion, continuation and negative-control errors
of one chain; prints a table of the maximum absolute errors per seed and method and writes
`credit_diagnostic.json` (the config, the rows and their mean over seeds) to the workdir.

    python experiments/run.py --config=configs/credit_diagnostic.py --workdir=/tmp/credit
"""

from __future__ import annotations

import dataclasses
import os

import jax
import numpy as np

from terminal_rsi.config.sections import Seeded
from terminal_rsi.credit.diagnostic import METHOD_NAMES, check_seed, mean_over_seeds
from terminal_rsi.runtime.atomic import atomic_write_json
from terminal_rsi.settings import SettingError, setting


def _methods_problem(methods: tuple[str, ...]) -> str | None:
    bad = [m for m in methods if m not in METHOD_NAMES]
    return f"unknown {bad}" if bad else None


@dataclasses.dataclass(frozen=True)
class CreditDiagnosticConfig(Seeded):
    """The chains of the diagnostic and the TB-GAE methods it checks."""

    seeds: tuple[int, ...] = setting((42, 43, 44), "seeds, one diagnostic chain each")
    num_generated: int = setting(20, "generated tokens per chain", lo=2)
    num_turns: int = setting(5, "turns the generated tokens are split into (at most "
                             "num_generated)", lo=1)
    num_observations: int = setting(40, "observation positions inserted", lo=0)
    split_at: int = setting(11, "generated position where the chain is split into chunks "
                            "(below num_generated)", lo=1)
    gamma_turn: float = setting(0.95, "turn-boundary discount γ_turn", lo=0.0, hi=1.0)
    lambda_turn: float = setting(0.95, "turn-boundary trace decay λ_turn", lo=0.0, hi=1.0)
    terminal_reward: float = setting(1.0, "reward on the last generated token")
    methods: tuple[str, ...] = setting(METHOD_NAMES, "TB-GAE methods to check",
                                       check=_methods_problem,
                                       allowed="each one of " + ", ".join(map(repr,
                                                                              METHOD_NAMES)))
    dtype: str = setting("float64", "compute dtype", choices=("float64", "float32"))

    def __post_init__(self) -> None:
        super().__post_init__()
        name = type(self).__name__
        if self.num_turns > self.num_generated:
            raise SettingError(f"{name}.num_turns = {self.num_turns} must be <= num_generated "
                               f"({self.num_generated})")
        if self.split_at >= self.num_generated:
            raise SettingError(f"{name}.split_at = {self.split_at} must be < num_generated "
                               f"({self.num_generated})")


CONFIG = CreditDiagnosticConfig


def run(config: CreditDiagnosticConfig, workdir: str) -> dict:
    """Measure every (method, seed), print the table, write `credit_diagnostic.json`."""
    rows = []
    with jax.enable_x64(config.dtype == "float64"):
        dtype = np.float64 if config.dtype == "float64" else np.float32
        for method in config.methods:
            for seed in config.seeds:
                rows.append(check_seed(
                    seed, method=method, dtype=dtype, num_generated=config.num_generated,
                    num_turns=config.num_turns, num_observations=config.num_observations,
                    split_at=config.split_at, gamma_turn=config.gamma_turn,
                    lambda_turn=config.lambda_turn, terminal_reward=config.terminal_reward))
    artifact = {"config": {"experiment": "credit_diagnostic", **dataclasses.asdict(config)},
                "rows": rows, "mean_over_seeds": mean_over_seeds(rows, config.methods)}
    path = os.path.join(workdir, "credit_diagnostic.json")
    atomic_write_json(path, artifact)
    print(format_table(rows))
    print(f"wrote {path}")
    return artifact


def format_table(rows: list[dict]) -> str:
    """The rows of `check_seed` as a text table, one line per (method, seed)."""
    header = (f"{'method':<12} {'seed':>4} {'vs double sum':>14} {'insertion':>10} "
              f"{'continuation':>13} {'zeroed trace (neg. control)':>28}")
    lines = [header, "-" * len(header)]
    for row in rows:
        lines.append(
            f"{row['method']:<12} {row['seed']:>4} {row['reference_error']:>14.3e} "
            f"{row['insertion_error']:>10.3e} {row['continuation_error']:>13.3e} "
            f"{row['negative_control_error']:>28.6f}"
        )
    return "\n".join(lines)
