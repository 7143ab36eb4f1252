"""Load Harbor task directories, described as Harbor runs them.

Layout::

    my-task/
      instruction.md          the public instruction
      task.toml               [metadata], [verifier] timeout_sec/env, [agent] timeout_sec,
                              [environment] docker_image/build_timeout_sec/cpus/memory_mb/
                              storage_mb/gpus/allow_internet/env/workdir (also memory = "4G",
                              storage = "10G"), [solution] env
      environment/Dockerfile  the image of the agent's service `main` (build context:
                              environment/); environment/docker-compose.yaml, if present,
                              is applied over Harbor's own compose files
      tests/test.sh           the verifier: writes reward.txt or reward.json (and optionally a
                              CTRF report ctrf.json) into /logs/verifier
      solution/solve.sh       the reference solution (the whole solution/ is the oracle's)

What Harbor does, and what the loader says of it (Harbor's src/harbor/models/task/config.py,
environments/docker/docker.py and its compose files, agents/oracle.py, verifier/verifier.py,
models/trial/paths.py):

* `docker compose` over its build (or prebuilt) file, the task's compose file and its
  infrastructure variables (`compose.harbor_vars`); the Environment describes `main`.
  `[environment] env` goes to every command of a task without a compose file, and only to
  compose's interpolation of one with it.
* tests/ is uploaded to /tests and `bash /tests/test.sh` runs in the agent's container
  (mode "shared"; `[verifier] environment_mode`, or this project's `mode`, may say
  "separate") with `[verifier] env`; nothing in test.sh is rewritten. The verdict is
  /logs/verifier/reward.txt or reward.json. The agent's processes are stopped before the
  tests are placed unless this project's `[verifier] live = true` says the tests query a
  service the agent left running (`VerifierSpec.live`).
* The oracle uploads solution/ to /solution and runs `bash /solution/solve.sh` with
  DEBIAN_FRONTEND=noninteractive and `[solution] env`.
* `${VAR}` / `${VAR:-default}` values of those env tables name variables of the host Harbor
  runs on; this loader reads no host variable (the default, if any, is taken; a warning
  says so).

Every file is read through `_files.TaskDir` (nothing outside the task directory, no links,
sizes capped); timeouts, memory, storage and CPUs are bounded (see the limits in
`terminal_rsi.tasks.spec`): `memory = "9999999G"` is refused naming the field.
"""

from __future__ import annotations

import math
import os
import posixpath
import re
import tomllib

from terminal_rsi.tasks import _files, compose
from terminal_rsi.tasks.spec import (
    DIFFICULTIES,
    HARBOR_SOLUTION_DIR,
    MAX_CPUS,
    MAX_INSTRUCTION_BYTES,
    MAX_MEMORY_MB,
    MAX_STORAGE_MB,
    MAX_TIMEOUT_S,
    TESTS_DIR,
    VERIFIER_MODES,
    Environment,
    Metadata,
    Oracle,
    Task,
    TaskFormatError,
    VerifierSpec,
    text_problem,
)
from terminal_rsi.tasks.terminal_bench import is_terminal_bench_dir, load_terminal_bench_task

TASK_FILE = "task.toml"
DEFAULT_AGENT_TIMEOUT = 600.0
DEFAULT_VERIFIER_TIMEOUT = 600.0
DEFAULT_BUILD_TIMEOUT = 600.0  # Harbor's EnvironmentConfig.build_timeout_sec
ORACLE_ENV = {"DEBIAN_FRONTEND": "noninteractive"}  # what Harbor's OracleAgent adds
NETWORK_MODES = ("public", "no-network", "allowlist")
_SIZE = re.compile(r"^\s*(\d{1,30}(?:\.\d{1,30})?)\s*([KMGT]?)i?B?\s*$", re.IGNORECASE)
_TEMPLATE = re.compile(r"\$\{([^}:]+)(?::-(.*))?\}", re.S)  # Harbor's utils/env.py
# task.toml keys per table ("" = the top level) that this loader uses or, being
# descriptive only, may pass over in silence; Harbor's other keys are warned about as
# unused, anything else as not Harbor's. [metadata] is free-form in Harbor.
_USED = {
    "": {"version", "schema_version", "source", "task", "metadata", "verifier", "agent",
         "environment", "solution"},
    "task": {"name", "keywords", "description", "authors"},
    "verifier": {"timeout_sec", "env", "mode", "environment_mode", "live"},
    "agent": {"timeout_sec"},
    "environment": {"build_timeout_sec", "docker_image", "cpus", "memory_mb", "memory",
                    "storage_mb", "storage", "gpus", "env", "workdir", "allow_internet",
                    "network_mode", "allowed_hosts", "os"},
    "solution": {"env"},
}
_HARBOR_UNUSED = {
    "": {"steps", "artifacts", "multi_step_reward_strategy"},
    "task": set(),
    "verifier": {"user", "network_mode", "allowed_hosts", "environment"},
    "agent": {"user", "network_mode", "allowed_hosts"},
    "environment": {"gpu_types", "tpu", "mcp_servers", "skills_dir", "healthcheck"},
    "solution": set(),
}
NETWORK_DEFAULT_WARNING = (
    "[environment] allow_internet (or network_mode) is not set: Harbor's default is "
    "internet access (allow_internet = true, network_mode = 'public'); this loader runs "
    "the task offline unless task.toml sets allow_internet = true or network_mode = "
    "'public'")


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


def _key_warnings(cfg: dict) -> list[str]:
    """One warning per task.toml key this loader does not use ([metadata] is free-form)."""
    out = []
    for table in ("", "task", "verifier", "agent", "environment", "solution"):
        keys = cfg if not table else cfg.get(table)
        for key in keys if isinstance(keys, dict) else ():
            where = f"[{table}] {key}" if table else str(key)
            if key in _HARBOR_UNUSED[table]:
                out.append(f"task.toml: {where} is not used by this loader")
            elif key not in _USED[table]:
                out.append(f"task.toml: {where} is not a Harbor key; it is ignored")
    return out


def _resolved_env(value, file: str, field: str, warnings: list[str]) -> dict[str, str]:
    """An env table whose `${VAR}` / `${VAR:-default}` values Harbor resolves from its host:
    the default is taken (the host is not read); without one, the variable is left out."""
    out = {}
    for name, text in _files.env_table(value, file, field).items():
        m = _TEMPLATE.fullmatch(text)
        if m is None:
            out[name] = text
            continue
        host, default = m.groups()
        if default is None:
            warnings.append(f"[{field.split('.')[0]}] env: {name} = {text!r} names the "
                            f"host variable {host}, which this loader does not read; "
                            f"{name} is not set")
        else:
            out[name] = default
            warnings.append(f"[{field.split('.')[0]}] env: {name} = {text!r} names the "
                            f"host variable {host}, which this loader does not read; "
                            f"{name} takes the default {default!r}")
    return out


def _network(envc: dict, file: str, warnings: list[str]) -> bool:
    """Environment.network: on only where task.toml asks for internet access explicitly."""
    mode = envc.get("network_mode")
    if mode is not None:
        if mode not in NETWORK_MODES:
            raise TaskFormatError(file, "environment.network_mode", f"{str(mode)[:80]!r}; "
                                  f"choose one of {NETWORK_MODES}")
        if mode == "allowlist":
            hosts = _files.string_list(envc.get("allowed_hosts"), file,
                                       "environment.allowed_hosts")
            warnings.append(f"[environment] network_mode = 'allowlist' ({', '.join(hosts)}): "
                            "no allowlist is enforced here; the task runs offline")
        return mode == "public"
    allow = envc.get("allow_internet")
    if allow is None:
        warnings.append(NETWORK_DEFAULT_WARNING)
        return False
    if not isinstance(allow, bool):
        raise TaskFormatError(file, "environment.allow_internet", "expected true or false")
    return allow


def _gpus(envc: dict, file: str, warnings: list[str]) -> int:
    gpus = envc.get("gpus", 0) or 0
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
        raise TaskFormatError(file, "environment.gpus", f"expected an integer >= 0, got "
                              f"{str(gpus)[:80]!r}")
    if gpus:
        warnings.append(f"[environment] gpus = {gpus}: the task asks for {gpus} GPU(s); no "
                        "GPU is given to sandboxes")
    return gpus


def _workdir(envc: dict, file: str) -> str | None:
    path = _files.string(envc.get("workdir"), file, "environment.workdir")
    if path is None:
        return None
    if not path.startswith("/"):
        raise TaskFormatError(file, "environment.workdir", f"expected an absolute path, got "
                              f"{path[:200]!r}")
    return "/" + posixpath.normpath(path).lstrip("/")


def _resources(envc: dict, file: str, warnings: list[str]) -> dict:
    """The Environment fields of [environment] other than the build and its variables."""
    os_name = envc.get("os", "linux")
    if str(os_name).lower() != "linux":
        warnings.append(f"[environment] os = {str(os_name)[:40]!r}: sandboxes run Linux "
                        "containers only")
    return dict(
        image=_files.string(envc.get("docker_image"), file, "environment.docker_image"),
        cpus=_files.number(envc.get("cpus"), file, "environment.cpus", hi=MAX_CPUS,
                           unit="CPUs"),
        memory_mb=_megabytes(envc.get("memory_mb", envc.get("memory")), file,
                             "environment.memory_mb", MAX_MEMORY_MB),
        storage_mb=_megabytes(envc.get("storage_mb", envc.get("storage")), file,
                              "environment.storage_mb", MAX_STORAGE_MB),
        network=_network(envc, file, warnings),
        gpus=_gpus(envc, file, warnings),
        build_timeout_s=_files.number(envc.get("build_timeout_sec"), file,
                                      "environment.build_timeout_sec", hi=MAX_TIMEOUT_S,
                                      default=DEFAULT_BUILD_TIMEOUT),
    )


def _environment(td: _files.TaskDir, envc: dict, file: str, warnings: list[str]
                 ) -> Environment:
    """The agent's service `main`: built from environment/Dockerfile (context environment/)
    or started from docker_image, with environment/docker-compose.yaml applied over it."""
    fields = _resources(envc, file, warnings)
    task_env = _resolved_env(envc.get("env"), file, "environment.env", warnings)
    workdir = _workdir(envc, file)
    dockerfile = "environment/Dockerfile" if td.exists("environment/Dockerfile") else None
    rel, notes = compose.find_compose(td, "environment", "Harbor")
    warnings += notes
    if rel is None:
        return compose.environment(td, dockerfile=dockerfile, context="environment",
                                   env=task_env, workdir=workdir,
                                   services=(compose.HARBOR_SERVICE,),
                                   agent_service=compose.HARBOR_SERVICE, **fields)
    variables = compose.harbor_vars(
        os.path.basename(td.given), td.path("environment"), docker_image=fields["image"],
        cpus=fields["cpus"], memory_mb=fields["memory_mb"], task_env=task_env)
    svc = compose.read_compose(td, rel, variables, compose.HARBOR_SERVICE, required=False)
    warnings += svc.warnings
    context = "environment"
    if svc.dockerfile:
        dockerfile, context = svc.dockerfile, svc.context
    if svc.image and (fields["image"] or dockerfile is None):
        # over the prebuilt image, or with nothing to build; else it names what is built
        fields["image"] = svc.image
    return compose.environment(
        td, dockerfile=dockerfile, context=context, compose_file=rel, env=svc.env,
        workdir=workdir or svc.workdir, services=(svc.name, *(
            s for s in svc.services if s != svc.name)), agent_service=svc.name,
        sidecars=svc.sidecars, volumes=svc.volumes, **fields)


def _mode(ver: dict, file: str) -> str:
    """Where the tests run: Harbor's `environment_mode` or this project's `mode` (default:
    "shared", or "separate" when [verifier.environment] is given, as in Harbor)."""
    given = {k: ver[k] for k in ("mode", "environment_mode") if ver.get(k) is not None}
    for key, value in given.items():
        if value not in VERIFIER_MODES:
            raise TaskFormatError(file, f"verifier.{key}", f"{str(value)[:80]!r}; choose "
                                  "separate or shared")
    if len(set(given.values())) > 1:
        raise TaskFormatError(file, "verifier.mode", "disagrees with verifier.environment_mode")
    default = "separate" if "environment" in ver else "shared"
    return next(iter(given.values()), default)


def _verifier(td: _files.TaskDir, ver: dict, file: str, warnings: list[str]) -> VerifierSpec:
    """tests/ at /tests and `bash /tests/test.sh`, as Harbor's verifier runs it."""
    if td.kind("tests/test.sh", "verifier") is None:
        raise TaskFormatError(td.path("tests/test.sh"), "verifier",
                              "missing: a Harbor task needs tests/test.sh")
    tests = td.read_tree("tests", "verifier",
                         budget=_files.TreeBudget(f"{td.path('tests')}/"))
    if "test.sh" not in tests:  # a link, a directory, ...: read it to say which
        td.read_bytes("tests/test.sh", "verifier")
    live = ver.get("live", False)
    if not isinstance(live, bool):
        raise TaskFormatError(file, "verifier.live", "expected true or false (true: the "
                              "tests query a service the agent left running)")
    return VerifierSpec(
        kind="script", mode=_mode(ver, file), files=tests, live=live,
        command=f"bash {TESTS_DIR}/test.sh", tests_dir=TESTS_DIR,
        timeout_s=_files.number(ver.get("timeout_sec"), file, "verifier.timeout_sec",
                                default=DEFAULT_VERIFIER_TIMEOUT, hi=MAX_TIMEOUT_S),
        env=_resolved_env(ver.get("env"), file, "verifier.env", warnings),
    )


def _oracle(td: _files.TaskDir, sol: dict, file: str, warnings: list[str]
            ) -> tuple[tuple[tuple[str, ...], ...], Oracle | None]:
    """Task.solution (solve.sh's text) and the oracle: all of solution/ at /solution, run
    as `bash /solution/solve.sh`."""
    env = _resolved_env(sol.get("env"), file, "solution.env", warnings)
    if not td.exists("solution", "solution"):
        return (), None
    tree = td.read_tree("solution", "solution",
                        budget=_files.TreeBudget(f"{td.path('solution')}/"))
    if "solve.sh" not in tree:
        if td.exists("solution/solve.sh", "solution"):  # a directory, ...: say which
            td.read_bytes("solution/solve.sh", "solution")
        warnings.append("solution/ has no solve.sh, which Harbor's oracle runs: the task "
                        "has no reference solution")
        return (), None
    try:
        text = tree["solve.sh"].decode("utf-8")
    except UnicodeDecodeError as e:
        raise TaskFormatError(td.path("solution/solve.sh"), "solution",
                              f"not UTF-8 text ({e})") from None
    oracle = Oracle(files=tree, dir=HARBOR_SOLUTION_DIR,
                    command=f"bash {HARBOR_SOLUTION_DIR}/solve.sh", env={**ORACLE_ENV, **env})
    return ((text,),), oracle


def _config(td: _files.TaskDir, file: str) -> dict:
    if not td.exists(TASK_FILE):
        raise TaskFormatError(file, None, "missing: a Harbor task needs task.toml")
    try:
        return tomllib.loads(td.read_text(TASK_FILE, None))
    except tomllib.TOMLDecodeError as e:
        raise TaskFormatError(file, None, f"not valid TOML: {e}") from None
    except (RecursionError, ValueError) as e:  # nesting past the parser's stack, huge ints
        raise TaskFormatError(file, None, f"not usable TOML ({type(e).__name__}: "
                              f"{str(e)[:200]})") from None


def _instruction(td: _files.TaskDir) -> str:
    instruction = td.read_text("instruction.md", "instruction", limit=MAX_INSTRUCTION_BYTES)
    problem = text_problem(instruction, MAX_INSTRUCTION_BYTES)
    if problem:
        raise TaskFormatError(td.path("instruction.md"), "instruction", problem)
    if not instruction.strip():
        raise TaskFormatError(td.path("instruction.md"), "instruction", "is empty")
    return instruction


def _metadata(cfg: dict, file: str) -> tuple[Metadata, int | None, str | None]:
    meta, task_t = _section(cfg, "metadata", file), _section(cfg, "task", file)
    difficulty = _files.string(meta.get("difficulty"), file, "metadata.difficulty",
                               default="unknown")
    if difficulty not in DIFFICULTIES:
        raise TaskFormatError(file, "metadata.difficulty",
                              f"{difficulty!r}; choose one of {DIFFICULTIES}")
    expected = meta.get("expected_checks")
    if expected is not None and (isinstance(expected, bool) or not isinstance(expected, int)
                                 or expected < 1):
        raise TaskFormatError(file, "metadata.expected_checks", "expected a positive integer")
    family = _files.string(meta.get("family") or meta.get("category"), file,
                           "metadata.family", default=None)
    name = _files.string(task_t.get("name"), file, "task.name", default=None)
    metadata = Metadata(
        difficulty=difficulty,
        category=_files.string(meta.get("category"), file, "metadata.category", default=""),
        tags=_files.string_list(meta.get("tags", task_t.get("keywords")), file,
                                "metadata.tags"))
    return metadata, expected, family or name


def load_harbor_task(root: str) -> Task:
    """Load one Harbor task directory (TaskFormatError names file and field)."""
    td = _files.TaskDir(root)
    root, task_id = td.given, os.path.basename(td.given)
    file = td.path(TASK_FILE)
    cfg = _config(td, file)
    instruction = _instruction(td)
    metadata, expected, family = _metadata(cfg, file)
    ver, agent = _section(cfg, "verifier", file), _section(cfg, "agent", file)
    warnings = _key_warnings(cfg)
    verifier = _verifier(td, ver, file, warnings)
    env = _environment(td, _section(cfg, "environment", file), file, warnings)
    solution, oracle = _oracle(td, _section(cfg, "solution", file), file, warnings)
    return Task(
        id=task_id, family=family or task_id, instruction=instruction, environment=env,
        verifier=verifier, solution=solution,
        agent_timeout_s=_files.number(agent.get("timeout_sec"), file, "agent.timeout_sec",
                                      default=DEFAULT_AGENT_TIMEOUT, hi=MAX_TIMEOUT_S),
        metadata=metadata, expected_checks=expected, format="harbor", source=root,
        oracle=oracle, warnings=warnings,
    )

def load_task_dir(path: str) -> Task:
    """Load a task directory in either format (Harbor if task.toml, else Terminal-Bench)."""
    if is_harbor_dir(path):
        return load_harbor_task(path)
    if is_terminal_bench_dir(path):
        return load_terminal_bench_task(path)
    raise TaskFormatError(path, None, "not a task directory: expected task.toml (Harbor) or "
                          "task.yaml (Terminal-Bench)")


def _task_children(root: str) -> list[str]:
    """The task directories right below `root`; a symbolic link among them is refused."""
    out = []
    for n in sorted(os.listdir(root)):
        path = os.path.join(root, n)
        if os.path.islink(path):
            raise TaskFormatError(path, None, "is a symbolic link; task directories in a "
                                  "suite must be real directories (links are refused)")
        if os.path.isdir(path) and (is_harbor_dir(path) or is_terminal_bench_dir(path)):
            out.append(path)
    return out


def find_task_dirs(root: str) -> list[str]:
    """`root` itself if it is a task directory, else the task directories right below it
    (a dataset folder), else those below `root`/tasks (a repository laid out as
    Terminal-Bench's is).

    `root` is the directory the user named; entries below it are untrusted, so a symbolic
    link among them (or `tasks` itself as a link) is refused instead of followed.
    """
    if is_harbor_dir(root) or is_terminal_bench_dir(root):
        return [root]
    if not os.path.isdir(root):
        raise TaskFormatError(root, None, "no such directory")
    out = _task_children(root)
    tasks = os.path.join(root, "tasks")
    if not out and os.path.islink(tasks):
        raise TaskFormatError(tasks, None, "is a symbolic link; a suite's tasks/ must be a "
                              "real directory (links are refused)")
    if not out and os.path.isdir(tasks):
        out = _task_children(tasks)
    if not out:
        raise TaskFormatError(root, None, "contains no task directories: looked for "
                              f"{TASK_FILE} or task.yaml in {root}, in the directories right "
                              f"below it and in those below {tasks}")
    return out


def load_task_dirs(root: str) -> list[Task]:
    """Load `root` itself if it is a task directory, else every task directory below it
    (`find_task_dirs`)."""
    return [load_task_dir(d) for d in find_task_dirs(root)]
