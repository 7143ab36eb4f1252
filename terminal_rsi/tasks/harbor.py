"""Load Harbor task directories.

Layout::

    my-task/
      instruction.md          the public instruction
      task.toml               [metadata] difficulty/category/tags, [verifier] timeout_sec/env,
                              [agent] timeout_sec, [environment] docker_image/cpus/memory_mb/
                              storage_mb/allow_internet (also memory = "4G", storage = "10G")
      environment/Dockerfile  the environment (optional when docker_image is set)
      tests/test.sh           the verifier: writes reward.txt or reward.json (and optionally a
                              CTRF report ctrf.json) into /logs/verifier
      solution/solve.sh       the reference solution

The reward file is the terminal verdict S = 1{r >= 1}; a CTRF report next to it gives
P and N. In the sandbox the tests live in $TEST_DIR and the logs in $TRSI_LOGS_DIR: the
loader rewrites the absolute `/tests` and `/logs/verifier` paths in test.sh to those
variables. `[verifier] mode = "shared"` (an extension) runs the tests in the agent's
sandbox; the default is a separate verifier sandbox that receives the workspace.

Every file is read through `_files.TaskDir` (nothing outside the task directory, no links,
sizes capped); timeouts, memory, storage and CPUs are bounded (see the limits in
`terminal_rsi.tasks.spec`): `memory = "9999999G"` is refused naming the field.
"""

from __future__ import annotations

import math
import os
import re
import tomllib

from terminal_rsi.tasks import _files
from terminal_rsi.tasks.spec import (
    DIFFICULTIES,
    MAX_CPUS,
    MAX_INSTRUCTION_BYTES,
    MAX_MEMORY_MB,
    MAX_STORAGE_MB,
    MAX_TIMEOUT_S,
    Metadata,
    Task,
    TaskFormatError,
    VerifierSpec,
    text_problem,
)
from terminal_rsi.tasks.terminal_bench import (
    environment_from_dockerfile,
    is_terminal_bench_dir,
    load_terminal_bench_task,
)

TASK_FILE = "task.toml"
DEFAULT_AGENT_TIMEOUT = 600.0
DEFAULT_VERIFIER_TIMEOUT = 600.0
_SIZE = re.compile(r"^\s*(\d{1,30}(?:\.\d{1,30})?)\s*([KMGT]?)i?B?\s*$", re.IGNORECASE)
_TESTS_PATH = re.compile(r"(?<![\w./$-])/tests(?=/|\b)")
_LOGS_PATH = re.compile(r"(?<![\w./$-])/logs/verifier(?=/|\b)")


def is_harbor_dir(path: str) -> bool:
    """Whether `path` holds a task.toml (a link counts, so that loading refuses it by name)."""
    return os.path.lexists(os.path.join(path, TASK_FILE))


def _section(cfg: dict, name: str, file: str) -> dict:
    value = cfg.get(name, {})
    if not isinstance(value, dict):
        raise TaskFormatError(file, name, "expected a TOML table [" + name + "]")
    return value


def _megabytes(value, file: str, field: str, hi: int) -> int | None:
    """Megabytes from a number of MB or a size like "4G" (at most `hi` MB)."""
    if value is None:
        return None
    mb = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        mb = value
    elif isinstance(value, str):
        m = _SIZE.match(value)
        if m:
            scale = {"": 1 / 2**20, "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024**2}
            mb = max(1.0, float(m.group(1)) * scale[m.group(2).upper()])
    if mb is None:
        raise TaskFormatError(file, field, f"expected megabytes or a size like '4G', got "
                              f"{str(value)[:80]!r}")
    if isinstance(mb, float) and not math.isfinite(mb) or not mb > 0:
        raise TaskFormatError(file, field, f"must be a positive, finite size, got {value!r}")
    if mb > hi:
        raise TaskFormatError(file, field, f"{str(value)[:80]!r} is more than the limit of "
                              f"{hi} MB")
    return max(1, int(mb))


def rewrite_harbor_paths(script: str) -> str:
    """Point Harbor's absolute verifier paths at the sandbox's verifier directories."""
    script = _LOGS_PATH.sub("${TRSI_LOGS_DIR}", script)
    return _TESTS_PATH.sub("${TEST_DIR}", script)


def load_harbor_task(root: str) -> Task:
    """Load one Harbor task directory (TaskFormatError names file and field)."""
    td = _files.TaskDir(root)
    root = td.given
    file = td.path(TASK_FILE)
    if not td.exists(TASK_FILE):
        raise TaskFormatError(file, None, "missing: a Harbor task needs task.toml")
    try:
        cfg = tomllib.loads(td.read_text(TASK_FILE, None))
    except tomllib.TOMLDecodeError as e:
        raise TaskFormatError(file, None, f"not valid TOML: {e}") from None
    except (RecursionError, ValueError) as e:  # nesting past the parser's stack, huge ints
        raise TaskFormatError(file, None, f"not usable TOML ({type(e).__name__}: "
                              f"{str(e)[:200]})") from None
    instruction = td.read_text("instruction.md", "instruction", limit=MAX_INSTRUCTION_BYTES)
    problem = text_problem(instruction, MAX_INSTRUCTION_BYTES)
    if problem:
        raise TaskFormatError(td.path("instruction.md"), "instruction", problem)
    if not instruction.strip():
        raise TaskFormatError(td.path("instruction.md"), "instruction", "is empty")
    meta = _section(cfg, "metadata", file)
    ver = _section(cfg, "verifier", file)
    agent = _section(cfg, "agent", file)
    envc = _section(cfg, "environment", file)
    task_t = _section(cfg, "task", file)
    difficulty = _files.string(meta.get("difficulty"), file, "metadata.difficulty",
                               default="unknown")
    if difficulty not in DIFFICULTIES:
        raise TaskFormatError(file, "metadata.difficulty",
                              f"{difficulty!r}; choose one of {DIFFICULTIES}")
    tags = _files.string_list(meta.get("tags", task_t.get("keywords")), file, "metadata.tags")
    mode = _files.string(ver.get("mode"), file, "verifier.mode", default="separate")
    if mode not in ("separate", "shared"):
        raise TaskFormatError(file, "verifier.mode", f"{mode!r}; choose separate or shared")
    venv = _files.env_table(ver.get("env"), file, "verifier.env")
    expected = meta.get("expected_checks")
    if expected is not None and (isinstance(expected, bool) or not isinstance(expected, int)
                                 or expected < 1):
        raise TaskFormatError(file, "metadata.expected_checks", "expected a positive integer")

    tests_dir = td.path("tests")
    if td.kind("tests/test.sh", "verifier") is None:
        raise TaskFormatError(td.path("tests/test.sh"), "verifier",
                              "missing: a Harbor task needs tests/test.sh")
    tests = td.read_tree("tests", "verifier", budget=_files.TreeBudget(f"{tests_dir}/"))
    if "test.sh" not in tests:  # a link, a directory, ...: read it to say which
        td.read_bytes("tests/test.sh", "verifier")
    try:
        command = rewrite_harbor_paths(tests["test.sh"].decode("utf-8"))
    except UnicodeDecodeError as e:
        raise TaskFormatError(td.path("tests/test.sh"), "verifier", f"not UTF-8 text ({e})"
                              ) from None

    network = envc.get("allow_internet", False)
    if not isinstance(network, bool):
        raise TaskFormatError(file, "environment.allow_internet", "expected true or false")
    resources = dict(
        image=_files.string(envc.get("docker_image"), file, "environment.docker_image"),
        cpus=_files.number(envc.get("cpus"), file, "environment.cpus", hi=MAX_CPUS,
                           unit="CPUs"),
        memory_mb=_megabytes(envc.get("memory_mb", envc.get("memory")), file,
                             "environment.memory_mb", MAX_MEMORY_MB),
        storage_mb=_megabytes(envc.get("storage_mb", envc.get("storage")), file,
                              "environment.storage_mb", MAX_STORAGE_MB),
        network=network,
    )
    dockerfile = "environment/Dockerfile"
    compose = "environment/docker-compose.yaml"
    if td.exists(compose):
        td.read_bytes(compose, "docker-compose")  # a regular file inside the task directory
    env = environment_from_dockerfile(
        td, dockerfile if td.exists(dockerfile) else None,
        compose=compose if td.exists(compose) else None, **resources)
    solve = "solution/solve.sh"
    solution = ((td.read_text(solve, "solution"),),) if td.exists(solve) else ()
    name = _files.string(task_t.get("name"), file, "task.name", default=None)
    family = _files.string(meta.get("family") or meta.get("category"), file,
                           "metadata.family", default=None)
    return Task(
        id=os.path.basename(root),
        family=family or name or os.path.basename(root),
        instruction=instruction,
        environment=env,
        verifier=VerifierSpec(
            kind="script",
            mode=mode,
            files=tests,
            command=command,
            timeout_s=_files.number(ver.get("timeout_sec"), file, "verifier.timeout_sec",
                                    default=DEFAULT_VERIFIER_TIMEOUT, hi=MAX_TIMEOUT_S),
            env=venv,
        ),
        solution=solution,
        agent_timeout_s=_files.number(agent.get("timeout_sec"), file, "agent.timeout_sec",
                                      default=DEFAULT_AGENT_TIMEOUT, hi=MAX_TIMEOUT_S),
        metadata=Metadata(
            difficulty=difficulty,
            category=_files.string(meta.get("category"), file, "metadata.category", default=""),
            tags=tags,
        ),
        expected_checks=expected,
        format="harbor",
        source=root,
    )


def load_task_dir(path: str) -> Task:
    """Load a task directory in either format (Harbor if task.toml, else Terminal-Bench)."""
    if is_harbor_dir(path):
        return load_harbor_task(path)
    if is_terminal_bench_dir(path):
        return load_terminal_bench_task(path)
    raise TaskFormatError(path, None, "not a task directory: expected task.toml (Harbor) or "
                          "task.yaml (Terminal-Bench)")


def find_task_dirs(root: str) -> list[str]:
    """`root` itself if it is a task directory, else the task directories right below it.

    `root` is the directory the user named; entries below it are untrusted, so a symbolic
    link among them is refused (TaskFormatError naming it) instead of followed.
    """
    if is_harbor_dir(root) or is_terminal_bench_dir(root):
        return [root]
    if not os.path.isdir(root):
        raise TaskFormatError(root, None, "no such directory")
    out = []
    for n in sorted(os.listdir(root)):
        path = os.path.join(root, n)
        if os.path.islink(path):
            raise TaskFormatError(path, None, "is a symbolic link; task directories in a "
                                  "suite must be real directories (links are refused)")
        if os.path.isdir(path) and (is_harbor_dir(path) or is_terminal_bench_dir(path)):
            out.append(path)
    if not out:
        raise TaskFormatError(root, None, "contains no task directories (task.toml/task.yaml)")
    return out


def load_task_dirs(root: str) -> list[Task]:
    """Load `root` itself if it is a task directory, else every task directory below it."""
    return [load_task_dir(d) for d in find_task_dirs(root)]
