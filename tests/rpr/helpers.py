"""Tiny actor/critic states and a toy packed PPO batch for the RPR tests."""

import functools

import numpy as np

from terminal_rsi.models.config import ModelConfig
from terminal_rsi.models.transformer import DecoderLM, ValueModel
from terminal_rsi.train_state import OptimizerConfig, create_train_state

TINY = ModelConfig(vocab_size=32, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1,
                   head_dim=16, d_ff=64, max_seq_len=64)


@functools.cache
def states(actor_lr=1e-2, critic_lr=1e-2, seed=0):
    """Cached (compiling the sharded init is slow on CPU): copy before donating."""
    actor = create_train_state(DecoderLM, TINY, OptimizerConfig(actor_lr, grad_clip=1.0),
                               seed=seed)
    critic = create_train_state(ValueModel, TINY, OptimizerConfig(critic_lr, grad_clip=100.0),
                                seed=seed + 1)
    return actor, critic


def toy_batch(b=4, length=12, seed=0):
    """Rows: prompt (3 tokens) then generated tokens of unequal lengths; row 1 packs two
    trajectories (segments 1 and 2); trailing padding has segment 0. Rewards and dones on
    the last generated token of each trajectory; two turns per trajectory."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, TINY.vocab_size, (b, length)).astype(np.int32)
    seg = np.zeros((b, length), np.int32)
    gen = np.zeros((b, length), bool)
    turn = np.zeros((b, length), np.int32)
    rewards = np.zeros((b, length), np.float32)
    dones = np.zeros((b, length), bool)
    pos = np.zeros((b, length), np.int32)

    def put(row, start, n_gen, sid):
        n = 3 + n_gen
        seg[row, start:start + n] = sid
        pos[row, start:start + n] = np.arange(n)
        gen[row, start + 3:start + n] = True
        turn[row, start + 3 + n_gen // 2:start + n] = 1
        last = start + n - 1
        rewards[row, last] = rng.normal()
        dones[row, last] = True

    for row in range(b):
        if row == 1:
            put(row, 0, 2, 1)
            put(row, 5, 4, 2)
        else:
            put(row, 0, min(length - 3, 2 + 3 * row), 1)
    return {"tokens": tokens, "positions": pos, "segment_ids": seg, "gen_mask": gen,
            "turn_ids": turn, "rewards": rewards, "dones": dones}


@functools.cache
def joint_step(num_microbatches=1):
    """One compiled non-donating RPR step per microbatch count, shared by the test modules."""
    from terminal_rsi.losses import PPOConfig
    from terminal_rsi.ppo_step import make_rpr_step

    return make_rpr_step(PPOConfig(), num_microbatches=num_microbatches, donate=False)
