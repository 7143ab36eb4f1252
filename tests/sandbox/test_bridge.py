"""The HTTP bridge over real loopback HTTP: auth, ownership, limits, TTL, cap, shutdown."""

from __future__ import annotations

import glob
import signal

import httpx
import pytest

from terminal_rsi.sandbox import (
    BadRequest,
    InfrastructureError,
    SandboxBusy,
    SandboxLost,
    SandboxSpec,
    open_sandbox,
)
from terminal_rsi.sandbox.base import files_to_tar
from terminal_rsi.sandbox.procs import pids_with_env
from terminal_rsi.sandbox.remote import BridgeClient, RemoteSandbox

from .conftest import BridgeServer, assert_no_leftovers, need_bwrap


@pytest.fixture
def server(tmp_path, request):
    need_bwrap()
    opts = getattr(request, "param", {})
    srv = BridgeServer(str(tmp_path), backend="local-bwrap", **opts)
    yield srv
    srv.stop()


def test_token_required_on_every_call(server):
    for method, path in [("GET", "/v1/health"), ("GET", "/v1/metrics"),
                         ("POST", "/v1/sandboxes"), ("POST", "/v1/sandboxes/x/exec"),
                         ("DELETE", "/v1/sandboxes/x")]:
        r = httpx.request(method, server.url + path)
        assert r.status_code == 401
        r = httpx.request(method, server.url + path, headers={"Authorization": "Bearer nope"})
        assert r.status_code == 401
    with pytest.raises(BadRequest, match="token"):
        BridgeClient(server.url, token="wrong-token-0123456789").health()


def test_sandbox_belongs_to_its_client(server):
    sb = RemoteSandbox.create(server.url, SandboxSpec(), token=server.token)
    other = BridgeClient(server.url, token=server.token)  # same token, other client id
    r = other._http.post(f"/v1/sandboxes/{sb.id}/exec", json={"command": "id"})
    assert r.status_code == 410 and r.json()["error"]["kind"] == "lost"
    other._http.delete(f"/v1/sandboxes/{sb.id}")  # no effect on someone else's sandbox
    assert sb.exec("echo mine", timeout=5).stdout == "mine\n"
    sb.close()
    other.close()


@pytest.mark.parametrize("server", [{"max_request_mb": 0.05}], indirect=True)
def test_request_and_upload_size_limits(server):
    with RemoteSandbox.create(server.url, SandboxSpec(), token=server.token) as sb:
        with pytest.raises(BadRequest, match="limit"):
            sb.put_tar(files_to_tar({"big.bin": b"x" * 100_000}))
        with pytest.raises(BadRequest, match="limit"):
            sb.exec("echo " + "a" * 100_000, timeout=5)
        sb.put_files({"small.txt": b"ok"})
        assert sb.get_file("small.txt") == b"ok"


def test_bad_requests_are_typed(server):
    c = BridgeClient(server.url, token=server.token)
    with pytest.raises(BadRequest):
        c.request("POST", "/v1/sandboxes", json={"spec": {"memory_mb": -1}})
    with pytest.raises(BadRequest):
        c.request("POST", "/v1/sandboxes", content=b"{not json")
    with RemoteSandbox.create(c, SandboxSpec()) as sb:
        with pytest.raises(BadRequest):
            c.request("GET", f"/v1/sandboxes/{sb.id}/files", params={"path": "../../etc"})
        with pytest.raises(BadRequest):
            c.request("PUT", f"/v1/sandboxes/{sb.id}/files", content=b"garbage" * 200)
    c.close()


@pytest.mark.parametrize("server", [{"ttl": 0.5}], indirect=True)
def test_idle_sandboxes_are_reaped(server):
    import time

    sb = RemoteSandbox.create(server.url, SandboxSpec(), token=server.token)
    assert sb.exec("sleep 1.5; echo busy-not-idle", timeout=5).stdout == "busy-not-idle\n"
    deadline = time.monotonic() + 20
    while server.client.metrics().get("sandboxes_reaped", 0) < 1:
        assert time.monotonic() < deadline, "idle sandbox was not reaped"
        time.sleep(0.1)
    with pytest.raises(SandboxLost):
        sb.exec("true", timeout=5)
    sb.close()
    assert_no_leftovers(sb.id)


@pytest.mark.parametrize("server", [{"max_sandboxes": 2}], indirect=True)
def test_concurrency_cap_is_retryable_busy(server):
    a = RemoteSandbox.create(server.url, SandboxSpec(), token=server.token)
    b = RemoteSandbox.create(server.url, SandboxSpec(), token=server.token)
    with pytest.raises(SandboxBusy) as ei:
        RemoteSandbox.create(server.url, SandboxSpec(), token=server.token)
    assert ei.value.retryable
    a.close()
    c = RemoteSandbox.create(server.url, SandboxSpec(), token=server.token)
    assert server.client.health()["sandboxes"] == 2
    b.close()
    c.close()
    assert server.client.metrics()["busy_rejections"] == 1


def test_shutdown_destroys_every_sandbox(server):
    sbs = [open_sandbox(SandboxSpec(), backend=server.url, token=server.token) for _ in range(3)]
    for sb in sbs:
        sb.exec("echo hi > f", timeout=5)
    assert glob.glob(f"/tmp/trsi-sb-{sbs[0].id}-*")
    assert server.stop(signal.SIGTERM) in (0, -signal.SIGTERM)  # uvicorn re-raises it
    for sb in sbs:
        assert_no_leftovers(sb.id)
        assert not pids_with_env(f"TRSI_SANDBOX={sb.id}".encode())
        with pytest.raises(InfrastructureError):
            sb.exec("true", timeout=5)
        sb.close()  # the server is gone: close still returns


def test_exec_in_flight_when_server_stops(server):
    import threading

    sb = open_sandbox(SandboxSpec(), backend=server.url, token=server.token)
    errors = []

    def run():
        try:
            sb.exec("sleep 20", timeout=30)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    import time

    time.sleep(0.5)
    server.stop(signal.SIGTERM)
    t.join(timeout=60)
    assert not t.is_alive()
    assert errors and isinstance(errors[0], InfrastructureError)
    assert_no_leftovers(sb.id)
    sb.close()


def test_health_and_metrics(server):
    h = server.client.health()
    assert h["ok"] and h["backend"] == "local-bwrap" and h["plain"] is False
    assert h["limits"]["max_timeout_s"] == 3600 and h["limits"]["allow_network"] is False
    with open_sandbox(SandboxSpec(), backend=server.url, token=server.token) as sb:
        sb.exec("sleep 2", timeout=0.5)
    m = server.client.metrics()
    assert m["execs"] == 1 and m["exec_timeouts"] == 1 and m["sandboxes_active"] == 0
