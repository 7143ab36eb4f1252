"""HTTP bridge server: sandboxes on this host for trainers on other hosts.

    python -m terminal_rsi.sandbox.serve --backend=local|local-bwrap|local-plain|docker \\
        --host 127.0.0.1 --port 8765 --token-file /etc/trsi/tokens [--max-sandboxes 64] \\
        [--ttl 900] [--max-request-mb 64] [--warm 0] [--port-file PATH]

Built on Starlette + uvicorn. API (JSON unless noted, every call needs
``Authorization: Bearer <token>``; ``X-Trsi-Client`` names the client
instance, and a sandbox belongs to the (token, client) pair that created it):

=======  ===============================  ===========================================
POST     /v1/sandboxes                    {"spec": SandboxSpec.to_json()} -> {"id"}
POST     /v1/sandboxes/{id}/exec          {"command", "timeout", "env", "cwd"} -> ExecResult
PUT      /v1/sandboxes/{id}/files?dest=   body: tar stream -> {}
GET      /v1/sandboxes/{id}/files?path=   -> tar stream (application/x-tar)
DELETE   /v1/sandboxes/{id}               -> {} (idempotent)
GET      /v1/health                       -> {"ok", "backend", "sandboxes", "capacity"}
GET      /v1/metrics                      -> counters (JSON)
=======  ===============================  ===========================================

Errors: ``{"error": {"kind", "message"}}`` with 400/413 bad_request, 401
unauthorized, 410 lost (unknown, reaped, or another client's sandbox), 503 busy
(``Retry-After``; the concurrent-sandbox cap is reached), 502 infrastructure.
Idle sandboxes are reaped after ``--ttl`` seconds; shutdown (SIGTERM/SIGINT)
destroys every sandbox the server made.

The token file holds one token per line, optionally ``name:token``.
"""

from __future__ import annotations

import argparse
import dataclasses
import hmac
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections import Counter

from terminal_rsi.sandbox.base import Sandbox, SandboxSpec, safe_relpath
from terminal_rsi.sandbox.errors import (
    BadRequest,
    InfrastructureError,
    SandboxBusy,
    SandboxError,
    SandboxLost,
)

log = logging.getLogger(__name__)


def read_tokens(path: str) -> dict[str, str]:
    """token -> client name, from a token file (one token or name:token per line)."""
    tokens: dict[str, str] = {}
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, _, tok = line.rpartition(":")
            tokens[tok] = name or f"token{i}"
    if not tokens or any(len(t) < 16 for t in tokens):
        raise BadRequest(f"token file {path} must hold tokens of >= 16 characters")
    return tokens


@dataclasses.dataclass
class _Entry:
    sandbox: Sandbox
    owner: str
    last_used: float
    busy: int = 0


class SandboxManager:
    """Owns the sandboxes of one server: cap, ownership, TTL reaping, shutdown."""

    def __init__(self, backend: str = "local", max_sandboxes: int = 64, ttl_s: float = 900.0,
                 base_dir: str | None = None, warm: int = 0):
        from terminal_rsi.sandbox import BACKENDS

        if backend not in BACKENDS:
            raise BadRequest(f"unknown backend {backend!r}; choose one of {BACKENDS}")
        self.backend = backend
        self.max_sandboxes = max_sandboxes
        self.ttl_s = ttl_s
        self.base_dir = base_dir
        self._docker = None
        if backend == "docker":
            from terminal_rsi.sandbox.docker_backend import DockerBackend

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
        """Remove workspaces a killed predecessor left in ``base_dir`` (its own dir)."""
        import glob
        import shutil
        import subprocess

        os.makedirs(base_dir, exist_ok=True)
        for d in glob.glob(os.path.join(base_dir, "trsi-sb-*")):
            subprocess.run(["umount", "-l", d], capture_output=True)
            shutil.rmtree(d, ignore_errors=True)
            log.warning("removed stale workspace %s", d)

    def create(self, owner: str, spec: SandboxSpec) -> str:
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
                from terminal_rsi.sandbox import open_sandbox

                sb = open_sandbox(spec, backend=self.backend, base_dir=self.base_dir)
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
        e.sandbox.close()
        self.metrics["sandboxes_deleted"] += 1

    def reap(self) -> int:
        now = time.monotonic()
        with self._lock:
            idle = [sid for sid, e in self._entries.items()
                    if e.busy == 0 and now - e.last_used > self.ttl_s]
            victims = [self._entries.pop(sid) for sid in idle]
        for e in victims:
            e.sandbox.close()
        self.metrics["sandboxes_reaped"] += len(victims)
        return len(victims)

    def active(self) -> int:
        with self._lock:
            return len(self._entries)

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
            victims = list(self._entries.values())
            self._entries.clear()
        for e in victims:
            try:
                e.sandbox.close()
            except Exception as ex:  # noqa: BLE001
                log.warning("closing %s at shutdown: %s", e.sandbox.id, ex)
        if self._docker is not None:
            self._docker.close()


_STATUS = {"bad_request": 400, "lost": 410, "busy": 503, "infrastructure": 502,
           "command_timeout": 400, "sandbox_error": 500}


def build_app(manager: SandboxManager, tokens: dict[str, str], max_request_bytes: int = 64 << 20,
              reap_interval_s: float | None = None):
    """The Starlette application (also used in-process by tests)."""
    import anyio.to_thread
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    token_bytes = {t.encode(): name for t, name in tokens.items()}
    stop = threading.Event()

    def error(kind: str, message: str, status: int | None = None, **headers) -> JSONResponse:
        manager.metrics[f"errors_{kind}"] += 1
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
        if cl is not None and cl.isdigit() and int(cl) > limit:
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
            except json.JSONDecodeError as e:
                return error("bad_request", f"body is not JSON: {e}")
            except Exception as e:  # noqa: BLE001
                log.exception("internal error")
                return error("infrastructure", f"internal error: {type(e).__name__}: {e}", 500)
        return handler

    async def health(request: Request, owner: str):
        return JSONResponse({"ok": True, "backend": manager.backend,
                             "sandboxes": manager.active(), "capacity": manager.max_sandboxes})

    async def metrics(request: Request, owner: str):
        m = dict(manager.metrics)
        m["sandboxes_active"] = manager.active()
        return JSONResponse(m)

    async def create(request: Request, owner: str):
        data = json.loads(await body(request, max_request_bytes) or b"{}")
        spec = SandboxSpec.from_json(data.get("spec", {}))
        sid = await run_in_threadpool(manager.create, owner, spec)
        return JSONResponse({"id": sid}, status_code=201)

    async def with_sandbox(owner: str, sid: str, fn, *args):
        e = manager.acquire(owner, sid)
        try:
            return await run_in_threadpool(fn, e.sandbox, *args)
        finally:
            manager.release(e)

    async def exec_(request: Request, owner: str):
        data = json.loads(await body(request, max_request_bytes))
        if not isinstance(data, dict) or not isinstance(data.get("command"), str):
            raise BadRequest("exec needs a JSON object with a string 'command'")
        timeout = data.get("timeout", 60.0)
        env, cwd = data.get("env"), data.get("cwd")
        if env is not None and not isinstance(env, dict):
            raise BadRequest("env must be an object of strings")

        def run(sb: Sandbox):
            return sb.exec(data["command"], timeout=timeout, env=env, cwd=cwd)

        t0 = time.monotonic()
        res = await with_sandbox(owner, request.path_params["sid"], run)
        manager.metrics["execs"] += 1
        manager.metrics["exec_timeouts"] += int(res.timed_out)
        manager.metrics["exec_seconds_sum"] += time.monotonic() - t0
        return JSONResponse(res.to_json())

    async def put_files(request: Request, owner: str):
        dest = safe_relpath(request.query_params.get("dest", "."))
        data = await body(request, max_request_bytes)
        await with_sandbox(owner, request.path_params["sid"],
                           lambda sb: sb.put_tar(data, dest))
        return JSONResponse({})

    async def get_files(request: Request, owner: str):
        path = safe_relpath(request.query_params.get("path", "."))
        try:
            max_bytes = min(int(request.query_params.get("max_bytes", max_request_bytes)),
                            max_request_bytes)
        except ValueError as e:
            raise BadRequest("max_bytes must be an integer") from e
        data = await with_sandbox(owner, request.path_params["sid"],
                                  lambda sb: sb.get_tar(path, max_bytes=max_bytes))
        return Response(data, media_type="application/x-tar")

    async def delete(request: Request, owner: str):
        await run_in_threadpool(manager.delete, owner, request.path_params["sid"])
        return JSONResponse({})

    def reaper():
        interval = reap_interval_s or max(0.5, min(30.0, manager.ttl_s / 4))
        while not stop.wait(interval):
            try:
                manager.reap()
            except Exception:  # noqa: BLE001
                log.exception("reaper")

    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app):
        limiter = anyio.to_thread.current_default_thread_limiter()
        limiter.total_tokens = max(limiter.total_tokens, 2 * manager.max_sandboxes + 8)
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
        Route("/v1/sandboxes/{sid}", endpoint(delete), methods=["DELETE"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


class _TooLarge(Exception):
    pass


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m terminal_rsi.sandbox.serve")
    p.add_argument("--backend", default="local",
                   choices=["local", "local-bwrap", "local-plain", "docker"])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8765, help="0 picks a free port (see --port-file)")
    p.add_argument("--token-file", required=True)
    p.add_argument("--max-sandboxes", type=int, default=64)
    p.add_argument("--ttl", type=float, default=900.0, help="idle seconds before reaping")
    p.add_argument("--max-request-mb", type=float, default=64.0)
    p.add_argument("--warm", type=int, default=0, help="docker: warm containers to keep")
    p.add_argument("--base-dir", default=None, help="local: where workspaces live")
    p.add_argument("--port-file", default=None, help="write the bound port here (atomic)")
    p.add_argument("--log-level", default="warning")
    args = p.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")

    import uvicorn

    tokens = read_tokens(args.token_file)
    manager = SandboxManager(args.backend, args.max_sandboxes, args.ttl, args.base_dir,
                             args.warm)
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
