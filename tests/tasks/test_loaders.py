"""Loaders for Terminal-Bench and Harbor task directories; errors name file and field."""

from __future__ import annotations

import os

import pytest

from terminal_rsi.tasks import (
    TaskFormatError,
    get_suite,
    load_harbor_task,
    load_task_dirs,
    load_terminal_bench_task,
)
from terminal_rsi.tasks.spec import TESTS_DIR
from tests.tasks.conftest import TB_COMPOSE, harbor_files, tb_files, write


def test_terminal_bench_fields(tb_dir):
    t = load_terminal_bench_task(tb_dir)
    assert t.format == "terminal-bench" and t.id == "tb-hello"
    assert t.instruction.startswith('Write "hello <name>"')
    assert t.agent_timeout_s == 120 and t.verifier.timeout_s == 60
    # Terminal-Bench copies run-tests.sh and tests/ into /tests of the agent's container
    assert t.verifier.kind == "terminal-bench" and t.verifier.mode == "shared"
    assert set(t.verifier.files) == {"run-tests.sh", "test_outputs.py"}
    assert t.verifier.command == "bash /tests/run-tests.sh"
    assert t.verifier.tests_dir == TESTS_DIR and t.verifier.env == {"TEST_DIR": "/tests"}
    assert (t.metadata.difficulty, t.metadata.category, t.metadata.tags) == (
        "easy", "file-operations", ("files", "echo"))
    assert t.expected_checks == 4
    # the workspace files and RUN steps a local sandbox would reproduce; the Dockerfile's
    # WORKDIR and ENV are the built image's (no compose working_dir or environment here)
    assert dict(t.environment.files) == {"name.txt": b"ada\n"}
    assert t.environment.workdir is None and t.environment.env == {}
    assert t.environment.setup == ("mkdir -p logs && echo started > logs/setup.txt",)
    assert len(t.solution) == 1 and "greeting.txt" in t.solution[0][0]
    assert t.oracle.command == "bash /oracle/solution.sh" and t.oracle.dir == "/oracle"
    assert t.oracle.files["solution.sh"].decode() == t.solution[0][0]


def test_terminal_bench_solution_yaml_and_descriptions(tmp_path):
    root = write(tmp_path / "t", tb_files(**{
        "solution.sh": None,
        "solution.yaml": "- command: echo 1 > count1.txt\n  min_timeout_sec: 1\n"
                         "- command: echo 2 > count2.txt\n",
        "task.yaml": "descriptions:\n  - key: base\n    description: do it\n"
                     "run_tests_in_same_shell: true\n"}))
    t = load_terminal_bench_task(root)
    assert t.solution == (("echo 1 > count1.txt", "echo 2 > count2.txt"),)
    assert t.instruction == "do it" and t.verifier.mode == "shared" and t.oracle is None


def test_harbor_fields(harbor_dir):
    t = load_harbor_task(harbor_dir)
    assert t.format == "harbor" and t.verifier.kind == "script"
    assert t.agent_timeout_s == 90
    assert t.verifier.timeout_s == 60
    assert t.environment.memory_mb == 2048 and t.environment.storage_mb == 512
    assert dict(t.environment.files) == {"name.txt": b"ada\n"}
    assert t.environment.workdir is None and t.environment.env == {}  # the image's own
    # nothing in test.sh is rewritten: it runs at /tests as Harbor runs it
    assert t.verifier.command == "bash /tests/test.sh" and t.verifier.tests_dir == TESTS_DIR
    assert t.verifier.files["test.sh"] == harbor_files()["tests/test.sh"].encode()
    assert t.verifier.mode == "shared"
    assert t.oracle.command == "bash /solution/solve.sh" and set(t.oracle.files) == {"solve.sh"}
    assert t.metadata.difficulty == "medium" and t.expected_checks == 4


@pytest.mark.parametrize("fmt,overrides,file,field", [
    ("tb", {"task.yaml": "difficulty: easy\n"}, "task.yaml", "instruction"),
    ("tb", {"task.yaml": "instruction: x\nmax_agent_timeout_sec: -1\n"}, "task.yaml",
     "max_agent_timeout_sec"),
    ("tb", {"task.yaml": "instruction: x\nmax_test_timeout_sec: soon\n"}, "task.yaml",
     "max_test_timeout_sec"),
    ("tb", {"task.yaml": "instruction: x\nparser_name: swebench\n"}, "task.yaml", "parser_name"),
    ("tb", {"task.yaml": "instruction: x\ndifficulty: brutal\n"}, "task.yaml", "difficulty"),
    ("tb", {"task.yaml": "instruction: [unclosed\n"}, "task.yaml", None),
    ("tb", {"task.yaml": "instruction: x\ntags: 3\n"}, "task.yaml", "tags"),
    ("tb", {"docker-compose.yaml": "services: []\n"}, "docker-compose.yaml", "services"),
    ("tb", {"docker-compose.yaml": "services:\n  client:\n    build: ..\n"},
     "docker-compose.yaml", "services.client.build.context"),
    ("tb", {"solution.sh": None, "solution.yaml": "- nope: 1\n"}, "solution.yaml", "[0].command"),
    ("harbor", {"task.toml": "[verifier\n"}, "task.toml", None),
    ("harbor", {"task.toml": "[verifier]\ntimeout_sec = 'x'\n"}, "task.toml",
     "verifier.timeout_sec"),
    ("harbor", {"task.toml": "[agent]\ntimeout_sec = 0\n"}, "task.toml", "agent.timeout_sec"),
    ("harbor", {"task.toml": "[environment]\nmemory = 'lots'\n"}, "task.toml",
     "environment.memory_mb"),
    ("harbor", {"task.toml": "verifier = 3\n"}, "task.toml", "verifier"),
    ("harbor", {"instruction.md": None}, "instruction.md", "instruction"),
    ("harbor", {"tests/test.sh": None}, "test.sh", "verifier"),
])
def test_errors_name_file_and_field(tmp_path, fmt, overrides, file, field):
    files = tb_files(**overrides) if fmt == "tb" else harbor_files(**overrides)
    root = write(tmp_path / "bad", files)
    load = load_terminal_bench_task if fmt == "tb" else load_harbor_task
    with pytest.raises(TaskFormatError) as e:
        load(root)
    assert os.path.basename(e.value.file) == file
    assert e.value.field == field
    assert file in str(e.value)


def test_load_task_dirs_both_formats(tmp_path):
    write(tmp_path / "suite" / "a-tb", tb_files())
    write(tmp_path / "suite" / "b-harbor", harbor_files())
    os.makedirs(tmp_path / "suite" / "not-a-task")
    tasks = load_task_dirs(str(tmp_path / "suite"))
    assert [(t.id, t.format) for t in tasks] == [("a-tb", "terminal-bench"),
                                                ("b-harbor", "harbor")]
    assert [t.id for t in get_suite(str(tmp_path / "suite"), "all")] == ["a-tb", "b-harbor"]
    with pytest.raises(TaskFormatError, match="no task directories"):
        load_task_dirs(str(tmp_path / "suite" / "not-a-task"))


def test_environments_are_described_not_refused(tmp_path):
    # a single-service compose file (every Terminal-Bench task ships one) is not a
    # multi-container setup; Dockerfile steps a local sandbox cannot do are named, not errors
    single = load_terminal_bench_task(write(tmp_path / "c", tb_files(
        **{"docker-compose.yaml": TB_COMPOSE})))
    assert single.environment.services == ("client",)
    assert not single.environment.multi_container
    two = load_terminal_bench_task(write(tmp_path / "two", tb_files(**{
        "docker-compose.yaml": TB_COMPOSE + "  db:\n    image: postgres:16\n"})))
    assert two.environment.services == ("client", "db") and two.environment.multi_container
    image_only = load_harbor_task(write(tmp_path / "i", harbor_files(**{
        "environment/Dockerfile": None, "environment/name.txt": None,
        "task.toml": "[environment]\ndocker_image = 'ghcr.io/x/y:1'\n"})))
    assert image_only.environment.image == "ghcr.io/x/y:1"
    assert image_only.environment.dockerfile is None
    remote = load_terminal_bench_task(write(tmp_path / "r", tb_files(
        Dockerfile="FROM x\nWORKDIR /app\nADD https://example.com/a.tgz .\n")))
    assert any("remote source" in u for u in remote.environment.unsupported)


def test_loaded_tasks_pickle(tb_dir, harbor_dir):
    import pickle

    for t in (load_terminal_bench_task(tb_dir), load_harbor_task(harbor_dir)):
        u = pickle.loads(pickle.dumps(t))
        assert u == t and dict(u.verifier.files) == dict(t.verifier.files)
        with pytest.raises(TypeError):
            u.environment.files["x"] = b""
