"""Hostile input to the bridge, over real loopback HTTP: every malformed request is a 4xx
``bad_request`` naming the field, never a 500, and the server stays healthy; server maxima;
declared plain mode; token files that only their owner may read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx
import pytest

from terminal_rsi.sandbox import BadRequest, SandboxSpec
from terminal_rsi.sandbox.remote import BridgeClient, load_token, read_secret_file
from terminal_rsi.sandbox.serve import (
    MAX_JSON_DEPTH,
    SandboxManager,
    ServerLimits,
    parse_json_object,
    read_tokens,
)

from .conftest import REPO, BridgeServer, need_bwrap

TOKEN = "tests:0123456789abcdef0123\n"
pytestmark = pytest.mark.xdist_group("bridge_input")  # one server for the module, in order


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    need_bwrap()
    s = BridgeServer(str(tmp_path_factory.mktemp("bridge-input")), backend="local-bwrap")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def http(srv):
    c = httpx.Client(base_url=srv.url, timeout=30,
                     headers={"Authorization": f"Bearer {srv.token}", "X-Trsi-Client": "hostile"})
    yield c
    c.close()


@pytest.fixture(scope="module")
def sid(http):
    r = http.post("/v1/sandboxes", json={"spec": {}})
    assert r.status_code == 201, r.text
    yield r.json()["id"]
    http.delete(f"/v1/sandboxes/{r.json()['id']}")


def _j(obj) -> bytes:
    return json.dumps(obj).encode()


# (raw body, words the message must hold): each a create request
CREATE_CASES = {
    "array body": (b"[]", ["create", "JSON object", "array"]),
    "string body": (b'"spec"', ["create", "JSON object", "string"]),
    "100k nested [": (b"[" * 100_000, ["create", "deeper than"]),
    "deep nesting": (b'{"spec": {"env": ' + b"[" * 40 + b"]" * 40 + b"}}", ["deeper than"]),
    "many containers": (b'{"spec": {"env": [' + b"[]," * 200 + b"[]]}}", ["arrays/objects"]),
    "not utf-8": (b'{"spec": {"image": "\xff"}}', ["UTF-8"]),
    "not json": (b'{"spec": ', ["not JSON"]),
    "trailing data": (b'{"spec": {}} {}', ["not JSON"]),
    "repeated key": (b'{"spec": {}, "spec": {"network": true}}', ["repeats", "spec"]),
    "unknown field": (_j({"spec": {}, "shell": "/bin/sh"}), ["shell", "unknown"]),
    "unknown spec field": (_j({"spec": {"privileged": True}}), ["privileged", "unknown"]),
    "spec not object": (_j({"spec": ["x"]}), ["spec must be a JSON object"]),
    "!! base64": (_j({"spec": {"files": {"a.txt": "!!"}}}), ["spec.files", "base64"]),
    "bad padding": (_j({"spec": {"files": {"a.txt": "aGk"}}}), ["spec.files", "base64"]),
    "non-ascii base64": (_j({"spec": {"files": {"a.txt": "aGk\u00e9"}}}), ["spec.files"]),
    "file not text": (_j({"spec": {"files": {"a.txt": 5}}}), ["spec.files", "base64"]),
    "files not object": (_j({"spec": {"files": "aGk="}}), ["spec.files"]),
    "file path escapes": (_j({"spec": {"files": {"../x": "aGk="}}}), ["spec.files", "leaves"]),
    "file path NUL": (_j({"spec": {"files": {"a\0b": "aGk="}}}), ["spec.files", "NUL"]),
    "file path .": (_j({"spec": {"files": {"./": "aGk="}}}), ["spec.files", "workspace itself"]),
    "disk_mb 1e7": (b'{"spec": {"disk_mb": 1e7}}', ["spec.disk_mb", "integer"]),
    "disk_mb 10**7": (_j({"spec": {"disk_mb": 10**7}}), ["spec.disk_mb", "10000000", "4096"]),
    "pids 10**6": (_j({"spec": {"pids": 10**6}}), ["spec.pids", "1000000", "1024"]),
    "memory 9999999": (_j({"spec": {"memory_mb": 9999999}}), ["spec.memory_mb", "9999999"]),
    "memory as text": (_j({"spec": {"memory_mb": "1024"}}), ["spec.memory_mb", "integer"]),
    "memory as bool": (_j({"spec": {"memory_mb": True}}), ["spec.memory_mb", "integer"]),
    "memory 0": (_j({"spec": {"memory_mb": 0}}), ["spec.memory_mb", ">= 1"]),
    "huge int": (b'{"spec": {"pids": ' + b"9" * 5000 + b"}}", ["integer", "digits"]),
    "output 1 GiB": (_j({"spec": {"max_output_bytes": 1 << 30}}), ["spec.max_output_bytes"]),
    "open_files 10**6": (_j({"spec": {"open_files": 10**6}}), ["spec.open_files"]),
    "network": (_j({"spec": {"network": True}}), ["spec.network", "--allow-network"]),
    "network as text": (_j({"spec": {"network": "yes"}}), ["spec.network", "true or false"]),
    "cpus 1e400": (b'{"spec": {"cpus": 1e400}}', ["spec.cpus", "finite"]),
    "cpus NaN": (b'{"spec": {"cpus": NaN}}', ["spec.cpus", "finite"]),
    "cpus 10**4": (_j({"spec": {"cpus": 10**4}}), ["spec.cpus", "10000"]),
    "image NUL": (_j({"spec": {"image": "a\0b"}}), ["spec.image", "NUL"]),
    "image lone surrogate": (b'{"spec": {"image": "\\ud800"}}', ["spec.image", "surrogate"]),
    "env name NUL": (_j({"spec": {"env": {"A\0": "x"}}}), ["spec.env", "NUL"]),
    "env value surrogate": (b'{"spec": {"env": {"A": "\\udfff"}}}', ["spec.env", "surrogate"]),
    "env bad name": (_j({"spec": {"env": {"1A": "x"}}}), ["spec.env", "variable name"]),
    "env 200 KB value": (_j({"spec": {"env": {"A": "x" * 300_000}}}), ["spec.env", "limit"]),
}


@pytest.mark.parametrize("case", list(CREATE_CASES))
def test_create_refuses_bad_input(http, case):
    raw, words = CREATE_CASES[case]
    r = http.post("/v1/sandboxes", content=raw, headers={"Content-Type": "application/json"})
    assert r.status_code == 400, (r.status_code, r.text)
    err = r.json()["error"]
    assert err["kind"] == "bad_request"
    for w in words:
        assert w in err["message"], (w, err["message"])


EXEC_CASES = {
    "array body": (b"[]", ["exec", "JSON object"]),
    "empty body": (b"", ["exec", "empty"]),
    "100k nested [": (b"[" * 100_000, ["exec", "deeper than"]),
    "no command": (_j({"timeout": 5}), ["exec.command", "required"]),
    "command not text": (_j({"command": ["ls"]}), ["exec.command", "string"]),
    "command NUL": (_j({"command": "echo a\0b"}), ["exec.command", "NUL"]),
    "command lone surrogate": (b'{"command": "echo \\ud800"}', ["exec.command", "surrogate"]),
    "command 200 KB": (_j({"command": "x" * 200_000}), ["exec.command", "limit"]),
    "env NUL value": (_j({"command": "true", "env": {"A": "b\0"}}), ["exec.env", "NUL"]),
    "env NUL name": (_j({"command": "true", "env": {"A\0B": "x"}}), ["exec.env", "NUL"]),
    "env surrogate": (b'{"command": "true", "env": {"A": "\\ud800"}}', ["exec.env", "surrogate"]),
    "env 200 KB": (_j({"command": "true", "env": {"A": "x" * 300_000}}), ["exec.env", "limit"]),
    "env many": (_j({"command": "true", "env": {f"V{i}": "x" for i in range(1000)}}),
                 ["exec.env", "entries"]),
    "env bad name": (_j({"command": "true", "env": {"A=B": "x"}}), ["exec.env", "variable"]),
    "env array": (_j({"command": "true", "env": ["A=1"]}), ["exec.env", "mapping"]),
    "env int value": (_j({"command": "true", "env": {"A": 1}}), ["exec.env", "string"]),
    "cwd NUL": (_j({"command": "true", "cwd": "a\0b"}), ["exec.cwd", "NUL"]),
    "cwd absolute": (_j({"command": "true", "cwd": "/etc"}), ["exec.cwd", "absolute"]),
    "cwd escapes": (_j({"command": "true", "cwd": "../.."}), ["exec.cwd", "leaves"]),
    "cwd not text": (_j({"command": "true", "cwd": 5}), ["exec.cwd", "string"]),
    "timeout inf": (b'{"command": "true", "timeout": Infinity}', ["exec.timeout", "inf"]),
    "timeout 1e400": (b'{"command": "true", "timeout": 1e400}', ["exec.timeout", "inf"]),
    "timeout NaN": (b'{"command": "true", "timeout": NaN}', ["exec.timeout", "nan"]),
    "timeout -1": (_j({"command": "true", "timeout": -1}), ["exec.timeout", "-1"]),
    "timeout 0": (_j({"command": "true", "timeout": 0}), ["exec.timeout"]),
    "timeout text": (_j({"command": "true", "timeout": "x"}), ["exec.timeout", "'x'"]),
    "timeout bool": (_j({"command": "true", "timeout": True}), ["exec.timeout", "True"]),
    "timeout above max": (_j({"command": "true", "timeout": 7200}),
                          ["exec.timeout", "3600", "--max-timeout-s"]),
    "unknown field": (_j({"command": "true", "user": "root"}), ["user", "unknown"]),
}


@pytest.mark.parametrize("case", list(EXEC_CASES))
def test_exec_refuses_bad_input(http, sid, case):
    raw, words = EXEC_CASES[case]
    r = http.post(f"/v1/sandboxes/{sid}/exec", content=raw,
                  headers={"Content-Type": "application/json"})
    assert r.status_code == 400, (r.status_code, r.text)
    err = r.json()["error"]
    assert err["kind"] == "bad_request"
    for w in words:
        assert w in err["message"], (w, err["message"])


QUERY_CASES = {
    "dest NUL": ("PUT", {"dest": "a\0b"}, ["dest", "NUL"]),
    "dest absolute": ("PUT", {"dest": "/etc"}, ["dest", "absolute"]),
    "dest escapes": ("PUT", {"dest": "../x"}, ["dest", "leaves"]),
    "dest too long": ("PUT", {"dest": "a" * 5000}, ["dest", "limit"]),
    "dest twice": ("PUT", [("dest", "a"), ("dest", "b")], ["dest", "twice"]),
    "unknown put param": ("PUT", {"mode": "777"}, ["mode", "unknown query parameter"]),
    "path NUL": ("GET", {"path": "a\0"}, ["path", "NUL"]),
    "path absolute": ("GET", {"path": "/etc/shadow"}, ["path", "absolute"]),
    "path empty": ("GET", {"path": ""}, ["path"]),
    "max_bytes text": ("GET", {"max_bytes": "x"}, ["max_bytes", "integer"]),
    "max_bytes negative": ("GET", {"max_bytes": "-1"}, ["max_bytes", "integer"]),
    "max_bytes zero": ("GET", {"max_bytes": "0"}, ["max_bytes", "integer"]),
    "max_bytes huge": ("GET", {"max_bytes": "9" * 40}, ["max_bytes", "integer"]),
    "max_bytes unicode digit": ("GET", {"max_bytes": "\u00b2"}, ["max_bytes", "integer"]),
    "unknown get param": ("GET", {"follow": "1"}, ["follow", "unknown query parameter"]),
}


@pytest.mark.parametrize("case", list(QUERY_CASES))
def test_files_refuse_bad_query(http, sid, case):
    from terminal_rsi.sandbox.base import files_to_tar

    method, params, words = QUERY_CASES[case]
    content = files_to_tar({"x.txt": b"x"}) if method == "PUT" else None
    r = http.request(method, f"/v1/sandboxes/{sid}/files", params=params, content=content)
    assert r.status_code == 400, (r.status_code, r.text)
    err = r.json()["error"]
    assert err["kind"] == "bad_request"
    for w in words:
        assert w in err["message"], (w, err["message"])


def test_other_bad_requests(http, sid):
    r = http.post("/v1/sandboxes/not.an.id/exec", json={"command": "true"})
    assert r.status_code == 400 and "sandbox id" in r.json()["error"]["message"]
    r = http.post(f"/v1/sandboxes/{'a' * 200}/exec", json={"command": "true"})
    assert r.status_code == 400 and "sandbox id" in r.json()["error"]["message"]
    r = http.post("/v1/sandboxes/0123456789abcdef/exec", json={"command": "true"})
    assert r.status_code == 410  # well formed, but no such sandbox
    r = http.post("/v1/sandboxes", params={"x": "1"}, json={"spec": {}})
    assert r.status_code == 400 and "unknown query parameter" in r.json()["error"]["message"]
    r = http.post(f"/v1/sandboxes/{sid}/exec", json={"command": "x" * (5 << 20)})
    assert r.status_code == 413 and "limit" in r.json()["error"]["message"]
    r = http.post(f"/v1/sandboxes/{sid}/exec", json={"command": "true", "cwd": "no/such/dir"})
    assert r.status_code == 400 and "cwd" in r.json()["error"]["message"]


def test_server_stays_healthy_and_never_answered_500(srv, http, sid):
    """Runs after the hostile cases above (one worker, file order): no 500 was ever answered,
    the sandbox the cases were sent to still works, and so does a new one."""
    m = srv.client.metrics()
    assert m.get("errors_infrastructure", 0) == 0 and m.get("errors_sandbox_error", 0) == 0
    r = http.post(f"/v1/sandboxes/{sid}/exec",
                  json={"command": "echo $A; pwd", "timeout": 10, "env": {"A": "ok"}})
    assert r.status_code == 200 and r.json()["stdout"] == "ok\n/workspace\n", r.text
    spec = SandboxSpec(files={"a.txt": b"hi"}, disk_mb=4096, pids=1024, memory_mb=4096)
    r = http.post("/v1/sandboxes", json={"spec": spec.to_json()})  # at the maxima: allowed
    assert r.status_code == 201, r.text
    other = r.json()["id"]
    r = http.post(f"/v1/sandboxes/{other}/exec", json={"command": "cat a.txt", "timeout": 10})
    assert r.json()["stdout"] == "hi"
    assert http.delete(f"/v1/sandboxes/{other}").status_code == 200
    assert srv.proc.poll() is None and srv.client.health()["ok"]


def test_health_reports_the_maxima(srv):
    h = srv.client.health()
    assert h["plain"] is False
    assert h["limits"] == {"max_memory_mb": 4096, "max_disk_mb": 4096, "max_pids": 1024,
                           "max_cpus": float(os.cpu_count()), "max_timeout_s": 3600.0,
                           "max_output_bytes": 16 << 20, "max_open_files": 65536,
                           "allow_network": False}


def test_configured_maxima_are_enforced(tmp_path):
    need_bwrap()
    s = BridgeServer(str(tmp_path), backend="local-bwrap", max_memory_mb=512, max_timeout_s=5,
                     max_disk_mb=64)
    try:
        assert s.client.health()["limits"]["max_memory_mb"] == 512
        with pytest.raises(BadRequest, match=r"spec.memory_mb: asked for 1024.*at most 512"):
            s.client.request("POST", "/v1/sandboxes", json={"spec": {}})  # the default spec
        r = s.client.request("POST", "/v1/sandboxes",
                             json={"spec": {"memory_mb": 512, "disk_mb": 64}})
        sb_id = r.json()["id"]
        with pytest.raises(BadRequest, match=r"exec.timeout.*\(0, 5\]"):
            s.client.request("POST", f"/v1/sandboxes/{sb_id}/exec",
                             json={"command": "true", "timeout": 6})
        r = s.client.request("POST", f"/v1/sandboxes/{sb_id}/exec", json={"command": "echo y"})
        assert r.json()["stdout"] == "y\n"  # no timeout given: min(60 s, the maximum)
    finally:
        s.stop()


def test_allow_network_lets_a_spec_ask_for_it():
    """In process (the CLI flag is --allow-network; ServerLimits.allow_network here)."""
    need_bwrap()
    from starlette.testclient import TestClient

    from terminal_rsi.sandbox.serve import build_app

    token = "0123456789abcdef0123"
    for allow, status in [(False, 400), (True, 201)]:
        mgr = SandboxManager("local-bwrap", limits=ServerLimits(allow_network=allow))
        with TestClient(build_app(mgr, {token: "t"})) as c:
            r = c.post("/v1/sandboxes", json={"spec": {"network": True}},
                       headers={"Authorization": f"Bearer {token}"})
            assert r.status_code == status, r.text
            if allow:
                assert mgr.active() == 1
        assert mgr.active() == 0  # shutdown closed it


def test_server_limits_are_checked():
    assert ServerLimits().max_cpus == float(os.cpu_count())
    for bad in [{"max_memory_mb": 0}, {"max_memory_mb": 1 << 30}, {"max_timeout_s": float("inf")},
                {"max_cpus": -1}, {"max_pids": 1.5}, {"allow_network": "yes"}]:
        with pytest.raises(BadRequest, match=next(iter(bad))):
            ServerLimits(**bad)
    with pytest.raises(BadRequest, match="spec.disk_mb"):
        ServerLimits(max_disk_mb=100).check_spec(vars(SandboxSpec(disk_mb=101)))
    with pytest.raises(BadRequest, match="spec.network"):
        ServerLimits().check_spec(vars(SandboxSpec(network=True)))
    ServerLimits(allow_network=True).check_spec(vars(SandboxSpec(network=True)))


def test_nesting_is_refused_before_the_parser_recurses(monkeypatch):
    import terminal_rsi.sandbox.serve as serve

    calls = []
    monkeypatch.setattr(serve.json, "loads", lambda *a, **k: calls.append(1))
    for raw in [b"[" * 100_000, b"{\"a\":" * 1000, b'{"a": ' + b"[" * (MAX_JSON_DEPTH + 1)]:
        with pytest.raises(BadRequest, match="deeper than"):
            parse_json_object(raw, "x")
    assert not calls
    monkeypatch.undo()
    ok = b'{"a": ' + b"[" * (MAX_JSON_DEPTH - 1) + b"]" * (MAX_JSON_DEPTH - 1) + b"}"
    assert parse_json_object(ok, "x")
    text = b'{"command": "' + b"[[{{" * 10_000 + b'\\"]]"}'  # brackets in a string are text
    assert parse_json_object(text, "x")["command"].startswith("[[{{")
    t0 = time.monotonic()
    with pytest.raises(BadRequest):
        parse_json_object(b'"",' * (10 << 20) + b"[" * 40, "x")  # many strings: refused fast
    assert time.monotonic() - t0 < 5


# ------------------------------------------------------------------ server start
def _serve(tmp_path, *args, env=None, mode=0o600) -> subprocess.CompletedProcess:
    tf = tmp_path / "tokens"
    tf.write_text(TOKEN)
    tf.chmod(mode)
    return subprocess.run([sys.executable, "-m", "terminal_rsi.sandbox.serve", "--port=0",
                           f"--token-file={tf}", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=60, env=env)


def test_server_refuses_a_readable_token_file(tmp_path):
    out = _serve(tmp_path, "--backend=local-bwrap", mode=0o644)
    assert out.returncode == 2 and "chmod 600" in out.stderr, out.stderr


def test_server_refuses_plain_mode_unless_allowed(tmp_path):
    out = _serve(tmp_path, "--backend=local-plain")
    assert out.returncode == 2 and "--allow-plain" in out.stderr, out.stderr
    # `local` where bubblewrap is missing does not fall back to plain silently either.
    out = _serve(tmp_path, "--backend=local", env={**os.environ, "PATH": str(tmp_path)})
    assert out.returncode == 2 and "bubblewrap" in out.stderr and "--allow-plain" in out.stderr
    with pytest.raises(BadRequest, match="--allow-plain"):
        SandboxManager("local-plain")


def test_server_refuses_bad_maxima(tmp_path):
    for flag in ["--max-memory-mb=0", "--max-timeout-s=inf", "--max-timeout-s=1e9"]:
        out = _serve(tmp_path, "--backend=local-bwrap", flag)
        assert out.returncode == 2 and "ServerLimits" in out.stderr, (flag, out.stderr)


def test_plain_mode_when_allowed_is_declared(tmp_path):
    tf = tmp_path / "tokens"
    tf.write_text(TOKEN)
    tf.chmod(0o600)
    port_file, log = tmp_path / "port", tmp_path / "log"
    proc = subprocess.Popen([sys.executable, "-m", "terminal_rsi.sandbox.serve",
                             "--backend=local-plain", "--allow-plain", "--port=0",
                             f"--port-file={port_file}", f"--token-file={tf}"], cwd=REPO,
                            stdout=open(log, "w"), stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        c = BridgeClient(f"http://127.0.0.1:{port_file.read_text()}", token_file=str(tf))
        while True:
            try:
                assert c.health()["plain"] is True
                break
            except BadRequest:
                raise
            except Exception:  # noqa: BLE001 (still starting)
                assert time.monotonic() < deadline
                time.sleep(0.05)
        c.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    lines = [ln for ln in log.read_text().splitlines() if "--allow-plain" in ln]
    assert len(lines) == 1 and "no filesystem, network" in lines[0], log.read_text()


# ------------------------------------------------------------------ token files
def _token_file(tmp_path, mode: int, name: str = "tok") -> str:
    p = tmp_path / name
    p.write_text(TOKEN)
    p.chmod(mode)
    return str(p)


@pytest.mark.parametrize("read", [read_tokens, lambda p: load_token(token_file=p)],
                         ids=["server", "client"])
def test_token_file_must_be_private(tmp_path, read):
    good = _token_file(tmp_path, 0o600)
    assert read(good) in ({"0123456789abcdef0123": "tests"}, "0123456789abcdef0123")
    assert read(_token_file(tmp_path, 0o400, "ro"))
    for mode in (0o644, 0o640, 0o604, 0o660, 0o602):
        p = _token_file(tmp_path, mode, f"tok{mode:o}")
        with pytest.raises(BadRequest, match=f"chmod 600 {p}") as ei:
            read(p)
        assert f"{mode:04o}" in str(ei.value)
    link = tmp_path / "link"
    link.symlink_to(good)
    with pytest.raises(BadRequest, match="symbolic link"):
        read(str(link))
    with pytest.raises(BadRequest, match="not a regular file"):
        read(str(tmp_path))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(BadRequest, match="not a regular file"):  # and does not block
        read(str(fifo))
    with pytest.raises(BadRequest, match="cannot open"):
        read(str(tmp_path / "missing"))


def test_client_token_file_from_env_must_be_private(tmp_path, monkeypatch):
    monkeypatch.delenv("TERMINAL_RSI_SANDBOX_TOKEN", raising=False)
    monkeypatch.setenv("TERMINAL_RSI_SANDBOX_TOKEN_FILE", _token_file(tmp_path, 0o644))
    with pytest.raises(BadRequest, match="chmod 600"):
        load_token()
    with pytest.raises(BadRequest, match="chmod 600"):
        BridgeClient("http://127.0.0.1:9")
    monkeypatch.setenv("TERMINAL_RSI_SANDBOX_TOKEN_FILE", _token_file(tmp_path, 0o600, "ok"))
    assert load_token() == "0123456789abcdef0123"
    empty = tmp_path / "empty"
    empty.write_text("# no token here\n")
    empty.chmod(0o600)
    with pytest.raises(BadRequest, match="holds no token"):
        load_token(token_file=str(empty))
    assert read_secret_file(_token_file(tmp_path, 0o600, "x")) == TOKEN
