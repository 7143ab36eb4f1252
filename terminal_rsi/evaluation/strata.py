"""Difficulty strata from structural proxies (paper §3.4, Appendix F).

Difficulty is fixed before any model outcome is seen. Each task gets three structural proxies:

- checker scale: the larger of the declared check count (`Task.expected_checks`) and the
  number of distinct static test functions (`def test_...`) in the verifier files;
- file footprint: files the task ships, not files the agent repairs: seeded workspace files
  (data and environment), verifier test files, and reference artifacts (the reference
  solution's commands, one per command);
- instruction length in characters.

Missing fields count as 0. Each proxy is turned into an empirical percentile rank over the
task population (the ECDF, #{j: x_j <= x_i} / T, so equal values share a rank), the three ranks
are averaged into a score, and the score's quartiles (linear interpolation) are the cutoffs.
A task's stratum is the number of cutoffs its score strictly exceeds, so a score equal to a
cutoff goes to the lower stratum. Strata Q1..Q4 read Easy, Medium, Hard, Extreme.

`fit_strata(tasks)` freezes cutoffs and assignments in a `StrataTable`, saved as JSON
(`save` / `load`); evaluations then only look assignments up, so they stay fixed across
checkpoints.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Mapping, Sequence

import chex
import jax.numpy as jnp
import numpy as np

from terminal_rsi.runtime.atomic import atomic_write_json

STRATA = ("Q1", "Q2", "Q3", "Q4")
STRATUM_NAMES = {"Q1": "Easy", "Q2": "Medium", "Q3": "Hard", "Q4": "Extreme"}
PROXIES = ("check_count", "file_footprint", "instruction_length")
FORMAT = "terminal_rsi.strata/1"
_TEST_FN = re.compile(rb"^\s*(?:async\s+)?def\s+(test_\w+)\s*\(", re.M)


class StrataError(ValueError):
    """A strata table is malformed or does not cover a task being evaluated."""


def structural_proxies(task) -> tuple[float, float, float]:
    """(checker scale, file footprint, instruction length) of a `terminal_rsi.tasks.Task`."""
    names = set()
    for data in task.verifier.files.values():
        if isinstance(data, bytes | bytearray):
            names.update(_TEST_FN.findall(bytes(data)))
    checks = max(int(task.expected_checks or 0), len(names))
    footprint = (len(task.environment.files) + len(task.verifier.files)
                 + sum(len(turn) for turn in task.solution))
    return float(checks), float(footprint), float(len(task.instruction or ""))


def percentile_ranks(x: chex.Array) -> chex.Array:
    """Empirical percentile rank of each entry: #{j: x_j <= x_i} / T. x: [T] -> [T] float32."""
    chex.assert_rank(x, 1)
    x = jnp.asarray(x, jnp.float32)
    return jnp.mean((x[None, :] <= x[:, None]).astype(jnp.float32), axis=1)


def difficulty_scores(proxies: chex.Array) -> chex.Array:
    """Mean percentile rank over proxies. proxies: [T, P] -> [T] float32."""
    chex.assert_rank(proxies, 2)
    p = jnp.asarray(proxies, jnp.float32)
    ranks = jnp.stack([percentile_ranks(p[:, i]) for i in range(p.shape[1])], axis=1)
    return jnp.mean(ranks, axis=1)


def quartile_cutoffs(scores: chex.Array) -> chex.Array:
    """[3] cutoffs: the 0.25 / 0.5 / 0.75 quantiles (linear interpolation) of scores [T]."""
    chex.assert_rank(scores, 1)
    return jnp.quantile(jnp.asarray(scores, jnp.float32), jnp.array([0.25, 0.5, 0.75]))


def assign_strata(scores: chex.Array, cutoffs: chex.Array) -> chex.Array:
    """Stratum index 0..3 per score: the number of cutoffs strictly below it (ties go to the
    lower stratum). scores: [T], cutoffs: [3] -> [T] int32."""
    chex.assert_rank([scores, cutoffs], 1)
    s = jnp.asarray(scores, jnp.float32)
    c = jnp.asarray(cutoffs, jnp.float32)
    return jnp.sum(s[:, None] > c[None, :], axis=1).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class StrataTable:
    """Frozen cutoffs and per-task assignments (task id -> stratum name)."""

    cutoffs: tuple[float, float, float]
    assignments: Mapping[str, str]
    scores: Mapping[str, float] = dataclasses.field(default_factory=dict)
    proxies: Mapping[str, tuple[float, float, float]] = dataclasses.field(default_factory=dict)

    def stratum(self, task_id: str) -> str:
        if task_id not in self.assignments:
            raise StrataError(f"task {task_id!r} has no frozen stratum; the strata table was "
                              "fitted on other tasks (refit it before any evaluation)")
        return self.assignments[task_id]

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(STRATA, 0)
        for s in self.assignments.values():
            out[s] += 1
        return out

    def to_dict(self) -> dict:
        return {"format": FORMAT, "proxies": list(PROXIES), "cutoffs": list(self.cutoffs),
                "names": STRATUM_NAMES,
                "tasks": {t: {"stratum": s, "score": self.scores.get(t),
                              "proxies": list(self.proxies.get(t, ()))}
                          for t, s in sorted(self.assignments.items())}}

    @classmethod
    def from_dict(cls, d: Mapping) -> StrataTable:
        if d.get("format") != FORMAT:
            raise StrataError(f"strata format {d.get('format')!r}; expected {FORMAT!r}")
        try:
            cut = tuple(float(x) for x in d["cutoffs"])
            tasks = d["tasks"]
            assign = {t: v["stratum"] for t, v in tasks.items()}
        except (KeyError, TypeError) as e:
            raise StrataError(f"malformed strata table: {e}") from e
        if len(cut) != 3 or any(s not in STRATA for s in assign.values()):
            raise StrataError("a strata table needs 3 cutoffs and strata in Q1..Q4")
        return cls(cut, assign, {t: v.get("score") for t, v in tasks.items()},
                   {t: tuple(v.get("proxies", ())) for t, v in tasks.items()})

    def save(self, path: str | os.PathLike) -> None:
        atomic_write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike) -> StrataTable:
        with open(path, encoding="utf-8") as f:
            return cls.from_dict(json.load(f))


def fit_strata(tasks: Sequence) -> StrataTable:
    """Freeze strata over `tasks` (their ids must be unique)."""
    ids = [t.id for t in tasks]
    if len(set(ids)) != len(ids) or not ids:
        raise StrataError("fit_strata needs a non-empty set of tasks with unique ids")
    prox = np.array([structural_proxies(t) for t in tasks], np.float64)
    scores = np.asarray(difficulty_scores(prox), np.float64)
    cut = np.asarray(quartile_cutoffs(scores), np.float64)
    idx = np.asarray(assign_strata(scores, cut))
    return StrataTable(tuple(float(x) for x in cut),
                       {t: STRATA[int(i)] for t, i in zip(ids, idx, strict=True)},
                       {t: float(s) for t, s in zip(ids, scores, strict=True)},
                       {t: tuple(float(v) for v in p) for t, p in zip(ids, prox, strict=True)})
