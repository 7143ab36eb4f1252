"""Docker sandboxes (Docker SDK for Python) and a warm pool of started containers.

Each sandbox is one container started from a locally built image
(``python -m terminal_rsi.sandbox.image build``) with: network ``none``
(``network=True`` uses the host network; the daemon here runs without a
bridge), memory = memory+swap cap, CPU quota, PID limit, all capabilities
dropped, ``no-new-privileges``, user 1000:1000, a read-only root filesystem,
and two size-limited tmpfs mounts: ``/workspace`` and ``/tmp``.

Commands run through ``docker exec`` as

    timeout -s KILL T bash -c CMD; rc=$?; kill -9 -1; kill -9 -1; exit $rc

The kill is a bash builtin run as the sandbox user: it signals every process
of that user in the container except pid 1 (``sleep infinity``), so double-forked
and ``setsid`` children die with the command and no new process is needed even
when a fork bomb holds every PID. Output is read from the raw exec socket
into head+tail caps. Files move through ``tar`` inside the container (stdin /
stdout of an exec), so they land on the tmpfs and belong to the sandbox user.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import struct
import threading
import time
import uuid
from collections.abc import Mapping

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
from terminal_rsi.sandbox.errors import (
    BadRequest,
    InfrastructureError,
    SandboxError,
    SandboxLost,
)

log = logging.getLogger(__name__)

LABEL = "terminal_rsi.sandbox"
WORKDIR = "/workspace"
USER = "1000:1000"
_WRAPPER = ('exec 3>&2 2>/dev/null; timeout -s KILL "$0" "$@" 2>&3 3>&-; rc=$?; '
            'kill -9 -1; kill -9 -1; exit $rc')
_GRACE_S = 15.0
_close_lock = threading.Lock()


def docker_client(timeout: int = 120):
    """A Docker SDK client; InfrastructureError if the engine is unreachable."""
    import docker

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
    import docker
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
            spec.open_files)


def _create_container(client, spec: SandboxSpec, sid: str):
    from docker.types import Ulimit

    mnt = "rw,exec,nosuid,nodev"
    try:
        return client.containers.run(
            spec.image, ["sleep", "infinity"], detach=True, name=f"trsi-{sid}",
            hostname="sandbox", user=USER, working_dir=WORKDIR,
            network_mode="host" if spec.network else "none",
            mem_limit=f"{spec.memory_mb}m", memswap_limit=f"{spec.memory_mb}m",
            pids_limit=spec.pids, nano_cpus=int(spec.cpus * 1e9),
            cap_drop=["ALL"], security_opt=["no-new-privileges"], read_only=True,
            tmpfs={WORKDIR: f"{mnt},size={spec.disk_mb}m,uid=1000,gid=1000,mode=0755",
                   "/tmp": f"{mnt},size={spec.disk_mb}m,mode=1777"},
            ulimits=[Ulimit(name="nofile", soft=spec.open_files, hard=spec.open_files),
                     Ulimit(name="core", soft=0, hard=0)],
            labels={LABEL: sid, LABEL + ".pid": str(os.getpid())},
            stop_signal="SIGKILL", init=False)
    except Exception as e:  # noqa: BLE001
        import docker

        if isinstance(e, docker.errors.ImageNotFound):
            raise BadRequest(
                f"image {spec.image!r} not found; build it with "
                "`python -m terminal_rsi.sandbox.image build`") from e
        raise _map_error(e, "create container") from e


class _ExecSocket:
    """A raw, multiplexed docker exec stream with deadlines."""

    def __init__(self, client, container_id: str, cmd: list[str], env: dict[str, str],
                 workdir: str, stdin: bool = False):
        api = client.api
        try:
            self.exec_id = api.exec_create(container_id, cmd, stdin=stdin, stdout=True,
                                           stderr=True, tty=False, environment=env,
                                           workdir=workdir, user=USER)["Id"]
            sock = api.exec_start(self.exec_id, socket=True)
        except Exception as e:  # noqa: BLE001
            raise _map_error(e, "exec") from e
        self.api = api
        self._keep = sock
        self.sock: socket.socket = getattr(sock, "_sock", sock)
        self.buf = b""

    def send_all(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
            self.sock.shutdown(socket.SHUT_WR)
        except OSError as e:
            raise InfrastructureError(f"writing to the exec stream failed: {e}") from e

    def _recv(self, deadline: float) -> bytes:
        wait = deadline - time.monotonic()
        if wait <= 0:
            raise TimeoutError
        self.sock.settimeout(wait)
        try:
            return self.sock.recv(1 << 16)
        except TimeoutError:
            raise
        except OSError as e:
            raise InfrastructureError(f"reading the exec stream failed: {e}") from e

    def pump(self, out, err, deadline: float) -> None:
        """Demultiplex frames into out/err (objects with .feed) until EOF or deadline."""
        while True:
            while len(self.buf) >= 8:
                kind, size = struct.unpack(">BxxxL", self.buf[:8])
                if len(self.buf) < 8 + size:
                    break
                payload = self.buf[8:8 + size]
                self.buf = self.buf[8 + size:]
                (err if kind == 2 else out).feed(payload)
            if len(self.buf) > 8:  # feed partial payloads early to bound memory
                kind, size = struct.unpack(">BxxxL", self.buf[:8])
                part = self.buf[8:]
                (err if kind == 2 else out).feed(part)
                self.buf = struct.pack(">BxxxL", kind, size - len(part))
            data = self._recv(deadline)
            if not data:
                return
            self.buf += data

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


class _Bytes:
    def __init__(self, limit: int):
        self.parts: list[bytes] = []
        self.n = 0
        self.limit = limit

    def feed(self, data: bytes) -> None:
        self.n += len(data)
        if self.n > self.limit:
            raise BadRequest(f"download larger than max_bytes={self.limit}")
        self.parts.append(data)


class DockerSandbox(Sandbox):
    """One container. Create through :class:`DockerBackend` (warm pool) or directly."""

    def __init__(self, spec: SandboxSpec | None = None, client=None, _container=None):
        self.spec = spec or SandboxSpec()
        self.client = client or docker_client()
        self.id = uuid.uuid4().hex[:16]
        self.workdir = WORKDIR
        self._lock = threading.RLock()
        self._closed = False
        self.container = _container or _create_container(self.client, self.spec, self.id)
        self.container_id = self.container.id
        try:
            if self.spec.files:
                self.put_files(self.spec.files)
        except BaseException:
            self.close()
            raise

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxLost(f"sandbox {self.id} is closed")

    def _env(self, env: Mapping[str, str] | None) -> dict[str, str]:
        out = dict(self.spec.env)
        out.update(env or {})
        out[MARKER_ENV] = self.id
        for k, v in out.items():
            if not isinstance(k, str) or not isinstance(v, str) or "\0" in k + v or "=" in k:
                raise BadRequest(f"bad environment entry {k!r}={v!r}")
        return out

    def _lost(self, what: str) -> SandboxLost:
        """Container unreachable mid-call: remove it so nothing leaks, report it lost."""
        self.close()
        return SandboxLost(f"sandbox {self.id}: {what}; the container was removed")

    def exec(self, command: str, timeout: float = 60.0, env: Mapping[str, str] | None = None,
             cwd: str | None = None) -> ExecResult:
        check_exec_args(command, timeout)
        with self._lock:
            self._check_open()
            rel = safe_relpath(cwd) if cwd else "."
            workdir = os.path.normpath(os.path.join(WORKDIR, rel))
            cmd = ["/bin/bash", "-c", _WRAPPER, f"{timeout:.3f}", "/bin/bash", "-c", command]
            out = OutputCap(self.spec.max_output_bytes)
            err = OutputCap(self.spec.max_output_bytes)
            t0 = time.monotonic()
            stream = _ExecSocket(self.client, self.container_id, cmd, self._env(env), workdir)
            try:
                try:
                    stream.pump(out, err, t0 + timeout + _GRACE_S)
                except TimeoutError:
                    raise self._lost("exec did not end within its timeout plus grace") from None
                code = stream.exit_code()
            except InfrastructureError:
                raise
            except SandboxError:
                raise
            except Exception as e:  # noqa: BLE001
                raise _map_error(e, "exec") from e
            finally:
                stream.close()
            dt = time.monotonic() - t0
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

    def put_tar(self, data: bytes, dest: str = ".") -> None:
        check_tar(data)
        rel = safe_relpath(dest)
        with self._lock:
            self._check_open()
            target = os.path.normpath(os.path.join(WORKDIR, rel))
            # -h is not given: tar never follows an existing symlink when writing members,
            # and --no-overwrite-dir keeps directory modes; all runs as the sandbox user.
            cmd = ["/bin/bash", "-c",
                   'mkdir -p -- "$1" && cd -P -- "$1" && case "$PWD/" in /workspace/*) ;; '
                   '*) echo "dest leaves the workspace" >&2; exit 3;; esac && '
                   'exec tar -x --no-same-owner --no-overwrite-dir -f -', "trsi", target]
            stream = _ExecSocket(self.client, self.container_id, cmd, self._env(None), WORKDIR,
                                 stdin=True)
            out, errb = _Bytes(1 << 20), _Bytes(1 << 20)
            try:
                stream.send_all(data)
                stream.pump(out, errb, time.monotonic() + 120)
                code = stream.exit_code()
            except TimeoutError:
                raise self._lost("put_tar did not finish in 120 s") from None
            except SandboxError:
                raise
            except Exception as e:  # noqa: BLE001
                raise _map_error(e, "put_tar") from e
            finally:
                stream.close()
            if code != 0:
                msg = b"".join(errb.parts).decode(errors="replace")[-2000:]
                raise BadRequest(f"extracting upload into {dest!r} failed ({code}): {msg}")

    def get_tar(self, path: str = ".", max_bytes: int = 256 << 20) -> bytes:
        rel = safe_relpath(path)
        with self._lock:
            self._check_open()
            cmd = ["/bin/bash", "-c",
                   'cd /workspace && r=$(realpath -m -- "$1") && case "$r/" in /workspace/*) ;; '
                   '*) echo "path leaves the workspace" >&2; exit 3;; esac && '
                   '[ -e "$1" -o -L "$1" ] || { echo "no such path" >&2; exit 4; } && '
                   'exec tar -c --numeric-owner -f - -- "$1"', "trsi", rel]
            stream = _ExecSocket(self.client, self.container_id, cmd, self._env(None), WORKDIR)
            out, errb = _Bytes(max_bytes), _Bytes(1 << 20)
            try:
                stream.pump(out, errb, time.monotonic() + 120)
                code = stream.exit_code()
            except TimeoutError:
                raise self._lost("get_tar did not finish in 120 s") from None
            except SandboxError:
                raise
            except Exception as e:  # noqa: BLE001
                raise _map_error(e, "get_tar") from e
            finally:
                stream.close()
            if code != 0:
                msg = b"".join(errb.parts).decode(errors="replace")[-2000:]
                raise BadRequest(f"reading {path!r} from the workspace failed: {msg.strip()}")
            return b"".join(out.parts)

    def close(self) -> None:
        # No exec lock: removing the container ends an exec in flight.
        with _close_lock:
            if self._closed:
                return
            self._closed = True
        try:
            self.container.remove(force=True, v=True)
        except Exception as e:  # noqa: BLE001
            import docker

            if not isinstance(e, docker.errors.NotFound):
                log.warning("removing container %s failed: %s", self.container_id[:12], e)


class WarmPool:
    """Keeps ``size`` started containers for one spec shape; refills in the background."""

    def __init__(self, client, spec: SandboxSpec, size: int):
        self.client, self.spec, self.size = client, spec, size
        self.key = _pool_key(spec)
        self._q: queue.Queue = queue.Queue()
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
                c = _create_container(self.client, self.spec, "warm-" + uuid.uuid4().hex[:12])
            except SandboxError as e:
                log.warning("warm pool: %s", e)
                self._need.release()
                self._stop.wait(1.0)
                continue
            self._q.put(c)

    def take(self, wait_s: float = 0.0):
        try:
            c = self._q.get(timeout=wait_s) if wait_s > 0 else self._q.get_nowait()
        except queue.Empty:
            return None
        self._need.release()
        return c

    def ready(self) -> int:
        return self._q.qsize()

    def close(self) -> None:
        self._stop.set()
        self._need.release()
        self._thread.join(timeout=120)
        while True:
            try:
                c = self._q.get_nowait()
            except queue.Empty:
                break
            try:
                c.remove(force=True, v=True)
            except Exception:  # noqa: BLE001
                pass


class DockerBackend:
    """Opens DockerSandboxes, from a warm pool when the spec's shape matches."""

    def __init__(self, client=None, warm: int = 0, warm_spec: SandboxSpec | None = None):
        self.client = client or docker_client()
        self.pool = WarmPool(self.client, warm_spec or SandboxSpec(), warm) if warm > 0 else None

    def open(self, spec: SandboxSpec | None = None) -> DockerSandbox:
        spec = spec or SandboxSpec()
        c = None
        if self.pool is not None and _pool_key(spec) == self.pool.key:
            c = self.pool.take()
        return DockerSandbox(spec, client=self.client, _container=c)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()


def remove_containers(client=None, pid: int | None = None) -> int:
    """Remove every sandbox container (of process ``pid`` if given). Returns the count."""
    client = client or docker_client()
    filt = {"label": [f"{LABEL}.pid={pid}"] if pid is not None else [LABEL]}
    n = 0
    for c in client.containers.list(all=True, filters=filt):
        try:
            c.remove(force=True, v=True)
            n += 1
        except Exception:  # noqa: BLE001
            pass
    return n
