"""Offline fixed-trajectory rescoring (paper §3.4, Appendix B).

`rescore` scores a fixed set of episode outcomes under FDR and SPR with the old and the
recalibrated family divisors, outcome labels unchanged (asserted), and measures what the
paper reports for its 4,352 trajectories: failures' share of the total reward mass, failures
scoring at least 1, mean success and failure rewards, the mean reward of early-declaration
failures (declared done within 10 turns, then failed), and a per-family table; `statement`
says it in one sentence. The experiment "rescore" (`terminal_rsi.experiments.rescore`) runs
it on a JSON Lines file of episodes and writes the result and a figure.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from terminal_rsi.rewards import functions
from terminal_rsi.rewards.divisors import FamilyDivisors, calibrate_family_divisors
from terminal_rsi.rewards.outcomes import EpisodeOutcome

SCORINGS = (("fdr", "old"), ("spr", "old"), ("fdr", "recalibrated"), ("spr", "recalibrated"))


class RescoreError(RuntimeError):
    """Rescoring changed an outcome label or broke SPR's ordering (a bug, never data)."""


def summarize(rewards: np.ndarray, success: np.ndarray, early: np.ndarray) -> dict[str, Any]:
    """Reward-allocation statistics of one scoring.

    Args:
      rewards: [E] float rewards.
      success: [E] bool strict success S.
      early: [E] bool early-declaration failure.
    """
    total = float(rewards.sum())
    fail = ~success

    def mean(mask):
        return float(rewards[mask].mean()) if mask.any() else None

    return {
        "total_mass": total,
        "failed_reward_share": float(rewards[fail].sum() / total) if total > 0 else None,
        "failures_ge_1": int((rewards[fail] >= 1.0).sum()),
        "mean_success": mean(success),
        "mean_failure": mean(fail),
        "mean_early_declaration_failure": mean(early),
        "mean": float(rewards.mean()),
        "std": float(rewards.std()),
    }


def rescore(
    episodes: Sequence[EpisodeOutcome],
    old: FamilyDivisors,
    new: FamilyDivisors,
    *,
    early_declaration_turns: int = 10,
) -> dict[str, Any]:
    """Score `episodes` under FDR and SPR with both tables; return metrics and a per-family
    table. Raises RescoreError if a label changed or SPR misorders a success and a failure."""
    labels = np.asarray([e.success for e in episodes], dtype=bool)
    early = np.asarray([e.early_declaration_failure(early_declaration_turns) for e in episodes],
                       dtype=bool)
    tables = {"old": old, "recalibrated": new}
    rewards: dict[str, np.ndarray] = {}
    for fn_name, table_name in SCORINGS:
        fn = functions.get_reward_fn(fn_name)
        rewards[f"{fn_name}/{table_name}"] = np.asarray(
            [fn(e.report, e.family, tables[table_name]) for e in episodes], dtype=np.float64)
    after = np.asarray([e.success for e in episodes], dtype=bool)
    if not np.array_equal(labels, after):
        raise RescoreError("outcome labels changed during rescoring")
    for key in ("spr/old", "spr/recalibrated"):
        if not np.array_equal(rewards[key] >= 1.0, labels):
            raise RescoreError(f"{key}: a failure scored >= 1 or a success < 1")
    metrics = {k: summarize(v, labels, early) for k, v in rewards.items()}
    binary = np.asarray([functions.binary(e.report) for e in episodes], dtype=np.float64)
    metrics["binary"] = summarize(binary, labels, early)

    fams = sorted({e.family for e in episodes})
    fam_idx = np.asarray([fams.index(e.family) for e in episodes])
    turns = np.asarray([e.turns for e in episodes], dtype=np.float64)
    valid = np.asarray([e.report.valid for e in episodes], dtype=bool)
    checks = np.asarray([e.report.total for e in episodes], dtype=np.float64)
    per_family = []
    for i, f in enumerate(fams):
        m = fam_idx == i
        decision = new.provenance.decisions.get(f)
        row = {
            "family": f,
            "episodes": int(m.sum()),
            "successes": int(labels[m].sum()),
            "valid_reports": int(valid[m].sum()),
            "mean_checks": float(checks[m & valid].mean()) if (m & valid).any() else None,
            "mean_turns": float(turns[m].mean()),
            "old_divisor": old.get(f),
            "new_divisor": new.get(f),
            "rule": decision.rule if decision else None,
            "reason": decision.reason if decision else None,
        }
        for k, v in rewards.items():
            row[f"mean_{k}"] = float(v[m].mean())
            fails = m & ~labels
            row[f"failed_share_{k}"] = float(v[fails].sum() / v[m].sum()) if v[m].sum() > 0 \
                else None
        per_family.append(row)
    n_fail = int((~labels).sum())
    return {
        "episodes": len(episodes),
        "successes": int(labels.sum()),
        "failures": n_fail,
        "invalid_reports": int((~valid).sum()),
        "early_declaration_failures": int(early.sum()),
        "early_declaration_turns": early_declaration_turns,
        "labels_unchanged": True,
        "metrics": metrics,
        "per_family": per_family,
        "rewards": {k: v.tolist() for k, v in rewards.items()},
    }


def statement(result: dict[str, Any]) -> str:
    """One sentence in the paper's style (§3.4) from a rescore result."""
    m = result["metrics"]
    a, b = m["fdr/old"], m["spr/recalibrated"]

    def pct(x):
        return "n/a" if x is None else f"{100 * x:.2f}%"

    def num(x):
        return "n/a" if x is None else f"{x:.2f}"

    return (
        f"On the same {result['episodes']} trajectories with unchanged outcome labels, mean "
        f"success/failure rewards change from {num(a['mean_success'])}/{num(a['mean_failure'])} "
        f"under FDR (old divisors) to {num(b['mean_success'])}/{num(b['mean_failure'])} under "
        f"SPR (recalibrated divisors). Failures' share of reward mass moves from "
        f"{pct(a['failed_reward_share'])} to {pct(b['failed_reward_share'])}, and failures "
        f"scoring at least one from {a['failures_ge_1']} to {b['failures_ge_1']}. "
        f"Early-declaration failures ({result['early_declaration_failures']}) receive "
        f"{num(b['mean_early_declaration_failure'])} instead of "
        f"{num(a['mean_early_declaration_failure'])} mean reward."
    )


def calibrate_from_episodes(episodes: Sequence[EpisodeOutcome], quantile: float, *,
                            fallback: float, source: str) -> FamilyDivisors:
    """A divisor table calibrated from the check counts N of the episodes' valid reports."""
    counts: dict[str, list[int]] = {}
    for e in episodes:
        if e.report.valid:
            counts.setdefault(e.family, []).append(e.report.total)
    return calibrate_family_divisors(counts, quantile, fallback=fallback, source=source)
