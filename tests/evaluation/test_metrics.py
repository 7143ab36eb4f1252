"""Evaluation metrics against independent NumPy references, with and without jit."""

import math

import chex
import jax
import numpy as np
from absl.testing import parameterized

from terminal_rsi.evaluation import metrics as M


def pass_at_k_ref(n: int, c: int, k: int) -> float:
    """Chen et al. (2021) by exact binomials."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


class MetricsTest(chex.TestCase, parameterized.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_mean_at_k_is_mean_of_run_rates(self):
        rng = np.random.default_rng(0)
        s = (rng.random((7, 3)) < 0.4).astype(np.float32)
        got = self.variant(M.mean_at_k)(s)
        ref = np.mean([s[:, r].mean() for r in range(3)])
        np.testing.assert_allclose(got, ref, rtol=1e-6)
        np.testing.assert_allclose(self.variant(M.run_success_rates)(s), s.mean(0), rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(1, 2, 3, 5)
    def test_pass_at_k_matches_exact_binomials(self, k):
        rng = np.random.default_rng(k)
        n = rng.integers(k, 12, size=20)
        c = np.array([rng.integers(0, x + 1) for x in n])
        fn = self.variant(lambda a, b: M.pass_at_k_per_task(a, b, k))
        got = np.asarray(fn(n, c))
        ref = np.array([pass_at_k_ref(int(a), int(b), k) for a, b in zip(n, c, strict=True)])
        np.testing.assert_allclose(got, ref, atol=2e-5)
        np.testing.assert_allclose(self.variant(lambda a, b: M.pass_at_k(a, b, k))(n, c),
                                   ref.mean(), atol=2e-5)

    def test_pass_at_k_differs_from_mean_at_k(self):
        # one task solved in 1 of 3 runs: Mean@3 = 1/3, pass@3 = 1, pass@1 = 1/3
        s = np.array([[1.0, 0.0, 0.0]])
        assert abs(float(M.mean_at_k(s)) - 1 / 3) < 1e-6
        assert abs(float(M.pass_at_k(np.array([3]), np.array([1]), 3)) - 1.0) < 1e-6
        assert abs(float(M.pass_at_k(np.array([3]), np.array([1]), 1)) - 1 / 3) < 1e-6

    @chex.variants(with_jit=True, without_jit=True)
    def test_process_reward(self):
        p, n, s = np.array([0, 2, 3, 0]), np.array([4, 4, 3, 0]), np.array([0, 0, 1, 1])
        got = self.variant(M.process_reward)(p, n, s)
        np.testing.assert_allclose(got, [0.0, 0.5, 1.0, 1.0])


def test_jitted_pass_at_k_large_n_is_finite():
    n, c = np.array([200, 200]), np.array([3, 197])
    got = np.asarray(jax.jit(lambda a, b: M.pass_at_k_per_task(a, b, 10))(n, c))
    ref = [pass_at_k_ref(200, 3, 10), pass_at_k_ref(200, 197, 10)]
    np.testing.assert_allclose(got, ref, atol=1e-4)
