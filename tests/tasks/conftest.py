"""Task directories in both formats, written by the tests themselves, and the helpers that
run them: `workspace_task` (the built-in families' workspace layout, on local backends) and
`need_task_image` (the real layout, on Docker)."""

from __future__ import annotations

import dataclasses
import os
import textwrap

import pytest

from terminal_rsi.tasks import Task
from tests.sandbox.conftest import need, need_docker_image

TEST_OUTPUTS = textwrap.dedent('''
    import os

    import pytest

    # the workspace layout names the workspace; in a task's own image the verifier runs in
    # the task's working directory (/app here)
    WS = os.environ.get("TRSI_WORKSPACE") or os.getcwd()


    def read(name):
        with open(os.path.join(WS, name)) as f:
            return f.read()


    def test_greeting_exists():
        assert os.path.exists(os.path.join(WS, "greeting.txt"))


    def test_greeting_text():
        assert read("greeting.txt").strip() == "hello " + read("name.txt").strip()


    @pytest.mark.parametrize("n", [1, 2])
    def test_count_file(n):
        assert read(f"count{n}.txt").strip() == str(n)


    @pytest.mark.hygiene
    def test_data_untouched():
        assert read("name.txt").strip() == "ada"
''').lstrip()

# The base image of the tasks written here: root, python3 with pytest and pytest-json-ctrf,
# no WORKDIR of its own (the real fixtures' base; `need_task_image` checks it is there).
BASE = "trsi-task-base:bookworm"

SOLUTION = 'echo "hello $(cat name.txt)" > greeting.txt\necho 1 > count1.txt\necho 2 > count2.txt\n'


def write(root, files):
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    return str(root)


def tb_files(**overrides):
    files = {
        "task.yaml": textwrap.dedent("""
            instruction: |
              Write "hello <name>" to greeting.txt, where <name> is in name.txt.
              Also write 1 to count1.txt and 2 to count2.txt.
            author_name: tests
            difficulty: easy
            category: file-operations
            tags: [files, echo]
            parser_name: pytest
            max_agent_timeout_sec: 120
            max_test_timeout_sec: 60
            expected_checks: 4
        """),
        "Dockerfile": f"FROM {BASE}\nUSER root\nWORKDIR /app\n"
                      "COPY name.txt .\nRUN mkdir -p logs && echo started > logs/setup.txt\n",
        "name.txt": "ada\n",
        "run-tests.sh": "#!/bin/bash\npytest $TEST_DIR/test_outputs.py -rA\n",
        "tests/test_outputs.py": TEST_OUTPUTS,
        "solution.sh": "#!/bin/bash\n" + SOLUTION,
    }
    files.update(overrides)
    return {k: v for k, v in files.items() if v is not None}


# Harbor's test.sh as Harbor runs it: from the task's working directory, tests at /tests,
# verdict and report in /logs/verifier (`workspace_task` rewrites those two paths).
TEST_SH = textwrap.dedent("""
    #!/bin/bash
    python3 -P -m pytest -q -p no:cacheprovider --rootdir=/tests \\
        --ctrf /logs/verifier/ctrf.json /tests/test_outputs.py
    if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt
    else echo 0 > /logs/verifier/reward.txt; fi
""").lstrip()


def harbor_files(**overrides):
    files = {
        "instruction.md": 'Write "hello <name>" to greeting.txt, where <name> is in name.txt.\n'
                          "Also write 1 to count1.txt and 2 to count2.txt.\n",
        "task.toml": textwrap.dedent("""
            version = "1.0"

            [metadata]
            author_name = "tests"
            difficulty = "medium"
            category = "files"
            tags = ["files"]
            expected_checks = 4

            [verifier]
            timeout_sec = 60.0

            [agent]
            timeout_sec = 90.0

            [environment]
            cpus = 1
            memory = "2G"
            storage_mb = 512
        """),
        "environment/Dockerfile": f"FROM {BASE}\nWORKDIR /app\n"
                                  "COPY name.txt /app/name.txt\n",
        "environment/name.txt": "ada\n",
        "tests/test.sh": TEST_SH,
        "tests/test_outputs.py": TEST_OUTPUTS,
        "solution/solve.sh": "#!/bin/bash\n" + SOLUTION,
    }
    files.update(overrides)
    return {k: v for k, v in files.items() if v is not None}


# The docker-compose.yaml every Terminal-Bench task ships (its task template): the agent's
# service `client`, built from the task's Dockerfile, with the harness's log mounts.
TB_COMPOSE = textwrap.dedent("""
    services:
      client:
        build:
          dockerfile: Dockerfile
        image: ${T_BENCH_TASK_DOCKER_CLIENT_IMAGE_NAME}
        container_name: ${T_BENCH_TASK_DOCKER_CLIENT_CONTAINER_NAME}
        command: [ "sh", "-c", "sleep infinity" ]
        environment:
          - TEST_DIR=${T_BENCH_TEST_DIR}
        volumes:
          - ${T_BENCH_TASK_LOGS_PATH}:${T_BENCH_CONTAINER_LOGS_PATH}
          - ${T_BENCH_TASK_AGENT_LOGS_PATH}:${T_BENCH_CONTAINER_AGENT_LOGS_PATH}
""").lstrip()


def tb_compose(client_extra: str = "", rest: str = "") -> str:
    """TB_COMPOSE with `client_extra` (YAML lines, indented for the client service) added to
    the client and `rest` (YAML text at the top level or under services) appended."""
    extra = textwrap.indent(textwrap.dedent(client_extra).strip("\n"), "    ")
    return TB_COMPOSE + (extra + "\n" if extra else "") + textwrap.dedent(rest)


def real_tb_files(**overrides):
    """A Terminal-Bench task as Terminal-Bench's template writes it (tb_files plus the
    template's docker-compose.yaml)."""
    return tb_files(**{"docker-compose.yaml": TB_COMPOSE, **overrides})


@pytest.fixture
def tb_dir(tmp_path):
    return write(tmp_path / "tb-hello", tb_files())


@pytest.fixture
def harbor_dir(tmp_path):
    return write(tmp_path / "harbor-hello", harbor_files())


# Harbor's fixed paths in a test.sh, and what they are in the workspace layout
_HARBOR_PATHS = (("/logs/verifier", "${TRSI_LOGS_DIR}"), ("/tests", "${TEST_DIR}"))


def workspace_task(task: Task, *, mode: str = "separate") -> Task:
    """`task` (a loaded Terminal-Bench or Harbor task) laid out as the built-in families are.

    Why: a task directory now runs as its own tools run it (tests at /tests, the oracle at
    /oracle or /solution, in its own image), which only the Docker backend provides; local
    backends refuse it (`verify.backend_problem`). verify()'s guarantees for the workspace
    layout that every built-in task uses (tests in a fresh `.trsi_verifier_<hex>/tests`
    placed after the episode, $TEST_DIR, $TRSI_LOGS_DIR and $TRSI_WORKSPACE, planted files
    and configs that cannot steer the verifier, typed verifier failures, the pytest runtime
    copied in) are still verify()'s own and still tested on the local backends, on these
    loaded tasks re-laid out here:

    * `verifier.tests_dir` is "" (the workspace layout) and `oracle` None (the solution's
      commands run by exec, as a built-in solution does); the files the Dockerfile copies
      under WORKDIR are seeded into the workspace and its RUN lines replayed, as before;
    * a Terminal-Bench verifier is kind "pytest" over its tests/ (pytest + pytest-json-ctrf,
      the built-in pytest path, so P and N come from CTRF with hygiene tests excluded);
      run-tests.sh is not used;
    * Harbor's test.sh runs as ``bash "$TEST_DIR/test.sh"``, its /tests and /logs/verifier
      written as $TEST_DIR and $TRSI_LOGS_DIR, where the workspace layout puts them;
    * the verifier's own TEST_DIR=/tests (Terminal-Bench's compose environment) is dropped:
      the workspace layout sets $TEST_DIR itself;
    * `mode` is "separate" unless asked (the built-in families' default; the loaders' real
      layout says "shared").
    """
    ver = task.verifier
    files = dict(ver.files)
    env = {k: v for k, v in ver.env.items() if k != "TEST_DIR"}
    if ver.kind == "script":
        script = files["test.sh"].decode()
        for path, var in _HARBOR_PATHS:
            script = script.replace(path, var)
        files["test.sh"] = script.encode()
        ver = dataclasses.replace(ver, files=files, command='bash "$TEST_DIR/test.sh"')
    elif ver.kind == "terminal-bench":
        files.pop("run-tests.sh", None)
        ver = dataclasses.replace(ver, kind="pytest", files=files, command="")
    ver = dataclasses.replace(ver, tests_dir="", env=env, mode=mode)
    return dataclasses.replace(task, verifier=ver, oracle=None)


def need_task_image() -> None:
    """A running Docker engine with the task base image `BASE` (CI: fail, else skip)."""
    need_docker_image()
    from terminal_rsi.sandbox.image import image_present

    need(image_present(BASE), f"the task base image {BASE} (python -m "
         "terminal_rsi.sandbox.image build-task-base)")
