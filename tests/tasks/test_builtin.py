"""Built-in families: reference passes strictly, empty attempt fails, partial is partial."""

from __future__ import annotations

import collections
import re
import types

import pytest

from terminal_rsi.rewards import parse_ctrf
from terminal_rsi.tasks import VerifierError, get_suite, pool_tasks
from terminal_rsi.tasks.builtin import (
    FAMILIES,
    HELDOUT_FAMILIES,
    TRAIN_FAMILIES,
    heldout_seed,
    hidden_values,
    make_task,
    partial_solution,
)
from terminal_rsi.tasks.spec import DIFFICULTIES, Task, VerifierSpec
from terminal_rsi.tasks.verify import (
    CheckResult,
    ctrf_document,
    open_task_sandbox,
    seed_files,
    verify,
)

SEEDS = range(20)
BACKEND = "local-plain"  # fastest local backend; the bwrap path is covered below


def test_inventory():
    assert len(FAMILIES) >= 12
    assert sum(f.turns >= 2 for f in FAMILIES.values()) >= 4
    lo = min(f.checks[0] for f in FAMILIES.values())
    hi = max(f.checks[1] for f in FAMILIES.values())
    assert lo == 1 and hi >= 20
    assert all(f.difficulty in DIFFICULTIES for f in FAMILIES.values())
    assert set(HELDOUT_FAMILIES).isdisjoint(TRAIN_FAMILIES)
    assert set(HELDOUT_FAMILIES) | set(TRAIN_FAMILIES) == set(FAMILIES)


def _reset(sb, task):
    r = sb.exec("find . -mindepth 1 -delete", timeout=30)
    assert r.ok, r.stderr
    seed_files(sb, task.environment.files, task.environment.modes)


def _attempt(sb, commands):
    # All commands of one turn in one exec (same semantics, fewer process chains).
    if commands:
        sb.exec("\n".join(commands), timeout=60)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_reference_empty_partial_20_seeds(family):
    fam = FAMILIES[family]
    seen_n = set()
    task0 = make_task(family, 0)
    with open_task_sandbox(task0, BACKEND) as sb:
        for seed in SEEDS:
            task = make_task(family, seed)
            if seed:
                _reset(sb, task)
            n = task.expected_checks
            seen_n.add(n)
            assert fam.checks[0] <= n <= fam.checks[1]

            empty = verify(task, sb, backend=BACKEND)
            assert empty.report.valid and empty.N == n
            assert empty.S == 0 and empty.P < n, (seed, empty.report)

            _attempt(sb, partial_solution(task))
            part = verify(task, sb, backend=BACKEND)
            assert part.S == 0 and part.N == n, (seed, part.report)
            if n >= 2:
                assert 0 < part.P < n, (seed, part.ctrf)
            else:  # N = 1: 0 < P < N is impossible; the partial attempt fails on hygiene
                assert part.P == 1 and part.report.hygiene_failed, part.report

            _reset(sb, task)
            for turn in task.solution:
                _attempt(sb, turn)
            ref = verify(task, sb, backend=BACKEND, hygiene=empty_rule())
            assert ref.S == 1 and ref.P == ref.N == n, (seed, ref.ctrf)
            assert not ref.report.hygiene_failed
            # the emitted document is a valid current-spec CTRF report, strictly parsed
            strict = parse_ctrf(ref.ctrf, terminal_success=True, strict=True)
            assert strict.shape == "ctrf" and (strict.P, strict.N) == (n, n)
            assert len(strict.hygiene_checks) == 2


def empty_rule():
    from terminal_rsi.rewards import DEFAULT_HYGIENE

    return DEFAULT_HYGIENE


def test_multi_turn_hidden_values():
    for name, fam in FAMILIES.items():
        for seed in range(5):
            task = make_task(name, seed)
            assert len(task.solution) >= fam.turns == task.turns
            if fam.turns < 2:
                continue
            hidden = hidden_values(task)
            assert hidden, name
            first = " ".join(task.solution[0])
            later = " ".join(c for t in task.solution[1:] for c in t)
            for v in hidden:
                assert v not in task.instruction, (name, v)
                assert v not in first and v in later, (name, v)


def test_bwrap_backend_reference():
    from terminal_rsi.sandbox.local import bwrap_available

    if not bwrap_available():
        pytest.skip("bubblewrap is not usable here (apt-get install bubblewrap; needs user "
                    "namespaces)")
    for name in ("fix_script", "permissions", "archive"):
        task = make_task(name, 7)
        with open_task_sandbox(task, "local-bwrap") as sb:
            for turn in task.solution:
                _attempt(sb, turn)
            r = verify(task, sb, backend="local-bwrap")
        assert (r.S, r.P, r.N) == (1, task.expected_checks, task.expected_checks)


def test_agent_sees_no_verifier():
    task = make_task("env_repair", 3)
    with open_task_sandbox(task, BACKEND) as sb:
        names = sb.exec("find . -type f | sort", timeout=10).stdout.split()
    assert sorted(n.removeprefix("./") for n in names) == sorted(task.environment.files)


def test_shared_mode_same_verdict():
    task = make_task("fix_script", 4)
    with open_task_sandbox(task, BACKEND) as sb:
        for turn in task.solution:
            _attempt(sb, turn)
        a = verify(task, sb, backend=BACKEND, mode="separate")
        b = verify(task, sb, backend=BACKEND, mode="shared")
    assert (a.S, a.P, a.N) == (b.S, b.P, b.N) == (1, task.expected_checks, task.expected_checks)
    assert (a.mode, b.mode) == ("separate", "shared")


def test_splits():
    train = list(get_suite("builtin", "train", n_per_family=30))
    test = list(get_suite("builtin", "test", n_per_family=5))
    held = list(get_suite("builtin", "heldout_families", n_per_family=3))
    assert {t.family for t in train} == set(TRAIN_FAMILIES)
    assert {t.family for t in held} == set(HELDOUT_FAMILIES)
    assert not {(t.family, t.seed) for t in train} & {(t.family, t.seed) for t in test}
    assert all(not heldout_seed(t.family, t.seed) for t in train)
    assert all(heldout_seed(t.family, t.seed) for t in test)
    assert collections.Counter(t.family for t in train) == dict.fromkeys(TRAIN_FAMILIES, 30)
    frac = sum(heldout_seed("sort_uniq", s) for s in range(2000)) / 2000
    assert 0.15 < frac < 0.25
    with pytest.raises(ValueError, match="split"):
        get_suite("builtin", "nope")


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_instances_deterministic_per_seed(family):
    """The same seed gives the same instance byte for byte (archives included: no time
    stamps), and another seed another instance."""
    a, b = make_task(family, 11), make_task(family, 11)
    assert a.instruction == b.instruction and a.solution == b.solution
    assert dict(a.environment.files) == dict(b.environment.files)
    for s in (12, 13):
        c = make_task(family, s)
        assert (c.instruction, dict(c.environment.files)) != (a.instruction,
                                                               dict(a.environment.files))


def test_ctrf_document_and_hygiene_tags():
    checks = [CheckResult("a works", True), CheckResult("b works", False, message="no"),
              CheckResult("hygiene::x", False, hygiene=True)]
    doc = ctrf_document(checks)
    rep = parse_ctrf(doc, terminal_success=False, strict=True)
    assert (rep.P, rep.N, rep.failed) == (1, 2, 1)
    assert rep.hygiene_failed == ("hygiene::x",)


def test_broken_check_is_verifier_error_not_zero():
    def boom(snapshot, run):
        raise KeyError("oops")

    task = Task(id="boom", family="boom", instruction="do nothing",
                verifier=VerifierSpec(kind="builtin", check=boom))
    with open_task_sandbox(task, BACKEND) as sb, pytest.raises(VerifierError) as e:
        verify(task, sb, backend=BACKEND)
    assert e.value.kind == "crash"


def test_fix_script_runs_the_original_check():
    """Rewriting check.sh to print 'all ok' does not pass the check (nor hygiene)."""
    task = make_task("fix_script", 2)
    with open_task_sandbox(task, BACKEND) as sb:
        sb.exec("printf '#!/bin/sh\\necho all ok\\n' > check.sh")
        r = verify(task, sb, backend=BACKEND)
    assert r.S == 0
    names = {t["name"]: t["status"] for t in r.ctrf["results"]["tests"]}
    assert names["check.sh passes"] == "failed"
    assert names["hygiene::inputs_unchanged"] == "failed"


# look, act, check: each later turn copies a value only the turn before it showed
CHAIN_FAMILIES = ("value_relay", "service_query", "find_then_fix", "count_then_report")


@pytest.mark.parametrize("family", CHAIN_FAMILIES)
def test_chain_families_need_three_turns(family):
    """Every hidden value first appears in the reference's commands at turn k (2 or 3, both
    taken) and in the output of turn k - 1, never in an earlier turn's output: the third
    turn needs what the second turn's action showed. Observations fit the tiny harness
    (300 characters)."""
    from terminal_rsi.agent.actions import Command, format_observation

    for seed in range(4):
        task = make_task(family, seed)
        hidden = hidden_values(task)
        assert FAMILIES[family].turns == len(task.solution) == 3
        outputs = []
        with open_task_sandbox(task, BACKEND) as sb:
            for turn in task.solution:
                res = [(Command(c), sb.exec(c, timeout=30)) for c in turn]
                assert len(format_observation(res, max_chars=10**6)) < 300, (seed, res)
                outputs.append(" ".join(r.stdout + r.stderr for _, r in res))

        def has(v, text):  # as a whole word: "4" is not in "340"
            return re.search(rf"(?<!\w){re.escape(v)}(?!\w)", text) is not None

        used = {v: min(i for i, t in enumerate(task.solution) if any(has(v, c) for c in t))
                for v in hidden}
        assert sorted(set(used.values())) == [1, 2], (seed, used)
        for v, k in used.items():
            assert has(v, outputs[k - 1]), (seed, v, outputs)
            assert not any(has(v, o) for o in outputs[:k - 1]), (seed, v, outputs)


def test_find_then_fix_runs_the_original_check():
    """check.sh rewritten to print 'all ok' does not pass (nor hygiene); deleting the files
    it names passes the original check.sh but not the fixed-file checks."""
    task = make_task("find_then_fix", 2)
    with open_task_sandbox(task, BACKEND) as sb:
        sb.exec("printf '#!/bin/sh\\necho all ok\\n' > check.sh; sh check.sh > ok.txt")
        r = verify(task, sb, backend=BACKEND)
    assert r.S == 0 and r.P == 0, r.ctrf
    names = {t["name"]: t["status"] for t in r.ctrf["results"]["tests"]}
    assert names["check.sh passes"] == "failed"
    assert names["hygiene::inputs_unchanged"] == "failed"
    with open_task_sandbox(task, BACKEND) as sb:
        sb.exec("rm " + " ".join(hidden_values(task)) + "; sh check.sh > ok.txt")
        r = verify(task, sb, backend=BACKEND)
    assert (r.S, r.P, r.N) == (0, 2, 4), r.ctrf


def test_tasks_pickle_and_still_verify():
    import pickle

    task = pickle.loads(pickle.dumps(make_task("fix_script", 5)))
    assert task == make_task("fix_script", 5)
    with open_task_sandbox(task, BACKEND) as sb:
        for turn in task.solution:
            _attempt(sb, turn)
        r = verify(task, sb, backend=BACKEND)
    assert (r.S, r.P, r.N) == (1, task.expected_checks, task.expected_checks)


def test_pool_tasks_reads_a_config_pool_and_raises_the_callers_error():
    pool = types.SimpleNamespace(suite="builtin", families=("count_lines",))
    got = pool_tasks(pool, "train", 2)
    assert [t.id for t in got] == [t.id for t in get_suite(
        "builtin", "train", n_per_family=2, families=("count_lines",))]
    assert {t.family for t in pool_tasks(types.SimpleNamespace(suite="builtin", families=()),
                                         "heldout_families", 1)} == set(HELDOUT_FAMILIES)

    class Mine(RuntimeError):
        pass

    with pytest.raises(Mine, match="no tasks in suite 'builtin' split 'train'; check "
                                   "config.tasks"):
        pool_tasks(pool, "train", 0, Mine)
