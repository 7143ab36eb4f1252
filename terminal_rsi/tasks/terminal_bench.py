"""Load Terminal-Bench task directories.

Layout::

    my-task/
      task.yaml            instruction, max_agent_timeout_sec, max_test_timeout_sec,
                           parser_name ("pytest"), difficulty, category, tags, ...
      Dockerfile           the environment (FROM ..., WORKDIR /app, COPY ..., RUN ...)
      docker-compose.yaml  optional (multi-container setups are reported as unavailable)
      run-tests.sh         the upstream test runner (kept for reference; see below)
      tests/               test_outputs.py and data, copied in after the agent finished
      solution.sh | solution.yaml   the reference solution

The verifier is pytest with the pytest-json-ctrf plugin over `tests/` (the upstream
`run-tests.sh` usually installs pytest over the network, which sandboxes here cannot
do; `parser_name` must be "pytest"). `run_tests_in_same_shell: true` selects shared mode.

Every file is read through `_files.TaskDir` (nothing outside the task directory, no links,
sizes capped; see the limits in `terminal_rsi.tasks.spec`).
"""

from __future__ import annotations

import os

import yaml

from terminal_rsi.tasks import _files
from terminal_rsi.tasks.spec import (
    DIFFICULTIES,
    MAX_INSTRUCTION_BYTES,
    MAX_TIMEOUT_S,
    Environment,
    Metadata,
    Task,
    TaskFormatError,
    VerifierSpec,
    text_problem,
)

TASK_FILE = "task.yaml"
DEFAULT_AGENT_TIMEOUT = 360.0
DEFAULT_TEST_TIMEOUT = 60.0
KNOWN_KEYS = {
    "instruction", "descriptions", "author_name", "author_email", "difficulty", "category",
    "tags", "parser_name", "max_agent_timeout_sec", "max_test_timeout_sec",
    "run_tests_in_same_shell", "disable_asciinema", "estimated_duration_sec",
    "expert_time_estimate_min", "junior_time_estimate_min", "test_scripts", "family",
    "expected_checks",
}


def is_terminal_bench_dir(path: str) -> bool:
    """Whether `path` holds a task.yaml (a link counts, so that loading refuses it by name)."""
    return os.path.lexists(os.path.join(path, TASK_FILE))


def _load_yaml(td: _files.TaskDir, rel: str):
    path = td.path(rel)
    text = td.read_text(rel, None)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise TaskFormatError(path, None, f"not valid YAML: {e}") from None
    except (RecursionError, ValueError) as e:  # nesting past the parser's stack, huge ints
        raise TaskFormatError(path, None, f"not usable YAML ({type(e).__name__}: "
                              f"{str(e)[:200]})") from None


def _checked_instruction(text: str, file: str, field: str) -> str:
    problem = text_problem(text, MAX_INSTRUCTION_BYTES)
    if problem:
        raise TaskFormatError(file, field, f"the instruction {problem}")
    return text


def _instruction(cfg: dict, file: str) -> str:
    if "instruction" in cfg:
        return _checked_instruction(
            _files.string(cfg["instruction"], file, "instruction", required=True), file,
            "instruction")
    descs = cfg.get("descriptions")
    if descs is None:
        raise TaskFormatError(file, "instruction", "is required (the public task text)")
    if not isinstance(descs, list):
        raise TaskFormatError(file, "descriptions", "expected a list of {key, description}")
    for i, d in enumerate(descs):
        if isinstance(d, dict) and d.get("key", "base") == "base":
            field = f"descriptions[{i}].description"
            return _checked_instruction(
                _files.string(d.get("description"), file, field, required=True), file, field)
    raise TaskFormatError(file, "descriptions", "has no entry with key 'base'")


def _solution(td: _files.TaskDir) -> tuple[tuple[str, ...], ...]:
    if td.exists("solution.sh"):
        return ((td.read_text("solution.sh", "solution.sh"),),)
    if td.exists("solution.yaml"):
        sy = td.path("solution.yaml")
        data = _load_yaml(td, "solution.yaml")
        if not isinstance(data, list):
            raise TaskFormatError(sy, None, "expected a list of {command: ...} entries")
        cmds = []
        for i, entry in enumerate(data):
            if isinstance(entry, str):
                cmds.append(entry)
            elif isinstance(entry, dict) and isinstance(entry.get("command"), str):
                cmds.append(entry["command"].rstrip("\n"))
            else:
                raise TaskFormatError(sy, f"[{i}].command", "each entry needs a command string")
        return (tuple(cmds),)
    return ()


def environment_from_dockerfile(td: _files.TaskDir, dockerfile: str | None, *,
                                compose: str | None = None, **resources) -> Environment:
    """The Environment of a task: `dockerfile` and `compose` are paths relative to the task
    directory `td` (None: none); `resources` are Environment fields (cpus, memory_mb...)."""
    compose_path = td.path(compose) if compose else None
    if dockerfile is None:
        return Environment(compose_file=compose_path, **resources)
    df = _files.parse_dockerfile(td, dockerfile)
    return Environment(
        dockerfile=td.path(dockerfile), compose_file=compose_path, files=df.files,
        workdir=df.workdir, base_image=df.base_image, setup=df.setup, env=df.env,
        unsupported=df.unsupported, **resources,
    )


def load_terminal_bench_task(root: str) -> Task:
    """Load one Terminal-Bench task directory (TaskFormatError names file and field)."""
    td = _files.TaskDir(root)
    root = td.given
    file = td.path(TASK_FILE)
    if not td.exists(TASK_FILE):
        raise TaskFormatError(file, None, "missing: a Terminal-Bench task needs task.yaml")
    cfg = _load_yaml(td, TASK_FILE)
    if not isinstance(cfg, dict):
        raise TaskFormatError(file, None, "the top level must be a mapping")
    instruction = _instruction(cfg, file)
    parser = _files.string(cfg.get("parser_name"), file, "parser_name", default="pytest")
    if parser != "pytest":
        raise TaskFormatError(file, "parser_name", f"{parser!r} is not supported; only "
                              "'pytest' (graded through pytest-json-ctrf)")
    difficulty = _files.string(cfg.get("difficulty"), file, "difficulty", default="unknown")
    if difficulty not in DIFFICULTIES:
        raise TaskFormatError(file, "difficulty", f"{difficulty!r}; choose one of {DIFFICULTIES}")
    same_shell = cfg.get("run_tests_in_same_shell", False)
    if not isinstance(same_shell, bool):
        raise TaskFormatError(file, "run_tests_in_same_shell", "expected true or false")
    expected = cfg.get("expected_checks")
    if expected is not None and (isinstance(expected, bool) or not isinstance(expected, int)
                                 or expected < 1):
        raise TaskFormatError(file, "expected_checks", "expected a positive integer")
    tests_dir = td.path("tests")
    if not td.exists("tests"):
        raise TaskFormatError(tests_dir, None, "missing: the verifier's tests/ directory")
    tests = td.read_tree("tests", "tests", budget=_files.TreeBudget(f"{tests_dir}/"))
    if not any(os.path.basename(p).startswith("test") and p.endswith(".py") for p in tests):
        raise TaskFormatError(tests_dir, None, "has no test_*.py file for pytest to collect")
    compose = None
    for name in ("docker-compose.yaml", "docker-compose.yml"):
        if td.exists(name):
            td.read_bytes(name, "docker-compose")  # a regular file inside the task directory
            compose = name
    env = environment_from_dockerfile(td, "Dockerfile" if td.exists("Dockerfile") else None,
                                      compose=compose)
    family = _files.string(cfg.get("family") or cfg.get("category"), file, "family",
                           default=os.path.basename(root))
    return Task(
        id=os.path.basename(root),
        family=family or os.path.basename(root),
        instruction=instruction,
        environment=env,
        verifier=VerifierSpec(
            kind="pytest",
            mode="shared" if same_shell else "separate",
            files=tests,
            timeout_s=_files.number(cfg.get("max_test_timeout_sec"), file,
                                    "max_test_timeout_sec", default=DEFAULT_TEST_TIMEOUT,
                                    hi=MAX_TIMEOUT_S),
        ),
        solution=_solution(td),
        agent_timeout_s=_files.number(cfg.get("max_agent_timeout_sec"), file,
                                      "max_agent_timeout_sec", default=DEFAULT_AGENT_TIMEOUT,
                                      hi=MAX_TIMEOUT_S),
        metadata=Metadata(
            difficulty=difficulty,
            category=_files.string(cfg.get("category"), file, "category", default=""),
            tags=_files.string_list(cfg.get("tags"), file, "tags"),
        ),
        expected_checks=expected,
        format="terminal-bench",
        source=root,
    )
