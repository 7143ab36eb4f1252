"""Benchmark the rewards area: CTRF parsing and vectorized SPR.

    python benchmarks/bench_rewards.py [--reports 300] [--tests-per-report 60] [--episodes 1000000]

1. Parse throughput: `parse_ctrf` (full validation, hygiene matching, duplicate-key check)
   vs a plain `json.load` of the same files (baseline), in reports/s.
2. SPR over many episodes: jitted `spr_array` (float32, one device call) vs a Python loop
   over the scalar `spr_value` (run on a subset and reported per episode).
Ratios are measured in one run; absolute numbers depend on the (shared) machine.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from timing import best_of  # noqa: E402

from terminal_rsi.rewards import parse_ctrf, spr_array, spr_value  # noqa: E402


def write_reports(directory: str, n_reports: int, n_tests: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    statuses = np.array(["passed", "failed", "skipped"])
    paths = []
    for i in range(n_reports):
        st = statuses[rng.choice(3, n_tests, p=[0.7, 0.25, 0.05])]
        tests = [{"name": f"tests/test_outputs.py::test_check_{j}", "status": str(s),
                  "duration": int(rng.integers(0, 500)), "suite": ["tests/test_outputs.py"],
                  "retries": 0, "filePath": "tests/test_outputs.py"} for j, s in enumerate(st)]
        tests.append({"name": "tests/test_outputs.py::test_tests_dir_untouched",
                      "status": "passed", "duration": 1})
        summary = {"tests": len(tests), **{k: sum(t["status"] == k for t in tests)
                                           for k in ("passed", "failed", "skipped", "pending",
                                                     "other")}, "start": 0, "stop": 1}
        obj = {"reportFormat": "CTRF", "specVersion": "1.0.0",
               "results": {"tool": {"name": "pytest"}, "summary": summary, "tests": tests}}
        path = os.path.join(directory, f"r{i}.json")
        with open(path, "w") as f:
            json.dump(obj, f, indent=4)
        paths.append(path)
    return paths


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reports", type=int, default=300)
    ap.add_argument("--tests-per-report", type=int, default=60)
    ap.add_argument("--episodes", type=int, default=1_000_000)
    ap.add_argument("--loop-episodes", type=int, default=100_000)
    args = ap.parse_args()

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_reports(tmp, args.reports, args.tests_per_report)

        def baseline():
            for p in paths:
                with open(p) as f:
                    json.load(f)

        def parse():
            for p in paths:
                r = parse_ctrf(p, terminal_success=False)
                assert r.valid

        t_json, t_parse = best_of(baseline), best_of(parse)
        rows.append(("CTRF parse", f"{args.reports} reports x {args.tests_per_report + 1} tests",
                     f"json.load {args.reports / t_json:,.0f} reports/s",
                     f"parse_ctrf {args.reports / t_parse:,.0f} reports/s",
                     f"{t_parse / t_json:.2f}x slower"))

    rng = np.random.default_rng(0)
    n = args.episodes
    p = rng.integers(0, 400, n).astype(np.float32)
    d = rng.uniform(1, 800, n).astype(np.float32)
    valid = rng.random(n) < 0.95
    s = (rng.random(n) < 0.3).astype(np.float32)
    dev = [jnp.asarray(x) for x in (p, d, valid, s)]
    f = jax.jit(spr_array)
    f(*dev).block_until_ready()  # compile
    t_vec = best_of(lambda: f(*dev).block_until_ready())
    m = min(args.loop_episodes, n)
    pl, dl, vl, sl = p[:m].tolist(), d[:m].tolist(), valid[:m].tolist(), s[:m].tolist()
    t_loop = best_of(lambda: [spr_value(pl[i], dl[i], vl[i], sl[i]) for i in range(m)], 1)
    per_vec, per_loop = t_vec / n, t_loop / m
    rows.append(("SPR", f"{n:,} episodes (loop on {m:,})",
                 f"Python loop {1 / per_loop:,.0f} episodes/s",
                 f"jit spr_array {1 / per_vec:,.0f} episodes/s",
                 f"{per_loop / per_vec:,.0f}x faster"))

    print(f"jax {jax.__version__} on {jax.devices()[0].platform}")
    header = ("benchmark", "size", "baseline", "measured", "ratio")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
