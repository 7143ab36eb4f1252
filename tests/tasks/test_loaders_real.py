"""Loaders describe a task as its own tools run it (Terminal-Bench's harness, Harbor), for the
Docker backend: compose files, Dockerfiles read only for the local path, verifiers and
oracles at the absolute paths the tasks name, and a warning for what is not used.
Pure loader tests: small task directories written here, no Docker."""

from __future__ import annotations

import os
import textwrap

import pytest

from terminal_rsi.tasks import (
    TaskFormatError,
    _files,
    load_harbor_task,
    load_task_dirs,
    load_terminal_bench_task,
    spec,
)
from terminal_rsi.tasks import harbor as harbor_module
from terminal_rsi.tasks._files import DEBIAN_PATH
from terminal_rsi.tasks.harbor import find_task_dirs
from tests.tasks.conftest import (
    TB_COMPOSE,
    harbor_files,
    real_tb_files,
    tb_compose,
    tb_files,
    write,
)


def _tb(tmp_path, name="task", **overrides):
    return load_terminal_bench_task(write(tmp_path / name, real_tb_files(**overrides)))


def _harbor(tmp_path, name="task", **overrides):
    return load_harbor_task(write(tmp_path / name, harbor_files(**overrides)))


def _df(tmp_path, dockerfile, **files):
    """The Environment of a Terminal-Bench task with this Dockerfile."""
    return _tb(tmp_path, Dockerfile=textwrap.dedent(dockerfile).lstrip(), **files).environment


def _parsed(tmp_path, dockerfile, **files):
    """What `parse_dockerfile` reads of this Dockerfile for a local sandbox (its ENV values
    and last WORKDIR included, which the Environment leaves to the built image)."""
    root = write(tmp_path / "task", real_tb_files(
        Dockerfile=textwrap.dedent(dockerfile).lstrip(), **files))
    return _files.parse_dockerfile(_files.TaskDir(root), "Dockerfile")


def _refused(root, load, file, field, fragment=""):
    with pytest.raises(TaskFormatError) as e:
        load(root)
    assert os.path.basename(e.value.file) == file, str(e.value)
    assert e.value.field == field, str(e.value)
    assert fragment in str(e.value)
    return e.value


def _warned(task, *fragments):
    hits = [w for w in task.warnings if all(f in w for f in fragments)]
    assert hits, (fragments, task.warnings)
    return hits


# ------------------------------------------------------------------ Terminal-Bench compose


def test_the_template_compose_file_is_one_client_service(tmp_path):
    t = _tb(tmp_path)
    root = str(tmp_path / "task")
    env = t.environment
    assert env.services == ("client",) and env.agent_service == "client"
    assert not env.multi_container
    assert env.compose_file == os.path.join(root, "docker-compose.yaml")
    assert env.dockerfile == os.path.join(root, "Dockerfile") and env.context == root
    assert env.image is None  # the harness's own tag for what it builds
    assert dict(env.env) == {"TEST_DIR": "/tests"}
    # log mounts, container_name, the keepalive command: the harness's own, nothing to say
    assert not [w for w in t.warnings if "docker-compose" in w], t.warnings


@pytest.mark.parametrize("names, used, warned", [
    (["docker-compose.yml"], "docker-compose.yml", "reads only docker-compose.yaml"),
    (["docker-compose.yaml", "docker-compose.yml"], "docker-compose.yaml",
     "docker-compose.yml is not read"),
])
def test_yml_compose_files_are_read(tmp_path, names, used, warned):
    files = tb_files(**dict.fromkeys(names, TB_COMPOSE))
    t = load_terminal_bench_task(write(tmp_path / "t", files))
    assert os.path.basename(t.environment.compose_file) == used
    assert t.environment.agent_service == "client"
    _warned(t, warned)


def test_compose_variables_are_interpolated(tmp_path):
    compose = textwrap.dedent("""
        services:
          client:
            build: .
            environment:
              A: ${T_BENCH_TEST_DIR}
              B: ${UNSET:-dflt}
              C: ${UNSET-dflt}
              D: $T_BENCH_CONTAINER_LOGS_PATH/x
              E: $$HOME
              F: ${NOPE}
              G: ${EMPTY:-x}
              H: ${EMPTY-x}
              I: ${T_BENCH_TEST_DIR:+set}
              J: ${UNSET:+set}
              K: ${FROM_DOTENV}
              L: ${UNSET:-${T_BENCH_CONTAINER_AGENT_LOGS_PATH}}
              M: 3
              N: true
    """)
    t = _tb(tmp_path, **{"docker-compose.yaml": compose, ".env": "EMPTY=\nFROM_DOTENV='dot'\n"})
    assert dict(t.environment.env) == {
        "A": "/tests", "B": "dflt", "C": "dflt", "D": "/logs/x", "E": "$HOME", "F": "",
        "G": "x", "H": "", "I": "set", "J": "", "K": "dot", "L": "/agent-logs", "M": "3",
        "N": "true"}
    _warned(t, "${NOPE}", "not a variable Terminal-Bench sets", "empty here")
    assert not [w for w in t.warnings if "UNSET" in w]  # a default is not a warning


def test_environment_list_form_and_pass_through(tmp_path):
    compose = tb_compose(rest="""
        x-note: &anchor {}
    """).replace("- TEST_DIR=${T_BENCH_TEST_DIR}",
                 "- TEST_DIR=${T_BENCH_TEST_DIR}\n      - T_BENCH_TEST_DIR\n      - HOSTONLY")
    t = _tb(tmp_path, **{"docker-compose.yaml": compose})
    assert dict(t.environment.env) == {"TEST_DIR": "/tests", "T_BENCH_TEST_DIR": "/tests"}
    _warned(t, "HOSTONLY is passed through", "not set here")
    assert not [w for w in t.warnings if "x-note" in w]  # x- extension fields are YAML reuse


@pytest.mark.parametrize("build, dockerfile, context", [
    ("build: .", "Dockerfile", ""),
    ("build: docker", "docker/Dockerfile", "docker"),
    ("build:\n  context: docker\n  dockerfile: Other.df", "docker/Other.df", "docker"),
    ("build:\n  dockerfile: docker/Other.df", "docker/Other.df", ""),
])
def test_build_gives_the_dockerfile_and_its_context(tmp_path, build, dockerfile, context):
    compose = "services:\n  client:\n" + textwrap.indent(build, "    ") + "\n"
    files = {"docker-compose.yaml": compose, "docker/name.txt": "bob\n",
             "docker/Dockerfile": "FROM y\nWORKDIR /srv\nCOPY name.txt .\n",
             "docker/Other.df": "FROM z\nWORKDIR /srv\nCOPY name.txt .\n"}
    t = _tb(tmp_path, **files)
    root = str(tmp_path / "task")
    env = t.environment
    assert env.dockerfile == os.path.join(root, *dockerfile.split("/"))
    assert env.context == os.path.join(root, *context.split("/")) if context else root
    # COPY sources come from the context, as for the engine
    assert env.files["name.txt"] == (b"bob\n" if context == "docker" else b"ada\n")


def test_build_args_and_other_build_keys_are_warned(tmp_path):
    compose = "services:\n  client:\n    build:\n      context: .\n      args:\n" \
              "        V: '1'\n      target: final\n"
    t = _tb(tmp_path, **{"docker-compose.yaml": compose})
    _warned(t, "services.client.build.args is not used", "not passed to the build")
    _warned(t, "services.client.build.target is not used")


@pytest.mark.parametrize("build, field, fragment", [
    ("build: ..", "services.client.build.context", "leaves the task directory"),
    ("build: ../other", "services.client.build.context", "leaves the task directory"),
    ("build: /etc", "services.client.build.context", "outside the task directory"),
    ("build: https://github.com/x/y.git", "services.client.build.context", "remote"),
    ("build:\n  context: .\n  dockerfile: ../Dockerfile", "services.client.build.dockerfile",
     "leaves the task directory"),
    ("build:\n  dockerfile: Nope", "services.client.build.dockerfile", "does not exist"),
    ("build: missing", "services.client.build.context", "does not exist"),
    ("build: 3.5", "services.client.build", "expected a string or a mapping"),
    ("build:\n  context: 7", "services.client.build.context", "does not exist"),
    ("build: [a]", "services.client.build", "expected a string or a mapping"),
])
def test_a_build_outside_the_task_directory_is_refused(tmp_path, build, field, fragment):
    compose = "services:\n  client:\n" + textwrap.indent(build, "    ") + "\n"
    root = write(tmp_path / "t", real_tb_files(**{"docker-compose.yaml": compose}))
    _refused(root, load_terminal_bench_task, "docker-compose.yaml", field, fragment)


def test_an_absolute_context_inside_the_task_directory_is_fine(tmp_path):
    root = str(tmp_path / "t")
    compose = f"services:\n  client:\n    build: {root}\n"
    t = load_terminal_bench_task(write(root, real_tb_files(**{"docker-compose.yaml": compose})))
    assert t.environment.context == root


def test_a_linked_build_context_or_dockerfile_is_refused(tmp_path):
    root = write(tmp_path / "t", real_tb_files(**{
        "docker-compose.yaml": "services:\n  client:\n    build: ctx\n"}))
    os.symlink("/etc", os.path.join(root, "ctx"))
    _refused(root, load_terminal_bench_task, "ctx", "services.client.build.context",
             "is a symbolic link")
    root = write(tmp_path / "u", real_tb_files(**{
        "docker-compose.yaml": "services:\n  client:\n    build:\n      dockerfile: D\n"}))
    os.symlink(os.path.join(root, "Dockerfile"), os.path.join(root, "D"))
    _refused(root, load_terminal_bench_task, "D", "services.client.build.dockerfile",
             "is a symbolic link")


def test_image_is_used_only_without_a_build(tmp_path):
    t = _tb(tmp_path, "a", **{"docker-compose.yaml":
                              "services:\n  client:\n    image: python:3.13-slim\n"})
    assert t.environment.image == "python:3.13-slim" and t.environment.dockerfile is None
    t = _tb(tmp_path, "b", **{"docker-compose.yaml": "services:\n  client:\n    image: "
                              "${T_BENCH_TASK_DOCKER_CLIENT_IMAGE_NAME}\n"})
    assert t.environment.image is None and t.environment.dockerfile is None
    _warned(t, "services.client.image", "Terminal-Bench's own name", "nothing to build or pull")


def test_working_dir_is_the_workdir(tmp_path):
    t = _tb(tmp_path, **{"docker-compose.yaml": tb_compose("working_dir: /work//x/\n")})
    assert t.environment.workdir == "/work/x"
    assert any("not the Dockerfile's WORKDIR /app" in u for u in t.environment.unsupported)
    root = write(tmp_path / "rel", real_tb_files(**{
        "docker-compose.yaml": tb_compose("working_dir: work\n")}))
    _refused(root, load_terminal_bench_task, "docker-compose.yaml",
             "services.client.working_dir", "absolute path")


def test_volumes_from_the_build_context_are_copied_the_rest_warned(tmp_path):
    compose = TB_COMPOSE.replace(
        "${T_BENCH_CONTAINER_AGENT_LOGS_PATH}\n",
        "${T_BENCH_CONTAINER_AGENT_LOGS_PATH}\n      - ./data:/data:ro\n      - ../up:/up\n"
        "      - /var/run/docker.sock:/var/run/docker.sock\n      - cache:/cache\n"
        "      - /anon\n      - type: bind\n        source: ./data/x.txt\n        target: /d2/x\n"
        "      - ./missing:/m\n")
    t = _tb(tmp_path, **{"docker-compose.yaml": compose, "data/x.txt": "x\n"})
    # bind mounts of what is inside the build context: copied in at start (a snapshot)
    assert t.environment.volumes == (("data", "/data"), ("data/x.txt", "/d2/x"))
    _warned(t, "volume '../up:/up' is not mounted", "outside the build context")
    _warned(t, "volume '/var/run/docker.sock:/var/run/docker.sock' is not mounted",
            "path on the host")
    _warned(t, "volume 'cache:/cache' is not mounted", "named volumes")
    _warned(t, "volume '/anon' is not mounted")
    _warned(t, "volume './missing:/m' is not mounted")
    assert not [w for w in t.warnings if "T_BENCH" in w]
    assert len([w for w in t.warnings if "volume" in w]) == 5


def test_a_volume_target_must_be_absolute(tmp_path):
    compose = TB_COMPOSE.replace("${T_BENCH_CONTAINER_AGENT_LOGS_PATH}\n",
                                 "${T_BENCH_CONTAINER_AGENT_LOGS_PATH}\n      - ./data:rel\n")
    root = write(tmp_path / "t", real_tb_files(**{"docker-compose.yaml": compose,
                                                  "data/x.txt": "x"}))
    _refused(root, load_terminal_bench_task, "docker-compose.yaml",
             "services.client.volumes[2]", "not an absolute path")


def test_fields_not_used_are_one_warning_each(tmp_path):
    compose = tb_compose("""
        ports:
          - "8000"
        healthcheck:
          test: ["CMD", "true"]
        depends_on: [db]
        mem_limit: 4g
    """, "  db:\n    image: postgres:16\n    ports: ['5432']\nnetworks:\n  n: {}\n")
    compose = compose.replace('[ "sh", "-c", "sleep infinity" ]', "python -m http.server")
    t = _tb(tmp_path, **{"docker-compose.yaml": compose})
    for key in ("ports", "healthcheck", "mem_limit", "command"):
        assert len(_warned(t, f"services.client.{key} is not used")) == 1
    _warned(t, "top-level 'networks' is not used")
    assert t.environment.services == ("client", "db")
    # the agent's depends_on is honoured (every other service starts first); the other
    # services are read as sidecars, so what of them is not used is one warning each too
    assert not [w for w in t.warnings if "depends_on" in w], t.warnings
    assert [s.name for s in t.environment.sidecars] == ["db"]
    assert [w for w in t.warnings if "services.db" in w] == [
        "docker-compose.yaml: services.db.ports is not used"]


@pytest.mark.parametrize("compose, field, fragment", [
    ("- a\n- b\n", None, "top level must be a mapping"),
    ("version: '3'\n", "services", "one or more services"),
    ("services: {}\n", "services", "one or more services"),
    ("services:\n  client: 3\n", "services.client", "expected a mapping"),
    ("services:\n  server:\n    image: x\n", "services.client", "missing"),
    ("services: [\n", None, "not valid YAML"),
    ("services:\n  client:\n    environment: 3\n", "services.client.environment",
     "list or a mapping"),
    ("services:\n  client:\n    environment: {1BAD: x}\n", "services.client.environment",
     "not a valid variable name"),
    ("services:\n  client:\n    image: ${BROKEN\n", "services.client.image", "unclosed"),
    ("services:\n  client:\n    image: ${A B}\n", "services.client.image",
     "not a valid interpolation"),
    ("services:\n  client:\n    volumes: ./x:/x\n", "services.client.volumes", "a list"),
])
def test_malformed_compose_files_name_file_and_field(tmp_path, compose, field, fragment):
    root = write(tmp_path / "t", real_tb_files(**{"docker-compose.yaml": compose}))
    _refused(root, load_terminal_bench_task, "docker-compose.yaml", field, fragment)


def test_a_linked_compose_file_is_refused(tmp_path):
    root = write(tmp_path / "t", real_tb_files(**{"docker-compose.yaml": None}))
    os.symlink("/etc/hostname", os.path.join(root, "docker-compose.yaml"))
    _refused(root, load_terminal_bench_task, "docker-compose.yaml", "docker-compose",
             "is a symbolic link")


def test_no_compose_file_builds_the_dockerfile_with_a_warning(tmp_path):
    t = load_terminal_bench_task(write(tmp_path / "t", tb_files()))
    assert t.environment.dockerfile.endswith("Dockerfile") and t.environment.services == ()
    _warned(t, "no docker-compose.yaml")


# ------------------------------------------------------------------ Dockerfiles (local path)


def test_heredocs_are_unsupported_and_the_rest_is_read(tmp_path):
    env = _df(tmp_path, """
        FROM x
        WORKDIR /app
        RUN <<EOF
        set -e
        echo hi > a
        EOF
        COPY <<-END /app/b.txt
        \tbody
        \tEND
        RUN echo after
    """)
    assert env.setup == ("echo after",)
    assert any(u.startswith("RUN with a heredoc") for u in env.unsupported)
    assert any(u.startswith("COPY with a heredoc") for u in env.unsupported)
    assert not any("unknown instruction" in u for u in env.unsupported)


def test_copy_from_a_stage_and_absolute_sources_are_unsupported(tmp_path):
    env = _df(tmp_path, """
        FROM golang:1.22 AS build
        RUN go build -o /out/app .
        FROM debian:bookworm
        WORKDIR /app
        COPY --from=build /out/app /usr/local/bin/app
        COPY /name.txt .
        COPY name.txt .
    """)
    assert env.base_image == "debian:bookworm" and dict(env.files) == {"name.txt": b"ada\n"}
    assert env.setup == ()  # the build stage's RUN is not in the final image
    assert any("COPY from another build stage" in u and "--from" in u for u in env.unsupported)
    assert any("COPY /name.txt" in u and "absolute path" in u for u in env.unsupported)


def test_a_stage_built_from_an_earlier_one_inherits_it(tmp_path):
    dockerfile = """
        FROM python:3.13 AS base
        ENV A=1
        WORKDIR /app
        COPY name.txt .
        FROM base
        RUN echo two
    """
    env = _df(tmp_path, dockerfile)
    assert env.base_image == "python:3.13" and env.env == {"TEST_DIR": "/tests"}  # compose
    assert dict(env.files) == {"name.txt": b"ada\n"} and env.setup == ("echo two",)
    assert any(u.startswith("the Dockerfile's ENV lines") for u in env.unsupported)
    df = _parsed(tmp_path / "p", dockerfile)
    assert df.env == {"A": "1"} and df.workdir == "/app" and df.setup == ("echo two",)


def test_comments_and_empty_lines_inside_a_continued_run_are_dropped(tmp_path):
    env = _df(tmp_path, """
        FROM x
        RUN apt-get update && \\
            # install the tools
            apt-get install -y curl \\

            && rm -rf /var/lib/apt/lists/*
        RUN echo done
    """)
    assert env.unsupported == ()
    assert len(env.setup) == 2 and env.setup[1] == "echo done"
    assert "apt-get install -y curl" in env.setup[0] and "#" not in env.setup[0]
    assert "rm -rf /var/lib/apt/lists/*" in env.setup[0]


def test_from_with_a_platform_flag_records_the_image(tmp_path):
    env = _df(tmp_path, "FROM --platform=linux/amd64 python:3.13-slim AS x\nRUN true\n")
    assert env.base_image == "python:3.13-slim" and env.unsupported == ()


def test_build_arguments(tmp_path):
    env = _df(tmp_path, """
        ARG VERSION=3.12
        ARG NODEFAULT
        FROM python:${VERSION}-slim
        ARG PKG=requests
        RUN pip install $PKG
        RUN pip install ${PKG}
        ENV X=$PKG
        RUN echo fine
    """)
    assert env.base_image == "python:3.12-slim" and env.setup == ("echo fine",)
    assert sum("build argument PKG" in u for u in env.unsupported) == 3
    env = _df(tmp_path / "b", "ARG V\nFROM python:${V}\n")
    assert any("build argument V" in u and u.startswith("FROM") for u in env.unsupported)


ENV_PATHS = """
    FROM x
    ENV PATH=/opt/x/bin:$PATH
    ENV GOPATH=/go PATH="/usr/local/go/bin:${PATH}"
    ENV PATH ${GOPATH}/bin:$PATH
    ENV A=1
    ENV A=2 B=$A C=${A:-no} E=${A:+yes}
    ENV D=${UNSET:+x}
"""


def test_env_path_is_expanded(tmp_path):
    """For a local sandbox the ENV values are expanded as Docker would (PATH from Debian's)."""
    df = _parsed(tmp_path, ENV_PATHS)
    assert df.env["PATH"] == "/go/bin:/usr/local/go/bin:/opt/x/bin:" + DEBIAN_PATH
    # on one line, Docker expands against the ENV lines before it
    assert (df.env["A"], df.env["B"], df.env["C"], df.env["E"]) == ("2", "1", "1", "yes")
    assert "D" not in df.env and any("$UNSET" in u for u in df.unsupported)


def test_dockerfile_env_is_left_to_the_image(tmp_path):
    """The Environment never restates the Dockerfile's ENV (a PATH expanded here could hide
    the base image's): the engine applies it; a local sandbox, which has no image, names it
    as a step it cannot reproduce."""
    env = _df(tmp_path, ENV_PATHS)
    assert env.env == {"TEST_DIR": "/tests"}  # only the compose file's run-time environment
    assert any(u.startswith("the Dockerfile's ENV lines") for u in env.unsupported)
    assert any("$UNSET" in u for u in env.unsupported)
    plain = _df(tmp_path / "plain", "FROM x\nWORKDIR /app\nCOPY name.txt .\n")
    assert not any("ENV" in u for u in plain.unsupported)


def test_env_that_cannot_be_expanded_honestly_is_unsupported(tmp_path):
    dockerfile = """
        FROM x
        ENV LD_LIBRARY_PATH=/opt/lib:$LD_LIBRARY_PATH
        ENV S='$PATH stays'
        ENV
        ENV 1BAD=x
        ENV Q='unclosed
    """
    df = _parsed(tmp_path, dockerfile)
    assert "LD_LIBRARY_PATH" not in df.env and df.env["S"] == "$PATH stays"
    assert all("$" not in v for k, v in df.env.items() if k != "S")
    env = _df(tmp_path / "env", dockerfile)
    assert env.env == {"TEST_DIR": "/tests"}
    for unsupported in (df.unsupported, env.unsupported):
        text = "\n".join(unsupported)
        for fragment in ("LD_LIBRARY_PATH", "needs a name and a value",
                         "not a valid variable name", "unclosed"):
            assert fragment in text


@pytest.mark.parametrize("dockerfile, fragment", [
    ("WORKDIR /app\nRUN true\n", "no FROM line"),
    ("FROM x\nFROBNICATE now\n", "unknown instruction FROBNICATE"),
    ("FROM x\nCOPY missing.txt .\n", "does not exist"),
    ("FROM x\nWORKDIR /app\nCOPY ../x .\n", "leaves the build context"),
    ("FROM x\nCOPY *.txt .\n", "wildcard source"),
    ("FROM x\nADD https://example.com/a.tgz .\n", "remote source"),
    ("FROM x\nADD name.tar.gz /opt/\n", "local archive"),
    ("FROM x\nRUN --mount=type=secret,id=k cat /run/secrets/k\n", "--mount=type=secret"),
    ("FROM x\nSHELL [\"pwsh\", \"-c\"]\n", "SHELL"),
    ("FROM x\nWORKDIR $HOME/app\nCOPY name.txt .\n", "WORKDIR is not known"),
])
def test_what_the_local_path_cannot_do_is_named_not_fatal(tmp_path, dockerfile, fragment):
    env = _df(tmp_path, dockerfile, **{"name.tar.gz": "x"})
    assert any(fragment in u for u in env.unsupported), env.unsupported


def test_run_forms_the_local_path_can_do(tmp_path):
    env = _df(tmp_path, """
        FROM x
        SHELL ["/bin/bash", "-o", "pipefail", "-c"]
        RUN ["echo", "a b"]
        RUN --mount=type=cache,target=/root/.cache pip install x
    """)
    assert env.setup == ("echo 'a b'", "pip install x") and env.unsupported == ()


def test_copy_sources_are_read_only_through_the_task_directory(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("HOST-SECRET\n")
    root = write(tmp_path / "t", real_tb_files(
        Dockerfile="FROM x\nWORKDIR /app\nCOPY link.txt .\nCOPY data/ data/\nCOPY name.txt .\n",
        **{"data/ok.txt": "ok\n"}))
    os.symlink(secret, os.path.join(root, "link.txt"))
    os.symlink(secret, os.path.join(root, "data", "leak.txt"))
    env = load_terminal_bench_task(root).environment
    assert dict(env.files) == {"name.txt": b"ada\n"}  # nothing of the links' trees
    assert sum("is a symbolic link" in u for u in env.unsupported) == 2
    assert not any(b"HOST-SECRET" in v for v in env.files.values())


def test_the_copy_cap_is_an_unsupported_entry(tmp_path, monkeypatch):
    monkeypatch.setattr(spec, "MAX_TREE_BYTES", 100)
    env = _df(tmp_path, "FROM x\nWORKDIR /app\nCOPY a.txt .\nCOPY b.txt .\n",
              **{"a.txt": "a" * 60, "b.txt": "b" * 60,
                 "tests/test_outputs.py": "def test_x():\n    pass\n"})
    assert dict(env.files) == {"a.txt": b"a" * 60}
    assert any("COPY b.txt" in u and "larger than 100 bytes" in u for u in env.unsupported)


def test_a_dockerignore_makes_directory_copies_unsupported(tmp_path):
    env = _df(tmp_path, "FROM x\nWORKDIR /app\nCOPY . .\n", **{".dockerignore": "tests\n"})
    assert env.files == {} and any(".dockerignore" in u for u in env.unsupported)


def test_the_dockerfile_itself_keeps_the_task_dir_guarantees(tmp_path):
    root = write(tmp_path / "t", real_tb_files(Dockerfile=None))
    os.symlink("/etc/hostname", os.path.join(root, "Dockerfile"))
    _refused(root, load_terminal_bench_task, "Dockerfile", "services.client.build.dockerfile",
             "is a symbolic link")


@pytest.mark.parametrize("dockerfile, workdir", [
    ("FROM x\nWORKDIR /a\nWORKDIR b\nRUN true\n", "/a/b"),
    ("FROM x\nRUN true\n", None),  # the image's own WORKDIR, whatever the base sets
])
def test_workdir_is_the_last_workdir(tmp_path, dockerfile, workdir):
    assert _parsed(tmp_path, dockerfile).workdir == workdir
    # the Environment's workdir is the run-time one (compose working_dir, Harbor's
    # [environment] workdir): without one, the built image's WORKDIR applies
    assert _df(tmp_path / "env", dockerfile).workdir is None


# ------------------------------------------------------------------ Terminal-Bench task.yaml


def test_unknown_task_yaml_keys_are_warned(tmp_path):
    t = _tb(tmp_path, **{"task.yaml": "instruction: x\nauthor_name: me\nfoo: 1\nbar: [2]\n"})
    _warned(t, "'foo' is not a Terminal-Bench key")
    _warned(t, "'bar' is not a Terminal-Bench key")
    assert not [w for w in t.warnings if "author_name" in w]
    _warned(t, "network access", "offline")


@pytest.mark.parametrize("same_shell", [True, False])
def test_the_verifier_runs_run_tests_sh_at_tests(tmp_path, same_shell):
    yaml = f"instruction: x\nmax_test_timeout_sec: 42\nrun_tests_in_same_shell: {same_shell}\n"
    t = _tb(tmp_path, **{"task.yaml": yaml, "tests/data/in.txt": "1\n"})
    v = t.verifier
    assert (v.kind, v.mode, v.command, v.tests_dir) == (
        "terminal-bench", "shared", "bash /tests/run-tests.sh", "/tests")
    assert set(v.files) == {"run-tests.sh", "test_outputs.py", "data/in.txt"}
    assert v.files["run-tests.sh"] == real_tb_files()["run-tests.sh"].encode()
    assert dict(v.env) == {"TEST_DIR": "/tests"} and v.timeout_s == 42
    assert bool([w for w in t.warnings if "run_tests_in_same_shell" in w]) == same_shell


def test_run_tests_sh_needs_no_tests_dir_and_tests_win_a_collision(tmp_path):
    t = _tb(tmp_path, "a", **{"tests/test_outputs.py": None})
    assert set(t.verifier.files) == {"run-tests.sh"}
    t = _tb(tmp_path, "b", **{"tests/run-tests.sh": "echo from tests\n"})
    assert t.verifier.files["run-tests.sh"] == b"echo from tests\n"
    _warned(t, "tests/run-tests.sh replaces run-tests.sh")


def test_without_run_tests_sh_the_verifier_is_pytest_at_tests(tmp_path):
    t = _tb(tmp_path, **{"run-tests.sh": None})
    v = t.verifier
    assert (v.kind, v.mode, v.tests_dir) == ("pytest", "shared", "/tests")
    assert set(v.files) == {"test_outputs.py"}
    root = write(tmp_path / "n", real_tb_files(**{"run-tests.sh": None,
                                                   "tests/test_outputs.py": None,
                                                   "tests/data.txt": "x"}))
    _refused(root, load_terminal_bench_task, "tests", None, "no test_*.py")


def test_same_shell_must_be_a_bool(tmp_path):
    root = write(tmp_path / "t", real_tb_files(**{"task.yaml": "instruction: x\n"
                                                  "run_tests_in_same_shell: maybe\n"}))
    _refused(root, load_terminal_bench_task, "task.yaml", "run_tests_in_same_shell")


def test_the_oracle_is_solution_sh_at_oracle(tmp_path):
    compose = TB_COMPOSE.replace("- TEST_DIR=${T_BENCH_TEST_DIR}",
                                 "- TEST_DIR=${T_BENCH_TEST_DIR}\n      - MODE=ci")
    t = _tb(tmp_path, **{"docker-compose.yaml": compose})
    o = t.oracle
    assert (o.dir, o.command) == ("/oracle", "bash /oracle/solution.sh")
    assert dict(o.files) == {"solution.sh": real_tb_files()["solution.sh"].encode()}
    assert dict(o.env) == {"TEST_DIR": "/tests", "MODE": "ci"}
    assert t.solution == ((real_tb_files()["solution.sh"],),)
    t = _tb(tmp_path, "y", **{"solution.sh": None, "solution.yaml": "- command: ls\n"})
    assert t.oracle is None and t.solution == (("ls",),)


# ------------------------------------------------------------------ Harbor task.toml


HARBOR_ENV = textwrap.dedent("""
    [environment]
    build_timeout_sec = 900
    cpus = 2
    memory_mb = 4096
    storage = "20G"
    gpus = 1
    allow_internet = true
    workdir = "/srv/app"
    env = { MODE = "ci", TOKEN = "${HOST_TOKEN}", LEVEL = "${HOST_LEVEL:-3}" }

    [solution]
    env = { SEED = "7" }

    [verifier]
    env = { STRICT = "1" }
    timeout_sec = 30
""")


def test_harbor_environment_fields(tmp_path):
    t = _harbor(tmp_path, **{"task.toml": HARBOR_ENV})
    env = t.environment
    assert (env.build_timeout_s, env.cpus, env.memory_mb, env.storage_mb, env.gpus) == (
        900, 2, 4096, 20480, 1)
    assert env.network is True and env.workdir == "/srv/app"
    assert dict(env.env) == {"MODE": "ci", "LEVEL": "3"}
    assert (env.services, env.agent_service) == (("main",), "main")
    assert env.context == str(tmp_path / "task" / "environment")
    _warned(t, "gpus = 1", "no GPU is given to sandboxes")
    _warned(t, "TOKEN", "HOST_TOKEN", "is not set")
    _warned(t, "LEVEL", "takes the default '3'")
    assert dict(t.oracle.env) == {"DEBIAN_FRONTEND": "noninteractive", "SEED": "7"}
    assert dict(t.verifier.env) == {"STRICT": "1"} and t.verifier.timeout_s == 30


def test_harbor_defaults(tmp_path):
    t = _harbor(tmp_path, **{"task.toml": "[metadata]\nanything = 1\n"})
    env = t.environment
    assert env.build_timeout_s == 600 and env.cpus is None and env.memory_mb is None
    assert env.network is False and env.gpus == 0
    assert env.workdir is None and env.env == {}  # the image's WORKDIR /app and ENV apply
    _warned(t, "allow_internet", "Harbor's default is internet access", "offline")
    assert not [w for w in t.warnings if "anything" in w]  # [metadata] is free-form


@pytest.mark.parametrize("toml, network, warned", [
    ("[environment]\nallow_internet = false\n", False, None),
    ("[environment]\nnetwork_mode = 'public'\n", True, None),
    ("[environment]\nnetwork_mode = 'no-network'\nallow_internet = true\n", False, None),
    ("[environment]\nnetwork_mode = 'allowlist'\nallowed_hosts = ['pypi.org']\n", False,
     "pypi.org"),
])
def test_harbor_network(tmp_path, toml, network, warned):
    t = _harbor(tmp_path, **{"task.toml": toml})
    assert t.environment.network is network
    if warned:
        _warned(t, warned, "offline")
    assert not [w for w in t.warnings if "is not set" in w]


@pytest.mark.parametrize("toml, field", [
    ("[environment]\nnetwork_mode = 'lan'\n", "environment.network_mode"),
    ("[environment]\ngpus = -1\n", "environment.gpus"),
    ("[environment]\ngpus = 'all'\n", "environment.gpus"),
    ("[environment]\nworkdir = 'app'\n", "environment.workdir"),
    ("[environment]\nbuild_timeout_sec = 0\n", "environment.build_timeout_sec"),
    ("[environment]\nenv = { A = 1 }\n", "environment.env"),
    ("[solution]\nenv = { 'B-C' = 'x' }\n", "solution.env"),
    ("[verifier]\nmode = 'elsewhere'\n", "verifier.mode"),
    ("[verifier]\nmode = 'shared'\nenvironment_mode = 'separate'\n", "verifier.mode"),
])
def test_harbor_bad_fields_name_file_and_field(tmp_path, toml, field):
    root = write(tmp_path / "t", harbor_files(**{"task.toml": toml}))
    _refused(root, load_harbor_task, "task.toml", field)


@pytest.mark.parametrize("toml, mode", [
    ("", "shared"),
    ("[verifier]\nmode = 'separate'\n", "separate"),
    ("[verifier]\nenvironment_mode = 'separate'\n", "separate"),
    ("[verifier.environment]\ncpus = 1\n", "separate"),
])
def test_harbor_verifier_is_test_sh_at_tests(tmp_path, toml, mode):
    t = _harbor(tmp_path, **{"task.toml": toml})
    v = t.verifier
    assert (v.kind, v.command, v.tests_dir, v.mode) == (
        "script", "bash /tests/test.sh", "/tests", mode)
    assert v.files["test.sh"] == harbor_files()["tests/test.sh"].encode()  # not rewritten
    assert b"/logs/verifier/reward.txt" in v.files["test.sh"]
    assert not hasattr(harbor_module, "rewrite_harbor_paths")


def test_harbor_oracle_is_the_whole_solution_dir(tmp_path):
    t = _harbor(tmp_path, **{"solution/data/answer.txt": "42\n", "solution/helper.py": "x=1\n"})
    o = t.oracle
    assert (o.dir, o.command) == ("/solution", "bash /solution/solve.sh")
    assert set(o.files) == {"solve.sh", "data/answer.txt", "helper.py"}
    assert t.solution == ((harbor_files()["solution/solve.sh"],),)
    t = _harbor(tmp_path, "n", **{"solution/solve.sh": None, "solution/other.sh": "true\n"})
    assert t.oracle is None and t.solution == ()
    _warned(t, "solution/ has no solve.sh")
    t = _harbor(tmp_path, "m", **{"solution/solve.sh": None})
    assert t.oracle is None and t.solution == ()


def test_harbor_unknown_and_unused_keys_are_warned(tmp_path):
    toml = textwrap.dedent("""
        version = "1.0"
        frobnicate = 1
        artifacts = ["/app/out"]

        [task]
        name = "org/t"
        description = "d"

        [verifier]
        user = "tester"
        colour = "red"

        [agent]
        timeout_sec = 60
        user = "agent"

        [environment]
        healthcheck = { command = "true" }
        os = "windows"
        allow_internet = false

        [extra]
        x = 1
    """)
    t = _harbor(tmp_path, **{"task.toml": toml})
    _warned(t, "frobnicate is not a Harbor key")
    _warned(t, "[verifier] colour is not a Harbor key")
    _warned(t, "extra is not a Harbor key")
    for used in ("artifacts", "[verifier] user", "[agent] user", "[environment] healthcheck"):
        _warned(t, f"{used} is not used")
    _warned(t, "os = 'windows'")
    assert not [w for w in t.warnings if "description" in w or "version" in w]


HARBOR_COMPOSE = textwrap.dedent("""
    services:
      main:
        build:
          context: ${CONTEXT_DIR}
          dockerfile: Dockerfile
        image: ${MAIN_IMAGE_NAME}
        environment:
          - MODE=${MODE}
          - LIMIT=${CPUS}
        working_dir: /srv
        volumes:
          - ${HOST_VERIFIER_LOGS_PATH}:${ENV_VERIFIER_LOGS_PATH}
          - ${HOST_AGENT_LOGS_PATH}:${ENV_AGENT_LOGS_PATH}
      redis:
        image: redis:7
""")


@pytest.mark.parametrize("name", ["docker-compose.yaml", "docker-compose.yml"])
def test_harbor_compose_describes_main(tmp_path, name):
    toml = "[environment]\ncpus = 2\nallow_internet = false\nenv = { MODE = 'ci' }\n"
    t = _harbor(tmp_path, **{"task.toml": toml, f"environment/{name}": HARBOR_COMPOSE})
    env = t.environment
    root = str(tmp_path / "task")
    assert env.compose_file == os.path.join(root, "environment", name)
    assert env.services == ("main", "redis") and env.agent_service == "main"
    assert env.multi_container
    assert env.context == os.path.join(root, "environment") and env.image is None
    # [environment] env reaches compose's interpolation, not the container directly
    assert dict(env.env) == {"MODE": "ci", "LIMIT": "2"} and env.workdir == "/srv"
    assert not [w for w in t.warnings if "volume" in w or "HOST_" in w], t.warnings
    assert bool([w for w in t.warnings if "reads only" in w]) == name.endswith(".yml")


def test_harbor_compose_without_main_keeps_the_default_build(tmp_path):
    t = _harbor(tmp_path, **{"environment/docker-compose.yaml":
                             "services:\n  db:\n    image: postgres:16\n"})
    env = t.environment
    assert env.services == ("main", "db") and env.dockerfile.endswith("environment/Dockerfile")


@pytest.mark.parametrize("toml, dockerfile, image", [
    ("", True, None),  # Harbor builds main; the image only tags it
    ("[environment]\ndocker_image = 'base:1'\n", True, "img:2"),  # over the prebuilt one
    ("", False, "img:2"),  # nothing to build
])
def test_harbor_compose_image_of_main(tmp_path, toml, dockerfile, image):
    files = {"task.toml": toml, "environment/docker-compose.yaml":
             "services:\n  main:\n    image: img:2\n"}
    if not dockerfile:
        files.update({"environment/Dockerfile": None, "environment/name.txt": None})
    t = _harbor(tmp_path, **files)
    assert t.environment.image == image
    assert (t.environment.dockerfile is not None) == dockerfile


def test_harbor_compose_context_may_not_leave_the_task(tmp_path):
    root = write(tmp_path / "t", harbor_files(**{
        "environment/docker-compose.yaml": "services:\n  main:\n    build: ../..\n"}))
    _refused(root, load_harbor_task, "docker-compose.yaml", "services.main.build.context",
             "leaves the task directory")


# ------------------------------------------------------------------ finding task directories


def test_a_repository_with_a_tasks_folder(tmp_path):
    repo = tmp_path / "terminal-bench"
    write(repo / "tasks" / "hello", real_tb_files())
    write(repo / "tasks" / "other", real_tb_files())
    write(repo / "terminal_bench", {"__init__.py": ""})
    assert [os.path.basename(p) for p in find_task_dirs(str(repo))] == ["hello", "other"]
    assert [t.id for t in load_task_dirs(str(repo))] == ["hello", "other"]


def test_a_dataset_folder_and_a_task_dir(tmp_path):
    write(tmp_path / "ds" / "a", harbor_files())
    write(tmp_path / "ds" / "b", real_tb_files())
    assert [os.path.basename(p) for p in find_task_dirs(str(tmp_path / "ds"))] == ["a", "b"]
    assert find_task_dirs(str(tmp_path / "ds" / "a")) == [str(tmp_path / "ds" / "a")]


def test_links_are_refused_and_nothing_found_says_where_it_looked(tmp_path):
    write(tmp_path / "real" / "t", real_tb_files())
    os.makedirs(tmp_path / "repo")
    os.symlink(tmp_path / "real", tmp_path / "repo" / "tasks")
    with pytest.raises(TaskFormatError, match="symbolic link") as e:
        find_task_dirs(str(tmp_path / "repo"))
    assert e.value.file.endswith("tasks")
    os.makedirs(tmp_path / "empty" / "tasks" / "nothing")
    with pytest.raises(TaskFormatError) as e:
        find_task_dirs(str(tmp_path / "empty"))
    assert "task.toml" in str(e.value) and os.path.join(str(tmp_path / "empty"), "tasks") \
        in str(e.value)


# ------------------------------------------------------------------ services beside the agent's

SIDECARS = """\
  api:
    build:
      context: .
      dockerfile: api.Dockerfile
    command: python3 -m http.server 8080
    environment: {MODE: "${T_BENCH_TEST_DIR}"}
    working_dir: /srv
    healthcheck:
      test: curl -f http://localhost:8080
      interval: 1s
      retries: 3
  cache:
    image: redis:7
    entrypoint: ["redis-server", "--save", ""]
"""


def test_the_other_services_are_sidecars(tmp_path):
    compose = tb_compose("depends_on: {api: {condition: service_healthy}}") + SIDECARS
    t = _tb(tmp_path, **{"docker-compose.yaml": compose,
                         "api.Dockerfile": "FROM trsi-task-base:bookworm\n"})
    env, root = t.environment, str(tmp_path / "task")
    assert env.multi_container and env.services == ("client", "api", "cache")
    api, cache = env.sidecars
    assert api.name == "api" and api.image is None
    assert api.dockerfile == os.path.join(root, "api.Dockerfile") and api.context == root
    assert api.command == ("python3", "-m", "http.server", "8080")
    assert dict(api.env) == {"MODE": "/tests"} and api.workdir == "/srv"
    assert dict(api.healthcheck) == {"test": ["CMD-SHELL", "curl -f http://localhost:8080"],
                                     "interval": "1s", "retries": 3}
    assert cache.image == "redis:7" and cache.dockerfile is None
    assert cache.entrypoint == ("redis-server", "--save", "") and cache.command is None
    assert not [w for w in t.warnings if "services.api" in w or "services.cache" in w]


@pytest.mark.parametrize("service, field, fragment", [
    ("  db:\n    environment: {A: b}\n", "services.db.image", "needs a build or an image"),
    ("  db:\n    build: ../elsewhere\n", "services.db.build.context", "leaves the task"),
    ("  db:\n    image: x\n    healthcheck: [1]\n", "services.db.healthcheck", "a mapping"),
    ("  db:\n    image: x\n    healthcheck: {retries: -1}\n", "services.db.healthcheck.retries",
     "integer"),
    ("  db:\n    image: x\n    command: {a: 1}\n", "services.db.command", "list of strings"),
])
def test_malformed_sidecars_name_file_and_field(tmp_path, service, field, fragment):
    root = write(tmp_path / "t", real_tb_files(**{"docker-compose.yaml": TB_COMPOSE + service}))
    _refused(root, load_terminal_bench_task, "docker-compose.yaml", field, fragment)
