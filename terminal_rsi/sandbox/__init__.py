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
SDK, HTTP client/server) are imported only when their backend is used. Modules:
``backends`` (names, ``open_backend``), ``pool`` (``SandboxPool``, ``host_pool``), ``base``,
``errors``, ``local``, ``docker_backend``, ``remote``, ``serve`` (the bridge server).

Profiles (``SandboxSpec.profile``, one of ``PROFILES``): ``"sandbox"``, our hardened layout
on any backend; ``"image"``, a task's own image run as ``docker run`` would (its USER,
WORKDIR, ENV, a writable root), Docker or a Docker bridge only.
"""

from __future__ import annotations

from terminal_rsi.sandbox.backends import BACKENDS, PLAIN_POLICIES, open_backend
from terminal_rsi.sandbox.base import PROFILES, ExecResult, OutputCap, Sandbox, SandboxSpec
from terminal_rsi.sandbox.errors import (
    BadRequest,
    CommandTimeout,
    InfrastructureError,
    SandboxBusy,
    SandboxError,
    SandboxLost,
)
from terminal_rsi.sandbox.pool import SandboxPool, host_pool


def open_sandbox(spec: SandboxSpec | None = None, backend: str = "local", *,
                 allow_plain: bool = False, **kwargs) -> Sandbox:
    """Start a sandbox on ``backend`` (a name from BACKENDS, a bridge URL, or a
    comma-separated list of bridge URLs: a sandbox from their process-wide `host_pool`).

    kwargs go to the backend: ``base_dir`` and ``allow_plain`` (local: let ``local`` fall back
    to plain subprocesses when bubblewrap is unusable), ``client`` (docker), ``token`` /
    ``token_file`` / ``timeout`` (remote).
    """
    spec = spec or SandboxSpec()
    if "," in backend:
        return host_pool(backend, **kwargs).open(spec)
    return open_backend(spec, backend, allow_plain=allow_plain, **kwargs)


__all__ = [
    "BACKENDS", "PLAIN_POLICIES", "BadRequest", "CommandTimeout", "ExecResult",
    "InfrastructureError", "OutputCap", "PROFILES",
    "Sandbox", "SandboxBusy", "SandboxError", "SandboxLost", "SandboxPool", "SandboxSpec",
    "host_pool", "open_backend", "open_sandbox",
]
