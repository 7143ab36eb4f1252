"""Turn-Boundary Skip-Observation GAE (TB-GAE), paper §2.3, Eq. 8–12, Appendix C.

Inputs are [B, L] arrays over one flattened interaction per row: prompt,
generated tokens and observation tokens interleaved. Only generated positions
(``gen_mask``) are recursion nodes. For consecutive generated positions
j < j' (observations in between are skipped):

    (Γ_j, Λ_j) = (1, 1)                   if t(j') == t(j)        (Eq. 8)
                 (γ_turn, λ_turn)          otherwise
    δ_j = r̃_j + Γ_j (1 - d_j) v_{j'} - v_j                           (Eq. 9)
    A_j = δ_j + Γ_j Λ_j (1 - d_j) A_{j'}
    Ĝ_j = A_j + v_j

Unrolled, A_j = Σ_k W_{j,k} δ_k with W_{j,k} = Π_{i=j}^{k-1} w_i and
w_i = Γ_i Λ_i (1 - d_i) (Eq. 10).

The recursion state after the last position of a row is a `Carry`: the
successor generated position's value, advantage and turn id, and whether one
exists. Splitting a row into chunks and running them last to first, each fed
the `carry_out` of the chunk after it, reproduces the unsplit result exactly
(Eq. 12: resetting only the trace loses W_{j,b+1} A_{b+1}). With no carry
(``carry=None``) nothing follows the row: the successor value and trace are 0,
which is right only for complete episodes. A truncated episode must continue
from `bootstrap_carry` (value of the cut-off state, unknown future trace 0),
never from an implied zero.

Two methods compute the same function:
  * ``"scan"``: a reverse `lax.scan` over positions, one step per token.
  * ``"associative"``: `lax.associative_scan` in O(log L) depth: a
    "next generated position" fill, then an affine-map composition for
    A_j = b_j + a_j A_{j'}.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


class Carry(NamedTuple):
    """Recursion state at the successor of a chunk's last position, per row ([B] each).

    Attributes:
      value: v of the successor generated position (0 where none exists).
      advantage: A of the successor generated position (0 where none exists).
      turn_id: turn id t of the successor generated position.
      exists: whether a successor generated position exists.
    """

    value: Array
    advantage: Array
    turn_id: Array
    exists: Array


def empty_carry(batch_size: int, dtype=jnp.float32) -> Carry:
    """A carry meaning "nothing follows": successor value and trace 0."""
    return Carry(
        value=jnp.zeros((batch_size,), dtype),
        advantage=jnp.zeros((batch_size,), dtype),
        turn_id=jnp.full((batch_size,), -1, jnp.int32),
        exists=jnp.zeros((batch_size,), bool),
    )


def bootstrap_carry(value: Array, turn_id: Array) -> Carry:
    """Carry for a truncated (not terminated) row: bootstrap from the critic.

    Args:
      value: [B] critic value V(h) of the state right after the cut.
      turn_id: [B] turn id of the next (never generated) position; use a turn id
        different from the last generated token's to discount the cut as a turn
        boundary (the usual case: cuts happen between turns).

    The unknown future trace is set to 0 (an approximate cutoff, §2.3).
    """
    value = jnp.asarray(value)
    return Carry(
        value=value,
        advantage=jnp.zeros_like(value),
        turn_id=jnp.asarray(turn_id, jnp.int32),
        exists=jnp.ones(value.shape, bool),
    )


def _check_inputs(rewards, values, turn_ids, gen_mask, dones, carry):
    chex.assert_rank([rewards, values, gen_mask, dones], 2)
    chex.assert_equal_shape([rewards, values, gen_mask, dones])
    if turn_ids is not None:
        chex.assert_equal_shape([rewards, turn_ids])
        chex.assert_type(turn_ids, int)
    chex.assert_type([rewards, values], float)
    if carry is not None:
        chex.assert_shape(
            [carry.value, carry.advantage, carry.turn_id, carry.exists], (rewards.shape[0],)
        )


def _prepare(rewards, values, turn_ids, gen_mask, dones, carry, gamma, lam):
    dtype = jnp.result_type(rewards, values)
    rewards = rewards.astype(dtype)
    values = values.astype(dtype)
    gen_mask = gen_mask.astype(bool)
    dones = dones.astype(bool)
    batch = rewards.shape[0]
    if turn_ids is None:
        turn_ids = jnp.zeros(rewards.shape, jnp.int32)
    turn_ids = turn_ids.astype(jnp.int32)
    if carry is None:
        carry = empty_carry(batch, dtype)
    carry = Carry(
        carry.value.astype(dtype),
        carry.advantage.astype(dtype),
        carry.turn_id.astype(jnp.int32),
        carry.exists.astype(bool),
    )
    gamma = jnp.asarray(gamma, dtype)
    lam = jnp.asarray(lam, dtype)
    return rewards, values, turn_ids, gen_mask, dones, carry, gamma, lam


def _clock(t_j, t_next, next_exists, unit_clock, gamma, lam):
    """(Γ_j, Λ_j) of Eq. 8; (1, 1) where no successor exists (its terms vanish anyway)."""
    same_turn = jnp.logical_not(unit_clock) & (t_next == t_j)
    within = same_turn | jnp.logical_not(next_exists)
    one = jnp.ones((), gamma.dtype)
    return jnp.where(within, one, gamma), jnp.where(within, one, lam)


_SCAN_BLOCK = 8  # positions per lax.scan iteration, unrolled in Python (cuts loop overhead ~3x)


def _tb_gae_scan(rewards, values, turn_ids, gen_mask, dones, carry, gamma, lam, unit_clock):
    batch, length = rewards.shape
    k = _SCAN_BLOCK
    pad = -length % k  # left padding: non-generated positions pass the carry through

    def blocks(x):  # [B, L] -> [L/K, K, B], time-major
        x = jnp.pad(x, ((0, 0), (pad, 0)))
        return x.T.reshape(-1, k, batch)

    def step(state: Carry, x):
        r, v, t, g, d = x
        big_gamma, big_lam = _clock(t, state.turn_id, state.exists, unit_clock, gamma, lam)
        not_done = jnp.logical_not(d).astype(v.dtype)
        v_next = jnp.where(state.exists, state.value, 0)
        a_next = jnp.where(state.exists, state.advantage, 0)
        delta = r + big_gamma * not_done * v_next - v
        adv = delta + big_gamma * big_lam * not_done * a_next
        new_state = Carry(
            value=jnp.where(g, v, state.value),
            advantage=jnp.where(g, adv, state.advantage),
            turn_id=jnp.where(g, t, state.turn_id),
            exists=g | state.exists,
        )
        return new_state, jnp.where(g, adv, 0)

    def block(state: Carry, xs):
        outs = [None] * k
        for i in reversed(range(k)):  # one reverse step per position, in order
            state, outs[i] = step(state, tuple(x[i] for x in xs))
        return state, jnp.stack(outs)

    xs = tuple(blocks(x) for x in (rewards, values, turn_ids, gen_mask, dones))
    carry_out, adv = jax.lax.scan(block, carry, xs, reverse=True)
    return adv.reshape(-1, batch).T[:, pad:], carry_out


def _tb_gae_associative(rewards, values, turn_ids, gen_mask, dones, carry, gamma, lam, unit_clock):
    # 1. For every position, its successor: the nearest generated position after it, or the
    #    carry where none is left in the row. A "first generated" fill over the row with the
    #    carry appended as position L, shifted by one.
    def first_generated(later, earlier):  # args: (accumulated later positions, this position)
        return jax.tree.map(lambda e, lt: jnp.where(earlier[0], e, lt), earlier, later)

    def with_carry(x, last):
        return jnp.concatenate([x, last[:, None]], axis=1)

    filled = jax.lax.associative_scan(
        first_generated,
        (
            with_carry(gen_mask, carry.exists),
            with_carry(values, carry.value),
            with_carry(turn_ids, carry.turn_id),
        ),
        reverse=True,
        axis=1,
    )
    next_exists, v_next, t_next = (x[:, 1:] for x in filled)
    v_next = jnp.where(next_exists, v_next, 0)

    # 2. A_j = b_j + a_j A_{j'}: generated positions apply Eq. 9, others pass A through.
    big_gamma, big_lam = _clock(turn_ids, t_next, next_exists, unit_clock, gamma, lam)
    not_done = jnp.logical_not(dones).astype(values.dtype)
    delta = rewards + big_gamma * not_done * v_next - values
    a = jnp.where(gen_mask, big_gamma * big_lam * not_done, 1)
    b = jnp.where(gen_mask, delta, 0)

    def compose(later, earlier):  # earlier ∘ later for affine maps x -> a x + b
        a_l, b_l = later
        a_e, b_e = earlier
        return a_e * a_l, a_e * b_l + b_e

    a_cum, b_cum = jax.lax.associative_scan(compose, (a, b), reverse=True, axis=1)
    a_carry = jnp.where(carry.exists, carry.advantage, 0)
    adv_all = b_cum + a_cum * a_carry[:, None]
    adv = jnp.where(gen_mask, adv_all, 0)

    # The state before position 0: the row's first generated position, else the carry itself.
    carry_out = Carry(
        value=filled[1][:, 0],
        advantage=jnp.where(gen_mask.any(axis=1), adv_all[:, 0], carry.advantage),
        turn_id=filled[2][:, 0],
        exists=filled[0][:, 0],
    )
    return adv, carry_out


def _block_size(length: int) -> int:
    """A power of two near sqrt(L): both levels of the blocked scan get similar lengths."""
    return max(8, 1 << max(0, (int(np.ceil(np.sqrt(max(length, 1)))) - 1).bit_length()))


def _tb_gae_blocked(rewards, values, turn_ids, gen_mask, dones, carry, gamma, lam, unit_clock):
    """Two-level reverse scan: O(L) work, O(sqrt L) sequential depth, vectorized over blocks.

    Inside each block of K positions, every generated position's advantage is affine in the
    advantage X of the block's last generated position: A_j = c_j + P_j X (c_ℓ = 0, P_ℓ = 1),
    computed by one reverse scan over K steps for all blocks at once. A scan over the C blocks
    then resolves X from the successor carry (Eq. 9 at ℓ) and passes the first generated
    position's state to the block before. The results equal `scan` up to float rounding.
    """
    batch, length = rewards.shape
    k = _block_size(length)
    n_blocks = -(-length // k)
    pad = n_blocks * k - length

    def blocks(x, fill):  # [B, L] -> [K, B, C] (time-major inside blocks), right-padded
        x = jnp.pad(x, ((0, 0), (0, pad)), constant_values=fill)
        return x.reshape(batch, n_blocks, k).transpose(2, 0, 1)

    r, v, t, g, d = (blocks(x, f) for x, f in
                     ((rewards, 0), (values, 0), (turn_ids, 0), (gen_mask, False), (dones, False)))
    not_done = jnp.logical_not(d).astype(values.dtype)
    zeros = jnp.zeros((batch, n_blocks), values.dtype)

    def local(state, x):  # state: successor inside the block (v, c, P, t, exists)
        v_n, c_n, p_n, t_n, e_n = state
        r_j, v_j, t_j, g_j, nd_j = x
        big_gamma, big_lam = _clock(t_j, t_n, e_n, unit_clock, gamma, lam)
        w = big_gamma * big_lam * nd_j
        c_j = jnp.where(e_n, r_j + big_gamma * nd_j * v_n - v_j + w * c_n, 0)
        p_j = jnp.where(e_n, w * p_n, 1)
        new = (jnp.where(g_j, v_j, v_n), jnp.where(g_j, c_j, c_n), jnp.where(g_j, p_j, p_n),
               jnp.where(g_j, t_j, t_n), g_j | e_n)
        return new, (c_j, p_j)

    init = (zeros, zeros, zeros + 1, jnp.zeros((batch, n_blocks), jnp.int32),
            jnp.zeros((batch, n_blocks), bool))
    first, (c, p) = jax.lax.scan(local, init, (r, v, t, g, not_done), reverse=True)
    v_first, c_first, p_first, t_first, has_gen = first  # [B, C] each

    # The last generated position ℓ of each block: its reward, value, turn and done.
    last = (k - 1) - jnp.argmax(g[::-1], axis=0)  # [B, C]

    def at_last(x):
        return jnp.take_along_axis(x, last[None], axis=0)[0]

    r_l, v_l, t_l, nd_l = at_last(r), at_last(v), at_last(t), at_last(not_done)

    def across(state: Carry, x):  # one block, last to first
        has, r_b, v_b, t_b, nd_b, c_f, p_f, v_f, t_f = x
        big_gamma, big_lam = _clock(t_b, state.turn_id, state.exists, unit_clock, gamma, lam)
        v_n = jnp.where(state.exists, state.value, 0)
        a_n = jnp.where(state.exists, state.advantage, 0)
        x_b = r_b + big_gamma * nd_b * v_n - v_b + big_gamma * big_lam * nd_b * a_n
        new = Carry(
            value=jnp.where(has, v_f, state.value),
            advantage=jnp.where(has, c_f + p_f * x_b, state.advantage),
            turn_id=jnp.where(has, t_f, state.turn_id),
            exists=has | state.exists,
        )
        return new, x_b

    per_block = (has_gen, r_l, v_l, t_l, nd_l, c_first, p_first, v_first, t_first)
    carry_out, x_blk = jax.lax.scan(across, carry, tuple(a.T for a in per_block), reverse=True)
    adv = jnp.where(g, c + p * x_blk.T[None], 0)  # [K, B, C]
    adv = adv.transpose(1, 2, 0).reshape(batch, n_blocks * k)[:, :length]
    return adv, carry_out


_METHODS = {
    "scan": _tb_gae_scan,
    "associative": _tb_gae_associative,
    "blocked": _tb_gae_blocked,
}


def _run(rewards, values, turn_ids, gen_mask, dones, carry, gamma, lam, method, unit_clock):
    if method not in _METHODS:
        raise ValueError(f"method={method!r} is not one of {sorted(_METHODS)}")
    return _run_jit(
        rewards, values, turn_ids, gen_mask, dones, carry, gamma, lam, method, unit_clock
    )


@functools.partial(jax.jit, static_argnames=("method", "unit_clock"))
def _run_jit(rewards, values, turn_ids, gen_mask, dones, carry, gamma, lam, method, unit_clock):
    """Jitted once per shape and method, so eager callers do not pay op-by-op dispatch."""
    _check_inputs(rewards, values, turn_ids, gen_mask, dones, carry)
    r, v, t, g, d, c, gamma, lam = _prepare(
        rewards, values, turn_ids, gen_mask, dones, carry, gamma, lam
    )
    adv, carry_out = _METHODS[method](r, v, t, g, d, c, gamma, lam, unit_clock)
    returns = jnp.where(g, adv + v, 0)
    return adv, returns, carry_out


def tb_gae(
    rewards: Array,
    values: Array,
    turn_ids: Array,
    gen_mask: Array,
    dones: Array,
    *,
    gamma_turn: float | Array,
    lambda_turn: float | Array,
    carry: Carry | None = None,
    method: str = "scan",
) -> tuple[Array, Array, Carry]:
    """TB-GAE advantages and returns (Eq. 8–10) over [B, L] flattened interactions.

    Args:
      rewards: [B, L] float r̃_j, causally assigned to generated positions (a
        reward elsewhere is an input error: see `validate_tb_gae_inputs`).
      values: [B, L] float pre-token critic values v_j = V(h_{u_j}).
      turn_ids: [B, L] int turn t(j) of each position.
      gen_mask: [B, L] bool, True at policy-generated tokens only.
      dones: [B, L] bool, True at the last generated token of a truly
        terminated episode (d_j = 1: zero successor value and trace).
      gamma_turn, lambda_turn: scalars in [0, 1] applied across turn boundaries.
      carry: successor state after position L-1 (chunk continuation or a
        bootstrap for truncation); None means nothing follows.
      method: "scan" (reverse lax.scan) or "associative" (lax.associative_scan).

    Returns:
      advantages [B, L], returns [B, L] (= advantages + values on generated
      positions; both 0 elsewhere), and the `Carry` before position 0 (feed it
      to the chunk that precedes this one).
    """
    return _run(
        rewards, values, turn_ids, gen_mask, dones, carry, gamma_turn, lambda_turn, method, False
    )


def gae(
    rewards: Array,
    values: Array,
    gen_mask: Array,
    dones: Array,
    *,
    gamma: float | Array,
    lam: float | Array,
    carry: Carry | None = None,
    method: str = "scan",
) -> tuple[Array, Array, Carry]:
    """Per-token GAE with observation skipping: TB-GAE where every generated token is its own turn.

    δ_j = r_j + γ (1 - d_j) v_{j'} - v_j and A_j = δ_j + γλ (1 - d_j) A_{j'} over
    consecutive generated positions j < j'; observations are skipped. With no
    observations this is textbook GAE (Schulman et al., 2016). The paper's
    first RPR phase used γ = λ = 1. Arguments and returns as in `tb_gae`.
    """
    return _run(rewards, values, None, gen_mask, dones, carry, gamma, lam, method, True)


def validate_tb_gae_inputs(rewards, gen_mask, dones=None, turn_ids=None) -> None:
    """Host-side input checks for TB-GAE; raise ValueError naming the row and position.

    * a non-zero reward at a non-generated position (it would be silently
      dropped by the recursion: place rewards on generated tokens);
    * a done flag at a non-generated position (d marks the last generated token);
    * non-finite rewards.
    """
    rewards = np.asarray(rewards)
    gen_mask = np.asarray(gen_mask, bool)
    if rewards.shape != gen_mask.shape or rewards.ndim != 2:
        raise ValueError(
            f"rewards {rewards.shape} and gen_mask {gen_mask.shape} must both be [B, L]"
        )
    bad = np.argwhere(~np.isfinite(rewards))
    if bad.size:
        row, pos = bad[0]
        raise ValueError(
            f"row {row}, position {pos}: reward {float(rewards[row, pos])} is not finite"
        )
    bad = np.argwhere((rewards != 0) & ~gen_mask)
    if bad.size:
        row, pos = bad[0]
        raise ValueError(
            f"row {row}, position {pos}: reward {float(rewards[row, pos])} sits on a non-generated "
            f"position ({len(bad)} such position(s) in total); TB-GAE would drop it. Place each "
            "reward on a generated token (normally the episode's last generated token)."
        )
    if dones is not None:
        dones = np.asarray(dones, bool)
        bad = np.argwhere(dones & ~gen_mask)
        if bad.size:
            row, pos = bad[0]
            raise ValueError(
                f"row {row}, position {pos}: done flag on a non-generated position; mark the "
                "last generated token of a terminated episode instead"
            )
    if turn_ids is not None and np.asarray(turn_ids).shape != rewards.shape:
        raise ValueError(
            f"turn_ids {np.asarray(turn_ids).shape} must match rewards {rewards.shape}"
        )


def tb_gae_checked(rewards, values, turn_ids, gen_mask, dones, **kwargs):
    """`tb_gae` after `validate_tb_gae_inputs` (host-side; not for use inside jit)."""
    validate_tb_gae_inputs(rewards, gen_mask, dones, turn_ids)
    return tb_gae(rewards, values, turn_ids, gen_mask, dones, **kwargs)
