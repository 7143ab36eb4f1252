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
"""

from __future__ import annotations

import os

from terminal_rsi.tasks import _files
from terminal_rsi.tasks.spec import (
    DIFFICULTIES,
    Environment,
    Metadata,
    Task,
    TaskFormatError,
    VerifierSpec,
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
    return os.path.isfile(os.path.join(path, TASK_FILE))


def _load_yaml(path: str):
    import yaml  # PyYAML; imported where used

    text = _files.read_text(path)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise TaskFormatError(path, None, f"not valid YAML: {e}") from None
    return data


def _instruction(cfg: dict, file: str) -> str:
    if "instruction" in cfg:
        return _files.string(cfg["instruction"], file, "instruction", required=True)
    descs = cfg.get("descriptions")
    if descs is None:
        raise TaskFormatError(file, "instruction", "is required (the public task text)")
    if not isinstance(descs, list):
        raise TaskFormatError(file, "descriptions", "expected a list of {key, description}")
    for i, d in enumerate(descs):
        if isinstance(d, dict) and d.get("key", "base") == "base":
            return _files.string(d.get("description"), file, f"descriptions[{i}].description",
                                 required=True)
    raise TaskFormatError(file, "descriptions", "has no entry with key 'base'")


def _solution(root: str) -> tuple[tuple[str, ...], ...]:
    sh = os.path.join(root, "solution.sh")
    sy = os.path.join(root, "solution.yaml")
    if os.path.isfile(sh):
        return ((_files.read_text(sh, "solution.sh"),),)
    if os.path.isfile(sy):
        data = _load_yaml(sy)
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


def environment_from_dockerfile(dockerfile: str | None, *, compose: str | None = None,
                                **resources) -> Environment:
    if dockerfile is None:
        return Environment(compose_file=compose, **resources)
    df = _files.parse_dockerfile(dockerfile)
    return Environment(
        dockerfile=dockerfile, compose_file=compose, files=df.files, workdir=df.workdir,
        base_image=df.base_image, setup=df.setup, env=df.env, unsupported=df.unsupported,
        **resources,
    )


def load_terminal_bench_task(root: str) -> Task:
    """Load one Terminal-Bench task directory (TaskFormatError names file and field)."""
    root = os.path.abspath(root)
    file = os.path.join(root, TASK_FILE)
    if not os.path.isfile(file):
        raise TaskFormatError(file, None, "missing: a Terminal-Bench task needs task.yaml")
    cfg = _load_yaml(file)
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
    if expected is not None and (not isinstance(expected, int) or expected < 1):
        raise TaskFormatError(file, "expected_checks", "expected a positive integer")
    tests_dir = os.path.join(root, "tests")
    if not os.path.isdir(tests_dir):
        raise TaskFormatError(tests_dir, None, "missing: the verifier's tests/ directory")
    tests = _files.read_tree(tests_dir, what="tests/")
    if not any(os.path.basename(p).startswith("test") and p.endswith(".py") for p in tests):
        raise TaskFormatError(tests_dir, None, "has no test_*.py file for pytest to collect")
    dockerfile = os.path.join(root, "Dockerfile")
    compose = None
    for name in ("docker-compose.yaml", "docker-compose.yml"):
        if os.path.isfile(os.path.join(root, name)):
            compose = os.path.join(root, name)
    env = environment_from_dockerfile(dockerfile if os.path.isfile(dockerfile) else None,
                                      compose=compose)
    return Task(
        id=os.path.basename(root),
        family=str(cfg.get("family") or cfg.get("category") or os.path.basename(root)),
        instruction=instruction,
        environment=env,
        verifier=VerifierSpec(
            kind="pytest",
            mode="shared" if same_shell else "separate",
            files=tests,
            timeout_s=_files.number(cfg.get("max_test_timeout_sec"), file,
                                    "max_test_timeout_sec", default=DEFAULT_TEST_TIMEOUT),
        ),
        solution=_solution(root),
        agent_timeout_s=_files.number(cfg.get("max_agent_timeout_sec"), file,
                                      "max_agent_timeout_sec", default=DEFAULT_AGENT_TIMEOUT),
        metadata=Metadata(
            difficulty=difficulty,
            category=_files.string(cfg.get("category"), file, "category", default=""),
            tags=_files.string_list(cfg.get("tags"), file, "tags"),
        ),
        expected_checks=expected,
        format="terminal-bench",
        source=root,
    )
