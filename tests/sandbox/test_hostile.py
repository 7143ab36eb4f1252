"""Hostile commands against every backend: each is contained.

Contained means: the call returns a result or a typed SandboxError in bounded
time; files outside the workspace are not written and secrets outside it are
not read; a sibling sandbox is unaffected; no process of the sandbox is left
after the exec returns; nothing (processes, workspace, container) is left after
close. Backends: local-bwrap, local-plain, docker, and the HTTP bridge in
front of local-bwrap. Cases that plain mode does not claim to contain
(network, host /tmp; see docs/sandbox.md) are skipped for it with that reason.
"""

from __future__ import annotations

import io
import os
import secrets
import shutil
import socket
import tarfile
import threading
import time

import pytest

from terminal_rsi.sandbox import BadRequest, SandboxLost, SandboxSpec
from terminal_rsi.sandbox.procs import pids_with_cmdline

from .conftest import ROOT, assert_no_leftovers

SPEC = SandboxSpec(memory_mb=256, pids=64, disk_mb=64, max_output_bytes=64 << 10)
BOUND_S = 30.0  # a generous wall-clock bound: "returns", not a speed claim


@pytest.fixture(scope="module")
def host_dir():
    """A root-owned 0755 directory outside every workspace, plus a 0600 secret in it."""
    d = f"/tmp/trsi-host-{secrets.token_hex(4)}"
    os.mkdir(d, 0o755)
    secret = secrets.token_hex(12)
    with open(os.path.join(d, "secret.txt"), "w") as f:
        f.write(secret)
    os.chmod(os.path.join(d, "secret.txt"), 0o600)
    vdir = os.path.join(d, "verifier", "tests")
    os.makedirs(vdir, mode=0o700)
    os.chmod(os.path.join(d, "verifier"), 0o700)
    with open(os.path.join(vdir, "test_outputs.py"), "w") as f:
        f.write(f"EXPECTED = '{secret}'\n")
    yield d, secret
    shutil.rmtree(d, ignore_errors=True)


class Ctx:
    def __init__(self, make, sb, host_dir, secret):
        self.make, self.sb, self.host_dir, self.secret = make, sb, host_dir, secret
        self.backend = make.backend
        self.tokens: tuple[bytes, ...] = ()

    def run(self, cmd, timeout=2.0):
        t0 = time.monotonic()
        r = self.sb.exec(cmd, timeout=timeout)
        assert time.monotonic() - t0 < BOUND_S
        return r

    def skip_unprivileged_plain(self):
        if self.backend == "local-plain" and not ROOT:
            pytest.skip("local-plain as a non-root user shares the caller's uid (documented)")

    def skip_plain(self, why):
        if self.backend == "local-plain":
            pytest.skip(f"local-plain does not isolate {why} (documented weaker mode)")


# ---------------------------------------------------------------- the cases
def case_fork_bomb(c):
    r = c.run("bomb() { bomb | bomb & }; bomb; sleep 5", timeout=2)
    assert r.timed_out or r.exit_code != 0


def case_fork_bomb_loop(c):
    r = c.run("while :; do sleep 100 & done", timeout=2)
    assert r.timed_out or r.exit_code != 0
    c.tokens = (b"sleep\x00100\x00",)


def case_memory_bomb(c):
    r = c.run("python3 -c 'x = bytearray(3 << 30); print(\"allocated\")'", timeout=5)
    assert "allocated" not in r.stdout and r.exit_code != 0


def case_memory_bomb_gradual(c):
    r = c.run("python3 -c '\nxs = []\nwhile True: xs.append(bytearray(32 << 20))'", timeout=5)
    assert r.exit_code != 0 or r.timed_out


def case_cpu_spin(c):
    r = c.run("while :; do :; done", timeout=1)
    assert r.timed_out and r.exit_code < 0


def case_cpu_spin_ignoring_signals(c):
    r = c.run("trap '' TERM INT HUP; while :; do :; done", timeout=1)
    assert r.timed_out


def case_gigabyte_stdout(c):
    r = c.run("head -c 1G /dev/zero | tr '\\0' x; echo END", timeout=3)
    assert r.truncated
    assert len(r.stdout) <= SPEC.max_output_bytes + 200
    assert r.stdout.startswith("xxxx")


def case_stderr_flood(c):
    r = c.run("yes flood >&2", timeout=1)
    assert r.truncated and r.timed_out
    assert len(r.stderr) <= SPEC.max_output_bytes + 200 and "truncated]" in r.stderr


def case_double_fork(c):
    c.tokens = (b"987.601",)
    r = c.run("( ( sleep 987.601 & ) & ); echo started", timeout=3)
    assert r.stdout.strip() == "started"


def case_setsid_child(c):
    c.tokens = (b"987.602",)
    r = c.run("setsid sleep 987.602 >/dev/null 2>&1 < /dev/null & echo started", timeout=3)
    assert "started" in r.stdout


def case_setsid_env_cleared(c):
    c.tokens = (b"987.603",)
    c.run("setsid env -i /bin/sleep 987.603 </dev/null >/dev/null 2>&1 & echo ok", timeout=3)


def case_background_holding_pipes(c):
    c.tokens = (b"987.604",)
    r = c.run("sleep 987.604 & echo bg", timeout=3)
    assert not r.timed_out and r.stdout.strip() == "bg"


def case_write_outside_workspace(c):
    target = os.path.join(c.host_dir, "pwned.txt")
    c.run(f"echo pwned > {target}; echo pwned > /pwned-{os.getpid()}", timeout=3)
    assert not os.path.exists(target)
    assert not os.path.exists(f"/pwned-{os.getpid()}")


def case_write_system_dirs(c):
    name = f"trsi-canary-{secrets.token_hex(4)}"
    c.run(f"touch /etc/{name} /usr/{name} /usr/bin/{name}; echo x >> /etc/hosts", timeout=3)
    leaked = [p for p in (f"/etc/{name}", f"/usr/{name}", f"/usr/bin/{name}")
              if os.path.exists(p)]
    for p in leaked:
        os.unlink(p)
    assert not leaked


def case_write_host_tmp(c):
    c.skip_plain("/tmp")
    name = f"/tmp/trsi-escape-{secrets.token_hex(4)}"
    c.run(f"echo pwned > {name}", timeout=3)
    assert not os.path.exists(name)


def case_read_host_secret(c):
    r = c.run(f"cat {c.host_dir}/secret.txt; ls -la {c.host_dir}", timeout=3)
    assert c.secret not in r.stdout + r.stderr


def case_read_host_home(c):
    home = os.path.expanduser("~")
    name = f".trsi-secret-{secrets.token_hex(4)}"
    path = os.path.join(home, name)
    with open(path, "w") as f:
        f.write(c.secret)
    os.chmod(path, 0o600)
    try:
        r = c.run(f"cat ~{os.environ.get('USER', 'root')}/{name} {path}; ls -la {home}",
                  timeout=3)
    finally:
        os.unlink(path)
    assert c.secret not in r.stdout + r.stderr
    if ROOT and c.backend != "local-plain":
        assert name not in r.stdout


def case_read_verifier_files(c):
    r = c.run(f"cat {c.host_dir}/verifier/tests/test_outputs.py; "
              "grep -rs EXPECTED / --include=test_outputs.py 2>/dev/null | head", timeout=5)
    assert c.secret not in r.stdout + r.stderr


def case_network_to_host(c):
    c.skip_plain("the network")
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.2)
    port = srv.getsockname()[1]
    got = []
    stop = threading.Event()

    def accept():
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
                got.append(conn.recv(100))
                conn.close()
            except OSError:
                pass

    th = threading.Thread(target=accept)
    th.start()
    r = c.run(f"echo pwned > /dev/tcp/127.0.0.1/{port}; "
              f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 1)"
              ".sendall(b'pwned')\"; echo done", timeout=4)
    time.sleep(0.3)  # a connection made before the exec ended is accepted by now
    stop.set()
    th.join()
    srv.close()
    assert got == [], f"sandbox reached a host socket: {got}"
    assert "done" in r.stdout


def case_network_external(c):
    c.skip_plain("the network")
    r = c.run("getent hosts deb.debian.org && echo RESOLVED; "
              "python3 -c \"import socket; socket.create_connection(('151.101.2.132', 80), 2);"
              " print('CONNECTED')\"", timeout=5)
    assert "RESOLVED" not in r.stdout and "CONNECTED" not in r.stdout


def case_disk_fill_one_file(c):
    r = c.run("head -c 512M /dev/zero > fill.bin; echo rc=$?; ls -la", timeout=10)
    assert "rc=0" not in r.stdout
    r2 = c.sb.exec("rm -f fill.bin && echo cleaned", timeout=10)
    assert r2.stdout.strip() == "cleaned"


def case_disk_fill_many_files(c):
    c.run("i=0; while head -c 1M /dev/zero > f$i; do i=$((i+1)); "
          "[ $i -gt 600 ] && echo UNBOUNDED && break; done; echo i=$i", timeout=15)
    r = c.sb.exec("ls | wc -l; rm -f f*; echo cleaned", timeout=10)
    assert "cleaned" in r.stdout
    assert int(r.stdout.split()[0]) < 600


def case_kill_parent(c):
    c.skip_unprivileged_plain()
    r = c.run("kill -9 $PPID; kill -9 $(ps -o ppid= -p $PPID 2>/dev/null) 2>/dev/null; "
              "sleep 0.5; echo alive", timeout=3)
    assert isinstance(r.exit_code, int)
    assert c.sb.exec("echo still-usable", timeout=10).stdout.strip() == "still-usable"


def case_kill_everything(c):
    c.skip_unprivileged_plain()
    c.run("kill -9 -1; kill -9 1; echo done", timeout=3)
    assert c.sb.exec("echo still-usable", timeout=10).stdout.strip() == "still-usable"


def case_symlink_escape_get(c):
    c.run(f"ln -s /etc/passwd leak; ln -s / rootlink; ln -s {c.host_dir} hostlink", timeout=3)
    for path in ("leak", "rootlink/etc/passwd", "hostlink/secret.txt"):
        with pytest.raises(BadRequest):
            data = c.sb.get_file(path)
            assert c.secret.encode() not in data and b"root:" not in data


def case_dotdot_get(c):
    for path in ("../../etc/passwd", "/etc/passwd", "a/../../etc/passwd"):
        with pytest.raises(BadRequest):
            c.sb.get_file(path)


def _tar(members):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, kind, payload in members:
            ti = tarfile.TarInfo(name)
            if kind == "sym":
                ti.type, ti.linkname = tarfile.SYMTYPE, payload
                tf.addfile(ti)
            elif kind == "hard":
                ti.type, ti.linkname = tarfile.LNKTYPE, payload
                tf.addfile(ti)
            else:
                ti.size = len(payload)
                tf.addfile(ti, io.BytesIO(payload))
    return buf.getvalue()


def case_put_traversal(c):
    target = os.path.join(c.host_dir, "evil.txt")
    bad = [
        [("../evil.txt", "file", b"x")],
        [(target, "file", b"x")],
        [("link", "sym", c.host_dir), ("link/evil.txt", "file", b"x")],
        [("hl", "hard", "/etc/passwd")],
    ]
    for members in bad:
        with pytest.raises(BadRequest):
            c.sb.put_tar(_tar(members))
    # a symlink planted by a command must not redirect a later upload
    c.run(f"ln -s {c.host_dir} out", timeout=3)
    try:
        c.sb.put_files({"out/evil.txt": b"pwned"})
    except BadRequest:
        pass
    assert not os.path.exists(target)


CASES = {name[5:]: fn for name, fn in sorted(globals().items()) if name.startswith("case_")}
assert len(CASES) >= 20


@pytest.fixture
def sibling(make_sandbox):
    sb = make_sandbox(SPEC)
    sb.put_files({"keep.txt": b"sibling"})
    return sb


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile(case, make_sandbox, sibling, host_dir):
    d, secret = host_dir
    sb = make_sandbox(SPEC)
    ctx = Ctx(make_sandbox, sb, d, secret)
    try:
        CASES[case](ctx)
    except SandboxLost:  # the sandbox died (e.g. its container): a typed, contained outcome
        pass
    # processes of this sandbox are gone once the exec returned
    assert_no_leftovers_open(sb.id, ctx.tokens)
    # the sibling is unaffected
    r = sibling.exec("cat keep.txt", timeout=10)
    assert r.stdout == "sibling" and r.exit_code == 0
    sb.close()
    assert_no_leftovers(sb.id, ctx.tokens)
    if make_sandbox.backend == "docker":
        from terminal_rsi.sandbox.docker_backend import LABEL, docker_client

        left = docker_client().containers.list(all=True, filters={"label": f"{LABEL}={sb.id}"})
        assert not left


def assert_no_leftovers_open(sid: str, tokens) -> None:
    from terminal_rsi.sandbox.procs import pids_with_env

    for _ in range(100):
        left = pids_with_env(f"TRSI_SANDBOX={sid}".encode())
        left += [p for t in tokens for p in pids_with_cmdline(t)]
        if not left:
            return
        time.sleep(0.02)
    raise AssertionError(f"processes of sandbox {sid} outlived their exec: {left}")
