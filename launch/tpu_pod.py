"""Run an experiment on every worker of a Cloud TPU VM pod slice (multi-host JAX).

    python launch/tpu_pod.py --name=trsi-v4 --zone=us-central2-b --accelerator-type=v4-32 \
        --config=configs/rpr_phase.py --workdir=gs://my-bucket/runs/rpr1 \
        [--project=P] [--spot] [--install=copy|git|none] [--sandbox-hosts=sbx0,sbx1 \
        --sandbox-token-file=~/.config/terminal_rsi/sandbox_tokens] [--config.a.b=v ...] [--dry-run]

Plan (printed by --dry-run, executed otherwise):
1. `gcloud compute tpus tpu-vm describe` the slice; create it only if that fails (reuse);
2. install the project on every worker (`--install=copy`: a tarball of this working tree via
   `tpu-vm scp --worker=all`; `git`: clone `--repo-url` at `--ref`; `none`: already there)
   plus `jax[tpu]`;
3. copy the sandbox token (if any) to every worker;
4. `gcloud compute tpus tpu-vm ssh --worker=all --command="cd terminal_rsi &&
   TERMINAL_RSI_DISTRIBUTED=1 python3 experiments/run.py ..."`: every worker runs the same
   command and `jax.distributed.initialize()` auto-detects coordinator, process count and id.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys

if __package__ in (None, ""):  # run as a script: make `launch` and `terminal_rsi` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from launch.common import (  # noqa: E402
    REMOTE_TOKEN_NAME,
    LaunchError,
    Step,
    cli_error,
    env_prefix,
    execute,
    parse_env,
    print_plan,
    run_argv,
    tarball_step,
)

REMOTE_DIR = "terminal_rsi"  # under the worker's home directory
JAX_TPU = "jax[tpu]>=0.7,<0.11"
DEFAULT_VERSION = "tpu-ubuntu2204-base"


def workers_for(accelerator_type: str) -> int:
    """Number of TPU VM hosts (JAX processes) of a slice type, e.g. v4-32 -> 4.

    v2/v3/v4/v5p name TensorCores (8 per host: 4 chips x 2 cores, or 8 x 1 on v2/v3);
    v5litepod (v5e) and v6e name chips (up to 8 on one host, 4 per host in multi-host slices).
    """
    m = re.fullmatch(r"(v2|v3|v4|v5p|v5litepod|v5e|v6e)-(\d+)", accelerator_type)
    if not m or int(m.group(2)) < 1:
        raise LaunchError(f"--accelerator-type={accelerator_type!r} is not a TPU slice type; "
                          "use e.g. v4-8, v4-32, v5p-16, v5litepod-16, v6e-8")
    gen, n = m.group(1), int(m.group(2))
    if gen in ("v2", "v3", "v4", "v5p"):
        if n % 8 and n > 8:
            raise LaunchError(f"{accelerator_type}: multi-host {gen} slices have a multiple "
                              "of 8 TensorCores")
        return max(1, n // 8)
    if n <= 8:
        return 1
    if n % 4:
        raise LaunchError(f"{accelerator_type}: multi-host {gen} slices have a multiple of 4 "
                          "chips")
    return n // 4


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python launch/tpu_pod.py", description=__doc__.split(
        "\n")[0], epilog="Other --config.a.b=value arguments are passed to experiments/run.py.")
    p.add_argument("--name", required=True, help="TPU VM (pod slice) name")
    p.add_argument("--zone", required=True)
    p.add_argument("--project", default=None, help="GCP project (default: gcloud's)")
    p.add_argument("--accelerator-type", required=True, help="e.g. v4-32")
    p.add_argument("--version", default=DEFAULT_VERSION, help="TPU VM runtime version")
    p.add_argument("--spot", action="store_true", help="create a Spot slice")
    p.add_argument("--create", choices=("auto", "never"), default="auto",
                   help="auto: reuse the slice if it exists, else create it")
    p.add_argument("--install", choices=("copy", "git", "none"), default="copy")
    p.add_argument("--repo-url", default=None, help="--install=git: repository to clone")
    p.add_argument("--ref", default="main", help="--install=git: branch, tag or commit")
    p.add_argument("--tarball", default="/tmp/terminal_rsi_project.tar.gz",
                   help="--install=copy: local path of the packed project")
    p.add_argument("--config", required=True, help="configs/<name>.py")
    p.add_argument("--workdir", required=True, help="shared storage every worker sees")
    p.add_argument("--sandbox-hosts", default=None,
                   help="comma-separated bridge hosts (host, host:port or URL) -> "
                        "--config.tasks.backend")
    p.add_argument("--sandbox-token-file", default=None,
                   help="local token file of the sandbox hosts, copied to every worker")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="environment variable for the run on every worker (repeatable), "
                        "e.g. --env=XLA_FLAGS=--xla_dump_to=/tmp/dump")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    return p


def plan(argv: list[str]) -> tuple[list[str], list[Step]]:
    """(header lines, steps) for the given command line; LaunchError on bad arguments."""
    p = parser()
    args, rest = p.parse_known_args(argv)
    n_workers = workers_for(args.accelerator_type)
    if not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", args.name):
        raise LaunchError(f"--name={args.name!r}: TPU names are lowercase letters, digits and "
                          "hyphens, starting with a letter")
    if args.install == "git" and not args.repo_url:
        raise LaunchError("--install=git needs --repo-url")
    if args.sandbox_token_file and not args.sandbox_hosts:
        raise LaunchError("--sandbox-token-file without --sandbox-hosts: name the hosts too")
    token = None
    if args.sandbox_token_file:
        token = os.path.expanduser(args.sandbox_token_file)
        if not os.path.isfile(token):
            raise LaunchError(f"--sandbox-token-file={args.sandbox_token_file!r} does not exist "
                              "(launch/sandbox_hosts.py writes it)")
    run = run_argv(args.config, args.workdir, rest, args.sandbox_hosts)

    where = [f"--zone={args.zone}"] + ([f"--project={args.project}"] if args.project else [])
    tpu = ["gcloud", "compute", "tpus", "tpu-vm"]
    steps = []
    describe = Step((*tpu, "describe", args.name, *where, "--format=value(state)"),
                    f"is the slice {args.name} there? (reuse it)", "check")
    create = Step((*tpu, "create", args.name, *where, f"--accelerator-type={args.accelerator_type}",
                   f"--version={args.version}", *(["--spot"] if args.spot else [])),
                  f"create {args.name}", "if_failed")
    steps += [describe] + ([create] if args.create == "auto" else [])

    def ssh(command: str, note: str) -> Step:
        return Step((*tpu, "ssh", args.name, *where, "--worker=all", f"--command={command}"),
                    note)

    def scp(local: str, remote: str, note: str) -> Step:
        return Step((*tpu, "scp", local, f"{args.name}:{remote}", *where, "--worker=all"), note)

    pip = f"python3 -m pip install -q -e '.[sandbox]' {shlex.quote(JAX_TPU)}"
    if args.install == "copy":
        steps += [tarball_step(args.tarball),
                  scp(args.tarball, "terminal_rsi_project.tar.gz",
                      f"copy it to all {n_workers} workers"),
                  ssh(f"mkdir -p {REMOTE_DIR} && tar -xzf "
                      f"terminal_rsi_project.tar.gz -C {REMOTE_DIR} && cd {REMOTE_DIR} && {pip}",
                      "unpack and install on every worker")]
    elif args.install == "git":
        url, ref = shlex.quote(args.repo_url), shlex.quote(args.ref)
        steps.append(ssh(f"(test -d {REMOTE_DIR}/.git || git clone {url} {REMOTE_DIR}) && cd "
                         f"{REMOTE_DIR} && git fetch --all -q && git checkout -q {ref} && {pip}",
                         "clone or update, and install on every worker"))
    env = {**parse_env(args.env), "TERMINAL_RSI_DISTRIBUTED": "1"}
    if token:
        steps.append(scp(token, REMOTE_TOKEN_NAME, "copy the sandbox token to every worker"))
        env["TERMINAL_RSI_SANDBOX_TOKEN_FILE"] = "$HOME/" + REMOTE_TOKEN_NAME
    steps.append(ssh(f"cd {REMOTE_DIR} && {env_prefix(env)} {shlex.join(run)}",
                     f"run on all {n_workers} workers (jax.distributed auto-detects the pod)"))
    header = [f"TPU pod slice {args.name} ({args.accelerator_type}, {args.zone}): "
              f"{n_workers} workers, one JAX process each"]
    return header, steps


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        header, steps = plan(argv)
    except LaunchError as e:
        return cli_error(str(e))
    if "--dry-run" in argv:
        print_plan(header, steps)
        return 0
    return execute(steps)


if __name__ == "__main__":
    sys.exit(main())
