"""Verification latency per task: built-in CTRF emitter vs pytest + pytest-json-ctrf.

    python benchmarks/bench_tasks.py [--n 10] [--backends local-plain,local-bwrap,docker]

For each backend: the latency of `verify()` after the reference solution ran (separate
mode: artifacts copied out, fresh verifier sandbox when the checks need commands, report
parsed through parse_ctrf). Rows: a built-in family without commands in its checks
(sort_uniq), one that runs commands in a verifier sandbox (fix_script), and the pytest
plugin path (the test suite's Terminal-Bench task dir with 5 tests, in the workspace layout
of the built-in tasks: `tests.tasks.conftest.workspace_task`). On Docker one more row: that
task as Terminal-Bench runs it (its own image, run-tests.sh at /tests in the agent's
container, graded by pytest's -rA summary), which local backends cannot run. Ratios are
against one sandbox exec of `true` on the same backend, measured in the same run. Docker
rows are skipped, with a note, if no engine answers (the real-layout row also needs the
task base image trsi-task-base:bookworm).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from terminal_rsi.tasks import load_terminal_bench_task, open_task_sandbox, run_solution, verify  # noqa: E402
from terminal_rsi.tasks.builtin import make_task  # noqa: E402


def _tb_task(tmp: str):
    """The Terminal-Bench test task as its own tools run it (Docker only)."""
    from tests.tasks.conftest import tb_files, write

    return load_terminal_bench_task(write(os.path.join(tmp, "tb-hello"), tb_files()))


def _task_base_present() -> bool:
    from terminal_rsi.sandbox.image import image_present
    from tests.tasks.conftest import BASE

    return image_present(BASE)


def _p(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def bench(task, backend: str, n: int) -> list[float]:
    out = []
    # the test task dir is ours (trusted): it may run plain where that backend is named
    with open_task_sandbox(task, backend, allow_plain="always") as sb:
        run_solution(task, sb)
        verify(task, sb, backend=backend)  # warm-up (pytest runtime probe, image build)
        for _ in range(n):
            t0 = time.perf_counter()
            r = verify(task, sb, backend=backend)
            out.append(time.perf_counter() - t0)
            assert r.S == 1, r.report
    return out


def exec_baseline(backend: str, n: int) -> list[float]:
    from terminal_rsi.sandbox import open_sandbox

    out = []
    with open_sandbox(backend=backend) as sb:
        sb.exec("true")
        for _ in range(n):
            t0 = time.perf_counter()
            sb.exec("true")
            out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--backends", default="local-plain,local-bwrap,docker")
    args = ap.parse_args()
    rows, notes = [], []
    with tempfile.TemporaryDirectory() as tmp:
        from tests.tasks.conftest import workspace_task

        real = _tb_task(tmp)
        tasks = [("builtin emitter (sort_uniq, no commands)", make_task("sort_uniq", 0)),
                 ("builtin emitter (fix_script, 1 command)", make_task("fix_script", 0)),
                 ("pytest + pytest-json-ctrf (5 tests)", workspace_task(real))]
        for backend in args.backends.split(","):
            todo = list(tasks)
            if backend == "docker":
                from terminal_rsi.sandbox.docker_backend import docker_available

                if not docker_available():
                    notes.append("docker: skipped, no Docker engine answers "
                                 "(start one with .ci/setup_sandbox.sh)")
                    continue
                if _task_base_present():
                    todo.append(("Terminal-Bench layout, -rA summary (5 tests, shared)", real))
                else:
                    notes.append("docker: the Terminal-Bench layout row is skipped, no task "
                                 "base image (python -m terminal_rsi.sandbox.image "
                                 "build-task-base)")
            bx = exec_baseline(backend, args.n)
            base = statistics.median(bx)
            rows.append((backend, "sandbox exec `true` (baseline)", base, _p(bx, 0.95), 1.0))
            for label, task in todo:
                xs = bench(task, backend, args.n)
                med = statistics.median(xs)
                rows.append((backend, label, med, _p(xs, 0.95), med / base))
    print(f"verification latency, n={args.n} per row (ms)\n")
    print("| backend | verifier | p50 ms | p95 ms | p50 / exec |")
    print("|---|---|---:|---:|---:|")
    for b, label, med, p95, ratio in rows:
        print(f"| {b} | {label} | {med * 1e3:.1f} | {p95 * 1e3:.1f} | {ratio:.1f}x |")
    for note in notes:
        print(f"\n{note}")


if __name__ == "__main__":
    main()
