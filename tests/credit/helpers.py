"""Random multi-turn interactions for credit-assignment tests."""

import numpy as np


def random_interaction(rng, batch, length, *, p_done=0.5, max_turns=5, rewards_on_all_gen=True):
    """Random [B, L] interactions: padding, prompt, turns of generated tokens with observation
    spans between and inside turns, rewards on generated tokens, dones at last generated tokens."""
    rewards = np.zeros((batch, length))
    values = rng.normal(size=(batch, length))
    turn_ids = np.zeros((batch, length), np.int32)
    gen = np.zeros((batch, length), bool)
    dones = np.zeros((batch, length), bool)
    for b in range(batch):
        pos = int(rng.integers(0, 3))  # left padding + prompt
        turn = 0
        while pos < length and turn < max_turns:
            run = int(rng.integers(1, 5))
            for _ in range(int(rng.integers(1, 3))):  # 1-2 generated runs per turn (obs inside)
                end = min(length, pos + run)
                gen[b, pos:end] = True
                turn_ids[b, pos:end] = turn
                pos = end + int(rng.integers(0, 3))  # observation span (maybe empty)
            turn_ids[b, pos:] = turn
            turn += 1
        idx = np.flatnonzero(gen[b])
        if len(idx) and rng.random() < p_done:
            dones[b, idx[-1]] = True
        if rewards_on_all_gen:
            rewards[b, idx] = rng.normal(size=len(idx)) * (rng.random(len(idx)) < 0.3)
    values = np.where(gen, values, rng.normal(size=(batch, length)))  # junk at non-gen positions
    return rewards, values, turn_ids, gen, dones
