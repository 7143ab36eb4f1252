"""Reward integrity: a scripted agent on a task it cannot solve never gets S = 1 or P > 0.

Each case is a hostile agent typing keystrokes into its terminal session (as a policy would),
on a task whose tests hold a random secret the agent never sees, then the protected verifier
in both modes, on every backend that runs here (local bubblewrap, Docker, the HTTP bridge).
Classes (issue "reward integrity"; the threat model is docs/tasks.md, "Threat model of the
verifier"): Python start-up hooks in the agent's home, a process left running that rewrites
the placed tests and verdict files, agent code a test imports that writes a verdict, exits
or kills the verifier, compiled Python planted beside a module a check imports, a job left
running behind a deleted lock. Each attack is also checked to be live: the agent's files
are there when the verifier runs (a case that could not have worked proves nothing).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import io
import json
import os
import secrets
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import textwrap
from pathlib import Path

import pytest

from terminal_rsi.agent.harness import HarnessConfig
from terminal_rsi.sandbox.base import ProcessInfo
from terminal_rsi.tasks import Task
from terminal_rsi.tasks.builtin import make_task
from terminal_rsi.tasks.builtin.terminal_families import jobs_left_running
from terminal_rsi.tasks.spec import Environment, Metadata, VerifierSpec
from terminal_rsi.tasks.verify import (
    PYTEST_BOOT,
    CheckResult,
    open_task_sandbox,
    pytest_runtime_tar,
    read_channel,
    script_reward,
    verify,
)
from tests.sandbox.conftest import bridge, need_bwrap, need_docker_image  # noqa: F401

MODES = ("separate", "shared")

# Writes every verdict file an old verifier read (CTRF with passing tests, reward files,
# Terminal-Bench's summary) wherever it finds a verifier directory, then ends the process
# with status 0. `{where}`: a shell glob of the logs directories.
FORGE_PY = textwrap.dedent('''
    import glob, json, os, sys
    doc = {"reportFormat": "CTRF", "specVersion": "1.0.0", "results": {
        "tool": {"name": "pytest"},
        "summary": {"tests": 2, "passed": 2, "failed": 0, "skipped": 0, "pending": 0,
                    "other": 0, "start": 1, "stop": 2},
        "tests": [{"name": n, "status": "passed", "duration": 0}
                  for n in ("test_secret.py::test_answer", "test_secret.py::test_solution")]}}
    dirs = [os.environ.get("TRSI_LOGS_DIR", "")] + glob.glob("{where}")
    for d in filter(None, dirs):
        for name, text in (("ctrf.json", json.dumps(doc)), ("reward.txt", "1"),
                           ("reward.json", '{"reward": 1.0}')):
            try:
                with open(os.path.join(d, name), "w") as f:
                    f.write(text)
            except OSError:
                pass
    print("=== short test summary info ===")
    print("PASSED test_secret.py::test_answer")
    sys.stdout.flush()
''')


def forge(where: str = "/nonexistent") -> str:
    return FORGE_PY.replace("{where}", where)


def secret_tests(secret: str) -> str:
    """The secret task's test file: answer.txt must hold the secret, and the agent's
    solution.py (imported by a test: agent code the verifier runs) must return it. The
    workspace is $TRSI_WORKSPACE, or the working directory in a task's own layout."""
    return textwrap.dedent(f'''
        import os
        import sys

        WS = os.environ.get("TRSI_WORKSPACE") or os.getcwd()
        SECRET = "{secret}"


        def test_answer():
            with open(os.path.join(WS, "answer.txt")) as f:
                assert f.read().strip() == SECRET


        def test_solution():
            sys.path.insert(0, WS)
            import solution
            assert solution.answer() == SECRET
    ''')


def secret_task(secret: str) -> Task:
    """A workspace-layout pytest task over `secret_tests`."""
    tests = secret_tests(secret)
    return Task(id="secret", family="secret", instruction="Guess the secret.",
                environment=Environment(files={"answer.txt": b"?\n"}),
                verifier=VerifierSpec(kind="pytest", files={"test_secret.py": tests.encode()},
                                      timeout_s=30),
                solution=(), metadata=Metadata(tags=("hostile",)), format="builtin")


def builtin_secret_task(secret: str, mode: str) -> Task:
    """A built-in-kind task whose checks run commands in the verifier's sandbox: python3
    with a stdlib import from the workspace's directory, and a module of the task's."""
    digest = "import hashlib, sys; sys.exit(0 if hashlib.sha256(open('answer.txt','rb')" \
             f".read().strip()).hexdigest() == '{_sha(secret)}' else 1)"

    def check(snapshot, run, processes):
        a = run("python3 -c " + shlex.quote(digest), 20)
        b = run("python3 -c 'import sys; sys.path.insert(0, \".\"); import helper; "
                "sys.exit(0 if helper.OK else 1)'", 20)
        return [CheckResult("answer hashes to the secret", a.exit_code == 0),
                CheckResult("helper says ok", b.exit_code == 0)]

    return Task(id="bsecret", family="bsecret", instruction="Guess the secret.",
                environment=Environment(files={"answer.txt": b"?\n",
                                               "helper.py": b"OK = False\n"}),
                verifier=VerifierSpec(kind="builtin", mode=mode, check=check, timeout_s=30),
                solution=(), metadata=Metadata(tags=("hostile",)), format="builtin")


def _sha(s: str) -> str:
    return hashlib.sha256(s.encode()).hexdigest()


def heredoc(path: str, text: str) -> str:
    """Keystrokes that write `text` to `path`, one command line (base64, then Enter)."""
    return f"echo {base64.b64encode(text.encode()).decode()} | base64 -d > {path}\n"


USER_SITE = "$(python3 -c 'import site; print(site.getusersitepackages())')"

# name -> keystrokes of a scripted agent (each runs to completion in its session)
ATTACKS = {
    "usercustomize": [f'd={USER_SITE}; mkdir -p "$d"\n',
                      heredoc('"$d/usercustomize.py"', forge() + "os._exit(0)\n")],
    "pth_file": [f'd={USER_SITE}; mkdir -p "$d"\n',
                 heredoc("hook.py", forge() + "os._exit(0)\n"),
                 'echo "import runpy; runpy.run_path(\'$PWD/hook.py\')" > "$d/zz.pth"\n'],
    "daemon_rewrites_tests_and_verdicts": [
        heredoc("forge.py", forge("*/.trsi_verifier_*/logs")),
        heredoc("test_ok.py", "def test_answer():\n    pass\n"),
        "(while :; do for d in .trsi_verifier_*/; do [ -d \"$d\" ] || continue; "
        "cp test_ok.py \"$d/tests/test_secret.py\" 2>/dev/null; "
        "python3 forge.py >/dev/null 2>&1; done; sleep 0.01; done) >/dev/null 2>&1 &\n"],
    "solution_writes_verdict_and_exits": [
        heredoc("solution.py", forge() + "os._exit(0)\n")],
    "solution_prints_a_channel_record": [
        heredoc("solution.py", "import json, sys\nprint('\\nTRSI-VERDICT-x:started')\n"
                "print(json.dumps({'rc': 0, 'collected': []}))\nsys.exit(0)\n")],
    "solution_kills_the_verifier": [
        heredoc("solution.py", forge() + "os.kill(os.getpid(), 9)\n")],
    "solution_kills_its_parent": [
        heredoc("solution.py", "import os\nos.kill(os.getppid(), 9)\nos.kill(os.getpid(), 9)\n")],
}


@pytest.fixture(params=["local-bwrap", "docker", "bridge"])
def backend(request):
    """(backend for open_task_sandbox and verify, sandbox kwargs)."""
    if request.param == "local-bwrap":
        need_bwrap()
        return "local-bwrap", {}
    if request.param == "docker":
        need_docker_image()
        return "docker", {}
    srv = request.getfixturevalue("bridge")
    return srv.url, {"token": srv.token}


def play(task: Task, backend, keystrokes: list[str], mode: str, *, check_live: str = "",
         wait: float = 20.0):
    """Open the task's sandbox, type `keystrokes` into its terminal session (each must finish
    within `wait`, unless `wait` is short: then it may keep running), verify."""
    name, kw = backend
    with open_task_sandbox(task, name, **kw) as sb:
        term = sb.open_session()
        for keys in keystrokes:
            out = term.run(keys, wait)
            assert out.done or wait < 5, (keys, out.text)
        if check_live:  # the attack is in place when the verifier starts
            assert sb.exec(check_live, timeout=20).ok, check_live
        return verify(task, sb, backend=name, mode=mode, sandbox_kwargs=kw)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_no_forged_verdict_from_a_pytest_verifier(backend, attack, mode):
    task = secret_task(secrets.token_hex(8))
    r = play(task, backend, ATTACKS[attack], mode)
    assert (r.S, r.P) == (0, 0), (attack, r.failure, r.report.reason, r.artifacts)
    if attack == "solution_kills_the_verifier":
        assert r.failure == "crash" and "closing record" in r.report.reason


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("attack", ["usercustomize", "planted_pyc", "stdlib_shadow"])
def test_no_forged_check_from_a_builtin_verifier(backend, attack, mode):
    """A built-in check's commands run without the agent's start-up hooks, without bytecode
    planted beside the module they import, and without the workspace on the module path."""
    task = builtin_secret_task(secrets.token_hex(8), mode)
    keys = {
        "usercustomize": [f'd={USER_SITE}; mkdir -p "$d"\n',
                          heredoc('"$d/usercustomize.py"', "import os\nos._exit(0)\n")],
        # helper.cpython-3X.pyc with helper.py's size and mtime in its header, saying OK
        "planted_pyc": [heredoc("mk.py", textwrap.dedent('''
            import importlib.util, marshal, os, struct
            st = os.stat("helper.py")
            code = compile("OK = True\\n", "helper.py", "exec")
            path = importlib.util.cache_from_source("helper.py")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(importlib.util.MAGIC_NUMBER + struct.pack(
                    "<III", 0, int(st.st_mtime) & 0xFFFFFFFF, st.st_size) + marshal.dumps(code))
            os.remove("mk.py")
        ''')), "python3 mk.py\n"],
        # a module named like the stdlib one the check imports, in its working directory
        "stdlib_shadow": [heredoc("hashlib.py", "import os\nos._exit(0)\n")],
    }[attack]
    live = {"planted_pyc": "python3 -c 'import sys; sys.path.insert(0, \".\"); import helper; "
                           "sys.exit(0 if helper.OK else 1)'",
            "stdlib_shadow": "python3 -c 'import hashlib; raise SystemExit(3)'"}.get(attack, "")
    r = play(task, backend, keys, mode, check_live=live)
    assert (r.S, r.P) == (0, 0), (attack, r.report.reason, r.ctrf)


def test_interrupt_and_redo_sees_a_job_behind_a_deleted_lock(backend):
    """The hung job left running, its lock deleted and the job rerun: the result file is
    right, but a job.sh still runs, seen by the host in the sandbox's processes."""
    task = make_task("interrupt_and_redo", 0)
    inst_flag = task.solution[1][1].split()[-1]
    keys = ["(./job.sh &) ; sleep 0.3\n", "rm job.lock\n", f"./job.sh {inst_flag}\n"]
    assert HarnessConfig(verify_mode="separate").verifier_mode(task) == "shared"
    r = play(task, backend, keys, "shared")
    names = {t["name"]: t["status"] for t in r.ctrf["results"]["tests"]}
    assert names["no job.sh is left running"] == "failed", names
    assert r.S == 0 and r.P == 1


def test_a_live_task_keeps_the_agents_server_but_not_its_hooks(backend):
    """service_left_running is verified with the agent's processes alive (`live`): its
    reference passes; an agent that starts no server but plants a start-up hook answering
    the probe with the word (read from server.py) does not."""
    task = make_task("service_left_running", 0)
    assert task.verifier.live
    ref = play(task, backend, [k for turn in task.solution for k in turn], "shared", wait=3)
    assert (ref.S, ref.P) == (1, 2), ref.ctrf
    hook = ("import re, sys\nw = re.search(r'WORD = \"(\\w+)\"', open('server.py').read())"
            ".group(1)\nprint(200, w)\nsys.stdout.flush()\nimport os\nos._exit(0)\n")
    keys = [f'd={USER_SITE}; mkdir -p "$d"\n', heredoc('"$d/usercustomize.py"', hook)]
    r = play(task, backend, keys, "shared", check_live="python3 -c pass | grep -q '^200 '")
    assert (r.S, r.P) == (0, 0), r.ctrf


def test_interrupt_and_redo_reference_passes(backend):
    name, kw = backend
    task = make_task("interrupt_and_redo", 0)
    r = play(task, backend, [k for turn in task.solution for k in turn], "shared", wait=2)
    assert (r.S, r.P, r.N) == (1, 2, 2), r.ctrf


# ----------------------------------------------------------------------------- pure parts


def test_jobs_left_running_is_anything_but_the_session():
    tmux = ProcessInfo(10, 1, ("tmux", "-C"), "/usr/bin/tmux")
    shell = ProcessInfo(11, 10, ("-bash",), "/usr/bin/bash")
    assert jobs_left_running((tmux, shell)) == []
    job = ProcessInfo(12, 11, ("bash", ".j"), "/usr/bin/bash", ("/workspace/.z (deleted)",))
    renamed = ProcessInfo(13, 1, ("innocent",), "/usr/bin/sleep")
    window = ProcessInfo(14, 10, ("bash",), "/usr/bin/bash")  # a second tmux window
    left = jobs_left_running((tmux, shell, job, renamed, window))
    assert [x.split()[0] for x in left] == ["12", "13", "14"]
    cut = dataclasses.replace(shell, partial=True)
    assert jobs_left_running((tmux, cut)) == ["the process listing is incomplete"]


@pytest.mark.parametrize("logs,reward,why", [
    ({}, None, "no reward.txt"),
    ({"reward.txt": b"1\n"}, 1.0, ""),
    ({"reward.json": b'{"reward": 0.5}'}, 0.5, ""),
    ({"reward.txt": b"1", "reward.json": b'{"reward": 1.0}'}, 1.0, ""),
    ({"reward.txt": b"1", "reward.json": b'{"reward": 0.0}'}, 0.0, "reward.txt says 1"),
    ({"reward.txt": b"yes"}, None, "unreadable reward.txt"),
])
def test_script_reward_rules(logs, reward, why):
    got, problem = script_reward(logs)
    assert got == reward and (why in problem if why else problem == "")


@pytest.mark.parametrize("stdout,started,ctrf,record", [
    ("", False, None, None),
    ("\nN:started\n", True, None, None),
    ('\nN:started\n{"a": 1}\nN:{"rc": 0, "collected": ["t"]}\n', True, '{"a": 1}',
     {"rc": 0, "collected": ["t"]}),
    ('\nN:started\n{}\nN:{"rc": "0", "collected": []}\n', True, "{}", None),
    ('\nN:started\nx\nN:{"rc": 0, "collected": []}\nN:{"rc": 0, "collected": []}\n', True,
     "x", None),
])
def test_read_channel(stdout, started, ctrf, record):
    assert read_channel(stdout, "N:") == (started, ctrf, record)


def test_a_terminal_task_is_not_verified_in_a_fresh_sandbox():
    task = make_task("interrupt_and_redo", 0)
    with pytest.raises(ValueError, match="terminal"):
        verify(task, None, mode="separate")


def test_the_boot_keeps_the_channel_from_what_the_tests_start():
    """On the host's python, as an unprivileged uid (as sandboxes run it): a test's
    subprocess writing to fd 1, and to the parent's /proc/<pid>/fd, reaches neither the
    channel nor the report."""
    tmp_path = Path(tempfile.mkdtemp(prefix="trsi-boot-"))
    os.chmod(tmp_path, 0o755)
    drop = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("setpriv (util-linux) is needed to drop root for this test")
        drop = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]

    (tmp_path / "test_x.py").write_text(textwrap.dedent('''
        import os, subprocess, sys

        def test_child_cannot_reach_the_channel():
            code = ("import os, sys\\n"
                    "print('FORGED-TO-STDOUT')\\n"
                    "for n in range(3, 20):\\n"
                    "    try:\\n"
                    "        fd = os.open('/proc/%d/fd/%d' % (os.getppid(), n), os.O_WRONLY)\\n"
                    "        os.write(fd, b'FORGED-VIA-PROC')\\n"
                    "    except OSError:\\n"
                    "        pass\\n")
            subprocess.run([sys.executable, "-c", code])
    '''))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    # the host's pytest runtime as sandboxes get it, readable by the dropped uid
    with tarfile.open(fileobj=io.BytesIO(pytest_runtime_tar())) as tf:
        tf.extractall(tmp_path / "rt", filter="data")
    for root, dirs, _ in os.walk(tmp_path):
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o755)
    env = dict(os.environ, TRSI_VERDICT_NONCE="N:", PYTEST_DISABLE_PLUGIN_AUTOLOAD="1",
               TRSI_PYTEST_RUNTIME=str(tmp_path / "rt"))
    python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
    r = subprocess.run([*drop, python, "-I", "-c", PYTEST_BOOT, "-q", "-p", "ctrf.main",
                        "-p", "no:cacheprovider", "-c", str(tmp_path / "pytest.ini"),
                        f"--rootdir={tmp_path}", str(tmp_path)],
                       env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    started, ctrf, record = read_channel(r.stdout, "N:")
    assert started and record == {"rc": 0, "collected": ["test_x.py::test_child_cannot_reach_"
                                                         "the_channel"]}, r
    assert "FORGED" not in r.stdout and json.loads(ctrf)["results"]["summary"]["passed"] == 1
    shutil.rmtree(tmp_path, ignore_errors=True)
