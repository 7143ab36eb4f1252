"""Check tasks as a task author would: run a task's reference solution in a sandbox, then its
protected verifier.

A task passes when its reference solution is strictly successful (S = 1, P = N) and N equals
the task's expected check count (if it declares one). Every task gets one of `VERDICTS`:
PASS, FAIL (the verdict says no; the reason names it, with the reference solution's exit
status and output tail when it failed: a verifier that timed out or crashed after its tests
began is a FAIL with its reason, as Harbor and Terminal-Bench score it), UNAVAILABLE (this
machine or backend cannot provide the environment: a base image or the engine missing, paths
a local sandbox cannot honour) or ERROR (the task is broken: it does not load, its image
does not build, its verifier cannot start). One task never stops the run. `check_task`
checks one task and returns a row of the pass/fail table; `load_tasks` gives the tasks to
check (a task directory that fails to load is an entry of its own, `format_error_row` makes
its row). The experiment "verify_tasks" (`terminal_rsi.experiments.verify_tasks`) runs them
over a suite, prints the table and raises `TaskCheckFailed` when a task did not pass.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

from terminal_rsi.sandbox import ExecResult
from terminal_rsi.tasks.harbor import find_task_dirs, load_task_dir
from terminal_rsi.tasks.registry import get_suite
from terminal_rsi.tasks.spec import (
    EnvironmentBuildFailed,
    EnvironmentUnavailable,
    Task,
    TaskFormatError,
)
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


VERDICTS = ("PASS", "FAIL", "UNAVAILABLE", "ERROR")


def format_error_row(task_dir: str, e: TaskFormatError) -> dict:
    """The table row of a task directory that failed to load (verdict ERROR)."""
    return {"task": os.path.basename(os.path.normpath(task_dir)) or e.file, "family": "-",
            "format": "-", "turns": "-", "expected": None, "verdict": "ERROR",
            "why": f"task format: {e}", "seconds": 0.0}


def solution_problem(task: Task, results: list[list[Any]]) -> str:
    """What went wrong running the reference solution, in words ("" when nothing did): the
    oracle's (or last command's) exit status and the tail of its output, or that it did not
    finish within the agent's timeout."""
    last = results[-1][-1] if results and results[-1] else None
    if last is None:
        return ""
    if isinstance(last, ExecResult):
        text, unfinished = last.stdout + last.stderr, last.timed_out
    else:  # a SessionOutput: what the terminal showed
        text, unfinished = last.text, not last.done
    tail = " ".join(text.strip()[-600:].split())
    if unfinished:
        return (f"the reference solution did not finish within {task.agent_timeout_s:g} s: "
                f"...{tail}")
    if last.exit_code not in (0, None):
        return f"the reference solution exited {last.exit_code}: ...{tail}"
    return ""


def check_task(task: Task, backend: str = "local", *, allow_plain: str = "never",
               allow_network: bool = False, mode: str | None = None,
               pytest_runtime: str = "auto") -> dict:
    """Run one task's reference solution and verifier in a `backend` sandbox; a row of the
    table with a verdict of `VERDICTS` and why. Never raises for the task's sake: a task
    whose environment cannot be provided here is UNAVAILABLE, one that is broken (its image
    does not build, its verifier crashes, anything unexpected) is ERROR.

    `allow_plain`: the plain-subprocess policy of `open_task_sandbox`; `allow_network`: a
    task that asks for network gets it (else it runs offline, and a failure says so);
    `mode`: verifier mode override (None: the task's own); `pytest_runtime`: as `verify`."""
    row = {"task": task.id, "family": task.family, "format": task.format, "turns": task.turns,
           "expected": task.expected_checks, "warnings": list(task.warnings)}
    t0 = time.monotonic()
    try:
        if not task.solution and task.oracle is None:
            raise EnvironmentUnavailable("the task has no reference solution")
        with open_task_sandbox(task, backend, allow_plain=allow_plain,
                               allow_network=allow_network) as sb:
            solution = solution_problem(task, run_solution(task, sb))
            res = verify(task, sb, backend=backend, mode=mode, pytest_runtime=pytest_runtime,
                         allow_network=allow_network)
        row.update(_verdict_row(task, res, solution, allow_network))
    except EnvironmentUnavailable as e:
        row.update(verdict="UNAVAILABLE", why=str(e))
    except (EnvironmentBuildFailed, VerifierError) as e:
        row.update(verdict="ERROR", why=str(e))
    except Exception as e:  # noqa: BLE001 - one task never stops the run
        row.update(verdict="ERROR", why=f"{type(e).__name__}: {e}")
    row["seconds"] = round(time.monotonic() - t0, 3)
    return row


def _verdict_row(task: Task, res, solution: str, allow_network: bool) -> dict:
    rep = res.report
    if res.reward is not None and "ctrf.json" not in res.artifacts:
        # Harbor's verdict is the reward alone; P and N only come with a CTRF report
        ok = rep.S == 1 and task.expected_checks is None
    else:
        ok = rep.S == 1 and rep.valid and rep.P == rep.N and (
            task.expected_checks is None or rep.N == task.expected_checks)
    why = "" if ok else (rep.reason if res.failure else "S=0" if not rep.S else rep.reason or
                         (f"N={rep.N} != expected {task.expected_checks}"
                          if rep.N != task.expected_checks else "P<N"))
    notes = [solution] if solution else []
    if not ok and task.environment.network and not allow_network:
        notes.append("the task asks for network access, which this run denies "
                     "(tasks.allow_network=False)")
    return dict(verdict="PASS" if ok else "FAIL", S=rep.S, P=rep.P, N=rep.N,
                why="; ".join([why, *notes] if why else notes), reward=res.reward,
                report=rep.to_dict(), mode=res.mode)
