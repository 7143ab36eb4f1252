"""The spec's CPU share holds for the whole process tree on every backend."""

from __future__ import annotations

import pytest

from terminal_rsi.sandbox import SandboxSpec

from .conftest import ROOT

SPIN = """python3 -c "
import os, resource, time
kids = []
for _ in range(2):
    pid = os.fork()
    if pid == 0:
        t = time.time()
        while time.time() - t < 1.5:
            pass
        os._exit(0)
    kids.append(pid)
for pid in kids:
    os.waitpid(pid, 0)
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print(r.ru_utime + r.ru_stime)"
"""


def test_cpu_share_bounds_the_process_tree(make_sandbox):
    if make_sandbox.backend == "local-plain" and not ROOT:
        pytest.skip("the CPU share needs cgroups (root)")
    sb = make_sandbox(SandboxSpec(cpus=0.5))
    r = sb.exec(SPIN, timeout=30)
    assert r.exit_code == 0, r.stderr
    cpu_s = float(r.stdout.split()[-1])
    # two spinners for 1.5 s of wall time; a 0.5-core share allows 0.75 s of CPU
    assert cpu_s <= 1.5 * 0.5 * 1.25, f"{cpu_s:.2f} s of CPU with cpus=0.5 in 1.5 s"
