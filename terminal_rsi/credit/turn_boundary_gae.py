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

Four methods compute the same function:
  * ``"fused"`` (the default): one sequential pass per group of at most 8 rows, a
    `lax.fori_loop` over positions whose whole step (successor fill, clock, Eq. 9)
    stays in the loop state. The loop is small enough for XLA:CPU to compile it
    into one native loop instead of dispatching its ops step by step; see
    `_tb_gae_fused`. Chunk continuation is bit-exact.
  * ``"scan"``: a reverse `lax.scan` over positions, one step per token (the same
    float operations as ``"fused"``, so also bit-exact, but several times slower
    on CPU).
  * ``"associative"``: `lax.associative_scan` in O(log L) depth: a
    "next generated position" fill, then an affine-map composition for
    A_j = b_j + a_j A_{j'}.
  * ``"blocked"``: a two-level scan over √L blocks (see `_tb_gae_blocked`).
The parallel methods regroup float sums: they agree with the sequential ones up
to rounding, and their chunked runs agree with unsplit runs only up to rounding.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

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


# Rows per sequential pass of `fused` (float32; 4 for float64): a larger group's step touches
# more than XLA:CPU's small-loop limit and falls back to op-by-op dispatch.
_FUSED_ROWS = 8


def _tb_gae_fused(rewards, values, turn_ids, gen_mask, dones, carry, gamma, lam, unit_clock):
    """One sequential pass per group of at most 8 rows, the whole step inside the loop.

    The state after each position is the recursion state itself, (A, v, t) of the nearest
    generated position at or after it; a non-generated position passes it through. Where no
    successor exists the state starts at A = v = 0, so Eq. 9's successor terms vanish whatever
    the clock (Γ_j only multiplies them). The step performs the float operations of `scan` in
    the same order (the tests check the results are bitwise equal; XLA:CPU contracts each
    multiply-add into an FMA in both), and a chunked run performs exactly those of the
    unsplit run.

    Why it is fast on CPU: XLA:CPU compiles a while loop whose step touches under ~1 kB
    (`xla_cpu_small_while_loop_byte_threshold`) into one native loop, instead of dispatching
    each of the step's ops as a separate kernel (~0.1–1 µs each, which is what makes `scan`
    slow). A float32 step over 8 rows stays under that limit, so rows are taken 8 at a time
    (one group when B ≤ 8; 4 at a time in float64) and the groups run one after another.
    Rewards are transposed to time-major [groups, L, rows] and overwritten in place by the
    advantages (no zero-filled output buffer); the other inputs are read in their [B, L]
    layout, one column per step. The compiled loop is scalar code, ~3–4 ns per position
    and row on this CPU: most of the method's time (docs/performance.md).
    """
    batch, length = rewards.shape
    dtype = values.dtype
    n_groups = -(-batch // (_FUSED_ROWS if jnp.dtype(dtype).itemsize <= 4 else _FUSED_ROWS // 2))
    rows = -(-batch // n_groups)  # balance the groups: padding only when B has no such split
    pad = n_groups * rows - batch
    gl = gamma * lam
    one = jnp.ones((), dtype)
    state0 = (jnp.where(carry.exists, carry.advantage, 0).astype(dtype),
              jnp.where(carry.exists, carry.value, 0).astype(dtype), carry.turn_id)
    xs = (values, turn_ids, gen_mask, dones)
    if pad:  # padded rows generate nothing: they pass their (zero) state through
        xs = tuple(jnp.pad(x, ((0, pad), (0, 0))) for x in xs)
        rewards = jnp.pad(rewards, ((0, pad), (0, 0)))
        state0 = tuple(jnp.pad(s, (0, pad)) for s in state0)

    def step(state, r, v, t, g, d):  # one position, `rows` rows: Eq. 8-9 as in `scan`
        a_next, v_next, t_next = state
        not_done = jnp.where(d, 0, 1).astype(dtype)
        if unit_clock:
            big_gamma, big_gl = gamma, gl
        else:
            same_turn = t == t_next
            big_gamma, big_gl = jnp.where(same_turn, one, gamma), jnp.where(same_turn, one, gl)
        delta = r + big_gamma * not_done * v_next - v
        adv = delta + big_gl * not_done * a_next
        return jnp.where(g, adv, a_next), jnp.where(g, v, v_next), jnp.where(g, t, t_next)

    # [B, L] -> [groups, L, rows]: the advantages overwrite the rewards, position by position.
    buf = rewards.reshape(n_groups, rows, length).transpose(0, 2, 1)

    def group(i, loop_state):
        buf, final = loop_state
        first = i * rows

        def position(k, inner):
            state, buf = inner
            j = length - 1 - k
            col = [lax.dynamic_slice(x, (first, j), (rows, 1))[:, 0] for x in xs]
            state = step(state, buf[i, j], *col)
            return state, lax.dynamic_update_slice(buf, state[0][None, None], (i, j, 0))

        start = tuple(lax.dynamic_slice_in_dim(s, first, rows) for s in state0)
        state, buf = lax.fori_loop(0, length, position, (start, buf))
        final = tuple(lax.dynamic_update_slice_in_dim(f, s, first, 0)
                      for f, s in zip(final, state, strict=True))
        return buf, final

    buf, final = lax.fori_loop(0, n_groups, group, (buf, jax.tree.map(jnp.zeros_like, state0)))
    adv_all = buf.transpose(0, 2, 1).reshape(n_groups * rows, length)[:batch]
    final = tuple(f[:batch] for f in final)
    adv = jnp.where(gen_mask, adv_all, 0)
    any_gen = gen_mask.any(axis=1)  # rows with nothing generated pass the carry through as is
    carry_out = Carry(
        value=jnp.where(any_gen, final[1], carry.value),
        advantage=jnp.where(any_gen, final[0], carry.advantage),
        turn_id=jnp.where(any_gen, final[2], carry.turn_id),
        exists=any_gen | carry.exists,
    )
    return adv, carry_out


_METHODS = {
    "fused": _tb_gae_fused,
    "scan": _tb_gae_scan,
    "associative": _tb_gae_associative,
    "blocked": _tb_gae_blocked,
}
METHODS = tuple(_METHODS)  # the `method` names tb_gae and gae accept; the first is the default


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
    method: str = "fused",
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
      method: "fused" (default; a sequential pass compiled into one loop), "scan"
        (reverse lax.scan; the same float operations), "associative"
        (lax.associative_scan) or "blocked" (two-level scan); see the module doc.

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
    method: str = "fused",
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
