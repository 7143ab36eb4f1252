"""Offline fixed-trajectory rescoring (paper §3.4, Appendix B): experiment "rescore".

Rescores a fixed set of episode outcomes under FDR and SPR with the old and the
recalibrated family divisors, outcome labels unchanged (asserted), and reports
what the paper reports for its 4,352 trajectories: failures' share of the total
reward mass, failures scoring at least 1, mean success and failure rewards, the
mean reward of early-declaration failures (declared done within 10 turns, then
failed), and a per-family table. Writes `rescore.json`, `rescore.png` and
`recalibrated_divisors.json` into the workdir.

    python experiments/run.py --config=configs/rescore.py --workdir=/tmp/rescore
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from typing import Any

import ml_collections
import numpy as np

from terminal_rsi.atomic import atomic_write_bytes, atomic_write_json
from terminal_rsi.configuration import BASE_SCHEMA, Field
from terminal_rsi.rewards import functions
from terminal_rsi.rewards.ctrf import DEFAULT_HYGIENE, HygieneRule
from terminal_rsi.rewards.divisors import (
    FamilyDivisors,
    RecalibrationRules,
    calibrate_family_divisors,
    recalibrate,
    rule_counts,
)
from terminal_rsi.rewards.outcomes import EpisodeOutcome, load_episodes

_R = "rescore.rules."
SCHEMA: dict[str, Field] = {
    **BASE_SCHEMA,
    "rescore.trajectories": Field(str, "episode-outcome JSON Lines file (docs/rewards.md)"),
    "rescore.divisors": Field(str, "old FamilyDivisors JSON; '' = calibrate from the episodes' "
                                   "valid check counts"),
    "rescore.recalibrated_divisors": Field(str, "recalibrated FamilyDivisors JSON; '' = run "
                                                "recalibrate() with rescore.rules"),
    "rescore.calibration_quantile": Field(float, "q for calibrating old divisors when "
                                                 "rescore.divisors is ''", lo=0.0, hi=1.0),
    "rescore.fallback_divisor": Field(float, "divisor for families absent from the table "
                                             "(used when calibrating)", lo=1e-9),
    "rescore.hygiene": Field(str, "hygiene rule for CTRF report paths", choices=("default",
                                                                                 "none")),
    "rescore.early_declaration_turns": Field(int, "early declaration: declared done within "
                                                  "this many turns", lo=0),
    "rescore.figure": Field(bool, "write rescore.png (matplotlib)"),
    _R + "reward": Field(str, "reward judging high/low reward (old divisors)",
                         choices=("fdr", "spr", "binary")),
    _R + "high_reward_failure_threshold": Field(float, "a failure scoring >= this is "
                                                       "high-reward"),
    _R + "min_high_reward_failures": Field(int, "high-reward failures needed for rule 1", lo=1),
    _R + "failure_factor": Field(float, "rule 1 divisor factor (2 = doubled)", lo=1e-9),
    _R + "long_mean_turns": Field(float, "rule 2: family mean turns at least this", lo=0.0),
    _R + "low_mean_reward": Field(float, "rule 2: family mean reward at most this"),
    _R + "long_factor": Field(float, "rule 2 divisor factor (0.25 = quartered)", lo=1e-9),
    _R + "min_family_episodes": Field(int, "episodes a family needs for rules 1-2", lo=1),
    _R + "new_family_quantile": Field(float, "rule 3 quantile", lo=0.0, hi=1.0),
    _R + "min_new_family_reports": Field(int, "valid reports a new family needs", lo=1),
}

SCORINGS = (("fdr", "old"), ("spr", "old"), ("fdr", "recalibrated"), ("spr", "recalibrated"))


class RescoreError(RuntimeError):
    """Rescoring changed an outcome label or broke SPR's ordering (a bug, never data)."""


def rules_from_config(cfg: ml_collections.ConfigDict) -> RecalibrationRules:
    return RecalibrationRules(**{k: cfg[k] for k in cfg.keys()})


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


def plot(result: dict[str, Any], path: str) -> None:
    """Per-family mean rewards, FDR vs SPR, for the old and recalibrated tables (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["per_family"]
    fams = [r["family"] for r in rows]
    x = np.arange(len(fams))
    fig, axes = plt.subplots(1, 2, figsize=(max(8, 1.4 * len(fams)), 4.5), sharey=True)
    for ax, table in zip(axes, ("old", "recalibrated"), strict=True):
        for j, (fn, color) in enumerate((("fdr", "tab:orange"), ("spr", "tab:blue"))):
            vals = [r[f"mean_{fn}/{table}"] for r in rows]
            ax.bar(x + (j - 0.5) * 0.4, vals, width=0.4, color=color, label=fn.upper())
        ax.axhline(1.0, color="gray", lw=0.8, ls="--")
        ax.set_xticks(x, fams, rotation=45, ha="right", fontsize=8)
        share_f = result["metrics"][f"fdr/{table}"]["failed_reward_share"]
        share_s = result["metrics"][f"spr/{table}"]["failed_reward_share"]
        ax.set_title(f"{table} divisors: failed share FDR {100 * (share_f or 0):.1f}%, "
                     f"SPR {100 * (share_s or 0):.1f}%", fontsize=9)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("mean reward per family")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
    """Experiment entry point (see module docstring)."""
    cfg = config.rescore
    hygiene = DEFAULT_HYGIENE if cfg.hygiene == "default" else HygieneRule.none()
    episodes = load_episodes(cfg.trajectories, hygiene=hygiene)
    if cfg.divisors:
        old = FamilyDivisors.load(cfg.divisors)
    else:
        counts: dict[str, list[int]] = {}
        for e in episodes:
            if e.report.valid:
                counts.setdefault(e.family, []).append(e.report.total)
        old = calibrate_family_divisors(counts, cfg.calibration_quantile,
                                        fallback=cfg.fallback_divisor,
                                        source=f"calibrated from {cfg.trajectories}")
    rules = rules_from_config(cfg.rules)
    if cfg.recalibrated_divisors:
        new = FamilyDivisors.load(cfg.recalibrated_divisors)
    else:
        new = recalibrate(old, episodes, rules)
    result = rescore(episodes, old, new, early_declaration_turns=cfg.early_declaration_turns)
    result["inputs"] = {
        "trajectories": os.path.abspath(cfg.trajectories),
        "divisors": os.path.abspath(cfg.divisors) if cfg.divisors else None,
        "recalibrated_divisors": (os.path.abspath(cfg.recalibrated_divisors)
                                  if cfg.recalibrated_divisors else None),
        "rules": rules.to_dict(),
    }
    result["divisors"] = {"old": old.to_dict(), "recalibrated": new.to_dict(),
                          "rule_counts": rule_counts(new)}
    result["statement"] = statement(result)
    os.makedirs(workdir, exist_ok=True)
    new.save(os.path.join(workdir, "recalibrated_divisors.json"))
    atomic_write_json(os.path.join(workdir, "rescore.json"), result)
    if cfg.figure:
        plot(result, os.path.join(workdir, "rescore.png"))
    print(result["statement"])
    return result
