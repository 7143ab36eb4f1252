"""Protected verification through real pytest + pytest-json-ctrf and Harbor reward files."""

from __future__ import annotations

import os

import pytest

from terminal_rsi.tasks import (
    VerifierError,
    load_harbor_task,
    load_terminal_bench_task,
    open_task_sandbox,
    run_reference,
    run_solution,
    verify,
)
from terminal_rsi.tasks.verify import ctrf_plugin_version, pytest_runtime_tar
from tests.tasks.conftest import harbor_files, tb_files, write

BACKEND = "local"  # bubblewrap where available: the host's read-only /usr, no host python libs
PLAIN = {"allow_plain": True}  # tasks from disk run on local-plain only when allowed


def test_plugin_pinned():
    assert ctrf_plugin_version() >= (0, 6)
    assert b"ctrf/" in pytest_runtime_tar() and b"_pytest/" in pytest_runtime_tar()


def test_terminal_bench_reference_empty_partial(tb_dir):
    task = load_terminal_bench_task(tb_dir)
    ref = run_reference(task, backend=BACKEND)
    assert (ref.S, ref.P, ref.N) == (1, 4, 4), ref.artifacts["stdout.txt"]
    assert ref.exit_code == 0 and ref.report.shape == "ctrf"
    assert ref.report.hygiene_checks and ref.ctrf["results"]["tool"]["name"] == "pytest"
    assert {"ctrf.json", "stdout.txt", "stderr.txt"} <= set(ref.artifacts)
    empty = run_reference(task, backend=BACKEND, attempt=lambda sb: None)
    assert (empty.S, empty.P, empty.N) == (0, 0, 4)
    part = run_reference(task, backend=BACKEND, attempt=lambda sb: sb.exec(
        "echo 1 > count1.txt && echo hi > greeting.txt"))
    assert part.S == 0 and (part.P, part.N) == (2, 4)


def test_tests_are_protected(tb_dir):
    """The agent never sees the tests; planted pytest.py / conftest.py do not fool them."""
    task = load_terminal_bench_task(tb_dir)
    with open_task_sandbox(task, BACKEND) as sb:
        listing = sb.exec("find . -type f", timeout=10).stdout
        assert "test_outputs" not in listing and "solution" not in listing
        sb.exec("printf 'import sys; sys.exit(0)\\n' > pytest.py; "
                "printf 'def pytest_collection_modifyitems(items): items.clear()\\n' "
                "> conftest.py; mkdir -p .trsi_verifier_x/tests && "
                "echo 'def test_x(): pass' > .trsi_verifier_x/tests/test_z.py")
        r = verify(task, sb, backend=BACKEND)
        assert (r.S, r.P, r.N) == (0, 0, 4)
        run_solution(task, sb)
        r = verify(task, sb, backend=BACKEND, mode="shared")
        assert (r.S, r.P, r.N) == (1, 4, 4)
        assert ".trsi_verifier" not in sb.exec("ls -a", timeout=10).stdout.replace(
            ".trsi_verifier_x", "")


@pytest.mark.parametrize("mode", ["separate", "shared"])
def test_links_and_special_files_left_by_the_agent_keep_the_verdict(tb_dir, mode):
    """An absolute symlink, a link chain, a FIFO and a socket in the workspace: a correct
    solution still scores S = 1 (main raised VerifierError(infrastructure) here)."""
    task = load_terminal_bench_task(tb_dir)
    with open_task_sandbox(task, BACKEND) as sb:
        run_solution(task, sb)
        sb.exec("ln -s /usr/bin/python3 py && ln -s / rootlink && ln -s py py2 && "
                "mkfifo fifo && python3 -c \"import socket; "
                "socket.socket(socket.AF_UNIX).bind('sock')\"", timeout=10).check()
        r = verify(task, sb, backend=BACKEND, mode=mode)
        assert (r.S, r.P, r.N) == (1, 4, 4), r.artifacts.get("stdout.txt")


def test_a_workspace_too_large_to_copy_is_a_failing_verdict(tb_dir):
    task = load_terminal_bench_task(tb_dir)
    with open_task_sandbox(task, BACKEND) as sb:
        run_solution(task, sb)
        sb.exec("mkdir many && cd many && seq 25000 | xargs touch", timeout=60).check()
        r = verify(task, sb, backend=BACKEND)
        assert r.S == 0 and not r.report.valid
        assert "could not be copied" in " ".join(r.report.problems)


@pytest.mark.parametrize("name,text", [
    ("pytest.ini", "[pytest]\naddopts = --co\n"),
    ("pytest.ini", "[pytest]\naddopts = -p no:ctrf\n"),
    ("pyproject.toml", "[tool.pytest.ini_options]\naddopts = '--co'\n"),
    ("setup.cfg", "[tool:pytest]\naddopts = --co\n"),
])
def test_config_files_left_by_the_agent_do_not_steer_pytest(tb_dir, harbor_dir, name, text):
    """An ini file above the tests in the workspace (main: `addopts = --co` made an unsolved
    task pass with S = 1) is ignored by the pytest verifier and by a script's pytest."""
    for task in (load_terminal_bench_task(tb_dir), load_harbor_task(harbor_dir)):
        with open_task_sandbox(task, BACKEND) as sb:
            sb.put_files({name: text.encode()})
            r = verify(task, sb, backend=BACKEND)
            assert (r.S, r.P, r.N) == (0, 0, 4), (task.id, r.artifacts.get("stdout.txt"))
            run_solution(task, sb)
            r = verify(task, sb, backend=BACKEND, mode="shared")
            assert (r.S, r.P, r.N) == (1, 4, 4), (task.id, r.artifacts.get("stdout.txt"))


@pytest.mark.parametrize("mode", ["separate", "shared"])
def test_a_full_disk_left_by_the_agent_is_a_failing_verdict(tmp_path, mode):
    """No room for the copied workspace or the verifier's tests: S = 0, not an error."""
    toml = harbor_files()["task.toml"].replace("storage_mb = 512", "storage_mb = 16")
    task = load_harbor_task(write(tmp_path / "h", harbor_files(**{"task.toml": toml})))
    with open_task_sandbox(task, BACKEND) as sb:
        run_solution(task, sb)
        sb.exec("head -c 32M /dev/zero > fill; head -c 32M /dev/zero > /tmp/fill; true",
                timeout=30)
        r = verify(task, sb, backend=BACKEND, mode=mode)
    assert r.S == 0 and not r.report.valid
    assert "could not be" in " ".join(r.report.problems)


def test_real_tasks_refuse_plain_mode_unless_allowed(tb_dir):
    from terminal_rsi.sandbox import BadRequest

    task = load_terminal_bench_task(tb_dir)
    with pytest.raises(BadRequest, match="allow_plain_sandbox"):
        open_task_sandbox(task, "local-plain")
    with open_task_sandbox(task, "local-plain", allow_plain=True) as sb:
        assert sb.mode == "plain"


def test_without_bubblewrap_local_falls_back_only_where_the_policy_allows(tb_dir,
                                                                          monkeypatch):
    """README's main job on a machine without bubblewrap: built-in tasks run plain under
    'builtin'; a task directory from disk is refused unless the policy is 'always'."""
    from terminal_rsi.sandbox import BadRequest, local
    from terminal_rsi.tasks.builtin import make_task

    monkeypatch.setattr(local, "bwrap_available", lambda *a: False)
    builtin = make_task("count_lines", 0)
    disk = load_terminal_bench_task(tb_dir)
    with pytest.raises(BadRequest, match="allow_plain_sandbox"):
        open_task_sandbox(builtin, "local")
    with open_task_sandbox(builtin, "local", allow_plain="builtin") as sb:
        assert sb.mode == "plain"
    with pytest.raises(BadRequest, match="allow_plain_sandbox"):
        open_task_sandbox(disk, "local", allow_plain="builtin")
    with open_task_sandbox(disk, "local", allow_plain="always") as sb:
        assert sb.mode == "plain"


def test_harbor_reward_file_is_terminal_verdict(harbor_dir):
    task = load_harbor_task(harbor_dir)
    ref = run_reference(task, backend=BACKEND)
    assert ref.reward == 1.0 and (ref.S, ref.P, ref.N) == (1, 4, 4)
    assert ref.artifacts["reward.txt"].strip() == b"1"
    empty = run_reference(task, backend=BACKEND, attempt=lambda sb: None)
    assert empty.reward == 0.0 and (empty.S, empty.P) == (0, 0)


def test_harbor_reward_json_without_ctrf(tmp_path):
    root = write(tmp_path / "h", harbor_files(**{
        "tests/test.sh": "#!/bin/bash\necho '{\"reward\": 1.0}' > /logs/verifier/reward.json\n"}))
    r = run_reference(load_harbor_task(root), backend="local-plain", sandbox_kwargs=PLAIN)
    assert r.reward == 1.0 and r.S == 1
    assert not r.report.valid and "no CTRF report" in r.report.reason  # falls back to S


@pytest.mark.parametrize("script,kind", [
    ("sleep 30\n", "timeout"),
    ("echo no reward here\n", "crash"),
    ("kill -9 $$\n", "crash"),
])
def test_verifier_failures_are_typed(tmp_path, script, kind):
    root = write(tmp_path / "h", harbor_files(**{
        "tests/test.sh": "#!/bin/bash\n" + script,
        "task.toml": "[verifier]\ntimeout_sec = 2\n"}))
    with pytest.raises(VerifierError) as e:
        run_reference(load_harbor_task(root), backend="local-plain", sandbox_kwargs=PLAIN)
    assert e.value.kind == kind


def test_pytest_usage_error_is_crash(tmp_path):
    root = write(tmp_path / "t", tb_files(**{
        "task.yaml": "instruction: x\nparser_name: pytest\n",
        "tests/test_outputs.py": "def test_a():\n    pass\n"}))
    task = load_terminal_bench_task(root)
    import dataclasses

    bad = dataclasses.replace(task, verifier=dataclasses.replace(
        task.verifier, command="--no-such-option"))
    with pytest.raises(VerifierError) as e:
        run_reference(bad, backend="local-plain", sandbox_kwargs=PLAIN)
    assert e.value.kind == "crash"


def _docker_ready() -> str | None:
    try:
        from terminal_rsi.sandbox.docker_backend import docker_available
    except ImportError as e:
        return f"docker SDK missing ({e})"
    if not docker_available():
        return "no Docker engine answers (start one with .ci/setup_sandbox.sh)"
    import docker

    from terminal_rsi.sandbox import image

    if not image.image_is_current(docker.from_env(timeout=10)):
        return (f"image {image.DEFAULT_IMAGE} is not built "
                "(python -m terminal_rsi.sandbox.image build)")
    return None


def _need_docker():
    why = _docker_ready()
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI: {why}; .ci/setup_sandbox.sh should have started it")
        pytest.skip(why)


def test_docker_backend_builtin_families():
    _need_docker()
    from terminal_rsi.tasks.builtin import FAMILIES, make_task

    for name in FAMILIES:
        task = make_task(name, 1)
        r = run_reference(task, backend="docker")
        assert (r.S, r.P, r.N) == (1, task.expected_checks, task.expected_checks), (name, r.ctrf)


def test_docker_backend_pytest_path(tb_dir, harbor_dir):
    _need_docker()
    tb = load_terminal_bench_task(tb_dir)
    ref = run_reference(tb, backend="docker")
    assert (ref.S, ref.P, ref.N) == (1, 4, 4), ref.artifacts["stdout.txt"]
    empty = run_reference(tb, backend="docker", attempt=lambda sb: None)
    assert (empty.S, empty.P) == (0, 0)
    h = run_reference(load_harbor_task(harbor_dir), backend="docker")
    assert h.reward == 1.0 and (h.S, h.P, h.N) == (1, 4, 4)


@pytest.mark.parametrize("ctrf,problem", [
    ("not json", "JSON"),
    ('{"results": {"tool": {"name": "x"}, "tool": 1}}', "duplicate"),
    ('{"reportFormat": "CTRF", "specVersion": "1.0.0", "results": {"tool": {"name": "x"}, '
     '"summary": {"tests": 0, "passed": 0, "failed": 0, "skipped": 0, "pending": 0, '
     '"other": 0}, "tests": []}}', "zero tests"),
])
def test_bad_report_is_invalid_and_falls_back_to_reward(tmp_path, ctrf, problem):
    root = write(tmp_path / "h", harbor_files(**{
        "tests/test.sh": f"#!/bin/bash\necho '{ctrf}' > /logs/verifier/ctrf.json\n"
                         "echo 1 > /logs/verifier/reward.txt\n"}))
    r = run_reference(load_harbor_task(root), backend="local-plain", sandbox_kwargs=PLAIN)
    assert not r.report.valid and problem in r.report.reason, r.report.reason
    assert r.S == 1 and r.P == 0 and r.ctrf is None and "ctrf.json" in r.artifacts


def test_sandbox_without_pytest_is_a_crash_not_a_zero(tb_dir):
    """pytest_runtime='sandbox' trusts the sandbox's python; the host /usr python has no
    pytest, so the verifier cannot run: a typed crash, never a score of 0."""
    from terminal_rsi.sandbox import open_sandbox
    from terminal_rsi.tasks.verify import _PROBE

    with open_sandbox(backend="local-plain") as sb:
        if sb.exec(_PROBE, timeout=30).ok:
            pytest.skip("this host's system python has pytest and pytest-json-ctrf >= 0.6")
    task = load_terminal_bench_task(tb_dir)
    with pytest.raises(VerifierError) as e:
        run_reference(task, backend="local-plain", pytest_runtime="sandbox",
                      sandbox_kwargs=PLAIN)
    assert e.value.kind == "crash" and "pytest" in str(e.value)
    assert "stdout.txt" in e.value.artifacts


def test_docker_unbuildable_image_says_so(tmp_path):
    _need_docker()
    from terminal_rsi.tasks import EnvironmentUnavailable

    task = load_terminal_bench_task(write(tmp_path / "x", tb_files(
        Dockerfile="FROM example.invalid/no-such-image:1\nWORKDIR /app\n")))
    with pytest.raises(EnvironmentUnavailable, match="no-such-image.*cannot be pulled"):
        open_task_sandbox(task, "docker")
    image_only = load_harbor_task(write(tmp_path / "i", harbor_files(**{
        "environment/Dockerfile": None, "environment/name.txt": None,
        "task.toml": "[environment]\ndocker_image = 'example.invalid/absent:2'\n"})))
    with pytest.raises(EnvironmentUnavailable, match="absent:2"):
        open_task_sandbox(image_only, "docker")
