"""The task spec (paper §2.1): a public instruction x, an environment, a protected verifier V_x.

A `Task` is immutable. Everything the agent may see is `instruction` and the
seeded workspace (`environment.files`, plus whatever the image holds); the
`verifier` (tests, command) and the `solution` are private and never enter the
agent's sandbox during an episode (see `terminal_rsi.tasks.verify`).

Loaders build Tasks from task directories (`terminal_bench.load_terminal_bench_task`,
`harbor.load_harbor_task`); the built-in families build them procedurally
(`terminal_rsi.tasks.builtin`). Every format problem raises `TaskFormatError`
naming the file and the field.

Limits: a task directory is untrusted input (downloaded from the internet), so what a task
may ask for is bounded by the constants below. The loaders refuse a task past them with a
`TaskFormatError` naming file and field; `Task`, `Environment` and `VerifierSpec` check the
same bounds when constructed, so a task built in code cannot bypass them.
"""

from __future__ import annotations

import dataclasses
import math
import posixpath
from collections.abc import Callable, Mapping
from typing import Any

from terminal_rsi.sandbox.base import text_problem
from terminal_rsi.sandbox.compose import HEALTHCHECK_KEYS

VERIFIER_MODES = ("separate", "shared")
# how long a scripted solution waits for each command typed into a terminal session (a
# command still running then keeps running while the next one is typed, as ahead-typing)
SESSION_SOLUTION_WAIT_S = 5.0
# the metadata tag of a task that needs a persistent terminal session (its solution is
# keystrokes; `terminal_rsi.tasks.verify.run_solution` types it into one)
TERMINAL_TAG = "terminal"
# "pytest": pytest + pytest-json-ctrf over the tests; "script": a shell command whose verdict
# is reward.txt / reward.json (Harbor's tests/test.sh); "terminal-bench": a shell command
# (Terminal-Bench's run-tests.sh) whose verdict is pytest's `-rA` summary in its output, as
# Terminal-Bench's own pytest parser reads it; "builtin": a Python check function.
VERIFIER_KINDS = ("pytest", "script", "terminal-bench", "builtin")
DIFFICULTIES = ("easy", "medium", "hard", "unknown")
FORMATS = ("terminal-bench", "harbor", "builtin")

# The public instruction x, in UTF-8 bytes: it is part of every prompt of an episode.
MAX_INSTRUCTION_BYTES = 256 * 1024
# Agent and verifier wall-clock budgets lie in (0, MAX_TIMEOUT_S] seconds (finite).
MAX_TIMEOUT_S = 24 * 3600.0
# Resource requests of an environment: memory (<= 256 GiB), storage (<= 1 TiB), CPUs.
MAX_MEMORY_MB = 256 * 1024
MAX_STORAGE_MB = 1024 * 1024
MAX_CPUS = 256
# Files of one task tree: the verifier's tests, or everything a Dockerfile COPYs into the
# workspace (all its COPY/ADD lines together): at most this many files and bytes. The
# loaders refuse a bigger tree before reading past the cap.
MAX_TREE_FILES = 10_000
MAX_TREE_BYTES = 64 * 1024 * 1024
# Directory levels below the top of such a tree.
MAX_TREE_DEPTH = 32
# One text file the loaders parse or keep as text (task.yaml, task.toml, Dockerfile,
# solution.sh, solution.yaml).
MAX_TEXT_FILE_BYTES = 1024 * 1024
# One environment variable of a task (a Dockerfile ENV, `[verifier] env`): name and value.
MAX_ENV_VALUE_BYTES = 32 * 1024
MAX_ENV_ENTRIES = 256
# Where the verifier's tests, its logs and the oracle's solution go in a task's own container
# (Terminal-Bench and Harbor write these absolute paths in their scripts; nothing is
# rewritten). Terminal-Bench copies solution.sh to /oracle, Harbor the solution/ dir to
# /solution.
TESTS_DIR = "/tests"
VERIFIER_LOGS_DIR = "/logs/verifier"
HARBOR_SOLUTION_DIR = "/solution"
TERMINAL_BENCH_ORACLE_DIR = "/oracle"


class TaskFormatError(ValueError):
    """A task directory or task definition is malformed; the message names file and field."""

    def __init__(self, file: str, field: str | None, message: str):
        self.file = str(file)
        self.field = field
        where = f"{self.file}" + (f": field {field!r}" if field else "")
        super().__init__(f"{where}: {message}")


class EnvironmentUnavailable(RuntimeError):
    """The task's environment needs something this machine cannot provide (a base image
    that is not present and cannot be pulled here, a backend that cannot honour the task's
    paths, no Docker engine, ...). Not the task's fault: it may run elsewhere."""


class EnvironmentBuildFailed(RuntimeError):
    """The task's own environment does not build (its Dockerfile fails on the engine, or the
    build runs past the task's build timeout): the task is broken, not the machine."""


class FrozenMap(Mapping):
    """A read-only mapping that pickles (tasks travel to rollout workers)."""

    __slots__ = ("_d",)

    def __init__(self, data: Mapping | None = None):
        object.__setattr__(self, "_d", dict(data or {}))

    def __getitem__(self, key):
        return self._d[key]

    def __iter__(self):
        return iter(self._d)

    def __len__(self):
        return len(self._d)

    def __eq__(self, other):
        return isinstance(other, Mapping) and dict(self._d) == dict(other)

    def __hash__(self):
        return hash(tuple(sorted(self._d)))

    def __repr__(self):
        return f"FrozenMap({self._d!r})"

    def __reduce__(self):
        return (FrozenMap, (self._d,))


def _frozen_map(m: Mapping | None) -> Mapping:
    return m if isinstance(m, FrozenMap) else FrozenMap(m)


def env_problem(name: Any, value: Any) -> str | None:
    """What makes `name=value` unfit as an environment variable of a task (None: fine)."""
    if not (isinstance(name, str) and name and name.isascii()
            and (name[0].isalpha() or name[0] == "_")
            and all(c.isalnum() or c == "_" for c in name)):
        return f"{str(name)[:80]!r} is not a valid variable name ([A-Za-z_][A-Za-z0-9_]*)"
    problem = text_problem(value, MAX_ENV_VALUE_BYTES)
    return f"the value of {name} {problem}" if problem else None


def number_problem(value: Any, hi: float, *, integer: bool = False) -> str | None:
    """What makes `value` unfit as a positive, finite number <= `hi` (None: fine)."""
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        return f"expected {'an integer' if integer else 'a number'}, got {_show(value)}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number, got {value!r}"
    if not value > 0:
        return f"must be > 0, got {value!r}"
    if value > hi:
        return f"must be at most {hi:g}, got {_show(value)}"
    return None


def tree_problem(files: Mapping) -> str | None:
    """What makes a {relative path: bytes} tree unfit (None: fine): a path that is not
    relative or leaves its root, contents that are not bytes, or the tree caps."""
    if len(files) > MAX_TREE_FILES:
        return f"holds {len(files)} files; the limit is {MAX_TREE_FILES}"
    total = 0
    for path, data in files.items():
        if not isinstance(path, str) or not path or "\0" in path or path.startswith("/"):
            return f"path {_show(path)} is not a relative path"
        norm = posixpath.normpath(path)
        if norm == ".." or norm.startswith("../"):
            return f"path {_show(path)} leaves its directory"
        if not isinstance(data, bytes | bytearray):
            return f"the contents of {_show(path)} are not bytes"
        total += len(data)
    if total > MAX_TREE_BYTES:
        return f"holds {total} bytes; the limit is {MAX_TREE_BYTES}"
    return None


def _show(value: Any, limit: int = 80) -> str:
    """repr(value), cut to `limit` characters (error messages stay short)."""
    try:
        text = repr(value) if not isinstance(value, int) or abs(value) < 10**30 else \
            f"an integer of {len(str(abs(value)))} digits"
    except ValueError:  # an int past Python's digit limit
        text = "a very large integer"
    return text if len(text) <= limit else text[:limit] + "..."


@dataclasses.dataclass(frozen=True)
class Sidecar:
    """A service of a multi-container task beside the agent's (a compose service), as the
    task's compose file gives it: built from `dockerfile` in `context` (absolute paths inside
    the task directory) or started from `image`; its environment, command and entrypoint
    (None: the image's), working directory (None: the image's) and compose healthcheck
    (keys `HEALTHCHECK_KEYS`; None: none)."""

    name: str
    dockerfile: str | None = None
    context: str | None = None
    image: str | None = None
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    command: tuple[str, ...] | None = None
    entrypoint: tuple[str, ...] | None = None
    workdir: str | None = None
    healthcheck: Mapping[str, Any] | None = None

    def __post_init__(self):
        object.__setattr__(self, "env", _frozen_map(self.env))
        if self.healthcheck is not None:
            object.__setattr__(self, "healthcheck", _frozen_map(self.healthcheck))
        where = f"service {self.name}"
        if not isinstance(self.name, str) or not self.name:
            raise TaskFormatError(where, "name", "expected a non-empty service name")
        if self.dockerfile is None and not self.image:
            raise TaskFormatError(where, "build", "a service needs a build or an image")
        for key in ("command", "entrypoint"):
            words = getattr(self, key)
            if words is not None and not (isinstance(words, tuple)
                                          and all(isinstance(w, str) for w in words)):
                raise TaskFormatError(where, key, "expected a tuple of strings")
        if self.healthcheck is not None and set(self.healthcheck) - set(HEALTHCHECK_KEYS):
            raise TaskFormatError(where, "healthcheck", f"unknown keys "
                                  f"{sorted(set(self.healthcheck) - set(HEALTHCHECK_KEYS))}")
        if self.workdir is not None and not _absolute_path(self.workdir):
            raise TaskFormatError(where, "working_dir", f"expected an absolute path, got "
                                  f"{_show(self.workdir)}")
        _check_env(self.env, where, "environment")


@dataclasses.dataclass(frozen=True)
class Environment:
    """Where the agent works.

    Attributes:
      image: a Docker image tag to start from (None: the default sandbox image).
      dockerfile: path of a Dockerfile to build (its directory is the build context).
      compose_file: path of a docker-compose file, if the task declares one.
      files: workspace-relative path -> bytes, seeded into the workspace at start.
      modes: workspace-relative path -> file mode for seeded files that need one (e.g. 0o755).
      workdir: the working directory the task sets at run time (compose working_dir, Harbor
        [environment] workdir); None: the image's WORKDIR.
      cpus, memory_mb, storage_mb, network: resource requests (None: sandbox defaults).
      base_image: the Dockerfile's FROM image.
      setup: shell commands run in the workspace before the agent starts (a Dockerfile's
        RUN lines when the environment is reproduced in a local sandbox).
      env: environment variables the task sets for the agent's commands at run time (compose
        `environment`, Harbor's [environment] env; a built-in task's own), on top of the
        image's.
      unsupported: Dockerfile steps a local sandbox cannot reproduce (reported plainly).
      context: the build context directory of `dockerfile` (None: the Dockerfile's directory).
      build_timeout_s: wall-clock limit of building the image (None: the builder's default).
      services: the compose file's service names (more than one: a multi-container setup).
      agent_service: the compose service the agent works in.
      sidecars: the other services (`Sidecar`), started before the agent's.
      volumes: (task-directory-relative source, absolute target) of the agent service's
        bind mounts from inside its build context: copied into the container at start.
      gpus: GPUs the task asks for (0: none).
    """

    image: str | None = None
    dockerfile: str | None = None
    compose_file: str | None = None
    files: Mapping[str, bytes] = dataclasses.field(default_factory=dict)
    modes: Mapping[str, int] = dataclasses.field(default_factory=dict)
    workdir: str | None = None
    cpus: float | None = None
    memory_mb: int | None = None
    storage_mb: int | None = None
    network: bool = False
    base_image: str | None = None
    setup: tuple[str, ...] = ()
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    unsupported: tuple[str, ...] = ()
    context: str | None = None
    build_timeout_s: float | None = None
    services: tuple[str, ...] = ()
    agent_service: str | None = None
    gpus: int = 0
    sidecars: tuple[Sidecar, ...] = ()
    volumes: tuple[tuple[str, str], ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "volumes", tuple(tuple(v) for v in self.volumes))
        for source, target in self.volumes:
            if not (isinstance(source, str) and not source.startswith("/")
                    and _absolute_path(target)):
                raise TaskFormatError(self.dockerfile or "Environment", "volumes",
                                      f"expected (relative source, absolute target), got "
                                      f"{_show((source, target))}")
        object.__setattr__(self, "services", tuple(self.services))
        object.__setattr__(self, "sidecars", tuple(self.sidecars))
        if not all(isinstance(s, Sidecar) for s in self.sidecars):
            raise TaskFormatError(self.dockerfile or "Environment", "sidecars",
                                  "expected Sidecar services")
        object.__setattr__(self, "files", _frozen_map(self.files))
        object.__setattr__(self, "modes", _frozen_map(self.modes))
        object.__setattr__(self, "env", _frozen_map(self.env))
        object.__setattr__(self, "setup", tuple(self.setup))
        object.__setattr__(self, "unsupported", tuple(self.unsupported))
        where = self.dockerfile or "Environment"
        for name, hi, integer in (("cpus", MAX_CPUS, False), ("memory_mb", MAX_MEMORY_MB, True),
                                  ("storage_mb", MAX_STORAGE_MB, True)):
            value = getattr(self, name)
            problem = None if value is None else number_problem(value, hi, integer=integer)
            if problem:
                raise TaskFormatError(where, name, problem)
        if not isinstance(self.network, bool):
            raise TaskFormatError(where, "network", f"expected true or false, got "
                                  f"{_show(self.network)}")
        problem = tree_problem(self.files)
        if problem:
            raise TaskFormatError(where, "files", problem)
        for path, mode in self.modes.items():
            if isinstance(mode, bool) or not isinstance(mode, int) or not 0 <= mode <= 0o7777:
                raise TaskFormatError(where, "modes", f"{_show(path)}: bad file mode "
                                      f"{_show(mode)}")
        _check_env(self.env, where, "env")
        for name in ("setup", "unsupported", "services"):
            if not all(isinstance(c, str) for c in getattr(self, name)):
                raise TaskFormatError(where, name, "expected strings")
        if self.build_timeout_s is not None:
            problem = number_problem(self.build_timeout_s, MAX_TIMEOUT_S)
            if problem:
                raise TaskFormatError(where, "build_timeout_s", f"{problem} seconds")
        if isinstance(self.gpus, bool) or not isinstance(self.gpus, int) or self.gpus < 0:
            raise TaskFormatError(where, "gpus", f"expected an integer >= 0, got "
                                  f"{_show(self.gpus)}")
        if self.workdir is not None and not _absolute_path(self.workdir):
            raise TaskFormatError(where, "workdir", f"expected an absolute path, got "
                                  f"{_show(self.workdir)}")

    @property
    def needs_build(self) -> bool:
        return self.dockerfile is not None

    @property
    def multi_container(self) -> bool:
        return len(self.services) > 1 or bool(self.sidecars)


@dataclasses.dataclass(frozen=True)
class VerifierSpec:
    """The protected verifier V_x (never visible to the agent).

    Attributes:
      kind: "pytest" (pytest + pytest-json-ctrf over `files`), "script" (a shell command,
        e.g. Harbor's tests/test.sh, that writes reward.json/reward.txt and optionally a
        CTRF report into the logs directory: /logs/verifier, or $TRSI_LOGS_DIR in the
        workspace layout), "terminal-bench" (a shell command, run-tests.sh, whose pytest -rA
        summary is the verdict) or "builtin" (a Python check function).
      mode: "separate" (default: a fresh sandbox gets the workspace artifacts and the
        tests) or "shared" (tests are copied into the agent's sandbox after it finished).
      files: test files, relative to the tests directory ($TEST_DIR in the sandbox).
      command: for "script": the shell command to run (relative paths from the tests dir);
        for "pytest": extra pytest arguments (may be empty).
      timeout_s: hard limit on the verifier run; running past it is a VerifierError.
      artifacts: workspace paths copied into the verifier sandbox in separate mode.
      env: extra environment for the verifier command.
      check: for "builtin": `check(snapshot, run, processes) -> list[CheckResult]` (see
        builtin.core): `processes` is what ran in the agent's sandbox as the host saw it
        before the agent was stopped (`Sandbox.processes`; shared mode only, else ()).
      live: shared mode only: the checks query a service the agent left running, so its
        processes keep running while the verifier runs (default False: they are stopped
        before the tests are placed). The tests, HOME and verdict still belong to the
        verifier; what the live processes can still touch is listed in docs/tasks.md.
      tests_dir: the absolute path the tests go to (`TESTS_DIR` for Terminal-Bench and
        Harbor tasks, whose scripts name it); "": a fresh `.trsi_verifier_<hex>/tests`
        directory in the workspace ($TEST_DIR).
    """

    kind: str = "pytest"
    mode: str = "separate"
    files: Mapping[str, bytes] = dataclasses.field(default_factory=dict)
    command: str = ""
    timeout_s: float = 120.0
    artifacts: tuple[str, ...] = (".",)
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    check: Callable[..., Any] | None = dataclasses.field(default=None, compare=False)
    tests_dir: str = ""
    live: bool = False

    def __post_init__(self):
        object.__setattr__(self, "files", _frozen_map(self.files))
        object.__setattr__(self, "env", _frozen_map(self.env))
        object.__setattr__(self, "artifacts", tuple(self.artifacts))
        where = "VerifierSpec"
        if self.tests_dir and not _absolute_path(self.tests_dir):
            raise TaskFormatError(where, "tests_dir", f"expected an absolute path, got "
                                  f"{_show(self.tests_dir)}")
        if self.kind not in VERIFIER_KINDS:
            raise TaskFormatError(where, "kind", f"VerifierSpec.kind = {_show(self.kind)}; "
                                  f"choose one of {VERIFIER_KINDS}")
        if self.mode not in VERIFIER_MODES:
            raise TaskFormatError(where, "mode", f"VerifierSpec.mode = {_show(self.mode)}; "
                                  f"choose one of {VERIFIER_MODES}")
        problem = number_problem(self.timeout_s, MAX_TIMEOUT_S)
        if problem:
            raise TaskFormatError(where, "timeout_s", f"VerifierSpec.timeout_s {problem} "
                                  "seconds")
        problem = tree_problem(self.files)
        if problem:
            raise TaskFormatError(where, "files", problem)
        if not isinstance(self.command, str):
            raise TaskFormatError(where, "command", "expected a string")
        _check_env(self.env, where, "env")
        if not isinstance(self.live, bool):
            raise TaskFormatError(where, "live", f"expected a bool, got {_show(self.live)}")
        if self.live and self.mode != "shared":
            raise TaskFormatError(where, "live", "a live verifier checks the agent's running "
                                  "environment: it needs mode='shared'")
        if self.kind == "builtin" and self.check is None:
            raise TaskFormatError(where, "check", "a builtin verifier needs a check function")


@dataclasses.dataclass(frozen=True)
class Oracle:
    """How a task's own tools run its reference solution (private, never in the agent's
    sandbox): `files` go to the absolute directory `dir` (Harbor's whole solution/ at
    /solution, Terminal-Bench's solution.sh at /oracle), then `command` runs in the agent's
    terminal, in the task's working directory, with `env` added."""

    files: Mapping[str, bytes] = dataclasses.field(default_factory=dict)
    dir: str = HARBOR_SOLUTION_DIR
    command: str = ""
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "files", _frozen_map(self.files))
        object.__setattr__(self, "env", _frozen_map(self.env))
        where = "Oracle"
        problem = tree_problem(self.files)
        if problem:
            raise TaskFormatError(where, "files", problem)
        if not _absolute_path(self.dir):
            raise TaskFormatError(where, "dir", f"expected an absolute path, got "
                                  f"{_show(self.dir)}")
        if not isinstance(self.command, str) or not self.command.strip():
            raise TaskFormatError(where, "command", "expected a non-empty shell command")
        _check_env(self.env, where, "env")


@dataclasses.dataclass(frozen=True)
class Metadata:
    difficulty: str = "unknown"
    category: str = ""
    tags: tuple[str, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "tags", tuple(self.tags))


@dataclasses.dataclass(frozen=True)
class Task:
    """One task: public instruction, environment, private verifier and reference solution.

    Attributes:
      id: unique id (directory name, or "<family>/<seed>" for built-ins).
      family: task family (the key of the family divisor table D_f).
      instruction: the public instruction x shown to the agent.
      environment: see `Environment`.
      verifier: see `VerifierSpec` (private).
      solution: reference solution, one tuple of shell commands per agent turn (private).
        A solution script is one turn with one command (its whole text).
      agent_timeout_s: wall-clock budget for the agent's episode.
      metadata: difficulty, category, tags.
      expected_checks: the number of non-hygiene checks N the verifier should report
        (None: unknown); `configs/verify_tasks.py` compares it with the report.
      turns: minimum number of agent turns the task needs by construction (1 unless the
        agent must read something in the sandbox before it can act).
      format: "terminal-bench", "harbor" or "builtin".
      source: the task directory, if loaded from disk.
      seed: instance seed for procedurally generated tasks.
      oracle: how the task's own tools run its reference solution (files placed at an
        absolute path, a command); None: `solution`'s commands are the oracle.
      warnings: what the loader saw but does not use (fields it ignores), in words.
    """

    id: str
    family: str
    instruction: str
    environment: Environment = dataclasses.field(default_factory=Environment)
    verifier: VerifierSpec = dataclasses.field(default_factory=VerifierSpec)
    solution: tuple[tuple[str, ...], ...] = ()
    agent_timeout_s: float = 600.0
    metadata: Metadata = dataclasses.field(default_factory=Metadata)
    expected_checks: int | None = None
    turns: int = 1
    format: str = "builtin"
    source: str | None = None
    seed: int | None = None
    oracle: Oracle | None = None
    warnings: tuple[str, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "solution", tuple(tuple(t) for t in self.solution))
        object.__setattr__(self, "warnings", tuple(self.warnings))
        if not self.id or not isinstance(self.id, str):
            raise TaskFormatError(self.source or "Task", "id", "Task.id must be a non-empty "
                                  "string")
        where = self.source or f"task {self.id}"
        problem = text_problem(self.instruction, MAX_INSTRUCTION_BYTES)
        if problem:
            raise TaskFormatError(where, "instruction", f"the instruction {problem}")
        if not self.instruction.strip():
            raise TaskFormatError(where, "instruction", f"task {self.id}: the instruction is "
                                  "empty")
        if not isinstance(self.family, str) or not self.family:
            raise TaskFormatError(where, "family", "expected a non-empty string")
        if self.format not in FORMATS:
            raise TaskFormatError(where, "format", f"Task.format = {_show(self.format)}; "
                                  f"choose one of {FORMATS}")
        if not isinstance(self.environment, Environment):
            raise TaskFormatError(where, "environment", "expected an Environment")
        if not isinstance(self.verifier, VerifierSpec):
            raise TaskFormatError(where, "verifier", "expected a VerifierSpec")
        problem = number_problem(self.agent_timeout_s, MAX_TIMEOUT_S)
        if problem:
            raise TaskFormatError(where, "agent_timeout_s", f"{problem} seconds")
        if isinstance(self.turns, bool) or not isinstance(self.turns, int) or self.turns < 1:
            raise TaskFormatError(where, "turns", f"task {self.id}: turns must be >= 1")
        if self.expected_checks is not None and number_problem(
                self.expected_checks, float("inf"), integer=True):
            raise TaskFormatError(where, "expected_checks", "expected a positive integer, got "
                                  f"{_show(self.expected_checks)}")
        if not all(isinstance(c, str) for turn in self.solution for c in turn):
            raise TaskFormatError(where, "solution", "expected turns of command strings")
        if self.oracle is not None and not isinstance(self.oracle, Oracle):
            raise TaskFormatError(where, "oracle", "expected an Oracle")
        if not all(isinstance(w, str) for w in self.warnings):
            raise TaskFormatError(where, "warnings", "expected strings")


def _absolute_path(path: Any) -> bool:
    """Whether `path` is a normalized absolute POSIX path (a trailing slash allowed)."""
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path or len(path) > 4096:
        return False
    return path == "/" or posixpath.normpath(path) == path.rstrip("/")


def _check_env(env: Mapping, where: str, field: str) -> None:
    if len(env) > MAX_ENV_ENTRIES:
        raise TaskFormatError(where, field, f"has {len(env)} entries; the limit is "
                              f"{MAX_ENV_ENTRIES}")
    for k, v in env.items():
        problem = env_problem(k, v)
        if problem:
            raise TaskFormatError(where, field, problem)
