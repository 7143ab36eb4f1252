"""Task directories in both formats, written by the tests themselves."""

from __future__ import annotations

import os
import textwrap

import pytest

TEST_OUTPUTS = textwrap.dedent('''
    import os

    import pytest

    WS = os.environ["TRSI_WORKSPACE"]


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
        "Dockerfile": "FROM terminal-rsi-sandbox:bookworm\nUSER root\nWORKDIR /app\n"
                      "COPY name.txt .\nRUN mkdir -p logs && echo started > logs/setup.txt\n",
        "name.txt": "ada\n",
        "run-tests.sh": "#!/bin/bash\npytest $TEST_DIR/test_outputs.py -rA\n",
        "tests/test_outputs.py": TEST_OUTPUTS,
        "solution.sh": "#!/bin/bash\n" + SOLUTION,
    }
    files.update(overrides)
    return {k: v for k, v in files.items() if v is not None}


TEST_SH = textwrap.dedent("""
    #!/bin/bash
    cd "$TRSI_WORKSPACE"
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
        "environment/Dockerfile": "FROM terminal-rsi-sandbox:bookworm\nWORKDIR /app\n"
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
