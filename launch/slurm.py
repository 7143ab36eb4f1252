"""Run an experiment on a multi-node GPU cluster with SLURM (multi-host JAX, one process/node).

    python launch/slurm.py --nodes=2 --gpus-per-node=8 --partition=gpu --time=04:00:00 \
        --config=configs/rpr_phase.py --workdir=/shared/runs/rpr1 \
        [--account=A] [--setup='source .venv/bin/activate'] [--sandbox-hosts=sbx0,sbx1 \
        --sandbox-token-file=...] [--config.a.b=v ...] [--dry-run]

Renders a batch script from the arguments (--dry-run prints it and the sbatch command;
otherwise it is written to --script and submitted). The script exports the coordinator
(first node of the allocation, --port), the process count (SLURM_NTASKS) and
TERMINAL_RSI_DISTRIBUTED=1, then `srun` starts one task per node, each setting
TERMINAL_RSI_PROCESS_ID=$SLURM_PROCID and running the same experiments/run.py command; each
process drives all GPUs of its node.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from launch.common import (  # noqa: E402
    REPO,
    LaunchError,
    Step,
    cli_error,
    execute,
    parse_env,
    run_argv,
)
from terminal_rsi.runtime.atomic import atomic_write_text  # noqa: E402

_TIME = re.compile(r"(\d+-)?\d{1,2}:\d{2}:\d{2}|\d+")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python launch/slurm.py", description=__doc__.split(
        "\n")[0], epilog="Other --config.a.b=value arguments are passed to experiments/run.py.")
    p.add_argument("--nodes", type=int, required=True, help="nodes = JAX processes")
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--cpus-per-task", type=int, default=16)
    p.add_argument("--mem", default=None, help="memory per node, e.g. 400G (default: SLURM's)")
    p.add_argument("--partition", default=None)
    p.add_argument("--account", default=None)
    p.add_argument("--qos", default=None)
    p.add_argument("--time", default="04:00:00", help="[D-]HH:MM:SS or minutes")
    p.add_argument("--job-name", default="terminal_rsi")
    p.add_argument("--port", type=int, default=12355, help="coordinator port on the first node")
    p.add_argument("--project-dir", default=REPO, help="the checkout on the shared filesystem")
    p.add_argument("--setup", default=None,
                   help="shell line run first, e.g. 'source .venv/bin/activate'")
    p.add_argument("--python", default="python3")
    p.add_argument("--log-dir", default=None, help="default: <project-dir>/runs/slurm")
    p.add_argument("--script", default=None, help="where to write the batch script "
                   "(default: <log-dir>/<job-name>.sbatch)")
    p.add_argument("--config", required=True, help="configs/<name>.py")
    p.add_argument("--workdir", required=True, help="shared storage every node sees")
    p.add_argument("--sandbox-hosts", default=None,
                   help="comma-separated bridge hosts -> --config.tasks.backend")
    p.add_argument("--sandbox-token-file", default=None,
                   help="token file of the sandbox hosts, readable on every node")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="environment variable exported in the batch script (repeatable)")
    p.add_argument("--dry-run", action="store_true", help="print the script, submit nothing")
    return p


def render(argv: list[str]) -> tuple[str, str]:
    """(batch script text, its path) for the command line; LaunchError on bad arguments."""
    args, rest = parser().parse_known_args(argv)
    if args.nodes < 1:
        raise LaunchError(f"--nodes={args.nodes}: need at least 1 node")
    if args.gpus_per_node < 0 or args.cpus_per_task < 1:
        raise LaunchError("--gpus-per-node must be >= 0 and --cpus-per-task >= 1")
    if not 1024 <= args.port <= 65535:
        raise LaunchError(f"--port={args.port}: use an unprivileged port in [1024, 65535]")
    if not _TIME.fullmatch(args.time):
        raise LaunchError(f"--time={args.time!r}: use [D-]HH:MM:SS or minutes, e.g. 04:00:00")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", args.job_name):
        raise LaunchError(f"--job-name={args.job_name!r}: letters, digits, '_', '.', '-' only")
    if args.sandbox_token_file and not args.sandbox_hosts:
        raise LaunchError("--sandbox-token-file without --sandbox-hosts: name the hosts too")
    run = run_argv(args.config, args.workdir, rest, args.sandbox_hosts, python=args.python)
    log_dir = args.log_dir or os.path.join(args.project_dir, "runs", "slurm")
    script = args.script or os.path.join(log_dir, f"{args.job_name}.sbatch")

    sb = [f"--job-name={args.job_name}", f"--nodes={args.nodes}", "--ntasks-per-node=1",
          f"--cpus-per-task={args.cpus_per_task}", f"--time={args.time}",
          f"--output={log_dir}/%x-%j.out"]
    if args.gpus_per_node:
        sb.insert(3, f"--gpus-per-node={args.gpus_per_node}")
    for flag in ("mem", "partition", "account", "qos"):
        if getattr(args, flag):
            sb.append(f"--{flag}={getattr(args, flag)}")
    lines = ["#!/bin/bash"] + [f"#SBATCH {s}" for s in sb] + [
        "# Generated by launch/slurm.py: one JAX process per node, all GPUs of the node each.",
        "set -euo pipefail",
        f"cd {shlex.quote(args.project_dir)}",
    ]
    if args.setup:
        lines.append(args.setup)
    lines += [f"export {k}={shlex.quote(v)}" for k, v in parse_env(args.env).items()]
    lines += [
        'COORDINATOR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)',
        f'export TERMINAL_RSI_COORDINATOR_ADDRESS="$COORDINATOR:{args.port}"',
        'export TERMINAL_RSI_NUM_PROCESSES="$SLURM_NTASKS"',
        "export TERMINAL_RSI_DISTRIBUTED=1",
    ]
    if args.sandbox_token_file:
        lines.append("export TERMINAL_RSI_SANDBOX_TOKEN_FILE="
                     + shlex.quote(os.path.expanduser(args.sandbox_token_file)))
    per_task = "export TERMINAL_RSI_PROCESS_ID=$SLURM_PROCID; exec " + shlex.join(run)
    lines.append(f"srun --nodes={args.nodes} --ntasks-per-node=1 --kill-on-bad-exit=1 "
                 f"bash -c {shlex.quote(per_task)}")
    return "\n".join(lines) + "\n", script


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        text, script = render(argv)
    except LaunchError as e:
        return cli_error(str(e))
    if "--dry-run" in argv:
        print(f"# batch script ({script}):")
        print(text, end="")
        print(f"# submit with:\nsbatch {shlex.quote(script)}")
        return 0
    os.makedirs(os.path.dirname(os.path.abspath(script)), exist_ok=True)
    for line in text.splitlines():  # sbatch does not create the --output directory
        if line.startswith("#SBATCH --output="):
            os.makedirs(os.path.dirname(line.partition("=")[2]), exist_ok=True)
    atomic_write_text(script, text)
    return execute([Step(("sbatch", script), "submit")])


if __name__ == "__main__":
    sys.exit(main())
