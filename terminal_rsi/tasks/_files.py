"""Shared helpers for the task-directory loaders: reading trees and reading Dockerfiles."""

from __future__ import annotations

import dataclasses
import os
import posixpath
import shlex

from terminal_rsi.tasks.spec import TaskFormatError

MAX_TREE_BYTES = 64 * 1024 * 1024
SKIP_NAMES = {"__pycache__", ".git", ".pytest_cache", ".DS_Store"}


def read_tree(root: str, *, what: str) -> dict[str, bytes]:
    """All regular files under `root` as {relative posix path: bytes} (caches skipped)."""
    out: dict[str, bytes] = {}
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_NAMES)
        for name in sorted(filenames):
            if name in SKIP_NAMES or name.endswith(".pyc"):
                continue
            full = os.path.join(dirpath, name)
            if not os.path.isfile(full):
                continue
            rel = os.path.relpath(full, root).replace(os.sep, "/")
            with open(full, "rb") as f:
                data = f.read()
            total += len(data)
            if total > MAX_TREE_BYTES:
                raise TaskFormatError(root, None, f"{what} is larger than {MAX_TREE_BYTES} bytes")
            out[rel] = data
    return out


def read_text(path: str, field: str | None = None) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        raise TaskFormatError(path, field, "file is missing") from None
    except UnicodeDecodeError as e:
        raise TaskFormatError(path, field, f"not UTF-8 text ({e})") from None


def number(value, file: str, field: str, *, default=None, positive: bool = True):
    """A positive number field (None -> default)."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TaskFormatError(file, field, f"expected a number of seconds, got {value!r}")
    if positive and not value > 0:
        raise TaskFormatError(file, field, f"must be > 0, got {value!r}")
    return float(value)


def string(value, file: str, field: str, *, default=None, required: bool = False):
    if value is None:
        if required:
            raise TaskFormatError(file, field, "is required")
        return default
    if not isinstance(value, str):
        raise TaskFormatError(file, field, f"expected a string, got {type(value).__name__}")
    if required and not value.strip():
        raise TaskFormatError(file, field, "is empty")
    return value


def string_list(value, file: str, field: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise TaskFormatError(file, field, f"expected a list of strings, got {value!r}")
    return tuple(value)


@dataclasses.dataclass(frozen=True)
class Dockerfile:
    """What a (simple) Dockerfile does, as far as a local sandbox can reproduce it.

    `files` are the COPY/ADD'ed local files that land under WORKDIR (workspace-relative);
    `setup` are the RUN commands; `unsupported` lists instructions that a local sandbox
    cannot reproduce (files copied outside WORKDIR, remote ADD, ...).
    """

    base_image: str
    workdir: str
    files: dict[str, bytes]
    setup: tuple[str, ...]
    env: dict[str, str]
    unsupported: tuple[str, ...]


def _logical_lines(text: str) -> list[str]:
    lines, cur = [], ""
    for raw in text.splitlines():
        s = raw.rstrip()
        if not cur and (not s.strip() or s.lstrip().startswith("#")):
            continue
        if s.endswith("\\"):
            cur += s[:-1] + " "
            continue
        cur += s
        lines.append(cur.strip())
        cur = ""
    if cur.strip():
        lines.append(cur.strip())
    return lines


def parse_dockerfile(path: str) -> Dockerfile:
    """Read FROM, WORKDIR, ENV, COPY/ADD (local sources) and RUN from a Dockerfile."""
    text = read_text(path, "Dockerfile")
    context = os.path.dirname(path)
    base, workdir = None, "/"
    files: dict[str, bytes] = {}
    setup: list[str] = []
    env: dict[str, str] = {}
    unsupported: list[str] = []
    for line in _logical_lines(text):
        op, _, rest = line.partition(" ")
        op = op.upper()
        rest = rest.strip()
        if op == "FROM":
            base = rest.split()[0] if rest else None
        elif op == "WORKDIR":
            workdir = posixpath.normpath(posixpath.join(workdir, rest))
        elif op == "ENV":
            if "=" in rest.split()[0]:
                for kv in shlex.split(rest):
                    k, _, v = kv.partition("=")
                    env[k] = v
            else:
                k, _, v = rest.partition(" ")
                env[k] = v.strip()
        elif op == "RUN":
            if rest.startswith("["):
                unsupported.append(f"exec-form RUN {rest}")
            else:
                setup.append(rest)
        elif op in ("COPY", "ADD"):
            try:
                parts = [p for p in shlex.split(rest) if not p.startswith("--")]
            except ValueError:
                unsupported.append(line)
                continue
            if len(parts) < 2:
                raise TaskFormatError(path, op, f"needs a source and a destination: {line!r}")
            *srcs, dst = parts
            dst_abs = posixpath.normpath(posixpath.join(workdir, dst))
            for src in srcs:
                if "://" in src:
                    unsupported.append(f"{op} of a remote source {src}")
                    continue
                full = os.path.normpath(os.path.join(context, src))
                if not os.path.exists(full):
                    raise TaskFormatError(path, op, f"source {src!r} does not exist in {context}")
                if os.path.isdir(full):
                    items = {
                        posixpath.join(dst_abs, rel): data
                        for rel, data in read_tree(full, what=src).items()
                    }
                else:
                    into_dir = dst.endswith("/") or len(srcs) > 1 or dst in (".", "./")
                    target = posixpath.join(dst_abs, os.path.basename(full)) if into_dir \
                        else dst_abs
                    with open(full, "rb") as f:
                        items = {target: f.read()}
                for target, data in items.items():
                    rel = posixpath.relpath(target, workdir)
                    if rel == ".." or rel.startswith("../"):
                        unsupported.append(f"{op} {src} to {target} (outside WORKDIR {workdir})")
                        continue
                    files[rel] = data
        elif op in ("CMD", "ENTRYPOINT", "LABEL", "EXPOSE", "USER", "ARG", "SHELL",
                    "HEALTHCHECK", "STOPSIGNAL", "VOLUME", "MAINTAINER", "ONBUILD"):
            continue
        else:
            raise TaskFormatError(path, op, f"unknown Dockerfile instruction in {line!r}")
    if base is None:
        raise TaskFormatError(path, "FROM", "the Dockerfile has no FROM line")
    return Dockerfile(base, workdir, files, tuple(setup), env, tuple(unsupported))
