"""Shared helpers for the task-directory loaders: reading a task directory without ever
leaving it, field checks, and reading a Dockerfile for what a local sandbox could reproduce
of it (`parse_dockerfile`; the Docker backend builds the Dockerfile itself).

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

import bisect
import dataclasses
import json
import os
import posixpath
import re
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


class BudgetSpent(TaskFormatError):
    """A tree would pass its file or byte cap (nothing past the cap was read)."""


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
            raise BudgetSpent(path, field, f"{self.what} holds more than {self.max_files} "
                              "files; a task tree may hold at most that many")
        if self.bytes + size > self.max_bytes:
            raise BudgetSpent(path, field, f"{self.what} is larger than {self.max_bytes} "
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
            raise BudgetSpent(path, field, f"{self.what} is larger than {self.max_bytes} "
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
                    raise BudgetSpent(self.path(posixpath.join(rel, prefix)), field,
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


# ----------------------------------------------------------------------------- Dockerfiles
#
# The Docker backend hands a task's Dockerfile to the engine, which builds it; nothing here
# decides what that build does. `parse_dockerfile` only tells the local backend which part
# of the image it could reproduce on the host's userland (COPY'd files under WORKDIR, RUN
# lines, ENV values), and names everything else in `unsupported`: it never makes a task
# fail to load. COPY sources are still read only through `TaskDir` (never a link, never a
# path leaving the build context or the task directory, never past the tree caps): such a
# source is an `unsupported` entry naming the refusal, because the local path cannot use it,
# while the engine resolves its build context on its own terms (BuildKit never follows a
# context link out of the context, and refuses sources outside it).

DEBIAN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# instructions that do not change the files, commands or variables the local path uses
_NO_EFFECT = frozenset({"CMD", "ENTRYPOINT", "LABEL", "EXPOSE", "USER", "HEALTHCHECK",
                        "STOPSIGNAL", "VOLUME", "MAINTAINER", "ONBUILD"})
_ARCHIVES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".tar.zst")
_HEREDOC = re.compile(r"(?<!<)<<(?!<)(-?)([\"']?)([A-Za-z_][A-Za-z0-9_]*)\2")
_DIRECTIVE = re.compile(r"#\s*([A-Za-z]+)\s*=\s*(\S+)\s*$")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BRACED = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(?::([-+])(.*))?", re.S)
_VAR_REF = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)|([A-Za-z_][A-Za-z0-9_]*))")
_SHOW = 200


@dataclasses.dataclass(frozen=True)
class Dockerfile:
    """What a Dockerfile's final image holds, as far as a local sandbox can reproduce it.

    `base_image` is the final stage's FROM image (None: no FROM line); `workdir` its last
    WORKDIR (None: none, or one that depends on what the base image sets); `files` the
    COPY/ADD'ed local files that land under WORKDIR (workspace-relative); `setup` the RUN
    commands; `env` the ENV values, expanded; `unsupported` every step a local sandbox
    cannot reproduce, each naming its instruction.
    """

    base_image: str | None
    workdir: str | None
    files: dict[str, bytes]
    setup: tuple[str, ...]
    env: dict[str, str]
    unsupported: tuple[str, ...]


class _NotHere(ValueError):
    """A Dockerfile construct the local path cannot reproduce (the message says why)."""


@dataclasses.dataclass
class _Stage:
    base: str | None
    cwd: str | None = "/"  # where relative destinations land (None: not known here)
    workdir: str | None = None
    files: dict[str, bytes] = dataclasses.field(default_factory=dict)
    setup: list[str] = dataclasses.field(default_factory=list)
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    args: set[str] = dataclasses.field(default_factory=set)
    unsupported: list[str] = dataclasses.field(default_factory=list)

    def child(self) -> _Stage:
        """A stage built FROM this one (it inherits files, commands and variables)."""
        return _Stage(self.base, self.cwd, self.workdir, dict(self.files), list(self.setup),
                      dict(self.env), set(), list(self.unsupported))


@dataclasses.dataclass
class _Build:
    td: TaskDir
    path: str  # the Dockerfile, as the user names it
    context: str  # the build context, task-directory-relative ("" = the task directory)
    budget: TreeBudget
    ignore_file: bool  # the context has a .dockerignore (not applied here)
    spent: bool = False  # the copied files reached the tree caps: nothing more is read
    stage: _Stage | None = None
    stages: dict[str, _Stage] = dataclasses.field(default_factory=dict)
    global_args: dict[str, str | None] = dataclasses.field(default_factory=dict)
    before_from: list[str] = dataclasses.field(default_factory=list)

    def note(self, what: str) -> None:
        (self.stage.unsupported if self.stage else self.before_from).append(what)


def _cut(text: str) -> str:
    line = text.split("\n", 1)[0].strip()
    return line if len(line) <= _SHOW else line[:_SHOW] + "..."


def _abs(path: str) -> str:
    return "/" + posixpath.normpath("/" + path).lstrip("/")


def _escape_char(lines: list[str]) -> str:
    """The `# escape=` parser directive of the Dockerfile's first lines (default `\\`)."""
    for line in lines:
        m = _DIRECTIVE.match(line.strip())
        if not m:
            break
        if m.group(1).lower() == "escape" and m.group(2) in ("\\", "`"):
            return m.group(2)
    return "\\"


def _heredoc_end(lines: list[str], index: dict[str, list[int]], start: int,
                 line: str) -> int:
    """Where the heredoc bodies named in a RUN/COPY/ADD `line` end (the index of the line
    after the last terminator); `start` if it has none or a terminator never comes.
    `index`: line text (also with leading tabs stripped, for `<<-`) -> its line numbers."""
    i = start
    for m in _HEREDOC.finditer(line):
        dash, word = m.group(1), m.group(3)
        found = index.get(("\t" if dash else "") + word, [])
        k = bisect.bisect_left(found, i)
        if k == len(found):
            return start
        i = found[k] + 1
    return i


def _line_index(lines: list[str]) -> dict[str, list[int]]:
    index: dict[str, list[int]] = {}
    for n, text in enumerate(lines):
        index.setdefault(text, []).append(n)
        index.setdefault("\t" + text.lstrip("\t"), []).append(n)
    return index


def _instructions(text: str) -> list[tuple[str, bool]]:
    """The Dockerfile's instructions as (text, has a heredoc): continuation lines joined as
    Docker joins them (comment and empty lines inside a continuation dropped), heredoc
    bodies kept with their instruction."""
    lines = text.splitlines()
    cont = re.compile(re.escape(_escape_char(lines)) + r"[ \t]*$")
    index = _line_index(lines)
    out: list[tuple[str, bool]] = []
    cur: str | None = None
    i = 0
    while i < len(lines):
        raw = lines[i]
        i += 1
        if not raw.strip() or raw.strip().startswith("#"):
            continue
        m = cont.search(raw)
        if m:
            cur = (cur or "") + raw[:m.start()]
            continue
        line = ((cur or "") + raw).strip()
        cur = None
        end = i
        if line.split(None, 1)[0].upper() in ("RUN", "COPY", "ADD"):
            end = _heredoc_end(lines, index, i, line)
        out.append(("\n".join([line, *lines[i:end]]), end > i))
        i = end
    if cur and cur.strip():
        out.append((cur.strip(), False))
    return out


def closing_brace(text: str, start: int) -> int:
    """The index of the `}` closing a `${` whose body starts at `start` (-1: none)."""
    depth, i = 1, start
    while i < len(text):
        if text.startswith("${", i):
            depth, i = depth + 1, i + 2
            continue
        if text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1


class _Words:
    """Docker's word processing of ENV, WORKDIR, COPY and ADD arguments: quotes, backslash
    escapes, and `$VAR`, `${VAR}`, `${VAR:-word}`, `${VAR:+word}` from the stage's earlier
    ENV lines (PATH, when no ENV set it: the standard Debian PATH). A variable this
    Dockerfile did not set (a build argument, or one its base image may set) cannot be
    expanded honestly: `split` raises _NotHere naming it."""

    def __init__(self, env: dict[str, str], args: set[str]):
        self.env, self.args = env, args
        self.unknown: list[str] = []

    def split(self, text: str, *, words: bool = True) -> list[str]:
        try:
            out = self._split(text, words)
        except RecursionError:
            raise _NotHere("nests substitutions too deeply") from None
        if self.unknown:
            raise _NotHere(self._unknown_text())
        return out

    def _unknown_text(self) -> str:
        names = sorted(set(self.unknown))
        args = [n for n in names if n in self.args]
        if args:
            return f"uses the build argument {', '.join(args)}, whose value is not known here"
        return (f"uses ${names[0]}, which this Dockerfile does not set (its base image may), "
                "so it cannot be expanded here")

    def _split(self, text: str, words: bool) -> list[str]:
        out: list[str] = []
        cur: list[str] = []
        quoted, i = False, 0
        while i < len(text):
            c = text[i]
            if words and c.isspace():
                if cur or quoted:
                    out.append("".join(cur))
                cur, quoted, i = [], False, i + 1
            elif c == "\\" and i + 1 < len(text):
                cur.append(text[i + 1])
                i += 2
            elif c == "'":
                end = text.find("'", i + 1)
                if end < 0:
                    raise _NotHere(f"cannot be split into words (an unclosed ') in "
                                   f"{_cut(text)!r}")
                cur.append(text[i + 1:end])
                quoted, i = True, end + 1
            elif c == '"':
                quoted, i = True, self._double(text, i + 1, cur)
            elif c == "$":
                i = self._dollar(text, i, cur)
            else:
                cur.append(c)
                i += 1
        if cur or quoted:
            out.append("".join(cur))
        return out

    def _double(self, text: str, i: int, cur: list[str]) -> int:
        while i < len(text) and text[i] != '"':
            if text[i] == "\\" and text[i + 1:i + 2] in ('"', "\\", "$"):
                cur.append(text[i + 1])
                i += 2
            elif text[i] == "$":
                i = self._dollar(text, i, cur)
            else:
                cur.append(text[i])
                i += 1
        if i >= len(text):
            raise _NotHere(f'cannot be split into words (an unclosed ") in {_cut(text)!r}')
        return i + 1

    def _dollar(self, text: str, i: int, cur: list[str]) -> int:
        if text.startswith("${", i):
            end = closing_brace(text, i + 2)
            if end < 0:
                raise _NotHere(f"has an unclosed ${{ in {_cut(text)!r}")
            cur.append(self._braced(text[i + 2:end]))
            return end + 1
        m = _NAME.match(text, i + 1)
        if not m:
            cur.append("$")
            return i + 1
        cur.append(self._lookup(m.group()) or "")
        return m.end()

    def _braced(self, inner: str) -> str:
        m = _BRACED.fullmatch(inner)
        if not m:
            raise _NotHere(f"uses ${{{inner[:80]}}}, a substitution this reader does not know")
        name, op, word = m.groups()
        value = self._lookup(name)
        if op == "-":
            return value if value else "".join(self._split(word, False))
        if op == "+":
            return "".join(self._split(word, False)) if value else ""
        return value or ""

    def _lookup(self, name: str) -> str | None:
        if name in self.env:
            return self.env[name]
        if name == "PATH":
            return DEBIAN_PATH
        self.unknown.append(name)
        return None


def _from_image(b: _Build, image: str) -> str:
    """A FROM image with the global ARG defaults expanded (raises _NotHere)."""
    known = {k: v for k, v in b.global_args.items() if v is not None}
    words = _Words(known, set(b.global_args)).split(image, words=False)
    if not words or not words[0]:
        raise _NotHere("the image name is empty")
    return words[0]


def _from(b: _Build, rest: str) -> None:
    """FROM [--platform=...] image [AS name]: a new stage (from an earlier one, if named)."""
    words = [w for w in rest.split() if not w.startswith("--")]
    image = words[0] if words else None
    alias = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
    problem = None if image else "FROM without an image"
    if image and "$" in image:
        try:
            image = _from_image(b, image)
        except _NotHere as e:
            problem = f"FROM {_cut(rest)}: {e}"
    earlier = b.stages.get(image.lower()) if image else None
    b.stage = earlier.child() if earlier else _Stage(image)
    if alias:
        b.stages[alias.lower()] = b.stage
    if problem:
        b.note(problem)


def _arg(b: _Build, rest: str) -> None:
    for word in rest.split():
        name, eq, default = word.partition("=")
        if b.stage is None:
            b.global_args[name] = default.strip("\"'") if eq else None
        else:
            b.stage.args.add(name)


def _workdir(b: _Build, op: str, rest: str, line: str) -> None:
    st = b.stage
    try:
        path = "".join(_Words(st.env, st.args).split(rest, words=False)).strip()
    except _NotHere as e:
        b.note(f"WORKDIR {_cut(rest)}: {e}")
        st.cwd = st.workdir = None
        return
    if not path:
        b.note("WORKDIR without a path")
        return
    st.cwd = st.workdir = _abs(path) if path.startswith("/") else (
        _abs(posixpath.join(st.cwd, path)) if st.cwd is not None else None)


def _env_pairs(st: _Stage, rest: str) -> list[tuple[str, str]]:
    """The (name, value) pairs of an ENV line (`ENV A=1 B="x y"` or `ENV A value`), values
    expanded against the stage's earlier ENV lines (raises _NotHere)."""
    if not rest:
        raise _NotHere("an ENV line needs a name and a value")
    words = _Words(st.env, st.args)
    if "=" in rest.split()[0]:
        pairs = [tuple(w.partition("=")[::2]) for w in words.split(rest)]
    else:
        name, _, value = rest.partition(" ")
        pairs = [(name, "".join(words.split(value.strip(), words=False)))]
    for name, value in pairs:
        problem = env_problem(name, value)
        if problem:
            raise _NotHere(problem)
    return pairs


def _env(b: _Build, op: str, rest: str, line: str) -> None:
    st = b.stage
    try:
        pairs = dict(_env_pairs(st, rest))
    except _NotHere as e:
        b.note(f"ENV {_cut(rest)}: {e}")
        return
    if len(st.env.keys() | pairs.keys()) > spec.MAX_ENV_ENTRIES:
        b.note(f"ENV {_cut(rest)}: more than {spec.MAX_ENV_ENTRIES} variables")
        return
    st.env.update(pairs)


def _run_command(st: _Stage, rest: str) -> str:
    """The shell command of a RUN line (raises _NotHere for what the local path cannot run:
    --mount other than cache/tmpfs, a bad exec form, a build argument)."""
    while rest.startswith("--"):
        flag, _, rest = rest.partition(" ")
        rest = rest.strip()
        harmless = flag.startswith("--network=") or flag.startswith("--mount=") and (
            "type=cache" in flag or "type=tmpfs" in flag)
        if not harmless:
            raise _NotHere(f"uses {flag[:80]}")
    if rest.startswith("["):
        try:
            argv = json.loads(rest)
        except ValueError:
            argv = None
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise _NotHere("is neither a JSON list of strings nor a shell command")
        rest = shlex.join(argv)
    refs = {a or b for a, b in _VAR_REF.findall(rest)} & (st.args - st.env.keys())
    if refs:
        raise _NotHere(f"uses the build argument {', '.join(sorted(refs))}, whose value is "
                       "not known here")
    return rest


def _run(b: _Build, op: str, rest: str, line: str) -> None:
    try:
        b.stage.setup.append(_run_command(b.stage, rest))
    except _NotHere as e:
        b.note(f"RUN {_cut(rest)}: {e}")


def _shell(b: _Build, op: str, rest: str, line: str) -> None:
    try:
        argv = json.loads(rest)
    except ValueError:
        argv = None
    ok = isinstance(argv, list) and len(argv) >= 2 and argv[-1] == "-c" and all(
        isinstance(a, str) for a in argv) and posixpath.basename(argv[0]) in ("sh", "bash")
    if not ok:
        b.note(f"SHELL {_cut(rest)}: RUN lines run under bash -c in a local sandbox")


def _copy_words(st: _Stage, rest: str) -> list[str]:
    """COPY/ADD arguments: the JSON form or words, variables expanded (raises _NotHere)."""
    words = _Words(st.env, st.args)
    if rest.startswith("["):
        try:
            items = json.loads(rest)
        except ValueError:
            items = None
        if not isinstance(items, list) or not all(isinstance(w, str) for w in items):
            raise _NotHere("is neither a JSON list of strings nor words")
        return ["".join(words.split(w, words=False)) for w in items]
    return words.split(rest)


def _source_problem(b: _Build, op: str, src: str) -> str | None:
    """Why the local path cannot read the COPY/ADD source `src` (None: it may try)."""
    where = f"the build context {b.context or '.'}/"
    if "://" in src or src.startswith("git@"):
        return f"{op} of a remote source {src}"
    if src.startswith("/"):
        return f"{op} {src}: source is an absolute path; the local path reads sources from {where}"
    norm = posixpath.normpath(src)
    if norm == ".." or norm.startswith("../"):
        return f"{op} {src}: source leaves {where}"
    if any(c in src for c in "*?["):
        return f"{op} of a wildcard source {src}"
    if op == "ADD" and norm.lower().endswith(_ARCHIVES):
        return f"ADD of a local archive {src} (Docker unpacks it)"
    return None


def _read_source(b: _Build, op: str, src: str, dst: str, dst_abs: str,
                 many: bool) -> dict[str, bytes]:
    """{absolute target: bytes} for one local COPY/ADD source (raises TaskFormatError or
    _NotHere for what the local path cannot read)."""
    norm = posixpath.normpath(src)
    rel = b.context if norm == "." else posixpath.join(b.context, norm) if b.context else norm
    kind = b.td.kind(rel, op)
    if kind is None:
        raise _NotHere(f"does not exist in {b.td.path(b.context)}")
    if kind == "dir":
        if b.ignore_file:
            raise _NotHere("is a directory and the build context has a .dockerignore, which "
                           "the local path does not apply")
        tree = b.td.read_tree(rel, op, budget=b.budget)
        return {posixpath.join(dst_abs, r): data for r, data in tree.items()}
    into_dir = dst.endswith("/") or many or dst in (".", "./")
    target = posixpath.join(dst_abs, posixpath.basename(rel)) if into_dir else dst_abs
    return {target: b.td.read_bytes(rel, op, limit=b.budget.max_bytes, budget=b.budget)}


def _copy_one(b: _Build, op: str, src: str, dst: str, dst_abs: str, many: bool) -> None:
    problem = _source_problem(b, op, src)
    if problem:
        b.note(problem)
        return
    if b.spent:
        b.note(f"{op} {src}: not read, the files copied before reach the tree caps")
        return
    try:
        items = _read_source(b, op, src, dst, dst_abs, many)
    except (_NotHere, TaskFormatError) as e:
        b.spent = isinstance(e, BudgetSpent)
        b.note(f"{op} {src}: {e}")
        return
    st = b.stage
    for target, data in items.items():
        rel = posixpath.relpath(target, st.cwd)
        if rel == ".." or rel.startswith("../"):
            b.note(f"{op} {src} to {target} (outside WORKDIR {st.cwd})")
            continue
        st.files[rel] = data


def _copy(b: _Build, op: str, rest: str, line: str) -> None:
    st = b.stage
    try:
        words = _copy_words(st, rest)
    except _NotHere as e:
        b.note(f"{op} {_cut(rest)}: {e}")
        return
    options = [w for w in words if w.startswith("--")]
    parts = [w for w in words if not w.startswith("--")]
    stage_opt = next((o for o in options if o.split("=", 1)[0] in ("--from", "--parents",
                                                                  "--exclude")), None)
    if stage_opt:
        what = "from another build stage or image" if stage_opt.startswith("--from") else \
            "with an option the local path does not apply"
        b.note(f"{op} {what}: {_cut(line)}")
        return
    if len(parts) < 2:
        b.note(f"{op} needs a source and a destination: {_cut(line)}")
        return
    *srcs, dst = parts
    if st.cwd is None:
        b.note(f"{op} {_cut(rest)}: WORKDIR is not known here")
        return
    dst_abs = _abs(dst) if dst.startswith("/") else _abs(posixpath.join(st.cwd, dst))
    for src in srcs:
        _copy_one(b, op, src, dst, dst_abs, len(srcs) > 1)


_STEPS = {"WORKDIR": _workdir, "ENV": _env, "RUN": _run, "COPY": _copy, "ADD": _copy,
          "SHELL": _shell}


def _step(b: _Build, line: str, heredoc: bool) -> None:
    op, _, rest = line.split("\n", 1)[0].partition(" ")
    op, rest = op.upper(), rest.strip()
    if op == "FROM":
        _from(b, rest)
    elif op == "ARG":
        _arg(b, rest)
    elif b.stage is None:
        b.note(f"{_cut(line)} (before the first FROM)")
    elif heredoc:
        b.note(f"{op} with a heredoc: {_cut(line)}")
    elif op in _STEPS:
        _STEPS[op](b, op, rest, line)
    elif op not in _NO_EFFECT:
        b.note(f"unknown instruction {_cut(line)}")


def _has_ignore_file(td: TaskDir, context: str, dockerfile: str) -> bool:
    names = [posixpath.join(context, ".dockerignore"), dockerfile + ".dockerignore"]
    try:
        return any(td.kind(n) is not None for n in names)
    except TaskFormatError:
        return True


def parse_dockerfile(td: TaskDir, rel: str, context: str | None = None) -> Dockerfile:
    """What the local path could reproduce of the Dockerfile `rel` (task-directory-relative)
    built in the build context `context` (task-directory-relative; None: the Dockerfile's
    directory). Only reading the Dockerfile itself can fail (a link, too large, not UTF-8:
    TaskFormatError); every construct the local path cannot reproduce is an `unsupported`
    entry. COPY/ADD sources are read through `td` (no links, nothing outside the build
    context) and count against one tree budget for the whole image."""
    path = td.path(rel)
    text = td.read_text(rel, "Dockerfile")
    ctx = posixpath.dirname(rel) if context is None else context
    b = _Build(td, path, ctx, TreeBudget(f"what {path} copies"),
               _has_ignore_file(td, ctx, rel))
    for line, heredoc in _instructions(text):
        _step(b, line, heredoc)
    st = b.stage
    if st is None:
        return Dockerfile(None, None, {}, (), {}, (*b.before_from, "the Dockerfile has no "
                                                   "FROM line"))
    return Dockerfile(st.base, st.workdir, st.files, tuple(st.setup), st.env,
                      (*b.before_from, *st.unsupported))
