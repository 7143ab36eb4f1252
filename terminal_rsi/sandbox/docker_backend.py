"""Docker sandboxes (Docker SDK for Python) and a warm pool of started containers.

Each sandbox is one container started from a locally built image
(``python -m terminal_rsi.sandbox.image build``). What holds, with ``spec`` its
:class:`SandboxSpec`, for profile ``"sandbox"`` (the default; profile ``"image"``, a task's
own image, differs as its section at the end says):

Container
    network ``none`` (``network=True`` uses the host network; the daemon here runs
    without a bridge), all capabilities dropped, ``no-new-privileges``, user 1000:1000,
    a read-only root filesystem, a private IPC namespace, ``RLIMIT_NOFILE`` =
    ``spec.open_files``, no core dumps, and the ``none`` log driver (the sandbox user
    can write to pid 1's stdout; a json log would grow on the host's disk unbounded).
Memory and processes
    the container's cgroup: memory = memory+swap = ``spec.memory_mb`` for the whole
    process tree (tmpfs pages written by the sandbox count too), ``pids_limit`` =
    ``spec.pids``, a CPU quota of ``spec.cpus``.
Disk: one quota of ``spec.disk_mb`` for every writable place
    ``/workspace``, ``/tmp`` and ``/dev/shm`` are three directories of ONE tmpfs of
    ``disk_mb`` mounted on the host (``<tempdir>/trsi-dk-<id>``, root-only 0700) and
    bind-mounted into the container; Docker's own ``/dev/shm`` is not mounted. This needs
    the daemon to see this host's mounts and us to be root. Otherwise (a remote daemon,
    a user-namespaced daemon, not root) the quota is split into three Docker tmpfs mounts
    whose sizes sum to ``disk_mb``: the total still holds, each place gets a share
    (:func:`_split_disk`). Engine API 1.45 volume subpaths would avoid the split; the
    engines this targets (20.10, API 1.41) lack them. Nothing else is writable.
Commands
    run through ``docker exec`` as

        timeout -s KILL T bash -c CMD; rc=$?; kill -9 -1; kill -9 -1; exit $rc

    The kill is a bash builtin run as the sandbox user: it signals every process of that
    user in the container except pid 1, so double-forked and ``setsid`` children die
    with the command and no new process is needed even when a fork bomb holds every PID.
    A command can kill the wrapper itself; whenever the exec ends by a signal, a second
    exec runs the same kill before ``exec`` returns (SandboxLost if it cannot).
    Pid 1 is a bash loop that reaps what it adopts, so the zombies of killed orphans do
    not keep holding PIDs. Output is read from the raw exec socket into head+tail
    caps. While a terminal session lives (below) the wrapper instead kills only the
    command's own process group (GNU ``timeout`` leads one):

        timeout -s KILL T bash -c CMD & pid=$!; wait $pid; rc=$?; kill -9 -- -$pid

    and the second exec is skipped, so the session's processes survive. A daemon the
    command detaches into another process group (``setsid``, a double fork that calls
    ``setpgid``) then lives until the session or the sandbox closes, as with
    Terminal-Bench's ``docker exec`` (one that keeps the command's output open makes
    the exec return about 2 s late: the engine waits that long for the streams); so
    does what is left when the command kills its own wrapper. A malformed request
    (NUL, lone surrogate, a command over 128 KiB, a bad env, timeout or cwd) is a
    :class:`BadRequest` before anything reaches the engine (``base.check_exec_args``).
Terminal session (`open_session`)
    one at a time, started by a docker exec with stdin attached as the sandbox user, with
    the command's environment, each process's CPU time bounded by ``lifetime_s``
    (RLIMIT_CPU): a tmux control-mode client (`terminal.tmux_argv`, socket
    ``/tmp/.trsi-tmux``) over the exec's multiplexed stream when the image has ``tmux``,
    else ``bash -i`` on the exec's own tty (`pty_session.PtySession`, same semantics). It
    shares the container, so ``exec`` sees its files, processes and network. Closing it
    closes the stream and then kills every process of the sandbox user (pid 1 aside):
    no tmux server, shell or background job survives. Closing the sandbox closes it.
Files
    move through GNU tar inside the container (stdin / stdout of an exec run as the
    sandbox user, with an environment the caller cannot set), so they land on the
    sandbox's tmpfs and belong to it. Uploads are checked while streaming before
    anything is sent (``base.check_tar``: member count, ``disk_mb`` of file data, a
    time budget); a member that passes through a symlink, whether planted in the
    workspace by a command or earlier in the same archive, is refused, as is a ``dest``
    that passes through one. Downloads never pass through a symlink either (the path's
    directories must be real directories); links are archived as links, FIFOs, sockets
    and devices are skipped, and the stream itself (headers included) is counted while
    it arrives: past ``max_bytes`` or the member cap the exec is dropped at once (its
    tar dies of SIGPIPE). While a terminal session lives the transfer does not first
    kill the sandbox's processes (it would end the session): a process of the session
    can then swap a checked directory for a link before tar reaches it, which gains it
    nothing, as tar runs as the sandbox user inside the container and reaches only what
    that user can read or write anyway. Every failure of a file operation is a
    BadRequest naming the path, never an ``OSError`` or a raw Docker error.
Profile ``"image"`` (a Terminal-Bench / Harbor task image, run as its tools run it)
    The container runs as the image's USER (``Config.User``; none: root ``0:0``) in
    ``spec.workdir`` or else the image's WORKDIR (none: ``/``), which is ``workdir`` and
    the workspace: it keeps the image's files. Commands and the terminal session run as
    that user, with the image's ENV (plus ``HOME`` as ``docker exec`` sets it when the
    image has none), then ``spec.env``, then the exec's. Our pid 1 replaces the image's
    ENTRYPOINT. The root filesystem is writable (no tmpfs anywhere; ``/tmp`` is the
    image's, ``/dev/shm`` Docker's own 64 MiB); ``disk_mb`` caps the writable layer with
    ``storage_opt size`` where the engine can (:func:`storage_quota_supported`, asked once
    per engine and process; overlay2 only on xfs with ``pquota``), else one warning says
    it is not enforced. Capabilities: all dropped but :data:`IMAGE_CAPS` (what package
    managers and file ownership need); ``no-new-privileges``, network, memory, pids, CPU,
    ulimits, log driver, labels, SIGKILL stop and the sweep are as above. The same two
    exec wrappers apply: an image user of root makes ``kill -9 -1`` reach every process
    but pid 1 (a non-root user cannot change uid under no-new-privileges, so its own
    processes are all there is); the second kill, a session's close and the transfers'
    first kill run as root. At start one exec checks the image has what the machinery
    runs (bash, and ``_TOOLS`` from coreutils, findutils, sed, tar): a missing one, or no
    ``/bin/bash`` for pid 1, is a BadRequest naming the image. Files move as root (as
    ``docker cp`` does: uploads belong to root, ``/tests`` can be made whatever the USER),
    still never through a link; ``put_tar`` / ``get_tar`` also take an absolute path,
    started from ``/`` instead of the workspace, and an absolute download's members are
    named relative to ``/`` (``get_tar("/logs/v")``: ``logs/v``, ``logs/v/reward.txt``).
    Relative paths stay workspace-relative; ``..`` is refused either way. The warm pool
    keys on profile and workdir too. The wrappers and scripts run the image's own bash,
    timeout and tar, which a root command can replace (the root is writable): the
    guarantees above hold against commands, not against an agent rewriting those binaries;
    the host stays out of reach either way.
Processes (`DockerSandbox.processes`)
    read from the host, never by a program in the container (its user may replace
    ``ps``): the engine's ``top`` gives the container's pids; where this host runs the
    engine (``/proc/<pid>/cgroup`` names the container) each is read from ``/proc``
    (argv, executable and open files as the container sees them); elsewhere the listing
    holds what ``top`` tells (``source="top"``: argv only, ``partial``). Left out: pid 1
    (``State.Pid``), its ``sleep 86400`` (with ``/proc``: only while it holds no file
    pid 1 does not hold) and, in profile ``"sandbox"``, each ``docker exec``'s first
    process (its parent is outside the container: the exec and transfer wrappers, the
    session's tmux client), whose binaries come from the read-only image; in profile
    ``"image"`` those binaries are the task's, so they are listed.
Cleanup
    ``close`` removes the container and unmounts its tmpfs. Containers carry owner
    labels (hostname, boot id, pid namespace, pid, process start time); the first
    sandbox or backend a process opens runs :func:`sweep_stale`, which removes the
    containers and tmpfs mounts of owners on this host that are gone (a killed
    trainer), and never those of live owners or of other hosts sharing the daemon.
"""

from __future__ import annotations

import bz2
import collections
import ctypes
import errno
import glob
import gzip
import io
import json
import logging
import lzma
import os
import posixpath
import queue
import selectors
import shutil
import socket
import struct
import tarfile
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Mapping

from terminal_rsi.sandbox import procs
from terminal_rsi.sandbox.base import (
    DEFAULT_SESSION_LIFETIME_S,
    MARKER_ENV,
    MAX_ARGV_BYTES,
    MAX_PROCESSES,
    ExecResult,
    OutputCap,
    ProcessInfo,
    Sandbox,
    SandboxSpec,
    TarLimits,
    check_exec_args,
    check_lifetime,
    check_tar,
    is_env_name,
    safe_path,
    safe_relpath,
)
from terminal_rsi.sandbox.errors import (
    BadRequest,
    InfrastructureError,
    SandboxError,
    SandboxLost,
)
from terminal_rsi.sandbox.pty_session import PtySession
from terminal_rsi.sandbox.terminal import (
    HEIGHT,
    WIDTH,
    Channel,
    StreamSession,
    TmuxSession,
    new_token,
    shell_env,
    tmux_argv,
)

log = logging.getLogger(__name__)

LABEL = "terminal_rsi.sandbox"
OWNER_LABELS = procs.OWNER_KEYS  # LABEL + "." + name
DISK_LABEL = LABEL + ".disk"  # host path of the sandbox's tmpfs ("" when split)
WORKDIR = "/workspace"
USER = "1000:1000"
ROOT = "0:0"  # profile "image": an image without USER, and the machinery's own execs
# Profile "image": the capabilities a task image's root needs to install packages and own
# files, nothing else (Docker's default set also has MKNOD, AUDIT_WRITE, NET_RAW, SETPCAP,
# SETFCAP, SYS_CHROOT; none of those is needed by apt, pip or a test harness).
IMAGE_CAPS = (
    "CHOWN",             # chown files (dpkg, tar and pip unpack as their owners)
    "DAC_OVERRIDE",      # root reads and writes files whatever their mode (apt's lists)
    "FOWNER",            # chmod / utime / set-gid bits on files root does not own
    "FSETID",            # keep set-uid/set-gid bits when root changes a file (dpkg)
    "KILL",              # root signals other users' processes (the exec cleanup kill -9 -1)
    "SETGID",            # apt drops to the _apt group, su / runuser to a task user
    "SETUID",            # ... and to the _apt user
    "NET_BIND_SERVICE",  # a task's server binds a port below 1024 (with network=True)
)
DISK_PREFIX = "trsi-dk-"
# `command -p`: the wrapper's tools come from the system's default PATH, never the exec's env.
_WRAPPER = ('exec 3>&2 2>/dev/null; command -p timeout -s KILL "$0" "$@" 2>&3 3>&-; rc=$?; '
            'kill -9 -1; kill -9 -1; exit $rc')
# The same while a terminal session lives: only the command's process group is killed
# (timeout makes itself a group leader), so the session's processes live on.
_GROUP_WRAPPER = ('exec 3>&2 2>/dev/null; command -p timeout -s KILL "$0" "$@" 2>&3 3>&- & '
                  'pid=$!; wait $pid; rc=$?; kill -9 -- -$pid; exit $rc')
# The terminal session's process: every process it starts inherits the CPU-time bound; on
# a tty (no tmux) the shell starts at the session's size (a later resize would redraw).
_SESSION_WRAPPER = ('ulimit -S -H -t "$0" 2>/dev/null || exit 125; '
                    f'if [ -t 0 ]; then command -p stty cols {WIDTH} rows {HEIGHT}; fi; '
                    'exec "$@"')
SESSION_SOCKET = "/tmp/.trsi-tmux"
# pid 1 of every container: it reaps the orphans a command leaves (``sleep infinity`` would
# keep their zombies, each holding one of spec.pids for good); ``kill -9 -1`` spares pid 1.
INIT_ARGV = ["/bin/bash", "-c", "while :; do sleep 86400 & wait $!; done"]
INIT_SLEEP = ("sleep", "86400")  # the argv of pid 1's child (`DockerSandbox.processes`)
# What the machinery runs in a container besides bash (wrappers, tar scripts, sessions):
# profile "image" checks a task image has them when the sandbox starts, as the image's
# USER, and learns that user's HOME as `docker exec` sets it (the image's ENV HOME, else
# the passwd entry's): line 1 the missing tools, line 2 HOME.
_TOOLS = ("env", "timeout", "dd", "mkdir", "stty", "find", "xargs", "sed", "tar", "sh")
_PROBE_SCRIPT = ('for t in "$@"; do command -v "$t" >/dev/null 2>&1 || printf "%s " "$t"; '
                 'done; printf "\\n%s" "$HOME"')
_GRACE_S = 15.0
# (image id, user, what) -> what a fresh container of that image tells (`_image_fact`)
_image_facts: dict[tuple[str, str, str], str] = {}
_facts_lock = threading.Lock()
_close_lock = threading.Lock()
# The environment of the machinery's own execs (tar): nothing of the spec or the agent.
# The machinery's own processes (the exec wrapper, tar scripts) run with this environment
# over the image's, under `bash -p` (no BASH_ENV, ENV, SHELLOPTS or imported functions): a
# task image or a caller cannot put code into them (LD_PRELOAD, BASH_ENV, ...). The
# command itself gets the image's environment plus the spec's and the exec's (`env -i`).
_TOOL_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
             "LC_ALL": "C", "TAR_OPTIONS": "", "BASH_ENV": "", "ENV": "", "CDPATH": "",
             "LD_PRELOAD": "", "LD_LIBRARY_PATH": "", "LD_AUDIT": "", "GCONV_PATH": ""}


# ------------------------------------------------------------------------ engine


def docker_client(timeout: int = 120):
    """A Docker SDK client; InfrastructureError if the engine is unreachable."""
    import docker  # the Docker SDK: an optional engine, loaded when a Docker backend is used

    try:
        client = docker.from_env(timeout=timeout)
        client.ping()
    except Exception as e:  # noqa: BLE001 - any engine failure is infrastructure
        raise InfrastructureError(
            f"cannot reach the Docker engine ({e}); start dockerd (see .ci/setup_sandbox.sh)"
        ) from e
    return client


def docker_available() -> bool:
    try:
        docker_client(timeout=5)
        return True
    except InfrastructureError:
        return False


def _map_error(e: Exception, what: str) -> SandboxError:
    import docker  # the Docker SDK: an optional engine, loaded when a Docker backend is used
    import requests

    if isinstance(e, SandboxError):
        return e
    if isinstance(e, docker.errors.NotFound):
        return SandboxLost(f"{what}: container is gone ({e.explanation})")
    if isinstance(e, docker.errors.APIError):
        code = e.response.status_code if e.response is not None else 500
        if code == 409:
            return SandboxLost(f"{what}: container is not running ({e.explanation})")
        if code >= 500:
            return InfrastructureError(f"{what}: Docker engine error {code}: {e.explanation}")
        return BadRequest(f"{what}: Docker rejected the request ({code}): {e.explanation}")
    if isinstance(e, (requests.exceptions.RequestException, OSError)):
        return InfrastructureError(f"{what}: Docker engine unreachable: {e}")
    return InfrastructureError(f"{what}: {type(e).__name__}: {e}")


def _pool_key(spec: SandboxSpec) -> tuple:
    return (spec.image, spec.memory_mb, spec.cpus, spec.pids, spec.disk_mb, spec.network,
            spec.open_files, spec.profile, spec.workdir)


# ------------------------------------------------------------------------ owners


# ------------------------------------------------------------------------ disk


_libc = None
_MS_NOSUID, _MS_NODEV, _MNT_DETACH = 2, 4, 2
_shared_disk: bool | None = None  # None: not decided yet in this process
_shared_disk_lock = threading.Lock()


def _c():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def _split_disk(disk_mb: int) -> tuple[int, int, int]:
    """Sizes (MiB) of /workspace, /tmp and /dev/shm when one shared tmpfs is not possible.

    They sum to ``disk_mb`` (at least 3, one MiB each).
    """
    shm = max(1, disk_mb // 8)
    tmp = max(1, disk_mb // 4)
    return max(1, disk_mb - tmp - shm), tmp, shm


def _shared_disk_possible(client) -> bool:
    """Whether a host tmpfs bind-mounted into containers can work (decided once)."""
    global _shared_disk
    with _shared_disk_lock:
        if _shared_disk is None:
            why = ""
            if os.geteuid() != 0:
                why = "not root (cannot mount a tmpfs)"
            elif not str(client.api.base_url).startswith("http+docker://localhost"):
                why = f"the daemon is not on a local socket ({client.api.base_url})"
            else:
                try:
                    opts = client.info().get("SecurityOptions") or []
                except Exception as e:  # noqa: BLE001
                    raise _map_error(e, "docker info") from e
                if any("userns" in o for o in opts):
                    why = "the daemon remaps user namespaces"
            _shared_disk = not why
            if why:
                _note_split(why)
        return _shared_disk


def _note_split(why: str) -> None:
    log.warning("Docker sandboxes: %s; disk_mb is split into separate tmpfs mounts for "
                "/workspace, /tmp and /dev/shm (their sizes sum to disk_mb)", why)


def _disk_base() -> str:
    return tempfile.gettempdir()


def make_disk(sid: str, disk_mb: int) -> str:
    """Mount a tmpfs of ``disk_mb`` with ws/, tmp/ and shm/ and an owner record; its path."""
    root = os.path.join(_disk_base(), DISK_PREFIX + sid)
    os.mkdir(root, 0o700)
    try:
        if _c().mount(b"tmpfs", root.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV,
                      f"size={disk_mb}m,mode=0700".encode()) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"mount tmpfs on {root}: {os.strerror(err)}")
        for name, uid, mode in (("ws", 1000, 0o755), ("tmp", 0, 0o1777), ("shm", 0, 0o1777)):
            path = os.path.join(root, name)
            os.mkdir(path)
            os.chown(path, uid, uid)
            os.chmod(path, mode)
        fd = os.open(os.path.join(root, "owner.json"),
                     os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(procs.owner_identity(), f)
    except BaseException:
        remove_disk(root)
        raise
    return root


def _is_disk_path(path: str) -> bool:
    name = os.path.basename(path)
    return (os.path.isabs(path) and name.startswith(DISK_PREFIX) and len(name) > len(DISK_PREFIX)
            and all(ch.isalnum() or ch == "-" for ch in name[len(DISK_PREFIX):]))


def remove_disk(root: str) -> None:
    """Unmount (lazily: a container still holding it keeps it until it goes) and remove."""
    if not root or not _is_disk_path(root):
        return
    for _ in range(8):  # a sandbox's tmpfs is mounted once; stacked mounts are not expected
        if _c().umount2(root.encode(), _MNT_DETACH) != 0:
            break
    try:
        os.rmdir(root)
    except FileNotFoundError:
        pass
    except OSError as e:
        if e.errno == errno.ENOTEMPTY:  # never mounted: a plain directory
            shutil.rmtree(root, ignore_errors=True)
        else:
            log.warning("removing the sandbox disk %s failed: %s", root, e)


# ------------------------------------------------------------------------ containers


class ContainerBox:
    """A started container and the host tmpfs it uses (``disk`` is "" when split or for
    profile "image"); ``user`` and ``workdir`` are the container's (what exec runs as and
    in: profile "sandbox" 1000:1000 in /workspace, profile "image" the image's)."""

    def __init__(self, container, disk: str):
        self.container, self.disk = container, disk
        self.id = container.id
        cfg = (getattr(container, "attrs", None) or {}).get("Config") or {}
        self.user = cfg.get("User") or ROOT
        self.workdir = cfg.get("WorkingDir") or "/"

    def destroy(self) -> None:
        try:
            self.container.remove(force=True, v=True)
        except Exception as e:  # noqa: BLE001
            # the Docker SDK: an optional engine, loaded when a Docker backend is used
            import docker

            if not isinstance(e, docker.errors.NotFound):
                log.warning("removing container %s failed: %s", self.id[:12], e)
        remove_disk(self.disk)


def _create_box(client, spec: SandboxSpec, sid: str) -> ContainerBox:
    """Start a container for ``spec``: one tmpfs for every writable place when possible
    (profile "image": none, the image's own root filesystem is writable)."""
    global _shared_disk
    if spec.profile == "sandbox" and _shared_disk_possible(client):
        try:
            disk = make_disk(sid, spec.disk_mb)
        except OSError as e:
            _shared_disk = False
            _note_split(f"mounting a tmpfs failed ({e})")
        else:
            try:
                return ContainerBox(_run_container(client, spec, sid, disk), disk)
            except BadRequest as e:
                remove_disk(disk)
                if "bind source path does not exist" not in str(e):
                    raise
                _shared_disk = False
                _note_split("the daemon does not see this host's mounts")
            except BaseException:
                remove_disk(disk)
                raise
    return ContainerBox(_run_container(client, spec, sid, ""), "")


def _sandbox_profile(spec: SandboxSpec, disk: str) -> dict:
    """create() arguments of profile "sandbox": uid 1000, read-only root, tmpfs places."""
    # the Docker SDK: an optional engine, loaded when a Docker backend is used
    from docker.types import Mount

    if disk:
        places = {"mounts": [Mount(target, os.path.join(disk, sub), type="bind")
                             for target, sub in ((WORKDIR, "ws"), ("/tmp", "tmp"),
                                                 ("/dev/shm", "shm"))]}
    else:
        ws, tmp, shm = _split_disk(spec.disk_mb)
        places = {"tmpfs": {
            WORKDIR: f"rw,exec,nosuid,nodev,size={ws}m,uid=1000,gid=1000,mode=0755",
            "/tmp": f"rw,exec,nosuid,nodev,size={tmp}m,mode=1777",
            "/dev/shm": f"rw,exec,nosuid,nodev,size={shm}m,mode=1777"}}
    return {"command": INIT_ARGV, "user": USER, "working_dir": WORKDIR, "read_only": True,
            **places}


def _image_profile(client, spec: SandboxSpec) -> dict:
    """create() arguments of profile "image": the image's USER and WORKDIR (or
    spec.workdir), a writable root, IMAGE_CAPS, a disk quota where the engine has one."""
    user, workdir = image_user_and_workdir(client, spec)
    kw = {"user": user, "working_dir": workdir, "read_only": False, "cap_add": list(IMAGE_CAPS),
          # our pid 1, never the image's ENTRYPOINT
          "entrypoint": INIT_ARGV[:1], "command": INIT_ARGV[1:]}
    if storage_quota_supported(client, spec.image):
        kw["storage_opt"] = {"size": f"{spec.disk_mb}M"}
    return kw


def image_user_and_workdir(client, spec: SandboxSpec) -> tuple[str, str]:
    """Profile "image": who a container of ``spec.image`` runs as and where: the image's
    USER (none: root) in ``spec.workdir``, else the image's WORKDIR, else ``/``."""
    cfg = _image_config(client, spec.image)
    return cfg.get("User") or ROOT, spec.workdir or cfg.get("WorkingDir") or "/"


def _image_config(client, image: str) -> dict:
    """The image's Config (User, WorkingDir, Env ...); BadRequest when it is missing."""
    import docker  # the Docker SDK: an optional engine, loaded when a Docker backend is used

    try:
        return client.images.get(image).attrs.get("Config") or {}
    except docker.errors.ImageNotFound as e:
        raise BadRequest(f"image {image!r} not found on the Docker engine; build or load it "
                         "first (sandboxes never pull from a registry)") from e
    except Exception as e:  # noqa: BLE001
        raise _map_error(e, f"inspect image {image!r}") from e


def _run_container(client, spec: SandboxSpec, sid: str, disk: str):
    # the Docker SDK: an optional engine, loaded when a Docker backend is used
    from docker.types import Ulimit

    profile = (_image_profile(client, spec) if spec.profile == "image"
               else _sandbox_profile(spec, disk))
    labels = {LABEL: sid, DISK_LABEL: disk}
    labels.update({f"{LABEL}.{k}": v for k, v in procs.owner_identity().items()})
    try:
        # create + start, not run: run() pulls a missing image from a registry (network
        # traffic the sandbox host must never make); create() only reports it missing.
        container = client.containers.create(
            spec.image, name=f"trsi-{sid}", hostname="sandbox",
            network_mode="host" if spec.network else "none", ipc_mode="private",
            mem_limit=f"{spec.memory_mb}m", memswap_limit=f"{spec.memory_mb}m",
            pids_limit=spec.pids, nano_cpus=int(spec.cpus * 1e9),
            cap_drop=["ALL"], security_opt=["no-new-privileges"],
            ulimits=[Ulimit(name="nofile", soft=spec.open_files, hard=spec.open_files),
                     Ulimit(name="core", soft=0, hard=0)],
            labels=labels, stop_signal="SIGKILL", init=False,
            log_config={"type": "none"},  # pid 1's stdout is writable by the sandbox user
            **profile)
        container.start()
        return container
    except Exception as e:  # noqa: BLE001
        raise _create_error(client, spec, sid, e) from e


def _create_error(client, spec: SandboxSpec, sid: str, e: Exception) -> SandboxError:
    """What a failed create or start means (the half-made container removed)."""
    import docker  # the Docker SDK: an optional engine, loaded when a Docker backend is used

    if isinstance(e, docker.errors.ImageNotFound):
        return BadRequest(
            f"image {spec.image!r} not found; build it with "
            "`python -m terminal_rsi.sandbox.image build`")
    err = _map_error(e, "create container")
    if isinstance(e, docker.errors.APIError):
        # A container created but not started would hold the mount: remove it by name.
        try:
            client.api.remove_container(f"trsi-{sid}", force=True)
        except Exception:  # noqa: BLE001
            pass
        if "no such file or directory" in str(e.explanation) and INIT_ARGV[0] in str(
                e.explanation):
            return BadRequest(_needs_tools(spec.image, f"it has no {INIT_ARGV[0]}"))
    return err


def _needs_tools(image: str, why: str) -> str:
    return (f"image {image!r} cannot host a sandbox: {why}; terminal_rsi needs bash "
            f"({INIT_ARGV[0]}) and coreutils, findutils, sed and tar ({', '.join(_TOOLS)}) in "
            "the image: install them in its Dockerfile")


# ------------------------------------------------------------------------ disk quota


_quota: dict[str, bool] = {}  # engine (base url) -> whether it enforces storage_opt size
_quota_lock = threading.Lock()
_QUOTA_PROBE_MB = 1024


def storage_quota_supported(client, image: str) -> bool:
    """Whether the engine can cap a container's writable layer (``storage_opt size``, how
    profile "image" applies ``disk_mb``). Decided once per engine and process by asking the
    engine itself: a container of ``image`` is created (never started) with the option and
    removed; overlay2 refuses it unless its backing filesystem is xfs mounted with
    ``pquota``. When it cannot, one warning says disk_mb is not enforced there."""
    key = str(client.api.base_url)
    with _quota_lock:
        if key not in _quota:
            _quota[key] = _probe_quota(client, image)
            if not _quota[key]:
                log.warning("Docker sandboxes of profile 'image': this engine cannot cap a "
                            "container's writable layer (storage_opt size needs overlay2 on "
                            "xfs with pquota, btrfs or zfs); disk_mb is NOT enforced for "
                            "them on this engine (memory, pids and CPU limits still are)")
        return _quota[key]


def _probe_quota(client, image: str) -> bool:
    import docker  # the Docker SDK: an optional engine, loaded when a Docker backend is used

    api = client.api
    labels = {LABEL: "probe", DISK_LABEL: ""}
    labels.update({f"{LABEL}.{k}": v for k, v in procs.owner_identity().items()})
    try:
        cid = api.create_container(
            image, ["true"], name=f"trsi-probe-{uuid.uuid4().hex[:12]}", labels=labels,
            host_config=api.create_host_config(
                network_mode="none", storage_opt={"size": f"{_QUOTA_PROBE_MB}M"}))["Id"]
    except docker.errors.APIError as e:
        if isinstance(e, docker.errors.ImageNotFound):
            raise BadRequest(f"image {image!r} not found on the Docker engine") from e
        text = str(e.explanation or e).lower()
        if any(w in text for w in ("storage-opt", "storage opt", "storageopt")):
            return False
        raise _map_error(e, "probe the engine's disk quota") from e
    except Exception as e:  # noqa: BLE001
        raise _map_error(e, "probe the engine's disk quota") from e
    try:
        api.remove_container(cid, force=True, v=True)
    except Exception as e:  # noqa: BLE001
        log.warning("removing the quota probe container %s failed: %s", cid[:12], e)
    return True


# ------------------------------------------------------------------------ sweep


_swept: set[str] = set()
_sweep_lock = threading.Lock()


def sweep_stale(client=None, *, once: bool = False, min_age_s: float = 60.0) -> int:
    """Remove the sandbox containers and tmpfs mounts of owners on this host that are gone.

    A container is stale when its owner labels name a process of this host that no longer
    runs (same hostname and PID namespace, pid absent or reused: another start time, or
    another boot). A tmpfs directory ``<tempdir>/trsi-dk-*`` is stale when the owner
    record inside it is, or when it has none and is older than ``min_age_s`` (a creation
    interrupted before the record was written). With ``once``, the sweep runs at most once
    per process and daemon. Returns how many containers and mounts were removed.
    """
    client = client or docker_client()
    key = str(client.api.base_url)
    if once:
        with _sweep_lock:
            if key in _swept:
                return 0
            _swept.add(key)
    me = procs.owner_identity()
    n = 0
    try:
        # ignore_removed: a container removed meanwhile (another sweep) is not an error
        found = client.containers.list(all=True, filters={"label": LABEL}, ignore_removed=True)
    except Exception as e:  # noqa: BLE001
        raise _map_error(e, "list sandbox containers") from e
    for c in found:
        labels = c.labels or {}
        owner = {k: labels.get(f"{LABEL}.{k}", "") for k in OWNER_LABELS}
        if not procs.owner_gone(owner, me):
            continue
        ContainerBox(c, labels.get(DISK_LABEL, "")).destroy()
        log.warning("removed the stale sandbox container %s (owner pid %s on %s is gone)",
                    c.name, owner["pid"], owner["host"])
        n += 1
    disks = glob.glob(os.path.join(_disk_base(), DISK_PREFIX + "*")) if os.geteuid() == 0 \
        else []  # only root makes them
    for root in disks:
        if not _is_disk_path(root):
            continue
        try:
            with open(os.path.join(root, "owner.json"), encoding="utf-8") as f:
                owner = json.load(f)
            stale = isinstance(owner, dict) and procs.owner_gone(
                {k: str(owner.get(k, "")) for k in OWNER_LABELS}, me)
        except (OSError, ValueError):
            try:
                stale = time.time() - os.lstat(root).st_mtime > min_age_s
            except OSError:
                stale = False
        if stale:
            remove_disk(root)
            n += 1
    return n


def remove_containers(client=None, pid: int | None = None) -> int:
    """Remove every sandbox container (of process ``pid`` if given) and its tmpfs.

    Returns the count of containers removed.
    """
    client = client or docker_client()
    filt = {"label": [f"{LABEL}.pid={pid}"] if pid is not None else [LABEL]}
    n = 0
    for c in client.containers.list(all=True, filters=filt, ignore_removed=True):
        try:
            c.remove(force=True, v=True)
            n += 1
        except Exception:  # noqa: BLE001
            continue
        remove_disk((c.labels or {}).get(DISK_LABEL, ""))
    return n


# ------------------------------------------------------------------------ exec streams


class _ExecSocket:
    """A raw docker exec stream (multiplexed; raw bytes with ``tty``): stdin written while
    output is read."""

    def __init__(self, client, container_id: str, cmd: list[str], env: dict[str, str],
                 workdir: str, stdin: bool = False, tty: bool = False, user: str = USER):
        api = client.api
        try:
            self.exec_id = api.exec_create(container_id, cmd, stdin=stdin, stdout=True,
                                           stderr=True, tty=tty, environment=env,
                                           workdir=workdir, user=user)["Id"]
            sock = api.exec_start(self.exec_id, tty=tty, socket=True)  # tty: raw stream
        except Exception as e:  # noqa: BLE001
            raise _map_error(e, "exec") from e
        self.api = api
        self.has_stdin = stdin
        self._keep = sock
        self.sock: socket.socket = getattr(sock, "_sock", sock)
        self._buf = bytearray()
        self._left = 0  # payload bytes of the current frame still to come
        self._sink = None

    def pump(self, out, err, deadline: float, stdin: Iterable[bytes | memoryview] = ()
             ) -> None:
        """Write ``stdin`` (then close it) and demultiplex output into out/err (objects
        with .feed) until EOF. TimeoutError at ``deadline``; a sink's exception ends it.

        Writing stops quietly when the process stops reading: its exit status says why.
        """
        pending = collections.deque(memoryview(b).cast("B") for b in stdin if len(b))
        writing = bool(pending)
        if self.has_stdin and not writing:
            self._shutdown_write()
        sel = selectors.DefaultSelector()
        self.sock.setblocking(False)
        sel.register(self.sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if writing
                                                        else 0))
        try:
            while True:
                wait = deadline - time.monotonic()
                if wait <= 0:
                    raise TimeoutError
                for _, events in sel.select(min(wait, 5.0)):
                    if events & selectors.EVENT_WRITE and writing:
                        writing = self._write_some(pending)
                        if not writing:
                            sel.modify(self.sock, selectors.EVENT_READ)
                    if events & selectors.EVENT_READ:
                        try:
                            data = self.sock.recv(1 << 16)
                        except (BlockingIOError, InterruptedError):
                            continue
                        except OSError as e:
                            raise InfrastructureError(
                                f"reading the exec stream failed: {e}") from e
                        if not data:
                            return
                        self._demux(data, out, err)
        finally:
            sel.close()

    def _write_some(self, pending: collections.deque) -> bool:
        """Send what the socket takes now; False once everything is sent (or refused)."""
        try:
            while pending:
                n = self.sock.send(pending[0][:1 << 20])
                if n < len(pending[0]):
                    pending[0] = pending[0][n:]
                    return True
                pending.popleft()
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:  # the process stopped reading (exited): its status tells why
            pending.clear()
        self._shutdown_write()
        return False

    def _shutdown_write(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def _demux(self, data: bytes, out, err) -> None:
        """Feed the payload of docker's 8-byte-header frames to the right sink."""
        self._buf += data
        while self._buf:
            if self._left == 0:
                if len(self._buf) < 8:
                    return
                kind, self._left = struct.unpack(">BxxxL", self._buf[:8])
                del self._buf[:8]
                self._sink = err if kind == 2 else out
                continue
            take = min(self._left, len(self._buf))
            chunk = bytes(self._buf[:take])
            del self._buf[:take]
            self._left -= take
            self._sink.feed(chunk)

    def exit_code(self) -> int:
        for _ in range(200):
            info = self.api.exec_inspect(self.exec_id)
            if not info.get("Running"):
                code = info.get("ExitCode")
                return -1 if code is None else int(code)
            time.sleep(0.01)
        return -1

    def close(self) -> None:
        for s in (self.sock, self._keep):
            try:
                s.close()
            except OSError:
                pass


class _Frames:
    """Collects the payloads `_ExecSocket._demux` hands it."""

    def __init__(self):
        self.parts: list[bytes] = []

    def feed(self, data: bytes) -> None:
        self.parts.append(data)

    def take(self) -> bytes:
        data, self.parts = b"".join(self.parts), []
        return data


class _ExecChannel(Channel):
    """The stream of a terminal session's docker exec (stdin attached): multiplexed
    frames (stdout and stderr alike are the session's output), or raw bytes for a tty."""

    def __init__(self, stream: _ExecSocket, multiplexed: bool):
        self.stream, self.multiplexed = stream, multiplexed
        self.sock = stream.sock
        self.sock.settimeout(None)  # the SDK's client timeout would end an idle session
        self._frames = _Frames()
        self._closed = False

    def write(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read(self) -> bytes:
        while True:
            try:
                data = self.sock.recv(1 << 16)
            except OSError:
                if self._closed:
                    return b""  # closed under the reader
                raise
            if not data or not self.multiplexed:
                return data
            self.stream._demux(data, self._frames, self._frames)
            payload = self._frames.take()
            if payload:
                return payload

    def close(self) -> None:
        self._closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the reader blocked in recv
        except OSError:
            pass
        self.stream.close()


class _TarSink:
    """Collects a tar stream, counting its bytes (headers included) and its members.

    Raises BadRequest as soon as the stream passes ``max_bytes`` or ``max_members``, so
    the caller drops the exec at once instead of reading the rest.
    """

    _NOT_MEMBERS = frozenset(b"LKxgX")  # GNU long names/links, pax headers

    def __init__(self, max_bytes: int, max_members: int, what: str):
        self.parts: list[bytes] = []
        self.n = 0
        self.members = 0
        self.max_bytes, self.max_members, self.what = max_bytes, max_members, what
        self._hdr: bytearray | None = bytearray()  # a header being collected, or None
        self._skip = 0  # payload bytes before the next header
        self._end = False

    def feed(self, data: bytes) -> None:
        self.n += len(data)
        if self.n > self.max_bytes:
            raise BadRequest(f"{self.what} is larger than max_bytes={self.max_bytes} "
                             "(the tar stream, headers included)")
        self.parts.append(data)
        self._scan(data)

    def _scan(self, data: bytes) -> None:
        i = 0
        while i < len(data) and not self._end:
            if self._hdr is None:
                step = min(self._skip, len(data) - i)
                i += step
                self._skip -= step
                if self._skip:
                    return
                self._hdr = bytearray()
            take = min(512 - len(self._hdr), len(data) - i)
            self._hdr += data[i:i + take]
            i += take
            if len(self._hdr) == 512:
                self._header(bytes(self._hdr))
                self._hdr = None

    def _header(self, h: bytes) -> None:
        if h == bytes(512):
            self._end = True
            return
        try:
            size = tarfile.nti(h[124:136])
        except (tarfile.HeaderError, ValueError) as e:
            raise InfrastructureError(f"{self.what}: unreadable tar header from tar: {e}") \
                from e
        self._skip = -(-size // 512) * 512
        if h[156] not in self._NOT_MEMBERS:
            self.members += 1
            if self.members > self.max_members:
                raise BadRequest(f"{self.what}: more than {self.max_members} entries to "
                                 "download; fetch a smaller directory")

    def value(self) -> bytes:
        return b"".join(self.parts)


# ------------------------------------------------------------------------ tar helpers

# Before a transfer no process of the sandbox may run while paths are checked and used
# (not while a terminal session lives: see the module doc).
_STOP_ALL = "kill -9 -1 2>/dev/null\n"
# Both start in $TRSI_DIR (the tool env, set by the sandbox: its workspace, or "/" for an
# absolute path of profile "image"); $TRSI_WHERE names it in messages, $TRSI_SHOW prefixes
# the paths they print ("/" when absolute).
# put: $@ are the dest components. stdin: "<n>\n", n bytes of NUL-separated paths (relative
# to dest) that must not be symlinks, then the tar stream.
_PUT_SCRIPT = r'''
cd -P -- "$TRSI_DIR" || exit 6
for c in "$@"; do
  if [ -L "$c" ]; then
    printf '%s is a symlink; %s paths are never followed through links\n' "$c" "$TRSI_WHERE" >&2
    exit 3
  fi
  if [ ! -d "$c" ]; then mkdir -- "$c" || exit 3; fi
  cd -P -- "./$c" || exit 3
done
IFS= read -r n || exit 5
if [ "$n" -gt 0 ]; then
  dd bs=65536 count="$n" iflag=count_bytes,fullblock status=none |
    xargs -0 -r sh -c 'for p do if [ -L "$p" ]; then
      printf "%s is a symlink; uploads are never written through links\n" "$p" >&2; exit 3
    fi; done' sh || exit 3
fi
exec tar -x --no-same-owner --no-overwrite-dir -f -
'''

# get: $@ are the path's components ("." alone for the start directory itself).
_GET_SCRIPT = r'''
cd -P -- "$TRSI_DIR" || exit 6
p=.
n=$#
for ((i = 1; i <= n; i++)); do
  c=${!i}
  [ "$c" = . ] && continue
  p=$p/$c
  if [ -L "$p" ]; then
    [ "$i" -eq "$n" ] && break
    printf '%s is a symlink; %s paths are never followed through links\n' \
      "$TRSI_SHOW${p#./}" "$TRSI_WHERE" >&2
    exit 3
  fi
  if [ ! -e "$p" ]; then
    printf '%s does not exist in the %s\n' "$TRSI_SHOW${p#./}" "$TRSI_WHERE" >&2; exit 4
  fi
  if [ "$i" -lt "$n" ] && [ ! -d "$p" ]; then
    printf '%s is not a directory\n' "$TRSI_SHOW${p#./}" >&2; exit 3
  fi
done
if [ "$p" = . ]; then
  { printf '.\0'; find . -mindepth 1 \( -type f -o -type d -o -type l \) -printf '%P\0'; }
else
  find "$p" \( -type f -o -type d -o -type l \) -print0 | sed -z 's,^\./,,'
fi | tar -c --null --no-recursion --verbatim-files-from -T - --numeric-owner \
         --ignore-failed-read --warning=no-file-changed -f -
'''


def _upload_stream(data: bytes, members: list[tarfile.TarInfo]) -> list[bytes | memoryview]:
    """The archive as an uncompressed tar ending right after its last member.

    Compressed uploads are decompressed here (GNU tar cannot detect compression on a
    pipe), never past the end of the members ``check_tar`` read: a trailing bomb is not
    expanded.
    """
    end = 0
    for m in members:
        end = max(end, m.offset_data + (-(-m.size // 512) * 512 if m.isreg() else 0))
    head = bytes(data[:6])
    opener = (gzip.GzipFile if head[:2] == b"\x1f\x8b" else
              bz2.BZ2File if head[:3] == b"BZh" else
              lzma.LZMAFile if head == b"\xfd7zXZ\x00" else None)
    if opener is None:
        body: bytes | memoryview = memoryview(data)[:end]
    else:
        try:
            with opener(fileobj=io.BytesIO(data)) if opener is gzip.GzipFile \
                    else opener(io.BytesIO(data)) as f:
                body = f.read(end)
        except (OSError, EOFError, lzma.LZMAError, ValueError) as e:
            raise BadRequest(f"upload is not a readable compressed tar stream: {e}") from e
    return [body, bytes(1024)]


def _checked_paths(members: list[tarfile.TarInfo]) -> list[str]:
    """Every directory an upload writes into or creates (relative to dest), refusing
    members that pass through a symlink member of the same archive."""
    links = {safe_relpath(m.name) for m in members if m.issym()}
    paths: set[str] = set()
    for m in members:
        name = safe_relpath(m.name)
        if name == ".":
            continue
        parts = name.split("/")
        for i in range(1, len(parts)):
            prefix = "/".join(parts[:i])
            if prefix in links:
                raise BadRequest(f"tar member {m.name!r} passes through the symlink "
                                 f"{prefix!r} of the same upload; links are never followed")
            paths.add(prefix)
        if m.isdir():
            paths.add(name)
    return sorted(paths)


# ------------------------------------------------------------------------ sandbox


class DockerSandbox(Sandbox):
    """One container. Create through :class:`DockerBackend` (warm pool) or directly.

    ``tar_limits`` caps downloads (members, time); uploads use the same with ``max_bytes``
    set to the spec's ``disk_mb``.
    """

    tar_limits = TarLimits()

    def __init__(self, spec: SandboxSpec | None = None, client=None,
                 box: ContainerBox | None = None):
        self.spec = spec or SandboxSpec()
        self.client = client or docker_client()
        self.id = uuid.uuid4().hex[:16]
        self._lock = threading.RLock()
        self._closed = False
        sweep_stale(self.client, once=True)
        self.box = box or _create_box(self.client, self.spec, self.id)
        self.container = self.box.container
        self.container_id = self.box.id
        self.image_profile = self.spec.profile == "image"
        # profile "sandbox": /workspace as uid 1000; "image": the image's WORKDIR and USER
        self.workdir, self.user = self.box.workdir, self.box.user
        # the machinery's own execs (transfers, cleanup): root in profile "image", as
        # `docker cp` is, so /tests can be made whatever the image's USER
        self.tool_user = ROOT if self.image_profile else USER
        self._image_env: dict[str, str] | None = None
        self.session: StreamSession | None = None
        self._home = ""  # profile "image": HOME as docker exec gives the image's USER
        self._init_pid = 0  # pid 1 as the engine's host numbers it (`processes`), once known
        try:
            if self.image_profile:
                self._probe_image()
            if self.spec.files:
                self.put_files(self.spec.files)
        except BaseException:
            self.close()
            raise

    def _probe_image(self) -> None:
        """Profile "image": BadRequest naming the image when it lacks a tool we run; learn
        the USER's HOME (`_PROBE_SCRIPT`). Known per image and user after the first
        sandbox (`_image_fact`)."""
        self._home = self._image_fact("home", self._probe_home)

    def _image_fact(self, what: str, learn) -> str:
        """What a fresh container of this sandbox's image tells, learned once per image id
        and user (`learn()`, in this container) and remembered for the process: every
        container of an image starts the same."""
        image_id = (self.container.attrs or {}).get("Image") or ""
        key = (image_id, self.user, what)
        with _facts_lock:
            if image_id and key in _image_facts:
                return _image_facts[key]
        value = learn()
        if image_id:
            with _facts_lock:
                _image_facts[key] = value
        return value

    def _probe_home(self) -> str:
        out = OutputCap(1 << 16)
        code, msg = self._tool("check tools", _PROBE_SCRIPT, list(_TOOLS), out,
                               time.monotonic() + 60, user=self.user)
        missing, _, home = out.text().partition("\n")
        if code != 0 or missing.strip():
            why = (f"it lacks {missing.strip()}" if code == 0
                   else f"bash failed there ({code}): {(out.text() + msg)[-300:]}")
            raise BadRequest(_needs_tools(self.spec.image, why))
        return home

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxLost(f"sandbox {self.id} is closed")

    def _env(self, env: Mapping[str, str] | None) -> dict[str, str]:
        """The command's environment: the image's, then the spec's, then the exec's."""
        if self._image_env is None:
            try:
                self.container.reload()
                pairs = self.container.attrs.get("Config", {}).get("Env") or []
            except Exception as e:  # noqa: BLE001
                raise _map_error(e, "inspect container") from e
            image_env = dict(p.split("=", 1) for p in pairs if "=" in p)
            if self._home and "HOME" not in image_env:
                image_env["HOME"] = self._home  # as docker exec sets it for the user
            self._image_env = {k: v for k, v in image_env.items() if is_env_name(k)}
        return {**self._image_env, **self.spec.env, **(env or {}), MARKER_ENV: self.id}

    def _tool_env(self) -> dict[str, str]:
        return {**_TOOL_ENV, MARKER_ENV: self.id}

    def _lost(self, what: str) -> SandboxLost:
        """Container unreachable mid-call: remove it so nothing leaks, report it lost."""
        self.close()
        return SandboxLost(f"sandbox {self.id}: {what}; the container was removed")

    def exec(self, command: str, timeout: float = 60.0, env: Mapping[str, str] | None = None,
             cwd: str | None = None) -> ExecResult:
        # Everything the engine would receive is checked here first (shared with every
        # backend): NUL, lone surrogates, sizes, env names, timeout and cwd.
        check_exec_args(command, timeout, env, cwd)
        with self._lock:
            self._check_open()
            rel = safe_relpath(cwd) if cwd else "."
            workdir = posixpath.normpath(posixpath.join(self.workdir, rel))
            spare_session = self.session_live
            wrapper = _GROUP_WRAPPER if spare_session else _WRAPPER
            cmd = ["/bin/bash", "-p", "-c", wrapper, f"{timeout:.3f}", "/usr/bin/env", "-i",
                   *(f"{k}={v}" for k, v in self._env(env).items()), "/bin/bash", "-c", command]
            out = OutputCap(self.spec.max_output_bytes)
            err = OutputCap(self.spec.max_output_bytes)
            t0 = time.monotonic()
            stream = _ExecSocket(self.client, self.container_id, cmd, self._tool_env(), workdir,
                                 user=self.user)
            try:
                try:
                    stream.pump(out, err, t0 + timeout + _GRACE_S)
                except TimeoutError:
                    raise self._lost("exec did not end within its timeout plus grace") from None
                code = stream.exit_code()
            except SandboxError:
                raise
            except Exception as e:  # noqa: BLE001
                raise _map_error(e, "exec") from e
            finally:
                stream.close()
            dt = time.monotonic() - t0
            if (code >= 128 or code < 0) and not spare_session:
                # Killed by a signal: perhaps the wrapper itself (the command can kill its
                # grandparent), whose final kill then never ran. (Not while a session
                # lives: that would end it; what is left dies with the session.)
                self._reap()
            if code in (126, 127) and out.total < 4096 and "OCI runtime exec failed" in (
                    out.text() + err.text()):
                msg = (out.text() + err.text()).strip()
                if "chdir to cwd" in msg:
                    raise BadRequest(f"cwd {cwd!r} is not a directory inside the workspace")
                raise InfrastructureError(f"docker could not start the command: {msg}")
            timed_out = code in (124, 137, -1) and dt >= timeout * 0.98
            if timed_out:
                code = -9
            elif code > 128:
                code = -(code - 128)  # killed by a signal (e.g. the OOM killer)
            return ExecResult(stdout=out.text(), stderr=err.text(), exit_code=code,
                              timed_out=timed_out, truncated=out.truncated or err.truncated,
                              duration_s=dt)

    def _reap(self) -> None:
        """Kill every process of the sandbox user (profile "image": every process) but
        pid 1; SandboxLost if impossible."""
        deadline = time.monotonic() + 5.0
        while True:
            out = OutputCap(4096)
            code, msg = self._tool("reap", "kill -9 -1; kill -9 -1; exit 0", [], out,
                                   deadline)
            if code == 0:
                return
            if time.monotonic() > deadline - 0.5:  # e.g. an escaped fork bomb holds every pid
                raise self._lost(f"processes of a command outlived it and could not be "
                                 f"killed ({(out.text() + msg).strip()[-300:]})")
            time.sleep(0.05)

    def _file_script(self, script: str) -> str:
        """A transfer script, first killing the sandbox's processes unless a session lives."""
        return script if self.session_live else _STOP_ALL + script

    # ---------------------------------------------------------------- processes
    def processes(self) -> tuple[ProcessInfo, ...]:
        """The container's processes (`Sandbox.processes`; the module doc, "Processes"):
        pids are the engine host's. Nothing runs in the container for it, and the exec
        lock is not taken: it answers while an exec or the session runs."""
        self._check_open()
        rows = self._top()
        init = self._pid1()
        pids = {r[0] for r in rows}
        if any(self._in_container(pid) for pid in sorted(pids)):
            return procs.list_processes(
                pids, machinery=lambda pid, ppid: self._is_machinery(pid, ppid, pids, init),
                belongs=self._in_container)
        return self._from_top(rows, pids, init)

    def _top(self) -> list[tuple[int, int, str]]:
        """(pid, ppid, command line) of each process of the container, from the engine's
        ``top`` (``ps`` on the engine's host)."""
        try:
            top = self.client.api.top(self.container_id, ps_args="-eo pid,ppid,args")
        except Exception as e:  # noqa: BLE001
            raise _map_error(e, "list processes") from e
        titles = top.get("Titles") or []
        try:
            at = [titles.index(t) for t in ("PID", "PPID")]
            return [(int(r[at[0]]), int(r[at[1]]), str(r[-1]))
                    for r in top.get("Processes") or []]
        except (ValueError, IndexError, TypeError) as e:
            raise InfrastructureError(f"sandbox {self.id}: the engine's top answered "
                                      f"{str(top)[:300]}: {e}") from e

    def _pid1(self) -> int:
        """The container's pid 1 as the engine's host numbers it (``State.Pid``; asked once:
        it never changes while the container runs)."""
        if not self._init_pid:
            try:
                state = self.client.api.inspect_container(self.container_id)["State"]
            except Exception as e:  # noqa: BLE001
                raise _map_error(e, "inspect container") from e
            if not state.get("Running") or not state.get("Pid"):
                raise SandboxLost(f"sandbox {self.id}: its container is not running")
            self._init_pid = int(state["Pid"])
        return self._init_pid

    def _in_container(self, pid: int) -> bool:
        """True if this host's ``/proc/<pid>`` is a process of this container (its cgroup
        path names the container): then the engine runs on this host."""
        try:
            with open(f"/proc/{pid}/cgroup", "rb") as f:
                return self.container_id.encode() in f.read(1 << 16)
        except OSError:
            return False

    def _is_machinery(self, pid: int, ppid: int, pids: set[int], init: int) -> bool:
        """Pid 1 ``init``, its own sleep, or (profile "sandbox") a ``docker exec``'s first
        process: its parent is outside the container."""
        if pid == init or (not self.image_profile and ppid not in pids):
            return True
        return ppid == init and self._is_init_sleep(pid, ppid)

    @staticmethod
    def _is_init_sleep(pid: int, init: int) -> bool:
        """``pid`` is the ``sleep 86400`` of pid 1 ``init`` (`INIT_ARGV`, started anew each
        day): that argv, a ``sleep`` executable, and no open file pid 1 does not hold.
        Whoever started such a process, it holds nothing of the agent's."""
        if procs.read_argv(pid) != (INIT_SLEEP, False):
            return False  # (most children of pid 1 are orphans of the agent's: cheap)
        info, parent = procs.read_process(pid), procs.read_process(init)
        return (info is not None and parent is not None and not info.partial
                and info.argv == INIT_SLEEP and posixpath.basename(info.exe) == "sleep"
                and set(info.files) <= set(parent.files))

    def _from_top(self, rows: list[tuple[int, int, str]], pids: set[int],
                  init: int) -> tuple[ProcessInfo, ...]:
        """The listing from ``top`` alone (an engine on another host): argv is the command
        column split on spaces; no exe, no files (``partial``, source "top")."""
        out: list[ProcessInfo] = []
        for pid, ppid, command in sorted(rows):
            if len(out) >= MAX_PROCESSES:
                break
            argv = tuple(command.encode()[:MAX_ARGV_BYTES].decode(errors="ignore").split())
            if pid == init or (not self.image_profile and ppid not in pids) or (
                    ppid == init and argv == INIT_SLEEP):
                continue
            out.append(ProcessInfo(pid=pid, ppid=ppid, argv=argv, partial=True,
                                   source="top"))
        return tuple(out)

    # ------------------------------------------------------------------ session
    def open_session(self, lifetime_s: float = DEFAULT_SESSION_LIFETIME_S) -> StreamSession:
        """Start the sandbox's terminal session (`terminal_rsi.sandbox.terminal`): tmux in
        the container when its image has it, else ``bash -i`` on a pty (`PtySession`); as
        the sandbox user, with the command's environment, in the workspace. ``lifetime_s``
        bounds each of its processes' CPU time. While it lives, exec spares its processes
        (see the module doc); closing it ends everything of the sandbox but pid 1."""
        check_lifetime(lifetime_s)
        with self._lock:
            self._check_open()
            self._clear_session_slot()
            tmux = self._find_tmux()
            token = "" if tmux else new_token()  # only a pty session's doorbell has one
            extra = {}  # a tmux session's prompt checks read /proc from here where they can
            if tmux and self._in_container(self._pid1()):
                extra["proc_root"] = f"/proc/{self._pid1()}/root"
            env = self._env(None)
            cpu = str(max(1, int(-(-lifetime_s // 1))))
            if tmux:
                argv = tmux_argv(SESSION_SOCKET, tmux, env=shell_env(token))
            else:
                env = {**env, **shell_env(token)}
                argv = ["/bin/bash", "--noprofile", "--norc", "-i"]
            cmd = ["/bin/bash", "-p", "-c", _SESSION_WRAPPER, cpu, "/usr/bin/env", "-i",
                   *(f"{k}={v}" for k, v in env.items()), *argv]
            stream = _ExecSocket(self.client, self.container_id, cmd, self._tool_env(),
                                 self.workdir, stdin=True, tty=not tmux, user=self.user)
            channel = _ExecChannel(stream, multiplexed=bool(tmux))
            kind = TmuxSession if tmux else PtySession
            self.session = kind(channel, token, self.spec.max_output_bytes,
                                on_close=self._end_session, **extra)
            return self.session

    def _find_tmux(self) -> str:
        """The path of tmux in the container ("" when the image has none)."""
        return self._image_fact("tmux", self._look_for_tmux)

    def _look_for_tmux(self) -> str:
        out = OutputCap(4096)
        code, _ = self._tool("find tmux", "command -v tmux", [], out, time.monotonic() + 30)
        path = out.text().strip()
        return path if code == 0 and path.startswith("/") else ""

    def _end_session(self) -> None:
        """After the session's stream is closed: kill every process of the sandbox user
        (pid 1 aside), so nothing the session started survives. No exec lock (an exec in
        flight would hold it for its whole timeout): that exec's processes die too."""
        if not self._closed:  # else the container is being removed
            self._reap()

    def _tool(self, what: str, script: str, args: list[str], out, deadline: float,
              stdin: list[bytes | memoryview] | None = None,
              where: dict[str, str] | None = None, user: str = "") -> tuple[int, str]:
        """Run a machinery script as ``user`` (default ``tool_user``) with the fixed tool
        environment (plus ``where``: the TRSI_* variables of a transfer); (exit code, stderr
        text)."""
        err = OutputCap(64 << 10)
        stream = _ExecSocket(self.client, self.container_id,
                             ["/bin/bash", "-p", "-c", script, "trsi", *args],
                             {**self._tool_env(), **(where or {})}, "/",
                             stdin=stdin is not None, user=user or self.tool_user)
        try:
            stream.pump(out, err, deadline, stdin or ())
            code = stream.exit_code()
        except TimeoutError:
            raise self._lost(f"{what} did not finish in {self.tar_limits.timeout_s:g} s") \
                from None
        except SandboxError:
            raise  # a cap crossed (BadRequest): closing the stream ends the exec's tar
        except Exception as e:  # noqa: BLE001
            raise _map_error(e, what) from e
        finally:
            stream.close()
        return code, err.text().strip()

    def _place(self, path: str) -> tuple[dict[str, str], list[str]]:
        """Where a transfer starts (the TRSI_* tool variables) and ``path``'s components
        from there: the workspace for a relative path; "/" for an absolute one, which only
        profile "image" takes (the whole filesystem is the task's there)."""
        norm = safe_path(path, absolute_ok=self.image_profile)
        if norm.startswith("/"):
            where = {"TRSI_DIR": "/", "TRSI_WHERE": "container", "TRSI_SHOW": "/"}
            return where, [p for p in norm.split("/") if p] or ["."]
        where = {"TRSI_DIR": self.workdir, "TRSI_WHERE": "workspace", "TRSI_SHOW": ""}
        return where, norm.split("/")

    def _check_start(self, what: str, code: int, msg: str, where: dict[str, str]) -> None:
        """A transfer script's exit 5 (its input broke) or 6 (no start directory): in
        profile "image" a command may have removed the workspace (BadRequest); in profile
        "sandbox" it is a mount, so the container is broken (InfrastructureError)."""
        if code == 6 and self.image_profile:
            raise BadRequest(f"{what}: {where['TRSI_DIR']} is not a directory in the container "
                             f"any more (a command removed the workspace?): {msg}")
        if code in (5, 6):
            raise InfrastructureError(f"{what}: the container's workspace is unusable: {msg}")

    def put_tar(self, data: bytes, dest: str = ".") -> None:
        """Extract into workspace directory ``dest``, or (profile "image") the absolute
        directory ``dest``, made with its missing parents; see the module doc."""
        limits = TarLimits(max_members=self.tar_limits.max_members,
                           max_bytes=self.spec.disk_mb << 20,
                           timeout_s=self.tar_limits.timeout_s)
        members = check_tar(data, limits)
        where, parts = self._place(dest)
        dest_parts = [p for p in parts if p != "."]
        listing = b"\0".join(p.encode("utf-8", "surrogateescape")
                             for p in _checked_paths(members))
        stdin = [f"{len(listing)}\n".encode(), listing, *_upload_stream(data, members)]
        with self._lock:
            self._check_open()
            code, msg = self._tool("put_tar", self._file_script(_PUT_SCRIPT), dest_parts,
                                   OutputCap(64 << 10), time.monotonic() + limits.timeout_s,
                                   stdin, where)
        self._check_start("put_tar", code, msg, where)
        if code != 0:
            if "No space left on device" in msg or "Wrote only" in msg:
                msg = f"the sandbox disk (disk_mb={self.spec.disk_mb}) is full: {msg}"
            raise BadRequest(f"extracting the upload into {dest!r} failed: {msg[-2000:]}")

    def get_tar(self, path: str = ".", max_bytes: int = 256 << 20) -> bytes:
        """A tar stream of workspace path ``path``, members named relative to the
        workspace; profile "image" also takes an absolute ``path``, its members then named
        relative to "/" (``/logs/v/r.txt`` -> ``logs/v/r.txt``; ``/`` -> ``.`` and the rest)."""
        where, parts = self._place(path)
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
            raise BadRequest(f"max_bytes must be a positive int, got {max_bytes!r}")
        sink = _TarSink(max_bytes, self.tar_limits.max_members, f"download of {path!r}")
        with self._lock:
            self._check_open()
            code, msg = self._tool("get_tar", self._file_script(_GET_SCRIPT), parts, sink,
                                   time.monotonic() + self.tar_limits.timeout_s, where=where)
        self._check_start("get_tar", code, msg, where)
        if code not in (0, 1):  # 1: a file changed while it was read
            raise BadRequest(f"reading {path!r} from the {where['TRSI_WHERE']} failed: "
                             f"{msg[-2000:]}")
        return sink.value()

    def close(self) -> None:
        # No exec lock: removing the container ends an exec in flight.
        with _close_lock:
            if self._closed:
                return
            self._closed = True
        try:
            if self.session is not None:
                self.session.close()
        except SandboxError as e:
            log.warning("closing the terminal session of sandbox %s: %s", self.id, e)
        finally:
            self.box.destroy()


# ------------------------------------------------------------------------ pool, backend


class WarmPool:
    """Keeps ``size`` started containers for one spec shape; refills in the background."""

    def __init__(self, client, spec: SandboxSpec, size: int):
        self.client, self.spec, self.size = client, spec, size
        self.key = _pool_key(spec)
        self._q: queue.Queue[ContainerBox] = queue.Queue()
        self._stop = threading.Event()
        self._need = threading.Semaphore(size)
        self._thread = threading.Thread(target=self._fill, daemon=True, name="trsi-warm-pool")
        self._thread.start()

    def _fill(self) -> None:
        while not self._stop.is_set():
            if not self._need.acquire(timeout=0.2):
                continue
            if self._stop.is_set():
                break
            try:
                box = _create_box(self.client, self.spec, "warm-" + uuid.uuid4().hex[:12])
            except (SandboxError, OSError) as e:
                log.warning("warm pool: %s", e)
                self._need.release()
                self._stop.wait(1.0)
                continue
            self._q.put(box)

    def take(self, wait_s: float = 0.0) -> ContainerBox | None:
        try:
            box = self._q.get(timeout=wait_s) if wait_s > 0 else self._q.get_nowait()
        except queue.Empty:
            return None
        self._need.release()
        return box

    def ready(self) -> int:
        return self._q.qsize()

    def close(self) -> None:
        self._stop.set()
        self._need.release()
        self._thread.join(timeout=120)
        while True:
            try:
                box = self._q.get_nowait()
            except queue.Empty:
                break
            box.destroy()


class DockerBackend:
    """Opens DockerSandboxes, from a warm pool when the spec's shape matches."""

    def __init__(self, client=None, warm: int = 0, warm_spec: SandboxSpec | None = None):
        self.client = client or docker_client()
        sweep_stale(self.client, once=True)
        self.pool = WarmPool(self.client, warm_spec or SandboxSpec(), warm) if warm > 0 else None

    def open(self, spec: SandboxSpec | None = None) -> DockerSandbox:
        spec = spec or SandboxSpec()
        box = None
        if self.pool is not None and _pool_key(spec) == self.pool.key:
            box = self.pool.take()
        return DockerSandbox(spec, client=self.client, box=box)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
