"""The sandbox protocol: spec, exec result, capped output, safe tar streams.

Every backend (local bubblewrap / plain, Docker, remote over HTTP) implements
:class:`Sandbox`. Semantics shared by all backends:

- ``exec`` runs ``bash -c command`` in the workspace and returns an
  :class:`ExecResult`. A command that runs past ``timeout`` is killed hard and
  the result has ``timed_out=True`` (the agent's timeout is an observation, not
  an exception; ``result.check()`` raises :class:`CommandTimeout` if wanted).
- When an exec returns, every process it started is gone, including children
  that double-forked or called ``setsid``: background processes do not
  outlive their command. Calls on one sandbox are serialized.
- stdout and stderr are each capped at ``spec.max_output_bytes``: the head and
  the tail are kept with a marker in between and ``truncated=True``.
- Files move as tar streams relative to the workspace. Absolute paths, ``..``
  components, links that leave the workspace and device files are rejected
  with :class:`BadRequest`; only a Docker sandbox of profile ``"image"`` (the task's own
  image, whose whole filesystem is the task's) also takes absolute paths.
- ``close`` is idempotent and always cleans up (processes, containers, mounts).
- ``processes`` lists what runs in the sandbox as seen from outside it (:class:`ProcessInfo`):
  checks of "is it still running" use it, never files or tools inside the sandbox.
"""

from __future__ import annotations

import abc
import base64
import dataclasses
import io
import math
import posixpath
import tarfile
import time
from collections.abc import Mapping
from typing import Any

from terminal_rsi.sandbox.errors import BadRequest, CommandTimeout

MiB = 1 << 20
# Hard upper bounds of a spec (a server or config may set lower maxima).
SPEC_BOUNDS = {"memory_mb": 1 << 20, "pids": 1 << 16, "disk_mb": 1 << 20,
               "max_output_bytes": 1 << 30, "open_files": 1 << 20}
MAX_CPUS = 1024
MIN_CPUS = 0.01  # the smallest CPU quota the engines apply (Docker turns less into none)
MARKER_ENV = "TRSI_SANDBOX"  # every exec'd process carries TRSI_SANDBOX=<sandbox id>
# How a sandbox runs its image (SandboxSpec.profile): "sandbox", our hardened container
# layout (any backend); "image", the task image as its own tools run it (Docker only).
PROFILES = ("sandbox", "image")
IMAGE_PROFILE_NEEDS_DOCKER = (
    "profile 'image' needs the Docker backend: it runs the task's own image (its USER, "
    "WORKDIR, ENV and root filesystem), which a local sandbox cannot; use backend='docker' "
    "or a bridge served with --backend=docker, or profile='sandbox'")


@dataclasses.dataclass(frozen=True)
class SandboxSpec:
    """What to start. Limits apply per sandbox; ``image`` is used by Docker only.

    Attributes:
      image: Docker image (default: the locally built sandbox image).
      files: workspace-relative path -> bytes, seeded at start.
      env: environment for every exec (exec-level env overrides it).
      memory_mb: memory cap (Docker: cgroup; local: RLIMIT_AS per process).
      cpus: CPU share (Docker only; local uses RLIMIT_CPU per process).
      pids: max processes (Docker: pids-limit; local: RLIMIT_NPROC of a dedicated uid).
      disk_mb: size of the workspace and of /tmp (tmpfs); also RLIMIT_FSIZE locally.
      network: allow network access (default off).
      max_output_bytes: cap per stream per exec (head + tail kept).
      open_files: RLIMIT_NOFILE.
      profile: how the image runs, one of ``PROFILES``. ``"sandbox"`` (default, every
        backend): our hardened layout, uid 1000, read-only root, the workspace at
        ``/workspace`` and ``disk_mb`` of tmpfs. ``"image"`` (Docker only; local backends
        refuse it): the image as ``docker run`` would run it, for Terminal-Bench / Harbor
        task images: its USER, its WORKDIR as the workspace, its ENV, a writable root
        filesystem, a few capabilities package managers need, the same memory, pids, CPU,
        network and cleanup limits; ``put_tar`` / ``get_tar`` also take absolute paths.
        docs/sandbox.md, "Profile image", says what holds.
      workdir: profile ``"image"`` only: the workspace's absolute path in the container
        (``""``, the default: the image's WORKDIR, ``"/"`` when it sets none). A
        normalized absolute path (``/app``, not ``/app/`` or ``/a/../app``), no NUL, at
        most 4096 characters; must stay ``""`` for profile ``"sandbox"``.
    """

    image: str = "terminal-rsi-sandbox:bookworm"
    files: Mapping[str, bytes] = dataclasses.field(default_factory=dict)
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    memory_mb: int = 1024
    cpus: float = 1.0
    pids: int = 256
    disk_mb: int = 512
    network: bool = False
    max_output_bytes: int = 1 * MiB
    open_files: int = 1024
    profile: str = "sandbox"
    workdir: str = ""

    def __post_init__(self):
        for name, hi in SPEC_BOUNDS.items():
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= hi:
                raise BadRequest(f"SandboxSpec.{name} must be an int in [1, {hi}], got {v!r}")
        if isinstance(self.cpus, bool) or not (
                isinstance(self.cpus, int | float) and MIN_CPUS <= self.cpus <= MAX_CPUS):
            raise BadRequest(f"SandboxSpec.cpus must be a number in [{MIN_CPUS}, {MAX_CPUS}], got "
                             f"{self.cpus!r}")
        if not isinstance(self.network, bool):
            raise BadRequest(f"SandboxSpec.network must be a bool, got {self.network!r}")
        check_text(self.image, "SandboxSpec.image", 512)
        check_env(self.env, "SandboxSpec.env")
        if not isinstance(self.files, Mapping):
            raise BadRequest("SandboxSpec.files must map workspace paths to bytes")
        for path, data in self.files.items():
            if safe_relpath(path) == ".":
                raise BadRequest(f"SandboxSpec.files: {path!r} names the workspace itself; "
                                 "give a file path inside it")
            if not isinstance(data, bytes):
                raise BadRequest(f"SandboxSpec.files[{path!r}] must be bytes")
        self._check_profile()

    def _check_profile(self) -> None:
        if not isinstance(self.profile, str) or self.profile not in PROFILES:
            raise BadRequest(f"SandboxSpec.profile must be one of {PROFILES}, got "
                             f"{self.profile!r}: 'sandbox' for our hardened layout, 'image' "
                             "to run a task image as its own tools do (Docker only)")
        check_text(self.workdir, "SandboxSpec.workdir", MAX_PATH_BYTES)
        if self.workdir and self.profile != "image":
            raise BadRequest(f"SandboxSpec.workdir={self.workdir!r} is for profile 'image' "
                             "only (profile 'sandbox' always works in /workspace); drop it "
                             "or set profile='image'")
        if self.workdir and not is_normal_abspath(self.workdir):
            raise BadRequest(f"SandboxSpec.workdir={self.workdir!r} must be a normalized "
                             "absolute path such as '/app' (no trailing '/', '.', '..' or "
                             "'//'); use '' for the image's own WORKDIR")

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["files"] = {k: base64.b64encode(v).decode() for k, v in self.files.items()}
        d["env"] = dict(self.env)
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> SandboxSpec:
        if not isinstance(d, Mapping):
            raise BadRequest("spec must be a JSON object")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise BadRequest(
                f"unknown SandboxSpec fields {sorted(unknown)}; known: {sorted(known)}")
        d = dict(d)
        try:
            if "files" in d:
                if not isinstance(d["files"], Mapping):
                    raise BadRequest("spec.files must be an object of path -> base64 text")
                d["files"] = {k: base64.b64decode(v, validate=True)
                              for k, v in d["files"].items()}
            return cls(**d)
        except (TypeError, ValueError, AttributeError) as e:
            if isinstance(e, BadRequest):
                raise
            raise BadRequest(f"bad SandboxSpec: {e}") from e


@dataclasses.dataclass(frozen=True)
class ExecResult:
    """Outcome of one command. ``exit_code`` is negative (-signal) if killed by a signal."""

    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool = False
    truncated: bool = False
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    def check(self) -> ExecResult:
        """Raise CommandTimeout if the command timed out; return self otherwise."""
        if self.timed_out:
            raise CommandTimeout(f"command timed out after {self.duration_s:.1f}s")
        return self

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ExecResult:
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls)})


# Caps of one `Sandbox.processes` listing (a fork bomb must not make it slow or huge).
MAX_PROCESSES = 256  # processes listed, lowest pids first; a full listing may be cut
MAX_PROCESS_FILES = 32  # open files listed per process, lowest descriptors first
MAX_ARGV_BYTES = 4096  # bytes of /proc/<pid>/cmdline read per process
MAX_PROCESS_PATH = 512  # characters of exe and of each file; longer: cut in the middle
PROCESS_SOURCES = ("proc", "top")


@dataclasses.dataclass(frozen=True)
class ProcessInfo:
    """One process running in a sandbox, read from outside it (`Sandbox.processes`): the
    agent cannot forge these fields, except ``argv``, which a process may rewrite.

    Attributes:
      pid: its pid in the PID namespace of the host that read it (the bridge server's, or
        the Docker engine's), not the pid the sandbox's own commands see.
      ppid: its parent's pid, in the same namespace.
      argv: its command line (``/proc/<pid>/cmdline``, at most ``MAX_ARGV_BYTES``); a
        process can rewrite it (``exec -a``, or its own memory): ``exe`` and ``files``
        cannot be.
      exe: the executable's path (``readlink /proc/<pid>/exe``), ``""`` when unknown.
      files: its open files (``readlink /proc/<pid>/fd/N``, lowest N first, at most
        ``MAX_PROCESS_FILES``): paths as the sandbox's commands see them
        (``/workspace/job.lock`` under bubblewrap and Docker; host paths in plain mode), an
        unlinked file with the kernel's `` (deleted)`` after it, ``pipe:[N]``,
        ``socket:[N]`` and the like for the rest.
      partial: something was cut to a cap or could not be read (argv, exe, files, or
        ``source`` "top"): treat what is missing as unknown, never as absent.
      source: ``"proc"``, read from ``/proc`` on this host; ``"top"``, only what the Docker
        engine's ``top`` tells (an engine on another host): ``argv`` is its command column
        split on spaces, ``exe`` and ``files`` are unknown.
    """

    pid: int
    ppid: int
    argv: tuple[str, ...]
    exe: str = ""
    files: tuple[str, ...] = ()
    partial: bool = False
    source: str = "proc"

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["argv"], d["files"] = list(self.argv), list(self.files)
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ProcessInfo:
        """The record of `to_json`; TypeError or KeyError if ``d`` is not one."""
        if not isinstance(d, Mapping):
            raise TypeError(f"a process must be a JSON object, got {type(d).__name__}")
        pid, ppid, argv, exe, files = (d[k] for k in ("pid", "ppid", "argv", "exe", "files"))
        ints = all(isinstance(v, int) and not isinstance(v, bool) for v in (pid, ppid))
        lists = all(isinstance(v, list) and all(isinstance(s, str) for s in v)
                    for v in (argv, files))
        if not (ints and lists and isinstance(exe, str) and isinstance(d["partial"], bool)
                and d["source"] in PROCESS_SOURCES):
            raise TypeError(f"not a ProcessInfo record: {str(d)[:200]}")
        return cls(pid, ppid, tuple(argv), exe, tuple(files), d["partial"], d["source"])


class OutputCap:
    """Keeps the first and last ``limit // 2`` bytes of a stream; counts the rest.

    Memory is O(limit) whatever the stream length.
    """

    def __init__(self, limit: int):
        self.head_limit = limit - limit // 2
        self.tail_limit = limit // 2
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0
        self._cut = False

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data and self.tail_limit > 0:
            self.tail += data
            if len(self.tail) > 2 * self.tail_limit:
                del self.tail[: len(self.tail) - self.tail_limit]

    @property
    def truncated(self) -> bool:
        return self.total > self.head_limit + self.tail_limit or self._cut

    def _fit(self, data: bytes, limit: int, keep_end: bool = False) -> str:
        """``data`` decoded (invalid bytes as U+FFFD) in at most ``limit`` UTF-8 bytes:
        a replacement character is 3 bytes, so binary output is cut to stay in the cap."""
        text = data.decode("utf-8", errors="replace")
        enc = text.encode("utf-8")
        if len(enc) <= limit:
            return text
        self._cut = True
        enc = enc[-limit:] if keep_end else enc[:limit]
        return enc.decode("utf-8", errors="ignore")

    def text(self) -> str:
        """The kept output as text, at most the cap in UTF-8 bytes (plus the marker)."""
        tail = bytes(self.tail[-self.tail_limit:]) if self.tail_limit else b""
        limit = self.head_limit + self.tail_limit
        if self.total <= limit:
            return self._fit(bytes(self.head) + tail, limit)
        dropped = self.total - len(self.head) - len(tail)
        marker = f"\n...[{dropped} bytes truncated]...\n"
        return (self._fit(bytes(self.head), self.head_limit) + marker
                + self._fit(tail, self.tail_limit, keep_end=True))


MAX_EXEC_TIMEOUT_S = 24 * 3600
DEFAULT_SESSION_LIFETIME_S = 3600.0
MAX_ARG_BYTES = (128 << 10) - 1  # Linux's limit on one argv or environment string (NUL aside)
MAX_COMMAND_BYTES = MAX_ARG_BYTES
MAX_ENV_BYTES = 256 << 10  # all of one exec's environment entries together
MAX_ENV_ENTRIES = 256
MAX_PATH_BYTES = 4096


def text_problem(value: Any, max_bytes: int) -> str | None:
    """What keeps ``value`` from being text a process can receive (None: nothing): not a
    string, a NUL character, a lone surrogate, or more than ``max_bytes`` UTF-8 bytes.
    Shared by the sandbox, the action parser and the task loaders."""
    if not isinstance(value, str):
        return f"expected a string, got {type(value).__name__}"
    if "\0" in value:
        return "holds a NUL character, which no process can receive"
    try:
        n = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        return "holds a lone surrogate (an escape like \\ud800 that is not valid Unicode text)"
    if n > max_bytes:
        return f"is {n} bytes; the limit is {max_bytes}"
    return None


def check_text(value: Any, what: str, max_bytes: int) -> str:
    """``value`` if a process can receive it as text, else BadRequest naming ``what``."""
    problem = text_problem(value, max_bytes)
    if problem:
        raise BadRequest(f"{what} {problem}")
    return value


def is_env_name(name: str) -> bool:
    """True for a portable environment variable name: ``[A-Za-z_][A-Za-z0-9_]*``."""
    return bool(name) and (name[0].isascii() and (name[0].isalpha() or name[0] == "_")) and all(
        c.isascii() and (c.isalnum() or c == "_") for c in name)


def check_env(env: Any, what: str = "env") -> dict[str, str]:
    """Validate an environment mapping: names ``[A-Za-z_][A-Za-z0-9_]*``, text values, caps."""
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise BadRequest(f"{what} must be a mapping of strings to strings")
    if len(env) > MAX_ENV_ENTRIES:
        raise BadRequest(f"{what} has {len(env)} entries; the limit is {MAX_ENV_ENTRIES}")
    total = 0
    for k, v in env.items():
        check_text(k, f"{what} name {k!r}", 256)
        if not is_env_name(k):
            raise BadRequest(f"{what} name {k!r} is not a valid variable name "
                             "([A-Za-z_][A-Za-z0-9_]*)")
        n = len(check_text(v, f"{what}[{k!r}]", MAX_ENV_BYTES).encode()) + len(k) + 1
        if n > MAX_ARG_BYTES:
            raise BadRequest(f"{what}[{k!r}] is {n} bytes as NAME=VALUE; the limit for one "
                             f"entry is {MAX_ARG_BYTES}: write long values to a file")
        total += n + 1
    if total > MAX_ENV_BYTES:
        raise BadRequest(f"{what} is {total} bytes in all; the limit is {MAX_ENV_BYTES}")
    return dict(env)


def check_exec_args(command: Any, timeout: Any, env: Any = None, cwd: Any = None) -> None:
    """Reject a malformed exec request with BadRequest (shared by every backend)."""
    check_text(command, "command", MAX_COMMAND_BYTES)
    if isinstance(timeout, bool) or not (
            isinstance(timeout, int | float) and 0 < timeout <= MAX_EXEC_TIMEOUT_S):
        raise BadRequest(f"timeout must be a number in (0, {MAX_EXEC_TIMEOUT_S}] seconds, "
                         f"got {timeout!r}")
    check_env(env)
    if cwd is not None:
        safe_relpath(check_text(cwd, "cwd", MAX_PATH_BYTES))


def check_lifetime(lifetime_s: Any) -> float:
    """A terminal session's ``lifetime_s`` (seconds in (0, MAX_EXEC_TIMEOUT_S]), else
    BadRequest (shared by every backend)."""
    if isinstance(lifetime_s, bool) or not (
            isinstance(lifetime_s, int | float) and 0 < lifetime_s <= MAX_EXEC_TIMEOUT_S):
        raise BadRequest(f"lifetime_s must be a number of seconds in (0, "
                         f"{MAX_EXEC_TIMEOUT_S}], got {lifetime_s!r}")
    return float(lifetime_s)


def safe_relpath(path: str) -> str:
    """Normalize a workspace-relative path; reject absolute paths and `..` escapes."""
    if not isinstance(path, str) or not path or "\0" in path:
        raise BadRequest(f"bad path {path!r}: give a non-empty workspace-relative path")
    if len(path) > MAX_PATH_BYTES:
        raise BadRequest(f"path of {len(path)} characters; the limit is {MAX_PATH_BYTES}")
    if path.startswith("/"):
        raise BadRequest(f"path {path!r} is absolute; paths are relative to the workspace")
    norm = posixpath.normpath(path)
    if norm == ".." or norm.startswith("../"):
        raise BadRequest(f"path {path!r} leaves the workspace")
    return norm


def refuse_image_profile(spec: SandboxSpec, backend: str) -> None:
    """BadRequest unless ``spec`` is profile "sandbox" (what a ``backend`` other than
    Docker runs)."""
    if spec.profile != "sandbox" or spec.workdir:
        raise BadRequest(f"{IMAGE_PROFILE_NEEDS_DOCKER} (backend {backend!r} got profile "
                         f"{spec.profile!r}, workdir {spec.workdir!r})")


def is_normal_abspath(path: str) -> bool:
    """True for an absolute path already in normal form: "/" or "/a/b" (no "//", "." or "..",
    no trailing "/")."""
    return path == "/" or (path.startswith("/") and all(
        p not in ("", ".", "..") for p in path[1:].split("/")))


def safe_abspath(path: str) -> str:
    """Normalize an absolute container path (profile "image" transfers); BadRequest for a
    relative path, NUL, more than MAX_PATH_BYTES characters or any ``..`` component."""
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
        raise BadRequest(f"bad path {path!r}: give an absolute path such as '/tests'")
    if len(path) > MAX_PATH_BYTES:
        raise BadRequest(f"path of {len(path)} characters; the limit is {MAX_PATH_BYTES}")
    if ".." in path.split("/"):
        raise BadRequest(f"path {path!r} has a '..' component; give the path without it")
    return "/" + posixpath.normpath(path).lstrip("/")


def safe_path(path: str, absolute_ok: bool = False) -> str:
    """``safe_relpath(path)``; with ``absolute_ok`` an absolute path is taken too
    (``safe_abspath``): a sandbox of profile "image", whose whole filesystem is the task's."""
    if absolute_ok and isinstance(path, str) and path.startswith("/"):
        return safe_abspath(path)
    return safe_relpath(path)


@dataclasses.dataclass(frozen=True)
class TarLimits:
    """Caps on one upload or download, checked while streaming.

    Attributes:
      max_members: archive members (files, directories and links) in one tar stream.
      max_bytes: upload: total size of the regular files' contents; download: bytes of the
        tar stream, headers included.
      timeout_s: wall-clock budget of the whole operation.
    """

    max_members: int = 20_000
    max_bytes: int = 1 << 30
    timeout_s: float = 120.0

    def __post_init__(self):
        for name in ("max_members", "max_bytes"):
            v = getattr(self, name)
            if not (isinstance(v, int) and not isinstance(v, bool) and v > 0):
                raise BadRequest(f"TarLimits.{name} must be a positive int, got {v!r}")
        if not (isinstance(self.timeout_s, int | float) and 0 < self.timeout_s < math.inf):
            raise BadRequest(f"TarLimits.timeout_s must be a positive finite number, got "
                             f"{self.timeout_s!r}")


def check_tar(data: bytes, limits: TarLimits = TarLimits()) -> list[tarfile.TarInfo]:
    """Read an upload's headers with the caps applied as they stream past; the members.

    Refuses (BadRequest naming the member) absolute or ``..`` names, hard links,
    devices, FIFOs and any cap exceeded, before anything is written. Symlinks may point
    anywhere: the sandbox machinery creates them as links and never follows them.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise BadRequest("an upload must be bytes (a tar stream)")
    deadline = time.monotonic() + limits.timeout_s
    total = 0
    out: list[tarfile.TarInfo] = []
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tf:
            while (m := tf.next()) is not None:
                if len(out) >= limits.max_members:
                    raise BadRequest(f"upload has more than {limits.max_members} members; "
                                     "send fewer files per tar stream")
                if time.monotonic() > deadline:
                    raise BadRequest(f"upload took longer than {limits.timeout_s:g} s to read")
                try:
                    safe_relpath(m.name)
                except BadRequest as e:
                    raise BadRequest(f"tar member {m.name!r}: {e}") from None
                if not (m.isreg() or m.isdir() or m.issym()):
                    kind = "hard link" if m.islnk() else "device, FIFO or other special file"
                    raise BadRequest(f"tar member {m.name!r} is a {kind}; uploads hold "
                                     "regular files, directories and symlinks only")
                if m.issym() and ("\0" in m.linkname or not m.linkname):
                    raise BadRequest(f"tar member {m.name!r} is a symlink with an empty or "
                                     "NUL-holding target")
                if m.isreg():
                    total += m.size
                    if total > limits.max_bytes:
                        raise BadRequest(f"upload holds more than {limits.max_bytes} bytes of "
                                         f"file data (at member {m.name!r})")
                out.append(m)
    except tarfile.TarError as e:
        raise BadRequest(f"upload is not a readable tar stream: {e}") from e
    except (EOFError, OSError, ValueError, OverflowError) as e:
        if isinstance(e, BadRequest):
            raise
        raise BadRequest(f"upload is not a readable tar stream: {e}") from e
    return out


def files_to_tar(files: Mapping[str, bytes], mode: int = 0o644,
                 mtime: float | None = None) -> bytes:
    """Pack {relpath: bytes} into an uncompressed tar stream of regular files, stamped
    `mtime` (None: now; a fixed value makes the stream byte-identical per input)."""
    buf = io.BytesIO()
    now = time.time() if mtime is None else mtime
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for path, data in files.items():
            info = tarfile.TarInfo(safe_relpath(path))
            info.size = len(data)
            info.mode = mode
            info.mtime = now
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def file_from_tar(data: bytes, path: str) -> bytes:
    """Extract the single regular file named ``basename(path)`` from a get_tar stream
    (``path`` as given to get_tar: workspace-relative, or absolute for profile "image")."""
    want = posixpath.basename(safe_path(path, absolute_ok=True))
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tf:
        for m in tf.getmembers():
            if posixpath.basename(posixpath.normpath(m.name)) == want:
                if not m.isreg():
                    raise BadRequest(f"{path!r} is not a regular file")
                f = tf.extractfile(m)
                assert f is not None
                return f.read()
    raise BadRequest(f"{path!r} not found in the sandbox")


class Sandbox(abc.ABC):
    """The protocol. Use as a context manager; ``close`` is idempotent."""

    spec: SandboxSpec
    id: str
    workdir: str  # absolute workspace path as seen by commands
    session = None  # the terminal session `open_session` started (None: never one)

    @abc.abstractmethod
    def exec(self, command: str, timeout: float = 60.0, env: Mapping[str, str] | None = None,
             cwd: str | None = None) -> ExecResult:
        """Run ``bash -c command`` with a hard kill at ``timeout`` seconds."""

    @abc.abstractmethod
    def put_tar(self, data: bytes, dest: str = ".") -> None:
        """Extract a tar stream into the workspace directory ``dest`` (profile "image": or
        the absolute directory ``dest``, created if missing)."""

    @abc.abstractmethod
    def get_tar(self, path: str = ".", max_bytes: int = 256 * MiB) -> bytes:
        """Return a tar stream of workspace path ``path`` (file or directory); members are
        named by their workspace-relative paths. Profile "image" also takes an absolute
        ``path``: its members are named by their paths relative to "/" (``/logs/x`` ->
        ``logs/x``)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Destroy the sandbox and everything it started. Idempotent."""

    def open_session(self, lifetime_s: float = DEFAULT_SESSION_LIFETIME_S):
        """Start the sandbox's terminal session, a ``terminal.TerminalSession`` (one at a
        time): an interactive shell in tmux that lives until it is closed or the sandbox
        is. While it lives, ``exec`` runs in its environment (its network: what it serves
        is reachable) and spares its processes. ``lifetime_s`` bounds each of its
        processes' CPU time."""
        raise BadRequest(f"the {type(self).__name__} backend has no terminal sessions")

    def processes(self) -> tuple[ProcessInfo, ...]:
        """The processes running in the sandbox now, its terminal session's included, read
        from outside it (the host's ``/proc``, the Docker engine): what a liveness check
        must trust ("no job.sh runs"), never a file the agent can delete or a ``ps`` it
        can replace. Lowest pid first; zombies left out.

        The sandbox's machinery is left out where it is told apart by what the agent
        cannot change: bubblewrap's processes outside the sandbox's PID namespaces and
        its pid 1 inside them, the local session's wrapper, Docker's pid 1 and what
        started before the sandbox opened, and (profile "sandbox") each ``docker exec``'s
        first process. The terminal session's tmux server (and, on local backends, its
        tmux client) are listed: they are the session; so are a running exec's wrapper
        in plain mode and the ``docker exec`` processes of profile "image", whose
        binaries are the task's.

        Caps: at most ``MAX_PROCESSES`` entries (a listing that long may be cut: treat
        it as inconclusive), each with at most ``MAX_PROCESS_FILES`` files,
        ``MAX_ARGV_BYTES`` of argv and ``MAX_PROCESS_PATH`` characters per path (a cut
        entry has ``partial=True``). SandboxLost once the sandbox is closed or gone.
        """
        raise BadRequest(f"the {type(self).__name__} backend cannot list its processes")

    @property
    def session_live(self) -> bool:
        """A terminal session is open and its shell runs (exec then spares it)."""
        return self.session is not None and self.session.alive

    def _clear_session_slot(self) -> None:
        """Before a backend opens a session (under its lock): BadRequest while one is alive;
        one that ended by itself (its shell exited) is closed first, so what it left dies."""
        if self.session_live:
            raise BadRequest(f"sandbox {self.id} already has a terminal session; close it "
                             "before opening another")
        if self.session is not None:
            self.session.close()
            self.session = None

    def put_files(self, files: Mapping[str, bytes], mode: int = 0o644) -> None:
        self.put_tar(files_to_tar(files, mode=mode))

    def get_file(self, path: str, max_bytes: int = 256 * MiB) -> bytes:
        return file_from_tar(self.get_tar(path, max_bytes=max_bytes), path)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
