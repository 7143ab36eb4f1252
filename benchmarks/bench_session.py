"""Terminal-session latency and episode wall time, as ratios inside one run.

    python benchmarks/bench_session.py [--n 200] [--skip-docker] [--episodes 1]

Table 1: per-command latency through a terminal session (`session.run("true\\n")`: type,
wait until the shell's prompt says it finished, read) on every backend (local-bwrap,
local-plain, Docker, the HTTP bridge on loopback in front of local-bwrap and Docker), p50
and p95, against a bare ``subprocess.run(["bash", "-c", "true"])`` (the baseline) measured
in the same run; the exec path of each backend (`sb.exec("true")`) and the session's start
time for comparison. Table 2: episode wall time on the built-in suite (every family, the
reference policy through the harness) with ``harness.terminal = "exec"`` against
``"session"``. Needs root for the local backends' full isolation, tmux, and a running
Docker engine with the sandbox image for the Docker rows.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_sandbox import pct, round_trips, start_server  # noqa: E402

from terminal_rsi.agent import HarnessConfig, ReferencePolicy  # noqa: E402
from terminal_rsi.agent.harness import run_episode  # noqa: E402
from terminal_rsi.models.tokenizer import ByteTokenizer  # noqa: E402
from terminal_rsi.sandbox import SandboxSpec, open_sandbox  # noqa: E402
from terminal_rsi.tasks import get_suite, open_task_sandbox  # noqa: E402
from terminal_rsi.tasks.builtin import FAMILIES  # noqa: E402


def targets(skip_docker: bool, tmp: str):
    """(row name, backend, open kwargs) for each backend; the bridge servers are started."""
    out = [("local-bwrap", "local-bwrap", {}), ("local-plain", "local-plain", {})]
    servers = []
    backs = ["local-bwrap"] + ([] if skip_docker else ["docker"])
    if not skip_docker:
        out.append(("docker", "docker", {}))
    for b in backs:
        proc, url, token = start_server(b, tmp)
        servers.append(proc)
        out.append((f"bridge -> {b}", url, {"token": token}))
    return out, servers


def latency_table(rows, n: int) -> None:
    base = round_trips(lambda: subprocess.run(["bash", "-c", "true"], check=True), n)
    b50, b95 = pct(base, 0.5), pct(base, 0.95)
    print(f"\nper-command latency, {n} round trips each; baseline: bare "
          "subprocess.run(['bash', '-c', 'true'])\n")
    print("| backend | path | p50 ms | p95 ms | p50 / baseline | p95 / baseline |")
    print("|---|---|---:|---:|---:|---:|")
    print(f"| bare subprocess.run (baseline) | - | {b50 * 1e3:.2f} | {b95 * 1e3:.2f} | 1.0x | "
          "1.0x |")
    for name, backend, kw in rows:
        with open_sandbox(SandboxSpec(), backend=backend, **kw) as sb:
            t0 = time.perf_counter()
            term = sb.open_session()
            start_s = time.perf_counter() - t0

            def one(cmd, term=term):
                if not term.run(cmd, 30).done:
                    raise RuntimeError(f"{cmd!r} did not finish in a session")

            sess = round_trips(lambda: one("true\n"), n)
            forked = round_trips(lambda: one("/bin/true\n"), n)
            execs = round_trips(lambda sb=sb: sb.exec("true", timeout=30), n)
        for path, xs in ((f"session `true` (start {start_s * 1e3:.0f} ms)", sess),
                         ("session `/bin/true` (a fork)", forked), ("exec `true`", execs)):
            p50, p95 = pct(xs, 0.5), pct(xs, 0.95)
            print(f"| {name} | {path} | {p50 * 1e3:.2f} | {p95 * 1e3:.2f} | {p50 / b50:.1f}x | "
                  f"{p95 / b95:.1f}x |")


def episode_table(per_family: int, backend: str = "local") -> None:
    tok = ByteTokenizer()
    tasks = [t for f in FAMILIES for t in get_suite("builtin", "all", families=[f],
                                                    n_per_family=per_family)]
    print(f"\nepisode wall time: {len(tasks)} built-in episodes (every family, reference "
          f"policy, backend {backend}), sequential\n")
    print("| terminal | total s | mean per episode ms | success | / exec |")
    print("|---|---:|---:|---:|---:|")
    base = None
    for terminal in ("exec", "session"):
        harness = HarnessConfig(max_turns=8, terminal=terminal)
        t0 = time.perf_counter()
        trajs = [run_episode(t, ReferencePolicy(tok, terminal=terminal),
                             lambda task: open_task_sandbox(task, backend), harness)
                 for t in tasks]
        dt = time.perf_counter() - t0
        base = base or dt
        ok = sum(int(tr.S) for tr in trajs)
        print(f"| {terminal} | {dt:.2f} | {dt / len(tasks) * 1e3:.0f} | {ok}/{len(tasks)} | "
              f"{dt / base:.2f}x |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=200, help="round trips per row")
    ap.add_argument("--episodes", type=int, default=2, help="instances per family")
    ap.add_argument("--skip-docker", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows, servers = targets(args.skip_docker, tmp)
        try:
            latency_table(rows, args.n)
        finally:
            for p in servers:
                p.terminate()
                p.wait()
    episode_table(args.episodes)


if __name__ == "__main__":
    main()
