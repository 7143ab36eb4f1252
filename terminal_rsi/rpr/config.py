"""The typed config of one RPR phase (§2.4): every setting of `terminal_rsi.rpr.phase`, with
its default, allowed values and doc, written once (`terminal_rsi.settings`).

`configs/rpr_phase.py` and the stage configs built on it hold only what differs from these
defaults; `python experiments/run.py` builds a `PhaseConfig` from the ConfigDict and checks
it before any work. The defaults run on a laptop CPU; the PPO and optimizer defaults that are
not learning rates are the paper's (App. A), and `--config.scale=paper` of the pipeline sets
the rest of the paper's protocol.
"""

from __future__ import annotations

import dataclasses

from terminal_rsi.config.sections import (
    LAPTOP_HARNESS,
    BatchedRollout,
    Candidates,
    Harness,
    InitWeights,
    Mesh,
    ModelSource,
    Seeded,
    SplitTasks,
)
from terminal_rsi.credit import ESTIMATORS, AdvantageEstimator
from terminal_rsi.rewards import REWARD_NAMES
from terminal_rsi.settings import Section, setting
from terminal_rsi.training.losses import PPOConfig, PPOLoss
from terminal_rsi.training.train_state import Optimizer

MODES = ("phase", "warmup_critic")
CURRICULA = ("cyclic", "reward_variance")
CORRECTIONS = ("auto", "none", "tis", "mask", "tis_mask")


@dataclasses.dataclass(frozen=True)
class Rewards(Section):
    fn: str = setting("fdr", "frozen reward function of the phase", choices=REWARD_NAMES)
    divisors_path: str | None = setting(None, "FamilyDivisors JSON (None: defaults, "
                                        "fallback 82)")


@dataclasses.dataclass(frozen=True)
class PhaseRollout(BatchedRollout):
    """How a rollout step collects its episodes."""

    progress: bool = setting(False, "print the scheduler's progress line")
    curriculum: str = setting("cyclic", "task draw: cyclic (in order) | reward_variance "
                              "(families with mixed rewards more often; "
                              "terminal_rsi.rpr.curriculum)", choices=CURRICULA)
    curriculum_floor: float = setting(0.1, "reward_variance: every family keeps at least this "
                                      "fraction of the mean family weight", lo=0.0)
    policy_lag: int = setting(0, "0: synchronous (collect, then update); 1: one batch ahead, "
                              "the rollouts of step k+1 run while step k updates, sampled by "
                              "the actor before that update (lag 1; a checkpoint waits for "
                              "them and stores them, so a resume loses none)", lo=0, hi=1)


@dataclasses.dataclass(frozen=True)
class Advantage(Section):
    """The advantage estimator (`credit.ESTIMATORS`): TB-GAE over turns (§2.3,
    `TurnBoundaryGAE(gamma_turn, lambda_turn)`) or per-token GAE (`TokenGAE(gamma, lam)`);
    `build()` is the estimator object the phase computes advantages with."""

    estimator: str = setting("tb_gae", " | ".join(ESTIMATORS), choices=tuple(ESTIMATORS))
    gamma_turn: float = setting(1.0, "TB-GAE γ_turn", lo=0.0, hi=1.0)
    lambda_turn: float = setting(1.0, "TB-GAE λ_turn", lo=0.0, hi=1.0)
    gamma: float = setting(1.0, "GAE γ", lo=0.0, hi=1.0)
    lam: float = setting(1.0, "GAE λ", lo=0.0, hi=1.0)

    def build(self) -> AdvantageEstimator:
        """The estimator named by `estimator`, with its parameters from this section (e.g.
        `TurnBoundaryGAE(gamma_turn=self.gamma_turn, lambda_turn=self.lambda_turn)`)."""
        return ESTIMATORS[self.estimator].from_section(self)


@dataclasses.dataclass(frozen=True)
class PPO(PPOLoss):
    """The PPO update of a rollout step: the loss settings (`losses.PPOLoss`: clips,
    aggregation, KL and entropy coefficients) and how the update runs. The losses take
    `PhaseConfig.loss_config()`."""

    critic_warmup_steps: int = setting(4, "first rollout steps with critic-only updates",
                                       lo=0)
    epochs: int = setting(1, "passes over each rollout batch", lo=1)
    critic_epochs: int | None = setting(None, "critic passes over each rollout batch (None: "
                                        "ppo.epochs); more than the actor's, as verl's "
                                        "critic.ppo_epochs, lets a young critic catch up "
                                        "without larger actor steps", lo=1)
    num_minibatches: int = setting(2, "minibatches per epoch (updates per epoch)", lo=1)
    num_microbatches: int = setting(1, "gradient-accumulation slices per minibatch", lo=1)
    normalize_advantages: bool = setting(False, "whiten advantages over the batch's trained "
                                         "tokens (mean 0, std 1) before the update (paper: "
                                         "off)")
    length_grouping: bool = setting(True, "minibatches of rows of similar length, each cut to "
                                    "its own width (False: random minibatches at the full "
                                    "width)")
    mask_malformed: bool = setting(False, "leave replies that did not parse or hit the output "
                                   "limit out of the policy loss (the critic still trains on "
                                   "them; agent.malformed_mask; paper: off)")
    behavior_correction: str = setting(
        "auto", "correction for tokens sampled by a policy other than π_old "
        "(losses.behavior_correction, r = π_old/π_behav): none | tis (surrogate weighted by "
        "min(r, behavior_is_cap)) | mask (tokens with r outside [behavior_band_low, "
        "behavior_band_high] leave the policy loss) | tis_mask (both) | auto (tis when "
        "rollout.policy_lag > 0, else none)", choices=CORRECTIONS)
    behavior_is_cap: float = setting(2.0, "truncation cap C of the importance weight", lo=1.0)
    behavior_band_low: float = setting(0.5, "lower end of the kept band of r", lo=0.0, hi=1.0)
    behavior_band_high: float = setting(2.0, "upper end of the kept band of r", lo=1.0)

    def correction(self, policy_lag: int) -> dict:
        """`losses.PPOConfig` fields is_cap and is_band of `behavior_correction` at this
        policy lag."""
        kind = self.behavior_correction
        if kind == "auto":
            kind = "tis" if policy_lag > 0 else "none"
        return {"is_cap": self.behavior_is_cap if "tis" in kind else None,
                "is_band": ((self.behavior_band_low, self.behavior_band_high)
                            if "mask" in kind else None)}


@dataclasses.dataclass(frozen=True)
class PhaseEval(Section):
    every: int = setting(3, "evaluate every N steps (0: never)", lo=0)
    num_tasks: int = setting(2, "held-out tasks per evaluation", lo=1)


@dataclasses.dataclass(frozen=True)
class Checkpointing(Section):
    every: int = setting(2, "checkpoint every M steps (and at the end)", lo=1)
    max_to_keep: int = setting(3, "checkpoints kept", lo=1)


@dataclasses.dataclass(frozen=True)
class PhaseConfig(Seeded):
    """One RPR phase, or with mode warmup_critic the critic's warm-up pass."""

    mode: str = setting("phase", "phase: RPR phase; warmup_critic: one critic-only pass",
                        choices=MODES)
    num_steps: int = setting(6, "rollout steps of the phase (mode=phase)", lo=1)
    model: ModelSource = ModelSource()
    init: InitWeights = InitWeights()
    tasks: SplitTasks = SplitTasks()
    harness: Harness = Harness(**LAPTOP_HARNESS)
    rewards: Rewards = Rewards()
    rollout: PhaseRollout = PhaseRollout()
    advantage: Advantage = Advantage()
    ppo: PPO = PPO()
    actor_opt: Optimizer = Optimizer()
    critic_opt: Optimizer = Optimizer(learning_rate=1e-3, grad_clip=100.0)
    eval: PhaseEval = PhaseEval()
    checkpoint: Checkpointing = Checkpointing()
    candidates: Candidates = Candidates()
    mesh: Mesh = Mesh()

    def __post_init__(self) -> None:
        super().__post_init__()
        self.loss_config()  # the losses' own checks (e.g. harness.temperature > 0), up front

    def loss_config(self) -> PPOConfig:
        """The losses' PPOConfig: the loss settings of `ppo`, the policy temperature of the
        rollouts (the optimized policy is the one that samples them: π_θ at
        harness.temperature) and the behaviour correction of `ppo.behavior_correction` at
        the phase's policy lag."""
        return PPOConfig.from_config(self.ppo, temperature=self.harness.temperature,
                                     **self.ppo.correction(self.rollout.policy_lag))
