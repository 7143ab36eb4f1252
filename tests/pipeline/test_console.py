"""What a user watching the main job sees: the stage lines, no library INFO logging (orbax
printed ~1,000 lines per CI-scale run) unless `--verbosity` asks for it, no progress bars
when stderr is not a terminal, and no None where nothing was measured."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ABSL_INFO = re.compile(r"^I\d{4} \d\d:\d\d:\d\d\.\d+ ", re.M)  # absl's INFO prefix

pytestmark = pytest.mark.xdist_group("pipeline_console")


def _main_job(workdir, *extra):
    env = {k: v for k, v in os.environ.items() if k != "TERMINAL_RSI_PROGRESS"}
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "experiments", "run.py"),
         "--config=configs/rpr2_spr.py", "--config.scale=test",
         "--config.pipeline.targets=('base',)", f"--workdir={workdir}", *extra],
        capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)


def test_the_main_job_console_is_the_stage_lines(tmp_path):
    proc = _main_job(tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not ABSL_INFO.search(proc.stderr + proc.stdout), proc.stderr[:3000]
    out = proc.stdout.splitlines()
    assert "[pipeline] base: done in" in proc.stdout and "[pipeline] base: evaluated" in proc.stdout
    assert any(ln.startswith("[evaluate] heldout_instances: Mean@3") for ln in out)
    # the test scale measures no held-out success during base_sft (eval.num_tasks = 0)
    assert "[base_sft] done: held-out success not measured (guided not measured)" in proc.stderr
    assert "None" not in proc.stdout + proc.stderr
    # stderr is a pipe: no bars (a bar redraws with \r)
    assert "\r" not in proc.stderr and "step/s" not in proc.stderr and "ep/s" not in proc.stderr

    # --verbosity=0 brings absl INFO back (a rerun: every stage is reused, nothing trains)
    again = _main_job(tmp_path, "--verbosity=0")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "trained now: none" in again.stdout
    assert re.search(ABSL_INFO.pattern + r".*running pipeline in", again.stderr, re.M), \
        again.stderr[:3000]
