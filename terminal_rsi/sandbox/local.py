"""Local sandboxes: bubblewrap (isolated) or plain subprocesses (weaker).

Isolation levels (see docs/sandbox.md):

``bwrap`` (needs the Debian package ``bubblewrap`` and user namespaces)
    Each exec runs in fresh namespaces (``--unshare-all``: PID, network, IPC,
    UTS, user, cgroup): the host's /usr and /etc read-only, a private /tmp and
    the workspace (bound at ``/workspace``) writable, nothing else of the host
    visible (no /root, /home, /work, /opt ...), no network, dies with its
    parent. When the exec's main process exits the PID namespace collapses, so
    no child survives.
``plain``
    ``bash -c`` in its own session and process group, with rlimits. No
    filesystem or network isolation beyond Unix permissions. Chosen only when
    asked for or when bubblewrap is missing (a warning is logged).

Both modes, when the host runs as root (CI, sandbox hosts), run commands as a
dedicated unprivileged uid per sandbox: RLIMIT_NPROC then bounds fork bombs,
Unix permissions keep the host's home and root-owned files out of reach, and
every process of that uid is killed when an exec ends. The workspace and /tmp
live on a per-sandbox tmpfs of ``spec.disk_mb``. Run as an ordinary user, the
uid is the caller's own, there is no tmpfs (RLIMIT_FSIZE bounds single files)
and leftovers are found by the ``TRSI_SANDBOX`` environment marker only: a
process that clears its environment and calls setsid can escape in plain
mode (bwrap mode is still safe: its PID namespace dies with the command).

Rlimits per process: RLIMIT_AS = memory_mb, RLIMIT_FSIZE = disk_mb,
RLIMIT_NOFILE = open_files, RLIMIT_CPU = timeout + 1 s, RLIMIT_CORE = 0,
RLIMIT_NPROC = pids (dedicated uid only).
"""

from __future__ import annotations

import logging
import math
import os
import random
import selectors
import shutil
import signal
import subprocess
import tarfile
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping

from terminal_rsi.sandbox import procs
from terminal_rsi.sandbox.base import (
    MARKER_ENV,
    ExecResult,
    OutputCap,
    Sandbox,
    SandboxSpec,
    check_exec_args,
    check_tar,
    safe_relpath,
)
from terminal_rsi.sandbox.errors import BadRequest, InfrastructureError, SandboxLost

log = logging.getLogger(__name__)

SANDBOX_WORKDIR = "/workspace"
_UID_LOW, _UID_HIGH = 2_000_000, 2_900_000
_uids_in_use: set[int] = set()
_uid_lock = threading.Lock()
_bwrap_ok: dict[bool, bool] = {}


def _is_root() -> bool:
    return os.geteuid() == 0


def _alloc_uid() -> int:
    with _uid_lock:
        for _ in range(1000):
            uid = random.randrange(_UID_LOW, _UID_HIGH)
            if uid not in _uids_in_use and not procs.pids_of_uid(uid):
                _uids_in_use.add(uid)
                return uid
    raise InfrastructureError("could not allocate a free sandbox uid")


def _bwrap_root_args() -> list[str]:
    """Host system directories, read-only (merged-/usr aware)."""
    args = ["--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
    for d in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        p = "/" + d
        if os.path.islink(p):
            args += ["--symlink", os.readlink(p), p]
        elif os.path.isdir(p):
            args += ["--ro-bind", p, p]
    return args


def _check_traversable(path: str) -> None:
    """The sandbox uid must reach its workspace: every ancestor needs o+x."""
    p = os.path.abspath(path)
    while True:
        if os.path.exists(p) and not os.stat(p).st_mode & 0o001:
            raise BadRequest(f"base_dir {path!r}: {p} is not traversable by other users "
                             "(needs o+x) so sandbox uids cannot reach their workspace; "
                             "choose a directory under /tmp or chmod o+x it")
        if p == "/":
            return
        p = os.path.dirname(p)


def _pdeathsig() -> list[str]:
    """Prefix that makes the exec's top process die with its parent (a killed server)."""
    return ["setpriv", "--pdeathsig", "KILL", "--"] if shutil.which("setpriv") else []


def bwrap_available(as_root_drop: bool | None = None) -> bool:
    """True if bubblewrap is installed and can create namespaces here (cached)."""
    drop = _is_root() if as_root_drop is None else as_root_drop
    if drop in _bwrap_ok:
        return _bwrap_ok[drop]
    ok = False
    if shutil.which("bwrap"):
        kw = {}
        if drop:
            kw = dict(user=65534, group=65534, extra_groups=[])
        try:
            r = subprocess.run(
                ["bwrap", "--unshare-all", "--die-with-parent", *_bwrap_root_args(),
                 "--proc", "/proc", "--dev", "/dev", "/bin/true"],
                capture_output=True, timeout=20, **kw)
            ok = r.returncode == 0
            if not ok:
                log.warning("bubblewrap is installed but fails here: %s",
                            r.stderr.decode(errors="replace").strip())
        except (OSError, subprocess.TimeoutExpired) as e:
            log.warning("bubblewrap check failed: %s", e)
    _bwrap_ok[drop] = ok
    return ok


class LocalSandbox(Sandbox):
    """A private workspace on this host; ``mode`` is "bwrap", "plain" or "auto"."""

    def __init__(self, spec: SandboxSpec | None = None, mode: str = "auto",
                 base_dir: str | None = None):
        self.spec = spec or SandboxSpec()
        if mode not in ("auto", "bwrap", "plain"):
            raise BadRequest(f"LocalSandbox mode must be auto|bwrap|plain, got {mode!r}")
        if mode in ("auto", "bwrap") and not bwrap_available():
            if mode == "bwrap":
                raise InfrastructureError(
                    "bubblewrap is not usable here; `apt-get install bubblewrap` or use "
                    "mode='plain' (weaker isolation)")
            log.warning("bubblewrap missing: LocalSandbox falls back to plain subprocesses "
                        "(weaker isolation, see docs/sandbox.md)")
            mode = "plain"
        elif mode == "auto":
            mode = "bwrap"
        self.mode = mode
        self.id = uuid.uuid4().hex[:16]
        self._marker = f"{MARKER_ENV}={self.id}".encode()
        self._lock = threading.RLock()
        self._closed = False
        self._mounted = False
        if _is_root():
            _check_traversable(base_dir or tempfile.gettempdir())
        self.uid = _alloc_uid() if _is_root() else None
        self.root = tempfile.mkdtemp(prefix=f"trsi-sb-{self.id}-", dir=base_dir)
        try:
            if _is_root():
                r = subprocess.run(
                    ["mount", "-t", "tmpfs", "-o",
                     f"size={self.spec.disk_mb}m,mode=0755,nosuid,nodev", "tmpfs", self.root],
                    capture_output=True)
                self._mounted = r.returncode == 0
                if not self._mounted:
                    log.warning("no tmpfs for the workspace (%s); only RLIMIT_FSIZE bounds disk",
                                r.stderr.decode(errors="replace").strip())
            self.ws = os.path.join(self.root, "ws")
            self.tmp = os.path.join(self.root, "tmp")
            os.mkdir(self.ws, 0o755)
            os.mkdir(self.tmp, 0o1777)
            os.chmod(self.tmp, 0o1777)
            if self.uid is not None:
                os.chown(self.ws, self.uid, self.uid)
            self.workdir = SANDBOX_WORKDIR if mode == "bwrap" else self.ws
            if self.spec.files:
                self.put_files(self.spec.files)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ exec
    def _ulimits(self, timeout: float) -> str:
        s = self.spec
        lim = [f"-v {s.memory_mb * 1024}", f"-f {s.disk_mb * 1024}", f"-n {s.open_files}",
               f"-t {math.ceil(timeout) + 1}", "-c 0"]
        if self.uid is not None:
            lim.append(f"-u {s.pids}")
        return "; ".join(f"ulimit -S -H {x}" for x in lim)

    def _argv(self, command: str, rel_cwd: str, timeout: float) -> list[str]:
        ul = self._ulimits(timeout)
        if _pdeathsig():  # the parent may have died before the death signal was armed
            ul = f'[ "$PPID" = "{os.getpid()}" ] || exit 111; {ul}'
        if self.mode == "plain":
            # The wrapper stays the parent (no exec) so `kill $PPID` hits only the wrapper.
            return [*_pdeathsig(), "/bin/bash", "-c", f'{ul}; "$@"; exit $?', "trsi",
                    "/bin/bash", "-c", command]
        bw = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session"]
        if self.spec.network:
            bw.append("--share-net")
        bw += _bwrap_root_args()
        bw += ["--proc", "/proc", "--dev", "/dev", "--bind", self.ws, SANDBOX_WORKDIR,
               "--bind", self.tmp, "/tmp",
               "--chdir", os.path.normpath(os.path.join(SANDBOX_WORKDIR, rel_cwd)),
               "/bin/bash", "-c", command]
        return [*_pdeathsig(), "/bin/bash", "-c", f'{ul}; exec "$@"', "trsi", *bw]

    def _env(self, env: Mapping[str, str] | None) -> dict[str, str]:
        out = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": self.workdir, "LANG": "C.UTF-8",
               "TERM": "dumb", "TMPDIR": "/tmp" if self.mode == "bwrap" else self.tmp}
        out.update(self.spec.env)
        out.update(env or {})
        out[MARKER_ENV] = self.id
        for k, v in out.items():
            if not isinstance(k, str) or not isinstance(v, str) or "\0" in k + v or "=" in k:
                raise BadRequest(f"bad environment entry {k!r}={v!r}")
        return out

    def _find(self) -> list[int]:
        if self.uid is not None:
            return procs.pids_of_uid(self.uid)
        return procs.pids_with_env(self._marker)

    def _kill_all(self, proc: subprocess.Popen | None) -> None:
        if proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        procs.freeze_and_kill(self._find)

    def exec(self, command: str, timeout: float = 60.0, env: Mapping[str, str] | None = None,
             cwd: str | None = None) -> ExecResult:
        check_exec_args(command, timeout)
        with self._lock:
            self._check_open()
            rel = safe_relpath(cwd) if cwd else "."
            host_cwd = os.path.join(self.ws, rel)
            if not os.path.isdir(host_cwd) or not self._inside(host_cwd):
                raise BadRequest(f"cwd {cwd!r} is not a directory inside the workspace")
            full_env = self._env(env)
            kw = {}
            if self.uid is not None:
                kw = dict(user=self.uid, group=self.uid, extra_groups=[])
            cap_out = OutputCap(self.spec.max_output_bytes)
            cap_err = OutputCap(self.spec.max_output_bytes)
            t0 = time.monotonic()
            try:
                proc = subprocess.Popen(
                    self._argv(command, rel, timeout), stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=full_env,
                    cwd=host_cwd if self.mode == "plain" else self.ws,
                    start_new_session=True, close_fds=True, **kw)
            except OSError as e:
                raise InfrastructureError(f"cannot start the sandbox command: {e}") from e
            timed_out = False
            try:
                timed_out = self._pump(proc, cap_out, cap_err, t0 + timeout)
            finally:
                if proc.poll() is None:
                    self._kill_all(proc)
                proc.wait()
                if timed_out or self.mode == "plain" or proc.returncode != 0:
                    # bwrap: a clean exit of the namespace's init already killed the rest.
                    self._kill_all(None)
            return ExecResult(
                stdout=cap_out.text(), stderr=cap_err.text(),
                exit_code=(-signal.SIGKILL if timed_out else _exit_code(proc.returncode)),
                timed_out=timed_out, truncated=cap_out.truncated or cap_err.truncated,
                duration_s=time.monotonic() - t0)

    def _pump(self, proc: subprocess.Popen, cap_out: OutputCap, cap_err: OutputCap,
              deadline: float) -> bool:
        """Read both pipes into the caps until EOF; kill at the deadline. Returns timed_out."""
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ, cap_out)
        sel.register(proc.stderr, selectors.EVENT_READ, cap_err)
        timed_out = False
        exited_at = None
        try:
            while sel.get_map():
                now = time.monotonic()
                if exited_at is None and proc.poll() is not None:
                    exited_at = now
                    if self.mode == "plain":
                        # Escaped children may hold the pipes open: they die with the command.
                        self._kill_all(None)
                if exited_at is None and self._closed:
                    self._kill_all(proc)  # closed from another thread
                    exited_at = time.monotonic()
                if not timed_out and exited_at is None and now >= deadline:
                    timed_out = True
                    self._kill_all(proc)
                    exited_at = time.monotonic()
                if exited_at is not None and now - exited_at > 3.0:
                    break  # pipes held by something unkillable; give up reading
                wait = 0.05 if exited_at is not None else max(0.0, min(deadline - now, 0.25))
                for key, _ in sel.select(wait):
                    data = os.read(key.fd, 1 << 16)
                    if data:
                        key.data.feed(data)
                    else:
                        sel.unregister(key.fileobj)
        finally:
            sel.close()
            proc.stdout.close()
            proc.stderr.close()
        return timed_out

    # ----------------------------------------------------------------- files
    def _inside(self, path: str) -> bool:
        real_ws = os.path.realpath(self.ws)
        real = os.path.realpath(path)
        return real == real_ws or real.startswith(real_ws + os.sep)

    def put_tar(self, data: bytes, dest: str = ".") -> None:
        with self._lock:
            self._check_open()
            members = check_tar(data)
            rel = safe_relpath(dest)
            target = os.path.join(self.ws, rel)
            if not self._inside(target):
                raise BadRequest(f"dest {dest!r} leaves the workspace (symlink)")
            for m in members:  # no existing symlink may redirect a member outside
                p = os.path.join(target, safe_relpath(m.name))
                if not self._inside(os.path.dirname(p)) or (
                        os.path.lexists(p) and os.path.islink(p) and not m.issym()):
                    raise BadRequest(f"tar member {m.name!r} would be written through a "
                                     "symlink or outside the workspace")
            os.makedirs(target, exist_ok=True)
            import io

            try:
                with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tf:
                    if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4
                        tf.extractall(target, filter="data")
                    else:  # members were validated by check_tar; drop special mode bits
                        ms = tf.getmembers()
                        for m in ms:
                            m.mode &= 0o777
                            m.uid = m.gid = os.getuid()
                        tf.extractall(target, members=ms, numeric_owner=True)
            except (tarfile.TarError, OSError) as e:
                raise BadRequest(f"cannot extract upload into {dest!r}: {e}") from e
            if self.uid is not None:
                for dirpath, dirnames, filenames in os.walk(target):
                    os.lchown(dirpath, self.uid, self.uid)
                    for n in dirnames + filenames:
                        os.lchown(os.path.join(dirpath, n), self.uid, self.uid)

    def get_tar(self, path: str = ".", max_bytes: int = 256 << 20) -> bytes:
        import io

        with self._lock:
            self._check_open()
            rel = safe_relpath(path)
            full = os.path.join(self.ws, rel)
            if not os.path.lexists(full):
                raise BadRequest(f"{path!r} does not exist in the workspace")
            if not self._inside(full):
                raise BadRequest(f"{path!r} leaves the workspace (symlink)")
            buf = io.BytesIO()
            total = 0

            def count(ti: tarfile.TarInfo):
                nonlocal total
                total += ti.size
                if total > max_bytes:
                    raise BadRequest(f"{path!r} is larger than max_bytes={max_bytes}")
                ti.uid = ti.gid = 0
                ti.uname = ti.gname = ""
                return ti

            with tarfile.open(fileobj=buf, mode="w") as tf:
                tf.add(full, arcname=rel, recursive=True, filter=count)
            return buf.getvalue()

    # ----------------------------------------------------------------- close
    def _check_open(self) -> None:
        if self._closed:
            raise SandboxLost(f"sandbox {self.id} is closed")

    def close(self) -> None:
        with _uid_lock:
            if self._closed:
                return
            self._closed = True
        # Kill first, without the exec lock: this ends an exec in flight (its pump notices).
        self._kill_all(None)
        with self._lock:
            try:
                self._kill_all(None)
            finally:
                if self._mounted:
                    subprocess.run(["umount", "-l", self.root], capture_output=True)
                shutil.rmtree(self.root, ignore_errors=True)
                if self.uid is not None:
                    with _uid_lock:
                        _uids_in_use.discard(self.uid)


def _exit_code(rc: int) -> int:
    # bash reports a signal death of its child as 128+N; Popen gives -N for our direct child.
    return rc
