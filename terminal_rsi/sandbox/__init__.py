"""Sandboxes for terminal agents: one protocol, local / Docker / remote backends.

    from terminal_rsi.sandbox import SandboxSpec, open_sandbox

    with open_sandbox(SandboxSpec(files={"main.py": b"print(1)"}), backend="local") as sb:
        r = sb.exec("python3 main.py", timeout=10)
        assert r.exit_code == 0 and not r.timed_out

Backends: ``local`` (bubblewrap; plain subprocesses only with ``allow_plain=True``,
with one warning line saying what plain mode does not isolate), ``local-bwrap``,
``local-plain`` (the weaker mode, chosen by name), ``docker``, or an ``http(s)://``
URL of a bridge server (``python -m terminal_rsi.sandbox.serve``). Many
sandboxes over many endpoints: :class:`terminal_rsi.sandbox.pool.SandboxPool`, or a
comma-separated list of bridge URLs as the backend (one process-wide pool per list; this is
how a trainer config lists its sandbox hosts: ``tasks.backend = "http://a:8765,http://b:8765"``).
Isolation levels and failure types: docs/sandbox.md. Heavy engines (Docker
SDK, HTTP client/server) are imported only when their backend is used.
"""

from __future__ import annotations

import threading

from terminal_rsi.sandbox.base import ExecResult, OutputCap, Sandbox, SandboxSpec
from terminal_rsi.sandbox.errors import (
    BadRequest,
    CommandTimeout,
    InfrastructureError,
    SandboxBusy,
    SandboxError,
    SandboxLost,
)

BACKENDS = ("local", "local-bwrap", "local-plain", "docker")
# When a task may run in plain (unisolated) local mode, by whose files it is made:
# "never"; "builtin": the procedurally generated built-in tasks only; "always": any task,
# including Terminal-Bench and Harbor directories from disk (untrusted input).
PLAIN_POLICIES = ("never", "builtin", "always")


def open_sandbox(spec: SandboxSpec | None = None, backend: str = "local", *,
                 allow_plain: bool = False, **kwargs) -> Sandbox:
    """Start a sandbox on ``backend`` (a name from BACKENDS or a bridge URL).

    kwargs go to the backend: ``base_dir`` and ``allow_plain`` (local: let ``local`` fall back
    to plain subprocesses when bubblewrap is unusable), ``client`` (docker), ``token`` /
    ``token_file`` / ``timeout`` (remote).
    """
    spec = spec or SandboxSpec()
    if "," in backend:
        return host_pool(backend, **kwargs).open(spec)
    if backend.startswith(("http://", "https://")):
        from terminal_rsi.sandbox.remote import RemoteSandbox

        return RemoteSandbox.create(backend, spec, **kwargs)
    if backend in ("local", "local-bwrap", "local-plain"):
        from terminal_rsi.sandbox.local import LocalSandbox

        mode = {"local": "auto", "local-bwrap": "bwrap", "local-plain": "plain"}[backend]
        return LocalSandbox(spec, mode=mode, allow_plain=allow_plain, **kwargs)
    if backend == "docker":
        from terminal_rsi.sandbox.docker_backend import DockerSandbox

        return DockerSandbox(spec, **kwargs)
    raise BadRequest(f"unknown sandbox backend {backend!r}; choose one of {BACKENDS}, a URL or "
                     "a comma-separated list of URLs")


_POOLS: dict = {}
_POOLS_LOCK = threading.Lock()


def host_pool(backend: str, token: str | None = None, token_file: str | None = None,
              timeout: float = 30.0):
    """The process-wide `SandboxPool` for a comma-separated list of bridge URLs.

    The token comes from `token` / `token_file`, else env TERMINAL_RSI_SANDBOX_TOKEN(_FILE)
    (see `remote.load_token`); the concurrency limit from env
    TERMINAL_RSI_SANDBOX_MAX_CONCURRENT (default 256; the rollout scheduler limits it too).
    """
    import os

    from terminal_rsi.sandbox.pool import SandboxPool

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


__all__ = [
    "BACKENDS", "PLAIN_POLICIES", "BadRequest", "CommandTimeout", "ExecResult",
    "InfrastructureError", "OutputCap",
    "Sandbox", "SandboxBusy", "SandboxError", "SandboxLost", "SandboxSpec", "host_pool",
    "open_sandbox",
]
