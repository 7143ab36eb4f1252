"""Structural-proxy strata: percentile ranks, quartile cutoffs, ties to the lower stratum."""

import chex
import numpy as np
import pytest

from terminal_rsi.evaluation import strata as S
from terminal_rsi.tasks import get_suite


def ranks_ref(x):
    x = np.asarray(x, float)
    return np.array([np.sum(x <= xi) / len(x) for xi in x])


def assign_ref(scores, cut):
    out = []
    for s in scores:
        k = 0
        for c in cut:
            if s > c:  # equal to a cutoff: stays in the lower stratum
                k += 1
        out.append(k)
    return np.array(out)


class StrataTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_percentile_ranks_and_scores(self):
        x = np.array([3.0, 1.0, 3.0, 7.0, 2.0])
        np.testing.assert_allclose(self.variant(S.percentile_ranks)(x), ranks_ref(x))
        p = np.random.default_rng(0).integers(0, 5, size=(11, 3)).astype(np.float32)
        ref = np.mean([ranks_ref(p[:, i]) for i in range(3)], axis=0)
        np.testing.assert_allclose(self.variant(S.difficulty_scores)(p), ref, rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_assignment_places_ties_in_lower_stratum(self):
        cut = np.array([0.25, 0.5, 0.75], np.float32)
        scores = np.array([0.1, 0.25, 0.26, 0.5, 0.6, 0.75, 0.9], np.float32)
        got = np.asarray(self.variant(S.assign_strata)(scores, cut))
        np.testing.assert_array_equal(got, [0, 0, 1, 1, 2, 2, 3])
        np.testing.assert_array_equal(got, assign_ref(scores, cut))

    @chex.variants(with_jit=True, without_jit=True)
    def test_cutoffs_are_linear_quartiles(self):
        s = np.random.default_rng(1).random(13).astype(np.float32)
        np.testing.assert_allclose(self.variant(S.quartile_cutoffs)(s),
                                   np.quantile(s, [0.25, 0.5, 0.75]), rtol=1e-6)


def test_ties_in_scores_share_the_lower_stratum():
    # many equal scores at the median: all of them in the same (lower) stratum
    scores = np.array([0.2, 0.5, 0.5, 0.5, 0.5, 0.9], np.float32)
    cut = np.asarray(S.quartile_cutoffs(scores))
    assert cut[1] == np.float32(0.5)
    got = np.asarray(S.assign_strata(scores, cut))
    assert len(set(got[1:5].tolist())) == 1 and got[1] == np.sum(cut < 0.5)


def test_fit_strata_on_builtin_tasks_is_frozen_and_roundtrips(tmp_path):
    tasks = list(get_suite("builtin", "test", n_per_family=2)) + list(
        get_suite("builtin", "heldout_families", n_per_family=2))
    table = S.fit_strata(tasks)
    assert set(table.assignments) == {t.id for t in tasks}
    counts = table.counts()
    assert sum(counts.values()) == len(tasks) and counts["Q1"] > 0 and counts["Q4"] > 0
    for t in tasks:
        i = S.STRATA.index(table.stratum(t.id))
        assert i == int(np.sum(np.float32(table.scores[t.id]) > np.float32(table.cutoffs)))
    # the same tasks give the same table; saved tables load back unchanged
    assert S.fit_strata(tasks).assignments == table.assignments
    table.save(tmp_path / "strata.json")
    back = S.StrataTable.load(tmp_path / "strata.json")
    assert back.assignments == table.assignments and back.cutoffs == table.cutoffs
    with pytest.raises(S.StrataError):
        back.stratum("nope/0")


def test_structural_proxies_of_a_builtin_task():
    t = next(iter(get_suite("builtin", "test", n_per_family=1, families=("count_lines",))))
    checks, footprint, length = S.structural_proxies(t)
    assert checks == t.expected_checks == 2
    assert footprint == len(t.environment.files) + sum(len(x) for x in t.solution)
    assert length == len(t.instruction)
