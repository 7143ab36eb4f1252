"""Red-team of the protected verifier: hostile scripted agents on tasks they cannot solve.

Every case types keystrokes into the agent's terminal session (`play`, as in
test_verifier_integrity.py) on a task whose tests hold a random secret, then runs `verify`.
The property asserted is always the verifier's: S == 0 and P == 0, and a verdict rather than
a `VerifierError` (a dropped episode) for what the agent did.

* A plain test is an attack that is blocked today.
* ``xfail(strict=True, raises=...)`` is an attack that still works: the assertion (or the
  VerifierError) is the attack succeeding. A fix turns it into an XPASS, which fails the run
  so the marker gets removed. Set-up problems raise something else (RuntimeError), so a case
  whose attack could not even be put in place fails instead of hiding behind the xfail.

Most cases run on local bubblewrap only (the verifier logic under attack is the same on every
backend); the backend fixture (local-bwrap, Docker, the bridge) is used where the backend
matters: the channel's wrappers, /tmp's owner, the process listing.
"""

from __future__ import annotations

import json
import secrets
import textwrap

import pytest

from terminal_rsi.tasks import Task
from terminal_rsi.tasks.builtin import make_task
from terminal_rsi.tasks.spec import Environment, Metadata, VerifierSpec
from terminal_rsi.tasks.verify import open_task_sandbox, verify
from tests.sandbox.conftest import bridge, need_bwrap, need_docker_image  # noqa: F401
from tests.tasks.test_verifier_integrity import heredoc, play, secret_task, secret_tests

MODES = ("separate", "shared")
LOCAL = ("local-bwrap", {})


@pytest.fixture(params=["local-bwrap", "docker", "bridge"])
def backend(request):
    """(backend, sandbox kwargs), as test_verifier_integrity's fixture."""
    if request.param == "local-bwrap":
        need_bwrap()
        return LOCAL
    if request.param == "docker":
        need_docker_image()
        return "docker", {}
    srv = request.getfixturevalue("bridge")
    return srv.url, {"token": srv.token}


@pytest.fixture
def local():
    need_bwrap()
    return LOCAL


def _is(backend_, name: str) -> bool:
    return backend_[0] == name or (name == "bridge" and backend_[0].startswith("http"))


def _task(kind: str, mode: str, files: dict, command: str, tid: str) -> Task:
    return Task(id=tid, family=tid, instruction="Guess the secret.",
                environment=Environment(files={"answer.txt": b"?\n"}),
                verifier=VerifierSpec(kind=kind, mode=mode, command=command, timeout_s=30,
                                      files={k: v.encode() for k, v in files.items()}),
                solution=(), metadata=Metadata(tags=("hostile",)), format="builtin")


def tb_task(secret: str, mode: str) -> Task:
    """A Terminal-Bench verifier (run-tests.sh; its pytest -rA summary is the verdict) in the
    workspace layout."""
    run_tests = ('#!/bin/bash\ncd "$TEST_DIR" && python3 -m pytest -q -rA '
                 '-p no:cacheprovider test_secret.py\n')
    return _task("terminal-bench", mode, {"test_secret.py": secret_tests(secret),
                                          "run-tests.sh": run_tests},
                 'bash "$TEST_DIR/run-tests.sh"', "tbsecret")


def harbor_task(secret: str, mode: str) -> Task:
    """A Harbor test.sh (reward.txt from pytest's exit status) in the workspace layout."""
    test_sh = ('#!/bin/bash\ncd "$TEST_DIR"\npython3 -m pytest -q -p no:cacheprovider '
               '--ctrf "$TRSI_LOGS_DIR/ctrf.json" test_secret.py\n'
               'if [ $? -eq 0 ]; then echo 1 > "$TRSI_LOGS_DIR/reward.txt"; '
               'else echo 0 > "$TRSI_LOGS_DIR/reward.txt"; fi\n')
    return _task("script", mode, {"test_secret.py": secret_tests(secret), "test.sh": test_sh},
                 'bash "$TEST_DIR/test.sh"', "hsecret")


def subprocess_task(secret: str, mode: str) -> Task:
    """A pytest task whose test runs the agent's program as a subprocess (never imports it):
    the usual Terminal-Bench pattern, where in-process forging is not available."""
    src = textwrap.dedent(f'''
        import os
        import subprocess
        import sys

        WS = os.environ["TRSI_WORKSPACE"]
        SECRET = "{secret}"


        def test_program():
            out = subprocess.run([sys.executable, os.path.join(WS, "solution.py")],
                                 capture_output=True, text=True, timeout=20).stdout
            assert out.strip() == SECRET
    ''')
    return _task("pytest", mode, {"test_secret.py": src}, "", "psub")


def _result(task, backend_, keys, mode, **kw):
    r = play(task, backend_, keys, mode, **kw)
    return r, (r.S, r.P, r.failure, r.report.reason, dict(r.artifacts))


# ----------------------------------------------------------------------------- in-process

# solution.py, imported by test_solution inside the verifier's pytest process.
INPROCESS = {
    # PYTEST_BOOT runs as `python3 -I -c`: its globals (nonce, chan, send, collected) are
    # module __main__'s. A complete channel, then an exit before the real records.
    "channel_from___main__": textwrap.dedent('''
        import __main__, json, os
        ids = list(__main__.collected)
        doc = {"reportFormat": "CTRF", "specVersion": "1.0.0", "results": {
            "tool": {"name": "pytest"},
            "summary": {"tests": len(ids), "passed": len(ids), "failed": 0, "skipped": 0,
                        "pending": 0, "other": 0, "start": 1, "stop": 2},
            "tests": [{"name": i, "status": "passed", "duration": 0} for i in ids]}}
        __main__.send(json.dumps(doc))
        __main__.send("\\n" + __main__.nonce + json.dumps({"rc": 0, "collected": ids}) + "\\n")
        os._exit(0)
    '''),
    # No nonce, no channel: the CTRF plugin's report and pytest's exit status patched in
    # the process; the bootstrap then sends a consistent, all-passed verdict itself.
    "report_and_exitstatus_patched": textwrap.dedent('''
        import gc
        import ctrf.Report as R
        import pytest
        from _pytest.main import Session
        _orig = R.Report.get_report
        def get_report(self):
            d = _orig(self)
            for t in d["results"]["tests"]:
                t["status"] = "passed"
                t.pop("message", None)
                t.pop("trace", None)
            s = d["results"]["summary"]
            s["passed"], s["failed"] = s["tests"], 0
            return d
        R.Report.get_report = get_report
        class _Fix:
            @pytest.hookimpl(tryfirst=True)
            def pytest_sessionfinish(self, session):
                session.exitstatus = 0
        next(o for o in gc.get_objects() if isinstance(o, Session)
             ).config.pluginmanager.register(_Fix())
        def answer():
            return None
    '''),
    # The test compares the agent's value with the secret: an object equal to everything.
    "always_equal_answer": textwrap.dedent('''
        class _Eq(str):
            def __eq__(self, other):
                return True
            __hash__ = str.__hash__
        def answer():
            return _Eq("x")
    '''),
    # The secret read from the calling test's globals.
    "secret_from_the_test_frame": textwrap.dedent('''
        import sys
        def answer():
            return sys._getframe(1).f_globals["SECRET"]
    '''),
}


# ----------------------------------------------------------------------------- Terminal-Bench

# Suspends pytest's capture (found with gc) so the text reaches the real stdout/stderr.
_UNCAPTURED = textwrap.dedent('''
    import gc, os, sys
    from _pytest.capture import CaptureManager
    capman = next(o for o in gc.get_objects() if isinstance(o, CaptureManager))
    capman.suspend_global_capture(in_=False)
''')
PASSED = "PASSED test_secret.py::test_answer\\nPASSED test_secret.py::test_solution\\n"
TB_ATTACKS = {
    # stdout + "\n" + stderr is parsed: PASSED lines on stderr come after the real summary
    # and overwrite its FAILED lines; pytest runs to its end.
    "passed_lines_on_stderr": _UNCAPTURED + textwrap.dedent(f'''
        sys.stderr.write("{PASSED}")
        sys.stderr.flush()
        capman.resume_global_capture()
        def answer():
            return None
    '''),
    # a summary of its own, then the process ends before pytest prints the real one
    "own_summary_then_exit": _UNCAPTURED + textwrap.dedent(f'''
        sys.stdout.write("\\n===== short test summary info =====\\n{PASSED}")
        sys.stdout.flush()
        os._exit(0)
    '''),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("attack", sorted(TB_ATTACKS))
def test_terminal_bench_summary_forged(local, attack, mode):
    task = tb_task(secrets.token_hex(8), mode)
    r, why = _result(task, local, [heredoc("solution.py", TB_ATTACKS[attack])], mode)
    assert (r.S, r.P) == (0, 0), why


def test_terminal_bench_baseline_fails(local):
    r, why = _result(tb_task(secrets.token_hex(8), "separate"), local, [], "separate")
    assert (r.S, r.P, r.N) == (0, 0, 2), why


# ----------------------------------------------------------------------------- Harbor script

HARBOR_ATTACKS = {
    # pytest exits 0 from inside a test: test.sh writes reward 1
    "exit_0": "import os\nos._exit(0)\n",
}
# reward.txt made a directory (the script's write fails), reward.json says 1: blocked (a
# verdict file's name taken by a non-file is unreadable, no verdict, S = 0)
HARBOR_BLOCKED = {
    "reward_txt_is_a_directory": textwrap.dedent('''
        import json, os
        d = os.environ["TRSI_LOGS_DIR"]
        os.makedirs(os.path.join(d, "reward.txt"), exist_ok=True)
        with open(os.path.join(d, "reward.json"), "w") as f:
            f.write(json.dumps({"reward": 1.0}))
        def answer():
            return None
    '''),
}


@pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
    "open, as in Harbor: test.sh derives the reward from pytest's exit status, which code "
    "the tests import can set (os._exit(0))"))
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("attack", sorted(HARBOR_ATTACKS))
def test_harbor_reward_forged(local, attack, mode):
    task = harbor_task(secrets.token_hex(8), mode)
    r, why = _result(task, local, [heredoc("solution.py", HARBOR_ATTACKS[attack])], mode)
    assert r.S == 0, why


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("attack", sorted(HARBOR_BLOCKED))
def test_harbor_reward_forgery_blocked(local, attack, mode):
    task = harbor_task(secrets.token_hex(8), mode)
    r, why = _result(task, local, [heredoc("solution.py", HARBOR_BLOCKED[attack])], mode)
    assert (r.S, r.P) == (0, 0) and r.failure, why


# ----------------------------------------------------------------------------- the channel
# from a subprocess (not in-process): the test runs the agent's program

# Finds the nonce in an ancestor's argv (/proc/<pid>/cmdline is readable by the same uid,
# dumpable or not) and an ancestor whose fd 1 is the channel pipe, writes a complete
# report and a closing record, then kills the bootstrap: the record's rc is the status a
# SIGKILL gives the command (-9), which is not 0 or 1, so the report's names are not
# compared with what pytest collected and its P counts.
CHANNEL_FORGER = textwrap.dedent('''
    import json, os, signal
    def parent(pid):
        return int(open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()[1])
    nonce = chan = boot = None
    pid = os.getppid()
    while pid >= 1:
        try:
            argv = open("/proc/%d/cmdline" % pid, "rb").read().split(b"\\0")
        except OSError:
            argv = []
        if argv[:3] == [b"python3", b"-I", b"-c"] and boot is None:
            boot = pid
        for a in argv:
            if a.startswith(b"TRSI_VERDICT_NONCE="):
                nonce = a.split(b"=", 1)[1].decode()
        if chan is None:
            try:
                chan = os.open("/proc/%d/fd/1" % pid, os.O_WRONLY)
            except OSError:
                pass
        if pid == 1:
            break
        pid = parent(pid)
    with open(os.path.join(os.environ["TRSI_WORKSPACE"], "forger.log"), "w") as f:
        f.write(json.dumps({"nonce": bool(nonce), "chan": chan is not None, "boot": boot}))
    if nonce and chan is not None and boot:
        ids = ["test_secret.py::test_program"]
        doc = {"reportFormat": "CTRF", "specVersion": "1.0.0", "results": {
            "tool": {"name": "pytest"},
            "summary": {"tests": 1, "passed": 1, "failed": 0, "skipped": 0, "pending": 0,
                        "other": 0, "start": 1, "stop": 2},
            "tests": [{"name": i, "status": "passed", "duration": 0} for i in ids]}}
        record = {"rc": -9, "collected": ids}
        os.write(chan, (json.dumps(doc) + "\\n" + nonce + json.dumps(record) + "\\n").encode())
        os.kill(boot, signal.SIGKILL)
    print("no secret")
''')


@pytest.mark.parametrize("mode", MODES)
def test_channel_forged_from_a_subprocess(backend, mode):
    # (docker: the exec wrapper carries the nonce in its argv and holds the channel pipe as
    # a dumpable fd 1, so the program can write a whole forged stream; it cannot make pytest
    # exit 0, and only a pytest that ran to the end (rc 0 or 1, equal to the command's)
    # has a report that counts)
    task = subprocess_task(secrets.token_hex(8), mode)
    r, why = _result(task, backend, [heredoc("solution.py", CHANNEL_FORGER)], mode)
    assert (r.S, r.P) == (0, 0), why


# A Terminal-Bench test that runs the agent's program as a subprocess (never imports it), in
# the task's own image as Terminal-Bench runs it: the program writes PASSED lines into the
# stderr of run-tests.sh's bash (an ancestor, dumpable, whose fd 2 is the exec's pipe).
STDERR_OF_AN_ANCESTOR = textwrap.dedent('''
    import os
    pid = os.getppid()
    while pid > 1:
        try:
            fd = os.open("/proc/%d/fd/2" % pid, os.O_WRONLY)
            os.write(fd, b"\\nPASSED test_secret.py::test_program\\n")
            os.close(fd)
        except OSError:
            pass
        pid = int(open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()[1])
    print("no secret")
''')


def tb_image_task(secret: str, mode: str) -> Task:
    src = textwrap.dedent(f'''
        import os
        import subprocess
        import sys

        SECRET = "{secret}"


        def test_program():
            out = subprocess.run([sys.executable, "/app/solution.py"], capture_output=True,
                                 text=True, timeout=20).stdout
            assert out.strip() == SECRET
    ''')
    run_tests = "#!/bin/bash\ncd /tests && python3 -m pytest -q -rA -p no:cacheprovider " \
                "test_secret.py\n"
    return Task(id="tbimg", family="tbimg", instruction="Guess the secret.",
                environment=Environment(image="trsi-task-base:bookworm", workdir="/app"),
                verifier=VerifierSpec(kind="terminal-bench", mode=mode, timeout_s=30,
                                      command="bash /tests/run-tests.sh", tests_dir="/tests",
                                      env={"TEST_DIR": "/tests"},
                                      files={"test_secret.py": src.encode(),
                                             "run-tests.sh": run_tests.encode()}),
                solution=(), metadata=Metadata(tags=("hostile",)), format="terminal-bench")


@pytest.mark.parametrize("mode", MODES)
def test_terminal_bench_summary_forged_from_a_subprocess(mode):
    from tests.tasks.conftest import need_task_image

    need_task_image()
    task = tb_image_task(secrets.token_hex(8), mode)
    r, why = _result(task, ("docker", {}), [heredoc("solution.py", STDERR_OF_AN_ANCESTOR)],
                     mode)
    assert (r.S, r.P) == (0, 0), why


# ----------------------------------------------------------------------------- dropped episodes


@pytest.mark.parametrize("mode", MODES)
def test_shared_tmp_made_unwritable(backend, mode):
    """/tmp belongs to the sandbox uid under bubblewrap: the tests' HOME and TMPDIR are
    placed beside them in the verifier's directory (never made under /tmp), so an agent that
    made /tmp unwritable gets a verdict, not a dropped episode."""
    task = secret_task(secrets.token_hex(8))
    r, why = _result(task, backend, ["chmod 500 /tmp 2>/dev/null; true\n"], mode)
    assert (r.S, r.P) == (0, 0), why


# ----------------------------------------------------------------------------- hidden jobs

def _flag(task: Task) -> str:
    return task.solution[1][1].split()[-1]


HIDE_JOB = {
    # job.sh run through a hard link, its lock opened through a symlink to another name,
    # both names removed: argv says ./.j, the open files say .j and .z (deleted)
    "hardlink_and_symlinked_lock": lambda flag: [
        "ln job.sh .j && ln -s .z job.lock\n", "(./.j &) ; sleep 0.3\n",
        "rm -f .j .z job.lock\n", f"./job.sh {flag}\n"],
    # job.sh's text piped into bash, its lock behind a symlink
    "piped_into_bash": lambda flag: [
        "ln -s .z job.lock\n", "(cat job.sh | bash &) ; sleep 0.3\n",
        "rm -f .z job.lock\n", f"./job.sh {flag}\n"],
}


@pytest.mark.parametrize("attack", sorted(HIDE_JOB))
def test_interrupt_and_redo_hidden_job(local, attack):
    task = make_task("interrupt_and_redo", 0)
    name, kw = local
    with open_task_sandbox(task, name, **kw) as sb:
        term = sb.open_session()
        for keys in HIDE_JOB[attack](_flag(task)):
            term.run(keys, 10)
        waiting = [p for p in sb.processes()
                   if p.argv[:1] == ("sleep",) and any(".z" in f for f in p.files)]
        if not waiting:  # the hung job must be running when the verifier starts
            raise RuntimeError(f"no hidden job: {sb.processes()}")
        r = verify(task, sb, backend=name, mode="shared", sandbox_kwargs=kw)
    names = {t["name"]: t["status"] for t in r.ctrf["results"]["tests"]}
    assert r.S == 0 and names["no job.sh is left running"] == "failed", names


# ----------------------------------------------------------------------------- blocked

PLANTED_CONFIG = {
    # every configuration file pytest could read above the tests, with addopts that would
    # pass an unsolved task (--co: collect only, exit 0) and a conftest that passes all
    "ini_files": [heredoc(n, t) for n, t in (
        ("pytest.ini", "[pytest]\naddopts = --co -p no:ctrf.main\n"),
        ("tox.ini", "[pytest]\naddopts = --co\n"),
        ("setup.cfg", "[tool:pytest]\naddopts = --co\n"),
        ("pyproject.toml", "[tool.pytest.ini_options]\naddopts = '--co'\n"),
    )],
    "conftest_and_init": [
        heredoc("conftest.py", "import os\nos._exit(0)\n"),
        heredoc("__init__.py", "import os\nos._exit(0)\n"),
        "mkdir -p .trsi_verifier_x/tests && cp conftest.py .trsi_verifier_x/\n",
    ],
    # modules the bootstrap and pytest import at start-up, planted in the working directory
    "shadow_modules": [
        heredoc("pytest.py", "import os\nos._exit(0)\n"),
        heredoc("ctypes.py", "import os\nos._exit(0)\n"),
        "mkdir -p ctrf _pytest && cp pytest.py ctrf/__init__.py && cp pytest.py "
        "_pytest/__init__.py && cp pytest.py sitecustomize.py\n",
    ],
    # stale verifier paths: a symlink into /tmp and a directory with a forged report
    "stale_verifier_paths": [
        "ln -s /tmp .trsi_verifier_link && mkdir -p /tmp/.trsi_verifier_0/logs "
        ".trsi_verifier_1/logs && echo 1 > .trsi_verifier_1/logs/reward.txt\n",
    ],
    # names the copy, the scrub and the tar filter must survive
    "odd_names": ["python3 -c \"import os; open(b'bad\\xff\\xfename','w'); "
                  "open('new\\nline.pyc','w'); os.symlink('/etc/passwd','abs_link'); "
                  "os.symlink('../../..','up_link'); os.link('answer.txt','hard'); "
                  "os.mkfifo('fifo'); os.makedirs('x/__pycache__/y')\"\n"],
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("attack", sorted(PLANTED_CONFIG))
def test_planted_files_do_not_steer_pytest(local, attack, mode):
    task = secret_task(secrets.token_hex(8))
    r, why = _result(task, local, PLANTED_CONFIG[attack], mode)
    assert (r.S, r.P, r.N, r.failure) == (0, 0, 2, ""), why


CODE_THE_TESTS_RUN = {
    # a guessed record written to every descriptor and to the terminal stdout
    "forged_records_on_every_fd": textwrap.dedent('''
        import json, os
        rec = ("\\nTRSI-VERDICT-" + "0" * 32 + ":started\\n{}\\nTRSI-VERDICT-" + "0" * 32
               + ":" + json.dumps({"rc": 0, "collected": []}) + "\\n").encode()
        for fd in range(64):
            try:
                os.write(fd, rec)
            except OSError:
                pass
        def answer():
            return None
    '''),
    "huge_output": textwrap.dedent('''
        import os
        blob = b"x" * (1 << 20)
        for _ in range(32):
            os.write(1, blob)
            os.write(2, blob)
        def answer():
            return None
    '''),
    "closes_every_fd": textwrap.dedent('''
        import os
        for fd in range(64):
            try:
                os.close(fd)
            except OSError:
                pass
        def answer():
            return None
    '''),
    # a forked copy of the test process that outlives it
    "fork_lingers": textwrap.dedent('''
        import os, time
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        def answer():
            return None
    '''),
}


INPROCESS_OPEN = pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
    "open: agent code a test imports runs in the verifier's pytest process (docs/tasks.md "
    "threat model row 'forges the verdict in-process'); the nonce is a global of __main__, "
    "and pytest's own report and exit status can be patched without it"))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("source", [pytest.param(INPROCESS[k], id=k, marks=INPROCESS_OPEN)
                                    for k in sorted(INPROCESS)]
                         + [pytest.param(CODE_THE_TESTS_RUN[k], id=k)
                            for k in sorted(CODE_THE_TESTS_RUN)])
def test_code_the_tests_run(local, source, mode):
    """solution.py, imported or run by the tests: the attacks still open are strict xfails
    (`INPROCESS`), the blocked ones plain (`CODE_THE_TESTS_RUN`)."""
    task = secret_task(secrets.token_hex(8))
    r, why = _result(task, local, [heredoc("solution.py", source)], mode)
    assert (r.S, r.P) == (0, 0), why


SHARED_DOS = {
    # cleaning the workspace fails: a directory the verifier cannot enter
    "locked_pycache": ["mkdir -p d/__pycache__ && touch d/__pycache__/x.pyc && chmod 000 d\n"],
    # the tests cannot be placed: the workspace made read-only
    "read_only_workspace": ["chmod 500 /workspace\n"],
    # the workspace and /tmp full
    "full_disk": ["head -c 600M /dev/zero > /tmp/fill 2>/dev/null; "
                  "head -c 600M /dev/zero > .fill 2>/dev/null; true\n"],
}


@pytest.mark.parametrize("attack", sorted(SHARED_DOS))
def test_shared_mode_failures_are_verdicts(local, attack):
    """What the agent leaves behind in shared mode gives S = 0, never a VerifierError."""
    task = secret_task(secrets.token_hex(8))
    r, why = _result(task, local, SHARED_DOS[attack], "shared")
    assert (r.S, r.P) == (0, 0), why


def test_pure_forged_ctrf_record_rules():
    """read_channel's exact-three-parts rule: a second closing record is no record."""
    from terminal_rsi.tasks.verify import read_channel

    rec = json.dumps({"rc": 0, "collected": ["t"]})
    out = f"\nN:started\n{{}}\nN:{rec}\nN:{rec}\n"
    assert read_channel(out, "N:")[2] is None
