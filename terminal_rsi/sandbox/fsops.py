"""Workspace file operations that never follow a link out of the workspace.

The sandbox machinery (not the agent) reads and writes a local workspace from the
host: uploads (``put_tar``), downloads (``get_tar``), and through them verification's
copy-in and copy-out. The agent controls what lies in the workspace, so every path is
resolved here one component at a time from an open descriptor of the workspace root,
each component opened with ``O_NOFOLLOW`` (what ``openat2(RESOLVE_BENEATH |
RESOLVE_NO_SYMLINKS)`` would do): a symlink anywhere on the way, however long its
chain, is an error naming the member, never a redirection. Symlinks are created and
archived as links, whatever their target, and never followed. FIFOs, sockets and device
files are skipped on the way out and refused on the way in; hard links are refused.

When the host runs as root, each operation runs with the sandbox's uid as the calling
thread's filesystem identity (``setfsuid``/``setfsgid``, per thread on Linux; the kernel
drops the filesystem capabilities with it), so the operation can touch only what the
sandbox itself may touch.

Uploads are checked while streaming, before anything is written: member count, total
size and a wall-clock budget (:class:`TarLimits`). Downloads count the bytes of the tar
stream itself (headers included) and stop at ``max_bytes``. Every failure is a
:class:`~terminal_rsi.sandbox.errors.BadRequest` naming the member; an ``OSError`` never
leaves this module.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import io
import os
import stat
import tarfile
import threading
import time
from collections.abc import Iterator

from terminal_rsi.sandbox.base import TarLimits, check_tar, safe_relpath
from terminal_rsi.sandbox.errors import BadRequest, InfrastructureError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 1 << 20


# --------------------------------------------------------------------- identity

_libc = None
_identity_lock = threading.Lock()


def _c_library():
    global _libc
    with _identity_lock:
        if _libc is None:
            _libc = ctypes.CDLL(None, use_errno=True)
        return _libc


@contextlib.contextmanager
def fs_identity(uid: int | None) -> Iterator[None]:
    """Run the block with ``uid`` as this thread's filesystem uid and gid (no-op for None).

    ``setfsuid`` is per thread and is not broadcast by glibc, so other threads keep
    their identity. Changing the filesystem uid from 0 drops CAP_DAC_OVERRIDE,
    CAP_CHOWN, CAP_FOWNER and the other filesystem capabilities of this thread.
    """
    if uid is None:
        yield
        return
    libc = _c_library()
    old_gid = libc.setfsgid(uid)
    old_uid = libc.setfsuid(uid)
    try:
        if libc.setfsuid(-1) != uid or libc.setfsgid(-1) != uid:
            raise InfrastructureError(f"could not take the sandbox uid {uid} as the "
                                      "filesystem identity (setfsuid)")
        yield
    finally:
        libc.setfsuid(old_uid)
        libc.setfsgid(old_gid)


# --------------------------------------------------------------------- resolution


def _components(rel: str) -> list[str]:
    norm = safe_relpath(rel)
    return [] if norm == "." else norm.split("/")


def _open_dir(parent_fd: int, name: str, *, create: bool, what: str) -> int:
    """Open directory ``name`` under ``parent_fd`` without following a link."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except FileNotFoundError:
        if not create:
            raise BadRequest(f"{what}: {name!r} does not exist in the workspace") from None
    except OSError as e:
        raise _path_error(what, name, e) from None
    try:
        os.mkdir(name, 0o755, dir_fd=parent_fd)
    except FileExistsError:
        pass
    except OSError as e:
        raise _path_error(what, name, e) from None
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except OSError as e:
        raise _path_error(what, name, e) from None


def _path_error(what: str, name: str, e: OSError) -> BadRequest:
    if e.errno in (errno.ELOOP, errno.ENOTDIR):
        return BadRequest(f"{what}: {name!r} is a symlink or not a directory; workspace "
                          "paths are never followed through links")
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return BadRequest(f"{what}: the workspace is full (the sandbox's disk_mb)")
    if e.errno == errno.ENAMETOOLONG:
        return BadRequest(f"{what}: a path or link name is too long")
    return BadRequest(f"{what}: {os.strerror(e.errno or 0)} at {name!r}")


@contextlib.contextmanager
def _walk_to(root: str, parts: list[str], *, create: bool, what: str,
             uid: int | None) -> Iterator[int]:
    """An fd of directory root/parts..., every component opened without following links.

    ``root`` (trusted) is opened as the caller; the walk below it and the caller's block
    run with ``uid`` as the filesystem identity.
    """
    try:
        fd = os.open(root, _DIR_FLAGS)
    except OSError as e:
        raise InfrastructureError(f"workspace {root} cannot be opened: {e}") from e
    try:
        with fs_identity(uid):
            for name in parts:
                nxt = _open_dir(fd, name, create=create, what=what)
                os.close(fd)
                fd = nxt
            yield fd
    finally:
        os.close(fd)


def is_dir(root: str, path: str, *, uid: int | None = None) -> bool:
    """True if workspace path ``path`` is a directory reached without following any link."""
    try:
        with _walk_to(root, _components(path), create=False, what=path, uid=uid):
            return True
    except BadRequest:
        return False


# --------------------------------------------------------------------- upload


def extract(root: str, data: bytes, dest: str = ".", *, uid: int | None = None,
            limits: TarLimits = TarLimits()) -> int:
    """Unpack tar ``data`` into workspace directory ``root/dest``. Returns the member count.

    Args:
      root: host path of the workspace (trusted).
      data: the tar stream (untrusted).
      dest: workspace-relative directory (untrusted); created if missing.
      uid: the sandbox's uid, used as the filesystem identity (None: the caller's).
      limits: caps checked before anything is written and while writing.

    Raises:
      BadRequest: a bad archive, a member that would pass through a link or over an
        existing directory, a cap exceeded, or the workspace full.
    """
    members = check_tar(data, limits)
    deadline = time.monotonic() + limits.timeout_s
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tf, \
                _walk_to(root, _components(dest), create=True, what=f"dest {dest!r}",
                         uid=uid) as dfd:
            for m in members:
                if time.monotonic() > deadline:
                    raise BadRequest(f"upload took longer than {limits.timeout_s:g} s")
                _extract_member(tf, m, dfd)
    except tarfile.TarError as e:
        raise BadRequest(f"upload is not a readable tar stream: {e}") from e
    except (EOFError, ValueError) as e:
        if isinstance(e, BadRequest):
            raise
        raise BadRequest(f"upload is not a readable tar stream: {e}") from e
    return len(members)


def _extract_member(tf: tarfile.TarFile, m: tarfile.TarInfo, dfd: int) -> None:
    what = f"tar member {m.name!r}"
    parts = _components(m.name)
    if not parts:  # "." itself
        return
    *dirs, leaf = parts
    fd = os.dup(dfd)
    try:
        for name in dirs:
            nxt = _open_dir(fd, name, create=True, what=what)
            os.close(fd)
            fd = nxt
        try:
            if m.isdir():
                _make_dir(fd, leaf, m.mode, what)
            elif m.issym():
                _remove_non_dir(fd, leaf, what)
                os.symlink(m.linkname, leaf, dir_fd=fd)
            else:
                _write_file(tf, m, fd, leaf, what)
        except OSError as e:
            raise _path_error(what, leaf, e) from None
    finally:
        os.close(fd)


def _make_dir(parent: int, name: str, mode: int, what: str) -> None:
    try:
        os.mkdir(name, 0o700, dir_fd=parent)
    except FileExistsError:
        pass
    fd = _open_dir(parent, name, create=False, what=what)
    try:
        os.fchmod(fd, (mode & 0o777) | 0o700)
    finally:
        os.close(fd)


def _remove_non_dir(parent: int, name: str, what: str) -> None:
    """Unlink an existing file or link at ``name`` (never its target); refuse a directory."""
    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        raise BadRequest(f"{what}: a directory of that name is in the way")
    os.unlink(name, dir_fd=parent)


def _write_file(tf: tarfile.TarFile, m: tarfile.TarInfo, parent: int, name: str,
                what: str) -> None:
    _remove_non_dir(parent, name, what)
    src = tf.extractfile(m)
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600, dir_fd=parent)
    try:
        left = m.size
        while left > 0 and src is not None:
            chunk = src.read(min(_CHUNK, left))
            if not chunk:
                raise BadRequest(f"{what}: the archive ends inside this file")
            os.write(fd, chunk)
            left -= len(chunk)
        os.fchmod(fd, m.mode & 0o777)
        os.utime(fd, (m.mtime, m.mtime))
    finally:
        os.close(fd)


# --------------------------------------------------------------------- download


class _CappedBuffer(io.RawIOBase):
    """A write-only byte sink that refuses to grow past ``limit``."""

    def __init__(self, limit: int, what: str):
        self.buf = io.BytesIO()
        self.limit, self.what = limit, what

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.buf.tell()

    def write(self, b) -> int:
        if self.buf.tell() + len(b) > self.limit:
            raise BadRequest(f"{self.what} is larger than max_bytes={self.limit}")
        return self.buf.write(b)


MAX_DEPTH = 256  # directory levels a download descends (one open descriptor each)


def pack(root: str, path: str = ".", *, uid: int | None = None,
         limits: TarLimits = TarLimits()) -> bytes:
    """A tar stream of workspace path ``root/path`` (a file, link or directory tree).

    Links are archived as links and never followed; FIFOs, sockets, devices and files
    the sandbox user cannot read are skipped. ``limits.max_bytes`` caps the stream itself;
    a tree deeper than `MAX_DEPTH` levels is a BadRequest.
    """
    parts = _components(path)
    what = f"{path!r}"
    sink = _CappedBuffer(limits.max_bytes, what)
    with tarfile.open(fileobj=sink, mode="w", format=tarfile.PAX_FORMAT) as tf:
        packer = _Packer(tf, limits)
        if not parts:
            with _walk_to(root, [], create=False, what=what, uid=uid) as fd:
                packer.tree(os.dup(fd), ".")
        else:
            with _walk_to(root, parts[:-1], create=False, what=what, uid=uid) as pfd:
                try:
                    st = os.stat(parts[-1], dir_fd=pfd, follow_symlinks=False)
                except FileNotFoundError:
                    raise BadRequest(f"{path!r} does not exist in the workspace") from None
                except OSError as e:
                    raise _path_error(what, parts[-1], e) from None
                packer.entry(pfd, parts[-1], "/".join(parts), st)
    return sink.buf.getvalue()


def _tarinfo(arcname: str, st: os.stat_result, kind: bytes) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(arcname)
    ti.type = kind
    ti.mode = st.st_mode & 0o7777
    ti.mtime = int(st.st_mtime)
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    return ti


class _Packer:
    """Adds workspace entries to a tar stream, counting members against the caps."""

    def __init__(self, tf: tarfile.TarFile, limits: TarLimits):
        self.tf, self.limits = tf, limits
        self.deadline = time.monotonic() + limits.timeout_s
        self.count = 0

    def _admit(self, arcname: str) -> None:
        if self.count >= self.limits.max_members:
            raise BadRequest(f"{arcname!r}: more than {self.limits.max_members} entries to "
                             "download")
        if time.monotonic() > self.deadline:
            raise BadRequest(f"download took longer than {self.limits.timeout_s:g} s")
        self.count += 1

    def entry(self, parent: int, name: str, arcname: str, st: os.stat_result) -> None:
        """One entry; a directory is walked with `tree`. Special files are skipped."""
        if stat.S_ISDIR(st.st_mode):
            try:
                fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
            except OSError:
                return
            self.tree(fd, arcname)
        elif stat.S_ISLNK(st.st_mode):
            try:
                target = os.readlink(name, dir_fd=parent)
            except OSError:
                return
            self._admit(arcname)
            ti = _tarinfo(arcname, st, tarfile.SYMTYPE)
            ti.linkname = target
            self.tf.addfile(ti)
        elif stat.S_ISREG(st.st_mode):
            self._file(parent, name, arcname)
        # FIFOs, sockets and devices are skipped: they carry no content to copy.

    def _file(self, parent: int, name: str, arcname: str) -> None:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=parent)
        except OSError:
            return  # unreadable by the sandbox user, or replaced meanwhile
        try:
            fst = os.fstat(fd)
            if not stat.S_ISREG(fst.st_mode):
                return
            self._admit(arcname)
            ti = _tarinfo(arcname, fst, tarfile.REGTYPE)
            ti.size = fst.st_size
            with os.fdopen(os.dup(fd), "rb") as f:
                self.tf.addfile(ti, _Exact(f, fst.st_size))
        finally:
            os.close(fd)

    def tree(self, fd: int, arcname: str) -> None:
        """Walk directory ``fd`` (owned: closed here) depth-first without recursion."""
        stack: list[tuple[int, str, Iterator[str]]] = []
        try:
            self._open_level(stack, fd, arcname)
            while stack:
                dfd, darc, names = stack[-1]
                name = next(names, None)
                if name is None:
                    os.close(stack.pop()[0])
                    continue
                try:
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                except OSError:
                    continue
                child = name if darc == "." else f"{darc}/{name}"
                if not stat.S_ISDIR(st.st_mode):
                    self.entry(dfd, name, child, st)
                    continue
                if len(stack) >= MAX_DEPTH:
                    raise BadRequest(f"{child!r}: the tree is deeper than {MAX_DEPTH} levels")
                try:
                    sub = os.open(name, _DIR_FLAGS, dir_fd=dfd)
                except OSError:
                    continue
                self._open_level(stack, sub, child)
        finally:
            for dfd, _, _ in stack:
                os.close(dfd)

    def _open_level(self, stack: list, fd: int, arcname: str) -> None:
        try:
            self._admit(arcname)
            self.tf.addfile(_tarinfo(arcname, os.fstat(fd), tarfile.DIRTYPE))
            try:
                names = sorted(os.listdir(fd))
            except OSError:
                names = []  # unreadable by the sandbox user: archived empty
        except BaseException:
            os.close(fd)
            raise
        stack.append((fd, arcname, iter(names)))


class _Exact(io.RawIOBase):
    """Exactly ``size`` bytes of ``f``: zero-padded if the file shrank, cut if it grew."""

    def __init__(self, f, size: int):
        self.f, self.left = f, size

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        if self.left <= 0:
            return b""
        n = self.left if n is None or n < 0 else min(n, self.left)
        data = self.f.read(n) or b""
        if len(data) < n:
            data += b"\0" * (n - len(data))
        self.left -= len(data)
        return data
