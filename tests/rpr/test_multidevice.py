"""The RPR phase on the 8-CPU-device mesh (data=2, fsdp=2, tensor=2) in a subprocess."""

import atexit
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _start():
    """Started at collection time so it overlaps the other tests (see tests/test_sharding.py)."""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
               JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "tests", "rpr",
                                                          "multidevice_phase.py")],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    atexit.register(lambda: proc.poll() is None and proc.kill())
    return proc


_PROC = _start()


def test_phase_runs_on_eight_device_mesh():
    out, err = _PROC.communicate(timeout=900)
    assert _PROC.returncode == 0, err[-3000:]
    r = json.loads(out.strip().splitlines()[-1])
    assert r["steps"] == [1, 2] and r["critic_only"] == [True, False]
    assert r["metrics_finite"] and r["params_finite"]
    assert r["mesh"] == {"data": 2, "fsdp": 2, "tensor": 2}
    assert r["embed_shards"] == 8 and "fsdp" in r["embed_spec"]  # parameters really sharded
    assert r["actor_loss"] is not None
