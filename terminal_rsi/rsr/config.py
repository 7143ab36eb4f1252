"""The typed configs of the supervised stages: `BaseSFTConfig` (`terminal_rsi.rsr.base_sft`,
the tiny default's base) and `RSRConfig` (`terminal_rsi.rsr.stage`, §2.1 Recursive
Self-Rewrite). Every setting, its default, allowed values and doc is written once here
(`terminal_rsi.settings`); `configs/base_sft.py`, `configs/rsr1.py` and `configs/rsr2.py` hold
only what differs.
"""

from __future__ import annotations

import dataclasses

from terminal_rsi.config.sections import (
    LAPTOP_HARNESS,
    Candidates,
    Harness,
    InitWeights,
    ModelSource,
    Rollout,
    Seeded,
    SplitTasks,
    TrainTasks,
)
from terminal_rsi.settings import Section, setting
from terminal_rsi.training.train_state import DecayingOptimizer

AGGREGATIONS = ("sequence_sum", "token_mean", "sample_mean")


@dataclasses.dataclass(frozen=True)
class TargetHarness(Harness):
    """The target harness H0 (the one the stage's actor is trained for)."""

    action_style: str = setting("compact", "style of demonstrations and external policies' "
                                "actions (in harness.action_format): compact (commands and "
                                "completion only, e.g. {\"commands\":[...]}) or full "
                                "(analysis, keystrokes, timeout)", choices=("compact", "full"))


@dataclasses.dataclass(frozen=True)
class SFTOptimizer(DecayingOptimizer):
    """The actor's optimizer of an SFT stage, with its lr schedule over the stage's steps
    (`rsr.common.optimizer_config` derives the runtime decay_steps from it)."""

    schedule: str = setting("constant", "lr after the warm-up: constant, or cosine decay to "
                            "end_lr_ratio x lr at the last SFT step of the stage",
                            choices=("constant", "cosine"))


@dataclasses.dataclass(frozen=True)
class SFT(Section):
    steps: int = setting(200, "SFT optimizer steps (rsr: at most, see sft.epochs)", lo=0)
    batch_size: int = setting(8, "trajectories per SFT step (drawn uniformly with "
                              "replacement)", lo=1)
    num_microbatches: int = setting(1, "gradient-accumulation slices per step", lo=1)
    aggregation: str = setting("token_mean", "loss aggregation (Eq. 3 literally: "
                               "sequence_sum)", choices=AGGREGATIONS)


@dataclasses.dataclass(frozen=True)
class Demos(Section):
    runbook_fraction: float = setting(0.6, "fraction of tasks that also get a runbook-"
                                      "conditioned demonstration", lo=0.0, hi=1.0)
    curriculum: str = setting("none", "none | length (shortest demonstrations first)",
                              choices=("none", "length"))


@dataclasses.dataclass(frozen=True)
class BaseSFTEval(Section):
    num_tasks: int = setting(16, "held-out tasks per evaluation (0: no evaluation)", lo=0)
    temperature: float = setting(0.0, "sampling temperature of evaluation (0: greedy)", lo=0.0)
    every: int = setting(0, "evaluate every N SFT steps (0: only at the end)", lo=0)
    guided: bool = setting(True, "also evaluate under H0 + digest-runbook guidance")


@dataclasses.dataclass(frozen=True)
class BaseSFTConfig(Seeded):
    """Supervised training of the base actor on reference demonstrations."""

    model: ModelSource = ModelSource()
    init: InitWeights = InitWeights()
    tasks: SplitTasks = SplitTasks()
    harness: TargetHarness = TargetHarness(**LAPTOP_HARNESS)
    rollout: Rollout = Rollout()
    demos: Demos = Demos()
    sft: SFT = SFT()
    actor_opt: SFTOptimizer = SFTOptimizer(learning_rate=3e-3, weight_decay=0.0,
                                           warmup_steps=10)
    eval: BaseSFTEval = BaseSFTEval()


@dataclasses.dataclass(frozen=True)
class Discovery(Section):
    """The complementary harnesses that look for successes H0 misses."""

    harnesses: tuple[str, ...] = setting(("hot", "external"), "complementary harnesses: "
                                         "hints, hot, long, external")
    hints: tuple[str, ...] = setting(("Read the files the task names before you act.",
                                      "Write outputs exactly where the task asks."),
                                     "hints of the `hints` harness")
    hot_temperature: float = setting(1.3, "temperature of the `hot` harness", lo=0.0)
    hot_samples: int = setting(2, "samples per task of the `hot` harness", lo=1)
    long_factor: int = setting(2, "budget multiplier of the `long` harness", lo=1)
    max_per_task: int = setting(1, "verified successes kept per task", lo=1)


@dataclasses.dataclass(frozen=True)
class Planner(Section):
    kind: str = setting("digest", "digest | policy", choices=("digest", "policy"))
    k: int = setting(4, "K: runbooks sampled per success (policy planner)", lo=1)
    max_tokens: int = setting(384, "max tokens of a sampled runbook", lo=1)
    temperature: float = setting(1.0, "planner sampling temperature", lo=0.0)


@dataclasses.dataclass(frozen=True)
class Execution(Section):
    m: int = setting(4, "M: fresh executions per accepted runbook", lo=1)
    temperature: float | None = setting(None, "sampling temperature of the fresh executions "
                                        "(None: the target harness's)", lo=0.0)
    instruction: str | None = setting(None, "I_exec (None: guidance.EXEC_INSTRUCTION)")


@dataclasses.dataclass(frozen=True)
class RSRSFT(SFT):
    epochs: float | None = setting(None, "size the SFT by the SFT set: ceil(epochs · "
                                   "(|Q_clean| + |rehearsal|) / batch_size) steps, at most "
                                   "sft.steps (None: always sft.steps); an empty Q_clean "
                                   "always means 0 steps", lo=1e-9)
    rehearsal_samples: int = setting(0, "self-rehearsal: samples per training task of the "
                                     "input actor under H0; its verified successes join a "
                                     "non-empty Q_clean in the fine-tune (0: off, the "
                                     "paper)", lo=0)
    guided_rehearsal: bool = setting(False, "the accepted fresh executions also join the "
                                     "fine-tune as they ran, runbook in the prompt (as "
                                     "base_sft's runbook demonstrations), so that the actor "
                                     "still follows a runbook in the next RSR stage (off: the "
                                     "paper, public views only)")
    kl_coef: float = setting(0.0, "trust region toward the input actor π_in: adds kl_coef · "
                             "KL(π_θ(·|h_j) ‖ π_in(·|h_j)), the exact full-vocabulary KL at "
                             "each supervised position j, aggregated like the SFT loss "
                             "(sft.aggregation); one more forward pass and full [B, L, V] "
                             "logits (0: off, the paper)", lo=0.0)


@dataclasses.dataclass(frozen=True)
class RSREval(Section):
    rewritten: bool = setting(True, "measure success on the rewritten tasks under H0 before "
                              "and after fine-tuning")
    temperature: float = setting(0.0, "temperature of that measurement (0: greedy)", lo=0.0)


@dataclasses.dataclass(frozen=True)
class RSRConfig(Seeded):
    """One RSR stage: discover, plan runbooks, review, execute fresh, fine-tune the actor."""

    model: ModelSource = ModelSource()
    init: InitWeights = InitWeights()
    tasks: TrainTasks = TrainTasks()
    harness: TargetHarness = TargetHarness(**LAPTOP_HARNESS)
    rollout: Rollout = Rollout()
    discovery: Discovery = Discovery()
    planner: Planner = Planner()
    execution: Execution = Execution()
    sft: RSRSFT = RSRSFT(steps=60, aggregation="sequence_sum")
    actor_opt: SFTOptimizer = SFTOptimizer(learning_rate=5e-4, weight_decay=0.0)
    eval: RSREval = RSREval()
    candidates: Candidates = Candidates()
