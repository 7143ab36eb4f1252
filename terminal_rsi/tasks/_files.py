"""Shared helpers for the task-directory loaders: reading a task directory without ever
leaving it, field checks, and reading Dockerfiles.

A task directory is untrusted input (it may come from the internet), so every read goes
through `TaskDir`: a path is relative to the task directory (absolute paths and `..` are
refused), each of its components is opened relative to its parent's descriptor with
O_NOFOLLOW after an lstat (a symbolic link anywhere below the task directory is refused,
whatever it points to; so are FIFOs, sockets and devices, and directories where a file is
expected), a file's size is checked before it is read, and a tree's file count and bytes
are capped (`spec.MAX_TREE_FILES`, `spec.MAX_TREE_BYTES`, `spec.MAX_TREE_DEPTH`) before
anything past the cap is read. Every problem is a `TaskFormatError` naming the file and the field.
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
import shlex
import stat

from terminal_rsi.tasks import spec
from terminal_rsi.tasks.spec import (
    MAX_TEXT_FILE_BYTES,
    TaskFormatError,
    env_problem,
    number_problem,
)

SKIP_NAMES = {"__pycache__", ".git", ".pytest_cache", ".DS_Store"}

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO that slipped past the lstat never blocks
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


class _Missing(TaskFormatError):
    """A path component does not exist (TaskDir.kind answers None for it)."""


def _kind_name(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a regular file" if stat.S_ISREG(mode) else "a special file"


@dataclasses.dataclass
class TreeBudget:
    """Files and bytes still allowed in one tree (shared by every COPY of a Dockerfile)."""

    what: str
    # read when a budget is made (the caps are spec's module constants)
    max_files: int = dataclasses.field(default_factory=lambda: spec.MAX_TREE_FILES)
    max_bytes: int = dataclasses.field(default_factory=lambda: spec.MAX_TREE_BYTES)
    files: int = 0
    bytes: int = 0

    def check(self, path: str, field: str | None, size: int) -> None:
        """Refuse one more file that claims `size` bytes if it cannot fit."""
        if self.files + 1 > self.max_files:
            raise TaskFormatError(path, field, f"{self.what} holds more than {self.max_files} "
                                  "files; a task tree may hold at most that many")
        if self.bytes + size > self.max_bytes:
            raise TaskFormatError(path, field, f"{self.what} is larger than {self.max_bytes} "
                                  "bytes; a task tree may hold at most that much")

    def take(self, path: str, field: str | None, size: int) -> int:
        """Count one file that claims `size` bytes (refused if it cannot fit); the most bytes
        it may hold when read (`add` the bytes actually read)."""
        self.check(path, field, size)
        self.files += 1
        return self.max_bytes - self.bytes

    def add(self, path: str, field: str | None, n: int) -> None:
        self.bytes += n
        if self.bytes > self.max_bytes:
            raise TaskFormatError(path, field, f"{self.what} is larger than {self.max_bytes} "
                                  "bytes; a task tree may hold at most that much")


class TaskDir:
    """A task directory whose files are read without ever leaving it (module doc).

    The directory itself is resolved once (the path the user named is trusted, whatever
    links lead to it); below it nothing is followed. Paths are POSIX-style, relative to the
    task directory; error messages name `path(rel)`, under the name the user gave.
    """

    def __init__(self, root: str):
        self.given = os.path.abspath(root)
        self.root = os.path.realpath(root)
        if not os.path.isdir(self.root):
            raise TaskFormatError(self.given, None, "no such directory")

    def path(self, rel: str) -> str:
        """The path of `rel` as the user sees it (for messages and `Task.source`)."""
        return os.path.join(self.given, *rel.split("/")) if rel else self.given

    def _parts(self, rel: str, field: str | None) -> list[str]:
        if not isinstance(rel, str) or "\0" in rel:
            raise TaskFormatError(self.given, field, f"bad path {rel!r}")
        if rel.startswith("/"):
            raise TaskFormatError(rel, field, "is an absolute path; task files are read only "
                                  f"from inside the task directory {self.given}")
        norm = posixpath.normpath(rel)
        if norm == ".." or norm.startswith("../"):
            raise TaskFormatError(self.path(rel), field, "leaves the task directory "
                                  f"{self.given}")
        return [] if norm == "." else norm.split("/")

    def _refuse(self, st: os.stat_result, rel: str, field: str | None, *, want_dir: bool,
                dir_fd: int | None = None, name: str = "") -> None:
        """TaskFormatError unless `st` is what is expected (a directory or a regular file)."""
        mode = st.st_mode
        if want_dir and stat.S_ISDIR(mode) or not want_dir and stat.S_ISREG(mode):
            return
        what = _kind_name(mode)
        if stat.S_ISLNK(mode):
            try:
                target = os.readlink(name, dir_fd=dir_fd) if dir_fd is not None else "?"
            except OSError:
                target = "?"
            raise TaskFormatError(self.path(rel), field, f"is a symbolic link (to {target!r}); "
                                  "task files must be real files inside the task directory, "
                                  "so links are refused")
        expected = "a directory" if want_dir else "a regular file"
        raise TaskFormatError(self.path(rel), field, f"is {what}; expected {expected}")

    def _open(self, parts: list[str], field: str | None, *, want_dir: bool) -> int:
        """A descriptor of root/parts, no component followed if it is a link."""
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for i, name in enumerate(parts):
                rel = "/".join(parts[:i + 1])
                is_dir = want_dir or i < len(parts) - 1
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    raise _Missing(self.path(rel), field, "is missing") from None
                except OSError as e:
                    raise TaskFormatError(self.path(rel), field, f"cannot be read ({e.strerror})"
                                          ) from None
                self._refuse(st, rel, field, want_dir=is_dir, dir_fd=fd, name=name)
                try:
                    nfd = os.open(name, _DIR_FLAGS if is_dir else _FILE_FLAGS, dir_fd=fd)
                except OSError as e:
                    raise TaskFormatError(self.path(rel), field, f"cannot be opened "
                                          f"({e.strerror})") from None
                os.close(fd)
                fd = nfd
                now = os.fstat(fd)
                if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                    raise TaskFormatError(self.path(rel), field, "changed while it was read")
                self._refuse(now, rel, field, want_dir=is_dir)
            return fd
        except BaseException:
            os.close(fd)
            raise

    def kind(self, rel: str, field: str | None = None) -> str | None:
        """None if `rel` does not exist, else "file", "dir", "link" or "other" (its parent
        directories must be real directories: a link on the way is a TaskFormatError)."""
        parts = self._parts(rel, field)
        if not parts:
            return "dir"
        try:
            fd = self._open(parts[:-1], field, want_dir=True)
        except _Missing:
            return None
        try:
            st = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise TaskFormatError(self.path(rel), field, f"cannot be read ({e.strerror})"
                                  ) from None
        finally:
            os.close(fd)
        if stat.S_ISLNK(st.st_mode):
            return "link"
        if stat.S_ISDIR(st.st_mode):
            return "dir"
        return "file" if stat.S_ISREG(st.st_mode) else "other"

    def exists(self, rel: str, field: str | None = None) -> bool:
        """Whether `rel` exists as anything (a link or a directory where a file is expected
        counts, so that reading it refuses it by name instead of the loader ignoring it)."""
        return self.kind(rel, field) is not None

    def read_bytes(self, rel: str, field: str | None, *, limit: int = MAX_TEXT_FILE_BYTES,
                   budget: TreeBudget | None = None) -> bytes:
        """The contents of the regular file `rel` (at most `limit` bytes, else an error;
        counted against `budget` if given)."""
        fd = self._open(self._parts(rel, field), field, want_dir=False)
        with os.fdopen(fd, "rb", buffering=0) as f:
            return self._read_counted(f, rel, field, limit, budget)

    def _read_counted(self, f, rel: str, field: str | None, limit: int,
                      budget: TreeBudget | None) -> bytes:
        if budget is None:
            return self._read_capped(f, rel, field, limit)
        room = budget.take(self.path(rel), field, os.fstat(f.fileno()).st_size)
        data = self._read_capped(f, rel, field, min(limit, room))
        budget.add(self.path(rel), field, len(data))
        return data

    def _read_capped(self, f, rel: str, field: str | None, limit: int) -> bytes:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise TaskFormatError(self.path(rel), field, f"is {size} bytes; the limit is "
                                  f"{limit}")
        chunks, n = [], 0
        while n <= limit:
            chunk = f.read(min(1 << 20, limit + 1 - n))
            if not chunk:
                break
            chunks.append(chunk)
            n += len(chunk)
        if n > limit:
            raise TaskFormatError(self.path(rel), field, f"is larger than {limit} bytes")
        return b"".join(chunks)

    def read_text(self, rel: str, field: str | None, *,
                  limit: int = MAX_TEXT_FILE_BYTES) -> str:
        """The UTF-8 text of the regular file `rel` (at most `limit` bytes)."""
        data = self.read_bytes(rel, field, limit=limit)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise TaskFormatError(self.path(rel), field, f"not UTF-8 text ({e})") from None

    def read_tree(self, rel: str, field: str | None, *,
                  budget: TreeBudget | None = None) -> dict[str, bytes]:
        """Every regular file below the directory `rel` as {relative posix path: bytes}
        (caches skipped); links and special files are refused by name, and the tree's file
        count and bytes are capped by `budget` (default: one fresh `TreeBudget`)."""
        budget = budget or TreeBudget(f"the tree {self.path(rel)}")
        top = self._open(self._parts(rel, field), field, want_dir=True)
        out: dict[str, bytes] = {}
        stack = [(top, "", 0)]
        try:
            while stack:
                dfd, prefix, depth = stack.pop()
                try:
                    self._read_dir(dfd, rel, prefix, depth, field, budget, out, stack)
                finally:
                    os.close(dfd)
        finally:
            for dfd, _, _ in stack:
                os.close(dfd)
        return dict(sorted(out.items()))

    def _read_dir(self, dfd, rel, prefix, depth, field, budget, out, stack) -> None:
        names = []
        with os.scandir(dfd) as it:
            for entry in it:
                if entry.name in SKIP_NAMES or entry.name.endswith(".pyc"):
                    continue
                names.append(entry.name)
                if len(names) > budget.max_files:
                    raise TaskFormatError(self.path(posixpath.join(rel, prefix)), field,
                                          f"{budget.what} holds more than {budget.max_files} "
                                          "entries in one directory")
        for name in sorted(names):
            sub = prefix + name
            full = posixpath.join(rel, sub) if rel else sub
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(st.st_mode):
                if depth + 1 > spec.MAX_TREE_DEPTH:
                    raise TaskFormatError(self.path(full), field, f"{budget.what} nests "
                                          f"directories deeper than {spec.MAX_TREE_DEPTH} "
                                          "levels")
                nfd = os.open(name, _DIR_FLAGS, dir_fd=dfd)
                now = os.fstat(nfd)
                if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                    os.close(nfd)
                    raise TaskFormatError(self.path(full), field, "changed while it was read")
                stack.append((nfd, sub + "/", depth + 1))
                continue
            self._refuse(st, full, field, want_dir=False, dir_fd=dfd, name=name)
            budget.check(self.path(full), field, st.st_size)  # refused before it is opened
            try:
                fd = os.open(name, _FILE_FLAGS, dir_fd=dfd)
            except OSError as e:
                raise TaskFormatError(self.path(full), field, f"cannot be opened "
                                      f"({e.strerror})") from None
            with os.fdopen(fd, "rb", buffering=0) as f:
                now = os.fstat(fd)
                if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                    raise TaskFormatError(self.path(full), field, "changed while it was read")
                self._refuse(now, full, field, want_dir=False)
                out[sub] = self._read_counted(f, full, field, budget.max_bytes, budget)


def number(value, file: str, field: str, *, default=None, hi: float, unit: str = "seconds"):
    """A positive, finite number field at most `hi` (None -> default), as a float."""
    if value is None:
        return default
    problem = number_problem(value, hi)
    if problem:
        raise TaskFormatError(file, field, f"{problem} ({unit})")
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
        raise TaskFormatError(file, field, f"expected a list of strings, got {str(value)[:80]}")
    return tuple(value)


def env_table(value, file: str, field: str) -> dict[str, str]:
    """A table of environment variables (names and values checked; None -> {})."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TaskFormatError(file, field, "expected a table of strings")
    for k, v in value.items():
        problem = env_problem(k, v)
        if problem:
            raise TaskFormatError(file, field, problem)
    return dict(value)


@dataclasses.dataclass(frozen=True)
class Dockerfile:
    """What a (simple) Dockerfile does, as far as a local sandbox can reproduce it.

    `files` are the COPY/ADD'ed local files that land under WORKDIR (workspace-relative);
    `setup` are the RUN commands; `unsupported` lists instructions that a local sandbox
    cannot reproduce (files copied outside WORKDIR, remote ADD, wildcards, COPY --from ...).
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


def _env_pairs(rest: str, path: str) -> list[tuple[str, str]]:
    """The (name, value) pairs of an ENV line (`ENV A=1 B="x y"` or `ENV A value`)."""
    if not rest:
        raise TaskFormatError(path, "ENV", "an ENV line needs a name and a value")
    if "=" in rest.split()[0]:
        try:
            words = shlex.split(rest)
        except ValueError as e:
            raise TaskFormatError(path, "ENV", f"cannot be split into words ({e}): "
                                  f"{rest[:80]!r}") from None
        pairs = [tuple(kv.partition("=")[::2]) for kv in words]
    else:
        k, _, v = rest.partition(" ")
        pairs = [(k, v.strip())]
    for k, v in pairs:
        problem = env_problem(k, v)
        if problem:
            raise TaskFormatError(path, "ENV", problem)
    return pairs


def _source(src: str, context: str, path: str, op: str) -> str:
    """A COPY/ADD source as a task-directory-relative path inside the build context."""
    where = f"the build context {context or '.'}/"
    if src.startswith("/"):
        raise TaskFormatError(path, op, f"source {src!r} is an absolute path; COPY/ADD "
                              f"sources are read from {where} only")
    norm = posixpath.normpath(src)
    if norm == ".." or norm.startswith("../"):
        raise TaskFormatError(path, op, f"source {src!r} leaves {where}; COPY/ADD sources "
                              "are read from inside it only")
    if norm == ".":
        return context
    return posixpath.join(context, norm) if context else norm


def parse_dockerfile(td: TaskDir, rel: str) -> Dockerfile:
    """Read FROM, WORKDIR, ENV, COPY/ADD (local sources) and RUN from the Dockerfile `rel` of
    the task directory `td`; its directory is the build context, which COPY/ADD sources may
    not leave (absolute and `..` sources are refused, links are refused) and whose copied
    files together are capped like one tree."""
    path = td.path(rel)
    text = td.read_text(rel, "Dockerfile")
    context = posixpath.dirname(rel)
    budget = TreeBudget(f"what {path} copies")
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
            env.update(_env_pairs(rest, path))
        elif op == "RUN":
            if rest.startswith("["):
                unsupported.append(f"exec-form RUN {rest}")
            else:
                setup.append(rest)
        elif op in ("COPY", "ADD"):
            try:
                words = shlex.split(rest)
            except ValueError:
                unsupported.append(line)
                continue
            options = [p for p in words if p.startswith("--")]
            parts = [p for p in words if not p.startswith("--")]
            if any(o.startswith("--from") for o in options):
                unsupported.append(f"{op} from another build stage or image: {line}")
                continue
            if len(parts) < 2:
                raise TaskFormatError(path, op, f"needs a source and a destination: {line!r}")
            *srcs, dst = parts
            dst_abs = posixpath.normpath(posixpath.join(workdir, dst))
            for src in srcs:
                if "://" in src:
                    unsupported.append(f"{op} of a remote source {src}")
                    continue
                src_rel = _source(src, context, path, op)
                if any(c in src for c in "*?["):
                    unsupported.append(f"{op} of a wildcard source {src}")
                    continue
                kind = td.kind(src_rel, op)
                if kind is None:
                    raise TaskFormatError(path, op, f"source {src!r} does not exist in "
                                          f"{td.path(context)}")
                if kind == "dir":
                    items = {posixpath.join(dst_abs, r): data
                             for r, data in td.read_tree(src_rel, op, budget=budget).items()}
                else:
                    into_dir = dst.endswith("/") or len(srcs) > 1 or dst in (".", "./")
                    target = posixpath.join(dst_abs, posixpath.basename(src_rel)) if into_dir \
                        else dst_abs
                    items = {target: td.read_bytes(src_rel, op, limit=budget.max_bytes,
                                                   budget=budget)}
                for target, data in items.items():
                    rel_target = posixpath.relpath(target, workdir)
                    if rel_target == ".." or rel_target.startswith("../"):
                        unsupported.append(f"{op} {src} to {target} (outside WORKDIR {workdir})")
                        continue
                    files[rel_target] = data
        elif op in ("CMD", "ENTRYPOINT", "LABEL", "EXPOSE", "USER", "ARG", "SHELL",
                    "HEALTHCHECK", "STOPSIGNAL", "VOLUME", "MAINTAINER", "ONBUILD"):
            continue
        else:
            raise TaskFormatError(path, op[:40], f"unknown Dockerfile instruction in "
                                  f"{line[:200]!r}")
    if base is None:
        raise TaskFormatError(path, "FROM", "the Dockerfile has no FROM line")
    return Dockerfile(base, workdir, files, tuple(setup), env, tuple(unsupported))
