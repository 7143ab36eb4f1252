"""Load Terminal-Bench task directories, described as Terminal-Bench's harness runs them.

Layout::

    my-task/
      task.yaml            instruction, max_agent_timeout_sec, max_test_timeout_sec,
                           parser_name ("pytest"), difficulty, category, tags, ...
      docker-compose.yaml  the environment: the agent works in the service `client`, built
                           from its `build` (usually this directory's Dockerfile)
      Dockerfile           the client's image (FROM ..., WORKDIR /app, COPY ..., RUN ...)
      run-tests.sh         the test runner: copied with tests/ into /tests and run there
      tests/               test_outputs.py and data
      solution.sh | solution.yaml   the reference solution

What the harness does, and what the loaders say of it (Terminal-Bench's
terminal_bench/harness/harness.py, handlers/trial_handler.py, agents/oracle_agent.py,
terminal/docker_compose_manager.py):

* `docker compose` with the T_BENCH_* variables (`compose.terminal_bench_vars`); the
  Environment describes the `client` service (`compose.read_compose`).
* After the agent, run-tests.sh and the contents of tests/ are copied into /tests of the
  agent's container and `bash /tests/run-tests.sh` runs there, in a second shell session
  (or the agent's own with `run_tests_in_same_shell: true`): a verifier of kind
  "terminal-bench" in shared mode, graded by pytest's `-rA` summary in its output
  (`parser_name` must be "pytest"). Without run-tests.sh: kind "pytest" over tests/ at
  /tests.
* The oracle copies solution.sh to /oracle and types `bash /oracle/solution.sh`
  (`Task.oracle`); a solution.yaml's commands are typed one by one (`Task.solution`).

Every file is read through `_files.TaskDir` (nothing outside the task directory, no links,
sizes capped; see the limits in `terminal_rsi.tasks.spec`).
"""

from __future__ import annotations

import os

import yaml

from terminal_rsi.tasks import _files, compose
from terminal_rsi.tasks.spec import (
    DIFFICULTIES,
    MAX_INSTRUCTION_BYTES,
    MAX_TIMEOUT_S,
    TERMINAL_BENCH_ORACLE_DIR,
    TESTS_DIR,
    Environment,
    Metadata,
    Oracle,
    Task,
    TaskFormatError,
    VerifierSpec,
    text_problem,
)

TASK_FILE = "task.yaml"
RUN_TESTS = "run-tests.sh"
SOLUTION_SH = "solution.sh"
DEFAULT_AGENT_TIMEOUT = 360.0
DEFAULT_TEST_TIMEOUT = 60.0
# Terminal-Bench's task.yaml keys (its Task model, and `descriptions`/`test_scripts` of
# earlier releases), and this project's own (`family`, `expected_checks`, `verifier_live`:
# the tests query a service the agent left running, `VerifierSpec.live`)
KNOWN_KEYS = {
    "instruction", "descriptions", "author_name", "author_email", "difficulty", "category",
    "tags", "parser_name", "max_agent_timeout_sec", "max_test_timeout_sec",
    "run_tests_in_same_shell", "disable_asciinema", "estimated_duration_sec",
    "expert_time_estimate_min", "junior_time_estimate_min", "test_scripts", "family",
    "expected_checks", "verifier_live",
}
NETWORK_WARNING = (
    "Terminal-Bench runs the task's containers with network access; this loader runs it "
    "offline (Environment.network is False), so steps that download (pip, uv, curl or apt "
    "in run-tests.sh or the solution) fail unless the image already holds what they fetch")
SAME_SHELL_WARNING = (
    "run_tests_in_same_shell: Terminal-Bench types run-tests.sh into the agent's own shell "
    "session; here it runs in the agent's container (mode 'shared'), not in that session")


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


def _decode(td: _files.TaskDir, rel: str, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TaskFormatError(td.path(rel), rel, f"not UTF-8 text ({e})") from None


def _solution_yaml(td: _files.TaskDir) -> tuple[str, ...]:
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
    return tuple(cmds)


def _solution(td: _files.TaskDir, env: dict[str, str]
              ) -> tuple[tuple[tuple[str, ...], ...], Oracle | None]:
    """Task.solution and Task.oracle: solution.sh is copied to /oracle and run with bash
    (its text is also the one-turn solution); solution.yaml's commands are the solution."""
    if td.exists(SOLUTION_SH):
        data = td.read_bytes(SOLUTION_SH, SOLUTION_SH)
        text = _decode(td, SOLUTION_SH, data)
        oracle = Oracle(files={SOLUTION_SH: data}, dir=TERMINAL_BENCH_ORACLE_DIR,
                        command=f"bash {TERMINAL_BENCH_ORACLE_DIR}/{SOLUTION_SH}", env=env)
        return ((text,),), oracle
    if td.exists("solution.yaml"):
        return (_solution_yaml(td),), None
    return (), None


def _environment(td: _files.TaskDir, task_id: str, warnings: list[str]
                 ) -> tuple[Environment, dict[str, str]]:
    """The Environment of the `client` service, and the service's own `environment`."""
    rel, notes = compose.find_compose(td, "", "Terminal-Bench")
    warnings += notes
    if rel is None:
        dockerfile = "Dockerfile" if td.exists("Dockerfile") else None
        warnings.append(
            "no docker-compose.yaml, which Terminal-Bench needs: the Dockerfile is built "
            "with the task directory as its context, as Terminal-Bench's usual client "
            "service does" if dockerfile else "no docker-compose.yaml (which Terminal-Bench "
            "needs) and no Dockerfile: the task runs in the default sandbox image")
        return compose.environment(td, dockerfile=dockerfile, context=""), {}
    svc = compose.read_compose(td, rel, compose.terminal_bench_vars(task_id),
                               compose.TERMINAL_BENCH_SERVICE, required=True)
    warnings += svc.warnings
    env = compose.environment(
        td, dockerfile=svc.dockerfile, context=svc.context, compose_file=rel, env=svc.env,
        workdir=svc.workdir, image=svc.image, services=svc.services,
        agent_service=svc.name, sidecars=svc.sidecars, volumes=svc.volumes)
    return env, dict(svc.env)


def _tests(td: _files.TaskDir, budget: _files.TreeBudget, *, required: bool
           ) -> dict[str, bytes]:
    if not td.exists("tests"):
        if required:
            raise TaskFormatError(td.path("tests"), None, "missing: the verifier's tests/ "
                                  "directory")
        return {}
    return td.read_tree("tests", "tests", budget=budget)


def _verifier(td: _files.TaskDir, cfg: dict, file: str, warnings: list[str]) -> VerifierSpec:
    """run-tests.sh and tests/ at /tests, `bash /tests/run-tests.sh` in the agent's
    container (without run-tests.sh: pytest over tests/ at /tests)."""
    timeout = _files.number(cfg.get("max_test_timeout_sec"), file, "max_test_timeout_sec",
                            default=DEFAULT_TEST_TIMEOUT, hi=MAX_TIMEOUT_S)
    budget = _files.TreeBudget(f"{td.path('tests')}/ and {RUN_TESTS}")
    live = cfg.get("verifier_live", False)
    if not isinstance(live, bool):
        raise TaskFormatError(file, "verifier_live", "expected true or false (true: the "
                              "tests query a service the agent left running)")
    common = dict(mode="shared", tests_dir=TESTS_DIR, env={"TEST_DIR": TESTS_DIR},
                  timeout_s=timeout, live=live)
    if not td.exists(RUN_TESTS):
        tests = _tests(td, budget, required=True)
        if not any(os.path.basename(p).startswith("test") and p.endswith(".py")
                   for p in tests):
            raise TaskFormatError(td.path("tests"), None, "has no test_*.py file for pytest "
                                  "to collect (and there is no run-tests.sh)")
        return VerifierSpec(kind="pytest", files=tests, **common)
    runner = td.read_bytes(RUN_TESTS, RUN_TESTS, budget=budget)
    tests = _tests(td, budget, required=False)
    if RUN_TESTS in tests:
        warnings.append(f"tests/{RUN_TESTS} replaces {RUN_TESTS} in {TESTS_DIR}, as "
                        "Terminal-Bench's copy (the task's file first, then tests/) does")
    return VerifierSpec(kind="terminal-bench", files={RUN_TESTS: runner, **tests},
                        command=f"bash {TESTS_DIR}/{RUN_TESTS}", **common)


def _config(td: _files.TaskDir, file: str) -> dict:
    if not td.exists(TASK_FILE):
        raise TaskFormatError(file, None, "missing: a Terminal-Bench task needs task.yaml")
    cfg = _load_yaml(td, TASK_FILE)
    if not isinstance(cfg, dict):
        raise TaskFormatError(file, None, "the top level must be a mapping")
    parser = _files.string(cfg.get("parser_name"), file, "parser_name", default="pytest")
    if parser != "pytest":
        raise TaskFormatError(file, "parser_name", f"{parser!r} is not supported; only "
                              "'pytest' (its `-rA` summary is the verdict)")
    if not isinstance(cfg.get("run_tests_in_same_shell", False), bool):
        raise TaskFormatError(file, "run_tests_in_same_shell", "expected true or false")
    return cfg


def _metadata(cfg: dict, file: str) -> tuple[Metadata, int | None]:
    difficulty = _files.string(cfg.get("difficulty"), file, "difficulty", default="unknown")
    if difficulty not in DIFFICULTIES:
        raise TaskFormatError(file, "difficulty", f"{difficulty!r}; choose one of {DIFFICULTIES}")
    expected = cfg.get("expected_checks")
    if expected is not None and (isinstance(expected, bool) or not isinstance(expected, int)
                                 or expected < 1):
        raise TaskFormatError(file, "expected_checks", "expected a positive integer")
    meta = Metadata(difficulty=difficulty,
                    category=_files.string(cfg.get("category"), file, "category", default=""),
                    tags=_files.string_list(cfg.get("tags"), file, "tags"))
    return meta, expected


def _config_warnings(cfg: dict) -> list[str]:
    out = [f"task.yaml: {str(k)[:80]!r} is not a Terminal-Bench key; it is ignored"
           for k in cfg if k not in KNOWN_KEYS]
    if cfg.get("run_tests_in_same_shell"):
        out.append(SAME_SHELL_WARNING)
    return [*out, NETWORK_WARNING]


def load_terminal_bench_task(root: str) -> Task:
    """Load one Terminal-Bench task directory (TaskFormatError names file and field)."""
    td = _files.TaskDir(root)
    root, task_id = td.given, os.path.basename(td.given)
    file = td.path(TASK_FILE)
    cfg = _config(td, file)
    instruction = _instruction(cfg, file)
    metadata, expected = _metadata(cfg, file)
    warnings = _config_warnings(cfg)
    verifier = _verifier(td, cfg, file, warnings)
    env, service_env = _environment(td, task_id, warnings)
    solution, oracle = _solution(td, service_env)
    family = _files.string(cfg.get("family") or cfg.get("category"), file, "family",
                           default=task_id)
    return Task(
        id=task_id, family=family or task_id, instruction=instruction, environment=env,
        verifier=verifier, solution=solution,
        agent_timeout_s=_files.number(cfg.get("max_agent_timeout_sec"), file,
                                      "max_agent_timeout_sec", default=DEFAULT_AGENT_TIMEOUT,
                                      hi=MAX_TIMEOUT_S),
        metadata=metadata, expected_checks=expected, format="terminal-bench", source=root,
        oracle=oracle, warnings=warnings,
    )
