"""The sandbox backends by name: `BACKENDS`, `PLAIN_POLICIES`, and `open_backend` (one backend
or one bridge URL; `terminal_rsi.sandbox.open_sandbox` adds lists of bridge URLs).

The Docker SDK and the HTTP client are imported by their backends on first use, so naming a
backend here costs nothing until it is opened.
"""

from __future__ import annotations

from terminal_rsi.sandbox.base import Sandbox, SandboxSpec
from terminal_rsi.sandbox.docker_backend import DockerSandbox
from terminal_rsi.sandbox.errors import BadRequest
from terminal_rsi.sandbox.local import LocalSandbox
from terminal_rsi.sandbox.remote import RemoteSandbox

BACKENDS = ("local", "local-bwrap", "local-plain", "docker")
# When a task may run in plain (unisolated) local mode, by whose files it is made:
# "never"; "builtin": the procedurally generated built-in tasks only; "always": any task,
# including Terminal-Bench and Harbor directories from disk (untrusted input).
PLAIN_POLICIES = ("never", "builtin", "always")
LOCAL_MODES = {"local": "auto", "local-bwrap": "bwrap", "local-plain": "plain"}


def open_backend(spec: SandboxSpec, backend: str, *, allow_plain: bool = False,
                 **kwargs) -> Sandbox:
    """Start a sandbox on one `backend`: a name from BACKENDS or an http(s):// bridge URL.

    kwargs go to the backend (see `terminal_rsi.sandbox.open_sandbox`). BadRequest names the
    choices for any other backend (a comma-separated list is `open_sandbox`'s job).
    """
    if backend.startswith(("http://", "https://")):
        return RemoteSandbox.create(backend, spec, **kwargs)
    if backend in LOCAL_MODES:
        return LocalSandbox(spec, mode=LOCAL_MODES[backend], allow_plain=allow_plain, **kwargs)
    if backend == "docker":
        return DockerSandbox(spec, **kwargs)
    raise BadRequest(f"unknown sandbox backend {backend!r}; choose one of {BACKENDS}, a URL or "
                     "a comma-separated list of URLs")
