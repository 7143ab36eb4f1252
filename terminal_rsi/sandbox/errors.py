"""Typed sandbox failures. The rollout code decides per type; nothing retries silently.

=====================  =========  ==================================================
type                   retryable  meaning
=====================  =========  ==================================================
InfrastructureError    yes        engine/daemon gone, connection refused, HTTP 5xx,
                                  server busy (``SandboxBusy``): try again elsewhere
SandboxLost            no         this sandbox is gone (reaped, container died,
                                  server restarted); its state is lost: restart
                                  the episode in a new sandbox
BadRequest             no         the caller is wrong (bad path, oversize upload,
                                  unknown backend, bad spec): fix the call
CommandTimeout         no         the agent's command ran past its timeout; raised
                                  only by ``ExecResult.check()`` — ``exec`` itself
                                  returns a result with ``timed_out=True``
=====================  =========  ==================================================
"""

from __future__ import annotations


class SandboxError(RuntimeError):
    """Base of every sandbox failure."""

    retryable: bool = False
    kind: str = "sandbox_error"


class InfrastructureError(SandboxError):
    """The machinery failed (not the agent): retryable, possibly on another endpoint."""

    retryable = True
    kind = "infrastructure"


class SandboxBusy(InfrastructureError):
    """The server is at its concurrent-sandbox cap; retry later or elsewhere."""

    kind = "busy"


class SandboxLost(SandboxError):
    """The sandbox no longer exists (reaped, crashed, server restarted)."""

    kind = "lost"


class BadRequest(SandboxError, ValueError):
    """The request is invalid (path escapes the workspace, too large, bad spec)."""

    kind = "bad_request"


class CommandTimeout(SandboxError):
    """The agent's command exceeded its timeout (raised by ``ExecResult.check``)."""

    kind = "command_timeout"


ERROR_TYPES: dict[str, type[SandboxError]] = {
    cls.kind: cls
    for cls in (SandboxError, InfrastructureError, SandboxBusy, SandboxLost, BadRequest,
                CommandTimeout)
}
