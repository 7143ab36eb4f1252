"""Task environments: a task's own Dockerfile built by the engine (BuildKit), offline,
cached by content, with typed errors; the offline task base image.

Engine tests need a running Docker engine and the default sandbox image (its debootstrap
base is the task base's base): they fail in CI (CI=true) and skip elsewhere without them.
"""

from __future__ import annotations

import os
import random
import secrets
import subprocess
import time

import pytest

from terminal_rsi.sandbox import image as image_mod
from terminal_rsi.sandbox.errors import InfrastructureError
from terminal_rsi.sandbox.image import (
    ENV_LABEL,
    LOG_TAIL_CHARS,
    PYTHON_IMAGE_PATH,
    TASK_BASE_IMAGE,
    BaseImageMissing,
    BuildFailed,
    BuildTimeout,
    EngineUnavailable,
    ImageMissing,
    build_context_image,
    build_task_base_image,
    build_task_image,
    context_digest,
    env_hash,
    image_config,
    image_present,
)
from terminal_rsi.sandbox.procs import pids_with_cmdline

from .conftest import need_docker_image

PREFIX = f"trsi-test-env-{secrets.token_hex(4)}"


def _docker(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=120)


def _our_tags() -> list[str]:
    out = _docker("image", "ls", "--format", "{{.Repository}}:{{.Tag}}", PREFIX).stdout
    return out.split()


@pytest.fixture(scope="module")
def base():
    """The task base image (built offline, kept: it is a cache); removes our tags at the end."""
    need_docker_image()
    tag = build_task_base_image()
    yield tag
    for t in _our_tags():
        _docker("image", "rm", t)


def _write(d, files: dict[str, str]) -> str:
    for rel, text in files.items():
        path = os.path.join(d, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    return str(d)


def _build(ctx, dockerfile_text: str, files: dict[str, str] | None = None, **kw) -> str:
    _write(ctx, {"Dockerfile": dockerfile_text, **(files or {})})
    return build_context_image(str(ctx), "Dockerfile", tag_prefix=PREFIX, **kw)


def _run(tag: str, script: str) -> str:
    r = _docker("run", "--rm", "--network=none", tag, "sh", "-c", script)
    assert r.returncode == 0, r.stderr
    return r.stdout


def _assert_no_build_tags() -> None:
    assert not [t for t in _our_tags() if ":build-" in t], _our_tags()


# -- no engine needed ---------------------------------------------------------------------


def test_engine_missing_is_typed(tmp_path, monkeypatch):
    ctx = _write(tmp_path, {"Dockerfile": f"FROM {TASK_BASE_IMAGE}\nRUN true\n"})
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    with pytest.raises(EngineUnavailable) as ei:
        build_context_image(ctx, "Dockerfile", tag_prefix=PREFIX)
    assert "dockerd" in str(ei.value) and ".ci/setup_sandbox.sh" in str(ei.value)
    assert isinstance(ei.value, InfrastructureError) and ei.value.retryable
    with pytest.raises(EngineUnavailable):
        image_present(TASK_BASE_IMAGE)
    monkeypatch.setenv("PATH", str(tmp_path))  # no docker CLI at all
    with pytest.raises(EngineUnavailable, match="no `docker` CLI"):
        image_config(TASK_BASE_IMAGE)


IGNORE = "# comment\n*.log\nbuild/\n**/cache\n/abs.txt\n"
IGNORE_FILES = {"keep.txt": "k", "sub/keep.txt": "k", "x.log": "l", "sub/y.log": "l",
                "build/out.bin": "b", "abs.txt": "a", "sub/abs.txt": "a", "sub/cache/c": "c",
                "cache/c": "c"}
# What BuildKit sends of IGNORE_FILES under IGNORE (checked against the engine below).
SENT = {"keep.txt", "sub", "sub/keep.txt", "sub/y.log", "sub/abs.txt"}


def test_digest_respects_dockerignore(tmp_path):
    ctx = _write(tmp_path, {"Dockerfile": "FROM scratch\n", ".dockerignore": IGNORE,
                            **IGNORE_FILES})
    d0 = context_digest(ctx)
    for rel in ("x.log", "build/out.bin", "abs.txt", "sub/cache/c", "cache/c"):
        _write(tmp_path, {rel: "changed"})
        assert context_digest(ctx) == d0, f"{rel} is ignored, yet changes the digest"
    for rel in ("keep.txt", "sub/y.log", "sub/abs.txt"):
        _write(tmp_path, {rel: "changed"})
        assert context_digest(ctx) != d0, f"{rel} is sent, yet does not change the digest"
        d0 = context_digest(ctx)
    os.chmod(tmp_path / "keep.txt", 0o755)
    assert context_digest(ctx) != d0, "a mode change is part of the content"


def test_digest_hashes_everything_when_ignore_has_exceptions(tmp_path):
    ctx = _write(tmp_path, {"Dockerfile": "FROM scratch\n", ".dockerignore": "*.log\n!a.log\n",
                            "b.log": "1"})
    d0 = context_digest(ctx)
    _write(tmp_path, {"b.log": "2"})  # ignored by BuildKit, but `!` is not mirrored
    assert context_digest(ctx) != d0


def test_digest_covers_dockerfile_args_network(tmp_path):
    ctx = _write(tmp_path, {"Dockerfile": "FROM scratch\n"})
    d0 = context_digest(ctx)
    assert context_digest(ctx, network=True) != d0
    assert context_digest(ctx, build_args={"V": "1"}) != d0
    assert context_digest(ctx, build_args={"V": "1"}) != context_digest(ctx, build_args={"V": "2"})
    _write(tmp_path, {"Dockerfile": "FROM scratch\n# edited\n"})
    assert context_digest(ctx) != d0


def test_dockerfile_specific_ignore_wins(tmp_path):
    ctx = _write(tmp_path / "ctx", {".dockerignore": "a.txt\n", "a.txt": "1", "b.txt": "1"})
    df = _write(tmp_path / "df", {"Dockerfile": "FROM scratch\n",
                                  "Dockerfile.dockerignore": "b.txt\n"})
    df = os.path.join(df, "Dockerfile")
    d0 = context_digest(ctx, df)
    _write(tmp_path / "ctx", {"b.txt": "2"})
    assert context_digest(ctx, df) == d0
    _write(tmp_path / "ctx", {"a.txt": "2"})
    assert context_digest(ctx, df) != d0


# -- the engine ---------------------------------------------------------------------------

MULTI = f"""\
FROM --platform=$BUILDPLATFORM {TASK_BASE_IMAGE} AS build
RUN <<EOF
set -e
mkdir -p /out
printf '#!/bin/sh\\necho tool-ran\\n' > /out/tool
chmod 755 /out/tool
EOF
FROM {TASK_BASE_IMAGE}
COPY --from=build /out/tool /opt/tool/bin/tool
COPY data.txt /app/data.txt
ENV PATH=/opt/tool/bin:$PATH
WORKDIR /app
"""


def test_task_base_image(base):
    cfg = image_config(base)
    assert (cfg.workdir, cfg.user) == ("/", "")
    assert cfg.env["LANG"] == "C.UTF-8" and cfg.env["PATH"] == PYTHON_IMAGE_PATH
    assert build_task_base_image() == base  # current: not rebuilt
    assert image_config(base).image_id == cfg.image_id
    out = _run(base, "id -u; pwd; python --version; pytest --version; pytest --help | "
                     "grep -c -- --ctrf")
    assert out.splitlines()[:2] == ["0", "/"] and "pytest 8." in out and out.endswith("1\n")


def test_multistage_heredoc_env_workdir(base, tmp_path):
    tag = _build(tmp_path, MULTI, {"data.txt": "payload\n"})
    assert tag.startswith(f"{PREFIX}:") and image_present(tag)
    cfg = image_config(tag)
    assert cfg.workdir == "/app" and cfg.user == ""
    assert cfg.env["PATH"] == "/opt/tool/bin:" + PYTHON_IMAGE_PATH  # $PATH expanded
    assert cfg.labels[ENV_LABEL] == tag.partition(":")[2]
    assert _run(tag, "pwd; tool; cat data.txt") == "/app\ntool-ran\npayload\n"
    _assert_no_build_tags()


def test_cache_hit_runs_no_build(base, tmp_path, monkeypatch):
    tag = _build(tmp_path, MULTI, {"data.txt": "cached\n"})
    image_id = image_config(tag).image_id
    argvs = []
    real_popen = subprocess.Popen

    def spy(argv, *a, **kw):
        argvs.append(list(argv))
        return real_popen(argv, *a, **kw)

    monkeypatch.setattr(image_mod.subprocess, "Popen", spy)
    assert build_context_image(str(tmp_path), "Dockerfile", tag_prefix=PREFIX) == tag
    monkeypatch.undo()
    assert argvs, "the cache check asks the engine"
    assert not [a for a in argvs if "build" in a[:3]], argvs
    assert image_config(tag).image_id == image_id


def test_content_change_gives_new_tag(base, tmp_path):
    t1 = _build(tmp_path, MULTI, {"data.txt": "one\n"})
    t2 = _build(tmp_path, MULTI, {"data.txt": "two\n"})
    assert t1 != t2 and image_present(t1) and image_present(t2)
    assert _run(t2, "cat data.txt") == "two\n"
    h = env_hash(str(tmp_path))
    assert t2 == f"{PREFIX}:{h}"
    assert env_hash(str(tmp_path), build_args={"X": "1"}) != h
    assert env_hash(str(tmp_path), network=True) != h


@pytest.mark.parametrize("outside", [False, True], ids=["dockerignore", "dockerfile-outside"])
def test_engine_sends_what_the_hash_covers(base, tmp_path, outside):
    files = {**IGNORE_FILES, "Dockerfile": f"FROM {TASK_BASE_IMAGE}\nCOPY . /ctx\n"}
    if outside:  # compose-style: the Dockerfile and its own ignore file elsewhere
        df_dir = _write(tmp_path / "df", {"Dockerfile": files.pop("Dockerfile"),
                                          "Dockerfile.dockerignore": IGNORE})
        dockerfile = os.path.join(df_dir, "Dockerfile")
    else:
        files[".dockerignore"] = IGNORE
        dockerfile = "Dockerfile"
    ctx = _write(tmp_path / "ctx", files)
    tag = build_context_image(ctx, dockerfile, tag_prefix=PREFIX)
    sent = set(_run(tag, "cd /ctx && find . -mindepth 1 | cut -c3-").split())
    expect = SENT if outside else SENT | {"Dockerfile", ".dockerignore"}
    assert sent == expect
    assert tag == f"{PREFIX}:{env_hash(ctx, dockerfile)}"


def test_build_task_image_wrapper(base, tmp_path):
    _write(tmp_path, {"Dockerfile": MULTI, "data.txt": "alias\n"})
    alias = f"{PREFIX}:alias"
    assert build_task_image(str(tmp_path), alias) == alias
    env_tag = build_context_image(str(tmp_path), "Dockerfile")  # the default prefix
    try:
        assert image_config(alias).image_id == image_config(env_tag).image_id
    finally:
        _docker("image", "rm", env_tag)


def test_image_missing(base):
    assert not image_present(f"{PREFIX}:nope")
    with pytest.raises(ImageMissing):
        image_config(f"{PREFIX}:nope")


@pytest.mark.parametrize("dockerfile,missing", [
    ("FROM trsi-no-such-image:1\nRUN true\n", "trsi-no-such-image:1"),
    (f"FROM {TASK_BASE_IMAGE} AS build\nRUN echo hi > /x\n"
     "FROM trsi-no-such-image-2:latest\nCOPY --from=build /x /x\n",
     "trsi-no-such-image-2:latest"),
    (f"# syntax=docker/dockerfile:1\nFROM {TASK_BASE_IMAGE}\n", "docker/dockerfile:1"),
], ids=["single", "multistage", "syntax-frontend"])
def test_missing_base_image(base, tmp_path, dockerfile, missing):
    with pytest.raises(BaseImageMissing) as ei:
        _build(tmp_path, dockerfile)
    e = ei.value
    assert e.image == missing and isinstance(e, ImageMissing)
    assert f"`docker pull {missing}`" in str(e) and "docker load" in str(e)
    if missing.startswith("docker/dockerfile"):
        assert "# syntax=" in str(e)
    assert not image_present(f"{PREFIX}:{env_hash(str(tmp_path))}")
    _assert_no_build_tags()


def test_failing_run_is_build_failed(base, tmp_path):
    marker = f"marker-{secrets.token_hex(4)}"
    df = f"FROM {TASK_BASE_IMAGE}\nRUN seq 1 3000; echo {marker}; exit 7\n"
    with pytest.raises(BuildFailed) as ei:
        _build(tmp_path, df)
    e = ei.value
    assert marker in e.log_tail and "exit code: 7" in e.log_tail
    assert len(e.log_tail) <= LOG_TAIL_CHARS and marker in str(e)
    assert not e.retryable
    assert not image_present(f"{PREFIX}:{env_hash(str(tmp_path))}")
    _assert_no_build_tags()


def test_timeout_kills_the_build(base, tmp_path):
    token = f"30.{random.randrange(10**6):06d}"
    t0 = time.monotonic()
    with pytest.raises(BuildTimeout):
        _build(tmp_path, f"FROM {TASK_BASE_IMAGE}\nRUN sleep {token}\n", timeout_s=3)
    assert time.monotonic() - t0 < 25, "the build was not killed at its timeout"
    for _ in range(100):  # the engine cancels the RUN once the CLI's session is gone
        left = pids_with_cmdline(token.encode())
        if not left:
            break
        time.sleep(0.1)
    assert not left, f"the RUN step still runs after the timeout: {left}"
    assert not image_present(f"{PREFIX}:{env_hash(str(tmp_path))}")
    _assert_no_build_tags()
