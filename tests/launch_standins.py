"""Running what the launchers start on this machine: a free loopback port (for a JAX
coordinator or the sandbox bridge), and a batch script of `launch/slurm.py` with stand-ins for
the two SLURM commands it calls (there is no SLURM here).

`srun` starts its --nodes tasks here, each with SLURM_PROCID and SLURM_NTASKS, and writes task
i's output to $SRUN_LOGS/task_<i>.log; `scontrol show hostnames` prints the given host names
(the script's coordinator is the first)."""

from __future__ import annotations

import os
import socket
import subprocess

SRUN = """#!/bin/bash
n=1
while [[ $1 == --* ]]; do case $1 in --nodes=*) n=${1#--nodes=};; esac; shift; done
pids=()
for ((i = 0; i < n; i++)); do
  SLURM_PROCID=$i SLURM_NTASKS=$n "$@" > "$SRUN_LOGS/task_$i.log" 2>&1 & pids+=($!)
done
rc=0; for p in "${pids[@]}"; do wait "$p" || rc=1; done; exit $rc
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_batch_script(text: str, tmp_path, hosts: tuple[str, ...], timeout: int,
                     env: dict[str, str] | None = None) -> list[str]:
    """Run the batch script `text` with bash, srun and scontrol standing in, on a node list of
    `hosts` (one task per host); the tasks' outputs. Fails with both tasks' output when the
    script does not exit with status 0."""
    bin_dir, logs = tmp_path / "slurm_bin", tmp_path / "slurm_logs"
    bin_dir.mkdir(exist_ok=True)
    logs.mkdir(exist_ok=True)
    (bin_dir / "srun").write_text(SRUN)
    (bin_dir / "scontrol").write_text("#!/bin/sh\nprintf '%s\\n' " + " ".join(hosts) + "\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    full = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "SLURM_NTASKS": str(len(hosts)), "SLURM_JOB_NODELIST": ",".join(hosts),
            "SRUN_LOGS": str(logs), **(env or {})}
    for k in ("TERMINAL_RSI_PROCESS_ID", "TERMINAL_RSI_NUM_PROCESSES"):
        full.pop(k, None)  # the script's own wiring, not the caller's
    done = subprocess.run(["bash", str(script)], env=full, timeout=timeout, capture_output=True,
                          text=True)
    outs = [(logs / f"task_{i}.log").read_text() for i in range(len(hosts))]
    assert done.returncode == 0, f"{done.stderr[-2000:]}\n" + "\n".join(o[-3000:] for o in outs)
    return outs
