"""Build the default Docker sandbox image from local material (no registry pulls).

    python -m terminal_rsi.sandbox.image build [--tag TAG] [--force] [--cache-dir DIR]
    python -m terminal_rsi.sandbox.image build-task CONTEXT_DIR --tag TAG

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
rebuilt. Tasks with their own Dockerfile start ``FROM terminal-rsi-sandbox:bookworm``
and are built with :func:`build_task_image` (no network during the build).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time

from terminal_rsi.sandbox.errors import InfrastructureError

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

DOCKERFILE = f"""\
FROM {BASE_TAG}
COPY wheels /tmp/wheels
RUN set -e; site=/usr/local/lib/python3.11/dist-packages; mkdir -p $site; \\
    for w in /tmp/wheels/*.whl; do python3 -m zipfile -e "$w" $site; done; \\
    rm -rf /tmp/wheels; \\
    printf '%s\\n' '#!/usr/bin/python3' 'import sys' 'from pytest import console_main' \\
      'sys.exit(console_main())' > /usr/local/bin/pytest; chmod 755 /usr/local/bin/pytest; \\
    echo 'sandbox:x:{SANDBOX_UID}:{SANDBOX_UID}:sandbox:/workspace:/bin/bash' >> /etc/passwd; \\
    echo 'sandbox:x:{SANDBOX_UID}:' >> /etc/group; \\
    mkdir -p /workspace; chown {SANDBOX_UID}:{SANDBOX_UID} /workspace; \\
    python3 -m pytest --version
USER {SANDBOX_UID}:{SANDBOX_UID}
WORKDIR /workspace
ENV HOME=/workspace LANG=C.UTF-8 PYTHONDONTWRITEBYTECODE=1 PATH=/usr/local/bin:/usr/bin:/bin
CMD ["sleep", "infinity"]
"""


def recipe_hash() -> str:
    h = hashlib.sha256()
    for part in (_rootfs_key(), *PY_REQS, str(SANDBOX_UID), DOCKERFILE):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def default_cache_dir() -> str:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "terminal_rsi", "sandbox")


def _docker():
    import docker  # heavy: imported where used

    try:
        client = docker.from_env(timeout=600)
        client.ping()
    except Exception as e:  # noqa: BLE001 - any engine failure is infrastructure
        raise InfrastructureError(
            f"cannot reach the Docker engine ({e}); start dockerd (see .ci/setup_sandbox.sh)"
        ) from e
    return client


def _has_image(client, tag: str):
    import docker  # the Docker SDK: an optional engine, loaded when a Docker backend is used

    try:
        return client.images.get(tag)
    except docker.errors.ImageNotFound:
        return None


def image_is_current(client, tag: str = DEFAULT_IMAGE) -> bool:
    img = _has_image(client, tag)
    return img is not None and (img.labels or {}).get("terminal_rsi.recipe") == recipe_hash()


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


def build_default_image(tag: str = DEFAULT_IMAGE, *, force: bool = False,
                        cache_dir: str | None = None) -> str:
    """Build (or reuse) the default sandbox image; return its tag."""
    client = _docker()
    if not force and image_is_current(client, tag):
        log.info("image %s is current (recipe %s)", tag, recipe_hash())
        return tag
    cache_dir = cache_dir or default_cache_dir()
    if force or _has_image(client, BASE_TAG) is None:
        tarball = _rootfs_tarball(cache_dir)
        with open(tarball, "rb") as f:
            repo, _, btag = BASE_TAG.partition(":")
            client.api.import_image_from_data(f, repository=repo, tag=btag)
    wheel_dir = _wheels(cache_dir)
    ctx = io.BytesIO()
    with tarfile.open(fileobj=ctx, mode="w") as tf:
        data = DOCKERFILE.encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
        tf.add(wheel_dir, arcname="wheels")
    ctx.seek(0)
    old = _has_image(client, tag)
    try:
        client.images.build(fileobj=ctx, custom_context=True, tag=tag, network_mode="none",
                            rm=True, forcerm=True, pull=False,
                            labels={"terminal_rsi.recipe": recipe_hash()})
    except Exception as e:  # noqa: BLE001
        logs = "".join(x.get("stream", "") for x in getattr(e, "build_log", []))[-4000:]
        raise InfrastructureError(f"building {tag} failed: {e}\n{logs}") from e
    if old is not None and old.id != client.images.get(tag).id:
        try:  # drop the superseded image (ignored if a container still uses it)
            client.images.remove(old.id)
        except Exception:  # noqa: BLE001
            pass
    return tag


def build_task_image(context_dir: str, tag: str, *, dockerfile: str = "Dockerfile") -> str:
    """Build a task's own Dockerfile (``FROM terminal-rsi-sandbox:bookworm``), offline."""
    import docker  # the Docker SDK: an optional engine, loaded when a Docker backend is used

    client = _docker()
    try:
        client.images.build(path=context_dir, dockerfile=dockerfile, tag=tag,
                            network_mode="none", rm=True, forcerm=True, pull=False)
    except docker.errors.BuildError as e:
        logs = "".join(x.get("stream", "") for x in e.build_log)[-4000:]
        raise InfrastructureError(f"building {tag} from {context_dir} failed: {e}\n{logs}") from e
    return tag


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m terminal_rsi.sandbox.image")
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build the default sandbox image (cached)")
    b.add_argument("--tag", default=DEFAULT_IMAGE)
    b.add_argument("--force", action="store_true")
    b.add_argument("--cache-dir", default=None)
    t = sub.add_parser("build-task", help="build a task Dockerfile on the default image")
    t.add_argument("context")
    t.add_argument("--tag", required=True)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    t0 = time.time()
    if args.cmd == "build":
        tag = build_default_image(args.tag, force=args.force, cache_dir=args.cache_dir)
    else:
        tag = build_task_image(args.context, args.tag)
    print(f"{tag} ready ({time.time() - t0:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
