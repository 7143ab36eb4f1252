"""launch/sandbox_hosts.py (commands, unit, errors), the unit's bridge command and health
check run for real on loopback, and a trainer reaching two sandbox hosts listed in
`tasks.backend` (comma-separated bridge URLs, token from TERMINAL_RSI_SANDBOX_TOKEN_FILE)."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest

from launch import sandbox_hosts
from launch.common import REPO, LaunchError
from terminal_rsi.sandbox import BadRequest, SandboxSpec, host_pool, open_sandbox
from tests.launch_standins import free_port
from tests.sandbox.conftest import BridgeServer


def _cmd(step) -> str:
    """The command a step runs on its host (inside `ssh host` / `bash -c`)."""
    inner = shlex.split(step.argv[-1])
    assert inner[:2] == ["bash", "-c"]
    return inner[2].removeprefix("set -euo pipefail; ")


def test_plan_two_hosts_exact(tmp_path):
    header, steps, args = sandbox_hosts.plan(
        ["--hosts=sbx0,sbx1", "--ssh-user=root", f"--token-file={tmp_path}/tok"])
    assert args.backend == "docker"
    assert steps[0].argv[:3] == ("tar", "-czf", "/tmp/terminal_rsi_project.tar.gz")
    per_host = steps[1:]
    assert len(per_host) == 2 * 10
    sbx0 = per_host[:10]
    assert [s.argv[0] for s in sbx0] == ["ssh", "ssh", "scp", "ssh", "ssh", "scp", "ssh",
                                         "scp", "ssh", "ssh"]
    assert all(s.argv[1] == "root@sbx0" for s in sbx0 if s.argv[0] == "ssh")
    cmds = [_cmd(s) if s.argv[0] == "ssh" else list(s.argv) for s in sbx0]
    assert cmds[0] == ("export DEBIAN_FRONTEND=noninteractive; apt-get update -qq && apt-get "
                       "install -y -qq docker.io debootstrap bubblewrap tmux python3-venv "
                       "python3-pip curl")
    assert cmds[1] == "systemctl enable --now docker && docker info >/dev/null"
    assert cmds[2] == ["scp", "-q", "/tmp/terminal_rsi_project.tar.gz",
                       "root@sbx0:/tmp/terminal_rsi_project.tar.gz"]
    assert "pip install -q -e '/opt/terminal_rsi[sandbox]'" in cmds[3]
    assert cmds[4] == ("cd /opt/terminal_rsi && /opt/terminal_rsi/.venv/bin/python -m "
                       "terminal_rsi.sandbox.image build")
    assert cmds[5] == ["scp", "-q", f"{tmp_path}/tok", "root@sbx0:/tmp/terminal_rsi_sandbox_tokens"]
    assert cmds[6] == ("install -D -m 600 /tmp/terminal_rsi_sandbox_tokens "
                       "/etc/terminal_rsi/sandbox_tokens && rm -f /tmp/terminal_rsi_sandbox_tokens")
    assert cmds[8].endswith("systemctl enable terminal-rsi-sandbox.service && "
                            "systemctl restart terminal-rsi-sandbox.service")
    assert cmds[9].startswith("for i in $(seq 60); do curl -fsS http://127.0.0.1:8765/v1/health")
    assert header[-2] == (f"trainers: --sandbox-hosts=sbx0:8765,sbx1:8765 "
                          f"--sandbox-token-file={tmp_path}/tok")
    assert header[-1].startswith("  or --config.tasks.backend=http://sbx0:8765,http://sbx1:8765")


def test_local_backend_and_localhost_skip_docker(tmp_path):
    _, steps, args = sandbox_hosts.plan(["--hosts=localhost", "--backend=local", "--sudo"])
    assert all(s.argv[0] in ("tar", "bash", "cp") for s in steps)
    text = " ".join(" ".join(s.argv) for s in steps)
    assert "docker" not in text.replace("docker.io", "") and "image build" not in text
    assert all(s.argv[2].startswith("sudo -n bash -c") for s in steps if s.argv[0] == "bash")
    unit = sandbox_hosts.unit_text(args)
    assert "Requires=docker.service" not in unit and "--backend=local " in unit


@pytest.mark.parametrize("argv,match", [
    (["--hosts="], "empty"),
    (["--hosts=sbx0:8765"], "not a host name"),
    (["--hosts=a,a"], "twice"),
    (["--hosts=a", "--port=70000"], "not a TCP port"),
    (["--hosts=a", "--install-dir=opt"], "absolute"),
])
def test_bad_arguments_are_clear(argv, match):
    with pytest.raises(LaunchError, match=match):
        sandbox_hosts.plan(argv)


def test_unit_command_serves_and_health_check_passes(tmp_path):
    """Start the bridge exactly as the unit's ExecStart does (but on loopback, plain backend,
    here's python) and run the plan's health check against it; a wrong token fails it."""
    port = free_port()
    token = tmp_path / "tokens"
    token.write_text("# comment\ntrainer:s3cret-0123456789abcdef\n")
    token.chmod(0o600)
    _, _, args = sandbox_hosts.plan(["--hosts=localhost", "--backend=local", f"--port={port}",
                                     f"--remote-token-file={token}"])
    argv = sandbox_hosts.serve_argv(args)
    unit = sandbox_hosts.unit_text(args)
    assert "ExecStart=" + shlex.join(argv) in unit.splitlines()
    argv = [sys.executable, *argv[1:]]
    argv = [a.replace("--host=0.0.0.0", "--host=127.0.0.1").replace(
        "--base-dir=/var/lib/terminal_rsi/sandboxes", f"--base-dir={tmp_path}")
        .replace("--backend=local", "--backend=local-plain") for a in argv] + ["--allow-plain"]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        ok = subprocess.run(["bash", "-c", sandbox_hosts.health_command(port, str(token), 40)
                             + "; exit 1"], capture_output=True, text=True, timeout=90)
        assert ok.returncode == 0, (ok.stderr, proc.poll())
        assert '"ok"' in ok.stdout
        bad = tmp_path / "bad"
        bad.write_text("trainer:wrong-0123456789abcdef\n")
        bad.chmod(0o600)
        no = subprocess.run(["bash", "-c", sandbox_hosts.health_command(port, str(bad), tries=1)
                             + "; exit 1"], capture_output=True, text=True, timeout=60)
        assert no.returncode == 1
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_trainer_reaches_two_hosts_listed_in_backend(tmp_path, monkeypatch):
    token = "0123456789abcdef-tok1"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = BridgeServer(str(tmp_path / "a"), backend="local-plain", token=token, allow_plain=True)
    b = BridgeServer(str(tmp_path / "b"), backend="local-plain", token=token, allow_plain=True)
    try:
        token_file = tmp_path / "trainer_token"
        token_file.write_text(f"trainer:{token}\n")
        token_file.chmod(0o600)
        monkeypatch.setenv("TERMINAL_RSI_SANDBOX_TOKEN_FILE", str(token_file))
        backend = f"{a.url},{b.url}"
        opened = [open_sandbox(SandboxSpec(files={"x.txt": b"hi\n"}), backend=backend)
                  for _ in range(4)]
        try:
            assert all(sb.exec("cat x.txt", timeout=30).stdout == "hi\n" for sb in opened)
            pool = host_pool(backend)
            assert pool is host_pool(backend)  # one process-wide pool per host list
            assert pool.stats() == {a.url: 2, b.url: 2}  # spread over both hosts
        finally:
            for sb in opened:
                sb.close()
        assert host_pool(backend).stats() == {a.url: 0, b.url: 0}
        host_pool(backend).close()
    finally:
        a.stop()
        b.stop()


def test_bad_host_list_and_missing_token(monkeypatch):
    with pytest.raises(BadRequest, match="not URLs"):
        open_sandbox(SandboxSpec(), backend="http://a:1,local")
    monkeypatch.delenv("TERMINAL_RSI_SANDBOX_TOKEN_FILE", raising=False)
    monkeypatch.delenv("TERMINAL_RSI_SANDBOX_TOKEN", raising=False)
    from terminal_rsi.sandbox.remote import load_token

    with pytest.raises(BadRequest, match="TERMINAL_RSI_SANDBOX_TOKEN_FILE"):
        load_token()
    monkeypatch.setenv("TERMINAL_RSI_SANDBOX_TOKEN", "abc")
    assert load_token() == "abc"


def test_dry_run_prints_unit_and_commands(tmp_path):
    out = subprocess.run([sys.executable, "launch/sandbox_hosts.py", "--hosts=sbx0",
                          f"--token-file={tmp_path}/tok", "--dry-run"], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert not (tmp_path / "tok").exists()  # a dry run writes nothing
    assert "# ExecStart=/opt/terminal_rsi/.venv/bin/python -m terminal_rsi.sandbox.serve " \
           "--backend=docker --host=0.0.0.0 --port=8765" in out.stdout
    cmds = [ln for ln in out.stdout.splitlines() if not ln.startswith("#")]
    assert len(cmds) == 1 + 10 and cmds[1].startswith("ssh sbx0 ")
    bad = subprocess.run([sys.executable, "launch/sandbox_hosts.py", "--hosts=a:1", "--dry-run"],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "not a host name" in bad.stderr
