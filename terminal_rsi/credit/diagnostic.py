"""Component-level CPU diagnostic of TB-GAE (paper/component_review.md, "Local reproduction").

For one seed: a chain of `num_generated` generated-token values over `num_turns` turns with
one terminal reward on the last generated token, then

  * reference error: TB-GAE against the independent float64 double sum of Eq. 10;
  * insertion error: `num_observations` observation positions (junk values,
    zero reward) inserted at random places leave every generated output unchanged;
  * continuation error: the row split before generated position `split_at`,
    the tail run first and its full carry (v, A, turn, exists) fed to the head;
  * negative control: the same split with the carried trace A zeroed
    (value bootstrap kept), which must differ, by W_{j,b+1} A_{b+1} (Eq. 12).

`check_seed` measures one seed and method, `mean_over_seeds` averages the rows. The experiment
"credit_diagnostic" (`terminal_rsi.experiments.credit_diagnostic`) runs them over its seeds
and methods, prints the table and writes `credit_diagnostic.json`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from terminal_rsi.credit.reference import tb_gae_double_sum
from terminal_rsi.credit.turn_boundary_gae import METHODS, tb_gae

METHOD_NAMES = METHODS
ERRORS = ("reference_error", "insertion_error", "continuation_error", "negative_control_error")


def make_chain(seed: int, num_generated: int, num_turns: int, terminal_reward: float):
    """One row of `num_generated` generated tokens in `num_turns` non-empty turns, terminated."""
    rng = np.random.default_rng(seed)
    cuts = np.sort(rng.choice(np.arange(1, num_generated), size=num_turns - 1, replace=False))
    turn_ids = np.searchsorted(cuts, np.arange(num_generated), side="right")
    values = rng.normal(size=num_generated)
    rewards = np.zeros(num_generated)
    rewards[-1] = terminal_reward
    dones = np.zeros(num_generated, bool)
    dones[-1] = True
    return rng, rewards, values, turn_ids, dones


def insert_observations(rng, rewards, values, turn_ids, dones, count):
    """Insert `count` observation positions at random places (before, between, after tokens)."""
    n = len(rewards)
    slots = np.sort(rng.integers(0, n + 1, size=count))
    src = np.insert(np.arange(n), slots, -1)
    gen = src >= 0
    take = np.maximum(src, 0)
    r = np.where(gen, rewards[take], 0.0)
    v = np.where(gen, values[take], rng.normal(size=len(src)))  # junk values at observations
    # An observation belongs to the turn it follows (its own turn id would be as good).
    t = np.maximum.accumulate(np.where(gen, turn_ids[take], -1))
    t = np.where(t < 0, 0, t)
    d = np.where(gen, dones[take], False)
    return r, v, t, gen, d


def check_seed(seed: int, *, method: str, dtype, num_generated: int, num_turns: int,
               num_observations: int, split_at: int, gamma_turn: float, lambda_turn: float,
               terminal_reward: float) -> dict:
    """The four errors (module doc) of one seed's chain under TB-GAE `method`, computed in
    `dtype` (float64 needs `jax.enable_x64`): a row of the diagnostic's table."""
    rng, r0, v0, t0, d0 = make_chain(seed, num_generated, num_turns, terminal_reward)
    gamma, lam = gamma_turn, lambda_turn
    f = jax.jit(functools.partial(tb_gae, gamma_turn=gamma, lambda_turn=lam, method=method))

    def run(r, v, t, g, d, carry=None):
        arrays = [jnp.asarray(x[None], dtype) for x in (r, v)]
        arrays += [jnp.asarray(t[None], jnp.int32), jnp.asarray(g[None]), jnp.asarray(d[None])]
        adv, ret, carry_out = f(*arrays, carry=carry)
        return np.asarray(adv[0], np.float64), np.asarray(ret[0], np.float64), carry_out

    ones = np.ones(len(r0), bool)
    base_adv, _, _ = run(r0, v0, t0, ones, d0)

    r, v, t, g, d = insert_observations(rng, r0, v0, t0, d0, num_observations)
    adv, ret, _ = run(r, v, t, g, d)
    ref_adv, ref_ret = tb_gae_double_sum(r[None], v[None], t[None], g[None], d[None], gamma, lam)
    u = np.flatnonzero(g)
    b = u[split_at]  # flat position of the first generated token of the tail chunk
    # Chunks are padded back to the full length with non-generated positions (passed through
    # by the recursion) so every seed and chunk reuses one compiled shape.
    n = len(r)

    def chunk(x, lo, hi):
        return np.pad(x[lo:hi], (lo, n - hi))

    tail_adv, _, tail_carry = run(*(chunk(x, b, n) for x in (r, v, t, g, d)))
    head_adv, _, _ = run(*(chunk(x, 0, b) for x in (r, v, t, g, d)), carry=tail_carry)
    cut = tail_carry._replace(advantage=jnp.zeros_like(tail_carry.advantage))
    cut_adv, _, _ = run(*(chunk(x, 0, b) for x in (r, v, t, g, d)), carry=cut)
    head_adv, tail_adv, cut_adv = head_adv[:b], tail_adv[b:], cut_adv[:b]
    continued = np.concatenate([head_adv, tail_adv])
    return {
        "seed": seed,
        "method": method,
        "reference_error": float(
            max(np.abs(adv - ref_adv[0]).max(), np.abs(ret - ref_ret[0]).max())
        ),
        "insertion_error": float(np.abs(adv[g] - base_adv).max()),
        "continuation_error": float(np.abs(continued - adv).max()),
        "negative_control_error": float(np.abs(cut_adv - adv[:b]).max()),
        "split_flat_position": int(b),
        "length_with_observations": len(r),
    }


def mean_over_seeds(rows: list[dict], methods: tuple[str, ...]) -> dict[str, dict[str, float]]:
    """{method: {error name: mean over that method's rows}} of `check_seed` rows."""
    out = {}
    for method in methods:
        mine = [row for row in rows if row["method"] == method]
        out[method] = {key: float(np.mean([row[key] for row in mine])) for key in ERRORS}
    return out
