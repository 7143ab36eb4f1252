"""Protected verification through real pytest + pytest-json-ctrf and Harbor reward files.

Two layouts (see `tests.tasks.conftest.workspace_task`):

* the workspace layout of the built-in tasks (tests in `.trsi_verifier_<hex>/tests`,
  $TEST_DIR, $TRSI_LOGS_DIR, $TRSI_WORKSPACE), on the local backends: verify()'s guarantees
  (protected tests, what the agent leaves behind, typed verifier failures, CTRF reports,
  the pytest runtime) on the loaded test tasks re-laid out by `workspace_task`;
* the real layout of Terminal-Bench and Harbor tasks (their own image, /tests,
  /logs/verifier, /oracle and /solution), on Docker: local backends refuse it, and on
  Docker the same guarantees hold at those paths. Docker tests fail in CI (CI=true) and
  skip elsewhere without an engine and the task base image.
"""

from __future__ import annotations

import dataclasses
import json
import textwrap

import pytest

from terminal_rsi.tasks import (
    EnvironmentUnavailable,
    VerifierError,
    load_harbor_task,
    load_terminal_bench_task,
    open_task_sandbox,
    run_reference,
    run_solution,
    verify,
)
from terminal_rsi.tasks.check_tasks import check_task
from terminal_rsi.tasks.verify import ctrf_plugin_version, pytest_runtime_tar
from tests.sandbox.conftest import need_docker_image
from tests.tasks.conftest import (
    harbor_files,
    need_task_image,
    tb_files,
    workspace_task,
    write,
)

BACKEND = "local"  # bubblewrap where available: the host's read-only /usr, no host python libs
PLAIN = {"allow_plain": True}  # tasks from disk run on local-plain only when allowed


@pytest.fixture
def tb_ws(tb_dir):
    """The Terminal-Bench test task in the workspace layout (kind pytest over its tests)."""
    return workspace_task(load_terminal_bench_task(tb_dir))


@pytest.fixture
def harbor_ws(harbor_dir):
    """The Harbor test task in the workspace layout (test.sh at $TEST_DIR)."""
    return workspace_task(load_harbor_task(harbor_dir))


def _harbor_ws(root):
    return workspace_task(load_harbor_task(root))


def test_plugin_pinned():
    assert ctrf_plugin_version() >= (0, 6)
    assert b"ctrf/" in pytest_runtime_tar() and b"_pytest/" in pytest_runtime_tar()


def test_workspace_task_is_the_workspace_layout(tb_ws, harbor_ws):
    """What the local tests below run: no absolute test dir, no oracle, nothing of /tests or
    /logs/verifier left in the Harbor script, Terminal-Bench's tests run by pytest."""
    for task in (tb_ws, harbor_ws):
        assert task.verifier.tests_dir == "" and task.oracle is None
        assert task.verifier.mode == "separate" and "TEST_DIR" not in task.verifier.env
    assert tb_ws.verifier.kind == "pytest" and "run-tests.sh" not in tb_ws.verifier.files
    script = harbor_ws.verifier.files["test.sh"].decode()
    assert harbor_ws.verifier.command == 'bash "$TEST_DIR/test.sh"'
    assert "/tests" not in script and "/logs/verifier" not in script
    assert "${TRSI_LOGS_DIR}/reward.txt" in script


# ------------------------------------------------------------------ the workspace layout, local


def test_terminal_bench_reference_empty_partial(tb_ws):
    task = tb_ws
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


def test_tests_are_protected(tb_ws):
    """The agent never sees the tests; planted pytest.py / conftest.py do not fool them."""
    task = tb_ws
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
def test_links_and_special_files_left_by_the_agent_keep_the_verdict(tb_ws, mode):
    """An absolute symlink, a link chain, a FIFO and a socket in the workspace: a correct
    solution still scores S = 1 (main raised VerifierError(infrastructure) here)."""
    task = tb_ws
    with open_task_sandbox(task, BACKEND) as sb:
        run_solution(task, sb)
        sb.exec("ln -s /usr/bin/python3 py && ln -s / rootlink && ln -s py py2 && "
                "mkfifo fifo && python3 -c \"import socket; "
                "socket.socket(socket.AF_UNIX).bind('sock')\"", timeout=10).check()
        r = verify(task, sb, backend=BACKEND, mode=mode)
        assert (r.S, r.P, r.N) == (1, 4, 4), r.artifacts.get("stdout.txt")


def test_a_workspace_too_large_to_copy_is_a_failing_verdict(tb_ws):
    task = tb_ws
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
def test_config_files_left_by_the_agent_do_not_steer_pytest(tb_ws, harbor_ws, name, text):
    """An ini file above the tests in the workspace (main: `addopts = --co` made an unsolved
    task pass with S = 1) is ignored by the pytest verifier and by a script's pytest."""
    for task in (tb_ws, harbor_ws):
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
    task = _harbor_ws(write(tmp_path / "h", harbor_files(**{"task.toml": toml})))
    with open_task_sandbox(task, BACKEND) as sb:
        run_solution(task, sb)
        sb.exec("head -c 32M /dev/zero > fill; head -c 32M /dev/zero > /tmp/fill; true",
                timeout=30)
        r = verify(task, sb, backend=BACKEND, mode=mode)
    assert r.S == 0 and not r.report.valid
    assert "could not be" in " ".join(r.report.problems)


def test_real_tasks_refuse_plain_mode_unless_allowed(tb_ws):
    from terminal_rsi.sandbox import BadRequest

    task = tb_ws  # still a task from disk (format terminal-bench), not a built-in one
    with pytest.raises(BadRequest, match="allow_plain_sandbox"):
        open_task_sandbox(task, "local-plain")
    with open_task_sandbox(task, "local-plain", allow_plain=True) as sb:
        assert sb.mode == "plain"


@pytest.mark.parametrize("backend", ["local", "local-plain", "local-bwrap"])
def test_the_real_layout_is_refused_on_local_backends(tb_dir, harbor_dir, backend):
    """A task directory as its own tools run it needs its image and its paths: a local
    backend says so (and which backend can), even where plain mode is allowed; check_task
    makes that an UNAVAILABLE row."""
    for task in (load_terminal_bench_task(tb_dir), load_harbor_task(harbor_dir)):
        with pytest.raises(EnvironmentUnavailable, match="backend='docker'"):
            open_task_sandbox(task, backend, allow_plain="always")
        row = check_task(task, backend, allow_plain="always")
        assert row["verdict"] == "UNAVAILABLE" and "backend='docker'" in row["why"], row


def test_without_bubblewrap_local_falls_back_only_where_the_policy_allows(tb_ws,
                                                                          monkeypatch):
    """README's main job on a machine without bubblewrap: built-in tasks run plain under
    'builtin'; a task directory from disk is refused unless the policy is 'always'."""
    from terminal_rsi.sandbox import BadRequest, local
    from terminal_rsi.tasks.builtin import make_task

    monkeypatch.setattr(local, "bwrap_available", lambda *a: False)
    builtin = make_task("count_lines", 0)
    disk = tb_ws
    with pytest.raises(BadRequest, match="allow_plain_sandbox"):
        open_task_sandbox(builtin, "local")
    with open_task_sandbox(builtin, "local", allow_plain="builtin") as sb:
        assert sb.mode == "plain"
    with pytest.raises(BadRequest, match="allow_plain_sandbox"):
        open_task_sandbox(disk, "local", allow_plain="builtin")
    with open_task_sandbox(disk, "local", allow_plain="always") as sb:
        assert sb.mode == "plain"


def test_harbor_reward_file_is_terminal_verdict(harbor_ws):
    task = harbor_ws
    ref = run_reference(task, backend=BACKEND)
    assert ref.reward == 1.0 and (ref.S, ref.P, ref.N) == (1, 4, 4)
    assert ref.artifacts["reward.txt"].strip() == b"1"
    empty = run_reference(task, backend=BACKEND, attempt=lambda sb: None)
    assert empty.reward == 0.0 and (empty.S, empty.P) == (0, 0)


def test_harbor_reward_json_without_ctrf(tmp_path):
    root = write(tmp_path / "h", harbor_files(**{
        "tests/test.sh": "#!/bin/bash\necho '{\"reward\": 1.0}' > /logs/verifier/reward.json\n"}))
    r = run_reference(_harbor_ws(root), backend="local-plain", sandbox_kwargs=PLAIN)
    assert r.reward == 1.0 and r.S == 1
    assert not r.report.valid and "no CTRF report" in r.report.reason  # falls back to S


@pytest.mark.parametrize("script,kind", [
    ("sleep 30\n", "timeout"),
    ("echo no reward here\n", "crash"),
    ("kill -9 $$\n", "crash"),
])
def test_verifier_failures_score_zero_with_their_kind(tmp_path, script, kind):
    """A verifier that runs past its timeout, is killed or leaves no verdict after its tests
    began could have been made to by the agent's code: S = 0, kept, with the reason."""
    root = write(tmp_path / "h", harbor_files(**{
        "tests/test.sh": "#!/bin/bash\n" + script,
        "task.toml": "[verifier]\ntimeout_sec = 2\n"}))
    r = run_reference(_harbor_ws(root), backend="local-plain", sandbox_kwargs=PLAIN)
    assert (r.S, r.P, r.failure) == (0, 0, kind), r
    assert f"verifier {kind}" in r.report.reason and "stdout.txt" in r.artifacts


def test_pytest_usage_error_is_crash(tmp_path):
    root = write(tmp_path / "t", tb_files(**{
        "task.yaml": "instruction: x\nparser_name: pytest\n",
        "tests/test_outputs.py": "def test_a():\n    pass\n"}))
    task = workspace_task(load_terminal_bench_task(root))
    bad = dataclasses.replace(task, verifier=dataclasses.replace(
        task.verifier, command="--no-such-option"))
    r = run_reference(bad, backend="local-plain", sandbox_kwargs=PLAIN)
    assert (r.S, r.failure) == (0, "crash") and "pytest exited 4" in r.report.reason


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
    r = run_reference(_harbor_ws(root), backend="local-plain", sandbox_kwargs=PLAIN)
    assert not r.report.valid and problem in r.report.reason, r.report.reason
    assert r.S == 1 and r.P == 0 and r.ctrf is None and "ctrf.json" in r.artifacts


def test_sandbox_without_pytest_is_a_crash_not_a_zero(tb_ws):
    """pytest_runtime='sandbox' trusts the sandbox's python; the host /usr python has no
    pytest, so the verifier cannot run: a typed crash, never a score of 0."""
    from terminal_rsi.sandbox import open_sandbox
    from terminal_rsi.tasks.verify import _PROBE

    with open_sandbox(backend="local-plain") as sb:
        if sb.exec(_PROBE, timeout=30).ok:
            pytest.skip("this host's system python has pytest and pytest-json-ctrf >= 0.6")
    with pytest.raises(VerifierError) as e:
        run_reference(tb_ws, backend="local-plain", pytest_runtime="sandbox",
                      sandbox_kwargs=PLAIN)
    assert e.value.kind == "crash" and "pytest" in str(e.value)
    assert "stdout.txt" in e.value.artifacts


# ------------------------------------------------------------------ Terminal-Bench's verdict

TB_OUTPUT = textwrap.dedent("""
    ============================= test session starts ==============================
    PASSED tests/test_outputs.py::test_not_in_the_summary
    collected 8 items
    ../tests/test_outputs.py ..F.sxXE                                        [100%]
    =========================== short test summary info ============================
    PASSED ../tests/test_outputs.py::test_a
    PASSED ../tests/test_outputs.py::test_count[1]
    PASSED ../tests/test_outputs.py::TestK::test_m
    FAILED ../tests/test_outputs.py::test_b - AssertionError: assert 1 == 2
    SKIPPED ../tests/test_outputs.py::test_s
    XFAIL ../tests/test_outputs.py::test_x
    XPASS ../tests/test_outputs.py::test_xp
    ERROR ../tests/test_outputs.py::test_e
    ============= 1 failed, 3 passed, 1 skipped, 1 xfailed, 1 xpassed, 1 error =====
""")


def test_terminal_bench_summary_is_read_as_terminal_bench_reads_it():
    """`pytest_summary_results` is Terminal-Bench's PytestParser: only the lines after the
    "short test summary info" banner count; PASSED, SKIPPED and XFAIL pass, FAILED, XPASS
    and ERROR fail; a name is the node id after its first `::` (a FAILED line's message
    dropped); no banner is no verdict."""
    from terminal_rsi.tasks.verify import pytest_summary_results

    assert pytest_summary_results(TB_OUTPUT) == {
        "test_a": True, "test_count[1]": True, "TestK::test_m": True, "test_b": False,
        "test_s": True, "test_x": True, "test_xp": False, "test_e": False}
    lower = TB_OUTPUT.replace("short test summary info", "Short Test Summary Info")
    assert pytest_summary_results(lower) == pytest_summary_results(TB_OUTPUT)
    assert pytest_summary_results("1 passed in 0.01s\nPASSED t.py::test_a\n") is None
    # only a summary pytest finished: its final counts line, matching its result lines
    assert pytest_summary_results("==== short test summary info ====\n") is None
    banner = "==== short test summary info ====\n"
    assert pytest_summary_results(banner + "PASSED t.py::test_a\n1 passed in 0.1s\n") == {
        "test_a": True}
    assert pytest_summary_results(banner + "PASSED t.py::test_a\n") is None  # os._exit
    assert pytest_summary_results(  # a line added to the real summary
        banner + "PASSED t.py::test_a\nPASSED t.py::test_b\n1 passed in 0.1s\n") is None
    assert pytest_summary_results(  # a test reported twice
        banner + "FAILED t.py::test_a\nPASSED t.py::test_a\n1 failed, 1 passed in 1s\n") is None
    assert pytest_summary_results(  # a forged banner earlier: the last one counts
        banner + "PASSED t.py::test_a\n1 passed in 0.1s\n" + banner
        + "FAILED t.py::test_a\n1 failed in 0.2s\n") == {"test_a": False}


# ------------------------------------------------------------------ the real layout, Docker


def test_docker_real_layout_of_the_test_tasks(tb_dir, harbor_dir, tmp_path):
    """The test tasks as their own tools run them: Terminal-Bench's run-tests.sh graded by
    pytest's -rA summary (every test counts: the summary carries no hygiene marker), pytest
    over /tests with a CTRF report when there is no run-tests.sh, Harbor's reward and its
    CTRF report from /logs/verifier."""
    need_task_image()
    tb = load_terminal_bench_task(tb_dir)
    ref = run_reference(tb, backend="docker")
    assert (ref.S, ref.P, ref.N) == (1, 5, 5), ref.artifacts["stdout.txt"]
    assert ref.ctrf["results"]["tool"]["name"] == "pytest -rA" and ref.mode == "shared"
    empty = run_reference(tb, backend="docker", attempt=lambda sb: None)
    assert (empty.S, empty.P, empty.N) == (0, 1, 5)
    part = run_reference(tb, backend="docker", attempt=lambda sb: sb.exec(
        "echo 1 > count1.txt && echo hi > greeting.txt").check())
    assert (part.S, part.P, part.N) == (0, 3, 5)
    bare = load_terminal_bench_task(write(tmp_path / "bare", tb_files(**{"run-tests.sh": None})))
    assert bare.verifier.kind == "pytest"
    ref = run_reference(bare, backend="docker")
    assert (ref.S, ref.P, ref.N) == (1, 4, 4), ref.artifacts["stdout.txt"]
    h = run_reference(load_harbor_task(harbor_dir), backend="docker")
    assert h.reward == 1.0 and (h.S, h.P, h.N) == (1, 4, 4), h.artifacts["stdout.txt"]


def test_docker_tests_and_logs_left_by_the_agent_are_replaced(tb_dir, harbor_dir):
    """What the agent put at /tests or /logs/verifier is gone before the verifier's own files
    are placed: a planted run-tests.sh printing an all-PASSED summary, a planted test.sh and
    a planted reward.json do not turn an unsolved task into a pass."""
    need_task_image()
    from terminal_rsi.sandbox.base import files_to_tar

    fake = b"echo '=== short test summary info ==='\necho 'PASSED t.py::test_greeting_text'\n"
    tb = load_terminal_bench_task(tb_dir)
    with open_task_sandbox(tb, "docker") as sb:
        sb.put_tar(files_to_tar({"run-tests.sh": fake, "planted.txt": b"x"}, mode=0o755),
                   dest="/tests")
        r = verify(tb, sb, backend="docker")
        assert (r.S, r.P, r.N) == (0, 1, 5), r.artifacts["stdout.txt"]
        assert "planted.txt" not in sb.exec("ls -A /tests", timeout=10).stdout
        assert sb.get_file("/tests/run-tests.sh") == tb.verifier.files["run-tests.sh"]
    h = load_harbor_task(harbor_dir)
    with open_task_sandbox(h, "docker") as sb:
        sb.put_tar(files_to_tar({"test.sh": b"echo 1 > /logs/verifier/reward.txt\n"}),
                   dest="/tests")
        sb.put_tar(files_to_tar({"reward.json": b'{"reward": 1.0}', "planted.txt": b"x"}),
                   dest="/logs/verifier")
        r = verify(h, sb, backend="docker")
        assert r.reward == 0.0 and r.S == 0 and "reward.json" not in r.artifacts
        assert r.artifacts["reward.txt"].strip() == b"0"
        assert "planted" not in sb.exec("ls -A /logs/verifier", timeout=10).stdout


@pytest.mark.parametrize("fmt,script,kind", [
    ("harbor", "sleep 30\n", "timeout"),
    ("harbor", "echo no reward here\n", "crash"),
    ("tb", "sleep 30\n", "timeout"),
    ("tb", "echo no summary here\n", "crash"),
])
def test_docker_verifier_failures_are_typed(tmp_path, fmt, script, kind):
    """In the real layout too, a verifier that runs past its timeout, or leaves no verdict
    (no reward file; no pytest summary), scores 0 with its kind (as Harbor and Terminal-
    Bench score it), never a dropped episode."""
    need_task_image()
    if fmt == "harbor":
        task = load_harbor_task(write(tmp_path / "h", harbor_files(**{
            "tests/test.sh": "#!/bin/bash\n" + script,
            "task.toml": "[verifier]\ntimeout_sec = 2\n"})))
    else:
        task = load_terminal_bench_task(write(tmp_path / "t", tb_files(**{
            "run-tests.sh": "#!/bin/bash\n" + script,
            "task.yaml": "instruction: x\nmax_test_timeout_sec: 2\n"})))
    r = run_reference(task, backend="docker")
    assert (r.S, r.P, r.failure) == (0, 0, kind), r


@pytest.mark.parametrize("reward_json,reward_txt,S,failure", [
    ('{"reward": 0.0}', "1", 0, "refused"),
    ('{"reward": 1.0}', "0", 0, "refused"),
    ('{"reward": 1.0}', "1", 1, ""),
])
def test_docker_harbor_reward_files_must_agree(tmp_path, reward_json, reward_txt, S,
                                               failure):
    """reward.txt and reward.json written with different values mean a second writer (code
    the script ran): refused, S = 0; the same value in both is the verdict."""
    need_task_image()
    script = (f"#!/bin/bash\necho '{reward_json}' > /logs/verifier/reward.json\n"
              f"echo {reward_txt} > /logs/verifier/reward.txt\n")
    task = load_harbor_task(write(tmp_path / "h", harbor_files(**{"tests/test.sh": script})))
    r = run_reference(task, backend="docker")
    assert (r.S, r.failure) == (S, failure), r.report.reason
    assert json.loads(r.artifacts["reward.json"]) == json.loads(reward_json)
    if failure:
        assert "reward.txt says" in r.report.reason


def test_docker_a_reward_only_harbor_task_passes_check_task(tmp_path):
    """Harbor's verdict is the reward alone: without a CTRF report the reference passes (P and
    N unknown), an unsolved run fails; a task that declares expected_checks needs the CTRF
    report that would count them."""
    need_task_image()
    script = ('#!/bin/bash\nr=0; [ "$(cat /app/greeting.txt)" = "hello ada" ] && r=1\n'
              'echo "{\\"reward\\": $r}" > /logs/verifier/reward.json\n')
    files = harbor_files(**{"tests/test.sh": script, "task.toml": "[verifier]\ntimeout_sec = 60\n"})
    task = load_harbor_task(write(tmp_path / "h", files))
    row = check_task(task, "docker")
    assert row["verdict"] == "PASS" and row["S"] == 1 and row["reward"] == 1.0, row
    assert not row["report"]["valid"] and "no CTRF report" in row["why"] + str(row["report"])
    unsolved = dataclasses.replace(task, oracle=None, solution=(("true",),))
    row = check_task(unsolved, "docker")
    assert row["verdict"] == "FAIL" and row["S"] == 0 and row["reward"] == 0.0, row
    counted = load_harbor_task(write(tmp_path / "c", {
        **files, "task.toml": "[metadata]\nexpected_checks = 4\n"}))
    row = check_task(counted, "docker")
    assert row["verdict"] == "FAIL" and row["S"] == 1 and "no CTRF report" in row["why"], row


def test_docker_an_image_with_a_non_root_user_can_write_its_verdict(tmp_path):
    need_docker_image()
    from terminal_rsi.sandbox.image import DEFAULT_IMAGE  # USER sandbox (uid 1000)

    task = load_harbor_task(write(tmp_path / "h", harbor_files(**{
        "environment/Dockerfile": f"FROM {DEFAULT_IMAGE}\nWORKDIR /app\n"
                                  "COPY name.txt /app/name.txt\n"})))
    row = check_task(task, "docker")
    assert "Permission denied" not in row.get("why", ""), row["why"]
    assert row["verdict"] == "PASS", row


def test_docker_backend_builtin_families():
    need_docker_image()
    from terminal_rsi.tasks.builtin import FAMILIES, make_task

    for name in FAMILIES:
        task = make_task(name, 1)
        r = run_reference(task, backend="docker")
        assert (r.S, r.P, r.N) == (1, task.expected_checks, task.expected_checks), (name, r.ctrf)


def test_docker_unbuildable_image_says_so(tmp_path):
    need_docker_image()
    task = load_terminal_bench_task(write(tmp_path / "x", tb_files(
        Dockerfile="FROM example.invalid/no-such-image:1\nWORKDIR /app\n")))
    with pytest.raises(EnvironmentUnavailable, match="no-such-image.*cannot be pulled"):
        open_task_sandbox(task, "docker")
    image_only = load_harbor_task(write(tmp_path / "i", harbor_files(**{
        "environment/Dockerfile": None, "environment/name.txt": None,
        "task.toml": "[environment]\ndocker_image = 'example.invalid/absent:2'\n"})))
    with pytest.raises(EnvironmentUnavailable, match="absent:2"):
        open_task_sandbox(image_only, "docker")
