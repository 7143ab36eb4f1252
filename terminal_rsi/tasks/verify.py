"""Protected verification (paper §2.1): run V_x on an episode's result, get a CTRF report.

The verifier never exists in the agent's sandbox during the episode, and its verdict comes
only from where the agent cannot write (docs/tasks.md, "Threat model of the verifier").
After the episode:

* **separate** mode: the declared artifacts (`verifier.artifacts`, the whole workspace by
  default) are copied out of the agent's sandbox (`get_tar`) into a fresh sandbox
  (`put_tar`) together with the tests; the verifier runs there. Nothing the agent left
  running, and no file outside the artifacts, can influence it.
* **shared** mode (tasks whose checks need the environment the agent left: Terminal-Bench
  and Harbor tasks, the built-in terminal families): the agent's processes are stopped
  first (its terminal session closed: everything it started dies), unless the task
  declares that it checks a live service (`VerifierSpec.live`); the tests are then copied
  into the agent's own sandbox, and removed again afterwards. A check that needs to know
  what was still running gets the sandbox's process list as the host saw it before the
  stop (`Sandbox.processes`), never a file the agent could delete.

In both modes the workspace's compiled Python (``__pycache__``, ``*.pyc``) is dropped before
any verifier command runs (a cache, never an artifact; a planted one would replace the code
a check imports), and every verifier command of the workspace layout starts with its own
HOME and TMPDIR, fresh and never the workspace root, and no user site-packages
(`PROTECTED_ENV`).

The tests go to a fresh, randomly named directory `.trsi_verifier_<hex>/` in the
workspace (`$TEST_DIR`; logs in `$TRSI_LOGS_DIR`); anything of that name the agent created
is dropped first. Verifier kinds:

* ``pytest``: the pytest-json-ctrf plugin (>= 0.6, pinned in setup.py) under an isolated
  interpreter (``python3 -I``: no PYTHON* variables, no user site, no script directory on
  sys.path; plugin autoloading off, `--rootdir`/`--confcutdir` at the tests, an ini file of
  the verifier's). The CTRF report does not go to a file: `PYTEST_BOOT` hands the plugin the
  command's original stdout, a pipe the host reads, kept from every process the tests start
  (not inherited, the process not dumpable), and closes it with a record of pytest's exit
  status and the ids it collected, under a per-run nonce. S = (exit status == 0), with the
  report's tests equal to what was collected; a verdict file in the logs directory is
  refused as planted. If the sandbox's python lacks pytest or the plugin, the host's
  pure-Python pytest runtime is copied in (`pytest_runtime`).
* ``script`` (Harbor's tests/test.sh): S comes from `reward.txt` / `reward.json` in
  `$TRSI_LOGS_DIR` (S = 1{r >= 1}; both present and different is refused); P and N from
  `ctrf.json` there if the script wrote one (otherwise the report is invalid and rewards fall
  back to S).
* ``terminal-bench``: run-tests.sh; its pytest -rA summary is the verdict.
* ``builtin``: a Python check function over the artifacts (and commands run in the
  verifier sandbox); its results are written as a real CTRF document and parsed back.

Every report goes through `terminal_rsi.rewards.parse_ctrf`. A verifier that runs past its
timeout, is killed, crashes or leaves no verdict after the tests began is a failing verdict
(S = 0, `VerificationResult.failure` says which and why): code the agent wrote, or left
behind, could have caused it. Only what the agent had no means to cause raises
`VerifierError` (no verdict): a sandbox that fails, a verifier that cannot start, a
built-in check that raises.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import posixpath
import re
import shlex
import tarfile
import tempfile
import time
import types
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from terminal_rsi.rewards import (
    DEFAULT_HYGIENE,
    HygieneRule,
    VerificationReport,
    parse_ctrf,
    parse_reward_value,
    success_from_exit_code,
    success_from_reward,
)
from terminal_rsi.sandbox import (
    PLAIN_POLICIES,
    BadRequest,
    SandboxError,
    SandboxSpec,
    open_sandbox,
)
from terminal_rsi.sandbox import image as image_mod
from terminal_rsi.sandbox.base import files_to_tar
from terminal_rsi.sandbox.compose import ComposeService, open_compose_sandbox
from terminal_rsi.sandbox.docker_backend import docker_available
from terminal_rsi.sandbox.errors import InfrastructureError
from terminal_rsi.sandbox.terminal import session_keystrokes
from terminal_rsi.tasks import _files
from terminal_rsi.tasks.spec import (
    MAX_TREE_BYTES,
    SESSION_SOLUTION_WAIT_S,
    TERMINAL_TAG,
    VERIFIER_LOGS_DIR,
    EnvironmentBuildFailed,
    EnvironmentUnavailable,
    Task,
)

VERIFIER_DIR_PREFIX = ".trsi_verifier"
MIN_CTRF_VERSION = (0, 6)
# pytest exit codes: 0 ok, 1 tests failed, 2 interrupted/collection errors, 3 internal
# error, 4 usage error, 5 no tests collected. Only after 0 and 1 did the tests run to the
# end: the only statuses whose report is a verdict.
PYTEST_RAN = (0, 1)
# How a verifier that began its tests can fail (VerificationResult.failure): each scores 0.
FAILURES = ("timeout", "crash", "refused")
# Every verifier command's environment in the workspace layout: no user site-packages, no
# bytecode written; a built-in check's commands also keep the working directory (the
# agent's workspace) off python's module path (a planted json.py would answer for json).
PROTECTED_ENV = {"PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1"}
BUILTIN_ENV = {**PROTECTED_ENV, "PYTHONSAFEPATH": "1"}
VERDICT_FILES = ("ctrf.json", "reward.txt", "reward.json")
# Compiled Python in a workspace: dropped before verification (`_filter_tar`, `_SCRUB`).
COMPILED_PYTHON = ("__pycache__", ".pyc")
_SCRUB = (f"rm -rf ./{VERIFIER_DIR_PREFIX}* && find . -xdev \\( -name {COMPILED_PYTHON[0]} "
          f"-o -name '*{COMPILED_PYTHON[1]}' \\) -prune -exec rm -rf -- {{}} +")

# The pytest kind's interpreter bootstrap (`python3 -I -c "$TRSI_PYTEST_BOOT" <pytest args>`):
# it keeps the exec's stdout as the verdict channel (a non-inheritable descriptor; fd 1 then
# points at stderr, so nothing else writes to the channel), makes the process non-dumpable
# (no process of the same uid opens /proc/<pid>/fd or ptraces it), writes "<nonce>started"
# once pytest is imported, writes the CTRF plugin's report (pytest-json-ctrf 0.6: its
# `_report`, after the plugin's own session-finish hook, which saves to /dev/null) into the
# channel, and closes it with "<nonce>{rc, collected}". The nonce comes from the environment
# and leaves it before any test is collected.
PYTEST_BOOT = r"""
import ctypes, json, os, sys
nonce = os.environ.pop("TRSI_VERDICT_NONCE", "")
chan = os.dup(1)
os.dup2(2, 1)
try:
    ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)
except Exception:
    pass
runtime = os.environ.pop("TRSI_PYTEST_RUNTIME", "")
if runtime:
    sys.path.insert(0, runtime)
import pytest
def send(text):
    data = text.encode()
    while data:
        data = data[os.write(chan, data):]
send("\n" + nonce + "started\n")
collected = []
class Channel:
    def pytest_collection_finish(self, session):
        collected[:] = [item.nodeid for item in session.items]
    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session):
        plugin = session.config.pluginmanager.get_plugin("ctrf_plugin")
        if plugin is not None and getattr(plugin, "_report", None):
            send(json.dumps(plugin._report.get_report(), default=str))
rc = int(pytest.main(sys.argv[1:] + ["--ctrf", os.devnull], plugins=[Channel()]))
send("\n" + nonce + json.dumps({"rc": rc, "collected": collected}) + "\n")
sys.exit(rc)
"""


class VerifierError(RuntimeError):
    """The verifier produced no verdict (timeout, crash, infrastructure failure).

    Distinct from a score of 0: the episode must be re-verified or dropped, never rewarded.

    Attributes:
      kind: "timeout", "crash" or "infrastructure".
      artifacts: whatever the verifier left (stdout/stderr, partial report).
    """

    def __init__(self, kind: str, message: str, artifacts: Mapping[str, bytes] | None = None):
        self.kind = kind
        self.artifacts = dict(artifacts or {})
        super().__init__(f"verifier {kind}: {message}")


@dataclasses.dataclass(frozen=True)
class VerificationResult:
    """One verifier run.

    Attributes:
      report: the parsed VerificationReport (P, N, S, validity).
      exit_code: the verifier command's exit status (None for builtin checks).
      reward: Harbor's terminal reward r, if the task wrote one.
      ctrf: the CTRF document, if one was produced.
      artifacts: raw files: "ctrf.json", "stdout.txt", "stderr.txt", "reward.txt"/"reward.json".
      mode: "separate" or "shared".
      duration_s: wall time of the whole verification (sandbox start included).
      failure: "" when the verifier reached a verdict; otherwise how it failed after the
        tests began ("timeout", "crash", "refused": a planted or inconsistent verdict),
        which scores S = 0 with the reason in `report` (`FAILURES`).
    """

    task_id: str
    family: str
    report: VerificationReport
    exit_code: int | None
    reward: float | None
    ctrf: dict | None
    artifacts: Mapping[str, bytes]
    mode: str
    duration_s: float
    failure: str = ""

    @property
    def S(self) -> int:  # noqa: N802
        return self.report.S

    @property
    def P(self) -> int:  # noqa: N802
        return self.report.P

    @property
    def N(self) -> int:  # noqa: N802
        return self.report.N


# ----------------------------------------------------------------------------- sandboxes

DEFAULT_BACKEND = "local"
# Where the host's pytest runtime goes in a task's own container (kind "pytest" with
# absolute test paths, when the image's python lacks pytest or the CTRF plugin).
TASK_PYTEST_RUNTIME_DIR = "/tmp/.trsi_pytest_runtime"
# How long a multi-container task's services may take to start (and get healthy).
SERVICES_START_TIMEOUT_S = 120.0


def in_task_image(task: Task) -> bool:
    """Whether `task` runs in its own image with its paths as written (the Terminal-Bench and
    Harbor layout: WORKDIR, /tests, /logs/verifier, /solution), not in the workspace layout
    of the built-in tasks."""
    return bool(task.verifier.tests_dir) or task.oracle is not None


def backend_problem(task: Task, backend: str) -> str | None:
    """Why `task` cannot run honestly on `backend` (None: it can)."""
    env = task.environment
    where = f"task {task.id}"
    remote = backend.startswith(("http://", "https://"))
    if backend == "docker":
        return None
    if env.multi_container:
        return (f"{where}: its environment is a {len(env.services)}-service docker compose "
                f"setup ({', '.join(env.services)}), which runs on backend='docker' only "
                "(through docker compose)")
    if in_task_image(task):
        paths = ", ".join(p for p in (env.workdir or "its WORKDIR", task.verifier.tests_dir,
                                      task.oracle.dir if task.oracle else "") if p)
        steps = "; ".join(_image_steps(env)[:3])
        return (f"{where}: the {'bridge' if remote else 'local'} backend cannot run it as "
                f"written: {steps + '; ' if steps else ''}its files and tests use the image's "
                f"paths ({paths}), which a sandbox on the host's userland does not have. Use "
                "backend='docker'")
    if env.image and env.dockerfile is None:
        return (f"{where}: its environment is the image {env.image!r}; local sandboxes run "
                "on the host's userland and cannot provide it. Use backend='docker' on a host "
                "that has the image")
    if env.unsupported:
        return (f"{where}: its Dockerfile has steps a local sandbox cannot reproduce: "
                + "; ".join(env.unsupported) + ". Use backend='docker'")
    return None


def _image_steps(env) -> list[str]:
    """The Dockerfile instructions a sandbox on the host's userland cannot stand in for."""
    steps = [f"FROM {env.base_image} (the host's userland is not that image)"
             ] if env.base_image else []
    if env.image and not env.dockerfile:
        steps.append(f"the image {env.image}")
    return steps + [f"RUN {cmd}" for cmd in env.setup] + list(env.unsupported)


def _spec_for(task: Task, image: str | None, *, allow_network: bool = True):
    env = task.environment
    kw: dict[str, Any] = {"env": dict(env.env), "network": bool(env.network and allow_network)}
    if image:
        kw["image"] = image
    if in_task_image(task):
        kw["profile"] = "image"
        kw["workdir"] = env.workdir or ""
    if env.memory_mb:
        kw["memory_mb"] = int(env.memory_mb)
    if env.storage_mb:
        kw["disk_mb"] = int(env.storage_mb)
    if env.cpus:
        kw["cpus"] = float(env.cpus)
    return SandboxSpec(**kw)


def task_image(task: Task, backend: str, *, allow_network: bool = False) -> str | None:
    """The image a task runs in on `backend` (None: the backend's default).

    Docker: the task's own Dockerfile is built by the engine (BuildKit: multi-stage builds,
    heredocs, ENV expansion are its job), cached by the build context's content
    (`image.build_context_image`), offline unless the task asks for network and
    `allow_network`, within the task's build timeout; a named image must be present.
    Raises EnvironmentUnavailable (a base image or the engine missing) or
    EnvironmentBuildFailed (the Dockerfile fails or times out). Local backends have no
    images: built-in tasks reproduce their Dockerfile's steps on the host userland.
    """
    env = task.environment
    if backend != "docker":
        return None
    return _service_image(task, env.dockerfile, env.context, env.image, allow_network)


def _service_image(task: Task, dockerfile: str | None, context: str | None,
                   image: str | None, allow_network: bool) -> str | None:
    """The image of one service of `task` (`task_image`'s rules and errors)."""
    env = task.environment
    try:
        if dockerfile is None:
            if image and not image_mod.image_present(image):
                raise image_mod.BaseImageMissing(image)
            return image
        return image_mod.build_context_image(
            context or os.path.dirname(dockerfile), dockerfile,
            network=bool(env.network and allow_network), timeout_s=env.build_timeout_s)
    except (image_mod.BaseImageMissing, image_mod.EngineUnavailable) as e:
        raise EnvironmentUnavailable(f"task {task.id}: {e}") from e
    except (image_mod.BuildFailed, image_mod.BuildTimeout) as e:
        raise EnvironmentBuildFailed(f"task {task.id}: its environment does not build: {e}"
                                     ) from e


def plain_allowed(task: Task, allow_plain: bool | str) -> bool:
    """May `task` run in plain (unisolated) local mode under policy `allow_plain`?

    `allow_plain` is one of `terminal_rsi.sandbox.PLAIN_POLICIES` (the config's
    ``tasks.allow_plain_sandbox``), or a bool: True for "always", False for "never".
    "builtin" admits only the built-in tasks: a task directory from disk is untrusted input.
    """
    policy = {True: "always", False: "never"}.get(allow_plain, allow_plain)
    if policy not in PLAIN_POLICIES:
        raise BadRequest(f"plain sandbox policy {allow_plain!r}; choose one of {PLAIN_POLICIES}")
    return policy == "always" or (policy == "builtin" and task.format == "builtin")


def check_plain_allowed(task: Task, backend: str, allow_plain: bool | str) -> None:
    """Refuse a named ``local-plain`` backend for tasks from disk unless the policy allows it.

    Built-in tasks may run on ``local-plain`` when it is named; a Terminal-Bench or Harbor
    task directory needs the policy "always". ``local`` itself falls back to plain only where
    `plain_allowed` (see ``LocalSandbox``).
    """
    if backend == "local-plain" and task.format != "builtin" and not plain_allowed(
            task, allow_plain):
        raise BadRequest(
            f"task {task.id} ({task.format}) would run in the plain local sandbox, which does "
            "not isolate the filesystem, network or /proc; use backend 'local' (bubblewrap) "
            "or 'docker', or allow it explicitly with tasks.allow_plain_sandbox='always'")


def open_task_sandbox(task: Task, backend: str = DEFAULT_BACKEND, *,
                      allow_plain: bool | str = False, allow_network: bool = False,
                      **sandbox_kwargs):
    """Start the agent's sandbox for `task`, ready for the agent.

    A Terminal-Bench or Harbor task (`in_task_image`) runs on Docker in its own image, as its
    own tools run it (profile "image": the image's user, WORKDIR and environment, a writable
    root filesystem, our limits). A built-in task gets the workspace layout: its files
    seeded into the workspace, its Dockerfile's RUN steps replayed on local backends.

    ``allow_plain`` (a policy from `PLAIN_POLICIES`, or a bool) says whether this task may
    run as plain subprocesses: backend ``local`` falling back where bubblewrap is unusable,
    or ``local-plain`` named for a task from disk (`plain_allowed`). ``allow_network``: a task
    that asks for network gets it only if this is set (else it runs offline).

    Raises EnvironmentUnavailable (plainly worded) when the environment cannot be provided
    on this backend (`backend_problem`, a missing base image or engine, a RUN step that fails
    on the local host userland), EnvironmentBuildFailed when the task's Dockerfile does not
    build, BadRequest if plain mode is needed and not allowed.
    """
    problem = backend_problem(task, backend)
    if problem:
        raise EnvironmentUnavailable(problem)
    image = task_image(task, backend, allow_network=allow_network)
    check_plain_allowed(task, backend, allow_plain)
    sb = start_sandbox(task, backend, image, allow_plain=plain_allowed(task, allow_plain),
                       allow_network=allow_network, **sandbox_kwargs)
    try:
        env = task.environment
        if in_task_image(task):  # the image holds the task's files where its Dockerfile put
            copy_volumes(task, sb)  # them; bind mounts from the build context are copied
            return sb
        seed_files(sb, env.files, env.modes)
        if backend != "docker" and not backend.startswith(("http://", "https://")):
            for cmd in env.setup:
                r = sb.exec(cmd, timeout=max(60.0, task.agent_timeout_s))
                if not r.ok:
                    raise EnvironmentUnavailable(
                        f"task {task.id}: Dockerfile step `RUN {cmd}` fails in a local "
                        f"sandbox (exit {r.exit_code}): {r.stderr.strip()[-500:]}. The "
                        "environment needs its image: use backend='docker'")
    except BaseException:
        sb.close()
        raise
    return sb


def copy_volumes(task: Task, sb) -> None:
    """Copy the agent service's bind mounts from inside its build context
    (`Environment.volumes`) into the container: a snapshot read through the task directory's
    guarded reader (no links, sizes capped), so nothing the container does reaches the task
    directory."""
    if not task.environment.volumes:
        return
    td = _files.TaskDir(task.source)
    for source, target in task.environment.volumes:
        if td.kind(source, "volumes") == "dir":
            sb.put_tar(files_to_tar(td.read_tree(source, "volumes"), mode=0o755), dest=target)
        else:
            data = td.read_bytes(source, "volumes", limit=MAX_TREE_BYTES)
            sb.put_tar(files_to_tar({posixpath.basename(target): data}, mode=0o755),
                       dest=posixpath.dirname(target))


def start_sandbox(task: Task, backend: str, image: str | None, *, allow_plain: bool,
                  allow_network: bool, **sandbox_kwargs):
    """A bare sandbox of `task`'s environment from `image` (`task_image`): a multi-container
    task's services as one docker compose project (`sandbox.compose`), any other one
    container or local sandbox. No engine is EnvironmentUnavailable."""
    env = task.environment
    spec = _spec_for(task, image, allow_network=allow_network)
    try:
        if not env.multi_container:
            return open_sandbox(spec, backend=backend, allow_plain=allow_plain,
                                **sandbox_kwargs)
        services = [ComposeService(
            s.name, _service_image(task, s.dockerfile, s.context, s.image, allow_network),
            env=dict(s.env), command=s.command, entrypoint=s.entrypoint,
            workdir=s.workdir or "", healthcheck=s.healthcheck) for s in env.sidecars]
        return open_compose_sandbox(spec, env.agent_service or "main", services,
                                    start_timeout_s=SERVICES_START_TIMEOUT_S)
    except InfrastructureError as e:
        if docker_available() or backend != "docker":
            raise
        raise EnvironmentUnavailable(f"task {task.id}: no Docker engine here ({e})") from e


def task_sandbox_factory(tasks) -> Callable[[Task], Any]:
    """`open_task_sandbox` with the settings of a config's `tasks` section (`backend`,
    `allow_plain_sandbox`, `allow_network`): the sandbox factory of a stage's episodes."""

    def factory(task: Task):
        return open_task_sandbox(task, tasks.backend, allow_plain=tasks.allow_plain_sandbox,
                                 allow_network=tasks.allow_network)

    return factory


def seed_files(sb, files: Mapping[str, bytes], modes: Mapping[str, int] | None = None) -> None:
    """Put files into a sandbox workspace, with per-file modes (default 0o644)."""
    modes = modes or {}
    by_mode: dict[int, dict[str, bytes]] = {}
    for path, data in files.items():
        by_mode.setdefault(modes.get(path, 0o644), {})[path] = data
    for mode, group in sorted(by_mode.items()):
        sb.put_files(group, mode=mode)


def run_solution(task: Task, sb, *, timeout: float | None = None) -> list[list[Any]]:
    """Run the reference solution; returns the results per turn.

    A task with an `Oracle` (Terminal-Bench's solution.sh, Harbor's solution/) runs as its
    own tools run it: `run_oracle` (one `SessionOutput`). A Terminal-Bench solution.yaml
    types its commands into the sandbox's terminal session one by one, as Terminal-Bench's
    oracle does, each waited for up to `timeout` (default: the agent's timeout); a built-in
    task that needs a terminal (tag "terminal") does the same with each command waited for
    up to `SESSION_SOLUTION_WAIT_S`. The session is opened here and left open for the
    verifier (`SessionOutput`s). Any other task runs each command by exec (`ExecResult`s)."""
    if task.oracle is not None:
        return [[run_oracle(task, sb, timeout=timeout)]]
    typed = TERMINAL_TAG in task.metadata.tags or in_task_image(task)
    term = sb.open_session() if typed else None
    out = []
    for turn in task.solution:
        results = []
        for cmd in turn:
            if term is not None:
                wait = timeout or task.agent_timeout_s
                if not in_task_image(task):
                    wait = min(wait, SESSION_SOLUTION_WAIT_S)
                results.append(term.run(session_keystrokes(cmd), wait))
            else:
                results.append(sb.exec(cmd, timeout=timeout or task.agent_timeout_s))
        out.append(results)
    return out


def run_oracle(task: Task, sb, *, timeout: float | None = None):
    """The task's oracle as its own tools run it: its files placed at their absolute
    directory, then its command typed into the sandbox's terminal session (opened here and
    left open, so what the solution starts keeps running for the verifier), with the
    oracle's environment, waiting up to `timeout` (default: the agent's timeout) for it to
    finish. Returns the `SessionOutput` (``exit_code``: the command's status; ``done``
    False: it did not finish in time)."""
    oracle = task.oracle
    sb.put_tar(files_to_tar(dict(oracle.files), mode=0o755), dest=oracle.dir)
    term = sb.open_session()
    assignments = "".join(f"{k}={shlex.quote(v)} " for k, v in oracle.env.items())
    return term.run(f"{assignments}{oracle.command}\n", timeout or task.agent_timeout_s)


# ----------------------------------------------------------------------------- artifacts


def _filter_tar(data: bytes, drop_prefix: str) -> bytes:
    """Drop members under `drop_prefix*` (stale verifier dirs planted by the agent) and
    compiled Python (`COMPILED_PYTHON`: a planted ``.pyc`` would run instead of the source a
    check imports)."""
    src = tarfile.open(fileobj=io.BytesIO(data), mode="r:*")
    buf = io.BytesIO()
    with src, tarfile.open(fileobj=buf, mode="w") as dst:
        for m in src.getmembers():
            parts = posixpath.normpath(m.name).split("/")
            if parts[0].startswith(drop_prefix) or is_compiled_python(parts):
                continue
            dst.addfile(m, src.extractfile(m) if m.isreg() else None)
    return buf.getvalue()


def is_compiled_python(parts: list[str]) -> bool:
    """Whether a path (its components) is compiled Python: in a ``__pycache__`` directory,
    or a ``.pyc`` file."""
    return COMPILED_PYTHON[0] in parts or parts[-1].endswith(COMPILED_PYTHON[1])


@dataclasses.dataclass(frozen=True)
class FileEntry:
    data: bytes
    mode: int
    kind: str  # "file", "dir", "symlink"
    target: str = ""


class Snapshot(Mapping):
    """The workspace artifacts as {relative path: FileEntry} (directories included)."""

    def __init__(self, entries: Mapping[str, FileEntry]):
        self._e = types.MappingProxyType(dict(entries))
        self._files = types.MappingProxyType(
            {k: v.data for k, v in self._e.items() if v.kind == "file"})

    @classmethod
    def from_tar(cls, data: bytes, strip: str = "") -> Snapshot:
        entries = {}
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tf:
            for m in tf.getmembers():
                name = posixpath.normpath(m.name)
                if strip and (name == strip or name.startswith(strip + "/")):
                    name = posixpath.relpath(name, strip)
                if name == ".":
                    continue
                if m.isreg():
                    f = tf.extractfile(m)
                    entries[name] = FileEntry(f.read() if f else b"", m.mode & 0o7777, "file")
                elif m.isdir():
                    entries[name] = FileEntry(b"", m.mode & 0o7777, "dir")
                elif m.issym():
                    entries[name] = FileEntry(b"", m.mode & 0o7777, "symlink", m.linkname)
        return cls(entries)

    def __getitem__(self, key):
        return self._e[key]

    def __iter__(self):
        return iter(self._e)

    def __len__(self):
        return len(self._e)

    def files(self) -> Mapping[str, bytes]:
        """{path: bytes} of the regular files (read-only view)."""
        return self._files

    def text(self, path: str) -> str | None:
        e = self._e.get(path)
        if e is None or e.kind != "file":
            return None
        return e.data.decode("utf-8", errors="replace")


class ArtifactsRefused(Exception):
    """What the agent left cannot be copied out, or leaves no room for the verifier's files
    (too many entries, too many bytes, a full disk): its doing, so the episode gets a
    failing verdict, not an infrastructure error."""


def _place(put, data, what: str) -> None:
    """``put(data)`` into a verifier workspace; a refusal (BadRequest) is ArtifactsRefused."""
    try:
        put(data)
    except BadRequest as e:
        raise ArtifactsRefused(f"{what} could not be placed for verification: {e}") from e


def collect_artifacts(task: Task, sb) -> bytes:
    """The declared artifacts of the agent's sandbox as one tar stream (stale verifier
    directories removed).

    Links come out as links (never followed) and FIFOs, sockets and devices are left out,
    so whatever the agent leaves in its workspace never turns a verdict into an error.
    Raises ArtifactsRefused when the workspace exceeds the download caps.
    """
    paths = task.verifier.artifacts or (".",)
    if paths == (".",):
        try:
            return _filter_tar(sb.get_tar("."), VERIFIER_DIR_PREFIX)
        except BadRequest as e:
            raise ArtifactsRefused(f"the agent's workspace could not be copied for "
                                   f"verification: {e}") from e
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as dst:
        for p in paths:
            try:
                data = sb.get_tar(p)
            except Exception:  # noqa: BLE001 - a missing artifact is the agent's failure
                continue
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as src:
                for m in src.getmembers():
                    dst.addfile(m, src.extractfile(m) if m.isreg() else None)
    return _filter_tar(buf.getvalue(), VERIFIER_DIR_PREFIX)


# ----------------------------------------------------------------------------- pytest runtime

_RUNTIME_DISTS = ("pytest", "pytest-json-ctrf")
_runtime_tar: bytes | None = None
_probe_cache: dict[tuple[str, str], bool] = {}


def ctrf_plugin_version() -> tuple[int, ...]:
    import importlib.metadata as md

    v = md.version("pytest-json-ctrf")
    return tuple(int(x) for x in v.split(".")[:3] if x.isdigit())


def pytest_runtime_tar() -> bytes:
    """The host's pytest + pytest-json-ctrf (and their runtime requirements) as a tar of a
    site-packages directory, for sandboxes whose python lacks them (pure Python; cached)."""
    global _runtime_tar
    if _runtime_tar is not None:
        return _runtime_tar
    import importlib.metadata as md

    from packaging.requirements import Requirement

    if ctrf_plugin_version() < MIN_CTRF_VERSION:
        raise VerifierError("infrastructure", "pytest-json-ctrf >= 0.6 is required on the host "
                            "(pip install 'pytest-json-ctrf>=0.6,<0.7')")
    seen: set[str] = set()
    todo = list(_RUNTIME_DISTS)
    files: dict[str, bytes] = {}
    while todo:
        name = todo.pop()
        key = name.lower().replace("_", "-")
        if key in seen:
            continue
        seen.add(key)
        dist = md.distribution(name)
        for req in dist.requires or ():
            r = Requirement(req)
            if r.marker is None or r.marker.evaluate({"extra": ""}):
                todo.append(r.name)
        for f in dist.files or ():
            rel = str(f).replace(os.sep, "/")
            if rel.startswith("..") or "__pycache__" in rel or rel.endswith(".pyc"):
                continue
            path = f.locate()
            if os.path.isfile(path):
                with open(path, "rb") as fh:
                    files[rel] = fh.read()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for rel, data in sorted(files.items()):
            info = tarfile.TarInfo(rel)
            info.size = len(data)
            info.mode = 0o644
            tf.addfile(info, io.BytesIO(data))
    _runtime_tar = buf.getvalue()
    return _runtime_tar


_PROBE = ("python3 -I -c 'import importlib.metadata as m, sys; "
          "v = tuple(int(x) for x in m.version(\"pytest-json-ctrf\").split(\".\")[:2]); "
          "import pytest; sys.exit(0 if v >= (0, 6) else 1)'")


def _needs_runtime(sb, backend: str, policy: str, fresh: bool) -> bool:
    """Whether the host's pytest runtime must be copied into `sb` under `policy`. "auto"
    asks the sandbox's isolated python (`_PROBE`); the answer is cached per backend and
    image only from a `fresh` sandbox (separate mode): one the agent used could answer
    falsely, and must not decide for other episodes."""
    if policy == "inject":
        return True
    if policy == "sandbox":
        return False
    key = (backend, sb.spec.image)
    if key in _probe_cache:
        return _probe_cache[key]
    needs = not sb.exec(_PROBE, timeout=30).ok
    if fresh:
        _probe_cache[key] = needs
    return needs


# ----------------------------------------------------------------------------- CTRF emitter


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """One check of a built-in verifier. Hygiene checks are tagged and excluded from P/N."""

    name: str
    passed: bool
    hygiene: bool = False
    message: str = ""


def ctrf_document(checks: list[CheckResult], *, tool: str = "terminal_rsi.builtin",
                  start_ms: int | None = None, stop_ms: int | None = None) -> dict:
    """A CTRF 1.0.0 report (the current spec shape) of `checks`."""
    now = int(time.time() * 1000)
    start_ms = now if start_ms is None else start_ms
    stop_ms = now if stop_ms is None else stop_ms
    tests = []
    for c in checks:
        t = {"name": c.name, "status": "passed" if c.passed else "failed", "duration": 0,
             "tags": ["hygiene"] if c.hygiene else []}
        if c.message and not c.passed:
            t["message"] = c.message
        tests.append(t)
    n_pass = sum(c.passed for c in checks)
    return {
        "reportFormat": "CTRF",
        "specVersion": "1.0.0",
        "reportId": str(uuid.uuid4()),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start_ms / 1000)),
        "generatedBy": tool,
        "results": {
            "tool": {"name": tool},
            "summary": {"tests": len(checks), "passed": n_pass, "failed": len(checks) - n_pass,
                        "skipped": 0, "pending": 0, "other": 0, "start": start_ms,
                        "stop": stop_ms},
            "tests": tests,
        },
    }


# ----------------------------------------------------------------------------- verify


def _encode(s: str) -> bytes:
    return s.encode("utf-8", errors="replace")


def verify(
    task: Task,
    sb,
    *,
    backend: str = DEFAULT_BACKEND,
    mode: str | None = None,
    hygiene: HygieneRule = DEFAULT_HYGIENE,
    pytest_runtime: str = "auto",
    sandbox_kwargs: Mapping[str, Any] | None = None,
    allow_plain: bool | str | None = None,
    allow_network: bool = False,
) -> VerificationResult:
    """Run task's protected verifier on the finished agent sandbox `sb`.

    Args:
      task: the task.
      sb: the agent's sandbox after the episode (read only in separate mode; in shared mode
        its terminal session is closed first unless the task's verifier is `live`).
      backend: backend for the fresh verifier sandbox (separate mode).
      mode: override the task's verifier mode ("separate" / "shared").
      hygiene: which checks are hygiene checks (excluded from P and N).
      pytest_runtime: "auto" (copy the host's pytest in if the sandbox python lacks it),
        "inject" (always), or "sandbox" (never).
      sandbox_kwargs: extra arguments for the verifier sandbox (e.g. base_dir).
      allow_plain: the plain-mode policy for a fresh local verifier sandbox (see
        `plain_allowed`; None: plain if and only if the agent's sandbox `sb` is plain).
      allow_network: a fresh verifier sandbox gets network if the task asks for it and this
        is set.

    Returns:
      A VerificationResult whose report came through `parse_ctrf`; a verifier that failed
      after its tests began is a result with S = 0 and `failure` set.

    Raises:
      VerifierError: no verdict, through nothing the agent could do (a sandbox that fails, a
        verifier that cannot start, a built-in check that raises).
    """
    t0 = time.monotonic()
    ver = task.verifier
    mode = mode or ver.mode
    if mode not in ("separate", "shared"):
        raise ValueError(f"verifier mode {mode!r}; choose separate or shared")
    if mode == "separate" and TERMINAL_TAG in task.metadata.tags:
        raise ValueError(f"task {task.id} is tagged {TERMINAL_TAG!r}: its checks look at the "
                         "environment the agent left (what still runs), which a fresh sandbox "
                         "cannot see; verify it in mode 'shared' (its own)")
    vdir = f"{VERIFIER_DIR_PREFIX}_{uuid.uuid4().hex[:12]}"
    owned = None
    sandbox_kwargs = dict(sandbox_kwargs or {})
    allow_plain = sandbox_kwargs.pop("allow_plain", allow_plain)
    allow_plain = (getattr(sb, "mode", None) == "plain" if allow_plain is None
                   else plain_allowed(task, allow_plain))
    try:
        artifacts = None
        processes = stop_agent(task, sb) if mode == "shared" else ()
        scrubbed = False

        def verifier_sandbox():
            nonlocal owned, artifacts, scrubbed
            if mode == "shared":
                if not scrubbed and not in_task_image(task):
                    _scrub(sb)
                    scrubbed = True
                return sb
            if owned is None:
                artifacts = collect_artifacts(task, sb) if artifacts is None else artifacts
                image = task_image(task, backend, allow_network=allow_network)
                owned = start_sandbox(task, backend, image, allow_plain=allow_plain,
                                      allow_network=allow_network, **sandbox_kwargs)
                _place(owned.put_tar, artifacts, "the agent's workspace")
            return owned

        if ver.kind == "builtin":
            # Checks read the artifacts directly; a sandbox is started only for commands.
            artifacts = collect_artifacts(task, sb)
            result = _verify_builtin(task, verifier_sandbox, artifacts, hygiene, processes,
                                     vdir)
        elif ver.tests_dir:
            result = _verify_in_task_paths(task, verifier_sandbox(), backend, hygiene,
                                           pytest_runtime, mode == "separate")
        else:
            result = _verify_command(task, verifier_sandbox(), backend, vdir, hygiene,
                                     pytest_runtime, mode == "separate")
        return dataclasses.replace(result, mode=mode, duration_s=time.monotonic() - t0)
    except ArtifactsRefused as e:  # the agent's doing: a failing verdict
        report = VerificationReport.invalid(str(e), terminal_success=False)
        return VerificationResult(task.id, task.family, report, None, None, None,
                                  types.MappingProxyType({}), mode, time.monotonic() - t0,
                                  "refused")
    except (SandboxError, EnvironmentUnavailable, EnvironmentBuildFailed) as e:
        # (the last two: a fresh verifier sandbox whose environment cannot start now)
        raise VerifierError("infrastructure", f"task {task.id}: sandbox failure during "
                            f"verification: {e}") from e
    finally:
        if owned is not None:
            owned.close()
        elif mode == "shared" and ver.kind != "builtin" and not ver.tests_dir:
            # (a builtin check places nothing; tests at the task's own path stay, as its
            # own tools leave them)
            try:
                sb.exec(f"rm -rf ./{vdir}", timeout=30)
            except SandboxError:
                pass


def stop_agent(task: Task, sb) -> tuple:
    """Before shared-mode verification: what ran in the agent's sandbox as the host saw it
    (`Sandbox.processes`, for built-in checks that judge what was left running; () for
    other kinds), then the agent's processes stopped (its terminal session closed, which
    ends everything it started), unless the task's verifier is `live` (it checks a service
    the agent left running)."""
    processes = tuple(sb.processes()) if task.verifier.kind == "builtin" else ()
    if not task.verifier.live:
        end_session(sb)
    return processes


def end_session(sb) -> None:
    """Close `sb`'s terminal session, if it has one: every process it started ends."""
    session = getattr(sb, "session", None)
    if session is not None:
        session.close()


def _scrub(sb) -> None:
    """Shared mode in the workspace layout, before any verifier command: the agent's stale
    verifier directories and its workspace's compiled Python removed (`_SCRUB`). A
    workspace that cannot be cleaned is the agent's doing (ArtifactsRefused). (A task in
    its own image keeps its files as its tools leave them: its tests and logs directories
    are replaced, `_verify_in_task_paths`.)"""
    r = sb.exec(_SCRUB, timeout=60)
    if not r.ok:
        raise ArtifactsRefused(f"the agent's workspace could not be prepared for "
                               f"verification (exit {r.exit_code}): "
                               f"{(r.stdout + r.stderr).strip()[-300:]}")


def protected_command(command: str, vdir: str) -> str:
    """A built-in check's `command` with the verifier's own HOME and TMPDIR: fresh
    directories under the sandbox's temporary directory, named after the verification
    (`vdir`), outside the workspace (so no ``~/.local`` site-packages, shell start-up file or
    config the agent left in its workspace is read). If they cannot be made (the agent made
    /tmp unwritable) the command exits 125: its check fails. (A tests directory's verifier
    gets directories placed beside its tests instead, `_verify_command`.)"""
    return (f'_trsi_v="${{TMPDIR:-/tmp}}/{vdir}"; export HOME="$_trsi_v/home" '
            'TMPDIR="$_trsi_v/tmp"; unset _trsi_v; mkdir -p -m 0700 -- "$HOME" "$TMPDIR" '
            f"|| exit 125; {command}")


def _verify_builtin(task: Task, get_sandbox, artifacts: bytes, hygiene: HygieneRule,
                    processes: tuple, vdir: str):
    snapshot = Snapshot.from_tar(artifacts)

    def run(cmd: str, timeout: float = 30.0):
        return get_sandbox().exec(protected_command(cmd, vdir),
                                  timeout=min(timeout, task.verifier.timeout_s),
                                  env=BUILTIN_ENV)

    start = int(time.time() * 1000)
    try:
        checks = list(task.verifier.check(snapshot, run, processes))
    except (VerifierError, ArtifactsRefused):
        raise
    except Exception as e:  # noqa: BLE001 - a broken check is a verifier crash, not a 0
        raise VerifierError("crash", f"task {task.id}: built-in check raised "
                            f"{type(e).__name__}: {e}") from e
    if not checks:
        raise VerifierError("crash", f"task {task.id}: built-in verifier returned no checks")
    doc = ctrf_document(checks, start_ms=start, stop_ms=int(time.time() * 1000))
    raw = json.dumps(doc, indent=1).encode()
    terminal = all(c.passed for c in checks)
    report = parse_report_bytes(raw, terminal_success=terminal, hygiene=hygiene)
    return VerificationResult(task.id, task.family, report, None, None, doc,
                              types.MappingProxyType({"ctrf.json": raw}), "", 0.0)


def parse_report_bytes(raw: bytes, *, terminal_success: bool | None,
                       hygiene: HygieneRule = DEFAULT_HYGIENE) -> VerificationReport:
    """Parse a CTRF report's bytes through `parse_ctrf`'s file path (size limit, UTF-8,
    JSON without NaN or duplicate keys, shape, counts), as a verifier's report file."""
    fd, path = tempfile.mkstemp(prefix="trsi-ctrf-", suffix=".json")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
        report = parse_ctrf(path, terminal_success=terminal_success, hygiene=hygiene)
    finally:
        os.unlink(path)
    return dataclasses.replace(report, source=None)


def _log_files(vsb, logs_dir: str) -> dict[str, bytes]:
    """The regular files directly in the verifier's logs directory `logs_dir` (workspace-
    relative, or absolute in a task's own container), in one transfer; {} when it is gone."""
    try:
        data = vsb.get_tar(logs_dir)
    except BadRequest:  # missing (the verifier removed it) or past the download caps
        return {}
    logs = Snapshot.from_tar(data, strip=posixpath.normpath(logs_dir.lstrip("/")))
    files = {name: d for name, d in logs.files().items() if "/" not in name}
    for name in VERDICT_FILES:  # a verdict file's name taken by a directory or a link
        if name in logs and name not in files:  # keeps the script from writing it
            files[name] = b"\0not a regular file"
    return files


# The pytest kind's command: `PYTEST_BOOT` under an isolated interpreter, pytest's
# configuration from the tests' pytest.ini or an empty one of the verifier's.
_PYTEST_CMD = ('python3 -I -c "$TRSI_PYTEST_BOOT" -q -rA -p no:cacheprovider -p ctrf.main '
               '-c "$TRSI_PYTEST_INI" --rootdir="$TEST_DIR" --confcutdir="$TEST_DIR" '
               '{args} "$TEST_DIR"')


def _verify_command(task, vsb, backend, vdir, hygiene, pytest_runtime, fresh):
    """The workspace layout: tests in a fresh `.trsi_verifier_<hex>/tests` ($TEST_DIR), logs
    and reports in `$TRSI_LOGS_DIR` beside it, and the command's own HOME and TMPDIR there
    too (never the workspace root, where the agent's dotfiles are)."""
    ver = task.verifier
    test_dir, logs_dir = f"{vdir}/tests", f"{vdir}/logs"
    files = {f"{test_dir}/{p}": d for p, d in ver.files.items()}
    for d in ("logs", "home", "tmp"):  # (placed, not made by the command: nothing the
        files[f"{vdir}/{d}/.keep"] = b""  # agent did to /tmp can stop the verifier)
    # pytest's configuration comes from the tests (their pytest.ini) or an empty one of the
    # verifier's, never from an ini file the agent left above the tests in its workspace
    # (`addopts = --co` there would turn an unsolved task into a pass).
    ini = f"{test_dir}/pytest.ini" if "pytest.ini" in ver.files else f"{vdir}/pytest.ini"
    files.setdefault(ini, b"[pytest]\n")
    _place(lambda f: vsb.put_files(f, mode=0o755), files, "the verifier's tests")
    # Script verifiers (Harbor's test.sh) usually run pytest too: same runtime rule.
    env = _pytest_env(vsb, backend, pytest_runtime, tests=f"{vsb.workdir}/{test_dir}",
                      logs=f"{vsb.workdir}/{logs_dir}", ini=f"{vsb.workdir}/{ini}",
                      runtime_dir=f"{vdir}/pylib",
                      env={"TRSI_WORKSPACE": vsb.workdir, **dict(ver.env)},
                      boot=ver.kind == "pytest", fresh=fresh)
    if ver.kind != "pytest":  # a script's own pytest run: the same configuration rule
        env.setdefault("PYTEST_ADDOPTS", f"-c {vsb.workdir}/{ini}")
    command = _PYTEST_CMD.format(args=ver.command) if ver.kind == "pytest" else ver.command
    own = {"HOME": f"{vsb.workdir}/{vdir}/home", "TMPDIR": f"{vsb.workdir}/{vdir}/tmp"}
    return _run_verifier(task, vsb, command, {**env, **own, **PROTECTED_ENV}, logs_dir,
                         hygiene)


def _verify_in_task_paths(task, vsb, backend, hygiene, pytest_runtime, fresh):
    """The task's own layout (Terminal-Bench, Harbor): the tests go to `tests_dir` (/tests),
    an empty `VERIFIER_LOGS_DIR` (/logs/verifier) is made, and the verifier command runs in
    the task's working directory with the verifier's environment; nothing is rewritten.
    Whatever the agent left at those paths is removed first."""
    ver = task.verifier
    tests = ver.tests_dir.rstrip("/") or "/"
    clear = vsb.exec(f"rm -rf -- {shlex.quote(tests)} {shlex.quote(VERIFIER_LOGS_DIR)}",
                     timeout=60)
    if not clear.ok:
        raise ArtifactsRefused(f"the agent's {tests} or {VERIFIER_LOGS_DIR} cannot be removed "
                               f"before verification: {clear.stderr.strip()[-300:]}")
    files = dict(ver.files)
    if ver.kind == "pytest":  # its configuration: the tests' own pytest.ini or an empty one
        files.setdefault("pytest.ini", b"[pytest]\n")
    _place(lambda t: vsb.put_tar(t, dest="/"), _task_paths_tar(tests, files),
           "the verifier's tests")
    env, command = dict(ver.env), ver.command
    if ver.kind == "pytest":
        env = _pytest_env(vsb, backend, pytest_runtime, tests=tests, logs=VERIFIER_LOGS_DIR,
                          ini=f"{tests}/pytest.ini", runtime_dir=TASK_PYTEST_RUNTIME_DIR,
                          env=env, boot=True, fresh=fresh)
        command = _PYTEST_CMD.format(args=ver.command)
    return _run_verifier(task, vsb, command, env, VERIFIER_LOGS_DIR, hygiene)


def _pytest_env(vsb, backend: str, policy: str, *, tests: str, logs: str, ini: str,
                runtime_dir: str, env: Mapping[str, str], boot: bool, fresh: bool
                ) -> dict[str, str]:
    """The environment of the verifier's pytest in either layout: where its tests, logs and
    configuration are, the bootstrap, then `env`, then the host's pytest runtime (copied to
    `runtime_dir`, relative to the workspace or absolute; on PYTHONPATH for a script's own
    pytest, and `TRSI_PYTEST_RUNTIME` for the bootstrap, whose -I ignores PYTHONPATH) when
    the sandbox's python lacks it (`_needs_runtime` under `policy`)."""
    out = {"TEST_DIR": tests, "TRSI_LOGS_DIR": logs, "TRSI_PYTEST_INI": ini,
           "PYTHONDONTWRITEBYTECODE": "1", **env}
    if boot:  # the pytest kind: the bootstrap, and only the plugins it names
        out.update(TRSI_PYTEST_BOOT=PYTEST_BOOT, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    if _needs_runtime(vsb, backend, policy, fresh):
        _place(lambda t: vsb.put_tar(t, dest=runtime_dir), pytest_runtime_tar(),
               "the verifier's pytest runtime")
        out["PYTHONPATH"] = out["TRSI_PYTEST_RUNTIME"] = posixpath.join(vsb.workdir,
                                                                         runtime_dir)
    return out


def _task_paths_tar(tests: str, files: Mapping[str, bytes]) -> bytes:
    """One upload from / : the tests (mode 0755) under `tests` and an empty, world-writable
    `VERIFIER_LOGS_DIR` (as Harbor makes it: the verifier may run as a non-root USER)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        logs = tarfile.TarInfo(VERIFIER_LOGS_DIR.lstrip("/"))
        logs.type, logs.mode, logs.mtime = tarfile.DIRTYPE, 0o777, time.time()
        tf.addfile(logs)
        for path, data in files.items():
            info = tarfile.TarInfo(posixpath.join(tests.lstrip("/"), path))
            info.size, info.mode, info.mtime = len(data), 0o755, logs.mtime
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _run_verifier(task, vsb, command, env, logs_dir, hygiene) -> VerificationResult:
    """Run the verifier command and turn what it left into a verdict (`_verdict`; the pytest
    kind's comes through its channel, `_pytest_verdict`; Terminal-Bench's is its output)."""
    ver = task.verifier
    nonce = f"TRSI-VERDICT-{uuid.uuid4().hex}:" if ver.kind == "pytest" else ""
    if nonce:
        env = {**env, "TRSI_VERDICT_NONCE": nonce}
    r = vsb.exec(command, timeout=ver.timeout_s, env=env)
    end_session(vsb)  # a live task's agent processes end before its verdict files are read
    arts = {"stdout.txt": _encode(r.stdout), "stderr.txt": _encode(r.stderr)}
    logs = {} if ver.kind == "terminal-bench" else _log_files(vsb, logs_dir)
    arts.update((name, raw) for name, raw in logs.items() if name in VERDICT_FILES)
    if r.timed_out:
        return _failed(task, "timeout", f"the verifier ran past its {ver.timeout_s:g} s "
                       "timeout", arts, r.exit_code)
    if ver.kind == "pytest":
        return _pytest_verdict(task, r, nonce, logs, arts, hygiene)
    if r.exit_code < 0:
        return _failed(task, "crash", f"the verifier was killed by signal {-r.exit_code}",
                       arts, r.exit_code)
    return _verdict(task, r, logs, arts, hygiene)


def _failed(task, failure: str, reason: str, arts: Mapping[str, bytes],
            exit_code: int | None = None) -> VerificationResult:
    """A verifier that failed after its tests began: S = 0, the reason in the report."""
    report = VerificationReport.invalid(f"verifier {failure}: {reason}",
                                        terminal_success=False)
    return VerificationResult(task.id, task.family, report, exit_code, None, None,
                              types.MappingProxyType(dict(arts)), "", 0.0, failure)


def read_channel(stdout: str, nonce: str) -> tuple[bool, str | None, dict | None]:
    """(started, CTRF text, closing record) from a pytest verifier's channel (`PYTEST_BOOT`):
    started False when pytest never ran; CTRF None when nothing came between the records;
    the record None when the process ended without writing it (or it is unreadable)."""
    parts = stdout.split("\n" + nonce)
    started = len(parts) > 1 and parts[1].startswith("started\n")
    if not started:
        return False, None, None
    ctrf = parts[1][len("started\n"):].strip() or None
    record = None
    if len(parts) == 3:
        try:
            record = json.loads(parts[2])
        except ValueError:
            record = None
    if not isinstance(record, dict) or not isinstance(record.get("rc"), int) or not \
            isinstance(record.get("collected"), list):
        record = None
    return True, ctrf, record


def _pytest_verdict(task, r, nonce, logs, arts, hygiene) -> VerificationResult:
    """The pytest kind's verdict from its channel: pytest's exit status as it returned it
    (equal to the command's), the CTRF report that came through the channel, whose tests are
    what pytest collected. What the tests could have caused scores 0 (`_failed`); a pytest
    that never started is a VerifierError."""
    tail = (r.stdout + r.stderr).strip()[-800:]
    started, ctrf, record = read_channel(r.stdout, nonce)
    if not started:
        raise VerifierError("crash", f"task {task.id}: the verifier's pytest could not start "
                            f"(exit {r.exit_code}): {tail}", arts)
    if ctrf is not None:
        arts = {**arts, "ctrf.json": _encode(ctrf)}
    planted = sorted(set(logs) & set(VERDICT_FILES))
    if record is None:
        return _failed(task, "crash", f"pytest ended (exit {r.exit_code}) without its closing "
                       "record: killed, or code the tests ran ended the process", arts,
                       r.exit_code)
    if planted:
        return _failed(task, "refused", f"verdict files {planted} appeared in the logs "
                       "directory, where this verifier writes none (written by code the "
                       "tests ran)", arts, r.exit_code)
    if record["rc"] != r.exit_code:
        return _failed(task, "refused", f"the command exited {r.exit_code}, pytest returned "
                       f"{record['rc']}", arts, r.exit_code)
    if record["rc"] not in PYTEST_RAN or ctrf is None:
        # interrupted, a collection error, no tests, an internal or usage error, a signal:
        # no per-test verdict to trust (P = 0)
        return _failed(task, "crash", f"pytest exited {record['rc']}"
                       f"{' without a CTRF report' if ctrf is None else ''}: {tail}", arts,
                       r.exit_code)
    terminal = success_from_exit_code(record["rc"])
    report = parse_report_bytes(_encode(ctrf), terminal_success=terminal, hygiene=hygiene)
    if report.valid:
        names = sorted({str(t.get("name")) for t in json.loads(ctrf)["results"]["tests"]})
        if names != sorted(set(record["collected"])):
            return _failed(task, "refused", f"the CTRF report's {len(names)} tests are not "
                           f"the {len(set(record['collected']))} pytest collected", arts,
                           r.exit_code)
    ctrf_obj = json.loads(ctrf) if report.valid else None
    return VerificationResult(task.id, task.family, report, r.exit_code, None, ctrf_obj,
                              types.MappingProxyType(arts), "", 0.0)


def _verdict(task, r, logs, arts, hygiene) -> VerificationResult:
    """A script's verdict (Harbor: the reward file; P and N from its ctrf.json) or
    Terminal-Bench's (pytest's -rA summary). No verdict scores 0 (`_failed`)."""
    ver = task.verifier
    tail = (r.stdout + r.stderr).strip()[-800:]
    reward = None
    ctrf_raw = logs.get("ctrf.json")
    if ver.kind == "terminal-bench":
        results = pytest_summary_results(tb_verdict_output(r))
        if results is None:
            return _failed(task, "crash", f"{ver.command!r} exited {r.exit_code} without "
                           "pytest's short test summary (-rA), which is Terminal-Bench's "
                           f"verdict: {tail}", arts, r.exit_code)
        checks = [CheckResult(name, passed) for name, passed in results.items()]
        terminal = all(results.values())  # Terminal-Bench: resolved iff every test passed
        ctrf_raw = json.dumps(ctrf_document(checks, tool="pytest -rA")).encode()
        arts = {**arts, "ctrf.json": ctrf_raw}
    else:
        reward, why = script_reward(logs)
        if why:
            return _failed(task, "crash" if reward is None else "refused",
                           f"the verifier script exited {r.exit_code}: {why}: {tail}", arts,
                           r.exit_code)
        terminal = success_from_reward(reward)
    ctrf_obj = None
    if ctrf_raw is not None:
        report = parse_report_bytes(ctrf_raw, terminal_success=terminal, hygiene=hygiene)
        if report.valid:
            ctrf_obj = json.loads(ctrf_raw)
    else:
        report = VerificationReport.invalid("the verifier wrote no CTRF report (ctrf.json)",
                                            terminal_success=terminal)
    return VerificationResult(task.id, task.family, report, r.exit_code, reward, ctrf_obj,
                              types.MappingProxyType(arts), "", 0.0)


def script_reward(logs: Mapping[str, bytes]) -> tuple[float | None, str]:
    """(reward, "") from a script verifier's reward.txt or reward.json, or (None or the
    reward, why it is not a verdict): neither written, unreadable, or both written with
    different values (a second writer: one of them came from code the script ran)."""
    values = {}
    for name in ("reward.txt", "reward.json"):
        if name in logs:
            values[name] = parse_reward_value(logs[name])
            if values[name] is None:
                return None, f"unreadable {name}: {logs[name][:200]!r}"
    if not values:
        return None, "no reward.txt or reward.json written"
    if len(set(values.values())) > 1:
        return 0.0, (f"reward.txt says {values['reward.txt']:g} and reward.json "
                     f"{values['reward.json']:g}")
    return next(iter(values.values())), ""


# Terminal-Bench's pytest parser: the lines after pytest's "short test summary info" banner
# (printed with -rA) read "STATUS path::test[ - message]"; PASSED, XFAIL and SKIPPED count as
# passed, FAILED, XPASS and ERROR as failed, anything else is not a result. This reader also
# asks for what only pytest's own end of run prints: the last banner, followed by the final
# counts line ("1 failed, 3 passed in 0.12s"), whose counts the result lines must match, each
# test once. A summary printed by code the tests ran (then os._exit), or lines added to the
# real one, is no verdict.
_SUMMARY_BANNER = re.compile(r"=+\s*short test summary info\s*=+", re.IGNORECASE)
_FINAL_LINE = re.compile(r"^=*\s*((?:\d+ [a-z]+(?:, )?)+)(?:\s+in\s+[\d.]+s.*?)?\s*=*\s*$")
_PASSING = ("PASSED", "XFAIL", "SKIPPED")
_FAILING = ("FAILED", "XPASS", "ERROR")
# final-line words -> the status their result lines carry (skips are grouped by reason)
_COUNTED = {"passed": "PASSED", "failed": "FAILED", "xfailed": "XFAIL", "xpassed": "XPASS",
            "error": "ERROR", "errors": "ERROR"}


def pytest_summary_results(output: str) -> dict[str, bool] | None:
    """{test name: passed} from pytest's -rA short test summary in `output`, read as
    Terminal-Bench's `PytestParser` reads it (the test name is what follows the node id's
    first `::`, so `f.py::TestK::test_m` is `TestK::test_m`; a FAILED line's last
    " - message" is dropped); None when the output has no summary that pytest finished (the
    last banner, then the final counts line, the result lines matching its counts)."""
    parts = _SUMMARY_BANNER.split(output)
    if len(parts) < 2:
        return None
    lines = parts[-1].splitlines()
    final = next((i for i in range(len(lines) - 1, -1, -1)
                  if _FINAL_LINE.match(lines[i].strip())), None)
    if final is None:
        return None
    results: dict[str, bool] = {}
    seen: dict[str, int] = {}
    for line in lines[:final]:
        if line.startswith("FAILED") and " - " in line:
            line = " - ".join(line.split(" - ")[:-1])
        words = line.split(maxsplit=1)
        if len(words) < 2:
            continue
        status = words[0].strip().strip(":")
        if status not in _PASSING + _FAILING:
            continue
        name = words[1].strip().split("::", 1)[-1]
        if not name:
            continue
        if name in results and status != "SKIPPED":
            return None  # a test reported twice: a line that pytest did not print
        results[name] = status in _PASSING
        seen[status] = seen.get(status, 0) + 1
    counts: dict[str, int] = {}
    for item in _FINAL_LINE.match(lines[final].strip()).group(1).split(","):
        n, word = item.split()
        if word in _COUNTED:
            counts[_COUNTED[word]] = counts.get(_COUNTED[word], 0) + int(n)
    if any(seen.get(status, 0) != counts.get(status, 0) for status in set(_COUNTED.values())):
        return None
    return results


def tb_verdict_output(r) -> str:
    """The output Terminal-Bench's verdict is read from: the command's stdout when it has
    pytest's summary, else its stderr (never both: lines that code the tests ran printed to
    the other stream are not the summary)."""
    return r.stdout if _SUMMARY_BANNER.search(r.stdout) else r.stderr


def run_reference(task: Task, *, backend: str = DEFAULT_BACKEND,
                  sandbox_kwargs: Mapping[str, Any] | None = None,
                  attempt: Callable[[Any], Any] | None = None, **verify_kwargs
                  ) -> VerificationResult:
    """Open the task's sandbox, run `attempt(sb)` (default: the reference solution), verify."""
    with open_task_sandbox(task, backend, **dict(sandbox_kwargs or {})) as sb:
        if attempt is None:
            run_solution(task, sb)
        else:
            attempt(sb)
        return verify(task, sb, backend=backend, sandbox_kwargs=sandbox_kwargs, **verify_kwargs)
