"""The real-format fixtures (tests/tasks/fixtures/real and real_bad, see their README.md) as
their own tools run them, on Docker: every positive fixture's reference solution passes
check_task and, without it, the verdict is a fail; the negative ones get the verdicts and
reasons their README states; the agent never sees the tests or the solution during the
episode; the protected "separate" mode (a fresh container from the task's image, only the
workspace artifacts carried over) passes too.

Needs a Docker engine and the fixtures' base image trsi-task-base:bookworm: fails in CI
(CI=true), skips elsewhere. The task images are built once and then found by content.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

import pytest

from terminal_rsi.tasks import load_task_dir, open_task_sandbox, run_solution, verify
from terminal_rsi.tasks.check_tasks import check_task
from tests.tasks.conftest import need_task_image
from tests.tasks.fixtures import run_bare

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
REAL = os.path.join(FIXTURES, "real")
REAL_BAD = os.path.join(FIXTURES, "real_bad")
POSITIVE = [name for name in sorted(os.listdir(REAL)) if os.path.isdir(os.path.join(REAL, name))]
PRIVATE = ("/tests", "/solution", "/oracle")


def _load(group: str, name: str):
    """The fixture `name` of `group`, for a Docker test (no engine: fail in CI, else skip)."""
    need_task_image()
    return load_task_dir(os.path.join(group, name))


def test_every_fixture_is_here():
    """The parametrization below covers what the fixtures README lists."""
    assert len(POSITIVE) == 9 and sorted(os.listdir(REAL_BAD)) == [
        "harbor-solution-exits-1", "tb-build-run-fails", "tb-missing-base"]


@pytest.mark.parametrize("name", POSITIVE)
def test_the_reference_solution_passes(name):
    task = _load(REAL, name)
    row = check_task(task, "docker")
    assert row["verdict"] == "PASS", row
    assert row["S"] == 1 and row["P"] == row["N"] and row["mode"] == "shared", row
    if task.format == "harbor":
        assert row["reward"] == 1.0
    else:  # graded by the -rA summary: every test of the fixture counts
        assert row["N"] > 0


@pytest.mark.parametrize("name", POSITIVE)
def test_without_the_solution_it_fails_and_nothing_private_is_visible(name):
    """The same task with no reference solution (no oracle, a solution that does nothing)
    fails: the fixtures' tests are not vacuous. And during the episode the agent's
    container holds no /tests, /solution or /oracle."""
    task = dataclasses.replace(_load(REAL, name), oracle=None, solution=(("true",),))
    with open_task_sandbox(task, "docker") as sb:
        seen = sb.exec("ls -d " + " ".join(PRIVATE), timeout=30)
        assert seen.exit_code != 0 and seen.stdout.strip() == "", seen.stdout
        assert all(p in seen.stderr for p in PRIVATE), seen.stderr
        run_solution(task, sb)
        res = verify(task, sb, backend="docker")
    assert res.S == 0, (name, res.artifacts.get("stdout.txt"))
    if res.reward is not None:
        assert res.reward < 1
    else:
        assert res.P < res.N


def test_a_missing_base_image_is_unavailable_and_named():
    row = check_task(_load(REAL_BAD, "tb-missing-base"), "docker")
    assert row["verdict"] == "UNAVAILABLE", row
    why = row["why"]
    assert "trsi-no-such-base:1" in why and "docker pull" in why and "docker load" in why


def test_a_failing_run_step_is_an_error():
    row = check_task(_load(REAL_BAD, "tb-build-run-fails"), "docker")
    assert row["verdict"] == "ERROR" and "does not build" in row["why"], row
    assert "tb-build-run-fails" in row["why"]


def test_a_solution_that_exits_1_fails_saying_so():
    """As in Harbor, the verifier still runs after the solution failed; the verdict is its
    reward 0, and the row says how the solution ended."""
    row = check_task(_load(REAL_BAD, "harbor-solution-exits-1"), "docker")
    assert row["verdict"] == "FAIL" and row["S"] == 0 and row["reward"] == 0.0, row
    assert "the reference solution exited 1" in row["why"]


@pytest.mark.parametrize("name", ["tb-sales-summary", "harbor-invoice-totals"])
def test_separate_mode_passes_in_a_fresh_container(name):
    """mode "separate": the workspace artifacts (the task's WORKDIR) go to a fresh container
    of the task's image, where the tests run; nothing else of the agent's container does."""
    row = check_task(_load(REAL, name), "docker", mode="separate")
    assert row["verdict"] == "PASS" and row["mode"] == "separate", row


def test_separate_mode_leaves_the_agents_processes_behind():
    """A server the solution left running is in the agent's container only: the fresh one
    of separate mode does not have it, so a task that queries one passes only shared."""
    row = check_task(_load(REAL, "tb-stats-server"), "docker", mode="separate")
    assert row["verdict"] == "FAIL" and row["S"] == 0 and row["mode"] == "separate", row


def test_volumes_from_the_build_context_are_copied_in(tmp_path):
    """A bind mount of the build context's `data/` lands in the container; what the
    container writes there never reaches the task directory (a snapshot, not a mount)."""
    root = tmp_path / "tb-sales-summary"
    shutil.copytree(os.path.join(REAL, "tb-sales-summary"), root)
    compose = (root / "docker-compose.yaml").read_text().replace(
        "${T_BENCH_CONTAINER_AGENT_LOGS_PATH}\n",
        "${T_BENCH_CONTAINER_AGENT_LOGS_PATH}\n      - ./data:/mnt/data\n"
        "      - ./data/one.txt:/etc/one.txt:ro\n")
    (root / "docker-compose.yaml").write_text(compose)
    (root / "data" / "sub").mkdir(parents=True)
    (root / "data" / "one.txt").write_text("1\n")
    (root / "data" / "sub" / "two.txt").write_text("2\n")
    need_task_image()
    task = load_task_dir(str(root))
    assert task.environment.volumes == (("data", "/mnt/data"), ("data/one.txt", "/etc/one.txt"))
    with open_task_sandbox(task, "docker") as sb:
        r = sb.exec("cat /mnt/data/one.txt /mnt/data/sub/two.txt /etc/one.txt; "
                    "echo changed > /mnt/data/one.txt")
        assert r.ok and r.stdout == "1\n2\n1\n", r
    assert (root / "data" / "one.txt").read_text() == "1\n"


@pytest.mark.parametrize("group, name", [
    (REAL, "tb-sales-summary"), (REAL, "harbor-temperature-convert"),
    (REAL_BAD, "harbor-solution-exits-1")])
def test_ours_agrees_with_a_bare_docker_run_of_the_same_steps(group, name):
    """The reference: the fixture run with bare docker commands the way Terminal-Bench's and
    Harbor's own harnesses run it (run_bare.py: docker build/run/cp/exec, their verdict
    rules, nothing of this project) reaches the verdict check_task reaches, with and without
    the reference solution. (Harbor itself needs Python >= 3.12, which these machines lack.)"""
    task = _load(group, name)
    bare = run_bare.FixtureRun(Path(group) / name, run_bare.options([])).run()
    assert bare.error == "" and bare.oracle is not None, bare
    ours = check_task(task, "docker")
    assert (ours["verdict"] == "PASS") == bare.oracle.resolved, (ours, bare)
    if bare.nop is not None:  # the positive fixtures also ran without their solution
        idle = dataclasses.replace(task, oracle=None, solution=(("true",),))
        with open_task_sandbox(idle, "docker") as sb:
            run_solution(idle, sb)
            assert verify(idle, sb, backend="docker").S == int(bare.nop.resolved)
