"""Docker images, built offline (no registry pulls): the default sandbox image, the task
base image, and task environments (a task's own Dockerfile).

    python -m terminal_rsi.sandbox.image build [--tag TAG] [--force] [--cache-dir DIR]
    python -m terminal_rsi.sandbox.image build-task-base [--tag TAG] [--force]
    python -m terminal_rsi.sandbox.image build-task CONTEXT_DIR [-f DOCKERFILE] [--tag TAG]
        [--network] [--timeout S] [--build-arg K=V ...]

The default image (``terminal-rsi-sandbox:bookworm``) holds bash, coreutils,
procps, tmux (terminal sessions), python3 with pytest and pytest-json-ctrf, and a
non-root user ``sandbox`` (uid 1000) whose home is the workspace ``/workspace``. It is
built in three steps:

1. ``debootstrap --variant=minbase --include=python3,procps,tmux bookworm``
   builds a Debian root filesystem from the Debian package archive (the only
   registry these machines reach); the result is cached as a tarball under
   ``~/.cache/terminal_rsi/sandbox`` so later builds skip it.
2. The pytest-json-ctrf wheel (``pip download`` on the host, pure Python) is
   unpacked into the rootfs's dist-packages, the ``sandbox`` user and
   ``/workspace`` are added, and the tree is ``docker import``-ed.
3. A generated Dockerfile ``FROM`` the imported image sets USER, WORKDIR and
   ENV; it is built with networking off.

If the tag already exists with the same recipe hash (a label) nothing is
rebuilt. The task base image (``trsi-task-base:bookworm``) is built the same way without
the user, WORKDIR or USER: root in ``/``, like ``python:3.x-slim-bookworm``, for which it
stands in (task fixtures start ``FROM trsi-task-base:bookworm``).

A task's own Dockerfile is built by the engine itself (``docker build``, BuildKit, no
``--pull``, networking off unless the task allows it) with :func:`build_context_image`,
cached by content under ``trsi-env:<hash>``; failures are typed (:class:`BaseImageMissing`,
:class:`BuildFailed`, :class:`BuildTimeout`, :class:`EngineUnavailable`).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import logging
import os
import posixpath
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from terminal_rsi.sandbox.errors import BadRequest, InfrastructureError

log = logging.getLogger(__name__)

DEFAULT_IMAGE = "terminal-rsi-sandbox:bookworm"
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
INCLUDE = ("python3", "procps", "tmux")
# Pure-Python wheels, fetched on the host with pip (PyPI) and unpacked into the image.
# Debian bookworm's own python3-pytest (7.2) is too old for pytest-json-ctrf 0.6.1.
PY_REQS = ("pytest==8.4.2", "pytest-json-ctrf==0.6.1")
SANDBOX_UID = 1000


def _rootfs_key() -> str:
    return hashlib.sha256("\0".join((SUITE, MIRROR, *INCLUDE)).encode()).hexdigest()[:12]


BASE_TAG = f"terminal-rsi-sandbox-base:{SUITE}-{_rootfs_key()}"

# Unpack the wheels into dist-packages and add a `pytest` launcher (shared by both images).
_PYTEST_RUN = """\
RUN set -e; site=/usr/local/lib/python3.11/dist-packages; mkdir -p $site; \\
    for w in /tmp/wheels/*.whl; do python3 -m zipfile -e "$w" $site; done; \\
    rm -rf /tmp/wheels; \\
    printf '%s\\n' '#!/usr/bin/python3' 'import sys' 'from pytest import console_main' \\
      'sys.exit(console_main())' > /usr/local/bin/pytest; chmod 755 /usr/local/bin/pytest; \\
"""

DOCKERFILE = f"""\
FROM {BASE_TAG}
COPY wheels /tmp/wheels
{_PYTEST_RUN}\
    echo 'sandbox:x:{SANDBOX_UID}:{SANDBOX_UID}:sandbox:/workspace:/bin/bash' >> /etc/passwd; \\
    echo 'sandbox:x:{SANDBOX_UID}:' >> /etc/group; \\
    mkdir -p /workspace; chown {SANDBOX_UID}:{SANDBOX_UID} /workspace; \\
    python3 -m pytest --version
USER {SANDBOX_UID}:{SANDBOX_UID}
WORKDIR /workspace
ENV HOME=/workspace LANG=C.UTF-8 PYTHONDONTWRITEBYTECODE=1 PATH=/usr/local/bin:/usr/bin:/bin
CMD ["sleep", "infinity"]
"""

# The stand-in for ``python:3.x-slim-bookworm``: root, no WORKDIR, no USER, the PATH and
# LANG of Debian's official python images, `python` -> python3 like them.
TASK_BASE_IMAGE = "trsi-task-base:bookworm"
PYTHON_IMAGE_PATH = "/usr/local/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TASK_BASE_DOCKERFILE = f"""\
FROM {BASE_TAG}
COPY wheels /tmp/wheels
{_PYTEST_RUN}\
    ln -s /usr/bin/python3 /usr/local/bin/python; \\
    python3 -m pytest --version
ENV LANG=C.UTF-8 PATH={PYTHON_IMAGE_PATH}
CMD ["python3"]
"""


class ImageError(InfrastructureError):
    """Base of the image failures below (all importable from this module)."""


class EngineUnavailable(ImageError):
    """No docker CLI, or no Docker engine answers it."""

    def __init__(self, detail: str):
        super().__init__(f"the Docker engine is not available ({detail.strip()}); "
                         "start dockerd (see .ci/setup_sandbox.sh)")


class ImageMissing(ImageError):
    """An image is not present on this engine, and this machine reaches no registry."""

    def __init__(self, image: str, remedy: str | None = None):
        super().__init__(image, remedy or _load_remedy(image))
        self.image, self.remedy = self.args

    def __str__(self) -> str:
        return (f"image {self.image!r} is not present on this Docker engine and cannot be "
                f"pulled here (no registry access): {self.remedy}")


class BaseImageMissing(ImageMissing):
    """A build needs an image (FROM, COPY --from, `# syntax=`) the engine does not have."""


class _LoggedBuildError(ImageError):
    def __init__(self, message: str, log_tail: str = ""):
        super().__init__(message, log_tail)
        self.message, self.log_tail = self.args

    def __str__(self) -> str:
        if not self.log_tail:
            return self.message
        return f"{self.message}\n--- build log (tail) ---\n{self.log_tail}"


class BuildFailed(_LoggedBuildError):
    """The build itself failed (a RUN step, a COPY source, a Dockerfile syntax error)."""

    retryable = False  # deterministic: the same Dockerfile fails again anywhere


class BuildTimeout(_LoggedBuildError):
    """The build ran past its timeout and was killed."""


def _load_remedy(image: str) -> str:
    load = (f"on a machine with registry access run `docker pull {image}` and "
            f"`docker save {image} -o image.tar`, copy image.tar here and run "
            "`docker load -i image.tar`")
    if image.startswith("docker/dockerfile"):
        return ("it is the Dockerfile frontend named by a `# syntax=` line: delete that line "
                "(the engine's built-in frontend handles heredocs and COPY --from), or " + load)
    return (f"{load}; or start FROM {TASK_BASE_IMAGE} (built offline by "
            "`python -m terminal_rsi.sandbox.image build-task-base`)")


def _recipe_hash(*parts: str) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def recipe_hash() -> str:
    return _recipe_hash(_rootfs_key(), *PY_REQS, str(SANDBOX_UID), DOCKERFILE)


def task_base_recipe_hash() -> str:
    return _recipe_hash(_rootfs_key(), *PY_REQS, TASK_BASE_DOCKERFILE)


def default_cache_dir() -> str:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "terminal_rsi", "sandbox")


def _docker():
    import docker  # heavy: imported where used

    try:
        client = docker.from_env(timeout=600)
        client.ping()
    except Exception as e:  # noqa: BLE001 - any engine failure is infrastructure
        raise EngineUnavailable(f"cannot reach it: {e}") from e
    return client


def _has_image(client, tag: str):
    import docker  # the Docker SDK: an optional engine, loaded when a Docker backend is used

    try:
        return client.images.get(tag)
    except docker.errors.ImageNotFound:
        return None


def image_is_current(client, tag: str = DEFAULT_IMAGE, recipe: str | None = None) -> bool:
    """Is `tag` present with the recipe label `recipe` (default: the default image's)?"""
    img = _has_image(client, tag)
    want = recipe or recipe_hash()
    return img is not None and (img.labels or {}).get("terminal_rsi.recipe") == want


def _run(cmd: list[str], **kw) -> None:
    log.info("$ %s", " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        raise InfrastructureError(
            f"command failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-4000:]}"
        )


def _rootfs_tarball(cache_dir: str) -> str:
    """debootstrap a minbase rootfs (cached as a tarball keyed by suite/mirror/packages)."""
    os.makedirs(cache_dir, exist_ok=True)
    out = os.path.join(cache_dir, f"rootfs-{SUITE}-{_rootfs_key()}.tar")
    if os.path.exists(out):
        return out
    if shutil.which("debootstrap") is None:
        raise InfrastructureError(
            "debootstrap is not installed; `apt-get install -y debootstrap` (Debian) "
            "or run .ci/setup_sandbox.sh"
        )
    root = tempfile.mkdtemp(prefix="trsi-rootfs-")
    try:
        t0 = time.time()
        _run(["debootstrap", "--variant=minbase", "--include=" + ",".join(INCLUDE),
              SUITE, root, MIRROR])
        log.info("debootstrap took %.0fs", time.time() - t0)
        # Slim: apt lists, docs and caches are not needed in a sandbox.
        for rel in ("var/cache/apt", "var/lib/apt/lists", "usr/share/doc", "usr/share/man",
                    "usr/share/locale", "usr/share/info"):
            shutil.rmtree(os.path.join(root, rel), ignore_errors=True)
        tmp = out + ".tmp"
        _run(["tar", "-C", root, "--numeric-owner", "-cf", tmp, "."])
        os.replace(tmp, out)  # atomic: a crash leaves no half tarball
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return out


def _wheels(cache_dir: str) -> str:
    d = os.path.join(cache_dir, "wheels-" + hashlib.sha256("\0".join(PY_REQS).encode())
                     .hexdigest()[:12])
    if not os.path.isdir(d):
        tmp = tempfile.mkdtemp(prefix="trsi-wheels-", dir=cache_dir)
        _run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:",
              "--python-version", "3.11", "--platform", "any", "--implementation", "py",
              "-d", tmp, *PY_REQS])
        os.replace(tmp, d)
    return d


def _ensure_base(client, cache_dir: str, force: bool) -> None:
    """Import the debootstrap rootfs as BASE_TAG unless it is there already."""
    if force or _has_image(client, BASE_TAG) is None:
        tarball = _rootfs_tarball(cache_dir)
        with open(tarball, "rb") as f:
            repo, _, btag = BASE_TAG.partition(":")
            client.api.import_image_from_data(f, repository=repo, tag=btag)


def _recipe_context(dockerfile: str, wheel_dir: str) -> io.BytesIO:
    """A build context tar: the generated Dockerfile and the wheels."""
    ctx = io.BytesIO()
    with tarfile.open(fileobj=ctx, mode="w") as tf:
        data = dockerfile.encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
        tf.add(wheel_dir, arcname="wheels")
    ctx.seek(0)
    return ctx


def _build_recipe_image(tag: str, dockerfile: str, recipe: str, *, force: bool,
                        cache_dir: str | None) -> str:
    """Build (or reuse) an image FROM BASE_TAG with the wheels, labelled with its recipe."""
    client = _docker()
    if not force and image_is_current(client, tag, recipe):
        log.info("image %s is current (recipe %s)", tag, recipe)
        return tag
    cache_dir = cache_dir or default_cache_dir()
    _ensure_base(client, cache_dir, force)
    ctx = _recipe_context(dockerfile, _wheels(cache_dir))
    old = _has_image(client, tag)
    try:
        client.images.build(fileobj=ctx, custom_context=True, tag=tag, network_mode="none",
                            rm=True, forcerm=True, pull=False,
                            labels={"terminal_rsi.recipe": recipe})
    except Exception as e:  # noqa: BLE001
        logs = "".join(x.get("stream", "") for x in getattr(e, "build_log", []))
        raise BuildFailed(f"building {tag} failed: {e}", logs[-LOG_TAIL_CHARS:]) from e
    if old is not None and old.id != client.images.get(tag).id:
        try:  # drop the superseded image (ignored if a container still uses it)
            client.images.remove(old.id)
        except Exception:  # noqa: BLE001
            pass
    return tag


def build_default_image(tag: str = DEFAULT_IMAGE, *, force: bool = False,
                        cache_dir: str | None = None) -> str:
    """Build (or reuse) the default sandbox image; return its tag."""
    return _build_recipe_image(tag, DOCKERFILE, recipe_hash(), force=force, cache_dir=cache_dir)


def build_task_base_image(tag: str = TASK_BASE_IMAGE, force: bool = False,
                          cache_dir: str | None = None) -> str:
    """Build (or reuse) the offline stand-in for ``python:3.x-slim-bookworm``; return its tag.

    Root, no WORKDIR (``/``), no USER, ``LANG=C.UTF-8``, the PATH of Debian's python
    images, python3 (+ ``python``) with pytest and pytest-json-ctrf. Task fixtures say
    ``FROM trsi-task-base:bookworm``.
    """
    return _build_recipe_image(tag, TASK_BASE_DOCKERFILE, task_base_recipe_hash(),
                               force=force, cache_dir=cache_dir)


# -- task environments: a task's own Dockerfile, built by the engine (BuildKit) ----------

ENV_LABEL = "terminal_rsi.env"
ENV_TAG_PREFIX = "trsi-env"
LOG_TAIL_CHARS = 4000
_CLI_TIMEOUT_S = 120
_ENGINE_DOWN = ("cannot connect to the docker daemon", "error during connect",
                "buildx component is missing", "is the docker daemon running")
# In the CLI's `ERROR:` lines (never in RUN output, which BuildKit prefixes with `#N`).
_MISSING_IMAGE = (
    re.compile(r"failed to resolve source metadata for (\S+?):?(?:\s|$)", re.M),
    re.compile(r"pull access denied for (\S+?),"),
)
# Fallback: BuildKit's own metadata step for an image failed on the registry.
_METADATA_FAILED = re.compile(
    r"^#(\d+) \[internal\] load metadata for (\S+)$(?s:.*?)^#\1 ERROR: .*"
    r"(?:no such host|dial tcp|lookup|not found|pull access denied|unauthorized)", re.M)
_FROM = re.compile(r"^[ \t]*FROM[ \t]+(.+)$", re.I | re.M)
# .dockerignore patterns mirrored exactly: no `!` exceptions, character classes, escapes
# or anchors (their semantics differ across BuildKit versions); any of those in the file
# and the whole context is hashed instead (a superset: at worst a needless rebuild).
_UNMIRRORED = re.compile(r"[\[\]\\^]|^\*\*[^/]|^!")


@dataclass(frozen=True)
class ImageConfig:
    """What a container of an image starts with (from the engine's inspect data)."""

    workdir: str = "/"
    user: str = ""
    env: dict[str, str] = field(default_factory=dict)
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    labels: dict[str, str] = field(default_factory=dict)
    image_id: str = ""

    @classmethod
    def from_inspect(cls, data: dict) -> ImageConfig:
        c = data.get("Config") or {}
        env = dict(e.partition("=")[::2] for e in c.get("Env") or ())
        return cls(workdir=c.get("WorkingDir") or "/", user=c.get("User") or "", env=env,
                   entrypoint=tuple(c.get("Entrypoint") or ()), cmd=tuple(c.get("Cmd") or ()),
                   labels=dict(c.get("Labels") or {}), image_id=data.get("Id", ""))


def _cli(args: list[str], timeout: float = _CLI_TIMEOUT_S) -> subprocess.CompletedProcess:
    """Run ``docker ARGS`` (output captured); a missing CLI is EngineUnavailable."""
    try:
        return subprocess.run(["docker", *args], capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise EngineUnavailable("no `docker` CLI on PATH") from None
    except subprocess.TimeoutExpired:
        raise EngineUnavailable(f"`docker {args[0]}` did not answer in {timeout:.0f}s") from None


def _inspect(names: list[str]) -> list[dict]:
    """Inspect data of those of `names` that are present (an invalid reference is absent);
    an engine failure raises EngineUnavailable."""
    r = _cli(["image", "inspect", *names])
    errs = [ln for ln in r.stderr.splitlines() if ln.strip() and not any(
        s in ln.lower() for s in ("no such image", "invalid reference format"))]
    if r.returncode and errs:
        raise EngineUnavailable("\n".join(errs[-3:]))
    return json.loads(r.stdout or "[]")


def image_present(tag: str) -> bool:
    """Is `tag` (or an image id) present on the engine?"""
    return bool(_inspect([tag]))


def image_config(tag: str) -> ImageConfig:
    """The config (workdir, user, env, entrypoint, cmd) of a present image."""
    data = _inspect([tag])
    if not data:
        raise ImageMissing(tag)
    return ImageConfig.from_inspect(data[0])


def _resolve(context_dir: str, dockerfile: str) -> tuple[str, str]:
    ctx = os.path.abspath(context_dir)
    df = dockerfile if os.path.isabs(dockerfile) else os.path.join(ctx, dockerfile)
    if not os.path.isdir(ctx):
        raise BadRequest(f"build context {context_dir!r} is not a directory")
    if not os.path.isfile(df):
        raise BadRequest(f"Dockerfile {df!r} does not exist")
    return ctx, df


def _ignore_patterns(ctx: str, df: str) -> list[re.Pattern] | None:
    """The .dockerignore BuildKit applies (Dockerfile-specific first), compiled; None:
    hash everything (no ignore file, or one this module does not mirror)."""
    for f in (df + ".dockerignore", os.path.join(ctx, ".dockerignore")):
        if os.path.isfile(f):
            with open(f, encoding="utf-8", errors="surrogateescape") as fh:
                return _parse_ignore(fh.read())
    return None


def _clean_pattern(line: str) -> str:
    """A .dockerignore line as moby reads it: filepath.Clean, one leading `/` dropped."""
    p = posixpath.normpath(line)
    p = "/" + p.lstrip("/") if p.startswith("/") else p
    return p[1:] if len(p) > 1 and p[0] == "/" else p


def _parse_ignore(text: str) -> list[re.Pattern] | None:
    out = []
    for line in text.removeprefix("\ufeff").splitlines():
        line = "" if line.startswith("#") else line.strip()
        p = _clean_pattern(line) if line else ""
        if _UNMIRRORED.search(line) or _UNMIRRORED.search(p):
            return None
        if p and p != ".." and not p.startswith("../"):  # `..` patterns match nothing
            out.append(_glob_regex(p))
    return out


def _glob_regex(p: str) -> re.Pattern:
    """moby/patternmatcher's translation: `*` and `?` stop at `/`, `**` crosses it."""
    out, i = ["^"], 0
    while i < len(p):
        c, i = p[i], i + 1
        if c == "*" and p[i:i + 1] == "*":
            i += 1 + (p[i + 1:i + 2] == "/")
            out.append(".*" if i >= len(p) else "(.*/)?")
        elif c in "*?":
            out.append("[^/]*" if c == "*" else "[^/]")
        else:
            out.append(re.escape(c))
    return re.compile("".join(out) + r"\Z")


def _hash_tree(h, root: str, rel: str, ignore: list[re.Pattern]) -> None:
    """Feed `h` every entry under root/rel that the build sends: path, type, mode, content."""
    with os.scandir(os.path.join(root, rel)) as it:
        entries = sorted(it, key=lambda e: e.name)
    for e in entries:
        path = f"{rel}/{e.name}" if rel else e.name
        if any(p.match(path) for p in ignore):
            continue  # an excluded dir is excluded whole (no `!` exceptions are mirrored)
        st = e.stat(follow_symlinks=False)
        h.update(b"%s\0%o\0" % (os.fsencode(path), st.st_mode))
        if stat.S_ISLNK(st.st_mode):
            h.update(os.fsencode(os.readlink(e.path)))
        elif stat.S_ISREG(st.st_mode):
            with open(e.path, "rb") as f:
                h.update(hashlib.file_digest(f, "sha256").digest())
        elif stat.S_ISDIR(st.st_mode):
            _hash_tree(h, root, path, ignore)
        h.update(b"\0")


def context_digest(context_dir: str, dockerfile: str = "Dockerfile", *, network: bool = False,
                   build_args: Mapping[str, str] | None = None) -> str:
    """sha256 of what a build depends on, besides base images: the Dockerfile bytes, every
    file of the context that is sent (.dockerignore respected), build args, network."""
    ctx, df = _resolve(context_dir, dockerfile)
    h = hashlib.sha256(b"trsi-env-v1\0")
    with open(df, "rb") as f:
        h.update(hashlib.file_digest(f, "sha256").digest())
    h.update(json.dumps([sorted((build_args or {}).items()), bool(network)]).encode())
    _hash_tree(h, ctx, "", _ignore_patterns(ctx, df) or [])
    return h.hexdigest()


def _from_refs(dockerfile_text: str) -> list[str]:
    """Images named by FROM lines (not stages, not `$ARG` refs, not scratch): only to key
    the cache on their ids; the engine alone interprets the Dockerfile."""
    refs, stages = set(), set()
    for m in _FROM.finditer(dockerfile_text):
        words = [w for w in m.group(1).split() if not w.startswith("--")]
        if words and "$" not in words[0] and words[0].lower() not in stages | {"scratch"}:
            refs.add(words[0])
        if len(words) >= 3 and words[-2].lower() == "as":
            stages.add(words[-1].lower())
    return sorted(refs)


def env_hash(context_dir: str, dockerfile: str = "Dockerfile", *, network: bool = False,
             build_args: Mapping[str, str] | None = None) -> str:
    """The content hash of a task environment: context_digest plus the ids of the local
    images its FROM lines name (a rebuilt base image gives a new hash)."""
    _, df = _resolve(context_dir, dockerfile)
    digest = context_digest(context_dir, dockerfile, network=network, build_args=build_args)
    with open(df, encoding="utf-8", errors="replace") as f:
        refs = _from_refs(f.read())
    ids = sorted(d["Id"] for d in _inspect(refs)) if refs else []
    return hashlib.sha256("\0".join([digest, *ids]).encode()).hexdigest()[:20]


def _build_argv(ctx: str, df: str, tag: str, h: str, network: bool,
                build_args: Mapping[str, str] | None) -> list[str]:
    argv = ["docker", "build", "--progress=plain", f"--network={'host' if network else 'none'}",
            "-f", df, "-t", tag, "--label", f"{ENV_LABEL}={h}"]
    for k, v in sorted((build_args or {}).items()):
        argv += ["--build-arg", f"{k}={v}"]
    return [*argv, ctx]  # no --pull: BuildKit resolves local images first


def _tail(f, n: int) -> str:
    f.seek(0, os.SEEK_END)
    f.seek(max(0, f.tell() - n))
    return f.read().decode("utf-8", "replace")


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill the docker CLI's process group; the engine cancels the build with its session."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _run_build(argv: list[str], timeout_s: float | None) -> tuple[int, str]:
    """Run `docker build`; return (exit status, log tail). Past timeout_s: BuildTimeout."""
    env = {**os.environ, "DOCKER_BUILDKIT": "1"}
    with tempfile.TemporaryFile() as out:
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True, env=env)
        except FileNotFoundError:
            raise EngineUnavailable("no `docker` CLI on PATH") from None
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise BuildTimeout(f"docker build ran past its timeout ({timeout_s}s) and was "
                               "killed", _tail(out, LOG_TAIL_CHARS)) from None
        except BaseException:
            _kill_group(proc)
            raise
        return rc, _tail(out, 4 * LOG_TAIL_CHARS)


def _missing_image(errors: str, log_text: str) -> str | None:
    """The image a build could not resolve, from its `ERROR:` lines or its metadata steps."""
    m = next(filter(None, (rx.search(errors) for rx in _MISSING_IMAGE)), None)
    name = m.group(1) if m else None
    if name is None and (m := _METADATA_FAILED.search(log_text)):
        name = m.group(2)
    return name and name.removeprefix("docker.io/").removeprefix("library/")


def _build_error(rc: int, log_text: str, what: str) -> ImageError:
    """The typed error for a failed `docker build` from its output."""
    errors = "\n".join(ln for ln in log_text.splitlines() if ln.startswith("ERROR:"))
    if any(s in errors.lower() for s in _ENGINE_DOWN):
        return EngineUnavailable(errors)
    image = _missing_image(errors, log_text)
    if image:
        return BaseImageMissing(image)
    return BuildFailed(f"building {what} failed (docker build exit {rc})",
                       log_text[-LOG_TAIL_CHARS:])


def _untag(tag: str) -> None:
    """Remove `tag` if present (only the tag when another one names the same image)."""
    try:
        _cli(["image", "rm", tag])
    except EngineUnavailable:
        pass


def _tag(src: str, dst: str) -> None:
    r = _cli(["tag", src, dst])
    if r.returncode:
        raise ImageError(f"docker tag {src} {dst} failed: {r.stderr.strip()}")


def build_context_image(context_dir: str, dockerfile: str = "Dockerfile", *,
                        network: bool = False, timeout_s: float | None = None,
                        build_args: Mapping[str, str] | None = None,
                        tag_prefix: str = ENV_TAG_PREFIX) -> str:
    """Build a task's own Dockerfile with the engine (BuildKit); return ``PREFIX:HASH``.

    `dockerfile` is relative to `context_dir` or absolute. The tag's hash covers the
    Dockerfile, the context files that are sent, the build args, the network flag and the
    ids of the local base images; if that tag exists (with our label) nothing is built.
    Nothing is pulled: a missing base image raises BaseImageMissing. The build runs under
    a temporary tag that is renamed only once it succeeded, so an interrupted build never
    leaves a tag that looks cached. Errors: BaseImageMissing, BuildFailed, BuildTimeout
    (the docker CLI is killed past timeout_s), EngineUnavailable, BadRequest.
    """
    ctx, df = _resolve(context_dir, dockerfile)
    h = env_hash(ctx, df, network=network, build_args=build_args)
    tag = f"{tag_prefix}:{h}"
    found = _inspect([tag])
    if found and ImageConfig.from_inspect(found[0]).labels.get(ENV_LABEL) == h:
        return tag  # built before: nothing to do
    tmp = f"{tag_prefix}:build-{h}-{os.getpid()}-{secrets.token_hex(3)}"
    try:
        rc, log_text = _run_build(_build_argv(ctx, df, tmp, h, network, build_args), timeout_s)
        if rc:
            raise _build_error(rc, log_text, f"{df} (context {ctx})")
        _tag(tmp, tag)
    finally:
        _untag(tmp)
    log.info("built %s from %s", tag, df)
    return tag


def build_task_image(context_dir: str, tag: str, *, dockerfile: str = "Dockerfile") -> str:
    """Compatibility wrapper: build_context_image (offline, content-cached), also tagged
    `tag`; returns `tag`."""
    _tag(build_context_image(context_dir, dockerfile), tag)
    return tag


def _cli_main(args) -> str:
    if args.cmd == "build":
        return build_default_image(args.tag, force=args.force, cache_dir=args.cache_dir)
    if args.cmd == "build-task-base":
        return build_task_base_image(args.tag, force=args.force, cache_dir=args.cache_dir)
    build_args = dict(a.partition("=")[::2] for a in args.build_arg)
    tag = build_context_image(args.context, args.file, network=args.network,
                              timeout_s=args.timeout, build_args=build_args)
    if args.tag:
        _tag(tag, args.tag)
    return args.tag or tag


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m terminal_rsi.sandbox.image")
    sub = p.add_subparsers(dest="cmd", required=True)
    for name, default, what in (("build", DEFAULT_IMAGE, "the default sandbox image"),
                                ("build-task-base", TASK_BASE_IMAGE,
                                 "the python:3.x-slim-bookworm stand-in for task fixtures")):
        b = sub.add_parser(name, help=f"build {what} offline (cached)")
        b.add_argument("--tag", default=default)
        b.add_argument("--force", action="store_true")
        b.add_argument("--cache-dir", default=None)
    t = sub.add_parser("build-task", help="build a task's own Dockerfile (content-cached)")
    t.add_argument("context")
    t.add_argument("-f", "--file", default="Dockerfile",
                   help="Dockerfile, relative to CONTEXT or absolute")
    t.add_argument("--tag", default=None, help="also tag the image TAG")
    t.add_argument("--network", action="store_true", help="RUN steps get the host network")
    t.add_argument("--timeout", type=float, default=None)
    t.add_argument("--build-arg", action="append", default=[], metavar="KEY=VALUE")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    t0 = time.time()
    try:
        tag = _cli_main(args)
    except (InfrastructureError, BadRequest) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"{tag} ready ({time.time() - t0:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
