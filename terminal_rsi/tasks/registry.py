"""Task suites: `get_suite(name, split)` returns an iterator of Tasks.

Suites:

* ``builtin``: the procedural families. Splits: ``train`` (training families, training
  seeds), ``validation`` (training families, validation seeds: model selection between
  stages, never trained on), ``test`` (training families, held-out seeds),
  ``heldout_families`` (families training never sees, any seed), ``all`` (every family,
  every seed). Train, validation and test seeds are disjoint.
* ``terminal``: the built-in families that need a persistent terminal session
  (`terminal_rsi.tasks.builtin.TERMINAL_FAMILIES`; keystroke solutions, tag "terminal",
  verifier mode "shared"), with the same splits (held-out family:
  `TERMINAL_HELDOUT_FAMILIES`). Run it with a session harness (``harness.terminal =
  "session"``): its solutions are keystrokes, not ``bash -c`` commands.
* a directory path: Terminal-Bench / Harbor task directories below it (split ``all``).

For the procedural suites (`PROCEDURAL_SUITES`), `n_per_family=None` iterates forever (round-robin
over families, increasing seeds); an int gives that many instances per family. The
``train`` and ``validation`` splits with an int take each family's seeds round-robin over its
variants (`Instance.variant`, e.g. find_tree's extension; `variant_seeds`), so training and
model selection see every form a family takes, not only the forms its first seeds happen to
draw (find_tree's first 4 training seeds are .log, .csv, .log, .csv; the held-out split asks
for .md). The ``test`` split keeps its first seeds: the held-out instances stay fixed.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator, Sequence

from terminal_rsi.tasks import builtin as b
from terminal_rsi.tasks.harbor import load_task_dirs
from terminal_rsi.tasks.spec import Task

SPLITS = ("train", "validation", "test", "heldout_families", "all")
# the splits whose n-per-family instances are spread over each family's variants
VARIANT_SPLITS = ("train", "validation")
# `variant_seeds` looks for variants among this many seeds of the split per instance asked for
VARIANT_SCAN = 8
# the procedural suites: (every family, the families training never sees)
PROCEDURAL_SUITES = {
    "builtin": (b.FAMILIES, b.HELDOUT_FAMILIES),
    "terminal": (b.TERMINAL_FAMILIES, b.TERMINAL_HELDOUT_FAMILIES),
}


def heldout_families_problem(suite: str, names: Sequence[str], where: str) -> str | None:
    """Why the setting `where` = `names` cannot select held-out families of `suite` (None: it
    can). A procedural suite's held-out families are fixed (`HELDOUT_FAMILIES`); a task
    directory has no such split, so any names pass here."""
    if suite not in PROCEDURAL_SUITES:
        return None
    heldout = PROCEDURAL_SUITES[suite][1]
    other = [n for n in names if n not in heldout]
    if not other:
        return None
    return (f"{where} = {tuple(names)}: {other} are not held-out families of suite {suite!r}, "
            f"which are {list(heldout)}")


def procedural_split(suite: str, split: str) -> tuple[tuple[str, ...], object]:
    """(families, seed predicate) of a split of a procedural suite (module doc)."""
    families, heldout = PROCEDURAL_SUITES[suite]
    train = tuple(f for f in families if f not in heldout)
    if split == "train":
        return train, lambda f, s: not (b.heldout_seed(f, s) or b.validation_seed(f, s))
    if split == "validation":
        return train, b.validation_seed
    if split == "test":
        return train, b.heldout_seed
    if split == "heldout_families":
        return tuple(heldout), lambda f, s: True
    if split == "all":
        return tuple(families), lambda f, s: True
    raise ValueError(f"unknown split {split!r} of suite {suite!r}; choose one of {SPLITS}")


def get_suite(name: str, split: str = "train", *, n_per_family: int | None = None,
              families: Sequence[str] | None = None, start_seed: int = 0) -> Iterator[Task]:
    """Iterate the tasks of suite `name` and `split` (see module doc)."""
    if name in PROCEDURAL_SUITES:
        fams, keep = procedural_split(name, split)
        if families:
            unknown = set(families) - set(fams)
            if unknown:
                raise ValueError(f"families {sorted(unknown)} are not in split {split!r}: "
                                 f"{list(fams)}")
            fams = tuple(f for f in fams if f in families)
        if split in VARIANT_SPLITS and n_per_family is not None:
            return _seeded_iter(fams, {f: variant_seeds(f, n_per_family, keep, start_seed)
                                       for f in fams})
        return _builtin_iter(fams, keep, n_per_family, start_seed, b.make_task)
    if os.path.isdir(name):
        if split != "all":
            raise ValueError(f"a task directory suite has only split 'all', got {split!r}")
        return iter(load_task_dirs(name))
    raise ValueError(f"unknown suite {name!r}: use 'builtin', 'terminal' or a directory of "
                     "task dirs")


def pool_tasks(pool, split: str, n_per_family: int | None,
               error: type[Exception] = ValueError) -> list[Task]:
    """The tasks of a config's task pool `pool` (its `suite` and `families`; empty families:
    all in the split) in `split`; `error` (the caller's error type) if there are none."""
    tasks = list(get_suite(pool.suite, split, n_per_family=n_per_family,
                           families=tuple(pool.families) or None))
    if not tasks:
        raise error(f"no tasks in suite {pool.suite!r} split {split!r}; check config.tasks")
    return tasks


def variant_seeds(family: str, n: int, keep: Callable[[str, int], bool],
                  start_seed: int = 0) -> list[int]:
    """`n` seeds of built-in `family` that `keep(family, seed)` admits (a split's seed
    predicate, `procedural_split`), taken round-robin over the family's variants in the
    order they first appear (each variant's seeds in increasing order) among its first
    `VARIANT_SCAN * n` admitted seeds from `start_seed`. A family with one form gets its
    first `n` admitted seeds."""
    by_variant: dict[str, list[int]] = {}
    seed, seen = start_seed, 0
    while seen < VARIANT_SCAN * n:
        if keep(family, seed):
            by_variant.setdefault(b.instance(family, seed).variant, []).append(seed)
            seen += 1
        seed += 1
    rounds = itertools.zip_longest(*by_variant.values())
    return [s for r in rounds for s in r if s is not None][:n]


def _seeded_iter(fams, seeds: dict[str, list[int]]) -> Iterator[Task]:
    """The tasks of the given seeds per family, round-robin over families."""
    for i in range(max(map(len, seeds.values()), default=0)):
        for f in fams:
            if i < len(seeds[f]):
                yield b.make_task(f, seeds[f][i])


def _builtin_iter(fams, keep, n_per_family, start_seed, make_task) -> Iterator[Task]:
    counts = dict.fromkeys(fams, 0)
    seeds = dict.fromkeys(fams, start_seed)
    for _ in itertools.count():
        active = [f for f in fams if n_per_family is None or counts[f] < n_per_family]
        if not active:
            return
        for f in active:
            while not keep(f, seeds[f]):
                seeds[f] += 1
            yield make_task(f, seeds[f])
            seeds[f] += 1
            counts[f] += 1
