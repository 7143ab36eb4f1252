"""What ``network=True`` costs an exec on local-bwrap, as a ratio against ``network=False``.

    python benchmarks/bench_sandbox_network.py [--n 40]

Rows: exec round trip of ``true`` (p50, p95) with ``network=False`` (the baseline: a fresh
network namespace with loopback only), with ``network=True`` (a fresh namespace plus its
slirp4netns helper, started before the command and stopped after it), and with
``network=True`` while a terminal session is open (the exec joins the session's namespace,
whose helper already runs: no helper of its own). The variants are interleaved, one exec of
each per round, so drift on a shared machine hits them alike. Needs bubblewrap, slirp4netns
and tmux; root for the full isolation (a dedicated uid and cgroups per sandbox).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_sandbox import pct  # noqa: E402

from terminal_rsi.sandbox import SandboxSpec, open_sandbox  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=40, help="execs per variant")
    args = ap.parse_args()
    off = open_sandbox(SandboxSpec(network=False), backend="local-bwrap")
    on = open_sandbox(SandboxSpec(network=True), backend="local-bwrap")
    joined = open_sandbox(SandboxSpec(network=True), backend="local-bwrap")
    joined.open_session()
    rows = [("network=False (baseline)", off), ("network=True", on),
            ("network=True, session open", joined)]
    times: dict[str, list[float]] = {name: [] for name, _ in rows}
    try:
        for sb in (off, on, joined):  # warm-up
            sb.exec("true").check()
        for _ in range(args.n):
            for name, sb in rows:
                t0 = time.perf_counter()
                sb.exec("true").check()
                times[name].append(time.perf_counter() - t0)
    finally:
        for sb in (off, on, joined):
            sb.close()
    base = pct(times[rows[0][0]], 0.5)
    print(f"local-bwrap exec of `true`, {args.n} execs per row, interleaved")
    print("| variant | p50 ms | p95 ms | p50 / baseline |")
    print("|---|---:|---:|---:|")
    for name, _ in rows:
        p50, p95 = pct(times[name], 0.5), pct(times[name], 0.95)
        print(f"| {name} | {p50 * 1e3:.1f} | {p95 * 1e3:.1f} | {p50 / base:.1f}x |")


if __name__ == "__main__":
    main()
