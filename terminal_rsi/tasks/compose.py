"""Read a task's docker-compose file as its own harness runs it (Terminal-Bench, Harbor).

Both harnesses start a task with `docker compose`: Terminal-Bench with the task's
docker-compose.yaml (the agent works in the service `client`), Harbor with its own compose
files plus the task's environment/docker-compose.yaml as an override (the agent works in
the service `main`). The harness sets the compose variables (`terminal_bench_vars`,
`harbor_vars`); the file is read with yaml.safe_load and its strings interpolated as
compose does (`${VAR}`, `${VAR:-default}`, `${VAR-default}`, `${VAR:+x}`, `${VAR?err}`,
`$VAR`, `$$`), a `.env` file next to it supplying further values. A variable nobody sets
becomes "" with a Task warning.

`read_compose` describes the agent's service: its build (Dockerfile and context, both
inside the task directory), image, environment and working_dir. The harness's own log
mounts are dropped without a word (they are how the harness collects logs); every other
volume and every field this reader does not use is one warning. A malformed file (not a
mapping, no services, a service that is not a mapping, a build context or Dockerfile
outside the task directory) is a TaskFormatError naming the file and the field.
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
import shlex
from collections.abc import Mapping

import yaml

from terminal_rsi.sandbox.compose import HEALTHCHECK_KEYS
from terminal_rsi.tasks import _files
from terminal_rsi.tasks.spec import (
    MAX_ENV_ENTRIES,
    Environment,
    Sidecar,
    TaskFormatError,
    env_problem,
)

COMPOSE_NAMES = ("docker-compose.yaml", "docker-compose.yml")
TERMINAL_BENCH_SERVICE = "client"
HARBOR_SERVICE = "main"
# Terminal-Bench's DockerComposeManager: CONTAINER_SESSION_LOGS_PATH, CONTAINER_AGENT_LOGS_PATH
TERMINAL_BENCH_LOGS = "/logs"
TERMINAL_BENCH_AGENT_LOGS = "/agent-logs"
# Harbor's compose variables for its EnvironmentPaths (the legacy log-mount targets)
HARBOR_LOG_VARS = {"ENV_VERIFIER_LOGS_PATH": "/logs/verifier",
                   "ENV_AGENT_LOGS_PATH": "/logs/agent", "ENV_ARTIFACTS_PATH": "/logs/artifacts"}
# commands the harnesses give the agent's service to keep it running
_KEEPALIVE = ({"sh", "-c", "sleep infinity"}, {"sleep", "infinity"}, {"tail", "-f", "/dev/null"})
# fields of the agent's service this reader uses (each handled below)
_USED = {"build", "image", "environment", "working_dir", "volumes", "container_name", "command",
         "depends_on"}  # depends_on: every other service starts before the agent's
_TOP_SILENT = {"services", "version", "name"}
# fields of a service beside the agent's this reader uses
_SIDECAR_USED = {"build", "image", "environment", "working_dir", "volumes", "container_name",
                 "command", "entrypoint", "healthcheck"}
_BUILD_USED = {"context", "dockerfile"}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BRACED = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-+?])(.*))?", re.S)


@dataclasses.dataclass(frozen=True)
class ComposeVars:
    """The variables a harness sets when it runs `docker compose` for a task.

    `values`: name -> value; `host_paths`: those naming host directories of the harness's
    own (log mounts); `own_names`: those naming the harness's own images and containers.
    """

    harness: str
    values: Mapping[str, str]
    host_paths: frozenset[str] = frozenset()
    own_names: frozenset[str] = frozenset()


def _harbor_name(text: str) -> str:
    """Harbor's _sanitize_docker_image_name."""
    text = re.sub(r"[^a-z0-9._-]", "-", text.lower())
    return text if re.match(r"[a-z0-9]", text) else "0" + text


def terminal_bench_vars(task_id: str) -> ComposeVars:
    """Terminal-Bench's compose variables (DockerComposeEnvVars, prefixed T_BENCH_): the
    trial's container and image names, the container log paths, /tests, and the host log
    directories of the trial (host paths of the harness: only its log mounts use them)."""
    prefix = f"tb__{task_id}".replace(".", "-")  # TrialHandler.docker_image_name_prefix
    values = {
        "T_BENCH_TASK_DOCKER_CLIENT_CONTAINER_NAME": task_id.replace(".", "-"),
        "T_BENCH_TASK_DOCKER_CLIENT_IMAGE_NAME": f"{prefix}__client",
        "T_BENCH_TASK_DOCKER_NAME_PREFIX": prefix,
        "T_BENCH_CONTAINER_LOGS_PATH": TERMINAL_BENCH_LOGS,
        "T_BENCH_CONTAINER_AGENT_LOGS_PATH": TERMINAL_BENCH_AGENT_LOGS,
        "T_BENCH_TEST_DIR": "/tests",
        "T_BENCH_TASK_LOGS_PATH": "",
        "T_BENCH_TASK_AGENT_LOGS_PATH": "",
    }
    return ComposeVars(
        "Terminal-Bench", values,
        host_paths=frozenset({"T_BENCH_TASK_LOGS_PATH", "T_BENCH_TASK_AGENT_LOGS_PATH"}),
        own_names=frozenset({"T_BENCH_TASK_DOCKER_CLIENT_CONTAINER_NAME",
                             "T_BENCH_TASK_DOCKER_CLIENT_IMAGE_NAME",
                             "T_BENCH_TASK_DOCKER_NAME_PREFIX"}))


def harbor_vars(task_id: str, environment_dir: str, *, docker_image: str | None = None,
                cpus: float | None = None, memory_mb: int | None = None,
                task_env: Mapping[str, str] | None = None) -> ComposeVars:
    """Harbor's compose variables (ComposeInfraEnvVars and the legacy log-mount variables;
    TEST_DIR of older releases) over the task's own `[environment] env`, which Harbor also
    passes to `docker compose` (its infrastructure variables win a collision)."""
    values = dict(task_env or {})
    values.update({"MAIN_IMAGE_NAME": _harbor_name(f"hb__{task_id}"),
                   "CONTEXT_DIR": environment_dir, "TEST_DIR": "/tests"})
    if docker_image:
        values["PREBUILT_IMAGE_NAME"] = docker_image
    if cpus:
        values["CPUS"] = f"{cpus:g}"
    if memory_mb:
        values["MEMORY"] = f"{memory_mb}M"
    values.update(HARBOR_LOG_VARS)
    hosts = frozenset({"HOST_VERIFIER_LOGS_PATH", "HOST_AGENT_LOGS_PATH",
                       "HOST_ARTIFACTS_PATH"})
    values.update(dict.fromkeys(hosts, ""))
    return ComposeVars("Harbor", values, host_paths=hosts,
                       own_names=frozenset({"MAIN_IMAGE_NAME"}))


@dataclasses.dataclass(frozen=True)
class AgentService:
    """The agent's service of a compose file, as far as the loaders use it.

    `dockerfile`, `context`: task-directory-relative (None: the service has no build);
    `image`: set only when there is no build and it is not a name of the harness's own;
    `env`: its `environment`; `workdir`: its `working_dir`; `volumes`: its bind mounts of
    files inside the build context as (task-directory-relative source, absolute target),
    copied in at start; `sidecars`: the other services.
    """

    name: str
    services: tuple[str, ...]
    dockerfile: str | None = None
    context: str | None = None
    image: str | None = None
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    workdir: str | None = None
    warnings: tuple[str, ...] = ()
    sidecars: tuple[Sidecar, ...] = ()
    volumes: tuple[tuple[str, str], ...] = ()


def find_compose(td: _files.TaskDir, directory: str, harness: str
                 ) -> tuple[str | None, list[str]]:
    """The compose file of `directory` (task-directory-relative) and what to say about it:
    docker-compose.yaml (what both harnesses read), else docker-compose.yml."""
    found = [posixpath.join(directory, n) if directory else n for n in COMPOSE_NAMES]
    found = [rel for rel in found if td.exists(rel, "docker-compose")]
    if not found:
        return None, []
    if len(found) == 2:
        return found[0], [f"{found[1]} is not read: {harness} reads {found[0]}"]
    if found[0].endswith(".yml"):
        return found[0], [f"{found[0]} is read, though {harness} itself reads only "
                          f"{found[0][:-4]}.yaml"]
    return found[0], []


class _Interpolator:
    """Compose's variable interpolation over one file's strings (unknown names: "" and a
    warning each)."""

    def __init__(self, variables: ComposeVars, dotenv: Mapping[str, str], file: str,
                 warnings: list[str]):
        self.values = {**dotenv, **variables.values}
        self.vars, self.file, self.warnings = variables, file, warnings
        self.used: set[str] = set()
        self.unknown: set[str] = set()

    def __call__(self, text: str, field: str) -> str:
        self.used = set()
        return self._expand(text, field)

    def _expand(self, s: str, field: str) -> str:
        out, i = [], 0
        while i < len(s):
            j = s.find("$", i)
            if j < 0:
                out.append(s[i:])
                break
            out.append(s[i:j])
            i = self._dollar(s, j, field, out)
        return "".join(out)

    def _dollar(self, s: str, i: int, field: str, out: list[str]) -> int:
        if s.startswith("$$", i):
            out.append("$")
            return i + 2
        if s.startswith("${", i):
            end = _files.closing_brace(s, i + 2)
            if end < 0:
                raise TaskFormatError(self.file, field, f"an unclosed ${{ in {s[:80]!r}")
            out.append(self._braced(s[i + 2:end], field))
            return end + 1
        m = _NAME.match(s, i + 1)
        if not m:
            out.append("$")
            return i + 1
        out.append(self._lookup(m.group(), field, warn=True) or "")
        return m.end()

    def _braced(self, inner: str, field: str) -> str:
        m = _BRACED.fullmatch(inner)
        if not m:
            raise TaskFormatError(self.file, field, f"${{{inner[:80]}}} is not a valid "
                                  "interpolation")
        name, op, word = m.groups()
        value = self._lookup(name, field, warn=op is None or "?" in op)
        if op is None or "?" in op:
            return value or ""
        is_set = bool(value) if op.startswith(":") else value is not None
        if op.endswith("-"):
            return value if is_set else self._expand(word, field)
        return self._expand(word, field) if is_set else ""

    def _lookup(self, name: str, field: str, *, warn: bool) -> str | None:
        if name in self.values:
            self.used.add(name)
            return self.values[name]
        if warn and name not in self.unknown:
            self.unknown.add(name)
            self.warnings.append(f"{posixpath.basename(self.file)}: ${{{name}}} ({field}) is "
                                 f"not a variable {self.vars.harness} sets; it is empty here")
        return None


def _dotenv(td: _files.TaskDir, directory: str) -> dict[str, str]:
    """The `.env` file compose reads from its project directory (KEY=VALUE lines)."""
    rel = posixpath.join(directory, ".env") if directory else ".env"
    if not td.exists(rel, "docker-compose"):
        return {}
    out = {}
    for line in td.read_text(rel, "docker-compose").splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.removeprefix("export ").partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        out[key.strip()] = value
    return out


def _load(td: _files.TaskDir, rel: str) -> dict:
    path = td.path(rel)
    text = td.read_text(rel, "docker-compose")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise TaskFormatError(path, None, f"not valid YAML: {e}") from None
    except (RecursionError, ValueError) as e:
        raise TaskFormatError(path, None, f"not usable YAML ({type(e).__name__}: "
                              f"{str(e)[:200]})") from None
    if not isinstance(data, dict):
        raise TaskFormatError(path, None, "the top level must be a mapping")
    services = data.get("services")
    if not isinstance(services, dict) or not services:
        raise TaskFormatError(path, "services", "expected a mapping of one or more services")
    for name, svc in services.items():
        if not isinstance(name, str) or not name:
            raise TaskFormatError(path, "services", f"service name {str(name)[:80]!r} is not "
                                  "a string")
        if not isinstance(svc, dict):
            raise TaskFormatError(path, f"services.{name}", "expected a mapping")
    return data


def read_compose(td: _files.TaskDir, rel: str, variables: ComposeVars, agent: str, *,
                 required: bool) -> AgentService:
    """The agent's service `agent` of the compose file `rel` (task-directory-relative);
    `required`: the file must declare it (Terminal-Bench; Harbor declares it itself)."""
    path = td.path(rel)
    data = _load(td, rel)
    services = data["services"]
    warnings: list[str] = [f"{posixpath.basename(rel)}: top-level {k!r} is not used"
                           for k in data if k not in _TOP_SILENT and not str(k).startswith("x-")]
    if agent not in services:
        if required:
            raise TaskFormatError(path, f"services.{agent}", f"missing: {variables.harness} "
                                  f"runs the agent in the service {agent!r}")
        return AgentService(agent, tuple(services), warnings=tuple(warnings))
    sub = _Interpolator(variables, _dotenv(td, posixpath.dirname(rel)), path, warnings)
    try:
        sidecars = tuple(_Service(td, rel, name, svc, sub, warnings).sidecar()
                         for name, svc in services.items() if name != agent)
        found = _Service(td, rel, agent, services[agent], sub, warnings).read(tuple(services))
    except RecursionError:
        raise TaskFormatError(path, "services", "nests interpolations too deeply") from None
    return dataclasses.replace(found, sidecars=sidecars, warnings=tuple(warnings))


def _split_volume(spec: str) -> list[str]:
    """A short-syntax volume `source:target[:mode]` split at colons outside `${...}`."""
    parts, cur, depth, i = [], [], 0, 0
    while i < len(spec):
        if spec.startswith("${", i):
            depth += 1
            cur.append("${")
            i += 2
            continue
        c = spec[i]
        depth -= c == "}" and depth > 0
        if c == ":" and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(c)
        i += 1
    return [*parts, "".join(cur)]


class _Service:
    """One service of a compose file, read field by field (`read`)."""

    def __init__(self, td: _files.TaskDir, rel: str, name: str, svc: dict,
                 sub: _Interpolator, warnings: list[str]):
        self.td, self.rel, self.name, self.svc, self.sub = td, rel, name, svc, sub
        self.path, self.dir = td.path(rel), posixpath.dirname(rel)
        self.warnings = warnings
        self.volumes: list[tuple[str, str]] = []

    def field(self, key: str) -> str:
        return f"services.{self.name}.{key}"

    def warn(self, text: str) -> None:
        self.warnings.append(f"{posixpath.basename(self.rel)}: {text}")

    def error(self, key: str, message: str) -> TaskFormatError:
        return TaskFormatError(self.path, self.field(key), message)

    def text(self, value, key: str) -> str:
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise self.error(key, f"expected a string, got {type(value).__name__}")
        return self.sub(str(value), self.field(key))

    def read(self, services: tuple[str, ...]) -> AgentService:
        for key in self.svc:
            if key not in _USED:
                self.warn(f"{self.field(str(key))} is not used")
        dockerfile, context = self._build()
        image = self._image(has_build=dockerfile is not None)
        self._container_name()
        self._command()
        self._volumes(context)
        return AgentService(self.name, services, dockerfile, context, image,
                            self._environment(), self._workdir(), tuple(self.warnings),
                            volumes=tuple(self.volumes))

    def sidecar(self) -> Sidecar:
        """This service as one beside the agent's: what `Sidecar` runs of it."""
        for key in self.svc:
            if key not in _SIDECAR_USED:
                self.warn(f"{self.field(str(key))} is not used"
                          + (" (every service starts before the agent's)"
                             if key == "depends_on" else ""))
        dockerfile, context = self._build()
        raw = self.svc.get("image")
        image = None if dockerfile or raw is None else self.text(raw, "image")
        if dockerfile is None and not image:
            raise self.error("image", "a service beside the agent's needs a build or an image")
        self._volumes(context)
        for src, target in self.volumes:
            self.warn(f"{self.field('volumes')}: {src or '.'} is not copied to {target} (only "
                      "the agent's service gets its volumes from the build context)")
        return Sidecar(
            self.name, dockerfile=self.td.path(dockerfile) if dockerfile else None,
            context=self.td.path(context) if dockerfile else None, image=image,
            env=self._environment(), command=self._words("command"),
            entrypoint=self._words("entrypoint"), workdir=self._workdir(),
            healthcheck=self._healthcheck())

    def _words(self, key: str) -> tuple[str, ...] | None:
        """A command or entrypoint: a list of strings, or a string split as compose does."""
        raw = self.svc.get(key)
        if raw is None:
            return None
        if isinstance(raw, str):
            try:
                return tuple(shlex.split(self.text(raw, key)))
            except ValueError as e:
                raise self.error(key, f"cannot be split into words ({e})") from None
        if not isinstance(raw, list):
            raise self.error(key, "expected a string or a list of strings")
        return tuple(self.text(w, key) for w in raw)

    def _healthcheck(self) -> dict | None:
        raw = self.svc.get("healthcheck")
        if raw is None:
            return None
        if not isinstance(raw, dict):
            raise self.error("healthcheck", "expected a mapping")
        out: dict = {}
        for key, value in raw.items():
            if key not in HEALTHCHECK_KEYS:
                self.warn(f"{self.field('healthcheck')}.{key} is not used")
            elif key == "test":
                out[key] = list(self._words_of(value, "healthcheck.test"))
            elif key == "retries":
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise self.error("healthcheck.retries", "expected an integer >= 0")
                out[key] = value
            elif key == "disable":
                if not isinstance(value, bool):
                    raise self.error("healthcheck.disable", "expected true or false")
                out[key] = value
            else:
                out[key] = self.text(value, f"healthcheck.{key}")
        return out

    def _words_of(self, value, key: str) -> tuple[str, ...]:
        if isinstance(value, str):
            return ("CMD-SHELL", self.text(value, key))
        if not isinstance(value, list) or not value:
            raise self.error(key, "expected a string or a non-empty list of strings")
        return tuple(self.text(w, key) for w in value)

    def _inside(self, value: str, base: str, key: str) -> str:
        """`value` (relative to `base`, or absolute) as a task-directory-relative path;
        a TaskFormatError naming the field if it is remote or leaves the task directory."""
        if "://" in value or value.startswith("git@"):
            raise self.error(key, f"{value[:200]!r} is a remote build context; a task builds "
                             "from its own directory")
        if value.startswith("/"):
            norm = posixpath.normpath(value)
            for root in (self.td.given, self.td.root):
                if norm == root or norm.startswith(root.rstrip("/") + "/"):
                    rel = posixpath.relpath(norm, root)
                    return "" if rel == "." else rel
            raise self.error(key, f"{value[:200]!r} is outside the task directory "
                             f"{self.td.given}")
        norm = posixpath.normpath(posixpath.join(base, value) if base else value)
        if norm == ".." or norm.startswith("../"):
            raise self.error(key, f"{value[:200]!r} leaves the task directory {self.td.given}")
        return "" if norm == "." else norm

    def _expect(self, rel: str, key: str, kind: str) -> None:
        found = self.td.kind(rel, self.field(key))
        if found == kind:
            return
        if found == "link":
            raise TaskFormatError(self.td.path(rel), self.field(key), "is a symbolic link; "
                                  "a task builds from real files of its own directory, so "
                                  "links are refused")
        what = {None: "does not exist", "dir": "is a directory", "file": "is a file"}.get(
            found, "is not a regular file or directory")
        raise self.error(key, f"names {self.td.path(rel)}, which {what}; expected a "
                         f"{'directory' if kind == 'dir' else 'regular file'}")

    def _build(self) -> tuple[str | None, str | None]:
        build = self.svc.get("build")
        if build is None:
            return None, None
        if isinstance(build, str):
            build = {"context": build}
        if not isinstance(build, dict):
            raise self.error("build", "expected a string or a mapping")
        for key in build:
            if key not in _BUILD_USED:
                why = " (build arguments are not passed to the build)" if key == "args" else ""
                self.warn(f"{self.field('build')}.{key} is not used{why}")
        context = self._inside(self.text(build.get("context", "."), "build.context"),
                               self.dir, "build.context")
        self._expect(context, "build.context", "dir")
        dockerfile = self._inside(self.text(build.get("dockerfile", "Dockerfile"),
                                            "build.dockerfile"), context, "build.dockerfile")
        self._expect(dockerfile, "build.dockerfile", "file")
        return dockerfile, context

    def _image(self, *, has_build: bool) -> str | None:
        raw = self.svc.get("image")
        if raw is None:
            return None
        image = self.text(raw, "image")
        if has_build:  # compose builds the service and tags the result with this name
            return None
        if not image or self.sub.used & self.sub.vars.own_names:
            self.warn(f"{self.field('image')} is {self.sub.vars.harness}'s own name "
                      f"{image!r} and the service has no build: nothing to build or pull")
            return None
        return image

    def _container_name(self) -> None:
        raw = self.svc.get("container_name")
        if raw is not None:
            self.text(raw, "container_name")
            if not self.sub.used & self.sub.vars.own_names:
                self.warn(f"{self.field('container_name')} is not used")

    def _command(self) -> None:
        raw = self.svc.get("command")
        if raw is None:
            return
        words = set(raw.split()) if isinstance(raw, str) else \
            set(raw) if isinstance(raw, list) and all(isinstance(w, str) for w in raw) else None
        if words not in _KEEPALIVE:
            self.warn(f"{self.field('command')} is not used")

    def _volumes(self, context: str | None) -> None:
        vols = self.svc.get("volumes")
        if vols is None:
            return
        if not isinstance(vols, list):
            raise self.error("volumes", "expected a list")
        for i, vol in enumerate(vols):
            self._volume(vol, context, f"volumes[{i}]")

    def _volume(self, vol, context: str | None, key: str) -> None:
        if isinstance(vol, str):
            parts = _split_volume(vol)
            source = parts[0] if len(parts) >= 2 else None
            kind = None if source is None else "bind" if source.startswith((".", "/", "~")) \
                else "volume"
            shown = vol
        elif isinstance(vol, dict):
            source, kind = vol.get("source"), vol.get("type", "volume")
            shown = f"{source or ''}:{vol.get('target', '')}"
        else:
            raise self.error(key, "expected a string or a mapping")
        src = self.text(source, key) if source is not None else None
        if src is not None and self.sub.used & self.sub.vars.host_paths:
            return  # the harness's own log mount: how it collects logs, not the task's
        target = vol.get("target") if isinstance(vol, dict) else (
            parts[1] if len(parts) >= 2 else None)
        copied = self._copied_volume(src, kind, context, target, key)
        if copied is not None:
            self.volumes.append(copied)
            return
        self.warn(f"volume {shown!r} is not mounted; {self._why(src, kind, context)}")

    def _copied_volume(self, src: str | None, kind: str | None, context: str | None,
                       target, key: str) -> tuple[str, str] | None:
        """A bind mount of a file or directory inside the build context, as (its task-
        directory-relative source, its absolute target): copied into the container when it
        starts (a snapshot, so the container never writes into the task directory)."""
        if not src or kind != "bind" or src.startswith(("/", "~")) or context is None:
            return None
        norm = posixpath.normpath(posixpath.join(self.dir, src) if self.dir else src)
        inside = not norm.startswith("../") and norm != ".." and (
            context == "" or norm == context or norm.startswith(context + "/"))
        if not inside or self.td.kind(norm, self.field(key)) not in ("file", "dir"):
            return None
        target = self.text(target, key) if target is not None else ""
        if not target.startswith("/"):
            raise self.error(key, f"the target {target[:200]!r} is not an absolute path")
        return ("" if norm == "." else norm), "/" + posixpath.normpath(target).lstrip("/")

    def _why(self, src: str | None, kind: str | None, context: str | None) -> str:
        if not src or kind not in ("bind", "volume"):
            return "it would start empty"
        if kind == "volume":
            return "named volumes are not created"
        if src.startswith(("/", "~")):
            return "its source is a path on the host"
        norm = posixpath.normpath(posixpath.join(self.dir, src) if self.dir else src)
        inside = context is not None and not norm.startswith("../") and norm != ".." and (
            context == "" or norm == context or norm.startswith(context + "/"))
        if inside:
            return ("its source is in the build context, so only what the Dockerfile copies "
                    "is in the container")
        return "its source is outside the build context"

    def _environment(self) -> dict[str, str]:
        raw = self.svc.get("environment")
        if raw is None:
            return {}
        if isinstance(raw, list):
            pairs = [self._env_item(item) for item in raw]
        elif isinstance(raw, dict):
            pairs = [self._env_entry(k, v) for k, v in raw.items()]
        else:
            raise self.error("environment", "expected a list or a mapping")
        env = {}
        for name, value in pairs:
            if value is None:
                value = self.sub.values.get(name)
            if value is None:
                self.warn(f"{self.field('environment')}: {name} is passed through from the "
                          f"environment of {self.sub.vars.harness}, which does not set it; "
                          "it is not set here")
                continue
            problem = env_problem(name, value)
            if problem:
                raise self.error("environment", problem)
            env[name] = value
        if len(env) > MAX_ENV_ENTRIES:
            raise self.error("environment", f"has {len(env)} entries; the limit is "
                             f"{MAX_ENV_ENTRIES}")
        return env

    def _env_item(self, item) -> tuple[str, str | None]:
        if not isinstance(item, str):
            raise self.error("environment", f"expected NAME=value strings, got "
                             f"{type(item).__name__}")
        name, eq, value = self.sub(item, self.field("environment")).partition("=")
        return name, value if eq else None

    def _env_entry(self, name, value) -> tuple[str, str | None]:
        if value is None:
            return str(name), None
        if isinstance(value, bool):
            return str(name), str(value).lower()
        if not isinstance(value, str | int | float):
            raise self.error("environment", f"{str(name)[:80]}: expected a string, got "
                             f"{type(value).__name__}")
        return str(name), self.sub(str(value), self.field("environment"))

    def _workdir(self) -> str | None:
        raw = self.svc.get("working_dir")
        if raw is None:
            return None
        path = self.text(raw, "working_dir")
        if not path.startswith("/"):
            raise self.error("working_dir", f"expected an absolute path, got {path[:200]!r}")
        return "/" + posixpath.normpath(path).lstrip("/")


def environment(td: _files.TaskDir, *, dockerfile: str | None = None,
                context: str | None = None, compose_file: str | None = None,
                env: Mapping[str, str] | None = None, workdir: str | None = None,
                **fields) -> Environment:
    """The Environment of a task whose agent's container is built from `dockerfile` in
    `context` (task-directory-relative; None: no build) or started from `fields["image"]`:
    `env` and `workdir` are what the task sets at run time (compose `environment` and
    `working_dir`, Harbor's [environment] env and workdir); the Dockerfile's own ENV and
    WORKDIR are the built image's, applied by the engine, never restated here (a PATH
    expanded here could hide the base image's). What a local sandbox could reproduce of the
    Dockerfile (`_files.parse_dockerfile`) is recorded too. `fields`: other Environment
    fields (services, agent_service, image, resources)."""
    df = _files.parse_dockerfile(td, dockerfile, context) if dockerfile else None
    if df is None:
        return Environment(compose_file=td.path(compose_file) if compose_file else None,
                           env=dict(env or {}), workdir=workdir, **fields)
    unsupported = df.unsupported
    if df.env:
        unsupported += ("the Dockerfile's ENV lines (the image applies them; a local sandbox "
                        "has no image)",)
    if workdir and df.workdir and workdir != df.workdir and df.files:
        unsupported += (f"the working directory {workdir} is not the Dockerfile's WORKDIR "
                        f"{df.workdir}, under which the copied files were placed",)
    return Environment(
        dockerfile=td.path(dockerfile), context=td.path(context or ""),
        compose_file=td.path(compose_file) if compose_file else None, files=df.files,
        workdir=workdir, base_image=df.base_image, setup=df.setup,
        env=dict(env or {}), unsupported=unsupported, **fields)
