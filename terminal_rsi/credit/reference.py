"""Independent float64 NumPy references for credit assignment.

Used by the tests and by the diagnostic experiment; never by training code.

`tb_gae_double_sum` evaluates Eq. 10 literally, A_j = Σ_k W_{j,k} δ_k with
W_{j,k} = Π_{i=j}^{k-1} w_i, over the chain of generated positions, with
explicit products (O(n²) per row) and no recursion. `textbook_gae` is the
usual per-token reverse loop of Schulman et al. (2016).
"""

from __future__ import annotations

import numpy as np


def tb_gae_double_sum(
    rewards, values, turn_ids, gen_mask, dones, gamma_turn, lambda_turn,
    carry=None, unit_clock=False,
):
    """(advantages, returns) as float64 [B, L]; carry = (value, adv, turn, exists) per row."""
    rewards = np.asarray(rewards, np.float64)
    values = np.asarray(values, np.float64)
    gen_mask = np.asarray(gen_mask, bool)
    dones = np.asarray(dones, bool)
    turn_ids = np.zeros(rewards.shape, np.int64) if turn_ids is None else np.asarray(turn_ids)
    adv = np.zeros_like(rewards)
    ret = np.zeros_like(rewards)
    for b in range(rewards.shape[0]):
        u = np.flatnonzero(gen_mask[b])
        n = len(u)
        if n == 0:
            continue
        r = rewards[b, u]
        v = values[b, u]
        t = turn_ids[b, u]
        d = dones[b, u].astype(np.float64)
        if carry is not None and bool(carry[3][b]):
            v_tail, a_tail, t_tail = float(carry[0][b]), float(carry[1][b]), int(carry[2][b])
            has_tail = True
        else:
            v_tail, a_tail, t_tail, has_tail = 0.0, 0.0, None, False
        big_g = np.ones(n)
        big_l = np.ones(n)
        v_next = np.zeros(n)
        for i in range(n):
            if i + 1 < n:
                nxt_t, v_next[i], exists = t[i + 1], v[i + 1], True
            else:
                nxt_t, v_next[i], exists = t_tail, v_tail, has_tail
            if exists and (unit_clock or nxt_t != t[i]):
                big_g[i], big_l[i] = gamma_turn, lambda_turn
        delta = r + big_g * (1 - d) * v_next - v
        w = big_g * big_l * (1 - d)
        for j in range(n):
            total = 0.0
            for k in range(j, n):
                total += np.prod(w[j:k]) * delta[k]
            total += np.prod(w[j:n]) * a_tail  # W_{j,n} A_n: the carried trace
            adv[b, u[j]] = total
            ret[b, u[j]] = total + v[j]
    return adv, ret


def textbook_gae(rewards, values, dones, gamma, lam, last_value=0.0):
    """Per-token GAE for one [L] episode, every position a decision (no observations)."""
    L = len(rewards)
    adv = np.zeros(L)
    next_adv, next_v = 0.0, last_value
    for i in reversed(range(L)):
        nd = 1.0 - float(dones[i])
        delta = rewards[i] + gamma * nd * next_v - values[i]
        next_adv = delta + gamma * lam * nd * next_adv
        adv[i] = next_adv
        next_v = values[i]
    return adv
