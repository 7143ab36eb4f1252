"""Fixtures: real backends (bubblewrap, plain, Docker engine, HTTP bridge on loopback).

An engine that is missing fails loudly in CI (CI=true) and skips with a reason
on a dev machine.
"""

from __future__ import annotations

import glob
import io
import os
import posixpath
import secrets
import signal
import subprocess
import sys
import tarfile
import time

import pytest

from terminal_rsi.sandbox import SandboxSpec, open_sandbox
from terminal_rsi.sandbox.procs import pids_with_cmdline, pids_with_env

# the small sandbox of the session and hostile tests, and their wall-clock bound: a generous
# "returns", not a speed claim
SPEC = SandboxSpec(memory_mb=256, pids=64, disk_mb=64, max_output_bytes=64 << 10)
BOUND_S = 30.0
IN_CI = os.environ.get("CI", "").lower() == "true"
ROOT = os.geteuid() == 0
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def sleep_secs() -> str:
    """Seconds for a ``sleep`` whose command line no other test shares, even on another
    xdist worker (every backend's variant of a test runs at once): tests find a sandbox's
    escapees by it, and a fixed value would find another test's live sleep."""
    return f"987.{secrets.randbelow(10**9):09d}"


def need(ok: bool, what: str) -> None:
    """Fail in CI, skip elsewhere, when a real engine this test needs is missing."""
    if ok:
        return
    if IN_CI:
        pytest.fail(f"{what} is required in CI (run .ci/setup_sandbox.sh first)")
    pytest.skip(f"{what} is not available on this machine")


def need_bwrap() -> None:
    from terminal_rsi.sandbox.local import bwrap_available

    need(bwrap_available(), "bubblewrap (apt-get install bubblewrap) with user namespaces")


def need_docker_image() -> None:
    from terminal_rsi.sandbox.docker_backend import docker_available

    need(docker_available(), "a running Docker engine")
    from terminal_rsi.sandbox.docker_backend import docker_client
    from terminal_rsi.sandbox.image import DEFAULT_IMAGE, image_is_current

    need(image_is_current(docker_client(), DEFAULT_IMAGE),
         f"the sandbox image {DEFAULT_IMAGE} (python -m terminal_rsi.sandbox.image build)")


class BridgeServer:
    """A real `python -m terminal_rsi.sandbox.serve` process on a loopback port."""

    def __init__(self, tmp_dir: str, backend: str = "local-bwrap", token: str | None = None,
                 **opts):
        self.token = token or secrets.token_hex(16)
        self.token_file = os.path.join(tmp_dir, "tokens")
        with open(self.token_file, "w") as f:
            f.write(f"tests:{self.token}\n")
        os.chmod(self.token_file, 0o600)
        port_file = os.path.join(tmp_dir, "port")
        argv = [sys.executable, "-m", "terminal_rsi.sandbox.serve", f"--backend={backend}",
                "--host=127.0.0.1", "--port=0", f"--port-file={port_file}",
                f"--token-file={self.token_file}"]
        argv += [f"--{k.replace('_', '-')}" if v is True else f"--{k.replace('_', '-')}={v}"
                 for k, v in opts.items()]
        self.log_path = os.path.join(tmp_dir, "server.log")
        self.proc = subprocess.Popen(argv, cwd=REPO, stdout=open(self.log_path, "w"),
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not os.path.exists(port_file):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"bridge server did not start: {self.log()}")
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{open(port_file).read().strip()}"
        from terminal_rsi.sandbox.remote import BridgeClient

        self.client = BridgeClient(self.url, token=self.token)
        while True:
            try:
                self.client.health()
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def log(self) -> str:
        try:
            return open(self.log_path).read()[-3000:]
        except OSError:
            return ""

    def stop(self, sig=signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.client.close()
        return self.proc.returncode


@pytest.fixture(scope="module")
def client():
    """A Docker SDK client of the running engine (the default sandbox image present)."""
    need_docker_image()
    from terminal_rsi.sandbox.docker_backend import docker_client

    return docker_client()


@pytest.fixture(scope="session")
def bridge(tmp_path_factory):
    need_bwrap()
    srv = BridgeServer(str(tmp_path_factory.mktemp("bridge")), backend="local-bwrap")
    yield srv
    srv.stop()


BACKEND_NAMES = ["local-bwrap", "local-plain", "docker", "bridge-local"]


@pytest.fixture(params=BACKEND_NAMES)
def make_sandbox(request):
    """A factory spec -> open sandbox on the parametrized backend; closes all at the end."""
    name = request.param
    opened = []
    if name == "local-bwrap":
        need_bwrap()

        def factory(spec):
            return open_sandbox(spec, backend="local-bwrap")
    elif name == "local-plain":
        def factory(spec):
            return open_sandbox(spec, backend="local-plain")
    elif name == "docker":
        need_docker_image()

        def factory(spec):
            return open_sandbox(spec, backend="docker")
    else:
        srv = request.getfixturevalue("bridge")

        def factory(spec):
            return open_sandbox(spec, backend=srv.url, token=srv.token)

    def make(spec=None):
        sb = factory(spec or SandboxSpec())
        opened.append(sb)
        return sb

    make.backend = name
    yield make
    for sb in opened:
        sb.close()
    for sb in opened:
        assert_no_leftovers(sb.id)


def assert_no_leftovers(sid: str, tokens: tuple[bytes, ...] = ()) -> None:
    """No process of sandbox `sid` runs, no workspace dir or container of it remains."""
    for _ in range(100):  # processes being killed may take a moment to vanish
        left = pids_with_env(f"TRSI_SANDBOX={sid}".encode())
        for t in tokens:
            left += pids_with_cmdline(t)
        if not left:
            break
        time.sleep(0.02)
    assert not left, f"sandbox {sid} left processes behind: {left}"
    assert not glob.glob(f"/tmp/trsi-sb-{sid}-*"), f"sandbox {sid} left its workspace"


def make_tar(members, mode: str = "w") -> bytes:
    """A tar stream of (name, kind, payload) members; kind: file, dir, sym, hard or fifo."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tf:
        for name, kind, payload in members:
            ti = tarfile.TarInfo(name)
            if kind == "file":
                ti.size, ti.mode = len(payload), 0o640
                tf.addfile(ti, io.BytesIO(payload))
                continue
            ti.type = {"dir": tarfile.DIRTYPE, "sym": tarfile.SYMTYPE, "hard": tarfile.LNKTYPE,
                       "fifo": tarfile.FIFOTYPE}[kind]
            if kind == "dir":
                ti.mode = 0o755
            if kind in ("sym", "hard"):
                ti.linkname = payload
            tf.addfile(ti)
    return buf.getvalue()


def tar_members(data: bytes) -> dict[str, tarfile.TarInfo]:
    """{normalized name: member} of a tar stream."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        return {posixpath.normpath(m.name): m for m in tf.getmembers()}


def mounted(path: str) -> bool:
    """True if ``path`` is a mount point in this process's mount namespace."""
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == path for line in f)
