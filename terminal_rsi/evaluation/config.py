"""The typed config of the `evaluate` experiment (Mean@k on held-out tasks, §3.1): every
setting, its default, allowed values and doc, written once (`terminal_rsi.settings`).
`configs/evaluate.py` and `configs/eval_smollm2.py` hold only what differs; the pipeline
evaluates every stage with it.
"""

from __future__ import annotations

import dataclasses

from terminal_rsi.config.sections import (
    LAPTOP_HARNESS,
    InitWeights,
    ModelSource,
    NucleusHarness,
    Sampler,
    Seeded,
    Tasks,
)
from terminal_rsi.rewards import REWARD_NAMES
from terminal_rsi.settings import Section, SettingError, setting
from terminal_rsi.tasks import registry


@dataclasses.dataclass(frozen=True)
class EvalTasks(Tasks):
    suites: tuple[str, ...] = setting(("heldout_instances", "heldout_families"),
                                      "suites to evaluate: heldout_instances, heldout_families, "
                                      "validation (built-in) or all (a task directory)")
    heldout_families: tuple[str, ...] = setting((), "held-out families (empty: all of them)")

    def __post_init__(self) -> None:
        super().__post_init__()
        problem = registry.heldout_families_problem(self.suite, self.heldout_families,
                                                    "EvalTasks.heldout_families")
        if problem:
            # training families have held-out instances (split `test`), not held-out families
            test_families = registry.procedural_split(self.suite, "test")[0]
            trained = [n for n in self.heldout_families if n in test_families]
            if trained:
                problem += (f"; to evaluate {trained} on instances no stage trains on, use "
                            f"tasks.suites=('heldout_instances',) with "
                            f"tasks.families={tuple(trained)}")
            raise SettingError(problem)


@dataclasses.dataclass(frozen=True)
class EvalHarness(NucleusHarness):
    """The harness of evaluation: its system prompt must be the one the weights were trained
    under; sampling follows the paper (temperature 0.6, top-p 0.95: `EvalConfig`'s
    defaults)."""


@dataclasses.dataclass(frozen=True)
class EvalRuns(Section):
    k: int = setting(3, "independent runs per task (Mean@k)", lo=1)
    concurrency: int = setting(8, "episodes in flight", lo=1)
    strata_path: str | None = setting(None, "frozen strata JSON (None: fit on the eval tasks)")
    divisors_path: str | None = setting(None, "FamilyDivisors JSON for FDR/SPR (None: "
                                        "defaults)")
    reward_fn: str = setting("fdr", "reward of the episodes (critic EV targets)",
                             choices=REWARD_NAMES)


@dataclasses.dataclass(frozen=True)
class EvalConfig(Seeded):
    """Mean@k, pass@k and process reward of a checkpoint on held-out task suites."""

    model: ModelSource = ModelSource()
    init: InitWeights = InitWeights()
    tasks: EvalTasks = EvalTasks(n_per_family=2)
    harness: EvalHarness = EvalHarness(**{**LAPTOP_HARNESS, "max_turns": 4,
                                          "max_output_tokens": 256},
                                       temperature=0.6, top_p=0.95)
    eval: EvalRuns = EvalRuns()
    rollout: Sampler = Sampler(decode_block=16)
