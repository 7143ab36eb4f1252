"""Evaluation metrics (paper §3.1 "Evaluation protocol", §3.3, §3.4): pure jit-able functions.

- Mean@k: the arithmetic mean of binary strict success over k independent runs of every task
  (the paper's primary number: "three independent runs, reporting their arithmetic mean
  (Mean@3), not pass@3 or a union of solved tasks").
- pass@k: the unbiased estimator of Chen et al. (2021), 1 - C(n - c, k) / C(n, k) per task
  with n attempts of which c succeeded, averaged over tasks. Reported separately from Mean@k.
- process reward: the fraction of a report's checks that passed, P / N (falls back to strict
  success S when the report has no checks), versus strict completion S.
- explained variance of the critic: EV = 1 - Var(G - V) / Var(G) over generated tokens (§3.3;
  distinct from squared correlation) is `terminal_rsi.training.losses.explained_variance`.

Attempts that produced no verdict (dropped episodes, runner errors) count as failures
("existing attempts without rewards count as failures", §3.4): callers fill them with 0.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp


def mean_at_k(success: chex.Array) -> chex.Array:
    """Mean@k. success: [T, k] (0/1, float or bool), task t's run r. Returns a scalar float32:
    mean over runs of each run's success rate (= the mean over all T·k entries)."""
    chex.assert_rank(success, 2)
    return jnp.mean(jnp.asarray(success, jnp.float32))


def run_success_rates(success: chex.Array) -> chex.Array:
    """[k] success rate of each run (success: [T, k]); their spread measures inference
    variability (not training replication)."""
    chex.assert_rank(success, 2)
    return jnp.mean(jnp.asarray(success, jnp.float32), axis=0)


def pass_at_k_per_task(n: chex.Array, c: chex.Array, k: int) -> chex.Array:
    """Unbiased pass@k per task: 1 - C(n - c, k) / C(n, k) (Chen et al. 2021, Eq. 1).

    n: [T] int attempts per task (n >= k), c: [T] int successes (0 <= c <= n); k: static int.
    Returns [T] float32. Computed in log space with lgamma; exactly 1 when n - c < k.
    """
    chex.assert_rank([n, c], 1)
    chex.assert_equal_shape([n, c])
    n = jnp.asarray(n, jnp.float32)
    c = jnp.asarray(c, jnp.float32)
    lg = jax.lax.lgamma
    fails = n - c
    # log C(n - c, k) - log C(n, k); the k! terms cancel
    log_ratio = (lg(fails + 1.0) - lg(jnp.maximum(fails - k, 0.0) + 1.0)
                 - lg(n + 1.0) + lg(n - k + 1.0))
    return jnp.where(fails < k, 1.0, 1.0 - jnp.exp(log_ratio))


def pass_at_k(n: chex.Array, c: chex.Array, k: int) -> chex.Array:
    """Mean over tasks of `pass_at_k_per_task` (scalar float32)."""
    return jnp.mean(pass_at_k_per_task(n, c, k))


def process_reward(passed: chex.Array, total: chex.Array, success: chex.Array) -> chex.Array:
    """Per-episode process reward P / N ([E] each -> [E] float32); S where N = 0."""
    chex.assert_rank([passed, total, success], 1)
    chex.assert_equal_shape([passed, total, success])
    p = jnp.asarray(passed, jnp.float32)
    t = jnp.asarray(total, jnp.float32)
    return jnp.where(t > 0, p / jnp.maximum(t, 1.0), jnp.asarray(success, jnp.float32))
