"""Finding and killing a sandbox's processes through /proc (Linux).

Processes are found by real uid (a dedicated uid per local sandbox when the host
runs as root) or by the ``TRSI_SANDBOX=<id>`` marker in their environment. They
are killed freeze-first: SIGSTOP every match until a scan finds no running
match (a stopped process cannot fork), then SIGKILL them all. This terminates
fork bombs, double-forked and ``setsid`` children alike.

:func:`list_processes` reads what a sandbox runs, for ``Sandbox.processes``: argv, executable
and open files from ``/proc``, within the caps of ``base`` (``MAX_PROCESSES`` ...).
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Callable, Iterable, Mapping

from terminal_rsi.sandbox.base import (
    MAX_ARGV_BYTES,
    MAX_PROCESS_FILES,
    MAX_PROCESS_PATH,
    MAX_PROCESSES,
    ProcessInfo,
)


def _pids() -> Iterable[int]:
    for name in os.listdir("/proc"):
        if name.isdigit():
            yield int(name)


def pids_of_uid(uid: int) -> list[int]:
    """Pids whose real uid is ``uid``."""
    out = []
    for pid in _pids():
        try:
            with open(f"/proc/{pid}/status", "rb") as f:
                for line in f:
                    if line.startswith(b"Uid:"):
                        if int(line.split()[1]) == uid:
                            out.append(pid)
                        break
        except (OSError, ValueError):
            continue
    return out


def pids_with_env(marker: bytes) -> list[int]:
    """Pids whose environment contains the exact entry ``marker`` (e.g. b"TRSI_SANDBOX=ab12")."""
    out = []
    me = os.getpid()
    for pid in _pids():
        if pid == me:
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if marker in env.split(b"\0"):
            out.append(pid)
    return out


def pids_with_cmdline(token: bytes) -> list[int]:
    """Pids whose command line contains ``token`` (used by tests to find escapees)."""
    out = []
    for pid in _pids():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if token in f.read():
                    out.append(pid)
        except OSError:
            continue
    return out


def start_time(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot (field 22 of /proc/PID/stat)."""
    st = stat(pid)
    return None if st is None else st[2]


def boot_id() -> str:
    """This boot's id (``/proc/sys/kernel/random/boot_id``), "" if unreadable."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


def alive(pid, start, boot) -> bool:
    """True if the process recorded as (pid, start time, boot id) still runs (not reused)."""
    if not isinstance(pid, int) or pid <= 0 or boot != boot_id():
        return False
    now = start_time(pid)
    return now is not None and now == start and _state(pid) not in ("Z", "X")


OWNER_KEYS = ("pid", "start", "boot", "host", "pidns")


def owner_identity() -> dict[str, str]:
    """This process as the owner of a sandbox: pid, start time, boot id, host name and PID
    namespace (strings), enough to tell later whether it is gone or its pid was reused."""
    pid = os.getpid()
    try:
        pidns = os.readlink("/proc/self/ns/pid")
    except OSError:
        pidns = ""
    return {"pid": str(pid), "start": str(start_time(pid)), "boot": boot_id(),
            "host": socket.gethostname(), "pidns": pidns}


def owner_gone(owner: Mapping[str, str], me: Mapping[str, str] | None = None) -> bool:
    """True if ``owner`` (an `owner_identity` record) was a process on this host that is gone.

    Owners on another host, in another PID namespace, or with incomplete records are never
    judged gone: their pids mean nothing here.
    """
    me = me or owner_identity()
    if any(not owner.get(k) for k in ("host", "boot", "pid")) or owner["host"] != me["host"]:
        return False
    if owner["boot"] != me["boot"]:
        return True  # this host rebooted since: every process of that boot is gone
    if owner.get("pidns") != me["pidns"]:
        return False
    try:
        pid, start = int(owner["pid"]), int(owner.get("start", ""))
    except ValueError:
        return False
    return not alive(pid, start, owner["boot"])


def _state(pid: int) -> str:
    st = stat(pid)
    return "X" if st is None else st[0]


def freeze_and_kill(find: Callable[[], list[int]], deadline_s: float = 5.0) -> int:
    """SIGSTOP everything ``find`` returns until stable, then SIGKILL. Returns #killed.

    Zombies (state Z) are ignored: they hold no resources beyond a pid and are
    reaped by their parent (or by init once the parent is gone).
    """
    t_end = time.monotonic() + deadline_s
    seen: set[int] = set()
    while time.monotonic() < t_end:
        live = [p for p in find() if _state(p) not in ("Z", "X")]
        fresh = [p for p in live if p not in seen or _state(p) not in ("T", "t")]
        if not fresh:
            break
        for p in fresh:
            try:
                os.kill(p, signal.SIGSTOP)
            except ProcessLookupError:
                pass
            seen.add(p)
    killed = 0
    for _ in range(50):
        live = [p for p in find() if _state(p) not in ("Z", "X")]
        if not live:
            break
        for p in live:
            try:
                os.kill(p, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        time.sleep(0.005)
    return killed


def ns_inode(pid: int | str, kind: str) -> int | None:
    """The inode of ``/proc/<pid>/ns/<kind>`` (e.g. "net", "pid"): equal inodes, same
    namespace. None if the process is gone or unreadable."""
    try:
        return os.stat(f"/proc/{pid}/ns/{kind}").st_ino
    except OSError:
        return None


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children", "rb") as f:
            return [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        return []


def descendant_in_other_ns(pid: int, kind: str = "pid", timeout_s: float = 10.0) -> int | None:
    """The first descendant of ``pid`` living in another ``kind`` namespace than ``pid``
    (the inside of a bubblewrap sandbox it started), waiting up to ``timeout_s`` for it."""
    mine = ns_inode(pid, kind)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        todo, seen = [pid], set()
        while todo:
            p = todo.pop()
            if p in seen:
                continue
            seen.add(p)
            ino = ns_inode(p, kind)
            if ino is not None and mine is not None and ino != mine:
                return p
            todo.extend(_children(p))
        if mine is None:
            return None
        time.sleep(0.01)
    return None


def pids_in_ns(kind: str, inode: int) -> list[int]:
    """Pids whose ``kind`` namespace has inode ``inode``."""
    return [p for p in _pids() if ns_inode(p, kind) == inode]


# ----------------------------------------------------------------- listing (processes())


def stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, start time in clock ticks since boot) of ``pid`` from
    ``/proc/<pid>/stat``; None if it is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        fields = data[data.rindex(b")") + 2:].split()
        return fields[0].decode(), int(fields[1]), int(fields[19])
    except (OSError, ValueError, IndexError, UnicodeDecodeError):
        return None


def ns_pids(pid: int) -> list[int]:
    """``pid``'s pid in each PID namespace it is in, outermost first (``NSpid``)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"NSpid:"):
                    return [int(x) for x in line.split()[1:]]
    except (OSError, ValueError):
        pass
    return []


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "backslashreplace")


def clip(text: str, limit: int = MAX_PROCESS_PATH) -> tuple[str, bool]:
    """``text`` in at most ``limit`` characters, cut in the middle (so a `` (deleted)``
    at the end stays); and whether it was cut."""
    if len(text) <= limit:
        return text, False
    head = (limit - 3) // 2
    return text[:head] + "..." + text[len(text) - (limit - 3 - head):], True


def read_argv(pid: int) -> tuple[tuple[str, ...], bool]:
    """The command line (at most MAX_ARGV_BYTES) and whether it is partial."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            data = f.read(MAX_ARGV_BYTES + 1)
    except OSError:
        return (), True
    cut = len(data) > MAX_ARGV_BYTES
    data = data[:MAX_ARGV_BYTES]
    if data.endswith(b"\0"):
        data = data[:-1]
    return (tuple(_text(a) for a in data.split(b"\0")) if data else ()), cut


def _link(path: str) -> str | None:
    try:
        return _text(os.readlink(os.fsencode(path)))
    except OSError:
        return None


def _files(pid: int) -> tuple[tuple[str, ...], bool]:
    """The open files (lowest descriptors first, at most MAX_PROCESS_FILES) and whether
    the list is partial. procfs lists a process's descriptors in ascending order, so
    only the first ones are read whatever the process holds."""
    fds: list[int] = []
    try:
        with os.scandir(f"/proc/{pid}/fd") as it:
            for entry in it:
                fds.append(int(entry.name))
                if len(fds) > MAX_PROCESS_FILES:
                    break
    except (OSError, ValueError):
        return (), True
    cut = len(fds) > MAX_PROCESS_FILES
    out = []
    for fd in sorted(fds)[:MAX_PROCESS_FILES]:
        target = _link(f"/proc/{pid}/fd/{fd}")
        if target is not None:  # closed meanwhile: no longer open
            target, clipped = clip(target)
            cut = cut or clipped
            out.append(target)
    return tuple(out), cut


def read_process(pid: int, belongs: Callable[[int], bool] | None = None) -> ProcessInfo | None:
    """What ``/proc`` says of ``pid`` (`ProcessInfo`, source "proc"); None if it is gone,
    a zombie, reused while read, or (``belongs`` given) not one ``belongs`` accepts."""
    before = stat(pid)
    if before is None or before[0] in ("Z", "X"):
        return None
    if belongs is not None and not belongs(pid):
        return None
    argv, argv_cut = read_argv(pid)
    exe = _link(f"/proc/{pid}/exe")
    files, files_cut = _files(pid)
    after = stat(pid)
    if after is None or after[2] != before[2]:
        return None  # exited (or its pid was reused) while it was read
    exe, exe_cut = clip(exe or "")
    return ProcessInfo(pid=pid, ppid=before[1], argv=argv, exe=exe, files=files,
                       partial=argv_cut or files_cut or exe_cut or not exe, source="proc")


def list_processes(pids: Iterable[int], machinery: Callable[[int, int], bool] | None = None,
                   belongs: Callable[[int], bool] | None = None) -> tuple[ProcessInfo, ...]:
    """`read_process` of ``pids``, lowest first, at most MAX_PROCESSES, skipping zombies
    and those ``machinery(pid, ppid)`` calls the sandbox's own (checked before anything
    else is read). Every pid is looked at until the cap is reached, so a listing shorter
    than MAX_PROCESSES is complete."""
    out: list[ProcessInfo] = []
    for pid in sorted(set(pids)):
        if len(out) >= MAX_PROCESSES:
            break
        st = stat(pid)
        if st is None or st[0] in ("Z", "X") or (machinery is not None and machinery(pid, st[1])):
            continue
        info = read_process(pid, belongs)
        if info is not None:
            out.append(info)
    return tuple(out)
