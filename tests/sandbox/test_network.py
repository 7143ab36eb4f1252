"""``network=True`` on local-bwrap: user-mode networking (slirp4netns), never the host's.

The sandbox reaches outside addresses through its own network namespace; listeners on the
host's loopback (127.0.0.1, ::1) and abstract Unix sockets are not reachable, neither from an
exec nor from (or next to) a terminal session, nor through slirp's gateway 10.0.2.2;
``network=False`` has loopback only. The helper process never outlives its exec, session,
sandbox or owner, and a host without the tool refuses the spec instead of sharing the host's
network. Every probe also runs on the host first, so a probe that cannot connect anywhere
never passes for isolation.
"""

from __future__ import annotations

import json
import os
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from terminal_rsi.sandbox import InfrastructureError, SandboxSpec, local, open_sandbox, procs
from terminal_rsi.sandbox.local import sweep_stale, user_net_problem

from .conftest import REPO, assert_no_leftovers, need, need_bwrap

# connect to (family, address); prints "connected" or "failed <errno name>"
PROBE = r"""
import errno, socket, sys
fam, addr = sys.argv[1], sys.argv[2]
if fam == "unix":
    s, target = socket.socket(socket.AF_UNIX), "\0" + addr
else:
    host, port = addr.rsplit(":", 1)
    s = socket.socket(socket.AF_INET6 if fam == "tcp6" else socket.AF_INET)
    target = (host.strip("[]"), int(port))
s.settimeout(3)
try:
    s.connect(target)
    print("connected")
except OSError as e:
    print("failed", errno.errorcode.get(e.errno, e.errno) if e.errno else type(e).__name__)
"""
# interfaces (up, IPv4 address) and whether a default route exists, without iproute2
NETINFO = r"""
import fcntl, json, socket, struct
s = socket.socket()
out = {}
for _, name in socket.if_nameindex():
    req = struct.pack("256s", name.encode())
    flags = struct.unpack("H", fcntl.ioctl(s, 0x8913, req)[16:18])[0]  # SIOCGIFFLAGS
    try:
        addr = socket.inet_ntoa(fcntl.ioctl(s, 0x8915, req)[20:24])  # SIOCGIFADDR
    except OSError:
        addr = None
    out[name] = {"up": bool(flags & 1), "addr": addr}
routes = open("/proc/net/route").read().splitlines()[1:]
print(json.dumps({"ifaces": out, "default": any(r.split()[1] == "00000000" for r in routes)}))
"""
# a server and a client on the sandbox's own loopback, in one command
LOOPBACK = r"""
import socket, threading
srv = socket.create_server(("127.0.0.1", 0))
def serve():
    c, _ = srv.accept()
    c.sendall(c.recv(100).upper())
threading.Thread(target=serve).start()
cl = socket.create_connection(srv.getsockname(), timeout=5)
cl.sendall(b"ping")
print(cl.recv(100).decode())
"""
OUTSIDE = [("deb.debian.org", 80), ("pypi.org", 443)]
OWNER = r"""
import sys, time
from terminal_rsi.sandbox import SandboxSpec, open_sandbox
sb = open_sandbox(SandboxSpec(network=True), backend="local-bwrap", base_dir=sys.argv[1])
sb.open_session()
print(sb.id, flush=True)
time.sleep(600)
"""


def need_user_net() -> None:
    need_bwrap()
    need(user_net_problem() is None, "slirp4netns (apt-get install slirp4netns) with /dev/net/tun")


def helpers_of(pid: int) -> list[int]:
    """slirp4netns processes whose parent is ``pid`` (a live one, or a zombie not reaped)."""
    out = []
    for d in os.listdir("/proc"):
        st = procs.stat(int(d)) if d.isdigit() else None
        if st is not None and st[1] == pid and comm_of(d) == "slirp4netns":
            out.append(int(d))
    return out


def comm_of(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def run_probe(sb, fam: str, addr: str) -> str:
    r = sb.exec(f"python3 -c {shlex.quote(PROBE)} {fam} {shlex.quote(addr)}", timeout=20)
    assert r.exit_code == 0, r.stderr
    return r.stdout.strip()


def host_probe(fam: str, addr: str) -> str:
    """The same probe on the host: the listener is reachable there (the probe works)."""
    r = subprocess.run([sys.executable, "-c", PROBE, fam, addr], capture_output=True,
                       text=True, timeout=20)
    return r.stdout.strip()


def got_connection(lsock: socket.socket) -> bool:
    """A connection reached the listener's accept queue (drains it)."""
    hit = False
    while select.select([lsock], [], [], 0)[0]:
        lsock.accept()[0].close()
        hit = True
    return hit


def listener(fam: str) -> tuple[socket.socket, str]:
    """A host listener of kind ``fam`` and the probe's address for it."""
    if fam == "tcp4":
        s = socket.create_server(("127.0.0.1", 0))
        return s, f"127.0.0.1:{s.getsockname()[1]}"
    if fam == "tcp6":
        try:
            s = socket.create_server(("::1", 0), family=socket.AF_INET6)
        except OSError as e:
            pytest.skip(f"this host has no IPv6 loopback: {e}")
        return s, f"[::1]:{s.getsockname()[1]}"
    name = f"trsi-test-net-{os.getpid()}-{time.monotonic_ns()}"
    s = socket.socket(socket.AF_UNIX)
    s.bind("\0" + name)
    s.listen()
    return s, name


@pytest.fixture
def netbox():
    """An open local-bwrap sandbox with network=True; closed, and checked clean, after."""
    need_user_net()
    opened = []

    def make(**kw):
        sb = open_sandbox(SandboxSpec(**kw), backend="local-bwrap")
        opened.append(sb)
        return sb

    yield make
    for sb in opened:
        sb.close()
        assert_no_leftovers(sb.id)
    assert helpers_of(os.getpid()) == []


@pytest.mark.parametrize("where", ["exec", "session"])
@pytest.mark.parametrize("fam", ["tcp4", "tcp6", "unix"])
def test_host_loopback_and_abstract_sockets_are_unreachable(netbox, fam, where):
    lsock, addr = listener(fam)
    with lsock:
        assert host_probe(fam, addr) == "connected"
        assert got_connection(lsock)
        sb = netbox(network=True)
        if where == "session":
            need(shutil.which("tmux") is not None, "tmux (apt-get install tmux)")
            term = sb.open_session()
            sb.put_files({"probe.py": PROBE.encode()})  # one line to type: one prompt
            out = term.run(f"python3 probe.py {fam} {shlex.quote(addr)}\n", timeout=20)
            assert out.done and "failed" in out.text and "connected" not in out.text, out
        assert run_probe(sb, fam, addr).startswith("failed")
        assert not got_connection(lsock)


def test_gateway_does_not_reach_host_loopback(netbox):
    lsock, addr = listener("tcp4")
    port = addr.rsplit(":", 1)[1]
    with lsock:
        sb = netbox(network=True)
        for gw in ("10.0.2.2", "10.0.2.3"):  # slirp's host alias and its DNS alias
            assert run_probe(sb, "tcp4", f"{gw}:{port}").startswith("failed"), gw
        assert not got_connection(lsock)


def test_network_true_has_an_interface_a_route_and_loopback(netbox):
    sb = netbox(network=True)
    r = sb.exec(f"python3 -c {shlex.quote(NETINFO)}", timeout=20)
    assert r.exit_code == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["default"], info
    assert info["ifaces"]["lo"]["up"] and info["ifaces"]["lo"]["addr"] == "127.0.0.1"
    assert info["ifaces"]["tap0"] == {"up": True, "addr": "10.0.2.100"}, info
    r = sb.exec(f"python3 -c {shlex.quote(LOOPBACK)}", timeout=20)
    assert (r.exit_code, r.stdout) == (0, "PING\n"), r.stderr


def test_network_true_reaches_outside(netbox):
    reachable = []
    for host, port in OUTSIDE:
        try:
            socket.create_connection((host, port), timeout=3).close()
            reachable.append((host, port))
        except OSError:
            pass
    if not reachable:
        pytest.skip(f"this host reaches none of {OUTSIDE} (no outside network); the other "
                    "tests still show the sandbox's network is up")
    sb = netbox(network=True)
    host, port = reachable[0]
    assert run_probe(sb, "tcp4", f"{host}:{port}") == "connected"  # DNS, then TCP


def test_network_false_has_loopback_only(netbox):
    sb = netbox(network=False)
    r = sb.exec(f"python3 -c {shlex.quote(NETINFO)}", timeout=20)
    info = json.loads(r.stdout)
    assert list(info["ifaces"]) == ["lo"] and not info["default"], info
    assert run_probe(sb, "tcp4", "192.0.2.1:80") == "failed ENETUNREACH"
    r = sb.exec(f"python3 -c {shlex.quote(LOOPBACK)}", timeout=20)
    assert (r.exit_code, r.stdout) == (0, "PING\n"), r.stderr
    assert helpers_of(os.getpid()) == []


def test_no_helper_outlives_exec_session_or_close(netbox):
    need(shutil.which("tmux") is not None, "tmux (apt-get install tmux)")
    me = os.getpid()
    sb = netbox(network=True)
    assert sb.exec("true", timeout=20).exit_code == 0
    assert helpers_of(me) == []
    r = sb.exec("sleep 30", timeout=0.5)
    assert r.timed_out and helpers_of(me) == []
    term = sb.open_session()
    assert len(helpers_of(me)) == 1  # the session's, which later execs join
    assert "10.0.2.100" in sb.exec(f"python3 -c {shlex.quote(NETINFO)}", timeout=20).stdout
    assert len(helpers_of(me)) == 1
    term.close()
    assert helpers_of(me) == []
    sb.open_session()
    assert len(helpers_of(me)) == 1
    sb.close()
    assert helpers_of(me) == []


def test_helper_dies_with_a_killed_owner():
    need_user_net()
    need(shutil.which("tmux") is not None, "tmux (apt-get install tmux)")
    base = tempfile.mkdtemp(prefix="trsi-net-", dir="/tmp")  # o+x up to / for the uids
    os.chmod(base, 0o755)
    proc = subprocess.Popen([sys.executable, "-c", OWNER, base], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
    try:
        sid = proc.stdout.readline().strip()
        assert sid, "the owner did not open its sandbox"
        helpers = helpers_of(proc.pid)
        assert len(helpers) == 1
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        while any(os.path.exists(f"/proc/{p}") for p in helpers):
            assert time.monotonic() < deadline, f"slirp4netns {helpers} outlived its owner"
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert sweep_stale(base) == 1
    assert_no_leftovers(sid)
    os.rmdir(base)


def test_host_without_the_tool_refuses_network(monkeypatch):
    need_bwrap()
    real = local._tool
    monkeypatch.setattr(local, "_tool", lambda n: None if n == "slirp4netns" else real(n))
    with pytest.raises(InfrastructureError, match="apt-get install slirp4netns"):
        open_sandbox(SandboxSpec(network=True), backend="local-bwrap")
    monkeypatch.setattr(local, "_tool", real)
    access = os.access
    monkeypatch.setattr(local.os, "access",
                        lambda path, mode: path != "/dev/net/tun" and access(path, mode))
    assert "chmod 0666 /dev/net/tun" in (user_net_problem() or "")
    monkeypatch.undo()
    sb = open_sandbox(SandboxSpec(), backend="local-bwrap")  # no network: no tool needed
    try:
        assert sb.exec("true", timeout=20).exit_code == 0
    finally:
        sb.close()
    assert_no_leftovers(sb.id)


def test_a_failing_helper_fails_the_exec_before_the_command_runs(netbox, monkeypatch):
    sb = netbox(network=True)
    real = local._tool
    monkeypatch.setattr(local, "_tool", lambda n: "/bin/false" if n == "slirp4netns" else real(n))
    with pytest.raises(InfrastructureError, match="slirp4netns could not set up"):
        sb.exec("touch /workspace/ran", timeout=20)
    assert not os.path.exists(os.path.join(sb.ws, "ran"))
    assert helpers_of(os.getpid()) == []
    monkeypatch.setattr(local, "_tool", real)
    assert sb.exec("touch /workspace/ran", timeout=20).exit_code == 0
