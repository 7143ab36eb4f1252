"""Docker backend against the real engine: hardening, one set of limits, safe file
transfer, cleanup that survives a killed owner, warm pool, task images.

Sandboxes are reused within a test where that is sound (container creation costs
0.2-1 s); the file-transfer tests share one module sandbox and start from an empty
workspace, /tmp and /dev/shm.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
import signal
import subprocess
import sys
import tarfile
import textwrap
import time

import pytest

from terminal_rsi.sandbox import BadRequest, SandboxLost, SandboxSpec, procs
from terminal_rsi.sandbox.base import TarLimits

from .conftest import REPO, make_tar, mounted, sleep_secs, tar_members

MiB = 1 << 20


@pytest.fixture(scope="module")
def shared(client):
    """One sandbox for the file-transfer tests."""
    from terminal_rsi.sandbox.docker_backend import DockerSandbox

    sb = DockerSandbox(SandboxSpec(memory_mb=512, pids=64, disk_mb=256), client=client)
    yield sb
    sb.close()


@pytest.fixture
def sb(shared):
    """The module sandbox with an empty workspace, /tmp and /dev/shm."""
    r = shared.exec("find /workspace /tmp /dev/shm -mindepth 1 -delete; ls -A /workspace",
                    timeout=30)
    assert r.exit_code == 0 and r.stdout == "", r
    shared.tar_limits = TarLimits()
    return shared


def _assert_gone(client, sb) -> None:
    from terminal_rsi.sandbox.docker_backend import LABEL

    assert not client.containers.list(all=True, filters={"label": f"{LABEL}={sb.id}"})
    if sb.box.disk:
        assert not os.path.exists(sb.box.disk) and not mounted(sb.box.disk)


# ----------------------------------------------------------------------- container


def test_container_is_hardened(client):
    from terminal_rsi.sandbox.docker_backend import DockerSandbox

    spec = SandboxSpec(memory_mb=128, cpus=0.5, pids=32, disk_mb=16)
    with DockerSandbox(spec, client=client) as sb:
        info = client.api.inspect_container(sb.container_id)
        hc, cfg = info["HostConfig"], info["Config"]
        assert hc["NetworkMode"] == "none" and hc["IpcMode"] == "private"
        assert hc["Memory"] == 128 << 20 and hc["MemorySwap"] == 128 << 20
        assert hc["NanoCpus"] == 500_000_000 and hc["PidsLimit"] == 32
        assert hc["CapDrop"] == ["ALL"] and not hc["Privileged"]
        assert "no-new-privileges" in hc["SecurityOpt"] and hc["ReadonlyRootfs"]
        assert cfg["User"] == "1000:1000"
        # pid 1's stdout is writable by the sandbox user: nothing of it is logged on the host
        assert hc["LogConfig"]["Type"] == "none" and not info["LogPath"]
        if sb.box.disk:  # the three writable places are directories of one host tmpfs
            binds = {m["Destination"]: m["Source"] for m in info["Mounts"]}
            assert binds == {"/workspace": f"{sb.box.disk}/ws", "/tmp": f"{sb.box.disk}/tmp",
                             "/dev/shm": f"{sb.box.disk}/shm"}
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
    _assert_gone(client, sb)


FILL = ("for d in /workspace /tmp /dev/shm; do head -c 16M /dev/zero > $d/fill 2>/dev/null; "
        "done; du -sk /workspace/fill /tmp/fill /dev/shm/fill")


def _written_kib(r) -> dict[str, int]:
    return {line.split()[1]: int(line.split()[0]) for line in r.stdout.splitlines()}


def test_disk_quota_is_one_for_workspace_tmp_and_shm(client):
    from terminal_rsi.sandbox.docker_backend import DockerSandbox

    with DockerSandbox(SandboxSpec(memory_mb=256, disk_mb=16), client=client) as sb:
        if not sb.box.disk:
            pytest.skip("no shared tmpfs here (not root or a remote daemon): see the split test")
        written = _written_kib(sb.exec(FILL, timeout=30))
        assert sum(written.values()) <= 16 * 1024 * 1.1, written
        assert written["/workspace/fill"] >= 15 * 1024  # the first place got the whole quota
        # shared: freeing /workspace makes room in /dev/shm, and the other way round
        r = sb.exec("rm /workspace/fill /tmp/fill /dev/shm/fill; "
                    "head -c 12M /dev/zero > /dev/shm/a && echo shm-ok; "
                    "head -c 8M /dev/zero > /tmp/b 2>/dev/null || echo tmp-full; "
                    "rm /dev/shm/a; head -c 8M /dev/zero > /tmp/b && echo tmp-ok", timeout=30)
        assert r.stdout.split() == ["shm-ok", "tmp-full", "tmp-ok"], r
        r = sb.exec("for d in / /dev /var/tmp /run /home /opt /srv /sandbox; do "
                    "touch $d/trsi-w 2>/dev/null && echo W:$d; done; true", timeout=10)
        assert "W:" not in r.stdout
    _assert_gone(client, sb)


def test_disk_quota_split_without_a_shared_tmpfs(client, monkeypatch):
    from terminal_rsi.sandbox import docker_backend
    from terminal_rsi.sandbox.docker_backend import DockerSandbox

    monkeypatch.setattr(docker_backend, "_shared_disk", False)
    with DockerSandbox(SandboxSpec(memory_mb=256, disk_mb=16), client=client) as sb:
        assert sb.box.disk == ""
        assert client.api.inspect_container(sb.container_id)["HostConfig"]["IpcMode"] == \
            "private"
        written = _written_kib(sb.exec(FILL, timeout=30))
        assert sum(written.values()) <= 16 * 1024 * 1.1, written
        assert min(written.values()) > 0
        r = sb.exec("rm /workspace/fill; echo x > /workspace/f && cat f", timeout=10)
        assert r.stdout == "x\n"
    _assert_gone(client, sb)


def test_memory_bounds_the_whole_process_tree(client):
    from terminal_rsi.sandbox.docker_backend import DockerSandbox

    hold = ("import time; a = bytearray(100 << 20); a[::4096] = b'x' * len(a[::4096]); "
            "time.sleep(2.5); print('survived', flush=True)")
    with DockerSandbox(SandboxSpec(memory_mb=128, pids=64, disk_mb=16), client=client) as sb:
        r = sb.exec(f"for i in 1 2 3 4 5 6; do python3 -c \"{hold}\" & done; wait; "
                    "echo done", timeout=30)
        survivors = r.stdout.count("survived")
        assert survivors * 100 <= 128 * 1.1, r
        assert "done" in r.stdout
        # the sandbox is still usable, its memory back
        assert sb.exec(f"python3 -c \"{hold}\"", timeout=30).stdout == "survived\n"


def test_pids_limit_bounds_the_process_tree(client):
    from terminal_rsi.sandbox.docker_backend import DockerSandbox

    forks = ("import os, time\nn = 0\ntry:\n    while n < 100:\n        if os.fork() == 0:\n"
             "            time.sleep(30)\n            os._exit(0)\n        n += 1\n"
             "except OSError:\n    pass\nprint(n, flush=True)")
    with DockerSandbox(SandboxSpec(memory_mb=256, pids=32), client=client) as sb:
        r = sb.exec(f"python3 -c '{forks}'", timeout=15)
        assert 0 < int(r.stdout) < 32, r
        r = sb.exec("ps -e -o stat=,comm=", timeout=10)  # the exec's children are gone
        assert "python3" not in r.stdout and "Z" not in r.stdout, r.stdout
        # pid 1 reaped the orphans' zombies: the whole budget is usable again
        assert int(sb.exec(f"python3 -c '{forks}'", timeout=15).stdout) >= 20


def test_no_process_outlives_its_exec_even_when_the_wrapper_is_killed(sb):
    secs = sleep_secs()
    r = sb.exec(f"setsid sleep {secs} >/dev/null 2>&1 </dev/null & "
                "kill -9 $(ps -o ppid= -p $PPID); echo unreachable", timeout=10)
    assert r.exit_code == -9 and not r.timed_out
    assert procs.pids_with_cmdline(secs.encode()) == []
    assert sb.exec("echo usable", timeout=10).stdout == "usable\n"


# ----------------------------------------------------------------------- exec input


def test_bad_exec_input_never_reaches_the_engine(sb, monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a malformed exec reached the engine")

    monkeypatch.setattr(sb.client.api, "exec_create", refuse)
    for cmd in ("echo a\0b", "echo \ud800", "echo " + "x" * 200_000, b"echo bytes"):
        with pytest.raises(BadRequest):
            sb.exec(cmd, timeout=2)
    for env in ({"A": "x\0"}, {"A=B": "1"}, {"A": "y" * 300_000}, {"\ud800": "1"}, {"A": 1}):
        with pytest.raises(BadRequest):
            sb.exec("true", timeout=2, env=env)
    for t in (float("inf"), float("nan"), -1, 0, True):
        with pytest.raises(BadRequest):
            sb.exec("true", timeout=t)
    for cwd in ("a\0b", "/etc", "../.."):
        with pytest.raises(BadRequest):
            sb.exec("true", timeout=2, cwd=cwd)
    monkeypatch.undo()
    assert sb.exec("echo still-usable", timeout=10).stdout == "still-usable\n"


# ----------------------------------------------------------------------- downloads


def test_get_tar_cap_counts_the_stream_and_stops_early(sb):
    sb.exec("mkdir m && cd m && for i in $(seq 3000); do : > f$i; done; "
            "head -c 100M /dev/zero > /workspace/big", timeout=30).check()
    with pytest.raises(BadRequest, match="max_bytes"):  # 3000 headers > 1 MiB, no content
        sb.get_tar("m", max_bytes=MiB)
    with pytest.raises(BadRequest, match="max_bytes"):
        sb.get_tar(".", max_bytes=MiB)
    # the dropped exec's tar dies (SIGPIPE), not left streaming 100 MiB
    r = sb.exec("for i in $(seq 100); do [ $(ps -e -o comm= | grep -c '^tar$') = 0 ] && "
                "echo gone && break; sleep 0.1; done", timeout=30)
    assert r.stdout.strip() == "gone", r
    data = sb.get_tar("m", max_bytes=4 * MiB)
    assert len(data) <= 4 * MiB and len(tar_members(data)) == 3001


def test_get_tar_member_cap(sb):
    sb.exec("mkdir m && cd m && for i in $(seq 150); do : > f$i; done", timeout=30).check()
    sb.tar_limits = TarLimits(max_members=100)
    with pytest.raises(BadRequest, match="more than 100 entries"):
        sb.get_tar("m")
    sb.tar_limits = TarLimits(max_members=151)
    assert len(tar_members(sb.get_tar("m"))) == 151


def test_get_tar_never_follows_links(sb):
    sb.exec("mkdir d && echo in > d/f && ln -s /etc e && ln -s /etc/passwd p && "
            "ln -s d dl", timeout=10).check()
    for path in ("e/passwd", "dl/f", "p/x", "missing/x", "d/f/x"):
        with pytest.raises(BadRequest):
            sb.get_tar(path)
    with pytest.raises(BadRequest):
        sb.get_tar("missing")
    got = tar_members(sb.get_tar("p"))
    assert list(got) == ["p"] and got["p"].issym() and got["p"].linkname == "/etc/passwd"
    with pytest.raises(BadRequest):
        sb.get_file("p")  # a link, not a regular file
    got = tar_members(sb.get_tar("."))
    assert got["e"].issym() and got["dl"].issym() and "e/passwd" not in got
    assert sb.get_file("d/f") == b"in\n"


def test_special_files_are_skipped_on_download(sb):
    sb.exec("mkfifo fifo; mkdir d; mkfifo d/fifo2; echo ok > ok.txt; "
            "python3 -c \"import socket; socket.socket(socket.AF_UNIX).bind('sock')\"; "
            "chmod 000 ok.txt; echo r > readable", timeout=10).check()
    got = tar_members(sb.get_tar("."))
    assert set(got) == {".", "d", "readable"}  # the unreadable file is skipped too
    assert not any(m.isfifo() or m.ischr() or m.isblk() for m in got.values())


def test_link_chain_past_path_max(sb):
    """A link chain longer than PATH_MAX only ever yields BadRequest, never an escape."""
    r = sb.exec("d=$(printf 'd%.0s' $(seq 200)); p=.; for i in $(seq 12); do p=$p/$d; done; "
                "mkdir -p $p && ln -s $p deep && prev=deep && up=$(printf '../%.0s' $(seq 12)) "
                "&& for i in $(seq 30); do ln -s $prev/${up}deep c$i; prev=c$i; done; "
                "ln -s /tmp exit; echo planted", timeout=20)
    assert "planted" in r.stdout
    for call in (lambda: sb.put_files({"c30/exit/evil.txt": b"pwned"}),
                 lambda: sb.put_tar(make_tar([("evil.txt", "file", b"x")]), dest="c30/exit"),
                 lambda: sb.put_tar(make_tar([("evil.txt", "file", b"x")]), dest="exit"),
                 lambda: sb.get_file("c30/exit/secret.txt")):
        with pytest.raises(BadRequest):
            call()
    assert sb.exec("ls -A /tmp", timeout=10).stdout == ""
    links = {n for n, m in tar_members(sb.get_tar(".")).items() if m.issym()}
    assert {"c30", "exit", "deep"} <= links


# ----------------------------------------------------------------------- uploads


def test_put_tar_member_cap_is_fast(sb):
    header = tarfile.TarInfo("b").tobuf()
    bomb = header * 300_000 + bytes(1024)
    t0 = time.monotonic()
    with pytest.raises(BadRequest, match="members"):
        sb.put_tar(bomb)
    assert time.monotonic() - t0 < 5
    assert sb.exec("ls -A", timeout=10).stdout == ""


def test_put_tar_size_cap_is_disk_mb(client):
    from terminal_rsi.sandbox.docker_backend import DockerSandbox

    with DockerSandbox(SandboxSpec(memory_mb=256, disk_mb=8), client=client) as sb:
        with pytest.raises(BadRequest, match="bytes of file data"):
            sb.put_tar(make_tar([("a", "file", bytes(5 * MiB)), ("b", "file", bytes(5 * MiB))]))
        assert sb.exec("ls -A", timeout=10).stdout == ""
        sb.exec("head -c 6M /dev/zero > /tmp/hog", timeout=10)
        with pytest.raises(BadRequest, match="full"):  # the shared quota is what is left
            sb.put_tar(make_tar([("a", "file", bytes(4 * MiB))]))


def test_upload_is_never_written_through_a_planted_symlink(sb):
    sb.exec("ln -s /tmp d; mkdir real; ln -s /tmp real/l; echo orig > /tmp/t; "
            "ln -s /tmp/t f", timeout=10).check()
    refused = [
        lambda: sb.put_files({"d/x": b"pwned"}),
        lambda: sb.put_files({"real/l/x": b"pwned"}),
        lambda: sb.put_tar(make_tar([("x", "file", b"pwned")]), dest="d"),
        lambda: sb.put_tar(make_tar([("x", "file", b"pwned")]), dest="real/l/sub"),
        lambda: sb.put_tar(make_tar([("d", "dir", b""), ("d/x", "file", b"pwned")])),
        # a link earlier in the same archive is not followed either
        lambda: sb.put_tar(make_tar([("s", "sym", "/tmp"), ("s/x", "file", b"pwned")])),
        lambda: sb.put_tar(make_tar([("../x", "file", b"pwned")])),
        lambda: sb.put_tar(make_tar([("/tmp/x", "file", b"pwned")])),
        lambda: sb.put_tar(b"not a tar at all" * 100),
    ]
    for call in refused:
        with pytest.raises(BadRequest):
            call()
    r = sb.exec("ls -A /tmp; cat /tmp/t; ls -A", timeout=10)
    assert r.stdout.split() == ["t", "orig", "d", "f", "real"], r
    # a regular file over a planted file link replaces the link, never writes its target
    sb.put_files({"f": b"new"})
    r = sb.exec("cat /tmp/t; [ -L f ] || cat f", timeout=10)
    assert r.stdout == "orig\nnew", r
    # symlink members are created as links, whatever their target
    sb.put_tar(make_tar([("links", "dir", b""), ("links/abs", "sym", "/etc/passwd"),
                     ("links/rel", "sym", "../f")]))
    assert sb.exec("readlink links/abs links/rel", timeout=10).stdout == "/etc/passwd\n../f\n"


@pytest.mark.parametrize("mode,opener", [("w:gz", gzip.compress), ("w:bz2", bz2.compress),
                                         ("w:xz", lzma.compress)])
def test_compressed_upload(sb, mode, opener):
    sb.put_tar(make_tar([("c/x.txt", "file", b"compressed")], mode=mode), dest="up")
    assert sb.get_file("up/c/x.txt") == b"compressed"
    # bytes after the archive's end are never expanded (a decompression bomb's tail)
    tail_bomb = opener(make_tar([("y.txt", "file", b"why")]) + bytes(64 * MiB))
    assert len(tail_bomb) < MiB
    t0 = time.monotonic()
    sb.put_tar(tail_bomb)
    assert time.monotonic() - t0 < 10 and sb.get_file("y.txt") == b"why"


def test_upload_and_download_roundtrip(sb):
    files = {"a/b/c.txt": b"abc", "-dash": b"dash", "sp ace/n\nl": b"newline", "e": b""}
    sb.put_files(files)
    sb.put_tar(make_tar([("x.txt", "file", b"in dest")]), dest="-d/e")
    assert sb.get_file("-d/e/x.txt") == b"in dest"
    got = tar_members(sb.get_tar("."))
    for name, data in files.items():
        assert got[name].isreg() and got[name].size == len(data)
    assert sb.get_file("sp ace/n\nl") == b"newline"


# ----------------------------------------------------------------------- cleanup


OWNER = textwrap.dedent("""
    import sys, time
    from terminal_rsi.sandbox import SandboxSpec
    from terminal_rsi.sandbox.docker_backend import DockerSandbox
    sb = DockerSandbox(SandboxSpec(memory_mb=64, disk_mb=8))
    print(sb.container_id, sb.box.disk, flush=True)
    time.sleep(600)
""")

SWEEPER = textwrap.dedent("""
    from terminal_rsi.sandbox import SandboxSpec
    from terminal_rsi.sandbox.docker_backend import DockerSandbox
    DockerSandbox(SandboxSpec(memory_mb=64, disk_mb=8)).close()
""")


def test_killed_owner_is_swept_by_the_next_process(client, shared):
    from terminal_rsi.sandbox.docker_backend import LABEL

    env = {**os.environ, "PYTHONPATH": REPO}
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdout=subprocess.PIPE, env=env,
                             cwd=REPO, text=True)
    try:
        cid, disk = owner.stdout.readline().split()
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    assert client.containers.get(cid).status == "running"  # nothing removed it yet
    # a container of a live owner on another host (a daemon shared by two hosts)
    other = {f"{LABEL}.{k}": v for k, v in procs.owner_identity().items()}
    other.update({LABEL: "other-host", f"{LABEL}.host": "another-host",
                  f"{LABEL}.pid": "999999"})
    foreign = client.containers.run(shared.spec.image, ["sleep", "infinity"], detach=True,
                                    labels=other, network_mode="none")
    try:
        subprocess.run([sys.executable, "-c", SWEEPER], env=env, cwd=REPO, check=True,
                       timeout=120)
        ids = {c.id for c in client.containers.list(all=True, filters={"label": LABEL})}
        assert cid not in ids, "the killed owner's container was not swept"
        assert foreign.id in ids and shared.container_id in ids  # live / foreign: kept
        if disk != "-":
            assert not os.path.exists(disk) and not mounted(disk)
        assert shared.exec("echo alive", timeout=10).stdout == "alive\n"
    finally:
        foreign.remove(force=True)


def test_sweep_removes_an_orphaned_disk(client):
    from terminal_rsi.sandbox import docker_backend

    if os.geteuid() != 0:
        pytest.skip("only root makes host tmpfs disks")
    disk = docker_backend.make_disk("orphan0123456789", 4)
    try:
        assert mounted(disk)
        docker_backend.sweep_stale(client)
        assert mounted(disk)  # its owner (this process) lives
        import json

        with open(os.path.join(disk, "owner.json"), "w") as f:
            json.dump({**procs.owner_identity(), "pid": "999999999"}, f)
        assert docker_backend.sweep_stale(client) >= 1
        assert not os.path.exists(disk) and not mounted(disk)
    finally:
        docker_backend.remove_disk(disk)


def test_nothing_is_left_after_close(client):
    from terminal_rsi.sandbox.docker_backend import DockerSandbox

    volumes = {v.id for v in client.volumes.list()}
    sb = DockerSandbox(SandboxSpec(files={"f": b"x"}), client=client)
    sb.exec("sleep 100 & echo > /tmp/x; echo > /dev/shm/y", timeout=5)
    sb.close()
    sb.close()  # idempotent
    _assert_gone(client, sb)
    assert {v.id for v in client.volumes.list()} == volumes
    with pytest.raises(SandboxLost):
        sb.exec("true", timeout=5)


# ----------------------------------------------------------------------- pool, images


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
    from terminal_rsi.sandbox.docker_backend import LABEL, DockerBackend

    spec = SandboxSpec(memory_mb=128)
    backend = DockerBackend(client=client, warm=2, warm_spec=spec)
    try:
        deadline = time.monotonic() + 60
        while backend.pool.ready() < 2:
            assert time.monotonic() < deadline, "warm pool never filled"
            time.sleep(0.1)
        boxes = list(backend.pool._q.queue)
        warm_ids = {b.id for b in boxes}
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
        boxes += list(backend.pool._q.queue)
    finally:
        backend.close()
    mine = [c for c in client.containers.list(all=True, filters={"label": LABEL})
            if c.labels.get(LABEL, "").startswith("warm-")]
    assert mine == []
    assert not [b.disk for b in boxes if b.disk and os.path.exists(b.disk)]


def test_container_killed_underneath_is_lost(client):
    from terminal_rsi.sandbox.docker_backend import DockerSandbox

    sb = DockerSandbox(SandboxSpec(), client=client)
    client.api.remove_container(sb.container_id, force=True)
    with pytest.raises(SandboxLost):
        sb.exec("true", timeout=5)
    sb.close()
    _assert_gone(client, sb)


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
