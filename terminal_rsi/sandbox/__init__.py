"""Sandboxes for terminal agents: one protocol, local / Docker / remote backends.

    from terminal_rsi.sandbox import SandboxSpec, open_sandbox

    with open_sandbox(SandboxSpec(files={"main.py": b"print(1)"}), backend="local") as sb:
        r = sb.exec("python3 main.py", timeout=10)
        assert r.exit_code == 0 and not r.timed_out

Backends: ``local`` (bubblewrap, falling back to plain subprocesses with a
warning), ``local-bwrap``, ``local-plain``, ``docker``, or an ``http(s)://``
URL of a bridge server (``python -m terminal_rsi.sandbox.serve``). Many
sandboxes over many endpoints: :class:`terminal_rsi.sandbox.pool.SandboxPool`.
Isolation levels and failure types: docs/sandbox.md. Heavy engines (Docker
SDK, HTTP client/server) are imported only when their backend is used.
"""

from __future__ import annotations

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


def open_sandbox(spec: SandboxSpec | None = None, backend: str = "local", **kwargs) -> Sandbox:
    """Start a sandbox on ``backend`` (a name from BACKENDS or a bridge URL).

    kwargs go to the backend: ``base_dir`` (local), ``client`` (docker),
    ``token`` / ``token_file`` / ``timeout`` (remote).
    """
    spec = spec or SandboxSpec()
    if backend.startswith(("http://", "https://")):
        from terminal_rsi.sandbox.remote import RemoteSandbox

        return RemoteSandbox.create(backend, spec, **kwargs)
    if backend in ("local", "local-bwrap", "local-plain"):
        from terminal_rsi.sandbox.local import LocalSandbox

        mode = {"local": "auto", "local-bwrap": "bwrap", "local-plain": "plain"}[backend]
        return LocalSandbox(spec, mode=mode, **kwargs)
    if backend == "docker":
        from terminal_rsi.sandbox.docker_backend import DockerSandbox

        return DockerSandbox(spec, **kwargs)
    raise BadRequest(f"unknown sandbox backend {backend!r}; choose one of {BACKENDS} or a URL")


__all__ = [
    "BACKENDS", "BadRequest", "CommandTimeout", "ExecResult", "InfrastructureError", "OutputCap",
    "Sandbox", "SandboxBusy", "SandboxError", "SandboxLost", "SandboxSpec", "open_sandbox",
]
