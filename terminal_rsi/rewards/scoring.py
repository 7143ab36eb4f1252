"""Scoring finished episodes: the stage that owns the frozen divisors applies its reward.

The harness only runs an episode and records the verifier's report (`Trajectory.report`,
P, N, S); which scalar reward that report earns is the stage's choice (paper §2.2: FDR in
RPR-1, SPR in the Long-Reward RPR-2, binary for ablations) with the divisor table D_f the
stage froze at its start. An `EpisodeScorer` is that choice:

    score = EpisodeScorer("spr", FamilyDivisors.load(path))
    reward = score(trajectory)        # sets trajectory.reward and trajectory.reward_fn

`RolloutScheduler(..., scorer=score)` applies it to every finished episode, before any
statistics of the batch are taken.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from terminal_rsi.rewards.ctrf import VerificationReport
from terminal_rsi.rewards.divisors import FamilyDivisors
from terminal_rsi.rewards.functions import DivisorTable, get_reward_fn


@dataclasses.dataclass(frozen=True)
class EpisodeScorer:
    """The reward `reward_fn` ("binary", "fdr" or "spr") of an episode's verification
    report with the frozen divisor table `divisors` (None: `FamilyDivisors()` defaults).

    An episode without a report (a verifier or infrastructure error, or one not verified)
    scores 0; a non-finite reward is stored as 0."""

    reward_fn: str = "fdr"
    divisors: DivisorTable | None = None

    def __post_init__(self) -> None:
        get_reward_fn(self.reward_fn)  # SettingError naming the choices
        if self.divisors is None:
            object.__setattr__(self, "divisors", FamilyDivisors())

    def reward(self, report: VerificationReport | None, family: str) -> float:
        """The reward of `report` for an episode of `family` (0 without a report)."""
        if report is None:
            return 0.0
        r = float(get_reward_fn(self.reward_fn)(report, family, self.divisors))
        return r if math.isfinite(r) else 0.0

    def __call__(self, trajectory: Any) -> float:
        """Score a finished trajectory (anything with `report` (a VerificationReport dict or
        None), `family`, `reward`, `reward_fn`): set its reward and reward_fn, return it."""
        report = (VerificationReport.from_dict(trajectory.report)
                  if trajectory.report is not None else None)
        trajectory.reward = self.reward(report, trajectory.family)
        trajectory.reward_fn = self.reward_fn
        return trajectory.reward


