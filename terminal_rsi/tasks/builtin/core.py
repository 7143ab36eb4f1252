"""Building blocks of the built-in procedural families.

A family turns an instance seed into an `Instance`: a short public instruction, the
seeded workspace, a reference solution (one list of shell commands per turn), a partial
solution (for tests: it passes some checks but not all) and a check function run by the
protected built-in verifier. Checks read the workspace artifacts (a `Snapshot`) and may
run commands in the verifier sandbox; every family adds hygiene checks (tagged
`hygiene`, excluded from P and N): seeded inputs unchanged and no stray files.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Iterable, Sequence

from terminal_rsi.tasks.verify import CheckResult, Snapshot

WORDS = (
    "apple", "river", "stone", "cloud", "maple", "tiger", "lemon", "piano", "ocean", "delta",
    "cedar", "amber", "falcon", "ginger", "harbor", "island", "jungle", "kettle", "lantern",
    "meadow", "nectar", "orbit", "pepper", "quartz", "raven", "saddle", "tulip", "umber",
    "velvet", "willow", "yonder", "zephyr", "bramble", "copper", "dune", "ember", "fjord",
)
IGNORED = ("__pycache__/", ".pyc")


@dataclasses.dataclass(frozen=True)
class Instance:
    """One generated task instance (see module doc)."""

    instruction: str
    files: dict[str, bytes]
    solution: list[list[str]]
    partial: list[str]
    checks: Callable[[Snapshot, Callable], list[CheckResult]]
    modes: dict[str, int] = dataclasses.field(default_factory=dict)
    outputs: tuple[str, ...] = ()  # paths (or "dir/" prefixes) the agent may create
    mutable: tuple[str, ...] = ()  # seeded paths the agent may change or remove
    hidden: tuple[str, ...] = ()  # values the agent must read in the sandbox (multi-turn)
    # the discrete form the family takes in this instance, when its forms ask for different
    # commands (find_tree's extension); "" when it has one form. The train and validation
    # splits cover every variant (`tasks.registry`).
    variant: str = ""
    # checks of what was still running when the episode ended (terminal families): they get
    # the sandbox's processes as the host saw them (`Sandbox.processes`), never a file the
    # agent could delete
    process_checks: Callable[[tuple], list[CheckResult]] | None = None
    # the checks query a service the agent left running: verified with its processes alive
    # (`VerifierSpec.live`)
    live: bool = False

    def all_checks(self, snapshot: Snapshot, run: Callable, processes: tuple) -> list:
        """The instance's checks (file and command checks, then process checks)."""
        extra = self.process_checks(processes) if self.process_checks else []
        return self.checks(snapshot, run) + extra


@dataclasses.dataclass(frozen=True)
class Family:
    """A procedural task family.

    Attributes:
      name: family id (key of the divisor table).
      category: what it exercises.
      difficulty: "easy", "medium" or "hard".
      turns: minimum agent turns by construction (>= 2: must read the sandbox first).
      checks: (min, max) number of non-hygiene checks N over instances.
      generate: `generate(rng) -> Instance`.
    """

    name: str
    category: str
    difficulty: str
    turns: int
    checks: tuple[int, int]
    generate: Callable[[random.Random], Instance]
    description: str = ""


def check(name: str, ok: bool, message: str = "") -> CheckResult:
    return CheckResult(name=name, passed=bool(ok), message="" if ok else message)


def text_eq(snapshot: Snapshot, path: str, expected: str) -> bool:
    got = snapshot.text(path)
    return got is not None and got.strip() == expected.strip()


def lines(snapshot: Snapshot, path: str) -> list[str] | None:
    got = snapshot.text(path)
    if got is None:
        return None
    return [ln.strip() for ln in got.strip().splitlines() if ln.strip()]


def _ignored(path: str) -> bool:
    return any(p in path if p.endswith("/") else path.endswith(p) for p in IGNORED)


def hygiene_checks(snapshot: Snapshot, inst: Instance) -> list[CheckResult]:
    """The two hygiene checks every family carries."""
    changed = [p for p, d in inst.files.items()
               if p not in inst.mutable and snapshot.files().get(p) != d]
    allowed_files = set(inst.files) | {o for o in inst.outputs if not o.endswith("/")}
    prefixes = tuple(o for o in inst.outputs if o.endswith("/"))
    stray = sorted(p for p, e in snapshot.items()
                   if e.kind != "dir" and p not in allowed_files
                   and not p.startswith(prefixes) and not _ignored(p))
    return [
        CheckResult("hygiene::inputs_unchanged", not changed, hygiene=True,
                    message=f"modified or removed inputs: {changed[:5]}" if changed else ""),
        CheckResult("hygiene::no_stray_files", not stray, hygiene=True,
                    message=f"unexpected files: {stray[:5]}" if stray else ""),
    ]


def pick(rng: random.Random, seq: Sequence, k: int) -> list:
    return rng.sample(list(seq), k)


def sh_quote(s: str) -> str:
    return "'" + s.replace("'", "'\"'\"'") + "'"


def join_lines(items: Iterable) -> bytes:
    return ("\n".join(str(x) for x in items) + "\n").encode()
