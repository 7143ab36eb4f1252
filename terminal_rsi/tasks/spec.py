"""The task spec (paper §2.1): a public instruction x, an environment, a protected verifier V_x.

A `Task` is immutable. Everything the agent may see is `instruction` and the
seeded workspace (`environment.files`, plus whatever the image holds); the
`verifier` (tests, command) and the `solution` are private and never enter the
agent's sandbox during an episode (see `terminal_rsi.tasks.verify`).

Loaders build Tasks from task directories (`terminal_bench.load_terminal_bench_task`,
`harbor.load_harbor_task`); the built-in families build them procedurally
(`terminal_rsi.tasks.builtin`). Every format problem raises `TaskFormatError`
naming the file and the field.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

VERIFIER_MODES = ("separate", "shared")
VERIFIER_KINDS = ("pytest", "script", "builtin")
DIFFICULTIES = ("easy", "medium", "hard", "unknown")
FORMATS = ("terminal-bench", "harbor", "builtin")


class TaskFormatError(ValueError):
    """A task directory or task definition is malformed; the message names file and field."""

    def __init__(self, file: str, field: str | None, message: str):
        self.file = str(file)
        self.field = field
        where = f"{self.file}" + (f": field {field!r}" if field else "")
        super().__init__(f"{where}: {message}")


class EnvironmentUnavailable(RuntimeError):
    """The task's environment needs something this machine cannot provide (an image that
    cannot be built or pulled here, a multi-container compose setup, ...)."""


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


@dataclasses.dataclass(frozen=True)
class Environment:
    """Where the agent works.

    Attributes:
      image: a Docker image tag to start from (None: the default sandbox image).
      dockerfile: path of a Dockerfile to build (its directory is the build context).
      compose_file: path of a docker-compose file, if the task declares one.
      files: workspace-relative path -> bytes, seeded into the workspace at start.
      modes: workspace-relative path -> file mode for seeded files that need one (e.g. 0o755).
      workdir: the working directory the task's own files assume (e.g. "/app"); the
        sandbox's workspace stands in for it.
      cpus, memory_mb, storage_mb, network: resource requests (None: sandbox defaults).
      base_image: the Dockerfile's FROM image.
      setup: shell commands run in the workspace before the agent starts (a Dockerfile's
        RUN lines when the environment is reproduced in a local sandbox).
      env: environment variables for the agent's commands (a Dockerfile's ENV lines).
      unsupported: Dockerfile steps a local sandbox cannot reproduce (reported plainly).
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

    def __post_init__(self):
        object.__setattr__(self, "files", _frozen_map(self.files))
        object.__setattr__(self, "modes", _frozen_map(self.modes))
        object.__setattr__(self, "env", _frozen_map(self.env))
        object.__setattr__(self, "setup", tuple(self.setup))
        object.__setattr__(self, "unsupported", tuple(self.unsupported))

    @property
    def needs_build(self) -> bool:
        return self.dockerfile is not None


@dataclasses.dataclass(frozen=True)
class VerifierSpec:
    """The protected verifier V_x (never visible to the agent).

    Attributes:
      kind: "pytest" (pytest + pytest-json-ctrf over `files`), "script" (a shell command,
        e.g. Harbor's tests/test.sh, that may write reward.txt/reward.json and a CTRF
        report into $TRSI_LOGS_DIR), or "builtin" (a Python check function).
      mode: "separate" (default: a fresh sandbox gets the workspace artifacts and the
        tests) or "shared" (tests are copied into the agent's sandbox after it finished).
      files: test files, relative to the tests directory ($TEST_DIR in the sandbox).
      command: for "script": the shell command to run (relative paths from the tests dir);
        for "pytest": extra pytest arguments (may be empty).
      timeout_s: hard limit on the verifier run; running past it is a VerifierError.
      artifacts: workspace paths copied into the verifier sandbox in separate mode.
      env: extra environment for the verifier command.
      check: for "builtin": `check(snapshot, run) -> list[CheckResult]` (see builtin.core).
    """

    kind: str = "pytest"
    mode: str = "separate"
    files: Mapping[str, bytes] = dataclasses.field(default_factory=dict)
    command: str = ""
    timeout_s: float = 120.0
    artifacts: tuple[str, ...] = (".",)
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    check: Callable[..., Any] | None = dataclasses.field(default=None, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "files", _frozen_map(self.files))
        object.__setattr__(self, "env", _frozen_map(self.env))
        object.__setattr__(self, "artifacts", tuple(self.artifacts))
        if self.kind not in VERIFIER_KINDS:
            raise ValueError(f"VerifierSpec.kind = {self.kind!r}; choose one of {VERIFIER_KINDS}")
        if self.mode not in VERIFIER_MODES:
            raise ValueError(f"VerifierSpec.mode = {self.mode!r}; choose one of {VERIFIER_MODES}")
        if not (isinstance(self.timeout_s, int | float) and self.timeout_s > 0):
            raise ValueError(f"VerifierSpec.timeout_s must be > 0, got {self.timeout_s!r}")
        if self.kind == "builtin" and self.check is None:
            raise ValueError("a builtin verifier needs a check function")


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

    def __post_init__(self):
        object.__setattr__(self, "solution", tuple(tuple(t) for t in self.solution))
        if not self.id or not isinstance(self.id, str):
            raise ValueError("Task.id must be a non-empty string")
        if not isinstance(self.instruction, str) or not self.instruction.strip():
            raise ValueError(f"task {self.id}: the instruction is empty")
        if self.format not in FORMATS:
            raise ValueError(f"Task.format = {self.format!r}; choose one of {FORMATS}")
        if self.turns < 1:
            raise ValueError(f"task {self.id}: turns must be >= 1")
