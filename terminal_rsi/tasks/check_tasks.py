"""Check tasks as a task author would: run a task's reference solution in a sandbox, then its
protected verifier.

A task passes when its reference solution is strictly successful (S = 1, P = N) and N equals
the task's expected check count (if it declares one). `check_task` checks one task and returns
a row of the pass/fail table; `load_tasks` gives the tasks to check (a task directory that
fails to load is an entry of its own, `format_error_row` makes its row). The experiment
"verify_tasks" (`terminal_rsi.experiments.verify_tasks`) runs them over a suite, prints the
table and raises `TaskCheckFailed` when a task did not pass.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from terminal_rsi.tasks.harbor import find_task_dirs, load_task_dir
from terminal_rsi.tasks.registry import get_suite
from terminal_rsi.tasks.spec import EnvironmentUnavailable, Task, TaskFormatError
from terminal_rsi.tasks.verify import VerifierError, open_task_sandbox, run_solution, verify


class TaskCheckFailed(RuntimeError):
    """At least one task's reference solution did not pass its verifier."""


def load_tasks(source: str, split: str, *, n_per_family: int = 1,
               families: Sequence[str] = ()) -> list[Task | tuple[str, TaskFormatError]]:
    """Tasks to check: the built-in suite's `split` (`source` 'builtin': `n_per_family`
    instances of `families`, empty: all) or every task directory under `source`; a directory
    that fails to load becomes a (directory, TaskFormatError) entry."""
    if source == "builtin":
        return list(get_suite("builtin", split, n_per_family=n_per_family,
                              families=list(families) or None, start_seed=0))
    out: list[Task | tuple[str, TaskFormatError]] = []
    for d in find_task_dirs(source):
        try:
            out.append(load_task_dir(d))
        except TaskFormatError as e:
            out.append((d, e))
    return out


def format_error_row(task_dir: str, e: TaskFormatError) -> dict:
    """The table row of a task directory that failed to load."""
    return {"task": os.path.basename(os.path.normpath(task_dir)) or e.file, "family": "-",
            "format": "-", "turns": "-", "expected": None, "verdict": "FORMAT ERROR",
            "why": str(e), "seconds": 0.0}


def check_task(task: Task, backend: str = "local", *, allow_plain: str = "never",
               mode: str | None = None, pytest_runtime: str = "auto") -> dict:
    """Run one task's reference solution and verifier in a `backend` sandbox; a row of the
    table. `allow_plain`: the plain-subprocess policy of `open_task_sandbox`; `mode`: verifier
    mode override (None: the task's own); `pytest_runtime`: as `verify` takes it."""
    row = {"task": task.id, "family": task.family, "format": task.format, "turns": task.turns,
           "expected": task.expected_checks}
    t0 = time.monotonic()
    try:
        if not task.solution:
            raise EnvironmentUnavailable("the task has no reference solution")
        with open_task_sandbox(task, backend, allow_plain=allow_plain) as sb:
            run_solution(task, sb)
            res = verify(task, sb, backend=backend, mode=mode, pytest_runtime=pytest_runtime)
        rep = res.report
        ok = rep.S == 1 and rep.valid and rep.P == rep.N and (
            task.expected_checks is None or rep.N == task.expected_checks)
        why = "" if ok else ("S=0" if not rep.S else rep.reason or
                             (f"N={rep.N} != expected {task.expected_checks}"
                              if rep.N != task.expected_checks else "P<N"))
        row.update(verdict="PASS" if ok else "FAIL", S=rep.S, P=rep.P, N=rep.N, why=why,
                   reward=res.reward, report=rep.to_dict(), mode=res.mode)
    except EnvironmentUnavailable as e:
        row.update(verdict="UNAVAILABLE", why=str(e))
    except VerifierError as e:
        row.update(verdict=f"VERIFIER {e.kind.upper()}", why=str(e))
    row["seconds"] = round(time.monotonic() - t0, 3)
    return row

