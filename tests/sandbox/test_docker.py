"""Docker backend against the real engine: container hardening, warm pool, task images."""

from __future__ import annotations

import time

import pytest

from terminal_rsi.sandbox import SandboxLost, SandboxSpec

from .conftest import need_docker_image


@pytest.fixture(scope="module")
def client():
    need_docker_image()
    from terminal_rsi.sandbox.docker_backend import docker_client

    return docker_client()


def test_container_is_hardened(client):
    from terminal_rsi.sandbox.docker_backend import DockerSandbox

    spec = SandboxSpec(memory_mb=128, cpus=0.5, pids=32, disk_mb=16)
    with DockerSandbox(spec, client=client) as sb:
        hc = client.api.inspect_container(sb.container_id)["HostConfig"]
        cfg = client.api.inspect_container(sb.container_id)["Config"]
        assert hc["NetworkMode"] == "none"
        assert hc["Memory"] == 128 << 20 and hc["MemorySwap"] == 128 << 20
        assert hc["NanoCpus"] == 500_000_000 and hc["PidsLimit"] == 32
        assert hc["CapDrop"] == ["ALL"] and not hc["Privileged"]
        assert "no-new-privileges" in hc["SecurityOpt"] and hc["ReadonlyRootfs"]
        assert cfg["User"] == "1000:1000"
        r = sb.exec("id -u; touch /etc/x 2>&1; touch /usr/x 2>&1; touch /workspace/ok && "
                    "echo ws-ok; df -m /workspace | tail -1", timeout=10)
        lines = r.stdout.splitlines()
        assert lines[0] == "1000"
        assert "Read-only file system" in lines[1] and "Read-only file system" in lines[2]
        assert lines[3] == "ws-ok"
        assert int(lines[4].split()[1]) <= 16
        r = sb.exec("python3 -c 'import pytest; print(pytest.__version__)' && "
                    "python3 -m pytest --help | grep -c -- --ctrf", timeout=30)
        assert r.exit_code == 0, r.stderr


def test_ctrf_report_from_pytest(client):
    from terminal_rsi.sandbox.docker_backend import DockerSandbox

    files = {"tests/test_x.py": b"def test_ok():\n    assert 1\n\ndef test_bad():\n    assert 0\n"}
    with DockerSandbox(SandboxSpec(files=files), client=client) as sb:
        r = sb.exec("python3 -m pytest -q tests --ctrf report.json", timeout=60)
        assert r.exit_code == 1, r.stdout + r.stderr
        import json

        summary = json.loads(sb.get_file("report.json"))["results"]["summary"]
        assert (summary["passed"], summary["failed"]) == (1, 1)


def test_warm_pool_hands_out_started_containers(client):
    from terminal_rsi.sandbox.docker_backend import DockerBackend

    spec = SandboxSpec(memory_mb=128)
    backend = DockerBackend(client=client, warm=2, warm_spec=spec)
    try:
        deadline = time.monotonic() + 60
        while backend.pool.ready() < 2:
            assert time.monotonic() < deadline, "warm pool never filled"
            time.sleep(0.1)
        warm_ids = {c.id for c in list(backend.pool._q.queue)}
        sb = backend.open(SandboxSpec(memory_mb=128, files={"f": b"x"}, env={"A": "1"}))
        assert sb.container_id in warm_ids
        assert sb.exec("cat f; echo $A", timeout=10).stdout == "x1\n"
        other = backend.open(SandboxSpec(memory_mb=64))  # different shape: created cold
        assert other.container_id not in warm_ids
        sb.close()
        other.close()
        deadline = time.monotonic() + 60
        while backend.pool.ready() < 2:  # refilled
            assert time.monotonic() < deadline, "warm pool never refilled"
            time.sleep(0.1)
    finally:
        backend.close()
    from terminal_rsi.sandbox.docker_backend import LABEL

    mine = [c for c in client.containers.list(all=True, filters={"label": LABEL})
            if c.labels.get(LABEL, "").startswith("warm-")]
    assert mine == []


def test_container_killed_underneath_is_lost(client):
    from terminal_rsi.sandbox.docker_backend import DockerSandbox

    sb = DockerSandbox(SandboxSpec(), client=client)
    client.api.remove_container(sb.container_id, force=True)
    with pytest.raises(SandboxLost):
        sb.exec("true", timeout=5)
    sb.close()


def test_task_image_builds_on_default(client, tmp_path):
    from terminal_rsi.sandbox.docker_backend import DockerSandbox
    from terminal_rsi.sandbox.image import DEFAULT_IMAGE, build_task_image

    (tmp_path / "Dockerfile").write_text(
        f"FROM {DEFAULT_IMAGE}\nCOPY data.txt /opt/task/data.txt\n")
    (tmp_path / "data.txt").write_text("task data\n")
    tag = "trsi-test-task:latest"
    build_task_image(str(tmp_path), tag)
    try:
        with DockerSandbox(SandboxSpec(image=tag), client=client) as sb:
            r = sb.exec("cat /opt/task/data.txt; id -un", timeout=10)
            assert r.stdout == "task data\nsandbox\n"
    finally:
        client.images.remove(tag, force=True)


def test_bridge_in_front_of_docker(client, tmp_path):
    import signal

    from terminal_rsi.sandbox import open_sandbox
    from terminal_rsi.sandbox.docker_backend import LABEL

    from .conftest import BridgeServer

    srv = BridgeServer(str(tmp_path), backend="docker")
    try:
        sbs = [open_sandbox(SandboxSpec(files={"f": b"via bridge"}), backend=srv.url,
                            token=srv.token) for _ in range(2)]
        for sb in sbs:
            assert sb.exec("cat f; id -u", timeout=10).stdout == "via bridge1000\n"
        ids = {c.labels[LABEL] for c in client.containers.list(filters={"label": LABEL})}
        assert {sb.id for sb in sbs} <= ids
    finally:
        srv.stop(signal.SIGTERM)
    left = client.containers.list(all=True, filters={"label": LABEL})
    assert not [c for c in left if c.labels[LABEL] in {sb.id for sb in sbs}]
