"""The built-in procedural task suite (no Docker needed).

    from terminal_rsi.tasks.builtin import FAMILIES, make_task, instances
    task = make_task("sort_uniq", seed=3)

Splits (see `terminal_rsi.tasks.registry.get_suite`):

* instance seeds: a seed is held out if `heldout_seed(family, seed)` (a hash, about 20%
  of seeds); of the others, `validation_seed(family, seed)` (another hash, about 10% of
  them) reserves the validation instances model selection scores stages on; training
  draws only the rest;
* families: `HELDOUT_FAMILIES` never appear in training splits.

`TERMINAL_FAMILIES` (`terminal_families`) need a persistent terminal session: their
reference solutions are keystrokes, their tasks carry the tag "terminal" and verify in
mode "shared" (the checks query the agent's live environment). They are kept out of
`FAMILIES` and of the ``builtin`` suite, so the default pipeline (no sessions) is
unchanged; the ``terminal`` suite serves them, with the same held-out seeds.
"""

from __future__ import annotations

import hashlib
import random

from terminal_rsi.tasks.builtin.core import Family, Instance, hygiene_checks
from terminal_rsi.tasks.builtin.families import FAMILIES as _FAMILIES
from terminal_rsi.tasks.builtin.terminal_families import TERMINAL_FAMILIES as _TERMINAL
from terminal_rsi.tasks.spec import TERMINAL_TAG, Environment, Metadata, Task, VerifierSpec

FAMILIES: dict[str, Family] = {f.name: f for f in _FAMILIES}
HELDOUT_FAMILIES: tuple[str, ...] = ("column_sum", "archive", "dir_hunt")
TRAIN_FAMILIES: tuple[str, ...] = tuple(n for n in FAMILIES if n not in HELDOUT_FAMILIES)
TERMINAL_FAMILIES: dict[str, Family] = {f.name: f for f in _TERMINAL}
TERMINAL_HELDOUT_FAMILIES: tuple[str, ...] = ("interrupt_and_redo",)
_ALL_FAMILIES: dict[str, Family] = {**FAMILIES, **TERMINAL_FAMILIES}
HELDOUT_SEED_PERCENT = 20
VALIDATION_SEED_PERCENT = 10
VERIFIER_TIMEOUT_S = 60.0


def heldout_seed(family: str, seed: int) -> bool:
    """True for the ~20% of instance seeds reserved for held-out evaluation."""
    h = hashlib.sha256(f"{family}:{int(seed)}".encode()).digest()
    return int.from_bytes(h[:4], "big") % 100 < HELDOUT_SEED_PERCENT


def validation_seed(family: str, seed: int) -> bool:
    """True for the ~10% of the non-held-out seeds reserved for validation (model selection
    between stages): disjoint from the held-out seeds and from the training seeds."""
    if heldout_seed(family, seed):
        return False
    h = hashlib.sha256(f"validation:{family}:{int(seed)}".encode()).digest()
    return int.from_bytes(h[:4], "big") % 100 < VALIDATION_SEED_PERCENT


def _family(family: str) -> Family:
    fam = _ALL_FAMILIES.get(family)
    if fam is None:
        raise KeyError(f"unknown built-in family {family!r}; known: {sorted(_ALL_FAMILIES)}")
    return fam


def instance(family: str, seed: int) -> Instance:
    """The instance of `family` (one of `FAMILIES` or `TERMINAL_FAMILIES`) for `seed`
    (deterministic)."""
    fam = _family(family)
    rng = random.Random(f"{family}:{int(seed)}")
    return fam.generate(rng)


def make_task(family: str, seed: int) -> Task:
    """A `Task` for one built-in instance; its verifier is the built-in CTRF emitter.
    A terminal family's task is tagged "terminal" and verified in mode "shared" (`live` when
    its checks query a service the agent left running)."""
    fam = _family(family)
    terminal = family in TERMINAL_FAMILIES
    inst = instance(family, seed)
    check = BuiltinCheck(family, int(seed))
    n_checks = len(inst.all_checks(EmptySnapshot(), no_run, ()))
    tags = ("builtin", TERMINAL_TAG) if terminal else ("builtin",)
    return Task(
        id=f"{family}/{seed}",
        family=family,
        instruction=inst.instruction,
        environment=Environment(files=inst.files, modes=inst.modes),
        verifier=VerifierSpec(kind="builtin", mode="shared" if terminal else "separate",
                              timeout_s=VERIFIER_TIMEOUT_S, check=check, live=inst.live),
        solution=tuple(tuple(t) for t in inst.solution),
        agent_timeout_s=120.0,
        metadata=Metadata(difficulty=fam.difficulty, category=fam.category,
                          tags=(*tags, f"turns:{fam.turns}")),
        expected_checks=n_checks,
        turns=fam.turns,
        format="builtin",
        seed=int(seed),
    )


class BuiltinCheck:
    """The protected check of one built-in instance: the family's checks plus hygiene.

    Pickles as (family, seed) and regenerates the instance where it runs, so built-in tasks
    can be sent to other processes.
    """

    def __init__(self, family: str, seed: int):
        self.family, self.seed = family, seed
        self._inst: Instance | None = None

    def __call__(self, snapshot, run, processes=()):
        if self._inst is None:
            self._inst = instance(self.family, self.seed)
        return (self._inst.all_checks(snapshot, run, processes)
                + hygiene_checks(snapshot, self._inst))

    def __reduce__(self):
        return (BuiltinCheck, (self.family, self.seed))

    def __repr__(self):
        return f"BuiltinCheck({self.family!r}, {self.seed})"


def partial_solution(task: Task) -> list[str]:
    """Commands of a partial solution (tests: passes some checks but not all)."""
    return list(instance(task.family, task.seed).partial)


def hidden_values(task: Task) -> tuple[str, ...]:
    """What a multi-turn task's agent must read in the sandbox (absent from the instruction)."""
    return instance(task.family, task.seed).hidden


class EmptySnapshot(dict):
    """An empty workspace: a family's checks run on it (with `no_run`) to count or name them
    without a sandbox."""

    def files(self):
        return {}

    def text(self, path):
        return None


class _NoRun:
    stdout = ""
    stderr = ""
    exit_code = 1
    timed_out = False
    ok = False


def no_run(cmd, timeout=0):
    """A command runner that runs nothing: every command "fails" with empty output."""
    return _NoRun()


__all__ = ["FAMILIES", "HELDOUT_FAMILIES", "TERMINAL_FAMILIES", "TERMINAL_HELDOUT_FAMILIES",
           "TERMINAL_TAG",
           "TRAIN_FAMILIES", "EmptySnapshot", "Family",
           "Instance", "heldout_seed", "hidden_values", "instance", "make_task", "no_run",
           "partial_solution", "validation_seed"]
