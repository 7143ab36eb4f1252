"""Episode outcomes for offline rescoring and recalibration, and their JSON Lines file.

Until the agent issue's trajectory records exist, rescoring reads a JSON Lines
file with one episode outcome per line (see docs/rewards.md):

    {"episode_id": "e17", "family": "log-parsing", "S": false, "P": 7, "N": 9,
     "turns": 23, "declared_done_turn": 8}
    {"family": "git-ops", "S": true, "report": "reports/e18.json", "turns": 5}
    {"family": "git-ops", "S": false, "invalid_reason": "verifier crashed", "turns": 40}

Keys: `family` (str, required); `S` (bool or 0/1, required: the verifier's
terminal verdict); exactly one of `report` (a CTRF file, relative paths are
relative to the JSONL file), `P` and `N` (non-hygiene counts, optionally
`failed`, `skipped`, `pending`, `other`) or `invalid_reason` (no valid grading);
`turns` (int >= 0, required); `declared_done_turn` (int or null: the turn at
which the agent declared completion, if it did); `episode_id` (optional str).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from terminal_rsi.rewards.ctrf import (
    DEFAULT_HYGIENE,
    HygieneRule,
    VerificationReport,
    parse_ctrf,
)
from terminal_rsi.runtime.atomic import atomic_write_text

_KEYS = {"episode_id", "family", "S", "report", "P", "N", "failed", "skipped", "pending",
         "other", "invalid_reason", "turns", "declared_done_turn"}


class EpisodeFormatError(ValueError):
    """A line of an episode-outcome JSON Lines file is malformed."""


@dataclasses.dataclass(frozen=True)
class EpisodeOutcome:
    """One finished episode: its family, verification report, and length.

    Attributes:
      family: task family f.
      report: the VerificationReport (carries S and, if valid, P and N).
      turns: interaction turns used.
      declared_done_turn: turn at which the agent declared completion (None if never).
      episode_id: optional identifier.
    """

    family: str
    report: VerificationReport
    turns: int
    declared_done_turn: int | None = None
    episode_id: str | None = None

    @property
    def success(self) -> bool:
        return self.report.strict_success

    def early_declaration_failure(self, within_turns: int = 10) -> bool:
        """Declared done within `within_turns` turns, then failed (§3.4)."""
        return (not self.success and self.declared_done_turn is not None
                and self.declared_done_turn <= within_turns)


def _int(value: Any, what: str, where: str, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise EpisodeFormatError(f"{where}: {what} = {value!r}, expected an integer >= 0")
    return value


def episode_from_dict(
    d: Any, *, base_dir: str = ".", hygiene: HygieneRule = DEFAULT_HYGIENE, where: str = ""
) -> EpisodeOutcome:
    """Build an EpisodeOutcome from one JSON Lines record (see module docstring)."""
    if not isinstance(d, dict):
        raise EpisodeFormatError(f"{where}: expected a JSON object, got {type(d).__name__}")
    unknown = set(d) - _KEYS
    if unknown:
        raise EpisodeFormatError(f"{where}: unknown keys {sorted(unknown)}; allowed: "
                                 f"{sorted(_KEYS)}")
    family = d.get("family")
    if not isinstance(family, str) or not family:
        raise EpisodeFormatError(f"{where}: family = {family!r}, expected a non-empty string")
    s = d.get("S")
    if s not in (True, False, 0, 1) or s is None:
        raise EpisodeFormatError(f"{where}: S = {s!r}, expected true/false (or 1/0)")
    s = bool(s)
    sources = [k for k in ("report", "P", "invalid_reason") if k in d]
    if len(sources) != 1:
        raise EpisodeFormatError(f"{where}: give exactly one of 'report', 'P'/'N', "
                                 f"'invalid_reason' (got {sources or 'none'})")
    if "report" in d:
        path = d["report"]
        if not isinstance(path, str):
            raise EpisodeFormatError(f"{where}: report = {path!r}, expected a path string")
        report = parse_ctrf(os.path.join(base_dir, path), terminal_success=s, hygiene=hygiene)
    elif "P" in d:
        if "N" not in d:
            raise EpisodeFormatError(f"{where}: 'P' given without 'N'")
        report = VerificationReport.from_counts(
            d["P"], d["N"], terminal_success=s, failed=d.get("failed"),
            skipped=d.get("skipped", 0), pending=d.get("pending", 0), other=d.get("other", 0),
        )
    else:
        report = VerificationReport.invalid(str(d["invalid_reason"]), terminal_success=s)
    turns = _int(d.get("turns"), "turns", where)
    declared = _int(d.get("declared_done_turn"), "declared_done_turn", where, allow_none=True)
    eid = d.get("episode_id")
    if eid is not None and not isinstance(eid, str):
        raise EpisodeFormatError(f"{where}: episode_id = {eid!r}, expected a string")
    return EpisodeOutcome(family=family, report=report, turns=turns,
                          declared_done_turn=declared, episode_id=eid)


def load_episodes(
    path: str | os.PathLike, *, hygiene: HygieneRule = DEFAULT_HYGIENE
) -> list[EpisodeOutcome]:
    """Read an episode-outcome JSON Lines file (blank lines and '#' comments skipped)."""
    path = os.fspath(path)
    base = os.path.dirname(os.path.abspath(path))
    out = []
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
    except FileNotFoundError:
        raise EpisodeFormatError(f"episode file not found: {path}") from None
    for i, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{path}:{i}"
        try:
            d = json.loads(line)
        except json.JSONDecodeError as e:
            raise EpisodeFormatError(f"{where}: invalid JSON: {e.msg}") from None
        out.append(episode_from_dict(d, base_dir=base, hygiene=hygiene, where=where))
    if not out:
        raise EpisodeFormatError(f"{path} contains no episodes")
    return out


def episode_to_dict(e: EpisodeOutcome) -> dict:
    """A JSON Lines record for `e` (counts form; the report's source path is not kept)."""
    d: dict[str, Any] = {"family": e.family, "S": e.success}
    if e.episode_id is not None:
        d["episode_id"] = e.episode_id
    r = e.report
    if r.valid:
        d.update(P=r.passed, N=r.total, failed=r.failed, skipped=r.skipped)
        if r.pending:
            d["pending"] = r.pending
        if r.other:
            d["other"] = r.other
    else:
        d["invalid_reason"] = r.reason
    d["turns"] = e.turns
    d["declared_done_turn"] = e.declared_done_turn
    return d


def write_episodes(path: str | os.PathLike, episodes: Iterable[EpisodeOutcome]) -> None:
    """Write episodes as JSON Lines, atomically."""
    atomic_write_text(
        path, "".join(json.dumps(episode_to_dict(e), sort_keys=True) + "\n" for e in episodes)
    )


# --------------------------------------------------------------------------- synthetic data

# (family, typical N, success probability, mean turns, in the calibration table?,
#  check-count drift vs calibration, mean partial credit of failures)
DEMO_FAMILIES: tuple[tuple[str, float, float, float, bool, float, float], ...] = (
    ("file-ops", 6, 0.55, 12, True, 1.0, 0.45),
    ("log-parsing", 14, 0.35, 25, True, 1.4, 0.55),
    ("build-systems", 40, 0.25, 35, True, 1.0, 0.40),
    ("data-pipelines", 120, 0.10, 70, True, 0.9, 0.15),
    ("distributed-debug", 300, 0.05, 90, True, 0.9, 0.10),
    ("crypto-puzzles", 25, 0.30, 30, False, 1.0, 0.40),
)


def synthetic_check_counts(seed: int, n_per_family: int = 30) -> dict[str, list[int]]:
    """Check counts N per family for a synthetic calibration population (families in the
    calibration table only)."""
    rng = np.random.default_rng(seed)
    out = {}
    for family, base, _, _, calibrated, _, _ in DEMO_FAMILIES:
        if calibrated:
            n = np.maximum(1, np.round(base * rng.lognormal(0.0, 0.25, n_per_family)))
            out[family] = [int(x) for x in n]
    return out


def synthetic_episodes(seed: int, n_per_family: int = 24) -> list[EpisodeOutcome]:
    """A small, seeded population of episode outcomes for demos and tests.

    Some families' check counts drift upward relative to `synthetic_check_counts` (so
    failures exceed their FDR divisor), some failures pass every check but fail the
    terminal gate, some declare completion early, and a few reports are invalid.
    """
    rng = np.random.default_rng(seed)
    out = []
    for family, base, p_success, mean_turns, _, drift, credit in DEMO_FAMILIES:
        for k in range(n_per_family):
            eid = f"{family}-{k}"
            n = int(max(1, round(base * drift * rng.lognormal(0.0, 0.25))))
            success = bool(rng.random() < p_success)
            turns = int(max(1, round(mean_turns * rng.lognormal(0.0, 0.3))))
            declared = None
            if rng.random() < 0.6:
                declared = int(rng.integers(1, turns + 1)) if rng.random() < 0.5 \
                    else min(turns, int(rng.integers(1, 11)))
            if rng.random() < 0.05:
                report = VerificationReport.invalid("verifier crashed (synthetic)",
                                                    terminal_success=success)
            else:
                if success:
                    p = n
                elif rng.random() < 0.08 * drift:
                    p = n  # every executed check passed, the terminal gate failed
                else:
                    p = int(rng.binomial(n, rng.beta(4.0 * credit, 4.0 * (1 - credit))))
                report = VerificationReport.from_counts(p, n, terminal_success=success)
            out.append(EpisodeOutcome(family=family, report=report, turns=turns,
                                      declared_done_turn=declared, episode_id=eid))
    return out


def families_of(episodes: Sequence[EpisodeOutcome]) -> list[str]:
    return sorted({e.family for e in episodes})
