"""Local sandboxes: bubblewrap (isolated) or plain subprocesses (declared weaker).

Isolation levels (the table in docs/sandbox.md says what each guarantees):

``bwrap`` (needs the Debian package ``bubblewrap`` and user namespaces)
    Each exec runs in fresh namespaces (``--unshare-all``: PID, network, IPC,
    UTS, user, cgroup): the host's /usr and /etc read-only, the root and /dev
    read-only, and exactly three writable places, all on the sandbox's one tmpfs:
    the workspace (at ``/workspace``), ``/tmp`` and ``/dev/shm``. Nothing else of the
    host is visible (no /root, /home, /work, /opt ...), no network, dies with its parent.
    When the exec's main process exits the PID namespace collapses, so no child survives.
    ``network=True`` keeps the new network namespace and gives it user-mode networking
    (Debian package ``slirp4netns``, :class:`_UserNet`): outside addresses are reachable,
    the host's loopback (127.0.0.1, ::1) and abstract Unix sockets are not; a host without
    it refuses the spec (:class:`InfrastructureError`), never sharing the host's network.
``plain``
    ``bash -c`` in its own session and process group, with rlimits: no filesystem
    or network isolation beyond Unix permissions (``network=False`` included: the host's
    network, loopback and abstract sockets are reachable). Used when asked for by name
    (``local-plain``), or by ``local`` when bubblewrap is unusable and the caller
    allowed it (``allow_plain=True``, one warning line says what it does not isolate).

Both modes run profile "sandbox" only: a spec of profile "image" (or with a ``workdir``) is
a :class:`BadRequest` (``base.refuse_image_profile``; the task's own image needs Docker).

Both modes, when the host runs as root (CI, sandbox hosts), run commands as a
dedicated unprivileged uid per sandbox whose workspace, /tmp and /dev/shm are
private (mode 0700) on a tmpfs of ``spec.disk_mb``: one disk quota for all of them.
Memory (``spec.memory_mb``) and processes (``spec.pids``) are limited for the whole
process tree by the sandbox's cgroups (``cgroups.py``); where cgroups cannot be made,
RLIMIT_AS bounds each process instead and RLIMIT_NPROC the uid. Every process of the
uid is killed when an exec ends. The sandbox machinery's own file operations
(``put_tar``, ``get_tar``) run as that uid and never follow a link (``fsops.py``).
Run as an ordinary user, the uid is the caller's own, there is no tmpfs
(RLIMIT_FSIZE bounds single files) and leftovers are found by the ``TRSI_SANDBOX``
environment marker only: a process that clears its environment and calls setsid can
escape in plain mode (bwrap mode is still safe: its PID namespace dies with the command).

A killed owner leaves nothing for long: the exec's processes die with it (parent-death
signal), and the first sandbox a later process opens sweeps the workspaces, mounts,
cgroups and processes of owners that are gone (:func:`sweep_stale`).
"""

from __future__ import annotations

import concurrent.futures
import fcntl
import glob
import json
import logging
import math
import os
import random
import selectors
import shlex
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping

from terminal_rsi.sandbox import cgroups, fsops, procs
from terminal_rsi.sandbox.base import (
    DEFAULT_SESSION_LIFETIME_S,
    MARKER_ENV,
    ExecResult,
    OutputCap,
    ProcessInfo,
    Sandbox,
    SandboxSpec,
    TarLimits,
    check_env,
    check_exec_args,
    check_lifetime,
    refuse_image_profile,
    safe_relpath,
)
from terminal_rsi.sandbox.errors import BadRequest, InfrastructureError, SandboxLost
from terminal_rsi.sandbox.terminal import (
    Channel,
    TmuxSession,
    shell_env,
    tmux_argv,
)

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


def _tool(name: str) -> str | None:
    """Absolute path of a host tool from this process's PATH (never the exec's env)."""
    return shutil.which(name)


def _pdeathsig() -> list[str]:
    """Prefix that makes the exec's top process die with its parent (a killed server)."""
    setpriv = _tool("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []


def bwrap_available(as_root_drop: bool | None = None) -> bool:
    """True if bubblewrap is installed and can create namespaces here (cached)."""
    drop = _is_root() if as_root_drop is None else as_root_drop
    if drop in _bwrap_ok:
        return _bwrap_ok[drop]
    ok = False
    if _tool("bwrap"):
        kw = {}
        if drop:
            kw = dict(user=65534, group=65534, extra_groups=[])
        try:
            r = subprocess.run(
                [_tool("bwrap"), "--unshare-all", "--die-with-parent", *_bwrap_root_args(),
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


# ------------------------------------------------------------------ user-mode network
SLIRP_MTU = 65520  # slirp4netns's largest: fewer, larger packets than its default 1500
NET_SETUP_TIMEOUT_S = 30.0  # bubblewrap's report plus slirp4netns's setup (ms when healthy)
_NS_GET_USERNS = 0xB701  # ioctl(2) on a namespace descriptor: the user namespace owning it
_HELPER_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}


def user_net_problem() -> str | None:
    """Why ``network=True`` cannot get user-mode networking on this host (None: it can)."""
    if _tool("slirp4netns") is None:
        return "slirp4netns is not installed (`apt-get install slirp4netns`)"
    try:
        tun = os.stat("/dev/net/tun")
    except OSError:
        return ("/dev/net/tun is missing (`modprobe tun`; a container needs "
                "`--device /dev/net/tun`)")
    if not stat.S_ISCHR(tun.st_mode):
        return "/dev/net/tun is not a character device"
    if not os.access("/dev/net/tun", os.R_OK | os.W_OK):
        return ("/dev/net/tun is not readable and writable by this user "
                "(`chmod 0666 /dev/net/tun`, its usual mode, or run as root)")
    return None


class _UserNet:
    """slirp4netns serving one new sandbox network namespace (``network=True``).

    bubblewrap reports its child's pid on ``--info-fd`` and holds the command until a byte
    arrives on ``--block-fd``; :meth:`start` attaches slirp4netns to that child's network
    namespace (tap0: 10.0.2.100/24, default route via 10.0.2.2, DNS forwarder 10.0.2.3;
    ``--disable-host-loopback`` refuses what would reach the host's 127.0.0.1 through the
    gateway), waits until it is configured, then lets the command run. The helper runs on
    the host as the caller (as root inside slirp4netns's own mount-namespace sandbox and
    seccomp filter), outside the sandbox's uid and cgroups (an exec's cleanup spares it);
    it exits when :meth:`stop` closes its exit descriptor, or when this process dies (the
    kernel closes it then), so it never outlives its owner."""

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}
        self._fds["info_r"], self._fds["info_w"] = os.pipe()
        self._fds["block_r"], self._fds["block_w"] = os.pipe()
        self.proc: subprocess.Popen | None = None

    def child_fds(self) -> tuple[int, int]:
        """bubblewrap's ``--info-fd`` and ``--block-fd`` (passed down the exec chain)."""
        return self._fds["info_w"], self._fds["block_r"]

    def spawned(self) -> None:
        """The command chain holds the child ends now (or failed to start): close ours."""
        self._close("info_w", "block_r")

    def _close(self, *names: str) -> None:
        for n in names:
            fd = self._fds.pop(n, None)
            if fd is not None:
                os.close(fd)

    def start(self, deadline: float) -> bool:
        """Network the bubblewrap child, then release its command. False: bubblewrap never
        ran (its wrapper failed first; the exec reports that). InfrastructureError when the
        network cannot be set up: the caller kills the held command, then calls `stop`."""
        info = _read_bwrap_info(self._fds["info_r"], deadline)
        self._close("info_r")
        if info is None:
            return False
        self._fds["child"] = _open_child(info)
        # bubblewrap's child adds 127.0.0.1 to lo (NLM_F_EXCL: it dies on EEXIST) before it
        # waits on --block-fd; slirp4netns sets lo up, which makes the kernel add that
        # address too: let bubblewrap's go first
        _wait_child_loopback(self._fds["child"], deadline)
        try:
            self._fds["netns"] = os.open("ns/net", os.O_RDONLY | os.O_CLOEXEC,
                                         dir_fd=self._fds["child"])
        except OSError as e:
            raise InfrastructureError(f"the sandbox's process is gone before its network "
                                      f"was set up: {e}") from e
        self._close("child")
        try:
            self._fds["userns"] = fcntl.ioctl(self._fds["netns"], _NS_GET_USERNS)
        except OSError as e:
            raise InfrastructureError(f"cannot find the sandbox's user namespace: {e} "
                                      "(NS_GET_USERNS needs Linux >= 4.9)") from e
        with tempfile.TemporaryFile() as err:
            self._spawn(err)
            if not _wait_readable(self._fds["ready_r"], deadline) or \
                    os.read(self._fds["ready_r"], 1) != b"1":
                err.seek(0)
                why = err.read()[-2000:].decode(errors="replace").strip() or "no output"
                raise InfrastructureError(
                    f"slirp4netns could not set up the sandbox's network: {why}")
        self._close("ready_r")
        try:
            os.write(self._fds["block_w"], b"1")
        except OSError as e:  # EPIPE: bubblewrap's child died before its command started
            raise InfrastructureError(f"the sandbox's process is gone before its command "
                                      f"started: {e}") from e
        self._close("block_w")
        return True

    def _spawn(self, err) -> None:
        """Start slirp4netns on the namespace descriptors (which it inherits; closed here
        after), its stderr to ``err``."""
        self._fds["ready_r"], ready_w = os.pipe()
        exit_r, self._fds["exit_w"] = os.pipe()
        try:
            self.proc = subprocess.Popen(
                self._argv(ready_w, exit_r), pass_fds=(ready_w, exit_r, self._fds["userns"],
                                                       self._fds["netns"]),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                env=_HELPER_ENV, start_new_session=True, close_fds=True)
        except OSError as e:
            raise InfrastructureError(f"cannot start slirp4netns: {e}") from e
        finally:
            os.close(ready_w)
            os.close(exit_r)
            self._close("netns", "userns")

    def _argv(self, ready_w: int, exit_r: int) -> list[str]:
        # --enable-sandbox as non-root would need uid 0 mapped in the sandbox's user
        # namespace (bubblewrap maps only the caller's uid); there the helper is unprivileged
        confine = ["--enable-sandbox"] if _is_root() else []
        return [_tool("slirp4netns"), "--configure", f"--mtu={SLIRP_MTU}",
                "--disable-host-loopback", *confine, "--enable-seccomp",
                f"--ready-fd={ready_w}", f"--exit-fd={exit_r}",
                f"--userns-path=/proc/self/fd/{self._fds['userns']}", "--netns-type=path",
                f"/proc/self/fd/{self._fds['netns']}", "tap0"]

    def stop(self) -> None:
        """End the helper (idempotent): close its exit descriptor, wait (SIGKILL after 2 s).
        Call it only once the command is dead or released: closing ``--block-fd`` unstarted
        lets bubblewrap run the command (without a network, never the host's)."""
        self._close(*list(self._fds))
        if self.proc is not None:
            try:
                self.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None


def _wait_readable(fd: int, deadline: float) -> bool:
    """True once ``fd`` is readable (data or EOF); False at the deadline."""
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        return bool(sel.select(max(0.0, deadline - time.monotonic())))


def _read_bwrap_info(fd: int, deadline: float) -> dict | None:
    """bubblewrap's ``--info-fd`` JSON (child pid, namespace inodes); None at EOF before
    any byte (the wrapper exited before bubblewrap ran)."""
    buf = b""
    while True:
        if not _wait_readable(fd, deadline):
            raise InfrastructureError(f"bubblewrap did not report its sandbox within "
                                      f"{NET_SETUP_TIMEOUT_S:.0f} s (host overloaded?)")
        data = os.read(fd, 4096)
        if not data:
            if not buf:
                return None
            raise InfrastructureError(f"bubblewrap's --info-fd report is cut: {buf[:200]!r}")
        buf += data
        try:
            info = json.loads(buf)
        except ValueError:
            continue
        if not isinstance(info, dict) or not isinstance(info.get("child-pid"), int):
            raise InfrastructureError(f"unexpected bubblewrap --info-fd report: {buf[:200]!r}")
        return info


def _open_child(info: dict) -> int:
    """A descriptor of bubblewrap's child's /proc directory: later lookups through it
    fail rather than reach another process once it is gone. Checked by its network
    namespace's inode, so a child that died and whose pid was reused is never networked."""
    pid = info["child-pid"]
    try:
        fd = os.open(f"/proc/{pid}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        ino = os.stat("ns/net", dir_fd=fd).st_ino
    except OSError as e:
        raise InfrastructureError(f"the sandbox's process {pid} is gone before its "
                                  f"network was set up: {e}") from e
    want = info.get("net-namespace")
    if want is not None and ino != want:
        os.close(fd)
        raise InfrastructureError(f"the sandbox's process {pid} is gone before its network "
                                  "was set up (its pid was reused)")
    return fd


def _wait_child_loopback(child: int, deadline: float) -> None:
    """Until bubblewrap's child has added 127.0.0.1 to its loopback (the address's routes
    show in ``net/fib_trie`` of its /proc directory ``child``; a new namespace has none)."""
    pause = 0.0002
    while True:
        try:
            with open(os.open("net/fib_trie", os.O_RDONLY | os.O_CLOEXEC, dir_fd=child),
                      "rb") as f:
                if b"127.0.0.1" in f.read():
                    return
        except OSError as e:
            raise InfrastructureError(f"the sandbox's process is gone before its network "
                                      f"was set up: {e}") from e
        if time.monotonic() > deadline:
            raise InfrastructureError(f"bubblewrap did not bring up the sandbox's loopback "
                                      f"within {NET_SETUP_TIMEOUT_S:.0f} s")
        time.sleep(pause)
        pause = min(pause * 2, 0.005)


PLAIN_MODE_NOTE = (
    "plain sandbox mode: commands run as ordinary subprocesses, with no filesystem, network "
    "or /proc isolation beyond the Unix permissions of a dedicated uid (root hosts only); "
    "use it for trusted built-in tasks only (docs/sandbox.md)")
OWNER_FILE = "owner.json"
_plain_warned = threading.Event()
# starts terminal sessions (module doc of terminal.py): one thread for the process's life
_SESSION_SPAWNER = concurrent.futures.ThreadPoolExecutor(
    max_workers=1, thread_name_prefix="trsi-session-spawn")
_swept: set[str] = set()
_cgroup_note: list[str] = []


def _note_plain_once() -> None:
    if not _plain_warned.is_set():
        _plain_warned.set()
        log.warning(PLAIN_MODE_NOTE)


class LocalSandbox(Sandbox):
    """A private workspace on this host; ``mode`` is "bwrap", "plain" or "auto".

    "auto" uses bubblewrap, and falls back to plain only with ``allow_plain=True``.
    """

    def __init__(self, spec: SandboxSpec | None = None, mode: str = "auto",
                 base_dir: str | None = None, allow_plain: bool = False):
        self.spec = spec or SandboxSpec()
        refuse_image_profile(self.spec, "local")
        if mode not in ("auto", "bwrap", "plain"):
            raise BadRequest(f"LocalSandbox mode must be auto|bwrap|plain, got {mode!r}")
        if mode in ("auto", "bwrap") and not bwrap_available():
            if mode == "bwrap":
                raise InfrastructureError(
                    "bubblewrap is not usable here; `apt-get install bubblewrap` or use "
                    "mode='plain' (weaker isolation)")
            if not allow_plain:
                raise BadRequest(
                    "bubblewrap is not usable here, and the weaker plain fallback was not "
                    "allowed: `apt-get install bubblewrap`, or allow plain subprocesses "
                    "(config tasks.allow_plain_sandbox='builtin' or 'always', "
                    "open_sandbox(..., allow_plain=True), or serve --allow-plain). "
                    + PLAIN_MODE_NOTE)
            mode = "plain"
        elif mode == "auto":
            mode = "bwrap"
        if mode == "plain":
            _note_plain_once()
        elif self.spec.network and (why := user_net_problem()):
            raise InfrastructureError(
                f"network=True on local-bwrap needs user-mode networking, and {why}; "
                "install it, or open the sandbox without network (the host's own network "
                "namespace is never shared: it would expose the host's loopback)")
        self.mode = mode
        self.id = uuid.uuid4().hex[:16]
        self._marker = f"{MARKER_ENV}={self.id}".encode()
        self._lock = threading.RLock()
        self._closed = False
        self._mounted = False
        self.cgroup: cgroups.SandboxCgroup | None = None
        self.session: TmuxSession | None = None
        self._session_ns: dict[str, int] = {}  # open fds of the session's user, net ns
        self._session_pidns: int | None = None
        self._session_host_pid: int | None = None
        base = base_dir or tempfile.gettempdir()
        if _is_root():
            _check_traversable(base)
        sweep_stale(base, once=True)
        self.uid = _alloc_uid() if _is_root() else None
        self.root = tempfile.mkdtemp(prefix=f"trsi-sb-{self.id}-", dir=base)
        try:
            self._make_root()
        except BaseException:
            self.close()
            raise

    def _make_root(self) -> None:
        """The tmpfs holding workspace, /tmp and /dev/shm; cgroups; the owner record."""
        if _is_root():
            r = subprocess.run(
                ["mount", "-t", "tmpfs", "-o",
                 f"size={self.spec.disk_mb}m,mode=0711,nosuid,nodev", "tmpfs", self.root],
                capture_output=True)
            self._mounted = r.returncode == 0
            if not self._mounted:
                log.warning("no tmpfs for the workspace (%s); only RLIMIT_FSIZE bounds disk",
                            r.stderr.decode(errors="replace").strip())
            self.cgroup, why = (cgroups.create(f"trsi-{self.id}", self.spec.memory_mb << 20,
                                               self.spec.pids, self.spec.cpus)
                                if _pdeathsig()
                                else (None, "setpriv (util-linux) is missing"))
            if self.cgroup is None and not _cgroup_note:
                _cgroup_note.append(why)
                log.warning("sandbox memory and pids limits fall back to per-process "
                            "rlimits: %s", why)
        os.chmod(self.root, 0o711)
        _write_owner(self.root, self.uid, self.cgroup)
        self.ws, self.tmp, self.shm = (os.path.join(self.root, n) for n in ("ws", "tmp", "shm"))
        for d in (self.ws, self.tmp, self.shm):
            os.mkdir(d, 0o700)
            if self.uid is not None:
                os.chown(d, self.uid, self.uid)
        self.workdir = SANDBOX_WORKDIR if self.mode == "bwrap" else self.ws
        if self.spec.files:
            self.put_files(self.spec.files)

    # ------------------------------------------------------------------ exec
    def _ulimits(self, timeout: float) -> str:
        s = self.spec
        lim = [f"-f {s.disk_mb * 1024}", f"-n {s.open_files}", f"-t {math.ceil(timeout) + 1}",
               "-c 0"]
        if self.cgroup is None:  # the cgroup bounds the whole tree; RLIMIT_AS each process
            lim.append(f"-v {s.memory_mb * 1024}")
        if self.uid is not None:
            lim.append(f"-u {s.pids}")
        return "; ".join(f"ulimit -S -H {x}" for x in lim)

    def _argv(self, command: str, rel_cwd: str, timeout: float,
              env: Mapping[str, str], join_ns: Mapping[str, int] | None = None,
              net_fds: tuple[int, int] | None = None) -> list[str]:
        """The exec's process chain. Every wrapper runs with `_wrapper_env` and ``bash -p``
        (no BASH_ENV, ENV, SHELLOPTS or imported functions); the sandbox's environment
        ``env`` reaches only the final ``bash -c command`` (``env -i`` in plain mode,
        ``--clearenv --setenv`` under bubblewrap), so nothing a task or client puts in it
        (BASH_ENV, LD_PRELOAD, ...) acts in the wrapper, which starts as root.

        ``join_ns``: open descriptors of a live terminal session's namespaces ("net",
        "user"; inherited by the chain, closed before the command); the command's bubblewrap
        then keeps that session's network namespace (``nsenter --net`` before it,
        ``--share-net`` in it) so it reaches what the session serves on loopback. Its own
        PID, mount and IPC namespaces stay fresh: it still ends with its command. A
        descriptor, not a pid, so a session that died cannot hand over a reused pid's
        namespace.

        ``net_fds``: a new network namespace's `_UserNet` descriptors (``network=True``
        without a session to join): bubblewrap reports its child on the first and holds the
        command until the network is up (`_start_net`). The host's network namespace is
        never shared."""
        # Innermost wrapper, as the sandbox uid: no survivor of a dead parent, rlimits.
        guard = f'[ "$PPID" = "{os.getpid()}" ] || exit 111; ' if _pdeathsig() else ""
        if self.mode == "plain":
            join_ns = None  # plain mode shares the host's network already
        if join_ns:
            guard += "".join(f"exec {fd}<&-; " for fd in join_ns.values())
        if self.mode == "plain":
            # The wrapper stays the parent (no exec) so `kill $PPID` hits only the wrapper.
            final = [_tool("env"), "-i", *(f"{k}={v}" for k, v in env.items()),
                     "/bin/bash", "-c", command]
            inner = ["/bin/bash", "-p", "-c", f'{guard}{self._ulimits(timeout)}; "$@"; exit $?',
                     "trsi", *final]
        else:
            bw = [_tool("bwrap"), "--unshare-all", "--die-with-parent", "--new-session"]
            if join_ns:
                bw.append("--share-net")
            elif net_fds:
                bw += ["--info-fd", str(net_fds[0]), "--block-fd", str(net_fds[1])]
            bw += _bwrap_root_args()
            bw += ["--proc", "/proc", "--dev", "/dev", "--bind", self.ws, SANDBOX_WORKDIR,
                   "--bind", self.tmp, "/tmp", "--bind", self.shm, "/dev/shm",
                   "--remount-ro", "/", "--remount-ro", "/dev",
                   "--chdir", os.path.normpath(os.path.join(SANDBOX_WORKDIR, rel_cwd)),
                   "--clearenv"]
            for k, v in env.items():
                bw += ["--setenv", k, v]
            bw += ["/bin/bash", "-c", command]
            inner = ["/bin/bash", "-p", "-c", f'{guard}{self._ulimits(timeout)}; exec "$@"',
                     "trsi", *bw]
        if self.uid is None or not _pdeathsig():
            netns = ([_tool("nsenter"), f"--user=/proc/self/fd/{join_ns['user']}",
                      f"--net=/proc/self/fd/{join_ns['net']}", "--preserve-credentials", "--"]
                     if join_ns else [])
            return [*_pdeathsig(), *netns, *inner]
        # As root: join the sandbox's cgroups, then drop to its uid (setpriv sets the
        # parent-death signal after the uid change, which would clear it).
        join = "".join(f'echo $$ > {shlex.quote(f)} || exit 112; '
                       for f in (self.cgroup.procs_files if self.cgroup else ()))
        netns = (f'{shlex.quote(_tool("nsenter"))} --net=/proc/self/fd/{join_ns["net"]} -- '
                 if join_ns else "")
        drop = (f'exec {netns}{shlex.quote(_tool("setpriv"))} --reuid={self.uid} '
                f'--regid={self.uid} --clear-groups --pdeathsig KILL -- "$@"')
        return ["/bin/bash", "-p", "-c", join + drop, "trsi", *inner]

    def _wrapper_env(self) -> dict[str, str]:
        """The wrappers' own environment: fixed, nothing from the task or the caller."""
        return {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", MARKER_ENV: self.id}

    def _env(self, env: Mapping[str, str] | None) -> dict[str, str]:
        out = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": self.workdir, "LANG": "C.UTF-8",
               "TERM": "dumb", "TMPDIR": "/tmp" if self.mode == "bwrap" else self.tmp}
        out.update(self.spec.env)
        out.update(check_env(env))
        out[MARKER_ENV] = self.id
        return check_env(out)

    def _find(self) -> list[int]:
        found = set(self.cgroup.pids()) if self.cgroup is not None else set()
        if self.uid is not None:
            found.update(procs.pids_of_uid(self.uid))
        else:
            found.update(procs.pids_with_env(self._marker))
        found.discard(os.getpid())
        return sorted(found)

    def _find_outside_session(self) -> list[int]:
        """The sandbox's processes but those of its live session (bwrap: its PID
        namespace and the bubblewrap process outside it), which an exec's cleanup spares."""
        if self._session_pidns is None:
            return self._find()
        return [p for p in self._find() if p != self._session_host_pid
                and procs.ns_inode(p, "pid") != self._session_pidns]

    def processes(self) -> tuple[ProcessInfo, ...]:
        """The sandbox's processes (`Sandbox.processes`): those `_find` gives (its cgroups,
        its uid, or its environment marker), read from this host's ``/proc``; pids are this
        process's. Paths are as the sandbox sees them: ``/workspace/...`` under bubblewrap,
        host paths in plain mode (its workspace is a host directory). Without the exec lock:
        it answers while an exec or the session runs."""
        self._check_open()
        return procs.list_processes(self._find(), machinery=self._is_machinery)

    def _is_machinery(self, pid: int, ppid: int) -> bool:
        """The session's wrapper (the process this one started for it) and, under
        bubblewrap, every process in this process's PID namespace (the wrappers and
        bubblewrap's outer process: every command runs in a new one) and the pid 1 that
        bubblewrap forks in each namespace it makes (its parent is such an outer process;
        a namespace the agent makes has its init's parent inside the sandbox)."""
        channel = getattr(self.session, "channel", None)
        if ppid == os.getpid() and pid == getattr(getattr(channel, "proc", None), "pid", None):
            return True
        mine = procs.ns_inode(os.getpid(), "pid")
        if self.mode != "bwrap" or mine is None:
            return False
        if procs.ns_inode(pid, "pid") == mine:
            return True
        return procs.ns_pids(pid)[-1:] == [1] and procs.ns_inode(ppid, "pid") == mine

    def _kill_all(self, proc: subprocess.Popen | None) -> None:
        _killpg(proc)
        procs.freeze_and_kill(self._find)

    def _kill_exec(self, proc: subprocess.Popen | None) -> None:
        """End an exec's processes. With a live session in plain mode that is the exec's
        process group only (what it detached lives until close); otherwise every process
        of the sandbox outside the session."""
        _killpg(proc)
        if not (self.session_live and self.mode == "plain"):
            procs.freeze_and_kill(self._find_outside_session)

    def exec(self, command: str, timeout: float = 60.0, env: Mapping[str, str] | None = None,
             cwd: str | None = None) -> ExecResult:
        check_exec_args(command, timeout, env, cwd)
        with self._lock:
            self._check_open()
            rel = safe_relpath(cwd) if cwd else "."
            host_cwd = os.path.join(self.ws, rel)
            if not self._is_workspace_dir(rel):
                raise BadRequest(f"cwd {cwd!r} is not a directory inside the workspace")
            full_env = self._env(env)
            join_ns = self._live_ns()
            kw = {}
            if self.uid is not None and not _pdeathsig():  # no setpriv: drop uid in Popen
                kw = dict(user=self.uid, group=self.uid, extra_groups=[])
            cap_out = OutputCap(self.spec.max_output_bytes)
            cap_err = OutputCap(self.spec.max_output_bytes)
            net = self._new_user_net(join_ns)
            net_fds = net.child_fds() if net else ()
            t0 = time.monotonic()
            try:
                proc = subprocess.Popen(
                    self._argv(command, rel, timeout, full_env, join_ns=join_ns,
                               net_fds=net_fds or None),
                    stdin=subprocess.DEVNULL, pass_fds=(*join_ns.values(), *net_fds),
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=self._wrapper_env(),
                    cwd=host_cwd if self.mode == "plain" else self.ws,
                    start_new_session=True, close_fds=True, **kw)
            except OSError as e:
                if net:
                    net.stop()
                raise InfrastructureError(f"cannot start the sandbox command: {e}") from e
            self._start_net(net, proc)
            timed_out = False
            try:
                timed_out = self._pump(proc, cap_out, cap_err, t0 + timeout)
            finally:
                if proc.poll() is None:
                    self._kill_exec(proc)
                proc.wait()
                if timed_out or self.mode == "plain" or proc.returncode != 0:
                    # bwrap: a clean exit of the namespace's init already killed the rest.
                    self._kill_exec(None)
                if net:
                    net.stop()
            if proc.returncode == 112:
                raise InfrastructureError(f"sandbox {self.id}: the command could not join "
                                          "its cgroup")
            return ExecResult(
                stdout=cap_out.text(), stderr=cap_err.text(),
                exit_code=(-signal.SIGKILL if timed_out else _exit_code(proc.returncode)),
                timed_out=timed_out, truncated=cap_out.truncated or cap_err.truncated,
                duration_s=time.monotonic() - t0)

    def _new_user_net(self, join_ns: Mapping[str, int]) -> _UserNet | None:
        """The user-mode network of a command's new network namespace: bwrap with
        ``network=True`` and no live session whose namespace it joins; else None."""
        if self.mode == "bwrap" and self.spec.network and not join_ns:
            return _UserNet()
        return None

    def _start_net(self, net: _UserNet | None, proc: subprocess.Popen) -> None:
        """Network the new namespace of ``proc`` (started with ``net``'s descriptors),
        then release its command. On failure the held command dies unstarted, the helper
        stops, and the InfrastructureError says why."""
        if net is None:
            return
        net.spawned()
        try:
            net.start(time.monotonic() + NET_SETUP_TIMEOUT_S)
        except BaseException:
            self._kill_exec(proc)
            proc.wait()
            net.stop()
            for f in (proc.stdin, proc.stdout, proc.stderr):
                if f is not None:
                    f.close()
            raise

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
                        self._kill_exec(proc)
                if exited_at is None and self._closed:
                    self._kill_all(proc)  # closed from another thread
                    exited_at = time.monotonic()
                if not timed_out and exited_at is None and now >= deadline:
                    timed_out = True
                    self._kill_exec(proc)
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

    # --------------------------------------------------------------- session
    def _live_ns(self) -> dict[str, int]:
        """The namespaces an exec joins: the live session's (bwrap), as open descriptors."""
        if self.session_live:
            return self._session_ns
        return {}

    def open_session(self, lifetime_s: float = DEFAULT_SESSION_LIFETIME_S) -> TmuxSession:
        """Start the sandbox's terminal session (`terminal_rsi.sandbox.terminal`): tmux
        inside the sandbox (bubblewrap: one long-lived sandbox process in its own
        namespaces; plain: the sandbox uid), as the same uid, cgroups, rlimits and
        environment as an exec; ``lifetime_s`` bounds each of its processes' CPU time.
        While it lives, exec runs in its network namespace (what it serves is reachable)."""
        tmux = _tool("tmux")
        if tmux is None:
            raise InfrastructureError("tmux is not installed on this host; `apt-get install "
                                      "tmux` (terminal sessions run in tmux)")
        check_lifetime(lifetime_s)
        with self._lock:
            self._check_open()
            self._clear_session_slot()
            sock = ("/tmp" if self.mode == "bwrap" else self.tmp) + "/.trsi-tmux"
            cmd = shlex.join(["exec", *tmux_argv(sock, tmux, env=shell_env())])
            kw = {}
            if self.uid is not None and not _pdeathsig():
                kw = dict(user=self.uid, group=self.uid, extra_groups=[])
            net = self._new_user_net({})  # the session's namespace, joined by later execs
            net_fds = net.child_fds() if net else ()
            try:
                # from a thread that never ends: the session dies with the thread that
                # started it (its parent-death signal follows the thread, not the process)
                proc = _SESSION_SPAWNER.submit(
                    subprocess.Popen, self._argv(cmd, ".", lifetime_s, self._env(None),
                                                 net_fds=net_fds or None),
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                    env=self._wrapper_env(), cwd=self.ws, start_new_session=True,
                    pass_fds=net_fds, close_fds=True, **kw).result()
            except OSError as e:
                if net:
                    net.stop()
                raise InfrastructureError(f"cannot start the terminal session: {e}") from e
            self._start_net(net, proc)
            root = "/"  # where the session reads the sandbox's /proc (its prompt checks)
            if self.mode == "bwrap":
                self._session_host_pid = proc.pid
                inside = procs.descendant_in_other_ns(proc.pid, "pid")
                root = None if inside is None else f"/proc/{inside}/root"
                if inside is not None:
                    self._session_pidns = procs.ns_inode(inside, "pid")
                    self._session_ns = _open_ns(inside, ("net", "user"))
            self.session = TmuxSession(
                _PipeChannel(proc), max_output_bytes=self.spec.max_output_bytes,
                on_close=lambda: self._end_session(proc, net), proc_root=root)
            return self.session

    def _end_session(self, proc: subprocess.Popen, net: _UserNet | None = None) -> None:
        """Everything the session started dies: bwrap, its PID namespace; plain, every
        process of the sandbox (no exec leaves one behind); then its network's helper."""
        pidns = self._session_pidns
        _killpg(proc)
        if pidns is not None:
            procs.freeze_and_kill(lambda: procs.pids_in_ns("pid", pidns))
        else:
            procs.freeze_and_kill(self._find)
        proc.wait()
        self._session_pidns = self._session_host_pid = None
        for fd in self._session_ns.values():
            os.close(fd)
        self._session_ns = {}
        if net is not None:
            net.stop()

    # ----------------------------------------------------------------- files
    def _is_workspace_dir(self, rel: str) -> bool:
        """True if workspace path ``rel`` is a directory reached without any link."""
        return fsops.is_dir(self.ws, rel, uid=self.uid)

    def put_tar(self, data: bytes, dest: str = ".") -> None:
        with self._lock:
            self._check_open()
            fsops.extract(self.ws, data, dest, uid=self.uid,
                          limits=TarLimits(max_bytes=self.spec.disk_mb << 20))

    def get_tar(self, path: str = ".", max_bytes: int = 256 << 20) -> bytes:
        with self._lock:
            self._check_open()
            return fsops.pack(self.ws, path, uid=self.uid, limits=TarLimits(max_bytes=max_bytes))

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
        if self.session is not None:
            self.session.close()
        self._kill_all(None)
        with self._lock:
            try:
                self._kill_all(None)
            finally:
                _remove_root(self.root, self._mounted or _is_root())
                if self.cgroup is not None:
                    _remove_cgroup(self.cgroup)
                if self.uid is not None:
                    with _uid_lock:
                        _uids_in_use.discard(self.uid)


def _killpg(proc: subprocess.Popen | None) -> None:
    """SIGKILL the process group a command was started in (a no-op for None)."""
    if proc is None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _open_ns(pid: int, kinds: tuple[str, ...]) -> dict[str, int]:
    """Open descriptors of ``pid``'s namespaces (all or none)."""
    out: dict[str, int] = {}
    try:
        for k in kinds:
            out[k] = os.open(f"/proc/{pid}/ns/{k}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        for fd in out.values():
            os.close(fd)
        return {}
    return out


class _PipeChannel(Channel):
    """The pipes of a local tmux control client."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc

    def write(self, data: bytes) -> None:
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def read(self) -> bytes:
        return os.read(self.proc.stdout.fileno(), 1 << 16)

    def close(self) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        _killpg(self.proc)


def _remove_root(root: str, mounted: bool) -> None:
    if mounted:
        subprocess.run(["umount", "-l", root], capture_output=True)
    shutil.rmtree(root, ignore_errors=True)


def _remove_cgroup(cg: cgroups.SandboxCgroup) -> None:
    """Remove the groups once their last (killed) process is gone; the sweep retries."""
    for _ in range(100):
        if not cg.pids():
            break
        procs.freeze_and_kill(cg.pids, deadline_s=0.5)
        time.sleep(0.01)
    cg.remove()


# ----------------------------------------------------------------- stale sandboxes


def _write_owner(root: str, uid: int | None, cg: cgroups.SandboxCgroup | None) -> None:
    """Record who owns ``root`` (root-owned, 0600) so a later sweep can tell it is stale."""
    rec = {**procs.owner_identity(), "uid": uid, "cgroups": list(cg.dirs) if cg else []}
    path = os.path.join(root, OWNER_FILE)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(rec, f)


def _read_owner(root: str) -> dict | None:
    try:
        fd = os.open(os.path.join(root, OWNER_FILE), os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd) as f:
            rec = json.load(f)
        return rec if isinstance(rec, dict) else None
    except (OSError, ValueError):
        return None


def sweep_stale(base_dir: str | None = None, *, once: bool = False,
                min_age_s: float = 60.0) -> int:
    """Remove what sandboxes of dead owners left in ``base_dir``; returns how many.

    A sandbox is stale when the process recorded in its owner file is gone
    (`procs.owner_gone`: pid absent or reused on this host; never an owner on another host
    or in another PID namespace). Its processes (by uid, cgroup and environment
    marker) are killed, its tmpfs unmounted, its directory and cgroups removed. A
    directory without a readable owner file counts as stale once older than ``min_age_s``
    (a creation interrupted before the record was written). With ``once``, each base
    directory is swept at most once per process.
    """
    base = os.path.abspath(base_dir or tempfile.gettempdir())
    if once:
        with _uid_lock:
            if base in _swept:
                return 0
            _swept.add(base)
    n = 0
    for root in glob.glob(os.path.join(base, "trsi-sb-*")):
        rec = _read_owner(root)
        if rec is None:
            try:
                if time.time() - os.lstat(root).st_mtime < min_age_s:
                    continue
            except OSError:
                continue
            rec = {}
        elif not procs.owner_gone({k: str(rec.get(k, "")) for k in procs.OWNER_KEYS}):
            continue
        sid = os.path.basename(root)[len("trsi-sb-"):].split("-", 1)[0]
        uid = rec.get("uid")
        dirs = tuple(d for d in rec.get("cgroups", ()) if isinstance(d, str)
                     and d.startswith(cgroups.CGROUP_ROOT + "/") and "/trsi-" in d)
        cg = cgroups.SandboxCgroup(dirs, 0)

        def find(uid=uid, cg=cg, sid=sid) -> list[int]:
            found = set(cg.pids()) | set(procs.pids_with_env(f"{MARKER_ENV}={sid}".encode()))
            if isinstance(uid, int) and _UID_LOW <= uid < _UID_HIGH:
                found.update(procs.pids_of_uid(uid))
            found.discard(os.getpid())
            return sorted(found)

        procs.freeze_and_kill(find)
        _remove_root(root, _is_root())
        if dirs:
            _remove_cgroup(cg)
        log.warning("removed the stale sandbox %s (owner pid %s is gone)", root,
                    rec.get("pid", "unknown"))
        n += 1
    return n


def _exit_code(rc: int) -> int:
    # bash reports a signal death of its child as 128+N; Popen gives -N for our direct child.
    return rc
