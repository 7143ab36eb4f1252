"""Cleanup survives a killed owner: nothing outlives it past the next start's sweep.

A child Python process opens a local sandbox in its own base directory, starts a
command that leaves background processes, and is killed with SIGKILL mid-exec. The
sweep that the next sandbox in another process runs (`sweep_stale`) must remove every
process, the tmpfs mount, the workspace directory and the cgroups it left; a live
owner's sandbox in the same base directory must be left alone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from terminal_rsi.sandbox import SandboxSpec, open_sandbox
from terminal_rsi.sandbox.local import sweep_stale
from terminal_rsi.sandbox.procs import pids_of_uid, pids_with_cmdline, pids_with_env

from .conftest import REPO, ROOT, mounted, need_bwrap, sleep_secs

OWNER = r"""
import json, sys, threading, time
from terminal_rsi.sandbox import SandboxSpec, open_sandbox
sb = open_sandbox(SandboxSpec(memory_mb=128, disk_mb=16), backend=sys.argv[1],
                  base_dir=sys.argv[2])
print(json.dumps({"id": sb.id, "root": sb.root, "uid": sb.uid,
                  "cgroups": list(sb.cgroup.dirs) if sb.cgroup else []}), flush=True)
a, b, c = sys.argv[3:6]
threading.Thread(target=sb.exec, args=(
    f"(sleep {a} &); setsid sleep {b} & sleep {c}",), kwargs={"timeout": 600},
    daemon=True).start()
time.sleep(600)
"""


def _zombie(pid: int) -> bool:
    """The process has exited and only waits to be reaped (or is gone already)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except OSError:
        return True


@pytest.mark.parametrize("backend", ["local-bwrap", "local-plain"])
def test_sigkilled_owner_is_swept_at_the_next_start(backend):
    if backend == "local-bwrap":
        need_bwrap()
    base = tempfile.mkdtemp(prefix="trsi-cleanup-", dir="/tmp")  # o+x up to / for the uids
    os.chmod(base, 0o755)
    live = open_sandbox(SandboxSpec(), backend=backend, base_dir=base)
    secs = [sleep_secs() for _ in range(3)]
    tokens = [s.encode() for s in secs]
    proc = subprocess.Popen([sys.executable, "-c", OWNER, backend, base, *secs], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
    try:
        info = json.loads(proc.stdout.readline())
        deadline = time.monotonic() + 20
        while not all(pids_with_cmdline(t) for t in tokens):
            assert time.monotonic() < deadline, "the owner's command did not start"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        assert os.path.isdir(info["root"])  # left behind until a sweep
        assert sweep_stale(base) == 1
        env = f"TRSI_SANDBOX={info['id']}".encode()

        def survivors():  # SIGKILLed processes leave the process table a moment later
            pids = ([p for t in tokens for p in pids_with_cmdline(t)] + pids_with_env(env)
                    + (pids_of_uid(info["uid"]) if info["uid"] is not None else []))
            return [p for p in pids if not _zombie(p)]  # dead, waiting for its reaper

        deadline = time.monotonic() + 10
        while survivors():
            assert time.monotonic() < deadline, f"processes of the killed owner survived: " \
                f"{survivors()}"
            time.sleep(0.05)
        assert not os.path.exists(info["root"])
        assert not mounted(info["root"])
        for d in info["cgroups"]:
            assert not os.path.exists(d)
        # the live owner's sandbox in the same directory is untouched
        assert live.exec("echo alive", timeout=10).stdout == "alive\n"
        assert sweep_stale(base) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        live.close()
    assert os.listdir(base) == []
    os.rmdir(base)


@pytest.mark.skipif(not ROOT, reason="cgroups need root")
def test_close_removes_cgroups_and_mount():
    need_bwrap()
    sb = open_sandbox(SandboxSpec(), backend="local-bwrap")
    root, dirs = sb.root, list(sb.cgroup.dirs) if sb.cgroup else []
    assert dirs, "a root host with writable cgroups gives every sandbox its groups"
    assert mounted(root)
    sb.exec("sleep 100 &", timeout=5)
    sb.close()
    assert not os.path.exists(root) and not mounted(root)
    assert not any(os.path.exists(d) for d in dirs)
