"""The RPR task curriculum (terminal_rsi.rpr.curriculum): draws, statistics, resume."""

import dataclasses

import numpy as np
import pytest

from terminal_rsi.rpr.curriculum import PRIOR_COUNT, PRIOR_VARIANCE, Curriculum, FamilyStats


@dataclasses.dataclass
class _Task:
    id: str
    family: str


@dataclasses.dataclass
class _Episode:
    family: str
    reward: float


TASKS = [_Task(f"{f}/{i}", f) for f in ("a", "b", "c") for i in range(2)]


def test_cyclic_is_the_plain_pass_over_the_pool():
    cur = Curriculum(TASKS, "cyclic")
    rng = np.random.default_rng(0)
    got = cur.launch(8, 5, rng)
    assert [t.id for t in got] == [TASKS[(5 + i) % 6].id for i in range(8)]
    assert cur.summary() == {}


def test_family_stats_match_numpy_variance_with_the_prior():
    rng = np.random.default_rng(3)
    xs = rng.uniform(0, 1, size=17)
    s = FamilyStats()
    for x in xs:
        s.add(float(x))
    m2 = float(np.sum((xs - xs.mean()) ** 2))
    np.testing.assert_allclose(s.mean, xs.mean(), rtol=1e-12)
    np.testing.assert_allclose(s.m2, m2, rtol=1e-10)
    np.testing.assert_allclose(s.variance(),
                               (PRIOR_COUNT * PRIOR_VARIANCE + m2) / (PRIOR_COUNT + 17))


def test_mixed_families_are_drawn_more_and_the_floor_keeps_the_rest():
    floor = 0.2
    cur = Curriculum(TASKS, "reward_variance", floor=floor)
    np.testing.assert_allclose(cur.probabilities(), [1 / 3] * 3)  # nothing seen yet
    cur.update([_Episode("a", 1.0)] * 20 + [_Episode("b", float(i % 2)) for i in range(20)]
               + [_Episode("c", 0.0)] * 20)
    p = cur.probabilities()
    v = np.array([cur.stats[f].variance() for f in ("a", "b", "c")])
    w = v + floor * v.mean()
    np.testing.assert_allclose(p, w / w.sum(), rtol=1e-12)
    assert p[1] > 0.5 > p[0] and p[0] == pytest.approx(p[2])
    assert p[0] >= floor * v.mean() / w.sum()
    draws = cur.launch(400, 0, np.random.default_rng(1))
    counts = {f: sum(t.family == f for t in draws) for f in ("a", "b", "c")}
    assert counts["b"] > counts["a"] + counts["c"]
    # within a family the tasks are taken in turn
    b_ids = [t.id for t in draws if t.family == "b"]
    assert b_ids[:4] == ["b/0", "b/1", "b/0", "b/1"]


def test_draws_are_seeded_and_the_state_survives_a_resume():
    def run(cur, seed):
        return [t.id for t in cur.launch(12, 0, np.random.default_rng(seed))]

    a = Curriculum(TASKS, "reward_variance")
    a.update([_Episode("a", 0.0), _Episode("a", 1.0), _Episode("c", 0.5)])
    first = run(a, 7)
    b = Curriculum(TASKS, "reward_variance")
    b.load(a.to_dict())
    assert b.to_dict() == a.to_dict()
    assert run(a, 9) == run(b, 9)  # same statistics and cursors -> same continuation
    c = Curriculum(TASKS, "reward_variance")
    c.update([_Episode("a", 0.0), _Episode("a", 1.0), _Episode("c", 0.5)])
    assert run(c, 7) == first


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="rollout.curriculum"):
        Curriculum(TASKS, "hardest_first")
    with pytest.raises(ValueError, match="curriculum_floor"):
        Curriculum(TASKS, "reward_variance", floor=-1.0)
