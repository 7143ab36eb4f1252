"""Built-in families that need a real terminal: the reference keystrokes pass through a
persistent session, the partial ones do not, and the same commands as separate execs fail."""

from __future__ import annotations

import collections
import time

import pytest

from terminal_rsi.sandbox.terminal import is_key_name
from terminal_rsi.tasks import get_suite
from terminal_rsi.tasks.builtin import (
    FAMILIES,
    HELDOUT_FAMILIES,
    TERMINAL_FAMILIES,
    TERMINAL_HELDOUT_FAMILIES,
    TRAIN_FAMILIES,
    heldout_seed,
    hidden_values,
    make_task,
    partial_solution,
)
from terminal_rsi.tasks.verify import open_task_sandbox, run_reference, verify

BACKEND = "local"  # bubblewrap where usable; built-in tasks may fall back to plain
ALLOW_PLAIN = "builtin"
WAIT_S = 1.5  # per keystroke string: a command still running after it is left running
NAMES = ("service_left_running", "persistent_shell", "interactive_prompt",
         "interrupt_and_redo")


def seeds(family: str, n_train: int = 2, n_held: int = 1) -> list[int]:
    train = [s for s in range(100) if not heldout_seed(family, s)][:n_train]
    held = [s for s in range(100) if heldout_seed(family, s)][:n_held]
    return train + held


CASES = [(f, s) for f in NAMES for s in seeds(f)]


def attempt(task, keystrokes, *, session: bool = True, backend: str = BACKEND):
    """Type `keystrokes` into a fresh session of the task's sandbox (or, with
    session=False, run each as its own exec, key names skipped); verify in shared mode."""
    with open_task_sandbox(task, backend, allow_plain=ALLOW_PLAIN) as sb:
        if not session:
            for k in keystrokes:
                if not is_key_name(k):
                    sb.exec(k.removesuffix("\n"), timeout=10)
            return verify(task, sb, mode="shared")
        with sb.open_session() as term:
            for k in keystrokes:
                term.run(k, WAIT_S)
            return verify(task, sb, mode="shared")


def reference(task) -> list[str]:
    return [k for turn in task.solution for k in turn]


def test_inventory_and_task_shape():
    assert tuple(TERMINAL_FAMILIES) == NAMES
    assert set(TERMINAL_FAMILIES).isdisjoint(FAMILIES)
    assert set(HELDOUT_FAMILIES) | set(TRAIN_FAMILIES) == set(FAMILIES)  # unchanged
    for name, fam in TERMINAL_FAMILIES.items():
        for seed in range(6):
            task = make_task(name, seed)
            assert "terminal" in task.metadata.tags and task.verifier.mode == "shared"
            assert fam.checks[0] <= task.expected_checks <= fam.checks[1]
            assert len(task.solution) >= fam.turns == task.turns >= 2
            keys = reference(task) + partial_solution(task)
            assert all(k.endswith("\n") or is_key_name(k) for k in keys), keys
            hidden = hidden_values(task)
            first = " ".join(task.solution[0])
            later = " ".join(c for t in task.solution[1:] for c in t)
            assert hidden and all(v not in task.instruction and v not in first and v in later
                                  for v in hidden), (name, seed, hidden)
        a, b, c = make_task(name, 11), make_task(name, 11), make_task(name, 12)
        assert dict(a.environment.files) == dict(b.environment.files)
        assert dict(c.environment.files) != dict(a.environment.files)
    plain = make_task("sort_uniq", 1)
    assert plain.verifier.mode == "separate" and "terminal" not in plain.metadata.tags


@pytest.mark.parametrize(("family", "seed"), CASES)
def test_reference_passes_partial_fails(family, seed):
    task = make_task(family, seed)
    n = task.expected_checks
    ref = attempt(task, reference(task))
    assert (ref.S, ref.P, ref.N) == (1, n, n), ref.ctrf
    assert not ref.report.hygiene_failed
    part = attempt(task, partial_solution(task))
    assert part.S == 0 and part.N == n and 0 < part.P < n, part.ctrf


@pytest.mark.parametrize(("family", "seed"), [(f, s) for f in ("persistent_shell",
                                                               "service_left_running")
                                              for s in seeds(f, 1, 1)])
def test_without_a_session_the_reference_fails(family, seed):
    task = make_task(family, seed)
    r = attempt(task, reference(task), session=False)
    assert r.S == 0 and r.P == 0, r.ctrf


def test_job_left_running_or_answers_piped_fail():
    task = make_task("interrupt_and_redo", 5)
    flag = hidden_values(task)[0]
    # backgrounded instead of interrupted: the rerun finds the lock held, nothing is written.
    # The rerun is typed only once the background job says it waits (it holds job.lock by
    # then); typed at once, on a loaded machine, the rerun could take the lock first.
    with open_task_sandbox(task, BACKEND, allow_plain=ALLOW_PLAIN) as sb, \
            sb.open_session() as term:
        seen = term.run("./job.sh &\n", WAIT_S).text
        deadline = time.monotonic() + 30
        while "waiting for lock" not in seen and time.monotonic() < deadline:
            term.wait(0.5)
            seen += term.read().text
        assert "waiting for lock" in seen, seen
        term.run(f"./job.sh {flag}\n", WAIT_S)
        r = verify(task, sb, mode="shared")
    assert r.S == 0 and r.P == 0, r.ctrf
    task = make_task("interactive_prompt", 5)
    r = attempt(task, [f"printf 'y\\n{hidden_values(task)[0]}\\n' | ./setup.sh\n"])
    assert r.S == 0 and r.P == 0, r.ctrf


@pytest.mark.parametrize("family", NAMES)
def test_reference_on_plain_backend(family):
    task = make_task(family, 4)
    ref = attempt(task, reference(task), backend="local-plain")
    assert (ref.S, ref.P) == (1, ref.N), ref.ctrf


def test_terminal_suite_splits():
    train = list(get_suite("terminal", "train", n_per_family=2))
    trained = [n for n in NAMES if n not in TERMINAL_HELDOUT_FAMILIES]
    assert len(train) == 6 and len(trained) == 3
    assert collections.Counter(t.family for t in train) == dict.fromkeys(trained, 2)
    held = list(get_suite("terminal", "heldout_families", n_per_family=2))
    assert {t.family for t in held} == set(TERMINAL_HELDOUT_FAMILIES)
    test = list(get_suite("terminal", "test", n_per_family=3))
    every = list(get_suite("terminal", "all", n_per_family=5))
    assert all(not heldout_seed(t.family, t.seed) for t in train)
    assert all(heldout_seed(t.family, t.seed) for t in test)
    assert not {t.id for t in train} & {t.id for t in test}
    assert [t.seed for t in every if t.family == NAMES[0]] == list(range(5))
    assert all("terminal" in t.metadata.tags for t in train + test + every)
    only = list(get_suite("terminal", "train", n_per_family=1, families=("persistent_shell",)))
    assert [t.family for t in only] == ["persistent_shell"]
    with pytest.raises(ValueError, match="split"):
        get_suite("terminal", "nope")
    with pytest.raises(ValueError, match="not in split"):
        get_suite("terminal", "train", families=("sort_uniq",))
    with pytest.raises(ValueError, match="not in split"):
        get_suite("terminal", "train", families=TERMINAL_HELDOUT_FAMILIES)
    # the builtin suite does not serve terminal families
    assert not {t.family for t in get_suite("builtin", "all", n_per_family=1)} & set(NAMES)
    with pytest.raises(KeyError, match="unknown built-in family"):
        make_task("no_such_family", 0)


@pytest.mark.parametrize("family", ["persistent_shell", "interrupt_and_redo"])
def test_run_reference_types_a_terminal_task_into_a_session(family):
    task = make_task(family, 2)
    res = run_reference(task, backend="local", sandbox_kwargs={"allow_plain": "builtin"})
    assert res.S == 1 and res.mode == "shared", res.ctrf
