"""The verify_tasks experiment: config validation, the verdicts PASS / FAIL / UNAVAILABLE /
ERROR over task dirs of both formats, and a run that never aborts for one task's sake."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from configs.verify_tasks import get_config
from terminal_rsi.config import registry
from terminal_rsi.config.configuration import ConfigError, validate_config
from terminal_rsi.tasks import load_task_dir
from terminal_rsi.tasks.check_tasks import TaskCheckFailed, check_task
from tests.tasks.conftest import need_task_image, tb_files, workspace_task, write

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(ROOT, "tests", "tasks", "fixtures")


def _copy(fixture: str, dest) -> str:
    """A copy of tests/tasks/fixtures/`fixture` at `dest` (a suite of our own making)."""
    return shutil.copytree(os.path.join(FIXTURES, fixture), dest)


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
    """The plain-subprocess policy reaches the sandbox: a task from disk (here in the
    workspace layout, which local backends run) is refused plain mode under 'never' and
    'builtin' (a row naming the setting, not an exception: one task never stops a run) and
    runs under 'always'."""
    task = workspace_task(load_task_dir(write(tmp_path / "a-tb", tb_files())))
    assert get_config().tasks.allow_plain_sandbox == "never"
    for policy in ("never", "builtin"):  # a task from disk is not a built-in one
        row = check_task(task, "local-plain", allow_plain=policy)
        assert row["verdict"] == "ERROR" and "tasks.allow_plain_sandbox" in row["why"], row
    assert check_task(task, "local-plain", allow_plain="always")["verdict"] == "PASS"


def test_run_on_task_dirs(tmp_path, capsys):
    """Both formats as their own tools run them (Docker): the references pass, a broken
    solution fails with its counts, a malformed task is an ERROR row; results.json holds
    every row before TaskCheckFailed names the bad ones."""
    need_task_image()
    suite = tmp_path / "suite"
    _copy("real/tb-sales-summary", suite / "a-tb")
    _copy("real/harbor-temperature-convert", suite / "b-harbor")
    broken = _copy("real/tb-sales-summary", suite / "c-broken")  # no region totals
    with open(os.path.join(broken, "solution.sh"), "w") as f:
        f.write("#!/bin/bash\necho '{\"regions\": {}, \"top_product\": \"gizmo\"}' "
                "> /app/summary.json\n")
    write(suite / "d-bad", tb_files(**{"task.yaml": "instruction: x\ndifficulty: brutal\n"}))
    cfg = get_config()
    cfg.tasks.source, cfg.tasks.backend = str(suite), "docker"
    cfg.tasks.show_reports = True
    with pytest.raises(TaskCheckFailed, match="c-broken, d-bad"):
        run(cfg, str(tmp_path / "wd"))
    out = capsys.readouterr().out
    assert "| a-tb |" in out and "2/4 tasks pass (2 PASS, 1 FAIL, 1 ERROR)" in out
    rows = json.load(open(tmp_path / "wd" / "results.json"))
    assert [r["verdict"] for r in rows] == ["PASS", "PASS", "FAIL", "ERROR"], rows
    assert (rows[0]["S"], rows[0]["P"], rows[0]["N"]) == (1, 4, 4)
    assert rows[1]["reward"] == 1.0 and rows[1]["S"] == 1 and rows[1]["P"] == rows[1]["N"]
    assert rows[2]["S"] == 0 and (rows[2]["P"], rows[2]["N"]) == (3, 4)
    assert rows[3]["task"] == "d-bad" and rows[3]["why"].startswith("task format: ")
    assert "difficulty" in rows[3]["why"]


def _four_kinds(suite) -> None:
    """A good task, a malformed one, one whose base image is missing, one that does not
    build (the last two: the negative fixtures)."""
    _copy("real/tb-sales-summary", suite / "a-good")
    write(suite / "b-malformed", tb_files(**{"task.yaml": "instruction: [unclosed\n"}))
    _copy("real_bad/tb-missing-base", suite / "c-missing-base")
    _copy("real_bad/tb-build-run-fails", suite / "d-no-build")


def test_verify_tasks_never_aborts(tmp_path, capsys):
    """One row per task whatever goes wrong, results.json written, and only then
    TaskCheckFailed, naming the broken tasks (a missing image is not the task's fault)."""
    need_task_image()
    _four_kinds(tmp_path / "suite")
    cfg = get_config()
    cfg.tasks.source, cfg.tasks.backend = str(tmp_path / "suite"), "docker"
    with pytest.raises(TaskCheckFailed) as e:
        run(cfg, str(tmp_path / "wd"))
    assert "2 task(s)" in str(e.value) and "b-malformed, d-no-build" in str(e.value)
    assert "c-missing-base" not in str(e.value)
    out = capsys.readouterr().out
    assert "1/4 tasks pass (1 PASS, 1 UNAVAILABLE, 2 ERROR)" in out
    rows = json.load(open(tmp_path / "wd" / "results.json"))
    assert [(r["task"], r["verdict"]) for r in rows] == [
        ("a-good", "PASS"), ("b-malformed", "ERROR"), ("c-missing-base", "UNAVAILABLE"),
        ("d-no-build", "ERROR")], rows
    why = [r["why"] for r in rows]
    assert why[1].startswith("task format: ") and "task.yaml" in why[1]
    assert "trsi-no-such-base:1" in why[2] and "docker pull" in why[2]
    assert "docker load" in why[2]
    assert "does not build" in why[3]


def test_without_a_docker_engine_every_docker_task_is_unavailable(tmp_path, monkeypatch):
    """No engine answers (DOCKER_HOST names no socket): every task that needs Docker is
    UNAVAILABLE, saying so, and the run goes on to the end; only the malformed task is an
    ERROR. Needs no engine."""
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent.sock")
    _four_kinds(tmp_path / "suite")
    cfg = get_config()
    cfg.tasks.source, cfg.tasks.backend = str(tmp_path / "suite"), "docker"
    cfg.tasks.fail_on_error = False
    rows = run(cfg, str(tmp_path / "wd"))
    assert [r["verdict"] for r in rows] == ["UNAVAILABLE", "ERROR", "UNAVAILABLE",
                                            "UNAVAILABLE"], rows
    for row in rows[:1] + rows[2:]:
        assert "Docker engine" in row["why"], row["why"]
    assert json.load(open(tmp_path / "wd" / "results.json")) == rows
    from terminal_rsi.tasks.builtin import make_task

    row = check_task(make_task("sort_uniq", 0), "docker")  # a built-in task on Docker too
    assert row["verdict"] == "UNAVAILABLE" and "Docker engine" in row["why"], row


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
    assert row["task"] == "e-hostile" and row["verdict"] == "ERROR"
    assert row["why"].startswith("task format: ")
    assert "leak.txt" in row["why"] and "symbolic link" in row["why"]
    assert "HOST-SECRET" not in json.dumps(row)
