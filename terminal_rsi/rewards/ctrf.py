"""CTRF verifier reports → `VerificationReport` (paper §2.2, Appendix B).

A protected verifier writes a test report in the Common Test Report Format
(CTRF). Rewards need three things from it: P, the number of passed
non-hygiene checks; N, the number of all non-hygiene checks; and whether the
report is valid at all. The strict success flag S does *not* come from the
report: it is the verifier's terminal verdict (its exit status, or Harbor's
reward file with S = 1{r_terminal >= 1}) and is passed in separately as
`terminal_success`. S is never derived from P/N, from `summary`, or from an
agent's completion declaration.

Public API::

    report = parse_ctrf(path_or_obj, terminal_success=exit_code == 0)
    report = parse_ctrf(path, terminal_success=True, hygiene=HygieneRule.none(), strict=True)
    report = VerificationReport.from_counts(passed=7, total=9, terminal_success=False)
    VerificationReport.from_dict(report.to_dict()) == report

Two report shapes are accepted (see docs/rewards.md for the details):

* current CTRF (spec 1.0.0): top-level `reportFormat: "CTRF"` and
  `specVersion: "1.x.y"`, `results.tool`, `results.summary`, `results.tests[]`
  whose `duration` is an integer number of milliseconds;
* legacy pytest-json-ctrf 0.1–0.3.x: only `{"results": {...}}`, float
  durations (milliseconds as floats in 0.3.x, seconds in 0.1.x) and float
  epoch-second `start`/`stop`, snake_case keys (`raw_status`, `file_path`),
  parametrized cases collapsed under one name with the extra cases counted in
  `retries`. A collapsed entry is counted as one check (the report has no
  per-case statuses); the number of collapsed cases is reported as a warning.

Counts always come from each test's `status`; `summary` is only checked for
consistency. A bad report never raises (unless `strict=True`): it yields an
invalid `VerificationReport` whose `problems` say why, and rewards fall back
to S.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

STATUSES: tuple[str, ...] = ("passed", "failed", "skipped", "pending", "other")
SUMMARY_COUNT_FIELDS: tuple[str, ...] = ("tests",) + STATUSES
SUPPORTED_SPEC_MAJOR = "1"
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
# Counts are used as floats by the reward functions; larger ones cannot be represented.
MAX_COUNT = int(1.7976931348623157e308)
_REPORT_FORMAT_TAG = "terminal_rsi.VerificationReport/1"


class ReportError(ValueError):
    """A verifier report is invalid (raised only in strict mode; otherwise recorded)."""


# --------------------------------------------------------------------------- hygiene rule

_S = r"[\s_\-]*"
# The seven default hygiene-check types (our choice; the paper excludes seven types without
# naming them). Matched case-insensitively with re.search against a test's leaf name: the
# part after the last "::", parameters ("[...]") removed. Documented in docs/rewards.md.
DEFAULT_HYGIENE_PATTERNS: tuple[str, ...] = (
    # 1. the tests / verifier directory was not modified by the agent
    rf"tests?{_S}(dir|directory|folder|files?|suite){_S}(is{_S}|are{_S})?"
    rf"(untouched|unchanged|unmodified|intact|not{_S}modified)",
    # 2. verifier / grader files intact
    rf"(verifier|grader|checker){_S}(files?{_S})?(untouched|unchanged|unmodified|intact|integrity)",
    # 3. no stray processes left running
    rf"no{_S}(stray|leftover|orphan(ed)?|zombie|lingering|background){_S}process(es)?",
    # 4. no stray files left behind
    rf"no{_S}(stray|leftover|temp(orary)?|extra){_S}files?",
    # 5. no open ports / listeners left behind
    rf"no{_S}(open|listening|stray){_S}(ports?|sockets?|listeners?)",
    # 6. protected / read-only / system paths unchanged
    rf"(protected|read{_S}only|system){_S}(paths?|files?|dirs?|directories){_S}"
    rf"(untouched|unchanged|unmodified|intact)",
    # 7. anything that calls itself hygiene
    r"hygiene",
)
DEFAULT_HYGIENE_TAGS: frozenset[str] = frozenset({"hygiene"})


def _leaf_name(name: str) -> str:
    return name.split("[", 1)[0].rsplit("::", 1)[-1]


@dataclasses.dataclass(frozen=True)
class HygieneRule:
    """Which checks are hygiene checks, excluded from P and N.

    A test is a hygiene check if one of its CTRF `tags` equals one of `tags`
    (case-insensitive; pytest-json-ctrf writes a marker `@pytest.mark.hygiene`
    as tag "hygiene", and a marker with arguments as "hygiene::arg", which also
    matches), or if one of `name_patterns` (regular expressions, searched
    case-insensitively) matches the test's leaf name.

    Attributes:
      tags: tag names marking hygiene checks.
      name_patterns: regular expressions for hygiene-check names.
    """

    tags: frozenset[str] = DEFAULT_HYGIENE_TAGS
    name_patterns: tuple[str, ...] = DEFAULT_HYGIENE_PATTERNS
    _compiled: tuple[re.Pattern, ...] = dataclasses.field(
        default=(), init=False, repr=False, compare=False
    )

    def __post_init__(self):
        tags = frozenset(t.lower() for t in self.tags)
        if any(not isinstance(t, str) or not t for t in tags):
            raise ValueError("HygieneRule.tags must be non-empty strings")
        object.__setattr__(self, "tags", tags)
        object.__setattr__(self, "name_patterns", tuple(self.name_patterns))
        for p in self.name_patterns:
            try:
                re.compile(p)
            except re.error as e:
                raise ValueError(f"HygieneRule.name_patterns: bad regex {p!r}: {e}") from e
        # one alternation: a single regex search per test name
        compiled = (re.compile("|".join(f"(?:{p})" for p in self.name_patterns),
                               re.IGNORECASE),) if self.name_patterns else ()
        object.__setattr__(self, "_compiled", compiled)

    @classmethod
    def none(cls) -> HygieneRule:
        """A rule that excludes nothing (every check counts)."""
        return cls(tags=frozenset(), name_patterns=())

    def is_hygiene(self, name: str, tags: Iterable[str] = ()) -> bool:
        """True if the check named `name` with CTRF `tags` is a hygiene check."""
        for tag in tags:
            t = str(tag).lower()
            if t in self.tags or t.split("::", 1)[0] in self.tags:
                return True
        leaf = _leaf_name(name)
        return any(p.search(leaf) for p in self._compiled)

    def to_dict(self) -> dict:
        return {"tags": sorted(self.tags), "name_patterns": list(self.name_patterns)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> HygieneRule:
        return cls(
            tags=frozenset(d.get("tags", ())), name_patterns=tuple(d.get("name_patterns", ()))
        )


DEFAULT_HYGIENE = HygieneRule()


# --------------------------------------------------------------------------- terminal verdict


def success_from_reward(reward: float | None) -> bool | None:
    """Strict success from a terminal reward r: S = 1{r >= 1} (Appendix B); None if unknown.

    NaN or a non-number gives None (no verdict), not success.
    """
    if reward is None or isinstance(reward, bool):
        return None if reward is None else bool(reward)
    try:
        r = float(reward)
    except (TypeError, ValueError):
        return None
    if math.isnan(r):
        return None
    return r >= 1.0


def success_from_exit_code(code: int | None) -> bool | None:
    """Strict success from a verifier exit status (0 = every check passed); None if unknown."""
    if code is None:
        return None
    return int(code) == 0


def parse_reward_value(text: str | bytes) -> float | None:
    """The terminal reward in a Harbor-style reward file's contents: a bare number
    (`reward.txt`) or a JSON object of named rewards (`reward.json`): its "reward" entry, or
    its only entry; None if neither is a number."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    try:
        value = json.loads(text.strip())
    except ValueError:
        return None
    if isinstance(value, Mapping):
        value = value.get("reward", next(iter(value.values())) if len(value) == 1 else None)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def success_from_reward_file(path: str | os.PathLike) -> bool | None:
    """Read a Harbor-style terminal reward file (`reward.txt` with a number, or JSON with a
    numeric "reward" field) and return S = 1{r >= 1}; None if missing or unreadable."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return None
    return success_from_reward(parse_reward_value(text))


def _terminal(terminal_success: Any) -> tuple[bool, bool]:
    """(S, verdict_known) from the caller's terminal verdict."""
    if terminal_success is None:
        return False, False
    if isinstance(terminal_success, bool):
        return terminal_success, True
    if isinstance(terminal_success, np.bool_):
        return bool(terminal_success), True
    raise TypeError(
        f"terminal_success must be True, False or None (unknown), got {terminal_success!r}; "
        "convert a reward with success_from_reward() or an exit code with "
        "success_from_exit_code()"
    )


# --------------------------------------------------------------------------- the report


@dataclasses.dataclass(frozen=True)
class VerificationReport:
    """What one verifier run says about one episode.

    Attributes:
      valid: the report could be graded (no problems). Rewards use P only if valid.
      strict_success: S, the verifier's terminal verdict (every check, terminal gates
        included, passed). Independent of P/N; False when the verdict is unknown.
      passed: P, passed non-hygiene checks (0 if invalid).
      total: N, all non-hygiene checks, any status (0 if invalid).
      failed, skipped, pending, other: non-hygiene checks by status (sum with P to N).
      hygiene_checks: (name, status) of the checks excluded as hygiene.
      problems: why the report is invalid (empty iff valid).
      warnings: non-fatal observations (legacy collapse, verdict/count disagreement).
      shape: "ctrf" (current spec), "legacy" (pytest-json-ctrf 0.x), "counts" (built from
        counts), or "none" (nothing could be read).
      verdict_known: False if no terminal verdict was given (then strict_success is False).
      source: the report's path, if it came from a file.
    """

    valid: bool
    strict_success: bool
    passed: int = 0
    total: int = 0
    failed: int = 0
    skipped: int = 0
    pending: int = 0
    other: int = 0
    hygiene_checks: tuple[tuple[str, str], ...] = ()
    problems: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    shape: str = "counts"
    verdict_known: bool = True
    source: str | None = None

    def __post_init__(self):
        object.__setattr__(self, "problems", tuple(self.problems))
        object.__setattr__(self, "warnings", tuple(self.warnings))
        object.__setattr__(
            self, "hygiene_checks", tuple((str(n), str(s)) for n, s in self.hygiene_checks)
        )
        counts = (self.passed, self.total, self.failed, self.skipped, self.pending, self.other)
        if any(not isinstance(c, int) or isinstance(c, bool) or c < 0 for c in counts):
            raise ReportError(f"VerificationReport counts must be non-negative ints, got {counts}")
        if not isinstance(self.valid, bool) or not isinstance(self.strict_success, bool):
            raise ReportError("VerificationReport.valid and .strict_success must be bools")
        if self.shape not in ("ctrf", "legacy", "counts", "none"):
            raise ReportError(f"VerificationReport.shape = {self.shape!r} is not a known shape")
        if self.valid:
            if self.problems:
                raise ReportError("a valid VerificationReport cannot list problems")
            if self.total < 1 or self.passed > self.total:
                raise ReportError(f"valid report needs 0 <= P <= N, N >= 1; got {counts[:2]}")
            if sum(counts) - self.total != self.total:
                raise ReportError(f"P + failed + skipped + pending + other != N: {counts}")
        else:
            if not self.problems:
                raise ReportError("an invalid VerificationReport must state a problem")
            if any(counts):
                raise ReportError("an invalid VerificationReport carries no counts")

    # Paper notation.
    @property
    def P(self) -> int:  # noqa: N802
        return self.passed

    @property
    def N(self) -> int:  # noqa: N802
        return self.total

    @property
    def S(self) -> int:  # noqa: N802
        return int(self.strict_success)

    @property
    def reason(self) -> str | None:
        """Why the report is invalid, one line; None if valid."""
        return "; ".join(self.problems) if self.problems else None

    @property
    def hygiene_excluded(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.hygiene_checks)

    @property
    def hygiene_failed(self) -> tuple[str, ...]:
        return tuple(n for n, s in self.hygiene_checks if s == "failed")

    # ----------------------------------------------------------------- constructors

    @classmethod
    def invalid(
        cls,
        reason: str | Sequence[str],
        *,
        terminal_success: bool | None,
        shape: str = "none",
        source: str | None = None,
        warnings: Sequence[str] = (),
    ) -> VerificationReport:
        """An invalid report: rewards fall back to S."""
        s, known = _terminal(terminal_success)
        problems = (reason,) if isinstance(reason, str) else tuple(reason)
        return cls(
            valid=False,
            strict_success=s,
            problems=problems,
            warnings=tuple(warnings) + (() if known else ("no terminal verdict given; S = 0",)),
            shape=shape,
            verdict_known=known,
            source=source,
        )

    @classmethod
    def from_counts(
        cls,
        passed: int,
        total: int,
        *,
        terminal_success: bool | None,
        failed: int | None = None,
        skipped: int = 0,
        pending: int = 0,
        other: int = 0,
        hygiene_checks: Sequence[tuple[str, str]] = (),
        strict: bool = False,
        source: str | None = None,
    ) -> VerificationReport:
        """A report from non-hygiene check counts (built-in task verifiers, JSONL outcomes).

        `failed` defaults to total - passed - skipped - pending - other. Counts may be
        ints or integral finite floats (1e300 is fine; inf and NaN are invalid). Bad
        counts give an invalid report (or ReportError with strict=True).
        """
        problems: list[str] = []
        values = {}
        for key, value in (
            ("passed", passed),
            ("total", total),
            ("skipped", skipped),
            ("pending", pending),
            ("other", other),
        ) + ((("failed", failed),) if failed is not None else ()):
            ok, v, why = _as_count(value)
            if not ok:
                problems.append(f"{key} count {value!r} {why}")
            values[key] = v
        if not problems:
            if values["total"] < 1:
                problems.append("zero checks (total = 0): nothing to grade")
            elif values["passed"] > values["total"]:
                problems.append(
                    f"passed ({values['passed']}) exceeds total ({values['total']})"
                )
            else:
                rest = values["skipped"] + values["pending"] + values["other"]
                if failed is None:
                    values["failed"] = values["total"] - values["passed"] - rest
                    if values["failed"] < 0:
                        problems.append(
                            f"passed + skipped + pending + other = {values['passed'] + rest} "
                            f"exceeds total ({values['total']})"
                        )
                elif values["passed"] + values["failed"] + rest != values["total"]:
                    problems.append(
                        "inconsistent counts: passed + failed + skipped + pending + other = "
                        f"{values['passed'] + values['failed'] + rest} != total "
                        f"({values['total']})"
                    )
        if problems:
            if strict:
                raise ReportError("; ".join(problems))
            return cls.invalid(problems, terminal_success=terminal_success, shape="counts",
                               source=source)
        s, known = _terminal(terminal_success)
        return cls(
            valid=True,
            strict_success=s,
            passed=values["passed"],
            total=values["total"],
            failed=values["failed"],
            skipped=values["skipped"],
            pending=values["pending"],
            other=values["other"],
            hygiene_checks=tuple(hygiene_checks),
            warnings=_verdict_warnings(s, known, values["failed"], hygiene_checks),
            shape="counts",
            verdict_known=known,
            source=source,
        )

    # ----------------------------------------------------------------- serialization

    def to_dict(self) -> dict:
        """A JSON-serializable dict; `from_dict` inverts it exactly."""
        d = dataclasses.asdict(self)
        d["hygiene_checks"] = [list(x) for x in self.hygiene_checks]
        d["problems"] = list(self.problems)
        d["warnings"] = list(self.warnings)
        d["format"] = _REPORT_FORMAT_TAG
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> VerificationReport:
        """Inverse of `to_dict` (raises ReportError on a malformed dict)."""
        if not isinstance(d, Mapping):
            raise ReportError(f"VerificationReport.from_dict needs a mapping, got {type(d)}")
        fmt = d.get("format", _REPORT_FORMAT_TAG)
        if fmt != _REPORT_FORMAT_TAG:
            raise ReportError(f"unknown VerificationReport format {fmt!r}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names - {"format"}
        if unknown:
            raise ReportError(f"VerificationReport.from_dict: unknown keys {sorted(unknown)}")
        kwargs = {k: d[k] for k in names if k in d}
        for key in ("hygiene_checks", "problems", "warnings"):
            if key in kwargs:
                kwargs[key] = tuple(
                    tuple(x) if key == "hygiene_checks" else x for x in kwargs[key]
                )
        try:
            return cls(**kwargs)
        except TypeError as e:
            raise ReportError(f"VerificationReport.from_dict: {e}") from e


def _as_count(value: Any) -> tuple[bool, int, str]:
    if isinstance(value, bool):
        return False, 0, "is a bool, not a count"
    if isinstance(value, int):
        if value < 0:
            return False, 0, "is negative"
        if value > MAX_COUNT:
            return False, 0, "is too large to represent as a float"
        return True, value, ""
    if isinstance(value, float) or type(value).__name__.startswith(("float", "int")):
        try:
            v = float(value)
        except (TypeError, ValueError):
            return False, 0, "is not a number"
        if not math.isfinite(v):
            return False, 0, "is not finite"
        if v != math.floor(v):
            return False, 0, "is not an integer"
        if v < 0:
            return False, 0, "is negative"
        return True, int(v), ""
    return False, 0, f"has type {type(value).__name__}, expected an integer"


def _verdict_warnings(
    s: bool, known: bool, failed: int, hygiene_checks: Iterable[tuple[str, str]]
) -> tuple[str, ...]:
    out = []
    if not known:
        out.append("no terminal verdict given; S = 0")
    if s and failed:
        out.append(f"terminal verdict is success but {failed} non-hygiene checks failed")
    hyg_failed = [n for n, st in hygiene_checks if st == "failed"]
    if s and hyg_failed:
        out.append(f"terminal verdict is success but hygiene checks failed: {hyg_failed[:3]}")
    return tuple(out)


# --------------------------------------------------------------------------- parsing


class _Invalid(Exception):
    def __init__(self, problems: str | Sequence[str], shape: str = "none"):
        super().__init__(problems)
        self.problems = (problems,) if isinstance(problems, str) else tuple(problems)
        self.shape = shape


def _no_constants(name: str):
    raise ValueError(f"non-standard JSON constant {name}")


def _pairs_no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    out = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r} in a JSON object")
        out[k] = v
    return out


def _load(source: Any, max_bytes: int) -> tuple[Any, str | None]:
    if isinstance(source, Mapping | list):
        return source, None
    if not isinstance(source, str | os.PathLike):
        raise _Invalid(f"report source has type {type(source).__name__}; "
                       "pass a file path or a parsed JSON object")
    path = os.fspath(source)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise _Invalid(f"report file not found: {path} (the verifier wrote no CTRF report)") \
            from None
    except OSError as e:
        raise _Invalid(f"cannot stat report file {path}: {e.strerror}") from None
    if os.path.isdir(path):
        raise _Invalid(f"report path {path} is a directory, not a file")
    if st.st_size == 0:
        raise _Invalid(f"report file {path} is empty")
    if st.st_size > max_bytes:
        raise _Invalid(f"report file {path} is {st.st_size} bytes, over the {max_bytes}-byte "
                       "limit (raise max_bytes if this is expected)")
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise _Invalid(f"cannot read report file {path}: {e.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _Invalid(f"report file {path} is not valid UTF-8 (byte {e.start})") from None
    try:
        obj = json.loads(
            text, object_pairs_hook=_pairs_no_duplicates, parse_constant=_no_constants
        )
    except json.JSONDecodeError as e:
        raise _Invalid(
            f"invalid JSON in {path} at line {e.lineno} column {e.colno}: {e.msg}"
        ) from None
    except ValueError as e:
        raise _Invalid(f"invalid JSON in {path}: {e}") from None
    except RecursionError:
        raise _Invalid(f"invalid JSON in {path}: nested too deeply") from None
    return obj, path


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _interpret(obj: Any, hygiene: HygieneRule) -> tuple[str, dict, tuple[str, ...]]:
    """Validate the shape; return (shape, non-hygiene counts etc., warnings)."""
    if not isinstance(obj, Mapping):
        raise _Invalid(f"top level is a JSON {type(obj).__name__}, expected an object with "
                       "a 'results' key")
    if "reportFormat" in obj or "specVersion" in obj:
        shape = "ctrf"
        problems = []
        if obj.get("reportFormat") != "CTRF":
            problems.append(f"reportFormat = {obj.get('reportFormat')!r}, expected 'CTRF'")
        spec = obj.get("specVersion")
        if not isinstance(spec, str) or not re.fullmatch(r"\d+\.\d+\.\d+", spec):
            problems.append(f"specVersion = {spec!r}, expected a version string like '1.0.0'")
        elif spec.split(".")[0] != SUPPORTED_SPEC_MAJOR:
            problems.append(f"specVersion {spec} is not supported (major version "
                            f"{SUPPORTED_SPEC_MAJOR} only)")
        if problems:
            raise _Invalid(problems, shape)
    else:
        shape = "legacy"
    results = obj.get("results")
    if results is None:
        raise _Invalid(f"missing 'results' (top-level keys: {sorted(obj)[:8]})", shape)
    if not isinstance(results, Mapping):
        raise _Invalid(f"'results' is a JSON {type(results).__name__}, expected an object", shape)
    problems: list[str] = []
    tool = results.get("tool")
    if not isinstance(tool, Mapping):
        problems.append("results.tool is missing or not an object")
    elif not isinstance(tool.get("name"), str) or not tool.get("name"):
        problems.append("results.tool.name is missing or not a non-empty string")
    tests = results.get("tests")
    if tests is None:
        raise _Invalid(problems + ["results.tests is missing"], shape)
    if not isinstance(tests, list):
        raise _Invalid(problems + [f"results.tests is a JSON {type(tests).__name__}, "
                                   "expected an array"], shape)
    if not tests:
        raise _Invalid(problems + ["zero tests: results.tests is empty (nothing was graded)"],
                       shape)
    summary = results.get("summary")
    if not isinstance(summary, Mapping):
        problems.append("results.summary is missing or not an object")
        summary = None
    else:
        for key in SUMMARY_COUNT_FIELDS:
            v = summary.get(key)
            if not _is_int(v) or v < 0:
                problems.append(f"results.summary.{key} = {v!r}, expected a non-negative integer")

    all_counts = dict.fromkeys(STATUSES, 0)
    counts = dict.fromkeys(STATUSES, 0)
    hygiene_checks: list[tuple[str, str]] = []
    seen: dict[str, int] = {}
    duplicates: list[str] = []
    collapsed = 0
    for i, t in enumerate(tests):
        where = f"results.tests[{i}]"
        if not isinstance(t, Mapping):
            problems.append(f"{where} is a JSON {type(t).__name__}, expected an object")
            continue
        name = t.get("name")
        if not isinstance(name, str) or not name.strip():
            problems.append(f"{where}.name = {name!r}, expected a non-empty string")
            continue
        status = t.get("status")
        if status not in STATUSES:
            problems.append(f"{where}.status = {status!r} ({name}), expected one of "
                            f"{', '.join(STATUSES)}")
            continue
        duration = t.get("duration")
        if shape == "ctrf":
            if not _is_int(duration) or duration < 0:
                problems.append(f"{where}.duration = {duration!r} ({name}); CTRF 1.0 needs a "
                                "non-negative integer number of milliseconds")
        elif not _is_number(duration) or duration < 0:
            problems.append(f"{where}.duration = {duration!r} ({name}), expected a "
                            "non-negative number")
        tags = t.get("tags", [])
        if not isinstance(tags, list) or not all(isinstance(x, str) for x in tags):
            problems.append(f"{where}.tags = {tags!r}, expected an array of strings")
            tags = []
        retries = t.get("retries", 0)
        if not _is_int(retries) or retries < 0:
            problems.append(f"{where}.retries = {retries!r}, expected a non-negative integer")
            retries = 0
        if shape == "legacy":
            collapsed += retries
        if name in seen:
            duplicates.append(name)
        seen[name] = i
        all_counts[status] += 1
        if hygiene.is_hygiene(name, tags):
            hygiene_checks.append((name, status))
        else:
            counts[status] += 1
    if duplicates:
        shown = ", ".join(repr(n) for n in sorted(set(duplicates))[:3])
        problems.append(f"duplicate test names ({len(duplicates)}): {shown}; each check needs "
                        "a unique name")
    if summary is not None and not problems:
        n_tests = sum(all_counts.values())
        if summary["tests"] != n_tests:
            problems.append(f"inconsistent counts: summary.tests = {summary['tests']} but "
                            f"results.tests has {n_tests} entries")
        for key in STATUSES:
            if summary[key] != all_counts[key]:
                problems.append(f"inconsistent counts: summary.{key} = {summary[key]} but "
                                f"{all_counts[key]} tests have status {key!r}")
    if not problems and sum(counts.values()) == 0:
        problems.append(f"no non-hygiene checks: all {len(hygiene_checks)} tests are hygiene "
                        "checks, nothing to grade")
    if problems:
        raise _Invalid(problems, shape)
    warnings = []
    if collapsed:
        warnings.append(f"legacy report: {collapsed} parametrized cases were collapsed into "
                        "other entries (counted once each)")
    return shape, {"counts": counts, "hygiene_checks": tuple(hygiene_checks)}, tuple(warnings)


def parse_ctrf(
    source: str | os.PathLike | Mapping[str, Any] | list,
    *,
    terminal_success: bool | None,
    hygiene: HygieneRule = DEFAULT_HYGIENE,
    strict: bool = False,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> VerificationReport:
    """Parse a CTRF report (file path or parsed JSON object) into a `VerificationReport`.

    Args:
      source: path to the report file, or the already-parsed JSON value (a dict; a list is
        accepted and reported as the wrong shape).
      terminal_success: the verifier's terminal verdict S (True iff every check, terminal
        gates included, passed: e.g. `exit_code == 0`, or `success_from_reward(r)`), or
        None if unknown (then S = 0 and a warning is recorded). Required keyword: S is
        never derived from the report's counts.
      hygiene: which checks to exclude from P and N (default: DEFAULT_HYGIENE).
      strict: raise ReportError on an invalid report instead of returning it (for tools
        and tests; the training loop uses strict=False).
      max_bytes: reports larger than this are invalid.

    Returns:
      A VerificationReport; invalid (with `problems`) if the report cannot be graded.
    """
    s, known = _terminal(terminal_success)
    src = os.fspath(source) if isinstance(source, str | os.PathLike) else None
    try:
        obj, src = _load(source, max_bytes)
        shape, parsed, warnings = _interpret(obj, hygiene)
        c = parsed["counts"]
        report = VerificationReport(
            valid=True,
            strict_success=s,
            passed=c["passed"],
            total=sum(c.values()),
            failed=c["failed"],
            skipped=c["skipped"],
            pending=c["pending"],
            other=c["other"],
            hygiene_checks=parsed["hygiene_checks"],
            warnings=warnings + _verdict_warnings(s, known, c["failed"],
                                                  parsed["hygiene_checks"]),
            shape=shape,
            verdict_known=known,
            source=src,
        )
    except _Invalid as e:
        report = VerificationReport.invalid(
            e.problems, terminal_success=terminal_success, shape=e.shape, source=src
        )
    except Exception as e:  # noqa: BLE001 - never raise into the training loop
        report = VerificationReport.invalid(
            f"unexpected parser error {type(e).__name__}: {e}",
            terminal_success=terminal_success,
            source=src,
        )
    if strict and not report.valid:
        where = f"{src}: " if src else ""
        raise ReportError(f"{where}{report.reason}")
    return report
