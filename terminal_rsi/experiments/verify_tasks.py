"""Experiment "verify_tasks": check tasks as a task author would.

    python experiments/run.py --config=configs/verify_tasks.py --workdir=/tmp/vt
    python experiments/run.py --config=configs/verify_tasks.py \
        --config.tasks.source=path/to/tasks --config.tasks.split=all

For each task: start its environment in a sandbox, run the reference solution, run the
protected verifier (`terminal_rsi.tasks.check_tasks.check_task`), print the report, and
finally a table with each task's verdict: PASS, FAIL, UNAVAILABLE (its environment cannot
be provided here: a base image or the engine missing, a backend that cannot honour its
paths) or ERROR (it does not load, its image does not build, its verifier crashes), with
the reason. A task passes when its reference solution is strictly successful (S = 1,
P = N) and N equals the task's expected check count (if it declares one). One task never
stops the run.
`results.json` in the workdir holds every report; the run raises `TaskCheckFailed` if any
task failed and `tasks.fail_on_error` is set.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence

from terminal_rsi.config.sections import Sandboxes, Seeded
from terminal_rsi.runtime.atomic import atomic_write_json
from terminal_rsi.settings import setting
from terminal_rsi.tasks.check_tasks import (
    VERDICTS,
    TaskCheckFailed,
    check_task,
    format_error_row,
    load_tasks,
)
from terminal_rsi.tasks.registry import SPLITS

REPORT_KEYS = ("valid", "strict_success", "passed", "total", "hygiene_checks", "problems",
               "warnings")


@dataclasses.dataclass(frozen=True)
class CheckedTasks(Sandboxes):
    """The tasks to check, where their sandboxes run and what the run prints."""

    source: str = setting("builtin", "'builtin' or a directory of Terminal-Bench/Harbor task "
                          "dirs")
    split: str = setting("all", "train | validation | test | heldout_families | all "
                         "(directories: all)", choices=SPLITS)
    n_per_family: int = setting(1, "built-in instances per family", lo=1)
    families: tuple[str, ...] = setting((), "built-in families to check (empty: all in the "
                                        "split)")
    mode: str = setting("", "verifier mode override ('' = the task's own)",
                        choices=("", "separate", "shared"))
    pytest_runtime: str = setting("auto", "copy the host's pytest into sandboxes lacking it",
                                  choices=("auto", "inject", "sandbox"))
    show_reports: bool = setting(False, "print each verifier report")
    fail_on_error: bool = setting(True, "raise at the end (after results.json) if any task "
                                  "is FAIL or ERROR (UNAVAILABLE is not the task's fault)")


@dataclasses.dataclass(frozen=True)
class VerifyTasksConfig(Seeded):
    """Run every task's reference solution and verifier."""

    # task directories from disk are untrusted: no plain-subprocess fallback unless asked for
    tasks: CheckedTasks = CheckedTasks(allow_plain_sandbox="never")


CONFIG = VerifyTasksConfig


def run(config: VerifyTasksConfig, workdir: str) -> list[dict]:
    """Check every task, print a line per task and the table, write `results.json`."""
    cfg = config.tasks
    rows = []
    for task in load_tasks(cfg.source, cfg.split, n_per_family=cfg.n_per_family,
                           families=cfg.families):
        if isinstance(task, tuple):
            task_dir, error = task
            rows.append(format_error_row(task_dir, error))
            print(f"== {rows[-1]['task']}: ERROR ({rows[-1]['why']})")
            continue
        row = check_task(task, cfg.backend, allow_plain=cfg.allow_plain_sandbox,
                         allow_network=cfg.allow_network, mode=cfg.mode or None,
                         pytest_runtime=cfg.pytest_runtime)
        rows.append(row)
        print(f"== {task.id} [{task.format}, {task.family}]: {row['verdict']}"
              + (f" ({row['why']})" if row.get("why") else ""))
        for warning in task.warnings:
            print(f"   warning: {warning}")
        if cfg.show_reports and "report" in row:
            print(json.dumps({k: row["report"][k] for k in REPORT_KEYS}, indent=None))
    print(format_table(rows))
    os.makedirs(workdir, exist_ok=True)
    atomic_write_json(os.path.join(workdir, "results.json"), rows)
    bad = [r["task"] for r in rows if r["verdict"] in ("FAIL", "ERROR")]
    if bad and cfg.fail_on_error:
        raise TaskCheckFailed(f"{len(bad)} task(s) failed or are broken: {', '.join(bad[:10])}"
                              f" (every verdict: {os.path.join(workdir, 'results.json')})")
    return rows


def format_table(rows: Sequence[dict]) -> str:
    """The task rows as a Markdown table and a pass count."""
    head = ("task", "family", "fmt", "turns", "S", "P", "N", "exp", "verdict", "s")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        vals = (r["task"], r["family"], r["format"], r["turns"], r.get("S", "-"), r.get("P", "-"),
                r.get("N", "-"), r["expected"] if r["expected"] is not None else "-",
                r["verdict"], f"{r['seconds']:.2f}")
        lines.append("| " + " | ".join(str(v) for v in vals) + " |")
    counts = {v: sum(r["verdict"] == v for r in rows) for v in VERDICTS}
    lines.append(f"\n{counts['PASS']}/{len(rows)} tasks pass ("
                 + ", ".join(f"{n} {v}" for v, n in counts.items() if n) + ")")
    return "\n".join(lines)
