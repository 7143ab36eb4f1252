"""Experiment "rescore": offline fixed-trajectory rescoring (paper §3.4, Appendix B).

Rescores a JSON Lines file of episode outcomes (docs/rewards.md) under FDR and SPR with the
old and the recalibrated family divisors (`terminal_rsi.rewards.rescore`), prints the paper's
one-sentence statement and writes `rescore.json`, `rescore.png` and
`recalibrated_divisors.json` into the workdir.

    python experiments/run.py --config=configs/rescore.py --workdir=/tmp/rescore
"""

from __future__ import annotations

import dataclasses
import io
import os
import pathlib
from typing import Any

import numpy as np

from terminal_rsi.config.sections import Seeded
from terminal_rsi.rewards import (
    DEFAULT_HYGIENE,
    REWARD_NAMES,
    FamilyDivisors,
    HygieneRule,
    RecalibrationRules,
    load_episodes,
    recalibrate,
    rule_counts,
)
from terminal_rsi.rewards.rescore import calibrate_from_episodes, rescore, statement
from terminal_rsi.runtime.atomic import atomic_write_bytes, atomic_write_json
from terminal_rsi.settings import Section, setting

# the small synthetic demo shipped with the package (terminal_rsi/rewards/data/)
DEMO_DATA = pathlib.Path(__file__).resolve().parents[1] / "rewards" / "data"


@dataclasses.dataclass(frozen=True)
class Rules(Section):
    """Appendix B recalibration rules, in priority order (`rewards.RecalibrationRules`)."""

    reward: str = setting("fdr", "reward judging high/low reward (old divisors)",
                          choices=REWARD_NAMES)
    high_reward_failure_threshold: float = setting(1.0, "a failure scoring >= this is "
                                                   "high-reward")
    min_high_reward_failures: int = setting(1, "high-reward failures needed for rule 1", lo=1)
    failure_factor: float = setting(2.0, "rule 1 divisor factor (2 = doubled)", lo=1e-9)
    long_mean_turns: float = setting(50.0, "rule 2: family mean turns at least this", lo=0.0)
    low_mean_reward: float = setting(0.35, "rule 2: family mean reward at most this")
    long_factor: float = setting(0.25, "rule 2 divisor factor (0.25 = quartered)", lo=1e-9)
    min_family_episodes: int = setting(1, "episodes a family needs for rules 1-2", lo=1)
    new_family_quantile: float = setting(0.90, "rule 3 quantile", lo=0.0, hi=1.0)
    min_new_family_reports: int = setting(1, "valid reports a new family needs", lo=1)

    def rules(self) -> RecalibrationRules:
        """These settings as the rules `recalibrate` takes."""
        return RecalibrationRules(**dict(self))


@dataclasses.dataclass(frozen=True)
class Rescore(Section):
    """The episodes, the divisor tables and the outputs of a rescoring."""

    trajectories: str = setting(str(DEMO_DATA / "demo_episodes.jsonl"),
                                "episode-outcome JSON Lines file (docs/rewards.md)")
    divisors: str = setting(str(DEMO_DATA / "demo_divisors.json"),
                            "old FamilyDivisors JSON; '' = calibrate from the episodes' valid "
                            "check counts")
    recalibrated_divisors: str = setting("", "recalibrated FamilyDivisors JSON; '' = run "
                                         "recalibrate() with rescore.rules")
    calibration_quantile: float = setting(0.90, "q for calibrating old divisors when "
                                          "rescore.divisors is ''", lo=0.0, hi=1.0)
    fallback_divisor: float = setting(82.0, "divisor for families absent from the table "
                                      "(used when calibrating)", lo=1e-9)
    hygiene: str = setting("default", "hygiene rule for CTRF report paths",
                           choices=("default", "none"))
    early_declaration_turns: int = setting(10, "early declaration: declared done within this "
                                           "many turns", lo=0)
    figure: bool = setting(True, "write rescore.png (matplotlib)")
    rules: Rules = Rules()


@dataclasses.dataclass(frozen=True)
class RescoreConfig(Seeded):
    """Offline rescoring; the defaults rescore the shipped demo."""

    rescore: Rescore = Rescore()


CONFIG = RescoreConfig


def run(config: RescoreConfig, workdir: str) -> dict[str, Any]:
    """Rescore, write the result, the recalibrated table and the figure, print the statement."""
    cfg = config.rescore
    hygiene = DEFAULT_HYGIENE if cfg.hygiene == "default" else HygieneRule.none()
    episodes = load_episodes(cfg.trajectories, hygiene=hygiene)
    if cfg.divisors:
        old = FamilyDivisors.load(cfg.divisors)
    else:
        old = calibrate_from_episodes(episodes, cfg.calibration_quantile,
                                      fallback=cfg.fallback_divisor,
                                      source=f"calibrated from {cfg.trajectories}")
    rules = cfg.rules.rules()
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


def plot(result: dict[str, Any], path: str) -> None:
    """Per-family mean rewards, FDR vs SPR, for the old and recalibrated tables (PNG)."""
    # matplotlib is heavy and only needed when a figure is asked for (rescore.figure)
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
