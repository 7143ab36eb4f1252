"""RemoteSandbox: the Sandbox protocol over HTTP against ``terminal_rsi.sandbox.serve``.

Each call is one request (the server's module doc has the table): ``exec`` -> ``POST
/v1/sandboxes/{id}/exec``, ``put_tar`` / ``get_tar`` -> ``PUT`` / ``GET .../files``,
``close`` -> ``DELETE /v1/sandboxes/{id}``, ``processes`` -> ``GET .../processes`` (the
server's host reads them; pids are that host's). ``open_session`` -> ``POST .../session``
gives a :class:`RemoteSession` whose ``send`` / ``wait`` / ``read`` / ``run`` are ``POST
.../session/send|wait|read|run``, ``alive`` is ``GET .../session`` and ``close`` is
``DELETE .../session``; a wait or run has ``timeout + SESSION_MARGIN_S`` of HTTP time.

Errors map to types and are never retried here (the pool retries sandbox
creation on infrastructure errors only):

- connection refused/reset, protocol errors, read timeouts, HTTP 5xx -> InfrastructureError
- 503 busy -> SandboxBusy (an InfrastructureError, retryable)
- 410 -> SandboxLost; 400/413/401 and any other 4xx -> BadRequest (a 4xx is never an
  infrastructure error, so a bad request never marks a host down)
- an answer that is not what the protocol says (not JSON, fields missing) -> InfrastructureError

Token files (``load_token``, and the server's ``read_tokens``) must be regular files that only
their owner may read (``chmod 600``): :func:`read_secret_file`.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import stat
import uuid
from collections.abc import Mapping

from terminal_rsi.sandbox.base import (
    DEFAULT_SESSION_LIFETIME_S,
    MAX_PROCESSES,
    ExecResult,
    ProcessInfo,
    Sandbox,
    SandboxSpec,
    check_exec_args,
    check_lifetime,
    is_normal_abspath,
    safe_abspath,
    safe_relpath,
)
from terminal_rsi.sandbox.errors import (
    ERROR_TYPES,
    BadRequest,
    InfrastructureError,
    SandboxBusy,
    SandboxError,
    SandboxLost,
)
from terminal_rsi.sandbox.terminal import (
    SETTLE_S,
    SessionOutput,
    TerminalSession,
    check_keystrokes,
    check_wait,
)

log = logging.getLogger(__name__)


TOKEN_ENV = "TERMINAL_RSI_SANDBOX_TOKEN"
TOKEN_FILE_ENV = "TERMINAL_RSI_SANDBOX_TOKEN_FILE"
SANDBOX_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")  # what a bridge hands out (hex ids)
SESSION_MARGIN_S = 30.0  # HTTP timeout of a session wait or run beyond its own timeout


def read_secret_file(path: str, what: str = "token file", max_bytes: int = 1 << 20) -> str:
    """The text of a secret file that only its owner may read, or BadRequest saying why not.

    Refused: a symlink (opened with ``O_NOFOLLOW``), anything but a regular file, a mode that
    grants group or other any access (``st_mode & 0o077``), more than ``max_bytes``, not UTF-8.
    """
    path = os.path.expanduser(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise BadRequest(f"{what} {path} is a symbolic link; name the file itself") from None
        raise BadRequest(f"cannot open {what} {path}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BadRequest(f"{what} {path} is not a regular file")
        if st.st_mode & 0o077:
            raise BadRequest(f"{what} {path} is accessible to group or other (mode "
                             f"{stat.S_IMODE(st.st_mode):04o}); it holds a secret: run "
                             f"`chmod 600 {path}`")
        if st.st_size > max_bytes:
            raise BadRequest(f"{what} {path} is {st.st_size} bytes; the limit is {max_bytes}")
        data = b""
        while len(data) <= max_bytes and (chunk := os.read(fd, 1 << 16)):
            data += chunk
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise BadRequest(f"{what} {path} holds more than {max_bytes} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest(f"{what} {path} is not UTF-8 text") from None


def load_token(token: str | None = None, token_file: str | None = None) -> str:
    """The bearer token: `token`, else the last field of the first line of `token_file`, else
    env TERMINAL_RSI_SANDBOX_TOKEN, else the file named by TERMINAL_RSI_SANDBOX_TOKEN_FILE (how
    launched trainers that only name hosts in `tasks.backend` get theirs). A token file must be
    a regular file of mode 600 (see `read_secret_file`)."""
    if token:
        return token
    if not token_file and os.environ.get(TOKEN_ENV):
        return os.environ[TOKEN_ENV]
    token_file = token_file or os.environ.get(TOKEN_FILE_ENV)
    if token_file:
        for line in read_secret_file(token_file).splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                return line.rpartition(":")[2]
        raise BadRequest(f"token file {token_file} holds no token")
    raise BadRequest("a bridge token is needed: pass token= or token_file=, or set "
                     f"{TOKEN_ENV} or {TOKEN_FILE_ENV}")


def _answer(r, what: str, fields: tuple[str, ...] = ()) -> dict:
    """The JSON object of a bridge answer; InfrastructureError if it is not what was promised."""
    try:
        data = r.json()
    except ValueError:
        data = None
    if not isinstance(data, dict) or any(f not in data for f in fields):
        raise InfrastructureError(f"bridge {what}: the answer is not the protocol's JSON "
                                  f"(status {r.status_code}): {r.text[:200]!r}")
    return data


class BridgeClient:
    """One HTTP connection pool to one bridge server, with typed errors."""

    def __init__(self, url: str, token: str | None = None, token_file: str | None = None,
                 timeout: float = 30.0, client_id: str | None = None):
        import httpx  # the HTTP client: an optional engine, loaded when a bridge is used

        self.url = url.rstrip("/")
        self.timeout = timeout
        self.client_id = client_id or uuid.uuid4().hex
        self._http = httpx.Client(
            base_url=self.url, timeout=httpx.Timeout(timeout),
            headers={"Authorization": f"Bearer {load_token(token, token_file)}",
                     "X-Trsi-Client": self.client_id},
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=64))

    def request(self, method: str, path: str, *, timeout: float | None = None, **kw):
        import httpx  # the HTTP client: an optional engine, loaded when a bridge is used

        try:
            r = self._http.request(method, path, timeout=timeout or self.timeout, **kw)
        except httpx.TimeoutException as e:
            raise InfrastructureError(f"{method} {self.url}{path}: no answer in time ({e!r})") \
                from e
        except httpx.TransportError as e:
            raise InfrastructureError(f"{method} {self.url}{path}: {type(e).__name__}: {e}") from e
        if r.status_code < 400:
            return r
        try:
            err = r.json()["error"]
            kind, msg = str(err["kind"]), str(err["message"])
        except Exception:  # noqa: BLE001
            kind, msg = "", r.text[:500]
        if r.status_code == 401:
            raise BadRequest(f"bridge {self.url} rejected the token: {msg}")
        if r.status_code == 503 or kind == "busy":
            raise SandboxBusy(f"bridge {self.url}: {msg}")
        if r.status_code >= 500:
            raise InfrastructureError(f"bridge {self.url} answered {r.status_code}: {msg}")
        if r.status_code == 410:
            raise SandboxLost(f"bridge {self.url}: {msg}")
        # Any other 4xx is the caller's: never an infrastructure error, whatever its kind says.
        cls = ERROR_TYPES.get(kind, BadRequest)
        if issubclass(cls, InfrastructureError | SandboxLost) or cls is SandboxError:
            cls = BadRequest
        raise cls(f"bridge {self.url} answered {r.status_code}: {msg}")

    def health(self, timeout: float = 5.0) -> dict:
        return _answer(self.request("GET", "/v1/health", timeout=timeout), f"{self.url} health")

    def metrics(self) -> dict:
        return _answer(self.request("GET", "/v1/metrics"), f"{self.url} metrics")

    def close(self) -> None:
        self._http.close()


class RemoteSandbox(Sandbox):
    """A sandbox living on a bridge server."""

    def __init__(self, client: BridgeClient, sid: str, spec: SandboxSpec, own_client: bool,
                 workdir: str = "/workspace"):
        self.client, self.id, self.spec = client, sid, spec
        self.workdir = workdir  # the server's answer (profile "image": the image's WORKDIR)
        self._own_client = own_client
        self._closed = False

    @classmethod
    def create(cls, url_or_client: str | BridgeClient, spec: SandboxSpec | None = None,
               **client_kw) -> RemoteSandbox:
        spec = spec or SandboxSpec()
        own = not isinstance(url_or_client, BridgeClient)
        client = BridgeClient(url_or_client, **client_kw) if own else url_or_client
        try:
            r = client.request("POST", "/v1/sandboxes", json={"spec": spec.to_json()},
                               timeout=max(client.timeout, 120.0))
            data = _answer(r, f"{client.url} create", ("id",))
            sid = data["id"]
            if not (isinstance(sid, str) and SANDBOX_ID.fullmatch(sid)):
                raise InfrastructureError(f"bridge {client.url} create: the id {sid!r} is not "
                                          "a sandbox id")
        except BaseException:
            if own:
                client.close()
            raise
        workdir = data.get("workdir")  # absent from servers older than profile "image"
        if not (isinstance(workdir, str) and is_normal_abspath(workdir)):
            workdir = "/workspace"
        return cls(client, sid, spec, own, workdir)

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxLost(f"sandbox {self.id} is closed")

    def exec(self, command: str, timeout: float = 60.0, env: Mapping[str, str] | None = None,
             cwd: str | None = None) -> ExecResult:
        check_exec_args(command, timeout, env, cwd)  # the server checks again, with its maxima
        self._check_open()
        body = {"command": command, "timeout": timeout, "env": dict(env) if env else None,
                "cwd": cwd}
        r = self.client.request("POST", f"/v1/sandboxes/{self.id}/exec", json=body,
                                timeout=timeout + 60.0)
        data = _answer(r, f"{self.client.url} exec")
        try:
            return ExecResult.from_json(data)
        except (KeyError, TypeError) as e:
            raise InfrastructureError(f"bridge {self.client.url} exec: the answer is not an "
                                      f"ExecResult ({e!r})") from e

    def _path(self, path: str) -> str:
        """A transfer path as the server takes it: workspace-relative, or absolute for
        profile "image" (the server checks again)."""
        if self.spec.profile == "image" and isinstance(path, str) and path.startswith("/"):
            return safe_abspath(path)
        return safe_relpath(path)

    def put_tar(self, data: bytes, dest: str = ".") -> None:
        self._check_open()
        self.client.request("PUT", f"/v1/sandboxes/{self.id}/files",
                            params={"dest": self._path(dest)}, content=data,
                            headers={"Content-Type": "application/x-tar"},
                            timeout=max(self.client.timeout, 120.0))

    def get_tar(self, path: str = ".", max_bytes: int = 256 << 20) -> bytes:
        self._check_open()
        r = self.client.request("GET", f"/v1/sandboxes/{self.id}/files",
                                params={"path": self._path(path), "max_bytes": max_bytes},
                                timeout=max(self.client.timeout, 120.0))
        return r.content

    def processes(self) -> tuple[ProcessInfo, ...]:
        """`Sandbox.processes` of the sandbox on the bridge, read by the server from its
        host (pids are that host's); InfrastructureError if the answer is not a listing."""
        self._check_open()
        r = self.client.request("GET", f"/v1/sandboxes/{self.id}/processes")
        found = _answer(r, f"{self.client.url} processes", ("processes",))["processes"]
        try:
            if not isinstance(found, list) or len(found) > MAX_PROCESSES:
                raise TypeError(f"not a list of at most {MAX_PROCESSES} processes")
            return tuple(ProcessInfo.from_json(p) for p in found)
        except (KeyError, TypeError) as e:
            raise InfrastructureError(f"bridge {self.client.url} processes: the answer is "
                                      f"not a process listing ({e!r:.300})") from e

    def open_session(self, lifetime_s: float = DEFAULT_SESSION_LIFETIME_S) -> RemoteSession:
        """Open the sandbox's terminal session on the bridge (see `Sandbox.open_session`);
        the server refuses a ``lifetime_s`` above its ``--max-timeout-s``."""
        check_lifetime(lifetime_s)
        self._check_open()
        self.client.request("POST", f"/v1/sandboxes/{self.id}/session",
                            json={"lifetime_s": lifetime_s},
                            timeout=max(self.client.timeout, 120.0))
        self.session = RemoteSession(self)
        return self.session

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.client.request("DELETE", f"/v1/sandboxes/{self.id}")
        except (InfrastructureError, SandboxLost) as e:
            # The server is gone or already dropped it; its shutdown/TTL reaper cleans up.
            log.warning("closing remote sandbox %s: %s", self.id, e)
        finally:
            if self._own_client:
                self.client.close()


class RemoteSession(TerminalSession):
    """The terminal session of a `RemoteSandbox`: each operation is one bridge request
    (``/v1/sandboxes/{id}/session/...``), with the errors of `BridgeClient.request`. A wait
    or run gets ``timeout + SESSION_MARGIN_S`` seconds of HTTP time. Once it or its sandbox
    is closed, every operation raises SandboxLost."""

    def __init__(self, sandbox: RemoteSandbox):
        self.sandbox = sandbox
        self.max_output_bytes = sandbox.spec.max_output_bytes
        self._path = f"/v1/sandboxes/{sandbox.id}/session"
        self._closed = False

    def _post(self, op: str, body: dict, timeout: float | None = None) -> dict:
        if self._closed or self.sandbox.closed:
            raise SandboxLost(f"the terminal session of sandbox {self.sandbox.id} is closed")
        client = self.sandbox.client
        r = client.request("POST", f"{self._path}/{op}", json=body,
                           timeout=timeout or client.timeout)
        return _answer(r, f"{client.url} session {op}")

    def _output(self, data: dict, op: str) -> SessionOutput:
        try:
            return SessionOutput.from_json(data)
        except (KeyError, TypeError) as e:
            raise InfrastructureError(f"bridge {self.sandbox.client.url} session {op}: the "
                                      f"answer is not a SessionOutput ({e!r})") from e

    def send(self, keystrokes: str) -> None:
        self._post("send", {"keystrokes": check_keystrokes(keystrokes)})

    def wait(self, timeout: float, prompts: int = 0, settle_s: float = SETTLE_S) -> bool:
        timeout = check_wait(timeout)
        check_wait(settle_s, "settle_s")
        if isinstance(prompts, bool) or not (isinstance(prompts, int) and prompts >= 0):
            raise BadRequest(f"prompts must be an int >= 0, got {prompts!r}")
        data = self._post("wait", {"timeout": timeout, "prompts": prompts, "settle_s": settle_s},
                          timeout + SESSION_MARGIN_S)
        if not isinstance(data.get("done"), bool):
            raise InfrastructureError(f"bridge {self.sandbox.client.url} session wait: the "
                                      f"answer has no boolean done: {data!r:.200}")
        return data["done"]

    def read(self) -> SessionOutput:
        return self._output(self._post("read", {}), "read")

    def run(self, keystrokes: str, timeout: float) -> SessionOutput:
        body = {"keystrokes": check_keystrokes(keystrokes), "timeout": check_wait(timeout)}
        return self._output(self._post("run", body, body["timeout"] + SESSION_MARGIN_S), "run")

    @property
    def alive(self) -> bool:
        if self._closed or self.sandbox.closed:
            return False
        client = self.sandbox.client
        try:
            data = _answer(client.request("GET", self._path), f"{client.url} session")
        except SandboxLost:
            return False
        return data.get("alive") is True

    def close(self) -> None:
        if self._closed or self.sandbox.closed:
            self._closed = True
            return
        self._closed = True
        try:
            self.sandbox.client.request("DELETE", self._path,
                                        timeout=max(self.sandbox.client.timeout, 60.0))
        except (InfrastructureError, SandboxLost) as e:
            # The server is gone or dropped the sandbox; closing the sandbox ends it anyway.
            log.warning("closing the terminal session of remote sandbox %s: %s",
                        self.sandbox.id, e)
