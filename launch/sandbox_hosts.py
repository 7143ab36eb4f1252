"""Bring up sandbox hosts: Docker engine, the sandbox image, the bridge as a systemd service.

    python launch/sandbox_hosts.py --hosts=sbx0,sbx1 [--ssh-user=root] [--port=8765] \
        [--backend=docker] [--token-file=~/.config/terminal_rsi/sandbox_tokens] [--dry-run]

For every host (over ssh; `localhost` runs the commands here):
1. Debian packages (docker.io, debootstrap, bubblewrap, tmux, python3-venv) and the Docker engine
   as a service (`systemctl enable --now docker`);
2. the project (a tarball of this working tree) in --install-dir with its own venv and the
   `sandbox` extra;
3. the sandbox image, built offline (`python -m terminal_rsi.sandbox.image build`);
4. the shared token (one token file, created here if missing, copied to every host);
5. the bridge (`python -m terminal_rsi.sandbox.serve`) as the systemd unit
   terminal-rsi-sandbox.service (restarts on failure), then a health check.

Finally it prints what trainers need: `--sandbox-hosts=...` for launch/tpu_pod.py and
launch/slurm.py, or `--config.tasks.backend=http://sbx0:8765,...` with
TERMINAL_RSI_SANDBOX_TOKEN_FILE. Run as a user that can ssh to the hosts as root (or pass
--sudo). `launch/sandbox_host.sh` is the foreground variant for one host (private dockerd).
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import shlex
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from launch.common import (  # noqa: E402
    DEFAULT_BRIDGE_PORT,
    LaunchError,
    Step,
    cli_error,
    execute,
    print_plan,
    split_hosts,
    tarball_step,
)

UNIT_NAME = "terminal-rsi-sandbox.service"
APT_PACKAGES = ("docker.io", "debootstrap", "bubblewrap", "tmux", "python3-venv", "python3-pip",
                "curl")
REMOTE_TARBALL = "/tmp/terminal_rsi_project.tar.gz"
REMOTE_UNIT_TMP = "/tmp/" + UNIT_NAME
REMOTE_TOKEN_TMP = "/tmp/terminal_rsi_sandbox_tokens"


def serve_argv(args) -> list[str]:
    """The bridge command the unit runs (flags of terminal_rsi.sandbox.serve)."""
    return [f"{args.install_dir}/.venv/bin/python", "-m", "terminal_rsi.sandbox.serve",
            f"--backend={args.backend}", "--host=0.0.0.0", f"--port={args.port}",
            f"--token-file={args.remote_token_file}", f"--max-sandboxes={args.max_sandboxes}",
            f"--warm={args.warm}", f"--ttl={args.ttl:g}",
            "--base-dir=/var/lib/terminal_rsi/sandboxes", "--log-level=info"]


def health_command(port: int, token_file: str, tries: int = 60) -> str:
    """Shell: succeed as soon as the bridge on this host answers /v1/health with the token."""
    return (f"for i in $(seq {tries}); do curl -fsS http://127.0.0.1:{port}/v1/health "
            f"-H \"Authorization: Bearer $(sed -n '/^[^#]/{{s/.*://;p;q}}' {token_file})\" "
            "&& exit 0; sleep 1; done")


def unit_text(args) -> str:
    after = "docker.service network-online.target" if args.backend == "docker" else \
        "network-online.target"
    lines = ["[Unit]",
             f"Description=terminal_rsi sandbox bridge ({args.backend}) on port {args.port}",
             f"After={after}", "Wants=network-online.target"]
    if args.backend == "docker":
        lines.append("Requires=docker.service")
    lines += ["", "[Service]", "Type=simple", f"WorkingDirectory={args.install_dir}",
              "ExecStartPre=/bin/mkdir -p /var/lib/terminal_rsi/sandboxes",
              "ExecStart=" + shlex.join(serve_argv(args)),
              "Restart=on-failure", "RestartSec=5", "TimeoutStopSec=60", "LimitNOFILE=65536",
              "", "[Install]", "WantedBy=multi-user.target", ""]
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python launch/sandbox_hosts.py",
                                description=__doc__.split("\n")[0])
    p.add_argument("--hosts", required=True, help="comma-separated host names (ssh targets)")
    p.add_argument("--ssh-user", default=None)
    p.add_argument("--sudo", action="store_true", help="prefix remote commands with sudo -n")
    p.add_argument("--backend", choices=("docker", "local"), default="docker")
    p.add_argument("--port", type=int, default=DEFAULT_BRIDGE_PORT)
    p.add_argument("--max-sandboxes", type=int, default=64)
    p.add_argument("--warm", type=int, default=8, help="docker: warm containers to keep")
    p.add_argument("--ttl", type=float, default=900.0, help="idle seconds before reaping")
    p.add_argument("--install-dir", default="/opt/terminal_rsi")
    p.add_argument("--token-file", default="~/.config/terminal_rsi/sandbox_tokens",
                   help="local token file (created if missing); trainers use it too")
    p.add_argument("--remote-token-file", default="/etc/terminal_rsi/sandbox_tokens")
    p.add_argument("--tarball", default="/tmp/terminal_rsi_project.tar.gz")
    p.add_argument("--unit-file", default="/tmp/terminal_rsi_sandbox.service",
                   help="local path the rendered unit is written to before copying")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    return p


def plan(argv: list[str]) -> tuple[list[str], list[Step], object]:
    args = parser().parse_args(argv)
    hosts = [h.strip() for h in split_hosts(args.hosts)]
    if not hosts:
        raise LaunchError("--hosts is empty; give comma-separated host names")
    for h in hosts:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", h):
            raise LaunchError(f"--hosts: {h!r} is not a host name (no ports or URLs here; the "
                              "port is --port)")
    if len(set(hosts)) != len(hosts):
        raise LaunchError(f"--hosts lists a host twice: {args.hosts}")
    if not 1 <= args.port <= 65535:
        raise LaunchError(f"--port={args.port} is not a TCP port")
    if args.max_sandboxes < 1 or args.warm < 0 or args.ttl <= 0:
        raise LaunchError("--max-sandboxes must be >= 1, --warm >= 0, --ttl > 0")
    for name in ("install_dir", "remote_token_file"):
        if not os.path.isabs(getattr(args, name)):
            raise LaunchError(f"--{name.replace('_', '-')} must be an absolute path")
    token = os.path.expanduser(args.token_file)

    sudo = "sudo -n " if args.sudo else ""
    steps = [tarball_step(args.tarball)]
    for host in hosts:
        local = host == "localhost"
        target = f"{args.ssh_user}@{host}" if args.ssh_user else host

        def sh(command: str, note: str, target=target, local=local) -> Step:
            cmd = f"{sudo}bash -c {shlex.quote('set -euo pipefail; ' + command)}"
            argv = ("bash", "-c", cmd) if local else ("ssh", target, cmd)
            return Step(argv, note)

        def cp(src: str, dst: str, note: str, target=target, local=local) -> Step:
            return Step(("cp", src, dst) if local else ("scp", "-q", src, f"{target}:{dst}"),
                        note)

        d = args.install_dir
        steps += [
            sh("export DEBIAN_FRONTEND=noninteractive; apt-get update -qq && apt-get install "
               "-y -qq " + " ".join(APT_PACKAGES), f"{host}: Debian packages"),
        ]
        if args.backend == "docker":
            steps.append(sh("systemctl enable --now docker && docker info >/dev/null",
                            f"{host}: Docker engine as a service"))
        steps += [
            cp(args.tarball, REMOTE_TARBALL, f"{host}: copy the project"),
            sh(f"mkdir -p {d} && tar -xzf {REMOTE_TARBALL} -C {d} && "
               f"(test -x {d}/.venv/bin/python || python3 -m venv {d}/.venv) && "
               f"{d}/.venv/bin/pip install -q -e '{d}[sandbox]'",
               f"{host}: install into {d} (venv, sandbox extra)"),
        ]
        if args.backend == "docker":
            steps.append(sh(f"cd {d} && {d}/.venv/bin/python -m terminal_rsi.sandbox.image build",
                            f"{host}: build the sandbox image offline (debootstrap)"))
        rt = args.remote_token_file
        steps += [
            cp(token, REMOTE_TOKEN_TMP, f"{host}: copy the token"),
            sh(f"install -D -m 600 {REMOTE_TOKEN_TMP} {rt} && rm -f {REMOTE_TOKEN_TMP}",
               f"{host}: install the token (mode 600)"),
            cp(args.unit_file, REMOTE_UNIT_TMP, f"{host}: copy the systemd unit"),
            sh(f"install -m 644 {REMOTE_UNIT_TMP} /etc/systemd/system/{UNIT_NAME} && "
               f"systemctl daemon-reload && systemctl enable {UNIT_NAME} && "
               f"systemctl restart {UNIT_NAME}", f"{host}: start the bridge service"),
            sh(health_command(args.port, rt) + f"; journalctl -u {UNIT_NAME} -n 50 "
               "--no-pager; exit 1", f"{host}: health check"),
        ]
    urls = ",".join(f"http://{h}:{args.port}" for h in hosts)
    header = [f"{len(hosts)} sandbox host(s), backend {args.backend}, port {args.port}",
              f"token file {token} (created if missing); unit {UNIT_NAME}:",
              *unit_text(args).splitlines(),
              "trainers: --sandbox-hosts=" + ",".join(f"{h}:{args.port}" for h in hosts)
              + f" --sandbox-token-file={args.token_file}",
              f"  or --config.tasks.backend={urls} with TERMINAL_RSI_SANDBOX_TOKEN_FILE={token}"]
    return header, steps, args


def ensure_token(path: str) -> None:
    if os.path.exists(path):
        return
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"trainer:{secrets.token_hex(24)}\n")
    print(f"wrote a new token to {path}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        header, steps, args = plan(argv)
    except LaunchError as e:
        return cli_error(str(e))
    if args.dry_run:
        print_plan(header, steps)
        return 0
    from terminal_rsi.runtime.atomic import atomic_write_text

    ensure_token(os.path.expanduser(args.token_file))
    atomic_write_text(args.unit_file, unit_text(args))
    rc = execute(steps)
    if rc == 0:
        print("\n".join(header[-2:]))
    return rc


if __name__ == "__main__":
    sys.exit(main())
