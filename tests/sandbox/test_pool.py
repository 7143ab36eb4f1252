"""SandboxPool over two real bridge servers (and a local endpoint); one is killed mid-run."""

from __future__ import annotations

import glob
import os
import secrets
import shutil
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from terminal_rsi.sandbox import (
    BadRequest,
    InfrastructureError,
    SandboxError,
    SandboxLost,
    SandboxSpec,
)
from terminal_rsi.sandbox.pool import SandboxPool
from terminal_rsi.sandbox.procs import pids_with_env

from .conftest import BridgeServer, assert_no_leftovers, need_bwrap


def _episode(pool, i, started_on, restarts, ids):
    """One rollout-like episode; restarts in a new sandbox on infrastructure/lost errors."""
    for _attempt in range(5):
        try:
            with pool.open(SandboxSpec(files={"in.txt": f"task {i}".encode()})) as sb:
                ids.append(sb.id)
                started_on.append(sb.endpoint.target)
                r = sb.exec("cat in.txt; sleep 0.4; echo done > out.txt", timeout=10)
                assert r.exit_code == 0 and r.stdout == f"task {i}"
                return sb.get_file("out.txt")
        except (InfrastructureError, SandboxLost):
            restarts.append(i)
    raise AssertionError(f"episode {i} never finished")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_work_continues_when_a_server_dies(tmp_path, sig):
    need_bwrap()
    token = secrets.token_hex(16)
    base_a = f"/tmp/trsi-test-{token[:8]}"  # sandbox uids must traverse it (o+x)
    a = BridgeServer(str(tmp_path), token=token, base_dir=base_a)
    os.makedirs(tmp_path / "b")
    b = BridgeServer(str(tmp_path / "b"), token=token)
    pool = SandboxPool([a.url, b.url], max_concurrent=4, token=token, backoff_s=0.05,
                       cooldown_s=60)
    started_on, restarts, ids, results = [], [], [], []
    n = 16
    victim = pool.open()  # a tie goes to the first endpoint: A; it is mid-exec at the kill
    assert victim.endpoint.target == a.url
    ids.append(victim.id)
    victim_err = []

    def run_victim():
        try:
            victim.exec("sleep 60", timeout=90)
        except Exception as e:  # noqa: BLE001
            victim_err.append(e)

    th = threading.Thread(target=run_victim)
    th.start()
    try:
        with ThreadPoolExecutor(4) as ex:
            futs = [ex.submit(_episode, pool, i, started_on, restarts, ids) for i in range(n)]
            while sum(f.done() for f in futs) < 3:
                time.sleep(0.02)
            a.stop(sig)  # mid-run: episodes on A fail and restart on B
            results = [f.result(timeout=120) for f in futs]
        th.join(timeout=60)
        assert not th.is_alive() and len(victim_err) == 1
        assert isinstance(victim_err[0], InfrastructureError), victim_err
        victim.close()
        assert results == [b"done\n"] * n
        late = started_on[-4:]
        assert all(t == b.url for t in late), "new sandboxes still went to the dead server"
        assert pool.stats() == {a.url: 0, b.url: 0}
        assert b.client.metrics()["sandboxes_active"] == 0
    finally:
        pool.close()
        b.stop()
        a.stop()
        # A restarted server clears the workspaces its killed predecessor left in base_dir.
        os.makedirs(tmp_path / "a2")
        BridgeServer(str(tmp_path / "a2"), token=token, base_dir=base_a).stop()
        left = glob.glob(os.path.join(base_a, "trsi-sb-*"))
        shutil.rmtree(base_a, ignore_errors=True)
    assert not left
    for sid in ids:  # no process left, whichever server ran it (killing takes a moment)
        t_end = time.monotonic() + 5
        while pids_with_env(f"TRSI_SANDBOX={sid}".encode()) and time.monotonic() < t_end:
            time.sleep(0.05)
        assert not pids_with_env(f"TRSI_SANDBOX={sid}".encode()), sid
        if sig == signal.SIGTERM:
            assert_no_leftovers(sid)


def test_retries_only_infrastructure_errors(tmp_path):
    need_bwrap()
    token = secrets.token_hex(16)
    srv = BridgeServer(str(tmp_path), token=token)
    dead = "http://127.0.0.1:9"  # connection refused: infrastructure
    pool = SandboxPool([dead, srv.url], max_concurrent=2, token=token, backoff_s=0.01)
    try:
        with pool.open() as sb:  # the dead endpoint is skipped after one failure
            assert sb.endpoint.target == srv.url
            assert sb.exec("echo ok", timeout=5).stdout == "ok\n"
        assert pool.endpoints[0].failures == 1
        before = srv.client.metrics().get("errors_bad_request", 0)
        with pytest.raises(BadRequest):  # the caller's fault: raised at once, no retry
            pool.open(SandboxSpec(image="x", memory_mb=1, files={"../escape": b""}))
        with pytest.raises(BadRequest):
            with pool.open() as sb:
                sb.exec("true", timeout=5, cwd="/abs")
        assert srv.client.metrics().get("errors_bad_request", 0) - before <= 1
        assert pool.health() == {dead: False, srv.url: True}
    finally:
        pool.close()
        srv.stop()


def test_bad_requests_never_mark_a_host_down(tmp_path, monkeypatch):
    """The caller's mistakes, refused by the server (4xx) or before it, leave the host up."""
    need_bwrap()
    from terminal_rsi.sandbox import remote

    token = secrets.token_hex(16)
    srv = BridgeServer(str(tmp_path), token=token)
    pool = SandboxPool([srv.url, "local-bwrap"], max_concurrent=2, token=token,
                       backoff_s=0.01, cooldown_s=60)
    try:
        for spec, field in [(SandboxSpec(disk_mb=8192), "spec.disk_mb"),  # above its maxima
                            (SandboxSpec(network=True), "spec.network")]:
            with pytest.raises(BadRequest, match=field):
                pool.open(spec)
        # Let bad input through the client's own checks, so that the server must refuse it.
        monkeypatch.setattr(remote, "check_exec_args", lambda *a, **k: None)
        monkeypatch.setattr(remote, "safe_relpath", lambda p: p)
        with pool.open() as sb:
            assert sb.endpoint.target == srv.url
            for kw, field in [({"command": "echo a\0b"}, "exec.command"),
                              ({"command": "true", "env": {"A": "\0"}}, "exec.env"),
                              ({"command": "true", "cwd": "a\0b"}, "exec.cwd"),
                              ({"command": "true", "cwd": "/etc"}, "exec.cwd"),
                              ({"command": "x" * 200_000}, "exec.command"),
                              ({"command": "true", "timeout": 7200}, "exec.timeout"),
                              ({"command": "true", "timeout": -1}, "exec.timeout")]:
                with pytest.raises(BadRequest, match=field):
                    sb.exec(**{"timeout": 5, **kw})
            with pytest.raises(BadRequest, match="path"):
                sb.get_tar("a\0b")
            with pytest.raises(BadRequest, match="dest"):
                sb.put_tar(b"", "../x")
            with pytest.raises(BadRequest, match="tar"):
                sb.put_tar(b"garbage" * 200)
            assert sb.exec("echo still-fine", timeout=5).stdout == "still-fine\n"
        assert pool.up() == {srv.url: True, "local-bwrap": True}
        assert [ep.failures for ep in pool.endpoints] == [0, 0]
        with pool.open() as sb:  # a tie goes to the first endpoint: it was never marked down
            assert sb.endpoint.target == srv.url
        m = srv.client.metrics()
        assert m["errors_bad_request"] >= 12 and m.get("errors_infrastructure", 0) == 0
    finally:
        pool.close()
        srv.stop()


def test_a_failed_call_on_a_healthy_host_keeps_it_up(tmp_path):
    """An infrastructure error of one sandbox marks its endpoint down only if the endpoint
    fails its health check too; a dead server is marked down."""
    need_bwrap()
    token = secrets.token_hex(16)
    srv = BridgeServer(str(tmp_path), token=token)
    pool = SandboxPool([srv.url], max_concurrent=2, token=token, cooldown_s=60)
    try:
        with pool.open() as sb:
            def broken(*a, **k):
                raise InfrastructureError("this sandbox's engine hiccuped")

            sb.inner.exec = broken
            with pytest.raises(InfrastructureError):
                sb.exec("true", timeout=5)
        assert pool.up() == {srv.url: True}
        sb = pool.open()
        srv.stop()
        with pytest.raises(InfrastructureError):
            sb.exec("true", timeout=5)
        assert pool.up() == {srv.url: False}
        sb.close()
    finally:
        pool.close()
        srv.stop()


def test_all_endpoints_down_is_a_typed_error():
    pool = SandboxPool(["http://127.0.0.1:9"], token="x" * 32, retries=3, backoff_s=0.01)
    with pytest.raises(InfrastructureError) as ei:
        pool.open()
    assert ei.value.retryable and "3 attempts" in str(ei.value)
    assert pool.stats() == {"http://127.0.0.1:9": 0}
    pool.close()


def test_concurrency_limit_and_local_endpoint():
    need_bwrap()
    pool = SandboxPool(["local-bwrap"], max_concurrent=2)
    peak, live, lock = [0], [0], threading.Lock()

    def work(i):
        with pool.open() as sb:
            with lock:
                live[0] += 1
                peak[0] = max(peak[0], live[0])
            sb.exec("sleep 0.2", timeout=5)
            with lock:
                live[0] -= 1
            return sb.id

    with ThreadPoolExecutor(6) as ex:
        ids = list(ex.map(work, range(6)))
    assert peak[0] == 2
    with pytest.raises(SandboxError):
        first = pool.open()
        second = pool.open()
        try:
            pool.open(timeout=0.2)  # both slots taken
        finally:
            first.close()
            second.close()
    pool.close()
    for sid in ids:
        assert_no_leftovers(sid)
