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
"""

from __future__ import annotations

import os
import re
import tomllib

from terminal_rsi.tasks import _files
from terminal_rsi.tasks.spec import (
    DIFFICULTIES,
    Metadata,
    Task,
    TaskFormatError,
    VerifierSpec,
)
from terminal_rsi.tasks.terminal_bench import environment_from_dockerfile

TASK_FILE = "task.toml"
DEFAULT_AGENT_TIMEOUT = 600.0
DEFAULT_VERIFIER_TIMEOUT = 600.0
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*$", re.IGNORECASE)
_TESTS_PATH = re.compile(r"(?<![\w./$-])/tests(?=/|\b)")
_LOGS_PATH = re.compile(r"(?<![\w./$-])/logs/verifier(?=/|\b)")


def is_harbor_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, TASK_FILE))


def _section(cfg: dict, name: str, file: str) -> dict:
    value = cfg.get(name, {})
    if not isinstance(value, dict):
        raise TaskFormatError(file, name, "expected a TOML table [" + name + "]")
    return value


def _megabytes(value, file: str, field: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return int(value)
    if isinstance(value, str):
        m = _SIZE.match(value)
        if m:
            scale = {"": 1 / 2**20, "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024**2}
            return max(1, int(float(m.group(1)) * scale[m.group(2).upper()]))
    raise TaskFormatError(file, field, f"expected megabytes or a size like '4G', got {value!r}")


def rewrite_harbor_paths(script: str) -> str:
    """Point Harbor's absolute verifier paths at the sandbox's verifier directories."""
    script = _LOGS_PATH.sub("${TRSI_LOGS_DIR}", script)
    return _TESTS_PATH.sub("${TEST_DIR}", script)


def load_harbor_task(root: str) -> Task:
    """Load one Harbor task directory (TaskFormatError names file and field)."""
    root = os.path.abspath(root)
    file = os.path.join(root, TASK_FILE)
    if not os.path.isfile(file):
        raise TaskFormatError(file, None, "missing: a Harbor task needs task.toml")
    try:
        with open(file, "rb") as f:
            cfg = tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise TaskFormatError(file, None, f"not valid TOML: {e}") from None
    instruction = _files.read_text(os.path.join(root, "instruction.md"), "instruction")
    if not instruction.strip():
        raise TaskFormatError(os.path.join(root, "instruction.md"), "instruction", "is empty")
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
    venv = ver.get("env", {})
    if not isinstance(venv, dict) or not all(isinstance(v, str) for v in venv.values()):
        raise TaskFormatError(file, "verifier.env", "expected a table of strings")
    expected = meta.get("expected_checks")
    if expected is not None and (not isinstance(expected, int) or expected < 1):
        raise TaskFormatError(file, "metadata.expected_checks", "expected a positive integer")

    tests_dir = os.path.join(root, "tests")
    test_sh = os.path.join(tests_dir, "test.sh")
    if not os.path.isfile(test_sh):
        raise TaskFormatError(test_sh, "verifier", "missing: a Harbor task needs tests/test.sh")
    tests = _files.read_tree(tests_dir, what="tests/")
    command = rewrite_harbor_paths(tests["test.sh"].decode("utf-8", errors="replace"))

    dockerfile = os.path.join(root, "environment", "Dockerfile")
    compose = os.path.join(root, "environment", "docker-compose.yaml")
    resources = dict(
        image=_files.string(envc.get("docker_image"), file, "environment.docker_image"),
        cpus=_files.number(envc.get("cpus"), file, "environment.cpus"),
        memory_mb=_megabytes(envc.get("memory_mb", envc.get("memory")), file,
                             "environment.memory_mb"),
        storage_mb=_megabytes(envc.get("storage_mb", envc.get("storage")), file,
                              "environment.storage_mb"),
        network=bool(envc.get("allow_internet", False)),
    )
    env = environment_from_dockerfile(
        dockerfile if os.path.isfile(dockerfile) else None,
        compose=compose if os.path.isfile(compose) else None, **resources)
    if env.dockerfile is None and env.image is None:
        pass  # the default sandbox image
    solve = os.path.join(root, "solution", "solve.sh")
    solution = ((_files.read_text(solve, "solution"),),) if os.path.isfile(solve) else ()
    name = _files.string(task_t.get("name"), file, "task.name", default=None)
    return Task(
        id=os.path.basename(root),
        family=str(meta.get("family") or meta.get("category") or name or os.path.basename(root)),
        instruction=instruction,
        environment=env,
        verifier=VerifierSpec(
            kind="script",
            mode=mode,
            files=tests,
            command=command,
            timeout_s=_files.number(ver.get("timeout_sec"), file, "verifier.timeout_sec",
                                    default=DEFAULT_VERIFIER_TIMEOUT),
            env=venv,
        ),
        solution=solution,
        agent_timeout_s=_files.number(agent.get("timeout_sec"), file, "agent.timeout_sec",
                                      default=DEFAULT_AGENT_TIMEOUT),
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
    from terminal_rsi.tasks.terminal_bench import is_terminal_bench_dir, load_terminal_bench_task

    if is_harbor_dir(path):
        return load_harbor_task(path)
    if is_terminal_bench_dir(path):
        return load_terminal_bench_task(path)
    raise TaskFormatError(path, None, "not a task directory: expected task.toml (Harbor) or "
                          "task.yaml (Terminal-Bench)")


def find_task_dirs(root: str) -> list[str]:
    """`root` itself if it is a task directory, else the task directories right below it."""
    if is_harbor_dir(root) or os.path.isfile(os.path.join(root, "task.yaml")):
        return [root]
    if not os.path.isdir(root):
        raise TaskFormatError(root, None, "no such directory")
    out = [os.path.join(root, n) for n in sorted(os.listdir(root))
           if os.path.isdir(os.path.join(root, n)) and (
               is_harbor_dir(os.path.join(root, n))
               or os.path.isfile(os.path.join(root, n, "task.yaml")))]
    if not out:
        raise TaskFormatError(root, None, "contains no task directories (task.toml/task.yaml)")
    return out


def load_task_dirs(root: str) -> list[Task]:
    """Load `root` itself if it is a task directory, else every task directory below it."""
    return [load_task_dir(d) for d in find_task_dirs(root)]
