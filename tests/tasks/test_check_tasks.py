"""The verify_tasks experiment: config validation and a run over task dirs of both formats."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from configs.verify_tasks import get_config
from terminal_rsi import registry
from terminal_rsi.configuration import ConfigError, validate_config
from terminal_rsi.sandbox import BadRequest
from terminal_rsi.tasks import load_task_dir
from terminal_rsi.tasks.check_tasks import TaskCheckFailed, check_task
from tests.tasks.conftest import harbor_files, tb_files, write

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_config_validates():
    mod = registry.get_experiment("verify_tasks")
    cfg = get_config()
    validate_config(cfg, mod.SCHEMA)
    cfg.tasks.split = "everything"
    with pytest.raises(ConfigError, match="tasks.split"):
        validate_config(cfg, mod.SCHEMA)
    cfg = get_config()
    cfg.tasks.backend = "bogus"
    with pytest.raises(ConfigError, match=r"config.tasks.backend = 'bogus' is not allowed.*"
                       r"'local', 'local-bwrap', 'local-plain', 'docker'"):
        validate_config(cfg, mod.SCHEMA)
    # task directories are untrusted: the checker does not fall back to plain by default
    assert get_config().tasks.allow_plain_sandbox == "never"


def run(config, workdir):
    """The verify_tasks experiment on a ConfigDict (built into its typed config first)."""
    return registry.get_experiment("verify_tasks").run(config, workdir)


def test_allow_plain_sandbox_reaches_the_sandbox(tmp_path):
    task = load_task_dir(write(tmp_path / "a-tb", tb_files()))
    assert get_config().tasks.allow_plain_sandbox == "never"
    with pytest.raises(BadRequest, match="tasks.allow_plain_sandbox"):
        check_task(task, "local-plain", allow_plain="never")
    # a task from disk is not a built-in one
    with pytest.raises(BadRequest, match="tasks.allow_plain_sandbox"):
        check_task(task, "local-plain", allow_plain="builtin")
    assert check_task(task, "local-plain", allow_plain="always")["verdict"] == "PASS"


def test_run_on_task_dirs(tmp_path, capsys):
    suite = tmp_path / "suite"
    write(suite / "a-tb", tb_files())
    write(suite / "b-harbor", harbor_files())
    write(suite / "c-broken", tb_files(**{"solution.sh": "echo 1 > count1.txt\n"}))
    write(suite / "d-bad", tb_files(**{"task.yaml": "instruction: x\ndifficulty: brutal\n"}))
    cfg = get_config()
    cfg.tasks.source = str(suite)
    cfg.tasks.show_reports = True
    with pytest.raises(TaskCheckFailed, match="c-broken"):
        run(cfg, str(tmp_path / "wd"))
    out = capsys.readouterr().out
    assert "| a-tb |" in out and "2/4 tasks pass" in out
    rows = json.load(open(tmp_path / "wd" / "results.json"))
    assert [r["verdict"] for r in rows] == ["PASS", "PASS", "FAIL", "FORMAT ERROR"]
    assert rows[3]["task"] == "d-bad" and "difficulty" in rows[3]["why"]
    assert rows[2]["S"] == 0 and rows[2]["P"] == 1 and rows[2]["N"] == 4


def test_entry_point_builtin(tmp_path):
    r = subprocess.run(
        [sys.executable, "experiments/run.py", "--config=configs/verify_tasks.py",
         f"--workdir={tmp_path}", "--config.tasks.families=('hint_lookup','fix_script')",
         "--config.tasks.backend=local-plain"],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "2/2 tasks pass" in r.stdout


def test_a_hostile_task_dir_is_a_format_error_row_named_by_its_dir(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("HOST-SECRET\n")
    root = write(tmp_path / "suite" / "e-hostile", tb_files())
    os.symlink(secret, os.path.join(root, "tests", "leak.txt"))
    cfg = get_config()
    cfg.tasks.source, cfg.tasks.fail_on_error = str(tmp_path / "suite"), False
    (row,) = run(cfg, str(tmp_path / "wd"))
    assert row["task"] == "e-hostile" and row["verdict"] == "FORMAT ERROR"
    assert "leak.txt" in row["why"] and "symbolic link" in row["why"]
    assert "HOST-SECRET" not in json.dumps(row)
