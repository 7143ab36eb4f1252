"""Report build cost against its baseline (reading the same shards and credit files).

    python benchmarks/bench_report.py [--shards 1,4,16] [--repeats 2]

Real episodes (tests/report/fixture_run.py: built-in tasks through the harness, TB-GAE
credit) are replicated into S training step shards of one stage (6 episodes, 7 credit rows
each). For each S: the baseline reads every shard and credit file (read_shard + np.load);
the report build (`build_report`, with max_episodes_per_shard=0 and max_train_shards=0 so
everything is included) does that plus decoding, alignment, JSON and plots. Prints build
time, its ratio to the baseline, ms per episode, output size per episode and, when Chromium
is installed, the time until the page is ready in headless Chromium.
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from timing import best_of  # noqa: E402

from terminal_rsi.agent import read_shard, write_shard  # noqa: E402
from terminal_rsi.report import ReportOptions, build_report  # noqa: E402
from terminal_rsi.report.browser import Browser, find_chromium  # noqa: E402
from tests.report.fixture_run import build_run, credit_arrays, run_episodes  # noqa: E402


def make_run(root: pathlib.Path, trajs, credit, shards: int) -> pathlib.Path:
    build_run(root, trajs)
    tdir = root / "rpr1_fdr" / "trajectories"
    for k in range(2, shards + 1):
        write_shard(tdir / f"step_{k:05d}.jsonl", trajs)
        np.savez(tdir / f"step_{k:05d}.credit.npz", **credit)
    return root


def read_all(run: pathlib.Path) -> None:
    for shard in sorted(run.rglob("*.jsonl")):
        if shard.name == "metrics.jsonl":
            continue
        read_shard(shard)
        c = shard.with_name(shard.name[:-6] + ".credit.npz")
        if c.exists():
            with np.load(c) as z:
                {k: z[k] for k in z.files}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shards", default="1,4,16")
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    trajs = run_episodes()
    credit = credit_arrays(trajs)
    opts = ReportOptions(max_episodes_per_shard=0, max_train_shards=0)
    chromium = find_chromium()
    rows = []
    tmp = pathlib.Path(tempfile.mkdtemp())
    try:
        for s in (int(x) for x in a.shards.split(",")):
            run = make_run(tmp / f"run{s}", trajs, credit, s)
            base = best_of(lambda: read_all(run), a.repeats)
            build = best_of(lambda: build_report(run, options=opts), a.repeats)
            index = run / "report" / "index.html"
            n_eps = len(list((index.parent / "episodes").glob("*.js")))
            size = sum(p.stat().st_size for p in index.parent.rglob("*") if p.is_file())
            load = None
            if chromium:
                with Browser.launch(chromium) as browser:
                    page = browser.new_page()
                    t0 = time.perf_counter()
                    page.goto(index.as_uri())
                    page.wait_for("document.body.dataset.ready === '1'")
                    load = time.perf_counter() - t0
            rows.append((s, n_eps, base, build, size, load))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("| step shards | episodes | read shards ms (baseline) | build ms | ratio | "
          "ms / episode | KiB / episode | page ready ms |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for s, n, base, build, size, load in rows:
        print(f"| {s} | {n} | {base * 1e3:.0f} | {build * 1e3:.0f} | {build / base:.1f} | "
              f"{build * 1e3 / n:.1f} | {size / 1024 / n:.1f} | "
              f"{'-' if load is None else f'{load * 1e3:.0f}'} |")


if __name__ == "__main__":
    main()
