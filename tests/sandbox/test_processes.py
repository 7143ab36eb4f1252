"""`Sandbox.processes` on every backend (local-bwrap, local-plain, docker, the HTTP bridge):
what runs in a sandbox, read from outside it. A job holding a lock is found by its argv and
its open file, still after the lock is deleted and after it rewrites its argv, and is gone
once killed; nothing of the host outside the sandbox is listed; hundreds of processes answer
fast and within the caps; a closed sandbox is SandboxLost."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import time

import pytest

from terminal_rsi.sandbox import SandboxLost, SandboxSpec, open_sandbox, procs
from terminal_rsi.sandbox.base import (
    MAX_ARGV_BYTES,
    MAX_PROCESS_FILES,
    MAX_PROCESS_PATH,
    MAX_PROCESSES,
    ProcessInfo,
)
from terminal_rsi.sandbox.procs import clip, list_processes, read_process
from terminal_rsi.sandbox.remote import BridgeClient

from .conftest import need, need_docker_image, sleep_secs

SPEC = SandboxSpec(memory_mb=512, pids=400, disk_mb=64, max_output_bytes=64 << 10)
JOB = "exec 9>>job.lock\nflock 9\nsleep {secs}\n"  # job.sh: holds the lock while it runs


@pytest.fixture(autouse=True)
def _tmux(request):
    if "make_sandbox" in request.fixturenames:
        need(shutil.which("tmux") is not None, "tmux (apt-get install tmux)")


def wait_until(probe, timeout: float = 10.0):
    """``probe()``'s first truthy value within ``timeout`` seconds (else the last one)."""
    deadline = time.monotonic() + timeout
    while not (value := probe()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return value


def holding(sb, path: str) -> list[ProcessInfo]:
    return [p for p in sb.processes() if path in p.files]


# ---------------------------------------------------------------- pure helpers, this host


def test_process_info_json_roundtrip_and_validation():
    p = ProcessInfo(pid=7, ppid=1, argv=("bash", "job.sh"), exe="/usr/bin/bash",
                    files=("/workspace/job.lock (deleted)",), partial=False, source="proc")
    assert ProcessInfo.from_json(p.to_json()) == p
    for bad in ({**p.to_json(), "pid": "7"}, {**p.to_json(), "argv": "bash"},
                {**p.to_json(), "source": "ps"}, {**p.to_json(), "partial": 1}, [1]):
        with pytest.raises(TypeError):
            ProcessInfo.from_json(bad)
    with pytest.raises(KeyError):
        ProcessInfo.from_json({"pid": 1})


def test_reading_one_process_is_capped():
    long_arg = "a" * (2 * MAX_ARGV_BYTES)
    code = ("import os, sys, time\n"
            f"fds = [os.open('/dev/null', os.O_RDONLY) for _ in range({MAX_PROCESS_FILES + 20})]\n"
            "sys.stdout.write('ready\\n'); sys.stdout.flush(); time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, long_arg], stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"ready\n"
        info = read_process(proc.pid)
        assert info is not None and info.partial and info.source == "proc"
        assert len(info.files) == MAX_PROCESS_FILES and "/dev/null" in info.files
        assert sum(len(a) + 1 for a in info.argv) <= MAX_ARGV_BYTES + 1
        assert info.argv[:2] == (sys.executable, "-c")
        assert os.path.realpath(info.exe) == os.path.realpath(sys.executable)
    finally:
        proc.kill()
        proc.wait()
    assert read_process(proc.pid) is None  # gone
    text, cut = clip("/workspace/" + "d" * 2000 + "/job.lock (deleted)")
    assert cut and len(text) == MAX_PROCESS_PATH and text.endswith("/job.lock (deleted)")
    assert clip("/workspace/job.lock") == ("/workspace/job.lock", False)


def test_a_listing_is_capped_and_skips_machinery(monkeypatch):
    monkeypatch.setattr(procs, "MAX_PROCESSES", 3)
    host = [int(n) for n in os.listdir("/proc") if n.isdigit()]
    found = list_processes(host)
    assert len(found) == 3 and [p.pid for p in found] == sorted(p.pid for p in found)
    me = os.getpid()
    assert me not in {p.pid for p in list_processes([me, 1], machinery=lambda p, _: p == me)}


# ---------------------------------------------------------------- every backend


def test_a_lock_holder_is_found_after_rm_and_gone_after_c_c(make_sandbox):
    sb = make_sandbox(SPEC)
    secs = sleep_secs()
    sb.put_files({"job.sh": JOB.format(secs=secs).encode()})
    term = sb.open_session()
    term.send("bash job.sh\n")
    lock = f"{sb.workdir}/job.lock"
    found = wait_until(lambda: [p for p in holding(sb, lock) if secs in p.argv])
    assert found, sb.processes()
    job = [p for p in holding(sb, lock) if p.argv == ("bash", "job.sh")]
    assert job and job[0].exe.endswith("/bash") and f"{sb.workdir}/job.sh" in job[0].files
    assert found[0].exe.endswith("/sleep") and found[0].source == "proc"

    assert sb.exec("rm job.lock && ! test -e job.lock", timeout=10).ok  # the agent's trick
    deleted = holding(sb, lock + " (deleted)")
    assert {p.pid for p in deleted} >= {job[0].pid, found[0].pid}, sb.processes()

    assert term.run("C-c", 10).done
    assert wait_until(lambda: not holding(sb, lock + " (deleted)")), sb.processes()
    assert not [p for p in sb.processes() if secs in p.argv]


def test_a_rewritten_argv_is_still_found_by_exe_and_files(make_sandbox):
    sb = make_sandbox(SPEC)
    secs = sleep_secs()
    term = sb.open_session()
    assert term.run(f"(exec 9>>job.lock; flock 9; exec -a innocent sleep {secs}) &\n", 10).done
    lock = f"{sb.workdir}/job.lock"
    found = wait_until(lambda: [p for p in holding(sb, lock) if p.argv[:1] == ("innocent",)])
    assert [p.argv for p in found] == [("innocent", secs)], sb.processes()
    assert [p.pid for p in holding(sb, lock)] == [found[0].pid]  # the only holder
    assert found[0].exe.endswith("/sleep") and not found[0].partial
    assert term.run("kill %1; wait\n", 10).done
    assert wait_until(lambda: not holding(sb, lock)), sb.processes()


def test_only_the_sandbox_is_listed(make_sandbox):
    sb = make_sandbox(SPEC)
    secs = sleep_secs()
    term = sb.open_session()
    outside = subprocess.Popen(["sleep", secs])  # the same command line, on the host
    try:
        assert term.run(f"sleep {secs} &\n", 10).done
        listed = wait_until(lambda: [p for p in sb.processes() if secs in p.argv])
        assert len(listed) == 1 and listed[0].pid != outside.pid, listed
        mine = {os.getpid(), outside.pid, 1}
        marker = f"TRSI_SANDBOX={sb.id}".encode()
        for p in sb.processes():
            assert p.pid not in mine
            with open(f"/proc/{p.pid}/environ", "rb") as f:  # every one is the sandbox's
                assert marker in f.read().split(b"\0"), p
        # the machinery is left out: no bubblewrap, no exec wrapper, no pid 1 loop
        for p in sb.processes():
            assert not p.exe.endswith("/bwrap") and "-p" not in p.argv[1:2], p
            assert "while :; do sleep 86400" not in " ".join(p.argv), p
    finally:
        outside.kill()
        outside.wait()


def test_hundreds_of_processes_answer_fast_within_the_caps(make_sandbox):
    sb = make_sandbox(SPEC)
    secs = sleep_secs()
    term = sb.open_session()
    assert term.run(f"for i in $(seq 200); do sleep {secs} & done\n", 20).done
    assert wait_until(lambda: sum(secs in p.argv for p in sb.processes()) >= 200, 20)
    t0 = time.monotonic()
    found = sb.processes()
    took = time.monotonic() - t0
    assert took < 3.0, took
    assert 200 <= len(found) <= MAX_PROCESSES
    assert all(len(p.files) <= MAX_PROCESS_FILES for p in found)
    assert len({p.pid for p in found}) == len(found)


def test_a_fork_bomb_answers_fast_within_the_caps(make_sandbox):
    sb = make_sandbox(dataclasses.replace(SPEC, pids=MAX_PROCESSES + 64))
    term = sb.open_session()
    term.run("bomb() { bomb | bomb & }; bomb\n", 2)
    t0 = time.monotonic()
    found = sb.processes()
    took = time.monotonic() - t0
    term.send("C-c")
    assert took < 5.0 and 0 < len(found) <= MAX_PROCESSES, (took, len(found))


def test_a_closed_sandbox_is_lost(make_sandbox):
    sb = make_sandbox(SPEC)
    assert isinstance(sb.processes(), tuple)
    sb.close()
    with pytest.raises(SandboxLost):
        sb.processes()


# ---------------------------------------------------------------- docker, bridge


def test_docker_engine_elsewhere_gives_top_only():
    """When this host's /proc is not the engine's, the listing is what `top` tells."""
    need_docker_image()
    need(shutil.which("tmux") is not None, "tmux (apt-get install tmux)")
    with open_sandbox(SPEC, backend="docker") as sb:
        secs = sleep_secs()
        term = sb.open_session()
        assert term.run(f"exec -a innocent sleep {secs} 9>>job.lock &\n", 10).done
        sb._in_container = lambda pid: False  # as if the engine ran on another host
        found = wait_until(lambda: [p for p in sb.processes() if secs in p.argv])
        assert [p.argv for p in found] == [("innocent", secs)]
        assert found[0].source == "top" and found[0].partial
        assert found[0].exe == "" and found[0].files == ()
        argvs = [p.argv for p in sb.processes()]
        assert ("sleep", "86400") not in argvs and argvs[0][0] == "/usr/bin/tmux", argvs


def test_docker_profile_image_lists_exec_roots():
    need_docker_image()
    need(shutil.which("tmux") is not None, "tmux (apt-get install tmux)")
    with open_sandbox(dataclasses.replace(SPEC, profile="image"), backend="docker") as sb:
        sb.open_session()
        tmux = [p for p in sb.processes() if p.exe.endswith("/tmux")]
        assert len(tmux) == 2, sb.processes()  # the client (an exec's first) and the server
        assert not [p for p in sb.processes() if "86400" in " ".join(p.argv)]


def test_bridge_processes_belong_to_their_client(bridge):
    with open_sandbox(SPEC, backend=bridge.url, token=bridge.token) as sb:
        assert sb.processes() == ()
        other = BridgeClient(bridge.url, token=bridge.token)  # same token, other client id
        try:
            r = other._http.get(f"/v1/sandboxes/{sb.id}/processes")
            assert r.status_code == 410 and r.json()["error"]["kind"] == "lost"
        finally:
            other.close()
        r = sb.client._http.get(f"/v1/sandboxes/{sb.id}/processes", params={"x": "1"})
        assert r.status_code == 400 and r.json()["error"]["kind"] == "bad_request"
