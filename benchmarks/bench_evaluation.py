"""Evaluation metrics: jitted pass@k / Mean@k / strata vs the NumPy reference loops, one run.

    python benchmarks/bench_evaluation.py

Prints seconds per call (best of 3) and the ratio reference / jitted for T tasks (pass@k with
n = 3 runs and n = 64 samples, Mean@3 over [T, 3], percentile-rank strata over [T, 3]).
"""

from __future__ import annotations

import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from timing import best_of  # noqa: E402

from terminal_rsi.evaluation import metrics as M  # noqa: E402
from terminal_rsi.evaluation import strata as S  # noqa: E402


def pass_ref(n, c, k):
    return float(np.mean([1.0 if a - b < k else 1.0 - math.comb(a - b, k) / math.comb(a, k)
                          for a, b in zip(n, c, strict=True)]))


def strata_ref(p):
    ranks = np.stack([[np.sum(p[:, i] <= x) / len(p) for x in p[:, i]]
                      for i in range(p.shape[1])], 1)
    s = ranks.mean(1)
    cut = np.quantile(s, [0.25, 0.5, 0.75])
    return np.array([sum(x > c for c in cut) for x in s])


def main():
    rng = np.random.default_rng(0)
    rows = []
    for t in (256, 4096):
        for n_runs, k in ((3, 3), (64, 8)):
            n = np.full(t, n_runs)
            c = rng.integers(0, n_runs + 1, t)
            f = jax.jit(lambda a, b, k=k: M.pass_at_k(a, b, k))
            jax.block_until_ready(f(n, c))
            tj = best_of(lambda f=f, n=n, c=c: jax.block_until_ready(f(n, c)))
            tr = best_of(lambda n=n, c=c, k=k: pass_ref(n, c, k))
            rows.append((f"pass@{k} (n={n_runs})", t, tr, tj))
        s = (rng.random((t, 3)) < 0.3).astype(np.float32)
        f = jax.jit(M.mean_at_k)
        jax.block_until_ready(f(s))
        tj = best_of(lambda f=f, s=s: jax.block_until_ready(f(s)))
        tr = best_of(lambda s=s: np.mean([s[:, r].mean() for r in range(3)]))
        rows.append(("Mean@3", t, tr, tj))
        p = rng.integers(0, 50, (t, 3)).astype(np.float32)

        def jstrata(p=p):
            sc = S.difficulty_scores(p)
            return jax.block_until_ready(S.assign_strata(sc, S.quartile_cutoffs(sc)))

        jstrata()
        tj = best_of(jstrata)
        tr = best_of(lambda p=p: strata_ref(p), repeats=1 if t > 1000 else 3)
        rows.append(("strata (rank+quartiles)", t, tr, tj))
    print(f"{'metric':28s} {'T':>6s} {'numpy ref s':>12s} {'jax s':>10s} {'ref/jax':>8s}")
    for name, t, tr, tj in rows:
        print(f"{name:28s} {t:6d} {tr:12.5f} {tj:10.5f} {tr / tj:8.1f}")


if __name__ == "__main__":
    main()
