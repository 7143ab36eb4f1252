"""Evaluation protocol (paper §3.1, §3.3, §3.4): Mean@k and unbiased pass@k, process reward
versus strict completion, per-family success and FDR/SPR profiles, frozen difficulty strata,
critic explained variance (`losses.explained_variance`), the policy movement of two actors
on a probe (`terminal_rsi.evaluation.movement`); the `evaluate` experiment
(terminal_rsi.evaluation.evaluate). See docs/evaluation.md.
"""

from terminal_rsi.evaluation.metrics import (
    mean_at_k,
    pass_at_k,
    pass_at_k_per_task,
    process_reward,
    run_success_rates,
)
from terminal_rsi.evaluation.strata import (
    PROXIES,
    STRATA,
    STRATUM_NAMES,
    StrataError,
    StrataTable,
    assign_strata,
    difficulty_scores,
    fit_strata,
    percentile_ranks,
    quartile_cutoffs,
    structural_proxies,
)
from terminal_rsi.evaluation.summary import mean_of_suites, rescore, summarize_suite

__all__ = [
    "PROXIES", "STRATA", "STRATUM_NAMES", "StrataError", "StrataTable", "assign_strata",
    "difficulty_scores", "fit_strata", "mean_at_k", "mean_of_suites",
    "pass_at_k", "pass_at_k_per_task", "percentile_ranks", "process_reward",
    "quartile_cutoffs", "rescore", "run_success_rates", "structural_proxies",
    "summarize_suite",
]
