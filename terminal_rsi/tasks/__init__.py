"""Tasks and protected verifiers (paper §2.1): Terminal-Bench and Harbor task directories,
CTRF verification, and the built-in procedural suite. See docs/tasks.md.

    from terminal_rsi.tasks import get_suite, open_task_sandbox, run_solution, verify
    for task in get_suite("builtin", "train", n_per_family=2):
        with open_task_sandbox(task, "local") as sb:
            run_solution(task, sb)
            result = verify(task, sb, backend="local")     # result.report: P, N, S
"""

from terminal_rsi.tasks.harbor import load_harbor_task, load_task_dir, load_task_dirs
from terminal_rsi.tasks.registry import SPLITS, get_suite, pool_tasks
from terminal_rsi.tasks.spec import (
    Environment,
    EnvironmentBuildFailed,
    EnvironmentUnavailable,
    Metadata,
    Task,
    TaskFormatError,
    VerifierSpec,
)
from terminal_rsi.tasks.terminal_bench import load_terminal_bench_task
from terminal_rsi.tasks.verify import (
    CheckResult,
    VerificationResult,
    VerifierError,
    ctrf_document,
    open_task_sandbox,
    run_oracle,
    run_reference,
    run_solution,
    task_sandbox_factory,
    verify,
)

__all__ = [
    "SPLITS", "CheckResult", "Environment", "EnvironmentBuildFailed", "EnvironmentUnavailable",
    "Metadata", "Task",
    "TaskFormatError", "VerificationResult", "VerifierError", "VerifierSpec", "ctrf_document",
    "get_suite",
    "pool_tasks", "load_harbor_task", "load_task_dir", "load_task_dirs",
    "load_terminal_bench_task", "open_task_sandbox", "run_oracle", "run_reference",
    "run_solution", "task_sandbox_factory", "verify",
]
