"""Experiment `verify_tasks`: check tasks as a task author would.

    python experiments/run.py --config=configs/verify_tasks.py --workdir=/tmp/vt
    python experiments/run.py --config=configs/verify_tasks.py \
        --config.tasks.source=path/to/tasks --config.tasks.split=all

For each task: start its environment in a sandbox, run the reference solution, run the
protected verifier, print the report, and finally a pass/fail table. A task passes when
its reference solution is strictly successful (S = 1, P = N) and N equals the task's
expected check count (if it declares one). `results.json` in the workdir holds every
report; the run exits with an error if any task failed and `tasks.fail_on_error` is set.
"""

from __future__ import annotations

import json
import os
import time

import ml_collections

from terminal_rsi.atomic import atomic_write_json
from terminal_rsi.configuration import BASE_SCHEMA, SANDBOX_SCHEMA, Field

SCHEMA = {
    **BASE_SCHEMA,
    "tasks.source": Field(str, "'builtin' or a directory of Terminal-Bench/Harbor task dirs"),
    "tasks.split": Field(str, "train | test | heldout_families | all (directories: all)",
                         choices=("train", "test", "heldout_families", "all")),
    "tasks.n_per_family": Field(int, "built-in instances per family", lo=1),
    "tasks.families": Field(tuple, "built-in families to check (empty: all in the split)",
                            item_type=str),
    **SANDBOX_SCHEMA,
    "tasks.mode": Field(str, "verifier mode override ('' = the task's own)",
                        choices=("", "separate", "shared")),
    "tasks.pytest_runtime": Field(str, "copy the host's pytest into sandboxes lacking it",
                                  choices=("auto", "inject", "sandbox")),
    "tasks.show_reports": Field(bool, "print each verifier report"),
    "tasks.fail_on_error": Field(bool, "raise at the end if any task did not pass"),
}


class TaskCheckFailed(RuntimeError):
    """At least one task's reference solution did not pass its verifier."""


def _load(cfg) -> list:
    """Tasks to check; a directory that fails to load becomes a (directory, TaskFormatError)
    entry."""
    from terminal_rsi.tasks import TaskFormatError, get_suite
    from terminal_rsi.tasks.harbor import find_task_dirs, load_task_dir

    if cfg.source == "builtin":
        return list(get_suite("builtin", cfg.split, n_per_family=cfg.n_per_family,
                              families=list(cfg.families) or None, start_seed=0))
    out = []
    for d in find_task_dirs(cfg.source):
        try:
            out.append(load_task_dir(d))
        except TaskFormatError as e:
            out.append((d, e))
    return out


def _format_error_row(task_dir: str, e) -> dict:
    return {"task": os.path.basename(os.path.normpath(task_dir)) or e.file, "family": "-",
            "format": "-", "turns": "-", "expected": None, "verdict": "FORMAT ERROR",
            "why": str(e), "seconds": 0.0}


def check_task(task, cfg) -> dict:
    """Run one task's reference solution and verifier; a row of the table."""
    from terminal_rsi.tasks import (
        EnvironmentUnavailable,
        VerifierError,
        open_task_sandbox,
        run_solution,
        verify,
    )

    row = {"task": task.id, "family": task.family, "format": task.format, "turns": task.turns,
           "expected": task.expected_checks}
    t0 = time.monotonic()
    try:
        if not task.solution:
            raise EnvironmentUnavailable("the task has no reference solution")
        with open_task_sandbox(task, cfg.backend, allow_plain=cfg.allow_plain_sandbox) as sb:
            run_solution(task, sb)
            res = verify(task, sb, backend=cfg.backend, mode=cfg.mode or None,
                         pytest_runtime=cfg.pytest_runtime)
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


def format_table(rows) -> str:
    head = ("task", "family", "fmt", "turns", "S", "P", "N", "exp", "verdict", "s")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        vals = (r["task"], r["family"], r["format"], r["turns"], r.get("S", "-"), r.get("P", "-"),
                r.get("N", "-"), r["expected"] if r["expected"] is not None else "-",
                r["verdict"], f"{r['seconds']:.2f}")
        lines.append("| " + " | ".join(str(v) for v in vals) + " |")
    n_pass = sum(r["verdict"] == "PASS" for r in rows)
    lines.append(f"\n{n_pass}/{len(rows)} tasks pass")
    return "\n".join(lines)


def run(config: ml_collections.ConfigDict, workdir: str) -> list[dict]:
    cfg = config.tasks
    tasks = _load(cfg)
    rows = []
    for task in tasks:
        if isinstance(task, tuple):
            task_dir, error = task
            rows.append(_format_error_row(task_dir, error))
            print(f"== {rows[-1]['task']}: FORMAT ERROR ({error})")
            continue
        row = check_task(task, cfg)
        rows.append(row)
        print(f"== {task.id} [{task.format}, {task.family}]: {row['verdict']}"
              + (f" ({row['why']})" if row.get("why") else ""))
        if cfg.show_reports and "report" in row:
            print(json.dumps({k: row["report"][k] for k in (
                "valid", "strict_success", "passed", "total", "hygiene_checks", "problems",
                "warnings")}, indent=None))
    table = format_table(rows)
    print(table)
    os.makedirs(workdir, exist_ok=True)
    atomic_write_json(os.path.join(workdir, "results.json"), rows)
    bad = [r["task"] for r in rows if r["verdict"] != "PASS"]
    if bad and cfg.fail_on_error:
        raise TaskCheckFailed(f"{len(bad)} task(s) did not pass: {', '.join(bad[:10])}")
    return rows
