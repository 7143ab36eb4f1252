"""Shared pieces of the launchers: the experiments/run.py command line, checks, printing.

Every launcher runs the same command on every process:

    TERMINAL_RSI_DISTRIBUTED=1 python3 experiments/run.py --config=configs/X.py --workdir=W \
        [--config.a.b=v ...] [--config.tasks.backend=http://sbx0:8765,http://sbx1:8765]

`TERMINAL_RSI_DISTRIBUTED=1` makes experiments/run.py call `jax.distributed.initialize` for
any experiment (terminal_rsi.runtime.sharding.maybe_initialize_distributed); the coordinator
address, process count and id come from JAX's TPU auto-detection or from TERMINAL_RSI_* variables
the SLURM script sets per task.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_BRIDGE_PORT = 8765
REMOTE_TOKEN_NAME = ".terminal_rsi_sandbox_token"
# What a tarball of the project leaves out (relative to the repository root).
TAR_EXCLUDES = ("./.git", "./runs", "./.venv", "*/__pycache__", "./.pytest_cache",
                "./.ruff_cache", "./*.egg-info")


class LaunchError(ValueError):
    """A launcher argument is wrong; the message says which and how to fix it."""


@dataclasses.dataclass(frozen=True)
class Step:
    """One command of a launch plan.

    kind: "run" (always), "check" (its exit status decides the next "if_failed" step),
    "if_failed" (runs only when the preceding "check" failed).
    """

    argv: tuple[str, ...]
    note: str
    kind: str = "run"

    def render(self) -> str:
        return f"# {self.note}\n{shlex.join(self.argv)}"


def load_config(config_path: str):
    """Load `configs/X.py` (relative to the repository root or absolute) -> ConfigDict."""
    path = config_path if os.path.isabs(config_path) else os.path.join(REPO, config_path)
    if not config_path.endswith(".py") or not os.path.isfile(path):
        raise LaunchError(f"--config={config_path!r} is not a config file; give a path like "
                          "configs/rpr_phase.py (relative to the repository root)")
    spec = importlib.util.spec_from_file_location("_launch_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "get_config"):
        raise LaunchError(f"{config_path} defines no get_config()")
    return module.get_config()


def host_url(host: str) -> str:
    """'sbx0' -> 'http://sbx0:8765'; 'sbx0:9000' and full http(s) URLs are kept."""
    host = host.strip()
    if not host or any(c.isspace() for c in host) or "," in host:
        raise LaunchError(f"bad sandbox host {host!r}; give host, host:port or http://host:port")
    if host.startswith(("http://", "https://")):
        return host.rstrip("/")
    if re.fullmatch(r"[^:/]+", host):
        return f"http://{host}:{DEFAULT_BRIDGE_PORT}"
    if re.fullmatch(r"[^:/]+:\d{1,5}", host):
        return f"http://{host}"
    raise LaunchError(f"bad sandbox host {host!r}; give host, host:port or http://host:port")


def split_hosts(hosts: str | None) -> list[str]:
    return [h for h in (hosts or "").split(",") if h.strip()]


def run_argv(config_path: str, workdir: str, overrides: Sequence[str],
             sandbox_hosts: str | None = None, python: str = "python3") -> list[str]:
    """The experiments/run.py argv; checks the config, its experiment and every override."""
    from terminal_rsi.config.configuration import flatten
    from terminal_rsi.config.registry import EXPERIMENTS

    if not workdir:
        raise LaunchError("--workdir is required (on a pod or cluster: shared storage, e.g. "
                          "gs://bucket/run or /shared/runs/x, so every process sees it)")
    config = load_config(config_path)
    name = config.get("experiment")
    if name not in EXPERIMENTS:
        raise LaunchError(f"{config_path}: config.experiment = {name!r} is not registered; "
                          f"choose one of {', '.join(sorted(EXPERIMENTS))}")
    fields = set(flatten(config))
    args = [python, "experiments/run.py", f"--config={config_path}", f"--workdir={workdir}"]
    for o in overrides:
        m = re.fullmatch(r"--config\.([A-Za-z0-9_.]+)=(.*)", o, flags=re.S)
        if not m:
            raise LaunchError(f"unknown argument {o!r}; config overrides look like "
                              "--config.a.b=value, launcher options are listed by --help")
        if m.group(1) not in fields:
            raise LaunchError(f"override {o!r}: {config_path} has no field {m.group(1)!r}")
        args.append(o)
    urls = [host_url(h) for h in split_hosts(sandbox_hosts)]
    if urls:
        if "tasks.backend" not in fields:
            raise LaunchError(f"--sandbox-hosts given but {config_path} has no tasks.backend "
                              "field (its experiment runs no sandboxes)")
        args.append("--config.tasks.backend=" + ",".join(urls))
    return args


def parse_env(items: Sequence[str] | None) -> dict[str, str]:
    """`--env=KEY=VALUE` arguments -> dict (LaunchError on a malformed one)."""
    out = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise LaunchError(f"--env={item!r}: use --env=NAME=VALUE (NAME: letters, digits, _)")
        out[key] = value
    return out


def env_prefix(env: dict[str, str]) -> str:
    """'K=V ...' for a remote shell; values are quoted unless they are $VARIABLE references."""
    parts = []
    for k, v in env.items():
        quoted = v if re.fullmatch(r"[$A-Za-z0-9_./:{}-]+", v) else shlex.quote(v)
        parts.append(f"{k}={quoted}")
    return " ".join(parts)


def tarball_step(path: str) -> Step:
    argv = ["tar", "-czf", path]
    for e in TAR_EXCLUDES:
        argv.append(f"--exclude={e}")
    argv += ["-C", REPO, "."]
    return Step(tuple(argv), "pack the project (working tree, without .git and runs/)")


def print_plan(header: Sequence[str], steps: Sequence[Step], out=None) -> None:
    out = out or sys.stdout
    for line in header:
        print(f"# {line}", file=out)
    i = 0
    while i < len(steps):  # a pasteable shell script: check || if_failed on one line
        s = steps[i]
        nxt = steps[i + 1] if i + 1 < len(steps) else None
        if s.kind == "check" and nxt is not None and nxt.kind == "if_failed":
            print(f"# {s.note}; otherwise: {nxt.note}", file=out)
            print(f"{shlex.join(s.argv)} >/dev/null 2>&1 || {shlex.join(nxt.argv)}", file=out)
            i += 2
            continue
        print(s.render(), file=out)
        i += 1


def execute(steps: Sequence[Step]) -> int:
    """Run the plan; a failing "check" selects the following "if_failed" step."""
    check_failed = False
    for s in steps:
        if s.kind == "if_failed" and not check_failed:
            print(f"skip: {s.note}", flush=True)
            continue
        print(f"+ {shlex.join(s.argv)}", flush=True)
        rc = subprocess.run(list(s.argv)).returncode
        if s.kind == "check":
            check_failed = rc != 0
            continue
        if rc != 0:
            print(f"error: step failed with exit status {rc}: {s.note}", file=sys.stderr)
            return rc
    return 0


def cli_error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2
