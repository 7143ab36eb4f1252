"""Rewards from verifier reports (paper §2.2, Appendix B).

CTRF report → `VerificationReport` (`parse_ctrf`), frozen family divisor tables
(`FamilyDivisors`, `calibrate_family_divisors`, `recalibrate`), and the reward
functions FDR (Eq. 6) and SPR (Eq. 7) in scalar and vectorized (jit-able) form, by name in
`REWARDS` (every reward setting's choices: `REWARD_NAMES`);
`EpisodeScorer`: a stage's reward of finished episodes (the harness does not score).
Offline rescoring: `terminal_rsi.rewards.rescore` (experiment "rescore":
`terminal_rsi.experiments.rescore`).
"""

from terminal_rsi.rewards.ctrf import (
    DEFAULT_HYGIENE,
    DEFAULT_HYGIENE_PATTERNS,
    DEFAULT_HYGIENE_TAGS,
    HygieneRule,
    ReportError,
    VerificationReport,
    parse_ctrf,
    parse_reward_value,
    success_from_exit_code,
    success_from_reward,
    success_from_reward_file,
)
from terminal_rsi.rewards.divisors import (
    DEFAULT_FALLBACK,
    DivisorError,
    FamilyDivisors,
    Provenance,
    RecalibrationRules,
    RuleDecision,
    calibrate_family_divisors,
    quantile_linear,
    recalibrate,
    rule_counts,
)
from terminal_rsi.rewards.functions import (
    REWARD_NAMES,
    REWARDS,
    Reward,
    RewardInputError,
    binary,
    fdr,
    fdr_array,
    fdr_value,
    get_reward,
    get_reward_array_fn,
    get_reward_fn,
    report_arrays,
    spr,
    spr_array,
    spr_progress,
    spr_value,
)
from terminal_rsi.rewards.outcomes import EpisodeFormatError, EpisodeOutcome, load_episodes
from terminal_rsi.rewards.scoring import EpisodeScorer

__all__ = [
    "DEFAULT_FALLBACK",
    "DEFAULT_HYGIENE",
    "DEFAULT_HYGIENE_PATTERNS",
    "DEFAULT_HYGIENE_TAGS",
    "DivisorError",
    "EpisodeFormatError",
    "EpisodeOutcome",
    "EpisodeScorer",
    "FamilyDivisors",
    "HygieneRule",
    "Provenance",
    "REWARDS",
    "REWARD_NAMES",
    "RecalibrationRules",
    "ReportError",
    "Reward",
    "RewardInputError",
    "RuleDecision",
    "VerificationReport",
    "binary",
    "calibrate_family_divisors",
    "fdr",
    "fdr_array",
    "fdr_value",
    "get_reward",
    "get_reward_array_fn",
    "get_reward_fn",
    "load_episodes",
    "parse_ctrf",
    "quantile_linear",
    "recalibrate",
    "report_arrays",
    "rule_counts",
    "spr",
    "spr_array",
    "spr_progress",
    "spr_value",
    "success_from_exit_code",
    "success_from_reward",
    "success_from_reward_file",
    "parse_reward_value",
]
