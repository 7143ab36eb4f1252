"""Hostile and malformed task directories: loading never reads outside the task directory,
and every problem is a TaskFormatError naming the file and the field (never another error,
never a hang, never host content in a Task).

A Dockerfile is the engine's to build (the Docker backend hands it to BuildKit): what its
COPY/ADD/ENV lines ask for is not a format error of the task. What the loader itself reads of
them (the files a local sandbox could seed) still goes through the task directory's rules (no
links followed, nothing outside the build context, the tree caps, no blocking on a FIFO); a
source it refuses becomes an `Environment.unsupported` entry naming the instruction and why,
with nothing of the host in the Task. On Docker, such a COPY fails to build (ERROR), never
bringing a host file into the image."""

from __future__ import annotations

import math
import os
import time

import pytest

from terminal_rsi.tasks import (
    Environment,
    Task,
    TaskFormatError,
    VerifierSpec,
    load_harbor_task,
    load_task_dirs,
    load_terminal_bench_task,
    spec,
)
from terminal_rsi.tasks.check_tasks import check_task
from terminal_rsi.tasks.harbor import find_task_dirs
from tests.tasks.conftest import BASE, harbor_files, need_task_image, tb_files, write

SECRET = "HOST-SECRET-7f3a9c"  # what a hostile task would like to read from the host


@pytest.fixture
def secret(tmp_path):
    """A host file next to (outside) the task directories."""
    path = tmp_path / "host_secret.txt"
    path.write_text(SECRET + "\n")
    return str(path)


def _tb(tmp_path, **overrides):
    return write(tmp_path / "task", tb_files(**overrides))


def _harbor(tmp_path, **overrides):
    return write(tmp_path / "task", harbor_files(**overrides))


def _refused(load, root, file, field, fragment):
    """Loading `root` raises TaskFormatError naming `file` (a path relative to the task dir)
    and `field`, with `fragment` in the message and no host content anywhere."""
    with pytest.raises(TaskFormatError) as e:
        load(root)
    err = e.value
    assert err.file == os.path.join(root, *file.split("/")), err.file
    assert err.field == field, (err.field, str(err))
    assert fragment in str(err), str(err)
    assert SECRET not in str(err)
    return err


def _all_bytes(task: Task) -> bytes:
    return b"".join([*task.environment.files.values(), *task.verifier.files.values(),
                     task.instruction.encode(), task.verifier.command.encode(),
                     *(c.encode() for turn in task.solution for c in turn),
                     *(u.encode() for u in task.environment.unsupported),
                     *(w.encode() for w in task.warnings)])


def _not_copied(task: Task, op: str, src: str, *fragments: str) -> str:
    """The loader did not take the COPY/ADD source `src`: one `Environment.unsupported` entry
    names the instruction, the source and why (`fragments`); the Task holds nothing of the
    host and seeds no file of that source."""
    hits = [u for u in task.environment.unsupported if u.startswith(f"{op} {src}")]
    assert len(hits) == 1, (op, src, task.environment.unsupported)
    for fragment in fragments:
        assert fragment in hits[0], hits[0]
    assert SECRET.encode() not in _all_bytes(task)
    assert os.path.basename(src) not in task.environment.files, dict(task.environment.files)
    return hits[0]


# ---------------------------------------------------------------- COPY / ADD sources


@pytest.mark.parametrize("src, fragment", [
    ("/etc/passwd", "is an absolute path"),
    ("/etc/hostname", "is an absolute path"),
    ("../host_secret.txt", "leaves the build context"),
    ("sub/../../host_secret.txt", "leaves the build context"),
])
def test_copy_sources_outside_the_build_context_are_not_read(tmp_path, secret, src, fragment):
    root = _tb(tmp_path, Dockerfile=f"FROM x\nWORKDIR /app\nCOPY {src} .\n")
    _not_copied(load_terminal_bench_task(root), "COPY", src, fragment)
    root = write(tmp_path / "h", harbor_files(**{
        "environment/Dockerfile": f"FROM x\nWORKDIR /app\nADD {src} /app/\n"}))
    _not_copied(load_harbor_task(root), "ADD", src, fragment)


def test_harbor_copy_may_not_reach_the_rest_of_the_task_dir(tmp_path):
    # the build context is environment/: tests/ and solution/ are outside it, as for Docker
    root = _harbor(tmp_path, **{"environment/Dockerfile":
                                "FROM x\nWORKDIR /app\nCOPY ../tests/test.sh .\n"})
    task = load_harbor_task(root)
    _not_copied(task, "COPY", "../tests/test.sh", "leaves the build context environment/")
    assert task.environment.files == {}


@pytest.mark.parametrize("target", ["host_secret", "/etc/hostname", "name2.txt"])
def test_a_symlink_in_the_build_context_is_not_followed(tmp_path, secret, target):
    root = _tb(tmp_path, **{"name.txt": None, "name2.txt": "inside\n"})
    os.symlink(secret if target == "host_secret" else target, os.path.join(root, "name.txt"))
    task = load_terminal_bench_task(root)
    _not_copied(task, "COPY", "name.txt", "is a symbolic link", "links are refused",
                os.path.join(root, "name.txt"))
    assert task.environment.files == {}  # not even the target inside the context


def test_a_symlink_inside_a_copied_directory_is_not_followed(tmp_path, secret):
    root = _tb(tmp_path, Dockerfile="FROM x\nWORKDIR /app\nCOPY data/ /app/data/\n",
               **{"data/ok.txt": "fine\n", "data/deeper/ok2.txt": "fine\n"})
    os.symlink(secret, os.path.join(root, "data", "deeper", "leak.txt"))
    task = load_terminal_bench_task(root)
    _not_copied(task, "COPY", "data/", "is a symbolic link",
                os.path.join(root, "data", "deeper", "leak.txt"))
    assert task.environment.files == {}  # the directory is not taken in part


def test_a_symlinked_directory_in_the_build_context_is_not_followed(tmp_path):
    root = _tb(tmp_path, Dockerfile="FROM x\nWORKDIR /app\nCOPY etc/passwd .\n")
    os.symlink("/etc", os.path.join(root, "etc"))
    task = load_terminal_bench_task(root)
    _not_copied(task, "COPY", "etc/passwd", "is a symbolic link", os.path.join(root, "etc"))
    assert task.environment.files == {}


def test_copy_of_the_whole_context_with_a_link_in_it_is_not_followed(tmp_path, secret):
    root = _tb(tmp_path, Dockerfile="FROM x\nWORKDIR /app\nCOPY . .\n")
    os.symlink(secret, os.path.join(root, "zz-link"))
    task = load_terminal_bench_task(root)
    _not_copied(task, "COPY", ".", "is a symbolic link", os.path.join(root, "zz-link"))
    assert task.environment.files == {}


@pytest.mark.parametrize("case", ["absolute", "parent", "link"])
def test_on_docker_a_hostile_copy_does_not_build(tmp_path, secret, case):
    """The engine resolves COPY sources inside the build context only (an absolute source
    is a context path, `..` stays in the context, a link is not followed out of it): the
    build fails, an ERROR naming the task, and no host file reaches an image."""
    need_task_image()
    src = {"absolute": secret, "parent": "../host_secret.txt", "link": "name.txt"}[case]
    root = _tb(tmp_path, Dockerfile=f"FROM {BASE}\nWORKDIR /app\nCOPY {src} .\n",
               **({"name.txt": None} if case == "link" else {}))
    if case == "link":
        os.symlink(secret, os.path.join(root, "name.txt"))
    row = check_task(load_terminal_bench_task(root), "docker")
    assert row["verdict"] == "ERROR" and "does not build" in row["why"], row
    assert SECRET not in str(row)


def test_copy_from_another_stage_is_unsupported_not_read(tmp_path):
    root = _tb(tmp_path, Dockerfile="FROM x AS b\nFROM y\nWORKDIR /app\n"
                                    "COPY --from=b /etc/passwd /app/\nCOPY name.txt .\n")
    task = load_terminal_bench_task(root)
    assert dict(task.environment.files) == {"name.txt": b"ada\n"}
    assert any("--from" in u for u in task.environment.unsupported)


# ---------------------------------------------------------------- tests/ and other files


@pytest.mark.parametrize("fmt", ["tb", "harbor"])
def test_tests_dir_as_a_symlink_is_refused(tmp_path, fmt):
    outside = write(tmp_path / "outside_tests", {"test.sh": "cat /etc/shadow\n",
                                                 "test_outputs.py": SECRET + "\n"})
    root = _tb(tmp_path) if fmt == "tb" else _harbor(tmp_path)
    for name in os.listdir(os.path.join(root, "tests")):
        os.unlink(os.path.join(root, "tests", name))
    os.rmdir(os.path.join(root, "tests"))
    os.symlink(outside, os.path.join(root, "tests"))
    load = load_terminal_bench_task if fmt == "tb" else load_harbor_task
    field = "tests" if fmt == "tb" else "verifier"
    _refused(load, root, "tests", field, "is a symbolic link")


@pytest.mark.parametrize("fmt", ["tb", "harbor"])
def test_a_symlink_inside_tests_is_refused(tmp_path, secret, fmt):
    root = _tb(tmp_path) if fmt == "tb" else _harbor(tmp_path)
    os.symlink(secret, os.path.join(root, "tests", "data.txt"))
    load = load_terminal_bench_task if fmt == "tb" else load_harbor_task
    _refused(load, root, "tests/data.txt", "tests" if fmt == "tb" else "verifier",
             "is a symbolic link")


@pytest.mark.parametrize("fmt, name, field", [
    ("tb", "task.yaml", None), ("tb", "solution.sh", "solution.sh"),
    ("tb", "Dockerfile", "Dockerfile"),
    ("harbor", "task.toml", None), ("harbor", "instruction.md", "instruction"),
    ("harbor", "solution/solve.sh", "solution"), ("harbor", "tests/test.sh", "verifier"),
])
def test_symlinked_task_files_are_refused(tmp_path, secret, fmt, name, field):
    root = _tb(tmp_path) if fmt == "tb" else _harbor(tmp_path)
    os.unlink(os.path.join(root, *name.split("/")))
    os.symlink(secret, os.path.join(root, *name.split("/")))
    load = load_terminal_bench_task if fmt == "tb" else load_harbor_task
    _refused(load, root, name, field, "is a symbolic link")


def test_instruction_md_as_a_directory_is_named(tmp_path):
    root = _harbor(tmp_path, **{"instruction.md": None})
    os.makedirs(os.path.join(root, "instruction.md"))
    _refused(load_harbor_task, root, "instruction.md", "instruction",
             "is a directory; expected a regular file")


def test_solution_as_a_directory_is_named(tmp_path):
    root = _tb(tmp_path, **{"solution.sh": None})
    os.makedirs(os.path.join(root, "solution.sh"))
    _refused(load_terminal_bench_task, root, "solution.sh", "solution.sh", "is a directory")


@pytest.mark.parametrize("where, field", [("tests/pipe", "verifier"),
                                          ("instruction.md", "instruction"),
                                          ("environment/name.txt", "COPY")])
def test_a_fifo_is_refused_without_blocking(tmp_path, where, field):
    root = _harbor(tmp_path)
    path = os.path.join(root, *where.split("/"))
    if os.path.exists(path):
        os.unlink(path)
    os.mkfifo(path)
    t0 = time.monotonic()
    if field == "COPY":  # a Dockerfile source: not the loader's to refuse, only not read
        _not_copied(load_harbor_task(root), "COPY", "name.txt", "FIFO", path)
    else:
        _refused(load_harbor_task, root, where, field, "FIFO")
    assert time.monotonic() - t0 < 5


def test_a_50_mb_instruction_is_refused_fast(tmp_path):
    root = _harbor(tmp_path)
    with open(os.path.join(root, "instruction.md"), "r+b") as f:
        f.truncate(50 * 1024 * 1024)  # sparse: nothing is written, reading it would be slow
    t0 = time.monotonic()
    _refused(load_harbor_task, root, "instruction.md", "instruction",
             f"is 52428800 bytes; the limit is {spec.MAX_INSTRUCTION_BYTES}")
    assert time.monotonic() - t0 < 1


def test_a_long_instruction_in_task_yaml_is_refused(tmp_path):
    text = "x" * (spec.MAX_INSTRUCTION_BYTES + 1)
    root = _tb(tmp_path, **{"task.yaml": f"instruction: {text}\n"})
    _refused(load_terminal_bench_task, root, "task.yaml", "instruction",
             f"the limit is {spec.MAX_INSTRUCTION_BYTES}")


def test_a_huge_task_file_is_refused_before_it_is_read(tmp_path):
    root = _tb(tmp_path)
    with open(os.path.join(root, "task.yaml"), "r+b") as f:
        f.truncate(spec.MAX_TEXT_FILE_BYTES + 1)
    _refused(load_terminal_bench_task, root, "task.yaml", None, "the limit is")


# ---------------------------------------------------------------- tree caps


def test_a_huge_tests_tree_is_refused_not_read(tmp_path):
    root = _tb(tmp_path)
    with open(os.path.join(root, "tests", "big.bin"), "wb") as f:
        f.truncate(spec.MAX_TREE_BYTES + 1)  # sparse
    t0 = time.monotonic()
    _refused(load_terminal_bench_task, root, "tests/big.bin", "tests", "is larger than")
    assert time.monotonic() - t0 < 1


def test_too_many_files_are_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(spec, "MAX_TREE_FILES", 5)
    root = _tb(tmp_path, **{f"tests/f{i}.txt": "x" for i in range(6)})
    with pytest.raises(TaskFormatError, match="more than 5") as e:
        load_terminal_bench_task(root)
    assert e.value.field == "tests" and "/tests" in e.value.file


def test_copied_files_share_one_budget(tmp_path, monkeypatch):
    monkeypatch.setattr(spec, "MAX_TREE_BYTES", 100)
    root = _tb(tmp_path, Dockerfile="FROM x\nWORKDIR /app\nCOPY a.txt .\nCOPY b.txt .\n"
                                    "COPY c.txt .\n",
               **{"a.txt": "a" * 60, "b.txt": "b" * 60, "c.txt": "c",
                  "tests/test_outputs.py": "def test_x():\n    pass\n"})
    task = load_terminal_bench_task(root)
    _not_copied(task, "COPY", "b.txt", "larger than 100 bytes", os.path.join(root, "b.txt"))
    # past the cap nothing more is read, however small
    _not_copied(task, "COPY", "c.txt", "not read", "tree caps")
    assert dict(task.environment.files) == {"a.txt": b"a" * 60}


def test_a_huge_copied_file_is_not_read(tmp_path):
    root = _tb(tmp_path, Dockerfile="FROM x\nWORKDIR /app\nCOPY big.bin .\n")
    with open(os.path.join(root, "big.bin"), "wb") as f:
        f.truncate(spec.MAX_TREE_BYTES + 1)  # sparse: reading it would be slow
    t0 = time.monotonic()
    task = load_terminal_bench_task(root)
    assert time.monotonic() - t0 < 1
    _not_copied(task, "COPY", "big.bin", "is larger than", os.path.join(root, "big.bin"))


def test_a_deep_tree_is_refused(tmp_path):
    deep = "/".join(["d"] * (spec.MAX_TREE_DEPTH + 2))
    root = _tb(tmp_path, **{f"tests/{deep}/x.txt": "x"})
    with pytest.raises(TaskFormatError, match="deeper than") as e:
        load_terminal_bench_task(root)
    assert e.value.field == "tests"


# ---------------------------------------------------------------- numbers and sizes


@pytest.mark.parametrize("toml, field, fragment", [
    ("[environment]\nmemory = '9999999G'\n", "environment.memory_mb", "more than the limit"),
    ("[environment]\nmemory_mb = 1e400\n", "environment.memory_mb", "finite"),
    ("[environment]\nmemory_mb = nan\n", "environment.memory_mb", "finite"),
    ("[environment]\nstorage = '5000T'\n", "environment.storage_mb", "more than the limit"),
    ("[environment]\ncpus = 100000\n", "environment.cpus", "at most"),
    ("[environment]\ncpus = inf\n", "environment.cpus", "finite"),
    ("[environment]\nallow_internet = 'yes'\n", "environment.allow_internet", "true or false"),
    ("[agent]\ntimeout_sec = inf\n", "agent.timeout_sec", "finite"),
    ("[agent]\ntimeout_sec = 1e400\n", "agent.timeout_sec", "finite"),
    ("[verifier]\ntimeout_sec = 86401\n", "verifier.timeout_sec", "at most 86400"),
    ("[verifier]\ntimeout_sec = -inf\n", "verifier.timeout_sec", "finite"),
    ("[verifier]\nenv = {'1BAD' = 'x'}\n", "verifier.env", "not a valid variable name"),
    ("[metadata]\nexpected_checks = true\n", "metadata.expected_checks", "positive integer"),
])
def test_harbor_numbers_are_bounded(tmp_path, toml, field, fragment):
    _refused(load_harbor_task, _harbor(tmp_path, **{"task.toml": toml}), "task.toml", field,
             fragment)


@pytest.mark.parametrize("yaml_line, field", [
    ("max_agent_timeout_sec: .inf", "max_agent_timeout_sec"),
    ("max_agent_timeout_sec: 1.0e+400", "max_agent_timeout_sec"),
    ("max_test_timeout_sec: .nan", "max_test_timeout_sec"),
    ("max_test_timeout_sec: 1000000", "max_test_timeout_sec"),
])
def test_terminal_bench_timeouts_are_finite_and_bounded(tmp_path, yaml_line, field):
    root = _tb(tmp_path, **{"task.yaml": f"instruction: x\n{yaml_line}\n"})
    _refused(load_terminal_bench_task, root, "task.yaml", field, "")


@pytest.mark.parametrize("name, text", [
    ("task.toml", "a = " + "[" * 50_000 + "]" * 50_000 + "\n"),
    ("task.toml", "[environment]\ncpus = 1" + "0" * 5000 + "\n"),
])
def test_pathological_toml_is_a_format_error(tmp_path, name, text):
    _refused(load_harbor_task, _harbor(tmp_path, **{name: text}), name, None, "TOML")


@pytest.mark.parametrize("text", ["instruction: " + "[" * 50_000 + "\n",
                                  "instruction: x\nexpected_checks: 1" + "0" * 5000 + "\n"])
def test_pathological_yaml_is_a_format_error(tmp_path, text):
    _refused(load_terminal_bench_task, _tb(tmp_path, **{"task.yaml": text}), "task.yaml",
             None, "YAML")


@pytest.mark.parametrize("line, fragment", [
    ("ENV", "needs a name and a value"),
    ("ENV 1BAD=x", "not a valid variable name"),
    ("ENV A='unclosed", "cannot be split"),
    ("ENV BIG=" + "x" * (spec.MAX_ENV_VALUE_BYTES + 1), "the value of BIG"),
])
def test_bad_env_lines_are_named(tmp_path, line, fragment):
    """A bad ENV line is the engine's to judge when it builds; the loader names it as a step
    a local sandbox cannot reproduce, and the Environment never carries it."""
    root = _tb(tmp_path, Dockerfile=f"FROM x\nWORKDIR /app\n{line}\n")
    env = load_terminal_bench_task(root).environment
    hits = [u for u in env.unsupported if u.startswith("ENV") and fragment in u]
    assert len(hits) == 1 and len(hits[0]) < 1000, env.unsupported
    assert dict(env.env) == {}


# ---------------------------------------------------------------- suites


def test_a_symlinked_task_dir_in_a_suite_is_refused(tmp_path, secret):
    outside = write(tmp_path / "outside" / "evil", tb_files())
    write(tmp_path / "suite" / "good", tb_files())
    os.symlink(outside, tmp_path / "suite" / "evil")
    with pytest.raises(TaskFormatError, match="is a symbolic link") as e:
        find_task_dirs(str(tmp_path / "suite"))
    assert e.value.file.endswith("evil")
    with pytest.raises(TaskFormatError):
        load_task_dirs(str(tmp_path / "suite"))


def test_the_named_task_dir_may_itself_be_a_link(tmp_path):
    real = write(tmp_path / "real", tb_files())
    os.symlink(real, tmp_path / "named")
    task = load_terminal_bench_task(str(tmp_path / "named"))
    assert task.id == "named" and dict(task.environment.files) == {"name.txt": b"ada\n"}


def test_valid_tasks_keep_loading_with_nothing_from_the_host(tmp_path, secret):
    root = _tb(tmp_path, Dockerfile="FROM x\nWORKDIR /app\nCOPY . .\n")
    task = load_terminal_bench_task(root)
    assert "name.txt" in task.environment.files and SECRET.encode() not in _all_bytes(task)


# ---------------------------------------------------------------- programmatic construction


def _task(**kw):
    base = dict(id="t", family="f", instruction="do it",
                verifier=VerifierSpec(kind="script", command="true"))
    return Task(**{**base, **kw})


@pytest.mark.parametrize("make, field", [
    (lambda: _task(agent_timeout_s=math.inf), "agent_timeout_s"),
    (lambda: _task(agent_timeout_s=float("nan")), "agent_timeout_s"),
    (lambda: _task(agent_timeout_s=spec.MAX_TIMEOUT_S + 1), "agent_timeout_s"),
    (lambda: _task(instruction="x" * (spec.MAX_INSTRUCTION_BYTES + 1)), "instruction"),
    (lambda: _task(instruction="bad \ud800"), "instruction"),
    (lambda: _task(instruction="   "), "instruction"),
    (lambda: _task(turns=0), "turns"),
    (lambda: _task(expected_checks=0), "expected_checks"),
    (lambda: Environment(memory_mb=9999999 * 1024), "memory_mb"),
    (lambda: Environment(memory_mb=1.5), "memory_mb"),
    (lambda: Environment(cpus=math.inf), "cpus"),
    (lambda: Environment(storage_mb=-1), "storage_mb"),
    (lambda: Environment(network="yes"), "network"),
    (lambda: Environment(files={"../escape": b""}), "files"),
    (lambda: Environment(files={"/abs": b""}), "files"),
    (lambda: Environment(env={"A": "x\0y"}), "env"),
    (lambda: Environment(env={"A": "x" * (spec.MAX_ENV_VALUE_BYTES + 1)}), "env"),
    (lambda: VerifierSpec(timeout_s=1e400), "timeout_s"),
    (lambda: VerifierSpec(timeout_s=True), "timeout_s"),
    (lambda: VerifierSpec(kind="magic"), "kind"),
    (lambda: VerifierSpec(env={"BAD-NAME": "x"}), "env"),
])
def test_construction_checks_the_same_bounds(make, field):
    with pytest.raises(TaskFormatError) as e:
        make()
    assert e.value.field == field and isinstance(e.value, ValueError)
