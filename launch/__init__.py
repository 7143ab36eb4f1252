"""Launchers: TPU VM pods (`tpu_pod.py`), SLURM GPU clusters (`slurm.py`), sandbox hosts
(`sandbox_hosts.py`). Each is a script with `--dry-run`; see docs/launch.md."""
