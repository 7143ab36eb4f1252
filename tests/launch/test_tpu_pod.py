"""launch/tpu_pod.py: the exact gcloud commands for a given config, and clear errors."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest

from launch import tpu_pod
from launch.common import REPO, LaunchError

BASE = ["--name=trsi-v4", "--zone=us-central2-b", "--accelerator-type=v4-32",
        "--config=configs/rpr_phase.py", "--workdir=gs://bucket/runs/rpr1"]
TPU = ["gcloud", "compute", "tpus", "tpu-vm"]
WHERE = ["--zone=us-central2-b", "--project=proj"]


def test_plan_create_or_reuse_copy_and_run(tmp_path):
    token = tmp_path / "tokens"
    token.write_text("trainer:abc\n")
    header, steps = tpu_pod.plan([*BASE, "--project=proj", "--spot", "--config.seed=3",
                                  "--sandbox-hosts=sbx0,sbx1:9000",
                                  f"--sandbox-token-file={token}"])
    assert header == ["TPU pod slice trsi-v4 (v4-32, us-central2-b): 4 workers, "
                      "one JAX process each"]
    argvs = [list(s.argv) for s in steps]
    assert [s.kind for s in steps] == ["check", "if_failed", "run", "run", "run", "run", "run"]
    assert argvs[0] == [*TPU, "describe", "trsi-v4", *WHERE, "--format=value(state)"]
    assert argvs[1] == [*TPU, "create", "trsi-v4", *WHERE, "--accelerator-type=v4-32",
                        "--version=tpu-ubuntu2204-base", "--spot"]
    assert argvs[2][:3] == ["tar", "-czf", "/tmp/terminal_rsi_project.tar.gz"]
    assert argvs[2][-3:] == ["-C", REPO, "."] and "--exclude=./.git" in argvs[2]
    assert argvs[3] == [*TPU, "scp", "/tmp/terminal_rsi_project.tar.gz",
                        "trsi-v4:terminal_rsi_project.tar.gz", *WHERE, "--worker=all"]
    assert argvs[4][:7] == [*TPU, "ssh", "trsi-v4", *WHERE][:7]
    assert argvs[4][-2] == "--worker=all"
    install = argvs[4][-1].removeprefix("--command=")
    assert "tar -xzf terminal_rsi_project.tar.gz -C terminal_rsi" in install
    assert "pip install -q -e '.[sandbox]' 'jax[tpu]>=0.7,<0.11'" in install
    assert argvs[5] == [*TPU, "scp", str(token), "trsi-v4:.terminal_rsi_sandbox_token", *WHERE,
                        "--worker=all"]
    run = argvs[6]
    assert run[:-1] == [*TPU, "ssh", "trsi-v4", *WHERE, "--worker=all"]
    words = shlex.split(run[-1].removeprefix("--command="))
    assert words == ["cd", "terminal_rsi", "&&", "TERMINAL_RSI_DISTRIBUTED=1",
                     "TERMINAL_RSI_SANDBOX_TOKEN_FILE=$HOME/.terminal_rsi_sandbox_token",
                     "python3", "experiments/run.py", "--config=configs/rpr_phase.py",
                     "--workdir=gs://bucket/runs/rpr1", "--config.seed=3",
                     "--config.tasks.backend=http://sbx0:8765,http://sbx1:9000"]


def test_git_install_and_never_create():
    _, steps = tpu_pod.plan([*BASE, "--create=never", "--install=git",
                             "--repo-url=https://example.org/trsi.git", "--ref=v1"])
    assert [s.kind for s in steps] == ["check", "run", "run"]
    cmd = steps[1].argv[-1].removeprefix("--command=")
    assert cmd.startswith("(test -d terminal_rsi/.git || git clone "
                          "https://example.org/trsi.git terminal_rsi) && cd terminal_rsi && "
                          "git fetch --all -q && git checkout -q v1 && python3 -m pip install")


@pytest.mark.parametrize("kind,workers", [("v4-8", 1), ("v4-32", 4), ("v5p-128", 16),
                                          ("v5litepod-8", 1), ("v5litepod-16", 4),
                                          ("v6e-64", 16), ("v3-32", 4), ("v2-8", 1)])
def test_worker_count(kind, workers):
    assert tpu_pod.workers_for(kind) == workers


@pytest.mark.parametrize("extra,match", [
    (["--accelerator-type=a100-8"], "not a TPU slice type"),
    (["--accelerator-type=v4-12"], "multiple of 8"),
    (["--name=Bad_Name"], "lowercase"),
    (["--install=git"], "needs --repo-url"),
    (["--config=configs/nope.py"], "not a config file"),
    (["--config.no_such.field=1"], "has no field 'no_such.field'"),
    (["--seed=3"], "unknown argument '--seed=3'"),
    (["--sandbox-hosts=http://a:1,bad host"], "bad sandbox host"),
    (["--sandbox-token-file=/nonexistent/tokens"], "without --sandbox-hosts"),
    (["--sandbox-hosts=a", "--sandbox-token-file=/nonexistent/tokens"], "does not exist"),
])
def test_bad_arguments_are_clear(extra, match):
    with pytest.raises(LaunchError, match=match):
        tpu_pod.plan([*BASE, *extra])


def test_config_without_sandboxes_rejects_hosts():
    args = [a for a in BASE if not a.startswith("--config=")]
    with pytest.raises(LaunchError, match="no tasks.backend"):
        tpu_pod.plan([*args, "--config=configs/credit_diagnostic.py", "--sandbox-hosts=a"])


def test_dry_run_script_prints_pasteable_commands():
    out = subprocess.run([sys.executable, "launch/tpu_pod.py", *BASE, "--dry-run"], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stdout.splitlines() if not ln.startswith("#")]
    assert lines[0] == ("gcloud compute tpus tpu-vm describe trsi-v4 --zone=us-central2-b "
                        "'--format=value(state)' >/dev/null 2>&1 || gcloud compute tpus tpu-vm "
                        "create trsi-v4 --zone=us-central2-b --accelerator-type=v4-32 "
                        "--version=tpu-ubuntu2204-base")
    assert lines[-1].startswith("gcloud compute tpus tpu-vm ssh trsi-v4 --zone=us-central2-b "
                                "--worker=all '--command=cd terminal_rsi && "
                                "TERMINAL_RSI_DISTRIBUTED=1 python3 experiments/run.py")
    bad = subprocess.run([sys.executable, "launch/tpu_pod.py", *BASE[:2], "--dry-run"],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--accelerator-type" in bad.stderr


def test_env_passthrough_is_quoted_for_the_remote_shell():
    _, steps = tpu_pod.plan([*BASE, "--install=none", "--env=XLA_FLAGS=--xla_dump_to=/tmp/d",
                             "--env=NOTE=two words"])
    words = shlex.split(steps[-1].argv[-1].removeprefix("--command="))
    assert words[3:6] == ["XLA_FLAGS=--xla_dump_to=/tmp/d", "NOTE=two words",
                          "TERMINAL_RSI_DISTRIBUTED=1"]
    with pytest.raises(LaunchError, match="--env=NAME=VALUE"):
        tpu_pod.plan([*BASE, "--env=1BAD=x"])
