"""Terminal sessions through the HTTP bridge and the pool, over real loopback HTTP: state
persists between runs, exec reaches what the session serves, C-c interrupts, closing the
sandbox (or reaping it) ends the session, malformed requests are 400s naming the field."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from terminal_rsi.sandbox import BadRequest, SandboxLost, SandboxPool, SandboxSpec
from terminal_rsi.sandbox.procs import pids_with_env
from terminal_rsi.sandbox.remote import BridgeClient, RemoteSandbox, RemoteSession
from terminal_rsi.sandbox.serve import SandboxManager, ServerLimits

from .conftest import BridgeServer, assert_no_leftovers, need_bwrap

FETCH = ("python3 -c \"import time, urllib.request\n"
         "for _ in range(100):\n"
         "    try:\n"
         "        print(urllib.request.urlopen('http://127.0.0.1:{port}/').status); break\n"
         "    except OSError:\n"
         "        time.sleep(0.05)\n\"")


@pytest.fixture
def sb(bridge):
    s = RemoteSandbox.create(bridge.url, SandboxSpec(), token=bridge.token)
    yield s
    s.close()
    assert_no_leftovers(s.id)


@pytest.fixture
def term(sb):
    t = sb.open_session()
    yield t
    t.close()


def test_cd_and_export_persist_across_runs(term):
    assert isinstance(term, RemoteSession) and term.alive
    out = term.run("mkdir sub; cd sub; export X=42\n", 5)
    assert out.done and out.exit_code == 0 and out.alive
    out = term.run("pwd; echo X=$X\n", 5)
    assert out.done and "/workspace/sub\n" in out.text and "X=42\n" in out.text
    out = term.run("(exit 3)\n", 5)
    assert out.done and out.exit_code == 3


def test_exec_reaches_a_server_the_session_started(sb, term):
    port = 8765
    out = term.run(f"python3 -m http.server {port} >/dev/null 2>&1 &\n", 5)
    assert out.done and out.exit_code == 0
    r = sb.exec(FETCH.format(port=port), timeout=10)
    assert r.stdout == "200\n", r
    assert term.run("jobs\n", 5).text.count("Running") == 1  # exec spared the server


def test_ctrl_c_interrupts_a_running_command(term):
    out = term.run("sleep 100\n", 0.5)
    assert not out.done and out.alive and 0.4 < out.duration_s < 3
    out = term.run("C-c", 5)
    assert out.done and out.exit_code == 130
    assert term.run("echo back\n", 5).text.count("back\n") == 2  # the echoed line and its output


def test_send_wait_read(term):
    term.send("echo one; sleep 0.3; echo two\n")
    assert term.wait(5, prompts=1)
    out = term.read()
    assert "one\n" in out.text and "two\n" in out.text and out.alive
    assert term.read().text == ""  # read only returns what is new
    out = term.run("echo partial", 2)  # typed, not run (no Enter): done once output is quiet
    assert out.done and out.text == "echo partial"
    assert not term.wait(0.2, prompts=1)  # nothing runs
    term.send("C-u")
    assert term.run("echo whole\n", 5).text == "echo whole\nwhole\n~$ "


def test_ctrl_c_while_another_thread_waits(term):
    """A send (C-c) is not blocked by a wait in flight on the same session."""
    term.send("sleep 100\n")
    done = []
    t = threading.Thread(target=lambda: done.append(term.wait(20, prompts=1)))
    t.start()
    time.sleep(0.3)
    t0 = time.monotonic()
    term.send("C-c")
    t.join(timeout=10)
    assert done == [True] and time.monotonic() - t0 < 5


def test_run_and_exec_run_at_once(bridge, sb, term):
    """A long run does not block an exec on its sandbox nor another sandbox's requests."""
    got = []
    t = threading.Thread(target=lambda: got.append(term.run("sleep 2; echo slept\n", 10)))
    t.start()
    time.sleep(0.3)
    t0 = time.monotonic()
    assert sb.exec("echo beside", timeout=5).stdout == "beside\n"
    with RemoteSandbox.create(bridge.url, SandboxSpec(), token=bridge.token) as other:
        assert other.exec("echo other", timeout=5).stdout == "other\n"
    assert time.monotonic() - t0 < 1.5
    t.join(timeout=15)
    assert got and got[0].done and "slept\n" in got[0].text


def test_closing_the_session_ends_what_it_started(sb):
    term = sb.open_session()
    term.run("sleep 1000 & sleep 1001 &\n", 5)
    assert pids_with_env(f"TRSI_SANDBOX={sb.id}".encode())
    with pytest.raises(BadRequest, match="already has a terminal session"):
        sb.open_session()
    term.close()
    term.close()  # idempotent
    assert_no_leftovers_but_workspace(sb.id)
    assert not term.alive
    with pytest.raises(SandboxLost, match="closed"):
        term.run("true\n", 5)
    again = sb.open_session()  # one at a time: a new one once the old is closed
    assert again.run("echo $((6*7))\n", 5).text.count("42") == 1
    assert sb.exec("echo still", timeout=5).stdout == "still\n"


def assert_no_leftovers_but_workspace(sid: str) -> None:
    for _ in range(100):
        left = pids_with_env(f"TRSI_SANDBOX={sid}".encode())
        if not left:
            return
        time.sleep(0.02)
    raise AssertionError(f"the session of sandbox {sid} left processes behind: {left}")


def test_closing_the_sandbox_ends_its_session(bridge):
    sb = RemoteSandbox.create(bridge.url, SandboxSpec(), token=bridge.token)
    term = sb.open_session()
    term.run("sleep 1000 &\n", 5)
    t = threading.Thread(target=lambda: term.wait(30, prompts=1))  # a wait in flight
    t.start()
    time.sleep(0.2)
    sb.close()
    t.join(timeout=10)
    assert not t.is_alive()
    assert_no_leftovers(sb.id)
    assert not term.alive
    with pytest.raises(SandboxLost):
        term.send("true\n")
    term.close()  # after its sandbox: still fine


def test_reaping_the_sandbox_ends_its_session(tmp_path):
    need_bwrap()
    srv = BridgeServer(str(tmp_path), backend="local-bwrap", ttl=0.5)
    try:
        sb = RemoteSandbox.create(srv.url, SandboxSpec(), token=srv.token)
        sb.open_session().run("sleep 1000 &\n", 5)
        deadline = time.monotonic() + 10
        while srv.client.metrics().get("sandboxes_reaped", 0) < 1:
            assert time.monotonic() < deadline, "the idle sandbox was not reaped"
            time.sleep(0.1)
        assert_no_leftovers(sb.id)
        with pytest.raises(SandboxLost):
            sb.exec("true", timeout=5)
        sb.close()
    finally:
        srv.stop()


def test_a_session_outlives_the_thread_that_opened_it():
    """The server opens sessions in threads that outlive them (a local session dies with
    the thread that started it), so a web worker thread ending does not end a session."""
    need_bwrap()
    mgr = SandboxManager("local-bwrap", limits=ServerLimits())
    try:
        sid = mgr.create("t/c", SandboxSpec())
        entry = mgr.acquire("t/c", sid)
        t = threading.Thread(target=mgr.open_session, args=(entry, 60.0))
        t.start()
        t.join()
        time.sleep(0.3)
        session = mgr.session_of(entry)
        assert session.alive and session.run("echo ok\n", 5).text.count("ok") == 2
        mgr.release(entry)
    finally:
        mgr.shutdown()
    assert mgr.active() == 0
    assert_no_leftovers(sid)


# bad input: (operation path, JSON body, regex the BadRequest message must match)
BAD = [
    ("", {"lifetime_s": 0}, r"session\.lifetime_s"),
    ("", {"lifetime_s": 1e9}, r"session\.lifetime_s.*3600"),
    ("", {"lifetime_s": "60"}, r"session\.lifetime_s"),
    ("", {"lifetime": 60}, r"unknown field.*lifetime"),
    ("/send", {}, r"send\.keystrokes is required"),
    ("/send", {"keystrokes": 5}, r"send\.keystrokes expected a string"),
    ("/send", {"keystrokes": ["ls\n"]}, r"send\.keystrokes"),
    ("/send", {"keystrokes": "ls\x00\n"}, r"send\.keystrokes holds a NUL"),
    ("/send", {"keystrokes": "x" * 200_000}, r"send\.keystrokes is 200000 bytes"),
    ("/send", {"keystrokes": "ls\n", "enter": True}, r"unknown field.*enter"),
    ("/wait", {}, r"wait\.timeout is required"),
    ("/wait", {"timeout": -1}, r"wait\.timeout"),
    ("/wait", {"timeout": 1e9}, r"wait\.timeout.*3600"),
    ("/wait", {"timeout": True}, r"wait\.timeout"),
    ("/wait", {"timeout": 1, "prompts": -1}, r"wait\.prompts"),
    ("/wait", {"timeout": 1, "prompts": 1.5}, r"wait\.prompts"),
    ("/wait", {"timeout": 1, "settle_s": -0.1}, r"wait\.settle_s"),
    ("/read", {"all": True}, r"unknown field.*all"),
    ("/run", {"keystrokes": "ls\n"}, r"run\.timeout is required"),
    ("/run", {"timeout": 1}, r"run\.keystrokes is required"),
    ("/run", {"keystrokes": "ls\n", "timeout": -1}, r"run\.timeout"),
    ("/run", {"keystrokes": "ls\n", "timeout": 86400}, r"run\.timeout.*3600"),
    ("/run", b'{"keystrokes": "\\ud800", "timeout": 1}', r"run\.keystrokes holds a lone surrogate"),
    ("/wait", b'{"timeout": NaN}', r"wait\.timeout must be a finite number"),
    ("/run", b'{"keystrokes": "", "timeout": Infinity}', r"run\.timeout must be a finite"),
    ("/run", b'{"keystrokes": "", "timeout": 1', r"run: the body is not JSON"),
    ("/wait", b'[1]', r"wait: the body must be a JSON object"),
]


def test_bad_input_is_a_400_naming_the_field(bridge, sb):
    c = sb.client  # the sandbox belongs to the client that made it
    path = f"/v1/sandboxes/{sb.id}/session"
    with pytest.raises(BadRequest, match="has no terminal session"):
        c.request("POST", path + "/run", json={"keystrokes": "ls\n", "timeout": 1})
    for _op, body, match in BAD[:4]:
        with pytest.raises(BadRequest, match=match):
            c.request("POST", path, json=body)
    term = sb.open_session()
    for op, body, match in BAD[4:]:
        raw = {"content": body} if isinstance(body, bytes) else {"json": body}
        with pytest.raises(BadRequest, match=match):
            c.request("POST", path + op, **raw)
    with pytest.raises(BadRequest, match="query parameter"):
        c.request("POST", path + "/read", params={"x": "1"})
    with pytest.raises(BadRequest, match=r"limit"):
        c.request("POST", path + "/wait", content=b" " * (1 << 20))
    with pytest.raises(BadRequest, match="malformed"):
        c.request("POST", "/v1/sandboxes/no.such/session/read")
    with pytest.raises(SandboxLost):
        c.request("POST", "/v1/sandboxes/feedbeef/session/read")
    # the client checks before sending, with the same messages
    with pytest.raises(BadRequest, match="keystrokes"):
        term.run(5, 1)
    with pytest.raises(BadRequest, match="timeout"):
        term.wait(-1)
    with pytest.raises(BadRequest, match="prompts"):
        term.wait(1, prompts=-2)
    with pytest.raises(BadRequest, match="lifetime_s"):
        sb.open_session(lifetime_s=0)
    assert term.alive and term.run("echo fine\n", 5).text.count("fine") == 2
    assert bridge.client.health()["ok"]


@pytest.mark.parametrize("endpoint", ["local-bwrap", "bridge"])
def test_a_pooled_sandbox_has_a_working_session(bridge, endpoint):
    need_bwrap()
    target = bridge.url if endpoint == "bridge" else endpoint
    with SandboxPool([target], max_concurrent=2, token=bridge.token) as pool:
        sb = pool.open(SandboxSpec())
        term = sb.open_session()
        out = term.run("cd /tmp && export Y=7\n", 5)
        assert out.done and out.exit_code == 0
        assert "/tmp:7\n" in term.run("echo $PWD:$Y\n", 5).text
        term.run("python3 -m http.server 8766 >/dev/null 2>&1 &\n", 5)
        assert sb.exec(FETCH.format(port=8766), timeout=10).stdout == "200\n"
        term.send("sleep 100\n")
        assert not term.wait(0.3, prompts=1)
        assert term.run("C-c", 5).exit_code == 130
        assert term.alive
        term.close()
        assert not term.alive
        sb.close()
        assert_no_leftovers(sb.id)
        assert pool.up() == {target: True}


def test_session_routes_need_the_token_and_the_owner(bridge, sb):
    base = f"{bridge.url}/v1/sandboxes/{sb.id}/session"
    routes = [("POST", "", None), ("GET", "", None), ("DELETE", "", None),
              ("POST", "/send", {"keystrokes": "id\n"}), ("POST", "/wait", {"timeout": 1}),
              ("POST", "/read", None), ("POST", "/run", {"keystrokes": "id\n", "timeout": 1})]
    for method, op, body in routes:
        assert httpx.request(method, base + op, json=body).status_code == 401
    other = BridgeClient(bridge.url, token=bridge.token)  # same token, another client
    try:
        for method, op, body in routes:
            with pytest.raises(SandboxLost, match="not yours"):
                other.request(method, f"/v1/sandboxes/{sb.id}/session{op}", json=body)
    finally:
        other.close()
    assert sb.open_session().run("echo mine\n", 5).text.count("mine") == 2
