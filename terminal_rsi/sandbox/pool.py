"""SandboxPool: many sandboxes over several endpoints (local and remote).

    pool = SandboxPool(["http://hostA:8765", "http://hostB:8765", "local"],
                       max_concurrent=16, token_file="~/.trsi_token")
    with pool.open(spec) as sb:       # blocks while 16 sandboxes are open
        r = sb.exec("make test", timeout=60)

- Placement: the healthy endpoint with the fewest open sandboxes (ties in
  the given order) among those that can run the spec: a spec of profile "image" goes
  only to ``docker`` and bridge endpoints (a bridge in front of a local backend answers
  it with BadRequest); with none such, ``open`` is a BadRequest at once.
- Health: an endpoint that fails to create a sandbox with an infrastructure error
  is marked down for ``cooldown_s``; after that a health check (``GET /v1/health``)
  must pass before it gets work again. A call on an open sandbox that fails with an
  infrastructure error marks its endpoint down unless the endpoint still passes its
  health check right then (the failure was that sandbox's, not the host's). A
  ``BadRequest`` (the caller's fault, including every 4xx answer of a server) never
  marks an endpoint down. ``pool.health()`` checks all endpoints now; ``pool.up()``
  says which are up without checking.
- Terminal sessions: ``sb.open_session()`` on a pooled sandbox is its inner sandbox's
  session; its calls count failures against the endpoint as the sandbox's calls do.
- `host_pool(urls)`: one process-wide pool per comma-separated list of bridge URLs (how
  ``open_sandbox`` serves such a backend).
- Retries: only *sandbox creation* is retried, only on infrastructure errors
  (connection refused, 5xx, busy, engine gone), with exponential backoff, up to
  ``retries`` attempts in all, moving to other endpoints. Calls on an open
  sandbox are never retried (their effect is unknown): an InfrastructureError
  or SandboxLost there goes to the caller, who restarts the episode with a new
  sandbox. An endpoint found down is skipped so the next sandbox lands elsewhere.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence

from terminal_rsi.sandbox.backends import open_backend
from terminal_rsi.sandbox.base import (
    DEFAULT_SESSION_LIFETIME_S,
    ExecResult,
    Sandbox,
    SandboxSpec,
    refuse_image_profile,
)
from terminal_rsi.sandbox.errors import (
    BadRequest,
    InfrastructureError,
    SandboxBusy,
    SandboxError,
)
from terminal_rsi.sandbox.remote import BridgeClient, RemoteSandbox
from terminal_rsi.sandbox.terminal import SETTLE_S, SessionOutput, TerminalSession

log = logging.getLogger(__name__)


class Endpoint:
    """A place to open sandboxes: a local backend name or a bridge URL."""

    def __init__(self, target: str, token: str | None = None, token_file: str | None = None,
                 timeout: float = 30.0):
        self.target = target
        self.remote = target.startswith(("http://", "https://"))
        self.client = None
        if self.remote:
            self.client = BridgeClient(target, token=token, token_file=token_file,
                                       timeout=timeout)
        self.active = 0
        self.down_until = 0.0
        self.failures = 0

    def open(self, spec: SandboxSpec) -> Sandbox:
        if self.remote:
            return RemoteSandbox.create(self.client, spec)
        return open_backend(spec, self.target)

    def serves(self, spec: SandboxSpec) -> bool:
        """Whether this endpoint can run ``spec``: profile "image" needs Docker (a bridge
        may have it; a local backend has not)."""
        return ((spec.profile == "sandbox" and not spec.workdir) or self.remote
                or self.target == "docker")

    def check(self) -> bool:
        if not self.remote:
            return True
        try:
            return bool(self.client.health().get("ok"))
        except SandboxError:
            return False

    def close(self) -> None:
        if self.client is not None:
            self.client.close()

    def __repr__(self) -> str:
        return f"Endpoint({self.target!r}, active={self.active})"


class PooledSandbox(Sandbox):
    """A sandbox from a pool: delegates, and gives its slot back on close."""

    def __init__(self, pool: SandboxPool, endpoint: Endpoint, inner: Sandbox):
        self._pool, self.endpoint, self.inner = pool, endpoint, inner
        self.spec, self.id, self.workdir = inner.spec, inner.id, inner.workdir
        self._closed = False

    def _call(self, fn, *args, **kw):
        try:
            return fn(*args, **kw)
        except InfrastructureError:
            self._pool._call_failed(self.endpoint)
            raise

    def exec(self, command: str, timeout: float = 60.0, env: Mapping[str, str] | None = None,
             cwd: str | None = None) -> ExecResult:
        return self._call(self.inner.exec, command, timeout=timeout, env=env, cwd=cwd)

    def put_tar(self, data: bytes, dest: str = ".") -> None:
        return self._call(self.inner.put_tar, data, dest)

    def get_tar(self, path: str = ".", max_bytes: int = 256 << 20) -> bytes:
        return self._call(self.inner.get_tar, path, max_bytes=max_bytes)

    def processes(self):
        return self._call(self.inner.processes)

    def open_session(self, lifetime_s: float = DEFAULT_SESSION_LIFETIME_S) -> PooledSession:
        self.session = PooledSession(self, self._call(self.inner.open_session, lifetime_s))
        return self.session

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.inner.close()
        finally:
            self._pool._release(self)


class PooledSession(TerminalSession):
    """The terminal session of a pooled sandbox: delegates; an infrastructure error of any
    call counts against the sandbox's endpoint as its sandbox's calls do."""

    def __init__(self, sandbox: PooledSandbox, inner: TerminalSession):
        self.sandbox, self.inner = sandbox, inner
        self.max_output_bytes = inner.max_output_bytes

    def send(self, keystrokes: str) -> None:
        self.sandbox._call(self.inner.send, keystrokes)

    def wait(self, timeout: float, prompts: int = 0, settle_s: float = SETTLE_S) -> bool:
        return self.sandbox._call(self.inner.wait, timeout, prompts=prompts, settle_s=settle_s)

    def read(self) -> SessionOutput:
        return self.sandbox._call(self.inner.read)

    def run(self, keystrokes: str, timeout: float) -> SessionOutput:
        return self.sandbox._call(self.inner.run, keystrokes, timeout)

    @property
    def alive(self) -> bool:
        return self.sandbox._call(lambda: self.inner.alive)

    def close(self) -> None:
        self.sandbox._call(self.inner.close)


class SandboxPool:
    """Spreads sandboxes over endpoints with a concurrency limit (see module doc)."""

    def __init__(self, endpoints: Sequence[str], max_concurrent: int = 16, *,
                 token: str | None = None, token_file: str | None = None, retries: int = 4,
                 backoff_s: float = 0.2, max_backoff_s: float = 5.0, cooldown_s: float = 10.0,
                 timeout: float = 30.0):
        if not endpoints:
            raise BadRequest("SandboxPool needs at least one endpoint")
        if max_concurrent < 1 or retries < 1:
            raise BadRequest("max_concurrent and retries must be >= 1")
        self.endpoints = [Endpoint(t, token, token_file, timeout) for t in endpoints]
        self.max_concurrent = max_concurrent
        self.retries, self.backoff_s, self.max_backoff_s = retries, backoff_s, max_backoff_s
        self.cooldown_s = cooldown_s
        self._slots = threading.BoundedSemaphore(max_concurrent)
        self._lock = threading.Lock()
        self._open: set[PooledSandbox] = set()
        self._closed = False

    def _mark_down(self, ep: Endpoint) -> None:
        with self._lock:
            ep.failures += 1
            ep.down_until = time.monotonic() + self.cooldown_s
        log.warning("sandbox endpoint %s marked down for %.0fs", ep.target, self.cooldown_s)

    def _call_failed(self, ep: Endpoint) -> None:
        """A call on an open sandbox of ``ep`` failed with an infrastructure error: mark ``ep``
        down unless it still answers its health check (then only that sandbox is broken)."""
        if ep.remote and ep.check():
            log.warning("a call on a sandbox of %s failed but the endpoint is healthy; "
                        "keeping it up", ep.target)
            return
        self._mark_down(ep)

    def _candidates(self) -> list[Endpoint]:
        now = time.monotonic()
        with self._lock:
            up = [e for e in self.endpoints if e.down_until <= now]
            down = [e for e in self.endpoints if e.down_until > now]
        ranked = sorted(up, key=lambda e: e.active)
        if not ranked:  # everything is down: try the one that comes back first
            ranked = sorted(down, key=lambda e: e.down_until)
        return ranked

    def _release(self, sb: PooledSandbox) -> None:
        with self._lock:
            if sb in self._open:
                self._open.discard(sb)
                sb.endpoint.active -= 1
                self._slots.release()

    def open(self, spec: SandboxSpec | None = None, timeout: float | None = None) -> Sandbox:
        """Open a sandbox on the best endpoint; blocks for a free slot (up to ``timeout``)."""
        spec = spec or SandboxSpec()
        if self._closed:
            raise InfrastructureError("the pool is closed")
        if not any(ep.serves(spec) for ep in self.endpoints):
            refuse_image_profile(spec, ",".join(ep.target for ep in self.endpoints))
        if not self._slots.acquire(timeout=timeout):
            raise SandboxBusy(f"no free slot among {self.max_concurrent} within {timeout}s")
        last: Exception | None = None
        try:
            for attempt in range(self.retries):
                if attempt:
                    time.sleep(min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1)))
                for ep in self._candidates():
                    if not ep.serves(spec):
                        continue
                    if ep.down_until > 0 and ep.down_until <= time.monotonic() and ep.remote:
                        if not ep.check():  # came back from cooldown: must pass health
                            self._mark_down(ep)
                            continue
                        ep.down_until = 0.0
                    try:
                        inner = ep.open(spec)
                    except SandboxBusy as e:
                        last = e
                        continue  # full, not broken: try the next endpoint
                    except InfrastructureError as e:
                        last = e
                        self._mark_down(ep)
                        continue
                    sb = PooledSandbox(self, ep, inner)
                    with self._lock:
                        ep.active += 1
                        self._open.add(sb)
                    return sb
        except BaseException:
            self._slots.release()
            raise
        self._slots.release()
        raise InfrastructureError(f"no endpoint could open a sandbox after {self.retries} "
                                  f"attempts; last error: {last}")

    def health(self) -> dict[str, bool]:
        """Check every endpoint now; mark failing ones down, passing ones up."""
        out = {}
        for ep in self.endpoints:
            ok = ep.check()
            out[ep.target] = ok
            if ok:
                ep.down_until = 0.0
            else:
                self._mark_down(ep)
        return out

    def up(self) -> dict[str, bool]:
        """Which endpoints are up now (not in a cooldown), without checking them."""
        now = time.monotonic()
        with self._lock:
            return {ep.target: ep.down_until <= now for ep in self.endpoints}

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {ep.target: ep.active for ep in self.endpoints}

    def close(self) -> None:
        """Close every sandbox still open, then the endpoint clients."""
        self._closed = True
        with self._lock:
            live = list(self._open)
        for sb in live:
            try:
                sb.close()
            except SandboxError as e:
                log.warning("closing %s: %s", sb.id, e)
        for ep in self.endpoints:
            ep.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


_POOLS: dict = {}
_POOLS_LOCK = threading.Lock()


def host_pool(backend: str, token: str | None = None, token_file: str | None = None,
              timeout: float = 30.0) -> SandboxPool:
    """The process-wide `SandboxPool` for a comma-separated list of bridge URLs.

    The token comes from `token` / `token_file`, else env TERMINAL_RSI_SANDBOX_TOKEN(_FILE)
    (see `remote.load_token`); the concurrency limit from env
    TERMINAL_RSI_SANDBOX_MAX_CONCURRENT (default 256; the rollout scheduler limits it too).
    """
    urls = tuple(u.strip() for u in backend.split(",") if u.strip())
    bad = [u for u in urls if not u.startswith(("http://", "https://"))]
    if bad or not urls:
        raise BadRequest(f"sandbox backend {backend!r}: a list of hosts must be http(s):// "
                         f"bridge URLs separated by commas; not URLs: {bad}")
    key = (urls, token, token_file, timeout)
    with _POOLS_LOCK:
        if key not in _POOLS:
            limit = int(os.environ.get("TERMINAL_RSI_SANDBOX_MAX_CONCURRENT", "256"))
            _POOLS[key] = SandboxPool(list(urls), max_concurrent=limit, token=token,
                                      token_file=token_file, timeout=timeout)
        return _POOLS[key]
