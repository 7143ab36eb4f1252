"""Family divisors D_f for FDR/SPR: calibration and frozen recalibration (§2.2, Appendix B).

`FamilyDivisors` is an immutable family → divisor table with a fallback (82) for
families it does not list. It is frozen within a training phase: there is no
mutating API; a new phase gets a new table from `calibrate_family_divisors`
(the q-quantile of each family's non-hygiene check counts N) or `recalibrate`
(the distribution-adaptive rules of Appendix B). Tables are saved as JSON with
their provenance (per-family sample counts, source, quantile, date and, after
recalibration, which rule fired for each family and why).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import numpy as np

from terminal_rsi.rewards.functions import REWARD_NAMES, get_reward_fn
from terminal_rsi.runtime.atomic import atomic_write_json

DEFAULT_FALLBACK = 82.0
_FORMAT_TAG = "terminal_rsi.FamilyDivisors/1"

RULE_FAILURE_SUPPRESSION = "failure_suppression"
RULE_LONG_LOW_REWARD = "long_low_reward"
RULE_NEW_FAMILY = "new_family"
RULE_KEEP = "keep"
RULES = (RULE_FAILURE_SUPPRESSION, RULE_LONG_LOW_REWARD, RULE_NEW_FAMILY, RULE_KEEP)


class DivisorError(ValueError):
    """A divisor table, its file, or calibration input is invalid."""


def _today() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _check_divisor(family: str, value: Any) -> float:
    if not isinstance(family, str) or not family:
        raise DivisorError(f"family names must be non-empty strings, got {family!r}")
    if isinstance(value, bool) or not isinstance(value, int | float | np.floating | np.integer):
        raise DivisorError(f"divisor for family {family!r} is {value!r}; expected a number > 0")
    v = float(value)
    if not math.isfinite(v) or v <= 0:
        raise DivisorError(f"divisor for family {family!r} is {v}; divisors must be finite "
                           "and > 0")
    return v


@dataclasses.dataclass(frozen=True)
class RuleDecision:
    """Which recalibration rule fired for one family, and why."""

    family: str
    rule: str
    old_divisor: float
    new_divisor: float
    reason: str
    episodes: int = 0
    failures: int = 0
    high_reward_failures: int = 0
    mean_turns: float = 0.0
    mean_reward: float = 0.0

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RuleDecision:
        return cls(**dict(d))


@dataclasses.dataclass(frozen=True)
class Provenance:
    """Where a divisor table came from.

    Attributes:
      source: free text (data set, run, or the parent table).
      quantile: q used for calibration (None if not calibrated here).
      date: ISO-8601 UTC timestamp of creation.
      sample_counts: family → number of samples behind its divisor.
      notes: free text (e.g. known coverage discrepancies).
      decisions: family → RuleDecision (only for recalibrated tables).
    """

    source: str = ""
    quantile: float | None = None
    date: str = ""
    sample_counts: Mapping[str, int] = dataclasses.field(default_factory=dict)
    notes: str = ""
    decisions: Mapping[str, RuleDecision] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "sample_counts",
                           MappingProxyType(dict(sorted(self.sample_counts.items()))))
        object.__setattr__(self, "decisions",
                           MappingProxyType(dict(sorted(self.decisions.items()))))

    def to_dict(self) -> dict:
        return {
            "source": self.source,
            "quantile": self.quantile,
            "date": self.date,
            "sample_counts": dict(self.sample_counts),
            "notes": self.notes,
            "decisions": {f: d.to_dict() for f, d in self.decisions.items()},
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Provenance:
        return cls(
            source=d.get("source", ""),
            quantile=d.get("quantile"),
            date=d.get("date", ""),
            sample_counts={k: int(v) for k, v in d.get("sample_counts", {}).items()},
            notes=d.get("notes", ""),
            decisions={k: RuleDecision.from_dict(v) for k, v in d.get("decisions", {}).items()},
        )


@dataclasses.dataclass(frozen=True, eq=True)
class FamilyDivisors:
    """Immutable family → divisor table D_f with a fallback for unlisted families.

    `table[family]` (or `table.get(family)`) returns the family's divisor, or the
    fallback (default 82, Appendix B) if the family is not listed.
    """

    divisors: Mapping[str, float] = dataclasses.field(default_factory=dict)
    fallback: float = DEFAULT_FALLBACK
    provenance: Provenance = dataclasses.field(default_factory=Provenance)

    __hash__ = None  # mappings inside; compare with ==

    def __post_init__(self):
        checked = {f: _check_divisor(f, v) for f, v in dict(self.divisors).items()}
        object.__setattr__(self, "divisors", MappingProxyType(dict(sorted(checked.items()))))
        object.__setattr__(self, "fallback", _check_divisor("<fallback>", self.fallback))
        if not isinstance(self.provenance, Provenance):
            raise DivisorError("provenance must be a Provenance")

    def get(self, family: str) -> float:
        """D_f for `family` (the fallback if the family is not listed)."""
        return self.divisors.get(family, self.fallback)

    __getitem__ = get

    def __contains__(self, family: object) -> bool:
        return family in self.divisors

    def __iter__(self) -> Iterator[str]:
        return iter(self.divisors)

    def __len__(self) -> int:
        return len(self.divisors)

    @property
    def families(self) -> tuple[str, ...]:
        return tuple(self.divisors)

    def lookup(self, families: Sequence[str]) -> np.ndarray:
        """Divisors for a batch of families, float64 [B]."""
        return np.asarray([self.get(f) for f in families], dtype=np.float64)

    def to_dict(self) -> dict:
        return {
            "format": _FORMAT_TAG,
            "fallback": self.fallback,
            "divisors": dict(self.divisors),
            "provenance": self.provenance.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FamilyDivisors:
        if not isinstance(d, Mapping) or d.get("format") != _FORMAT_TAG:
            raise DivisorError(f"not a divisor table: expected format {_FORMAT_TAG!r}")
        if not isinstance(d.get("divisors"), Mapping):
            raise DivisorError("divisor table lacks a 'divisors' object")
        try:
            provenance = Provenance.from_dict(d.get("provenance", {}))
        except (TypeError, ValueError, AttributeError) as e:
            raise DivisorError(f"bad provenance in divisor table: {e}") from e
        return cls(
            divisors=d["divisors"],
            fallback=d.get("fallback", DEFAULT_FALLBACK),
            provenance=provenance,
        )

    def save(self, path: str | os.PathLike) -> None:
        """Write the table as JSON atomically (temp file + os.replace)."""
        atomic_write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike) -> FamilyDivisors:
        try:
            with open(path, encoding="utf-8") as f:
                d = json.load(f)
        except FileNotFoundError:
            raise DivisorError(f"divisor table not found: {path}") from None
        except (OSError, ValueError) as e:
            raise DivisorError(f"cannot read divisor table {path}: {e}") from e
        return cls.from_dict(d)


# --------------------------------------------------------------------------- calibration


def quantile_linear(values: Sequence[float], q: float) -> float:
    """The q-quantile with linear interpolation (numpy.quantile(method="linear")).

    With sorted values x_0 <= ... <= x_{n-1}, h = (n - 1) q, the result is
    x_{floor h} + (h - floor h) (x_{floor h + 1} - x_{floor h}).
    """
    if not values:
        raise DivisorError("quantile of an empty sample")
    if not 0.0 <= q <= 1.0:
        raise DivisorError(f"quantile q = {q} must be in [0, 1]")
    xs = sorted(float(v) for v in values)
    h = (len(xs) - 1) * q
    lo = math.floor(h)
    hi = min(lo + 1, len(xs) - 1)
    frac = h - lo
    a, b = xs[lo], xs[hi]
    # Same two-sided lerp numpy uses, so results agree to the last bit in most cases.
    return a + (b - a) * frac if frac < 0.5 else b - (b - a) * (1.0 - frac)


def _check_counts(family: str, counts: Iterable[Any]) -> list[int]:
    out = []
    for c in counts:
        if isinstance(c, bool) or not isinstance(c, int | float | np.integer | np.floating) \
                or not math.isfinite(float(c)) or float(c) != math.floor(float(c)) or c < 1:
            raise DivisorError(f"family {family!r}: check count {c!r} is not an integer >= 1 "
                               "(counts come from valid reports, which have N >= 1)")
        out.append(int(c))
    if not out:
        raise DivisorError(f"family {family!r} has no check counts; drop it to use the fallback")
    return out


def calibrate_family_divisors(
    check_counts_by_family: Mapping[str, Iterable[int]],
    q: float = 0.90,
    *,
    fallback: float = DEFAULT_FALLBACK,
    source: str = "",
    date: str | None = None,
    notes: str = "",
) -> FamilyDivisors:
    """D_f = q_q(N | f): the q-quantile (linear interpolation) of each family's total
    non-hygiene check counts N (paper §2.2, Eq. 6; q = 0.90)."""
    if not 0.0 <= q <= 1.0:
        raise DivisorError(f"q = {q} must be in [0, 1]")
    divisors, samples = {}, {}
    for family, counts in check_counts_by_family.items():
        xs = _check_counts(family, counts)
        divisors[family] = quantile_linear(xs, q)
        samples[family] = len(xs)
    return FamilyDivisors(
        divisors=divisors,
        fallback=fallback,
        provenance=Provenance(source=source, quantile=q, date=date or _today(),
                              sample_counts=samples, notes=notes),
    )


# --------------------------------------------------------------------------- recalibration


@dataclasses.dataclass(frozen=True)
class RecalibrationRules:
    """Thresholds for `recalibrate` (Appendix B, frozen distribution-adaptive table).

    Rules, in priority order (the first that fires decides the family):
      1. failure_suppression: the family has at least `min_high_reward_failures`
         failures whose reward (under `reward` with the old divisors) is at least
         `high_reward_failure_threshold` → divisor × `failure_factor` (doubled).
      2. long_low_reward: mean turns >= `long_mean_turns` and mean reward <=
         `low_mean_reward` → divisor × `long_factor` (quartered).
      3. new_family: absent from the old table with at least `min_new_family_reports`
         valid reports → the `new_family_quantile` quantile of its check counts N.
      4. keep: the old divisor (the fallback for absent families with too few reports).
    Rules 1–2 need at least `min_family_episodes` episodes of the family; rules 1-2
    applied to a family absent from the old table scale the fallback it was scored with.
    """

    reward: str = "fdr"
    high_reward_failure_threshold: float = 1.0
    min_high_reward_failures: int = 1
    failure_factor: float = 2.0
    long_mean_turns: float = 50.0
    low_mean_reward: float = 0.35
    long_factor: float = 0.25
    min_family_episodes: int = 1
    new_family_quantile: float = 0.90
    min_new_family_reports: int = 1

    def __post_init__(self):
        if self.reward not in REWARD_NAMES:
            raise DivisorError(f"RecalibrationRules.reward = {self.reward!r}; expected one of "
                               f"{', '.join(map(repr, REWARD_NAMES))}")
        for name in ("failure_factor", "long_factor"):
            v = getattr(self, name)
            if not math.isfinite(v) or v <= 0:
                raise DivisorError(f"RecalibrationRules.{name} = {v} must be finite and > 0")
        for name in ("min_high_reward_failures", "min_family_episodes",
                     "min_new_family_reports"):
            if getattr(self, name) < 1:
                raise DivisorError(f"RecalibrationRules.{name} must be >= 1")
        if not 0.0 <= self.new_family_quantile <= 1.0:
            raise DivisorError("RecalibrationRules.new_family_quantile must be in [0, 1]")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def recalibrate(
    divisors: FamilyDivisors,
    trajectories: Iterable[Any],
    rules: RecalibrationRules = RecalibrationRules(),
    *,
    source: str | None = None,
    date: str | None = None,
) -> FamilyDivisors:
    """A new frozen table from `divisors` and scored trajectories (Appendix B).

    Args:
      divisors: the old table (the one the trajectories' rewards were judged with).
      trajectories: objects with `.family` (str), `.report` (VerificationReport) and
        `.turns` (int), e.g. `EpisodeOutcome`.
      rules: thresholds; see RecalibrationRules for the rules and their priority.

    Returns:
      A FamilyDivisors listing every old family plus every family that appears in the
      trajectories, with `provenance.decisions[family]` saying which rule fired and why.
    """
    reward_fn = get_reward_fn(rules.reward)
    by_family: dict[str, list[Any]] = {}
    for t in trajectories:
        by_family.setdefault(t.family, []).append(t)

    new, decisions, samples = {}, {}, dict(divisors.provenance.sample_counts)
    for family in sorted(set(divisors.divisors) | set(by_family)):
        eps = by_family.get(family, [])
        old = divisors.get(family)
        rewards = [reward_fn(t.report, family, divisors) for t in eps]
        failures = [r for t, r in zip(eps, rewards, strict=True)
                    if not t.report.strict_success]
        high = sum(r >= rules.high_reward_failure_threshold for r in failures)
        mean_turns = float(np.mean([t.turns for t in eps])) if eps else 0.0
        mean_reward = float(np.mean(rewards)) if eps else 0.0
        stats = dict(episodes=len(eps), failures=len(failures), high_reward_failures=int(high),
                     mean_turns=mean_turns, mean_reward=mean_reward)
        enough = len(eps) >= rules.min_family_episodes
        if enough and high >= rules.min_high_reward_failures:
            rule, value = RULE_FAILURE_SUPPRESSION, old * rules.failure_factor
            reason = (f"{high} of {len(failures)} failures score >= "
                      f"{rules.high_reward_failure_threshold} under {rules.reward} "
                      f"(min {rules.min_high_reward_failures}); divisor x{rules.failure_factor}")
        elif enough and mean_turns >= rules.long_mean_turns \
                and mean_reward <= rules.low_mean_reward:
            rule, value = RULE_LONG_LOW_REWARD, old * rules.long_factor
            reason = (f"mean turns {mean_turns:.2f} >= {rules.long_mean_turns} and mean "
                      f"{rules.reward} reward {mean_reward:.4f} <= {rules.low_mean_reward}; "
                      f"divisor x{rules.long_factor}")
        elif family not in divisors:
            counts = [t.report.total for t in eps if t.report.valid]
            if len(counts) >= rules.min_new_family_reports:
                rule, value = RULE_NEW_FAMILY, quantile_linear(counts, rules.new_family_quantile)
                reason = (f"absent from the old table; q{rules.new_family_quantile} of "
                          f"{len(counts)} valid reports' check counts")
            else:
                rule, value = RULE_KEEP, None
                reason = (f"absent from the old table with {len(counts)} valid reports "
                          f"(< {rules.min_new_family_reports}); stays on the fallback")
        else:
            rule, value = RULE_KEEP, old
            reason = ("no episodes" if not eps else
                      "no rule fired (no high-reward failures; not long and low-reward)")
        if value is not None:
            new[family] = value
        if rule != RULE_KEEP or family not in divisors:
            samples[family] = len(eps)
        decisions[family] = RuleDecision(family=family, rule=rule, old_divisor=old,
                                         new_divisor=old if value is None else float(value),
                                         reason=reason, **stats)
    return FamilyDivisors(
        divisors=new,
        fallback=divisors.fallback,
        provenance=Provenance(
            source=source if source is not None else
            f"recalibrate({divisors.provenance.source or 'table'})",
            quantile=rules.new_family_quantile,
            date=date or _today(),
            sample_counts={k: v for k, v in samples.items() if k in new},
            notes="rules: " + json.dumps(rules.to_dict(), sort_keys=True),
            decisions=decisions,
        ),
    )


def rule_counts(table: FamilyDivisors) -> dict[str, int]:
    """How many families each recalibration rule decided (from provenance.decisions)."""
    out = dict.fromkeys(RULES, 0)
    for d in table.provenance.decisions.values():
        out[d.rule] += 1
    return out
