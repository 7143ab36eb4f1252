"""One RPR actor+critic PPO update vs the plain training steps of terminal_rsi.training.train_state.

Baseline: an actor LM step (`make_update_step(lm_loss)`) plus a critic regression step
(`make_update_step(value_regression_loss)`) on the same [B, L] batch. Measured: the PPO
actor step + clipped-value critic step (`ppo_step.make_actor_step` / `make_critic_step`,
separately jitted), and the fused joint step (`make_rpr_step`). Target: ratio ≤ 1.15.
Steps are timed interleaved (A, B, A, B, ...) and the median per step is reported.

    python benchmarks/bench_ppo.py --preset tiny --batch 8 --seq 128 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from terminal_rsi.models.config import get_model_config  # noqa: E402
from terminal_rsi.models.transformer import DecoderLM, ValueModel  # noqa: E402
from terminal_rsi.training import ppo_step as ps  # noqa: E402
from terminal_rsi.training.forward import make_logprob_fn  # noqa: E402
from terminal_rsi.training.losses import PPOConfig  # noqa: E402
from terminal_rsi.training.train_state import (  # noqa: E402
    OptimizerConfig,
    create_train_state,
    lm_loss,
    make_update_step,
    value_regression_loss,
)


def make_batch(cfg, b, length, seed=0):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, cfg.vocab_size, (b, length)).astype(np.int32)
    pos = np.broadcast_to(np.arange(length, dtype=np.int32), (b, length)).copy()
    seg = np.ones((b, length), np.int32)
    gen = np.zeros((b, length), bool)
    gen[:, length // 4:] = True  # prompt then generation
    adv = np.where(gen, rng.normal(size=(b, length)), 0.0).astype(np.float32)
    batch = {"tokens": tokens, "positions": pos, "segment_ids": seg, "gen_mask": gen,
             "targets": np.roll(tokens, -1, axis=1), "loss_mask": gen,
             "returns": (adv + 1.0).astype(np.float32), "advantages": adv,
             "old_values": np.zeros((b, length), np.float32)}
    return {k: jnp.asarray(v) for k, v in batch.items()}


def timed(fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    jax.block_until_ready(out)
    return time.perf_counter() - t0, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--microbatches", type=int, default=1)
    args = ap.parse_args()

    cfg = get_model_config(args.preset)
    actor = create_train_state(DecoderLM, cfg, OptimizerConfig(5e-7, grad_clip=1.0))
    critic = create_train_state(ValueModel, cfg, OptimizerConfig(1.5e-5, grad_clip=100.0),
                                seed=1)
    batch = make_batch(cfg, args.batch, args.seq)
    batch["old_logprobs"] = make_logprob_fn(args.microbatches)(actor, batch)
    m = args.microbatches

    lm_step = make_update_step(lm_loss, actor, donate=False)
    vr_step = make_update_step(value_regression_loss, critic, donate=False)
    actor_step = ps.make_actor_step(PPOConfig(), m, actor, donate=False)
    critic_step = ps.make_critic_step(PPOConfig(), m, critic, donate=False)
    joint = ps.make_rpr_step(PPOConfig(), m, states=(actor, critic), donate=False)
    # Non-donating steps on fixed states: every call does the same work.
    cases = {
        "lm_step": lambda: lm_step(actor, batch),
        "value_step": lambda: vr_step(critic, batch),
        "ppo_actor_step": lambda: actor_step(actor, batch),
        "ppo_critic_step": lambda: critic_step(critic, batch),
        "ppo_joint_step": lambda: joint(actor, critic, batch),
    }
    for fn in cases.values():  # compile + warm up
        timed(fn)
        timed(fn)
    times = {k: [] for k in cases}
    for _ in range(args.repeats):
        for k, fn in cases.items():
            times[k].append(timed(fn)[0])
    med = {k: statistics.median(v) for k, v in times.items()}
    base = med["lm_step"] + med["value_step"]
    ppo = med["ppo_actor_step"] + med["ppo_critic_step"]
    print(f"preset={args.preset} B={args.batch} L={args.seq} microbatches={m} "
          f"repeats={args.repeats} backend={jax.default_backend()}")
    print(f"| {'step':<34} | {'median ms':>9} | {'ratio':>6} |")
    print(f"|{'-' * 36}|{'-' * 11}|{'-' * 8}|")
    rows = [("actor LM step (baseline)", med["lm_step"], None),
            ("critic regression step (baseline)", med["value_step"], None),
            ("baseline sum", base, 1.0),
            ("PPO actor step", med["ppo_actor_step"], med["ppo_actor_step"] / med["lm_step"]),
            ("PPO critic step", med["ppo_critic_step"],
             med["ppo_critic_step"] / med["value_step"]),
            ("PPO actor + critic (separate jits)", ppo, ppo / base),
            ("PPO joint step (one jit)", med["ppo_joint_step"], med["ppo_joint_step"] / base)]
    for name, t, r in rows:
        print(f"| {name:<34} | {t * 1e3:9.1f} | {'' if r is None else f'{r:6.3f}':>6} |")
    print(f"target: PPO actor+critic / baseline <= 1.15 -> "
          f"{'met' if ppo / base <= 1.15 else 'NOT met'} ({ppo / base:.3f})")


if __name__ == "__main__":
    main()
