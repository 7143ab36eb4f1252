"""Memory and process limits for a sandbox's whole process tree, through Linux cgroups.

A local sandbox gets one control group per controller, made under the cgroup its owner
(the trainer or bridge server) already runs in, so the sandbox also stays inside the
owner's own limits:

- cgroup v2 (unified hierarchy with the ``memory`` and ``pids`` controllers enabled for
  children): one group with ``memory.max``, ``memory.swap.max = 0``, ``pids.max`` and,
  where the ``cpu`` controller is there too, ``cpu.max`` (the spec's CPU share);
- cgroup v1: a ``memory`` group (``memory.limit_in_bytes``, and
  ``memory.memsw.limit_in_bytes`` where swap accounting exists), a ``pids`` group
  (``pids.max``) and, where the ``cpu`` controller is mounted, a ``cpu`` group
  (``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``).

Every exec writes its own pid into the groups' ``cgroup.procs`` before it drops to the
sandbox uid (see ``local.py``), so every process it starts is counted and the kernel's
OOM killer acts inside the sandbox only. Creating groups needs root and a writable
cgroup filesystem; where that fails :func:`create` returns None with the reason, and the
local backend falls back to per-process rlimits (docs/sandbox.md says what then holds).
Pages of the sandbox's tmpfs that its processes write are charged to its memory group.
"""

from __future__ import annotations

import dataclasses
import os

CGROUP_ROOT = "/sys/fs/cgroup"


def _own_path(controller: str) -> str | None:
    """This process's cgroup path for ``controller`` ("" = v2 unified) from /proc/self/cgroup."""
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, ctrls, path = line.split(":", 2)
        if controller == "" and ctrls == "":
            return path
        if controller and controller in ctrls.split(","):
            return path
    return None


def _write(path: str, value: str) -> None:
    with open(path, "w", encoding="ascii") as f:
        f.write(value)


@dataclasses.dataclass(frozen=True)
class SandboxCgroup:
    """The control groups of one sandbox. ``dirs`` are absolute group directories."""

    dirs: tuple[str, ...]
    version: int

    @property
    def procs_files(self) -> tuple[str, ...]:
        """The files an exec writes its pid into to join every group."""
        return tuple(os.path.join(d, "cgroup.procs") for d in self.dirs)

    def pids(self) -> list[int]:
        """Pids currently in the sandbox's groups."""
        out: set[int] = set()
        for f in self.procs_files:
            try:
                with open(f, encoding="ascii") as fh:
                    out.update(int(x) for x in fh.read().split())
            except (OSError, ValueError):
                continue
        return sorted(out)

    def memory_events(self) -> dict[str, int]:
        """OOM counters: v2 ``memory.events``; v1 ``oom_kill`` from ``memory.oom_control``."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        for d in self.dirs:
            try:
                with open(os.path.join(d, name), encoding="ascii") as f:
                    pairs = [line.split() for line in f if line.strip()]
                return {k: int(v) for k, v in pairs if v.isdigit()}
            except OSError:
                continue
        return {}

    def remove(self) -> None:
        """Remove the groups (they must hold no process). Idempotent."""
        remove_dirs(self.dirs)


def remove_dirs(dirs) -> None:
    for d in dirs:
        try:
            os.rmdir(d)
        except FileNotFoundError:
            pass
        except OSError:
            pass  # still busy: the next sweep retries


def _quota(cpus: float) -> int:
    return max(1000, int(cpus * CPU_PERIOD_US))


def _v2_parent() -> str | None:
    own = _own_path("")
    if own is None or not os.path.exists(os.path.join(CGROUP_ROOT, "cgroup.controllers")):
        return None
    base = os.path.join(CGROUP_ROOT, own.lstrip("/"))
    # A v2 group with processes cannot hand controllers to children (the
    # no-internal-processes rule), so sandboxes live under a sibling "trsi" group of the
    # owner's group, with the controllers delegated to it.
    parent = os.path.join(os.path.dirname(base) if own != "/" else base, "trsi-sandboxes")
    os.makedirs(parent, exist_ok=True)
    for d in (os.path.dirname(parent), parent):
        with open(os.path.join(d, "cgroup.subtree_control"), encoding="ascii") as f:
            have = set(f.read().split())
        missing = [c for c in ("memory", "pids") if c not in have]
        if missing:
            _write(os.path.join(d, "cgroup.subtree_control"),
                   " ".join(f"+{c}" for c in missing))
    return parent


CPU_PERIOD_US = 100_000


def create(name: str, memory_bytes: int, pids: int,
           cpus: float | None = None) -> tuple[SandboxCgroup | None, str]:
    """Make the groups of sandbox ``name``; (groups, "") or (None, why not).

    Memory and pids are required; the CPU quota (``cpus`` cores) is applied where the
    cpu controller is available and skipped otherwise.
    """
    if os.geteuid() != 0:
        return None, "cgroups need root"
    made: list[str] = []
    try:
        parent = _v2_parent()
        if parent is not None:
            d = os.path.join(parent, name)
            os.mkdir(d)
            made.append(d)
            _write(os.path.join(d, "memory.max"), str(memory_bytes))
            if os.path.exists(os.path.join(d, "memory.swap.max")):
                _write(os.path.join(d, "memory.swap.max"), "0")
            _write(os.path.join(d, "pids.max"), str(pids))
            if cpus and os.path.exists(os.path.join(d, "cpu.max")):
                _write(os.path.join(d, "cpu.max"), f"{_quota(cpus)} {CPU_PERIOD_US}")
            return SandboxCgroup((d,), 2), ""
        mem_own, pids_own = _own_path("memory"), _own_path("pids")
        if mem_own is None or pids_own is None:
            return None, "no cgroup v2 hierarchy and no v1 memory and pids controllers"
        mem = os.path.join(CGROUP_ROOT, "memory", mem_own.lstrip("/"), name)
        pid = os.path.join(CGROUP_ROOT, "pids", pids_own.lstrip("/"), name)
        os.mkdir(mem)
        made.append(mem)
        os.mkdir(pid)
        made.append(pid)
        _write(os.path.join(mem, "memory.limit_in_bytes"), str(memory_bytes))
        if os.path.exists(os.path.join(mem, "memory.memsw.limit_in_bytes")):
            _write(os.path.join(mem, "memory.memsw.limit_in_bytes"), str(memory_bytes))
        _write(os.path.join(pid, "pids.max"), str(pids))
        cpu_own = _own_path("cpu")
        if cpus and cpu_own is not None:
            cpu = os.path.join(CGROUP_ROOT, "cpu", cpu_own.lstrip("/"), name)
            try:
                os.mkdir(cpu)
            except OSError:
                return SandboxCgroup(tuple(made), 1), ""  # no CPU quota here: optional
            made.append(cpu)
            _write(os.path.join(cpu, "cpu.cfs_period_us"), str(CPU_PERIOD_US))
            _write(os.path.join(cpu, "cpu.cfs_quota_us"), str(_quota(cpus)))
        return SandboxCgroup(tuple(made), 1), ""
    except OSError as e:
        remove_dirs(reversed(made))
        return None, f"cannot create cgroups here: {e}"
