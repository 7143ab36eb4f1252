"""HTTP bridge server: sandboxes on this host for trainers on other hosts.

    python -m terminal_rsi.sandbox.serve --backend=local|local-bwrap|local-plain|docker \\
        --host 127.0.0.1 --port 8765 --token-file /etc/trsi/tokens [--max-sandboxes 64] \\
        [--ttl 900] [--max-request-mb 64] [--warm 0] [--port-file PATH] [--allow-plain] \\
        [--max-memory-mb 4096] [--max-disk-mb 4096] [--max-pids 1024] [--max-cpus N] \\
        [--max-timeout-s 3600] [--max-output-bytes 16777216] [--max-open-files 65536] \\
        [--allow-network]

Built on Starlette + uvicorn. API (JSON unless noted, every call needs
``Authorization: Bearer <token>``; ``X-Trsi-Client`` names the client
instance, and a sandbox belongs to the (token, client) pair that created it):

=======  ===============================  ===========================================
POST     /v1/sandboxes                    {"spec": SandboxSpec.to_json()} -> {"id",
                                          "workdir"} (the workspace path commands see)
POST     /v1/sandboxes/{id}/exec          {"command", "timeout", "env", "cwd"} -> ExecResult
PUT      /v1/sandboxes/{id}/files?dest=   body: tar stream -> {}
GET      /v1/sandboxes/{id}/files?path=   -> tar stream (application/x-tar); &max_bytes=
                                          (dest / path: workspace-relative; a sandbox of
                                          profile "image" also takes absolute ones)
DELETE   /v1/sandboxes/{id}               -> {} (idempotent; closes its session too)
GET      /v1/sandboxes/{id}/processes     -> {"processes": [ProcessInfo.to_json()]}: what
                                          runs in it, read from this host (pids are
                                          this host's; `Sandbox.processes`)
POST     /v1/sandboxes/{id}/session       {"lifetime_s"} -> {} (201): open the terminal
                                          session (one per sandbox)
GET      /v1/sandboxes/{id}/session       -> {"open", "alive"}
POST     .../session/send                 {"keystrokes"} -> {}
POST     .../session/wait                 {"timeout", "prompts", "settle_s"} ->
                                          {"done", "alive"}
POST     .../session/read                 {} -> SessionOutput
POST     .../session/run                  {"keystrokes", "timeout"} -> SessionOutput
DELETE   /v1/sandboxes/{id}/session       -> {} (idempotent): ends all it started
GET      /v1/health                       -> {"ok", "backend", "plain", "sandboxes",
                                              "capacity", "limits"}
GET      /v1/metrics                      -> counters (JSON)
=======  ===============================  ===========================================

Terminal sessions (`terminal_rsi.sandbox.terminal` gives the semantics of each operation):
``lifetime_s`` and every wait or run ``timeout`` are at most ``--max-timeout-s`` (refused
above it), so no request waits longer. Session operations run beside the sandbox's execs
(a ``run`` and an ``exec`` at once; a ``send`` of ``C-c`` during a ``wait``); a long wait
holds one worker thread, never the event loop or another sandbox. Deleting or reaping the
sandbox closes its session first. A session operation on a sandbox without one is a 400.

Every request is checked against its schema before anything runs (:func:`parse_json_object`,
:func:`parse_exec`, :func:`parse_spec`, :func:`parse_query`): bodies are JSON objects of the
known fields only, nested at most ``MAX_JSON_DEPTH`` deep, every field of its type and size
(text without NUL or lone surrogates, ints as ints, finite numbers, strict base64, env names
``[A-Za-z_][A-Za-z0-9_]*``), and a sandbox asks for no more than the server's
:class:`ServerLimits` (refused, never clamped). Bad input is a 400 (413 when too large) naming
the field; a 500 means a bug or a broken host, never bad input.

Errors: ``{"error": {"kind", "message"}}`` with 400/413 bad_request, 401
unauthorized, 410 lost (unknown, reaped, or another client's sandbox), 503 busy
(``Retry-After``; the concurrent-sandbox cap is reached), 502/500 infrastructure.
Idle sandboxes are reaped after ``--ttl`` seconds; shutdown (SIGTERM/SIGINT)
destroys every sandbox the server made.

Plain mode (``--backend=local-plain``, or ``local`` on a host without a usable bubblewrap) is
the declared weaker mode: the server refuses to start with it unless ``--allow-plain`` is
given, and then logs one line saying what it does not isolate.

The token file holds one token per line, optionally ``name:token``; it must be a regular file
that only its owner may read (``chmod 600``).
"""

from __future__ import annotations

import argparse
import base64
import binascii
import dataclasses
import hmac
import json
import logging
import math
import os
import re
import signal
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Mapping
from contextlib import asynccontextmanager
from typing import Any

from terminal_rsi.sandbox.backends import BACKENDS, open_backend
from terminal_rsi.sandbox.base import (
    DEFAULT_SESSION_LIFETIME_S,
    MAX_COMMAND_BYTES,
    MAX_CPUS,
    MAX_EXEC_TIMEOUT_S,
    MAX_PATH_BYTES,
    SPEC_BOUNDS,
    MiB,
    Sandbox,
    SandboxSpec,
    TarLimits,
    check_env,
    check_text,
    safe_path,
)
from terminal_rsi.sandbox.docker_backend import DockerBackend
from terminal_rsi.sandbox.errors import (
    BadRequest,
    InfrastructureError,
    SandboxBusy,
    SandboxError,
    SandboxLost,
)
from terminal_rsi.sandbox.local import PLAIN_MODE_NOTE, bwrap_available, sweep_stale
from terminal_rsi.sandbox.remote import SANDBOX_ID, read_secret_file
from terminal_rsi.sandbox.terminal import SETTLE_S, TerminalSession

log = logging.getLogger(__name__)

MAX_JSON_DEPTH = 32  # arrays/objects inside one another in a request body
MAX_JSON_CONTAINERS = 64  # arrays/objects in one request body (a valid one has at most 4)
MAX_JSON_SCAN_ESCAPES = 2_000_000  # quotes + backslashes in a body that also has many brackets
MAX_EXEC_BODY_BYTES = 4 * MiB  # an exec body: command (128 KiB) + env (256 KiB), JSON-escaped
MAX_SESSION_BODY_BYTES = 64 << 10  # an open / wait / read body: a few numbers
MAX_TOKEN_FILE_BYTES = 1 * MiB


def read_tokens(path: str) -> dict[str, str]:
    """token -> client name, from a token file (one token or name:token per line).

    The file must be a regular file (not a link) that grants nothing to group or other.
    """
    tokens: dict[str, str] = {}
    text = read_secret_file(path, "token file", MAX_TOKEN_FILE_BYTES)
    for i, line in enumerate(text.splitlines()):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, tok = line.rpartition(":")
        if not (tok.isascii() and tok.isprintable() and " " not in tok):
            raise BadRequest(f"token file {path}, line {i + 1}: a token is printable ASCII "
                             "without spaces")
        tokens[tok] = name or f"token{i}"
    if not tokens or any(len(t) < 16 for t in tokens):
        raise BadRequest(f"token file {path} must hold tokens of >= 16 characters")
    return tokens


def _limit(default: Any = dataclasses.MISSING, doc: str = "", **kw) -> Any:
    """A ServerLimits field: its default and its doc (also the help of its ``serve`` flag)."""
    return dataclasses.field(default=default, metadata={"doc": doc}, **kw)


def _cpu_count() -> float:
    return float(os.cpu_count() or 1)


# SandboxSpec field -> the ServerLimits field that caps it.
_SPEC_MAXIMA = {"memory_mb": "max_memory_mb", "disk_mb": "max_disk_mb", "pids": "max_pids",
                "cpus": "max_cpus", "max_output_bytes": "max_output_bytes",
                "open_files": "max_open_files"}


@dataclasses.dataclass(frozen=True)
class ServerLimits:
    """What a client of this server may ask for; each field is a ``serve`` flag of its name.

    A request above a maximum is refused with 400 naming the field, the value asked and the
    maximum: nothing is silently clamped. Every maximum is at most the hard bound of
    ``SandboxSpec`` (``base.SPEC_BOUNDS``, ``MAX_CPUS``, ``MAX_EXEC_TIMEOUT_S``).
    ``GET /v1/health`` reports them. Each field's doc is in its ``metadata["doc"]``.
    """

    max_memory_mb: int = _limit(4096, "largest spec.memory_mb (MiB of memory per sandbox)")
    max_disk_mb: int = _limit(4096, "largest spec.disk_mb (MiB of workspace, /tmp and "
                                    "/dev/shm per sandbox)")
    max_pids: int = _limit(1024, "largest spec.pids (processes per sandbox)")
    max_cpus: float = _limit(doc="largest spec.cpus (CPU cores per sandbox; by default all "
                                 "of this host's)", default_factory=_cpu_count)
    max_timeout_s: float = _limit(3600.0, "longest exec timeout, terminal-session lifetime "
                                          "and session wait (seconds)")
    max_output_bytes: int = _limit(16 * MiB, "largest spec.max_output_bytes (bytes kept per "
                                             "stream per exec)")
    max_open_files: int = _limit(65536, "largest spec.open_files (RLIMIT_NOFILE)")
    allow_network: bool = _limit(False, "let a sandbox ask for network=True (off: refused)")

    def __post_init__(self):
        for spec_name, name in _SPEC_MAXIMA.items():
            v = getattr(self, name)
            if spec_name == "cpus":
                ok = _is_number(v) and 0 < v <= MAX_CPUS
                hi = MAX_CPUS
            else:
                ok = _is_int(v) and 0 < v <= SPEC_BOUNDS[spec_name]
                hi = SPEC_BOUNDS[spec_name]
            if not ok:
                raise BadRequest(f"ServerLimits.{name} must be a positive "
                                 f"{'number' if spec_name == 'cpus' else 'int'} <= {hi}, "
                                 f"got {v!r}")
        if not (_is_number(self.max_timeout_s) and 0 < self.max_timeout_s <= MAX_EXEC_TIMEOUT_S):
            raise BadRequest(f"ServerLimits.max_timeout_s must be a number in "
                             f"(0, {MAX_EXEC_TIMEOUT_S}], got {self.max_timeout_s!r}")
        if not isinstance(self.allow_network, bool):
            raise BadRequest(f"ServerLimits.allow_network must be a bool, got "
                             f"{self.allow_network!r}")

    def check_spec(self, values: Mapping[str, Any]) -> None:
        """Refuse (BadRequest) spec values above these maxima, and network unless allowed.

        ``values``: SandboxSpec fields by name (``vars(spec)`` or a request's typed fields).
        """
        for spec_name, name in _SPEC_MAXIMA.items():
            if spec_name in values and values[spec_name] > getattr(self, name):
                raise BadRequest(
                    f"spec.{spec_name}: asked for {values[spec_name]!r}, this server allows at "
                    f"most {getattr(self, name)!r} (serve --{name.replace('_', '-')}); ask for "
                    "less or use another server")
        if values.get("network") and not self.allow_network:
            raise BadRequest("spec.network: this server does not give sandboxes network "
                             "access (serve --allow-network is off); ask for network=false")

    def check_timeout(self, timeout: Any, what: str = "timeout") -> float:
        """An exec timeout: a finite number of seconds in (0, max_timeout_s]."""
        if not (_is_number(timeout) and 0 < timeout <= self.max_timeout_s):
            raise BadRequest(f"{what} must be a finite number of seconds in "
                             f"(0, {self.max_timeout_s:g}] (serve --max-timeout-s), got "
                             f"{_show(timeout)}")
        return float(timeout)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return (isinstance(v, int | float) and not isinstance(v, bool)
            and math.isfinite(v))


def _show(v: Any, n: int = 60) -> str:
    """A short, ASCII-safe rendering of a client's value for an error message."""
    s = ascii(v)
    return s if len(s) <= n else s[:n] + "..."


def plain_mode(backend: str, allow_plain: bool) -> bool:
    """Whether sandboxes of ``backend`` run as plain subprocesses; refused unless allowed.

    ``local-plain`` is plain by name; ``local`` is plain where bubblewrap is unusable (it never
    falls back silently: without ``allow_plain`` that is a BadRequest here, at server start).
    """
    if backend == "local-plain":
        if not allow_plain:
            raise BadRequest("--backend=local-plain runs commands as plain subprocesses, "
                             "without namespace isolation; pass --allow-plain to serve this "
                             "weaker mode anyway, or use --backend=local-bwrap or docker")
        return True
    if backend == "local":
        if not bwrap_available():
            if not allow_plain:
                raise BadRequest("bubblewrap is not usable on this host, so --backend=local "
                                 "would run commands as plain subprocesses: install it "
                                 "(apt-get install bubblewrap; user namespaces enabled), or "
                                 "pass --allow-plain to serve the weaker plain mode anyway")
            return True
    return False


# ------------------------------------------------------------------ request schema
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_OPENERS = frozenset(b"[{")
_JSON_TYPES = {dict: "object", list: "array", str: "string", bool: "boolean",
               int: "number", float: "number", type(None): "null"}


def _check_nesting(raw: bytes, what: str) -> None:
    """Refuse deep nesting and too many containers before the JSON parser recurses.

    Every step runs at C speed: a body with at most ``MAX_JSON_DEPTH`` opening brackets
    anywhere cannot nest deeper; otherwise the strings are cut out (their brackets are text)
    and the structural brackets counted, which costs time per string and escape, so a body
    with more than ``MAX_JSON_SCAN_ESCAPES`` of those is refused first.
    """
    if raw.count(b"[") + raw.count(b"{") <= MAX_JSON_DEPTH:
        return
    if raw.count(b'"') + raw.count(b"\\") > MAX_JSON_SCAN_ESCAPES:
        raise BadRequest(f"{what}: the JSON body holds more than {MAX_JSON_SCAN_ESCAPES} quotes "
                         "and backslashes besides many brackets; send the request's fields "
                         "only (large data goes in files)")
    brackets = _JSON_STRING.sub(b"", raw).translate(None, _NOT_BRACKET)
    depth = 0
    for b in brackets[: 2 * MAX_JSON_CONTAINERS + 1]:
        depth += 1 if b in _OPENERS else -1
        if depth > MAX_JSON_DEPTH:
            raise BadRequest(f"{what}: the JSON body nests arrays/objects deeper than "
                             f"{MAX_JSON_DEPTH} levels; send a flat JSON object")
    if len(brackets) > 2 * MAX_JSON_CONTAINERS:
        raise BadRequest(f"{what}: the JSON body holds more than {MAX_JSON_CONTAINERS} "
                         "arrays/objects; send only the request's fields")


def _parse_int(s: str) -> int:
    if len(s.lstrip("-")) > 30:
        raise BadRequest(f"the integer {s[:20]}... has more than 30 digits")
    return int(s)


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise BadRequest(f"a JSON object in the body repeats the key {_show(dup)}; send each "
                         "field once")
    return d


def parse_json_object(raw: bytes, what: str, empty_ok: bool = False) -> dict[str, Any]:
    """The JSON object of a request body, or BadRequest saying what is wrong with it."""
    if not raw.strip():
        if empty_ok:
            return {}
        raise BadRequest(f"{what}: the body is empty; send a JSON object")
    _check_nesting(raw, what)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadRequest(f"{what}: the body is not UTF-8 (byte {e.start}); send UTF-8 "
                         "JSON") from None
    try:
        # NaN, Infinity and 1e400 parse to floats that every numeric field refuses by name.
        data = json.loads(text, parse_int=_parse_int, object_pairs_hook=_object)
    except BadRequest as e:
        raise BadRequest(f"{what}: {e}") from None
    except json.JSONDecodeError as e:
        raise BadRequest(f"{what}: the body is not JSON ({e.msg} at line {e.lineno} column "
                         f"{e.colno}); send a JSON object") from None
    except (RecursionError, ValueError) as e:  # backstops: the checks above come first
        raise BadRequest(f"{what}: the body is not acceptable JSON "
                         f"({type(e).__name__}); send a flat JSON object") from None
    if not isinstance(data, dict):
        raise BadRequest(f"{what}: the body must be a JSON object, got a JSON "
                         f"{_JSON_TYPES.get(type(data), 'value')}")
    return data


def _check_fields(data: Mapping[str, Any], known: tuple[str, ...], what: str) -> None:
    unknown = [k for k in data if k not in known]
    if unknown:
        raise BadRequest(f"{what}: unknown field(s) {_show(sorted(unknown), 200)}; the known "
                         f"fields are {list(known)}")


def _relpath(value: Any, what: str, absolute_ok: bool = False) -> str:
    """A checked workspace-relative path (``absolute_ok``: or absolute, profile "image")."""
    check_text(value, what, MAX_PATH_BYTES)
    try:
        return safe_path(value, absolute_ok=absolute_ok)
    except BadRequest as e:
        raise BadRequest(f"{what}: {e}") from None


def _file_path(sb: Sandbox, value: str, what: str) -> str:
    """A transfer path for ``sb``: absolute only when its profile is "image"."""
    return _relpath(value, what, absolute_ok=sb.spec.profile == "image")


EXEC_FIELDS = ("command", "timeout", "env", "cwd")
DEFAULT_EXEC_TIMEOUT_S = 60.0


def parse_exec(data: Mapping[str, Any], limits: ServerLimits) -> dict[str, Any]:
    """Checked ``Sandbox.exec`` keyword arguments from an exec request body."""
    _check_fields(data, EXEC_FIELDS, "exec")
    if "command" not in data:
        raise BadRequest("exec.command is required: the shell command to run (a string)")
    out: dict[str, Any] = {"command": check_text(data["command"], "exec.command",
                                                 MAX_COMMAND_BYTES)}
    timeout = data.get("timeout")
    out["timeout"] = limits.check_timeout(
        min(DEFAULT_EXEC_TIMEOUT_S, limits.max_timeout_s) if timeout is None else timeout,
        "exec.timeout")
    out["env"] = check_env(data.get("env"), "exec.env") or None
    cwd = data.get("cwd")
    out["cwd"] = None if cwd is None else _relpath(cwd, "exec.cwd")
    return out


SESSION_OPEN_FIELDS = ("lifetime_s",)
SEND_FIELDS = ("keystrokes",)
WAIT_FIELDS = ("timeout", "prompts", "settle_s")
RUN_FIELDS = ("keystrokes", "timeout")
MAX_WAIT_PROMPTS = MAX_COMMAND_BYTES  # the most Enter presses one send can hold


def _seconds(value: Any, what: str, hi: float, flag: str = "--max-timeout-s") -> float:
    """A finite number of seconds in [0, hi], or BadRequest naming ``what``."""
    if not (_is_number(value) and 0 <= value <= hi):
        raise BadRequest(f"{what} must be a finite number of seconds in [0, {hi:g}] "
                         f"(serve {flag}), got {_show(value)}")
    return float(value)


def _keystrokes(data: Mapping[str, Any], what: str) -> str:
    if "keystrokes" not in data:
        raise BadRequest(f"{what}.keystrokes is required: the text to type, or one tmux key "
                         "name such as C-c (a string)")
    return check_text(data["keystrokes"], f"{what}.keystrokes", MAX_COMMAND_BYTES)


def _wait_timeout(data: Mapping[str, Any], what: str, limits: ServerLimits) -> float:
    if "timeout" not in data:
        raise BadRequest(f"{what}.timeout is required: the most seconds to wait (a number)")
    return _seconds(data["timeout"], f"{what}.timeout", limits.max_timeout_s)


def parse_session_open(data: Mapping[str, Any], limits: ServerLimits) -> float:
    """``lifetime_s`` of an open-session request: in (0, max_timeout_s] (it bounds each of
    the session's processes' CPU time, as an exec's timeout does); default one hour or the
    maximum, whichever is less."""
    _check_fields(data, SESSION_OPEN_FIELDS, "session")
    v = data.get("lifetime_s")
    if v is None:
        return min(DEFAULT_SESSION_LIFETIME_S, limits.max_timeout_s)
    return limits.check_timeout(v, "session.lifetime_s")


def parse_send(data: Mapping[str, Any]) -> str:
    """The keystrokes of a send request."""
    _check_fields(data, SEND_FIELDS, "send")
    return _keystrokes(data, "send")


def parse_wait(data: Mapping[str, Any], limits: ServerLimits) -> dict[str, Any]:
    """Checked ``TerminalSession.wait`` keyword arguments from a wait request body."""
    _check_fields(data, WAIT_FIELDS, "wait")
    out: dict[str, Any] = {"timeout": _wait_timeout(data, "wait", limits)}
    prompts = data.get("prompts", 0)
    if not (_is_int(prompts) and 0 <= prompts <= MAX_WAIT_PROMPTS):
        raise BadRequest(f"wait.prompts must be an integer in [0, {MAX_WAIT_PROMPTS}] (the "
                         f"prompts to wait for; 0: quiet output), got {_show(prompts)}")
    out["prompts"] = prompts
    out["settle_s"] = _seconds(data.get("settle_s", SETTLE_S), "wait.settle_s",
                               limits.max_timeout_s)
    return out


def parse_run(data: Mapping[str, Any], limits: ServerLimits) -> dict[str, Any]:
    """Checked ``TerminalSession.run`` keyword arguments from a run request body."""
    _check_fields(data, RUN_FIELDS, "run")
    return {"keystrokes": _keystrokes(data, "run"),
            "timeout": _wait_timeout(data, "run", limits)}


_SPEC_INTS = ("memory_mb", "pids", "disk_mb", "max_output_bytes", "open_files")
SPEC_FIELDS = tuple(f.name for f in dataclasses.fields(SandboxSpec))


def parse_spec(data: Any, limits: ServerLimits) -> SandboxSpec:
    """A SandboxSpec from a request's ``spec`` object: typed, within the server's limits."""
    if not isinstance(data, dict):
        raise BadRequest(f"spec must be a JSON object, got a JSON "
                         f"{_JSON_TYPES.get(type(data), 'value')}")
    _check_fields(data, SPEC_FIELDS, "spec")
    d: dict[str, Any] = {}
    for name in _SPEC_INTS:
        if name in data:
            v = data[name]
            if not _is_int(v):
                raise BadRequest(f"spec.{name} must be an integer, got {_show(v)}")
            if v < 1:
                raise BadRequest(f"spec.{name} must be >= 1, got {v}")
            d[name] = v
    if "cpus" in data:
        v = data["cpus"]
        if not (_is_number(v) and v > 0):
            raise BadRequest(f"spec.cpus must be a positive finite number, got {_show(v)}")
        d["cpus"] = v
    if "network" in data:
        if not isinstance(data["network"], bool):
            raise BadRequest(f"spec.network must be true or false, got {_show(data['network'])}")
        d["network"] = data["network"]
    limits.check_spec(d)
    if "image" in data:
        d["image"] = check_text(data["image"], "spec.image", 512)
    if "env" in data:
        d["env"] = check_env(data["env"], "spec.env")
    if "files" in data:
        d["files"] = _parse_files(data["files"], d.get("disk_mb", SandboxSpec.disk_mb))
    if "profile" in data:
        d["profile"] = check_text(data["profile"], "spec.profile", 64)
    if "workdir" in data:
        d["workdir"] = check_text(data["workdir"], "spec.workdir", MAX_PATH_BYTES)
    return SandboxSpec(**d)  # checks profile and workdir (BadRequest saying what is wrong)


def _parse_files(files: Any, disk_mb: int) -> dict[str, bytes]:
    """spec.files: workspace-relative path -> strict base64, within the member and disk caps."""
    if not isinstance(files, dict):
        raise BadRequest("spec.files must be a JSON object of workspace path -> base64 text")
    max_members = TarLimits().max_members
    if len(files) > max_members:
        raise BadRequest(f"spec.files has {len(files)} files; the limit is {max_members}: "
                         "upload the rest with put_files")
    out, total = {}, 0
    for path, text in files.items():
        what = f"spec.files[{_show(path)}]"
        if _relpath(path, f"{what} (its path)") == ".":
            raise BadRequest(f"{what}: a file path names the workspace itself; name a file")
        if not isinstance(text, str):
            raise BadRequest(f"{what} must be base64 text, got {_show(text)}")
        try:
            out[path] = base64.b64decode(text.encode("ascii"), validate=True)
        except (UnicodeEncodeError, binascii.Error):
            raise BadRequest(f"{what} is not strict base64 (A-Z a-z 0-9 + / with = padding); "
                             "encode the file's bytes with base64.b64encode") from None
        total += len(out[path])
        if total > disk_mb * MiB:
            raise BadRequest(f"spec.files hold more than spec.disk_mb = {disk_mb} MiB")
    return out


def parse_sid(sid: str) -> str:
    """A sandbox id from the URL path (what the server hands out: hex, at most 128 chars)."""
    if not SANDBOX_ID.fullmatch(sid):
        raise BadRequest(f"sandbox id {_show(sid)} is malformed; use the id that create "
                         "returned")
    return sid


def parse_query(params: Any, known: Mapping[str, str]) -> dict[str, str]:
    """Query parameters: only ``known`` ones (name -> default), each once, as checked text."""
    out: dict[str, str] = {}
    for k, v in params.multi_items():
        if k not in known:
            raise BadRequest(f"unknown query parameter {_show(k)}; the known ones are "
                             f"{list(known)}")
        if k in out:
            raise BadRequest(f"query parameter {k} is given twice; give it once")
        out[k] = check_text(v, f"query parameter {k}", MAX_PATH_BYTES)
    return {k: out.get(k, d) for k, d in known.items()}


def _parse_max_bytes(value: str, ceiling: int) -> int:
    if not re.fullmatch(r"[0-9]{1,19}", value) or int(value) < 1:
        raise BadRequest(f"query parameter max_bytes must be a positive integer, got "
                         f"{_show(value)}")
    return min(int(value), ceiling)  # a download cap, not a resource ask: the server's wins


@dataclasses.dataclass
class _Entry:
    sandbox: Sandbox
    owner: str
    last_used: float
    busy: int = 0
    session: TerminalSession | None = None
    closed: bool = False  # dropped from the manager: a session opened now is closed at once
    session_lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


class SandboxManager:
    """Owns the sandboxes of one server: cap, limits, ownership, TTL reaping, shutdown.

    ``allow_plain`` lets the server run plain subprocesses (``local-plain``, or ``local``
    without a usable bubblewrap); without it such a manager cannot be made.
    """

    def __init__(self, backend: str = "local", max_sandboxes: int = 64, ttl_s: float = 900.0,
                 base_dir: str | None = None, warm: int = 0,
                 limits: ServerLimits | None = None, allow_plain: bool = False):
        if backend not in BACKENDS:
            raise BadRequest(f"unknown backend {backend!r}; choose one of {BACKENDS}")
        self.backend = backend
        self.max_sandboxes = max_sandboxes
        self.ttl_s = ttl_s
        self.base_dir = base_dir
        self.limits = limits or ServerLimits()
        self.allow_plain = allow_plain
        self.plain = plain_mode(backend, allow_plain)
        self._docker = None
        if backend == "docker":
            self._docker = DockerBackend(warm=warm)
        if base_dir is not None and backend.startswith("local"):
            self._clean_stale(base_dir)
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        self._pending = 0
        self.metrics: Counter = Counter()
        self._closed = False

    @staticmethod
    def _clean_stale(base_dir: str) -> None:
        """Remove what a killed predecessor left in ``base_dir`` (its processes, tmpfs
        mounts, workspaces and cgroups; `local.sweep_stale` keeps live owners' sandboxes)."""
        os.makedirs(base_dir, exist_ok=True)
        sweep_stale(base_dir, min_age_s=0.0)

    def create(self, owner: str, spec: SandboxSpec) -> str:
        self.limits.check_spec(vars(spec))
        with self._lock:
            if self._closed:
                raise InfrastructureError("server is shutting down")
            if len(self._entries) + self._pending >= self.max_sandboxes:
                self.metrics["busy_rejections"] += 1
                raise SandboxBusy(f"server is at its cap of {self.max_sandboxes} sandboxes; "
                                  "retry later or on another endpoint")
            self._pending += 1
        try:
            if self._docker is not None:
                sb = self._docker.open(spec)
            else:
                sb = open_backend(spec, self.backend, base_dir=self.base_dir,
                                  allow_plain=self.allow_plain)
        finally:
            with self._lock:
                self._pending -= 1
        with self._lock:
            if self._closed:
                sb.close()
                raise InfrastructureError("server is shutting down")
            self._entries[sb.id] = _Entry(sb, owner, time.monotonic())
            self.metrics["sandboxes_created"] += 1
        return sb.id

    def workdir(self, sid: str) -> str:
        """The workspace path commands of sandbox ``sid`` see ("" once it is gone)."""
        with self._lock:
            e = self._entries.get(sid)
            return e.sandbox.workdir if e is not None else ""

    def acquire(self, owner: str, sid: str) -> _Entry:
        with self._lock:
            e = self._entries.get(sid)
            if e is None or not hmac.compare_digest(e.owner.encode(), owner.encode()):
                raise SandboxLost(f"sandbox {sid} does not exist (closed, reaped, or not yours)")
            e.busy += 1
            e.last_used = time.monotonic()
            return e

    def release(self, e: _Entry) -> None:
        with self._lock:
            e.busy -= 1
            e.last_used = time.monotonic()

    def delete(self, owner: str, sid: str) -> None:
        with self._lock:
            e = self._entries.get(sid)
            if e is None or not hmac.compare_digest(e.owner.encode(), owner.encode()):
                return  # idempotent
            del self._entries[sid]
            e.closed = True
        self._close_entry(e)
        self.metrics["sandboxes_deleted"] += 1

    def reap(self) -> int:
        now = time.monotonic()
        with self._lock:
            idle = [sid for sid, e in self._entries.items()
                    if e.busy == 0 and now - e.last_used > self.ttl_s]
            victims = [self._entries.pop(sid) for sid in idle]
            for e in victims:
                e.closed = True
        for e in victims:
            self._close_entry(e)
        self.metrics["sandboxes_reaped"] += len(victims)
        return len(victims)

    @staticmethod
    def _close_entry(e: _Entry) -> None:
        """Close a dropped entry's terminal session, then its sandbox (whatever the first
        does, the second runs). ``e.closed`` is set first, so a session being opened
        meanwhile is closed by its opener (`open_session`)."""
        session, e.session = e.session, None
        try:
            if session is not None:
                session.close()
        finally:
            e.sandbox.close()

    # -- terminal sessions (one per sandbox; its operations run beside execs, see build_app)
    def open_session(self, e: _Entry, lifetime_s: float) -> None:
        """Open ``e``'s terminal session; BadRequest if one is live (a dead one is closed
        first: its processes end)."""
        with e.session_lock:
            old = e.session
            if old is not None and old.alive:
                raise BadRequest(f"sandbox {e.sandbox.id} already has a terminal session; "
                                 f"close it (DELETE /v1/sandboxes/{e.sandbox.id}/session) "
                                 "before opening another")
            if old is not None:
                e.session = None
                old.close()
            session = e.session = e.sandbox.open_session(lifetime_s)
            if e.closed:  # the sandbox was deleted or reaped while this one opened
                e.session = None
                session.close()
                raise SandboxLost(f"sandbox {e.sandbox.id} was closed while its terminal "
                                  "session opened")
        self.metrics["sessions_opened"] += 1

    @staticmethod
    def session_of(e: _Entry) -> TerminalSession:
        session = e.session
        if session is None:
            raise BadRequest(f"sandbox {e.sandbox.id} has no terminal session; open one "
                             f"first (POST /v1/sandboxes/{e.sandbox.id}/session)")
        return session

    def close_session(self, e: _Entry) -> None:
        """Close ``e``'s terminal session and everything it started (idempotent)."""
        with e.session_lock:
            session, e.session = e.session, None
        if session is not None:
            session.close()
            self.metrics["sessions_closed"] += 1

    def active(self) -> int:
        with self._lock:
            return len(self._entries)

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
            victims = list(self._entries.values())
            self._entries.clear()
            for e in victims:
                e.closed = True
        for e in victims:
            try:
                self._close_entry(e)
            except Exception as ex:  # noqa: BLE001
                log.warning("closing %s at shutdown: %s", e.sandbox.id, ex)
        if self._docker is not None:
            self._docker.close()


_STATUS = {"bad_request": 400, "lost": 410, "busy": 503, "infrastructure": 502,
           "command_timeout": 400, "sandbox_error": 500}


def build_app(manager: SandboxManager, tokens: dict[str, str], max_request_bytes: int = 64 << 20,
              reap_interval_s: float | None = None):
    """The Starlette application (also used in-process by tests); limits: ``manager.limits``."""
    # the web framework, imported here: only the bridge server process needs it
    import anyio.to_thread
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    token_bytes = {t.encode(): name for t, name in tokens.items()}
    limits = manager.limits
    stop = threading.Event()

    def error(kind: str, message: str, status: int | None = None, **headers) -> JSONResponse:
        manager.metrics[f"errors_{kind}"] += 1
        # A message may quote client text: never let a lone surrogate break the answer.
        message = message.encode("utf-8", "backslashreplace").decode("utf-8")
        return JSONResponse({"error": {"kind": kind, "message": message}},
                            status_code=status or _STATUS.get(kind, 500), headers=headers)

    def owner_of(request: Request) -> str | None:
        auth = request.headers.get("authorization", "")
        if not auth.startswith("Bearer "):
            return None
        given = auth[7:].strip().encode()
        name = None
        for tok, n in token_bytes.items():
            if hmac.compare_digest(tok, given):
                name = n
        if name is None:
            return None
        client = request.headers.get("x-trsi-client", "")
        if len(client) > 128 or not client.isprintable():
            return None
        return f"{name}/{client}"

    async def body(request: Request, limit: int) -> bytes:
        cl = request.headers.get("content-length")
        if cl is not None and re.fullmatch(r"[0-9]{1,30}", cl) and int(cl) > limit:
            raise _TooLarge(f"request body of {cl} bytes exceeds the limit of {limit}")
        parts, n = [], 0
        async for chunk in request.stream():
            n += len(chunk)
            if n > limit:
                raise _TooLarge(f"request body exceeds the limit of {limit} bytes")
            parts.append(chunk)
        return b"".join(parts)

    def endpoint(fn):
        async def handler(request: Request):
            owner = owner_of(request)
            if owner is None:
                manager.metrics["errors_unauthorized"] += 1
                return JSONResponse({"error": {"kind": "unauthorized", "message":
                                     "missing or wrong bearer token"}}, status_code=401)
            manager.metrics["requests"] += 1
            try:
                return await fn(request, owner)
            except _TooLarge as e:
                return error("bad_request", str(e), 413)
            except SandboxBusy as e:
                return error("busy", str(e), 503, **{"Retry-After": "1"})
            except SandboxError as e:
                return error(e.kind, str(e))
            except ClientDisconnect:  # the client hung up mid-body: its doing, not ours
                manager.metrics["client_disconnects"] += 1
                return Response(status_code=400)
            except Exception as e:  # noqa: BLE001  (a bug or a broken host; never bad input)
                log.exception("internal error")
                return error("infrastructure", f"internal error: {type(e).__name__}: {e}", 500)
        return handler

    async def health(request: Request, owner: str):
        return JSONResponse({"ok": True, "backend": manager.backend, "plain": manager.plain,
                             "sandboxes": manager.active(), "capacity": manager.max_sandboxes,
                             "limits": limits.to_json()})

    async def metrics(request: Request, owner: str):
        m = dict(manager.metrics)
        m["sandboxes_active"] = manager.active()
        return JSONResponse(m)

    async def create(request: Request, owner: str):
        parse_query(request.query_params, {})
        data = parse_json_object(await body(request, max_request_bytes), "create",
                                 empty_ok=True)
        _check_fields(data, ("spec",), "create")
        spec = parse_spec(data.get("spec", {}), limits)
        sid = await run_in_threadpool(manager.create, owner, spec)
        return JSONResponse({"id": sid, "workdir": manager.workdir(sid) or "/workspace"},
                            status_code=201)

    async def with_sandbox(owner: str, sid: str, fn, *args):
        e = manager.acquire(owner, parse_sid(sid))
        try:
            return await run_in_threadpool(fn, e.sandbox, *args)
        finally:
            manager.release(e)

    async def exec_(request: Request, owner: str):
        parse_query(request.query_params, {})
        raw = await body(request, min(max_request_bytes, MAX_EXEC_BODY_BYTES))
        kw = parse_exec(parse_json_object(raw, "exec"), limits)

        def run(sb: Sandbox):
            return sb.exec(**kw)

        t0 = time.monotonic()
        res = await with_sandbox(owner, request.path_params["sid"], run)
        manager.metrics["execs"] += 1
        manager.metrics["exec_timeouts"] += int(res.timed_out)
        manager.metrics["exec_seconds_sum"] += time.monotonic() - t0
        return JSONResponse(res.to_json())

    async def put_files(request: Request, owner: str):
        q = parse_query(request.query_params, {"dest": "."})
        _relpath(q["dest"], "query parameter dest", absolute_ok=True)  # before the body
        data = await body(request, max_request_bytes)
        await with_sandbox(owner, request.path_params["sid"], lambda sb: sb.put_tar(
            data, _file_path(sb, q["dest"], "query parameter dest")))
        return JSONResponse({})

    async def get_files(request: Request, owner: str):
        q = parse_query(request.query_params, {"path": ".", "max_bytes": str(max_request_bytes)})
        _relpath(q["path"], "query parameter path", absolute_ok=True)
        max_bytes = _parse_max_bytes(q["max_bytes"], max_request_bytes)
        data = await with_sandbox(owner, request.path_params["sid"], lambda sb: sb.get_tar(
            _file_path(sb, q["path"], "query parameter path"), max_bytes=max_bytes))
        return Response(data, media_type="application/x-tar")

    async def processes(request: Request, owner: str):
        parse_query(request.query_params, {})
        found = await with_sandbox(owner, request.path_params["sid"],
                                   lambda sb: sb.processes())
        manager.metrics["process_listings"] += 1
        return JSONResponse({"processes": [p.to_json() for p in found]})

    async def delete(request: Request, owner: str):
        parse_query(request.query_params, {})
        sid = parse_sid(request.path_params["sid"])
        await run_in_threadpool(manager.delete, owner, sid)
        return JSONResponse({})

    def reaper():
        interval = reap_interval_s or max(0.5, min(30.0, manager.ttl_s / 4))
        while not stop.wait(interval):
            try:
                manager.reap()
            except Exception:  # noqa: BLE001
                log.exception("reaper")

    @asynccontextmanager
    async def lifespan(app):
        limiter = anyio.to_thread.current_default_thread_limiter()
        # per sandbox at once: an exec, a session wait or run, a send (C-c) and a close
        limiter.total_tokens = max(limiter.total_tokens, 4 * manager.max_sandboxes + 8)
        t = threading.Thread(target=reaper, daemon=True, name="trsi-reaper")
        t.start()
        try:
            yield
        finally:
            stop.set()
            await run_in_threadpool(manager.shutdown)

    routes = [
        Route("/v1/health", endpoint(health), methods=["GET"]),
        Route("/v1/metrics", endpoint(metrics), methods=["GET"]),
        Route("/v1/sandboxes", endpoint(create), methods=["POST"]),
        Route("/v1/sandboxes/{sid}/exec", endpoint(exec_), methods=["POST"]),
        Route("/v1/sandboxes/{sid}/files", endpoint(put_files), methods=["PUT"]),
        Route("/v1/sandboxes/{sid}/files", endpoint(get_files), methods=["GET"]),
        Route("/v1/sandboxes/{sid}/processes", endpoint(processes), methods=["GET"]),
        Route("/v1/sandboxes/{sid}", endpoint(delete), methods=["DELETE"]),
        *_session_routes(manager, endpoint, body, max_request_bytes),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


def _session_routes(manager: SandboxManager, endpoint, body, max_request_bytes: int) -> list:
    """The terminal-session routes of `build_app` (the module doc lists them); ``endpoint``
    and ``body`` are build_app's (auth, error mapping, body caps). Each operation runs in a
    worker thread with the sandbox marked busy (not reaped), beside its execs: the session
    has its own locks, so a long wait blocks neither an exec nor a C-c sent to stop it."""
    # the web framework, imported here: only the bridge server process needs it
    from starlette.concurrency import run_in_threadpool
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    limits = manager.limits
    small = min(max_request_bytes, MAX_SESSION_BODY_BYTES)
    large = min(max_request_bytes, MAX_EXEC_BODY_BYTES)

    async def fields(request, limit: int, what: str, empty_ok: bool = False) -> dict:
        parse_query(request.query_params, {})
        return parse_json_object(await body(request, limit), what, empty_ok=empty_ok)

    async def on_entry(request, owner: str, fn, *args):
        e = manager.acquire(owner, parse_sid(request.path_params["sid"]))
        try:
            return await run_in_threadpool(fn, e, *args)
        finally:
            manager.release(e)

    async def on_session(request, owner: str, fn):
        return await on_entry(request, owner, lambda e: fn(manager.session_of(e)))

    async def open_(request, owner: str):
        lifetime_s = parse_session_open(await fields(request, small, "session", True), limits)
        await on_entry(request, owner, manager.open_session, lifetime_s)
        return JSONResponse({}, status_code=201)

    async def status(request, owner: str):
        parse_query(request.query_params, {})

        def state(e: _Entry) -> dict[str, bool]:
            s = e.session
            return {"open": s is not None, "alive": s is not None and s.alive}
        return JSONResponse(await on_entry(request, owner, state))

    async def send(request, owner: str):
        keystrokes = parse_send(await fields(request, large, "send"))
        await on_session(request, owner, lambda s: s.send(keystrokes))
        return JSONResponse({})

    async def wait(request, owner: str):
        kw = parse_wait(await fields(request, small, "wait"), limits)
        done, alive = await on_session(request, owner, lambda s: (s.wait(**kw), s.alive))
        return JSONResponse({"done": done, "alive": alive})

    async def read(request, owner: str):
        _check_fields(await fields(request, small, "read", True), (), "read")
        return JSONResponse((await on_session(request, owner, lambda s: s.read())).to_json())

    async def run(request, owner: str):
        kw = parse_run(await fields(request, large, "run"), limits)
        out = await on_session(request, owner, lambda s: s.run(**kw))
        manager.metrics["session_runs"] += 1
        manager.metrics["session_run_timeouts"] += int(not out.done)
        manager.metrics["session_run_seconds_sum"] += out.duration_s
        return JSONResponse(out.to_json())

    async def close(request, owner: str):
        parse_query(request.query_params, {})
        await on_entry(request, owner, manager.close_session)
        return JSONResponse({})

    base = "/v1/sandboxes/{sid}/session"
    return [
        Route(base, endpoint(open_), methods=["POST"]),
        Route(base, endpoint(status), methods=["GET"]),
        Route(base, endpoint(close), methods=["DELETE"]),
        Route(base + "/send", endpoint(send), methods=["POST"]),
        Route(base + "/wait", endpoint(wait), methods=["POST"]),
        Route(base + "/read", endpoint(read), methods=["POST"]),
        Route(base + "/run", endpoint(run), methods=["POST"]),
    ]


class _TooLarge(Exception):
    pass


_FLAG_TYPES = {"int": int, "float": float}


def _add_limit_flags(p: argparse.ArgumentParser) -> None:
    """One flag per ServerLimits field (``--max-memory-mb``, ``--allow-network``, ...)."""
    g = p.add_argument_group("what a client may ask for (ServerLimits; above a maximum: 400)")
    defaults = ServerLimits()
    for f in dataclasses.fields(ServerLimits):
        flag = "--" + f.name.replace("_", "-")
        if f.type == "bool":
            g.add_argument(flag, action="store_true", help=f.metadata["doc"])
        else:
            g.add_argument(flag, type=_FLAG_TYPES[f.type], default=getattr(defaults, f.name),
                           help=f.metadata["doc"] + " (default: %(default)s)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m terminal_rsi.sandbox.serve")
    p.add_argument("--backend", default="local",
                   choices=["local", "local-bwrap", "local-plain", "docker"])
    p.add_argument("--allow-plain", action="store_true",
                   help="serve plain subprocesses (local-plain, or local without bubblewrap): "
                        "the weaker mode, refused without this flag")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8765, help="0 picks a free port (see --port-file)")
    p.add_argument("--token-file", required=True, help="mode 600: one token or name:token a line")
    p.add_argument("--max-sandboxes", type=int, default=64)
    p.add_argument("--ttl", type=float, default=900.0, help="idle seconds before reaping")
    p.add_argument("--max-request-mb", type=float, default=64.0)
    p.add_argument("--warm", type=int, default=0, help="docker: warm containers to keep")
    p.add_argument("--base-dir", default=None, help="local: where workspaces live")
    p.add_argument("--port-file", default=None, help="write the bound port here (atomic)")
    p.add_argument("--log-level", default="warning")
    _add_limit_flags(p)
    args = p.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")

    try:
        tokens = read_tokens(args.token_file)
        limits = ServerLimits(**{f.name: getattr(args, f.name)
                                 for f in dataclasses.fields(ServerLimits)})
        manager = SandboxManager(args.backend, args.max_sandboxes, args.ttl, args.base_dir,
                                 args.warm, limits=limits, allow_plain=args.allow_plain)
    except SandboxError as e:
        p.exit(2, f"{p.prog}: error: {e}\n")
    if manager.plain:
        log.warning("--allow-plain: serving %s; %s", args.backend, PLAIN_MODE_NOTE)

    import uvicorn  # the HTTP server engine: only the bridge server process needs it

    app = build_app(manager, tokens, int(args.max_request_mb * (1 << 20)))
    sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    port = sock.getsockname()[1]
    if args.port_file:
        tmp = args.port_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(str(port))
        os.replace(tmp, args.port_file)
    config = uvicorn.Config(app, log_level=args.log_level, timeout_graceful_shutdown=5,
                            lifespan="on", access_log=False)
    server = uvicorn.Server(config)
    signal.signal(signal.SIGHUP, lambda *_: setattr(server, "should_exit", True))
    try:
        server.run(sockets=[sock])
    finally:
        manager.shutdown()  # idempotent; covers a lifespan that never ran
    return 0


if __name__ == "__main__":
    sys.exit(main())
