"""Reward functions: binary, FDR (Eq. 6) and SPR (Eq. 7), scalar and vectorized.

Scalar forms take a `VerificationReport`, the episode's family and a divisor table
(`FamilyDivisors`, or anything with `.get(family) -> D_f`: `DivisorTable`); vectorized
forms take arrays and run under `jit`. `REWARDS` is the table of both by name; every reward
setting's choices are its `REWARD_NAMES`, and code looks a reward up with `get_reward`:

    R_FDR = max(P / D_f, 0)          if the report is valid, else S      (Eq. 6)
    R_SPR = S + P / (P + D'_f)       if the report is valid, else S      (Eq. 7)
    R_binary = S

SPR's progress term g(P) = P / (P + D') lies in [0, 1) mathematically, but for
enormous P it rounds to 1.0 in floating point; we clamp it to the largest float
below 1 for failures, and 1 + g to the largest float below 2 for successes, so
every failure scores < 1 <= every success and 0 <= R_SPR < 2 hold exactly.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from terminal_rsi.rewards.ctrf import VerificationReport
from terminal_rsi.settings import SettingError

if TYPE_CHECKING:
    import chex

_BELOW_ONE = math.nextafter(1.0, 0.0)
_BELOW_TWO = math.nextafter(2.0, 0.0)


class RewardInputError(ValueError):
    """Reward inputs violate the preconditions (finite P >= 0, D > 0)."""


class DivisorTable(Protocol):
    """What the reward functions read from a divisor table (`divisors.FamilyDivisors`)."""

    def get(self, family: str | None) -> float:
        """D_f of `family` (the table's fallback for a family it does not list)."""


def _check(p: float, d: float) -> tuple[float, float]:
    try:
        p, d = float(p), float(d)
    except OverflowError:
        raise RewardInputError("P or D is too large to represent as a float") from None
    if not math.isfinite(p) or p < 0:
        raise RewardInputError(f"P = {p} must be finite and >= 0 (an invalid count means an "
                               "invalid report; rewards then fall back to S)")
    if not math.isfinite(d) or d <= 0:
        raise RewardInputError(f"divisor D = {d} must be finite and > 0")
    return p, d


def fdr_value(p: float, d: float, valid: bool, s: bool | int) -> float:
    """Eq. 6 on numbers: max(P / D, 0) if valid else S."""
    if not valid:
        return float(bool(s))
    p, d = _check(p, d)
    return max(p / d, 0.0)


def spr_progress(p: float, d: float) -> float:
    """g(P) = P / (P + D'), correctly rounded (exact rational arithmetic, then one rounding),
    so it is exactly monotone in P and never overflows."""
    p, d = _check(p, d)
    if p == 0.0:
        return 0.0
    fp = Fraction(p)
    return float(fp / (fp + Fraction(d)))


def spr_value(p: float, d: float, valid: bool, s: bool | int) -> float:
    """Eq. 7 on numbers: S + P / (P + D') if valid else S, with failures < 1 <= successes
    and R < 2 guaranteed in floating point."""
    if not valid:
        return float(bool(s))
    g = spr_progress(p, d)
    return min(1.0 + g, _BELOW_TWO) if s else min(g, _BELOW_ONE)


def binary(report: VerificationReport, family: str | None = None,
           divisors: DivisorTable | None = None) -> float:
    """R = S, the strict terminal success (report validity and counts ignored)."""
    return float(report.strict_success)


def fdr(report: VerificationReport, family: str, divisors: DivisorTable) -> float:
    """Family Dense Reward (Eq. 6): max(P / D_f, 0) for a valid report, else S."""
    return fdr_value(report.passed, divisors.get(family), report.valid, report.strict_success)


def spr(report: VerificationReport, family: str, divisors: DivisorTable) -> float:
    """Success-Prioritized Reward (Eq. 7): S + P / (P + D'_f) for a valid report, else S."""
    return spr_value(report.passed, divisors.get(family), report.valid, report.strict_success)


RewardFn = Callable[[VerificationReport, str, DivisorTable], float]


# --------------------------------------------------------------------------- vectorized


def _prep(p, d, valid, s):
    import chex  # jax/chex are imported on first use: parsing reports stays light
    import jax.numpy as jnp

    chex.assert_equal_shape([p, d, valid, s])
    chex.assert_type([p, d, s], float)
    chex.assert_type(valid, bool)
    # Non-finite or negative P cannot come from a valid report: treat it as invalid.
    ok = valid & jnp.isfinite(p) & (p >= 0)
    return ok


def fdr_array(p: chex.Array, d: chex.Array, valid: chex.Array, s: chex.Array) -> chex.Array:
    """FDR (Eq. 6) for a batch.

    Args:
      p: [B] float, passed non-hygiene checks P.
      d: [B] float, family divisors D_f (> 0; FamilyDivisors guarantees it).
      valid: [B] bool, report validity.
      s: [B] float in {0, 1}, strict success S.

    Returns:
      [B] float: max(P / D, 0) where valid (and P finite, >= 0), else S.
    """
    import jax.numpy as jnp

    ok = _prep(p, d, valid, s)
    safe_p = jnp.where(ok, p, 0.0)
    return jnp.where(ok, jnp.maximum(safe_p / d, 0.0), s)


def spr_array(p: chex.Array, d: chex.Array, valid: chex.Array, s: chex.Array) -> chex.Array:
    """SPR (Eq. 7) for a batch, with failures < 1 <= successes < 2 in the array's dtype.

    Args:
      p: [B] float, passed non-hygiene checks P.
      d: [B] float, family divisors D'_f (> 0).
      valid: [B] bool, report validity; non-finite or negative P also counts as invalid.
      s: [B] float in {0, 1}, strict success S.

    Returns:
      [B] float: S + P / (P + D') where valid, else S.
    """
    import jax.numpy as jnp

    ok = _prep(p, d, valid, s)
    safe_p = jnp.where(ok & (p > 0), p, 1.0)
    g = jnp.where(ok & (p > 0), 1.0 / (1.0 + d / safe_p), 0.0)
    one = jnp.ones_like(g)
    below_one = jnp.nextafter(one, jnp.zeros_like(g))
    below_two = jnp.nextafter(2.0 * one, jnp.zeros_like(g))
    success = s > 0.5
    r = jnp.where(success, jnp.minimum(1.0 + g, below_two), jnp.minimum(g, below_one))
    return jnp.where(ok, r, s)


def binary_array(p: chex.Array, d: chex.Array, valid: chex.Array, s: chex.Array) -> chex.Array:
    """R = S for a batch (inputs as in `spr_array`)."""
    _prep(p, d, valid, s)
    return s


# --------------------------------------------------------------------------- the table


@dataclasses.dataclass(frozen=True)
class Reward:
    """One reward function by name: its scalar form (report, family, divisor table -> float)
    and its vectorized form ((P, D, valid, S) arrays [B] -> [B], jit-able)."""

    name: str
    scalar: RewardFn
    array: Callable[..., Any]
    doc: str


# the reward functions by name, the one list every `rewards.fn` / `reward_fn` setting's
# choices come from (in the order the configs list them)
REWARDS: dict[str, Reward] = {r.name: r for r in (
    Reward("fdr", fdr, fdr_array, "Family Dense Reward, max(P / D_f, 0) (Eq. 6)"),
    Reward("spr", spr, spr_array, "Success-Prioritized Reward, S + P / (P + D'_f) (Eq. 7)"),
    Reward("binary", binary, binary_array, "strict terminal success S"),
)}
REWARD_NAMES: tuple[str, ...] = tuple(REWARDS)


def get_reward(name: str) -> Reward:
    """The reward called `name` (one of `REWARD_NAMES`); SettingError naming the choices."""
    if name not in REWARDS:
        raise SettingError(f"unknown reward function {name!r}; choose one of "
                          f"{', '.join(sorted(REWARDS))}")
    return REWARDS[name]


def get_reward_fn(name: str) -> RewardFn:
    """The scalar reward function called `name` (`REWARD_NAMES`)."""
    return get_reward(name).scalar


def get_reward_array_fn(name: str) -> Callable[..., Any]:
    """The vectorized reward function called `name` (`REWARD_NAMES`)."""
    return get_reward(name).array


def report_arrays(
    reports: Sequence[VerificationReport],
    families: Sequence[str],
    divisors: DivisorTable,
    dtype: Any = np.float32,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(P, D, valid, S) arrays [B] for the vectorized reward functions."""
    if len(reports) != len(families):
        raise RewardInputError(f"{len(reports)} reports but {len(families)} families")
    p = np.asarray([float(r.passed) for r in reports], dtype=dtype)
    d = np.asarray([divisors.get(f) for f in families], dtype=dtype)
    valid = np.asarray([r.valid for r in reports], dtype=bool)
    s = np.asarray([float(r.strict_success) for r in reports], dtype=dtype)
    return p, d, valid, s
