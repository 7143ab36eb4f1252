"""From evaluation episodes to the metrics dict of one suite (ledger format C5).

`summarize_suite(tasks, runs, k, ...)`: `runs[r][t]` is the trajectory of task t in run r
(None when the attempt gave no verdict: dropped, cancelled or raised; it counts as a failure).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from terminal_rsi.evaluation import metrics as M
from terminal_rsi.evaluation.strata import STRATA, StrataTable
from terminal_rsi.rewards.divisors import FamilyDivisors
from terminal_rsi.rewards.functions import fdr_value, spr_value


def _finite(x) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def rescore(traj, divisors) -> tuple[float, float]:
    """(FDR, SPR) of one trajectory from its report, with the frozen family divisors (Eq. 6,
    7); invalid or missing reports fall back to strict success S."""
    rep = traj.report or {}
    valid = bool(rep.get("valid", False))
    d = divisors.get(traj.family)
    return (fdr_value(traj.P, d, valid, traj.S), spr_value(traj.P, d, valid, traj.S))


def success_matrix(runs: Sequence[Sequence], num_tasks: int) -> np.ndarray:
    """[T, k] float32 strict success (None attempts are failures)."""
    out = np.zeros((num_tasks, len(runs)), np.float32)
    for r, run in enumerate(runs):
        for t, traj in enumerate(run):
            out[t, r] = float(traj.S) if traj is not None else 0.0
    return out


def summarize_suite(tasks: Sequence, runs: Sequence[Sequence], *, divisors=None,
                    strata: StrataTable | None = None,
                    explained_variance: float | None = None,
                    trajectories: str | None = None,
                    pass_ks: Sequence[int] | None = None) -> dict:
    """The C5 `eval.<suite>` dict: k, num_tasks, mean_at_k, pass_at_k {"1": .., "k": ..},
    run_success (per run), process_reward vs strict_success, per_family, strata,
    explained_variance, episodes/missing counts, trajectories path, the action format the
    episodes' replies were parsed in and the fraction of replies that held no action
    (`unparsed_replies`)."""
    divisors = divisors if divisors is not None else FamilyDivisors()
    k, n_tasks = len(runs), len(tasks)
    succ = success_matrix(runs, n_tasks)
    c = succ.sum(axis=1).astype(np.int32)
    n = np.full((n_tasks,), k, np.int32)
    ks = sorted(set(pass_ks or (1, k)))
    eps = [(t, traj) for run in runs for t, traj in enumerate(run) if traj is not None]
    proc = np.zeros_like(succ)
    fdr = np.zeros_like(succ)
    spr = np.zeros_like(succ)
    turns = []
    replies = [t for _, traj in eps for t in traj.turns]
    formats = sorted({str(traj.meta.get("action_format", "json")) for _, traj in eps})
    for r, run in enumerate(runs):
        for t, traj in enumerate(run):
            if traj is None:
                continue
            proc[t, r] = float(M.process_reward(np.array([traj.P]), np.array([traj.N]),
                                                np.array([traj.S]))[0])
            fdr[t, r], spr[t, r] = rescore(traj, divisors)
            turns.append(len(traj.turns))
    fams: dict[str, list[int]] = {}
    for i, task in enumerate(tasks):
        fams.setdefault(task.family, []).append(i)
    per_family = {f: {"n": len(ix), "success": float(succ[ix].mean()),
                      "mean_p_over_n": float(proc[ix].mean()),
                      "fdr": float(fdr[ix].mean()), "spr": float(spr[ix].mean())}
                  for f, ix in sorted(fams.items())}
    strata_out = None
    if strata is not None:
        strata_out = {}
        for s in STRATA:
            ix = [i for i, task in enumerate(tasks) if strata.stratum(task.id) == s]
            strata_out[s] = {"n": len(ix),
                             "success": float(succ[ix].mean()) if ix else None}
    out = {
        "k": k,
        "num_tasks": n_tasks,
        "episodes": len(eps),
        "missing": n_tasks * k - len(eps),
        "mean_at_k": float(M.mean_at_k(succ)) if n_tasks else None,
        "run_success": [float(x) for x in M.run_success_rates(succ)] if n_tasks else [],
        "pass_at_k": {str(j): float(M.pass_at_k(n, c, j)) for j in ks if j <= k},
        "strict_success": float(succ.mean()) if n_tasks else None,
        "process_reward": float(proc.mean()) if n_tasks else None,
        "fdr": float(fdr.mean()) if n_tasks else None,
        "spr": float(spr.mean()) if n_tasks else None,
        "mean_turns": float(np.mean(turns)) if turns else None,
        "action_format": ",".join(formats) or None,
        "unparsed_replies": (sum(bool(t.parse_error) for t in replies) / len(replies)
                             if replies else None),
        "explained_variance": (_finite(explained_variance)
                               if explained_variance is not None else None),
        "per_family": per_family,
        "strata": strata_out,
        "trajectories": trajectories,
    }
    return out


def mean_of_suites(evals: Mapping[str, dict], key: str = "mean_at_k") -> float | None:
    """Equal-weight mean of `key` over suites (Fig. 5's s̄_k), None if none has it."""
    xs = [e[key] for e in evals.values() if isinstance(e, dict) and e.get(key) is not None]
    return float(np.mean(xs)) if xs else None
