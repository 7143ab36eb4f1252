"""Length-grouped PPO minibatches (rpr.phase, `ppo.length_grouping`) vs random minibatches at
the packed width, on the row-length mix of the tiny default's rollouts.

One RPR update of a packed batch = π_old and pre-update values (forward passes) + one epoch
of `--minibatches` critic and actor steps. Baseline: random minibatches, every row at the
packed width (the longest row rounded up to `--multiple`). Measured: the phase's
length-grouped minibatches, each cut to its own longest row (`minibatch_rows`, `take_rows`,
`grouped_forward` in terminal_rsi.rpr.update). Both use the same jitted functions; every
width is compiled before timing, and the two variants are timed interleaved (median of `--repeats`).

The default length mix is the one measured on the tiny default (rpr1_fdr, T = 0.6, batch 16):
single-turn episodes of about 250–400 tokens and multi-turn ones of 1400–2048.

    python benchmarks/bench_update_batches.py --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from terminal_rsi.models.config import ModelConfig  # noqa: E402
from terminal_rsi.models.transformer import DecoderLM, ValueModel  # noqa: E402
from terminal_rsi.rpr.update import (  # noqa: E402
    grouped_forward,
    minibatch_rows,
    row_widths,
    take_rows,
)
from terminal_rsi.training import ppo_step as ps  # noqa: E402
from terminal_rsi.training.forward import make_logprob_fn, make_value_fn  # noqa: E402
from terminal_rsi.training.losses import PPOConfig  # noqa: E402
from terminal_rsi.training.train_state import OptimizerConfig, create_train_state  # noqa: E402

TINY = ModelConfig(vocab_size=384, d_model=128, n_layers=2, n_heads=4, n_kv_heads=2,
                   head_dim=32, d_ff=384, max_seq_len=2048)


def make_batch(lengths, width, vocab, seed=0):
    """Rows of the given real lengths (prompt = first 60 %, then generated) padded to width."""
    rng = np.random.default_rng(seed)
    b = len(lengths)
    tokens = np.zeros((b, width), np.int32)
    seg = np.zeros((b, width), np.int32)
    pos = np.zeros((b, width), np.int32)
    gen = np.zeros((b, width), bool)
    for i, n in enumerate(lengths):
        tokens[i, :n] = rng.integers(1, vocab, n)
        seg[i, :n] = 1
        pos[i, :n] = np.arange(n)
        gen[i, int(0.6 * n):n] = True
    adv = np.where(gen, rng.normal(size=(b, width)), 0.0).astype(np.float32)
    return {"tokens": tokens, "positions": pos, "segment_ids": seg, "gen_mask": gen,
            "advantages": adv, "returns": (adv + 0.5).astype(np.float32)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--short", type=int, default=10, help="single-turn rows (250-400 tokens)")
    ap.add_argument("--long", type=int, default=6, help="multi-turn rows (1400-2048 tokens)")
    ap.add_argument("--multiple", type=int, default=512, help="rollout.cache_multiple")
    ap.add_argument("--minibatches", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()

    rng = np.random.default_rng(0)
    lengths = list(rng.integers(250, 400, args.short)) + list(rng.integers(1400, 2048,
                                                                            args.long))
    width = -(-max(lengths) // args.multiple) * args.multiple
    raw = make_batch(lengths, width, TINY.vocab_size)
    actor = create_train_state(DecoderLM, TINY, OptimizerConfig(5e-4, grad_clip=1.0))
    critic = create_train_state(ValueModel, TINY, OptimizerConfig(1e-3, grad_clip=100.0),
                                seed=1)
    lp_fn, v_fn = make_logprob_fn(), make_value_fn()
    cfg = PPOConfig()
    actor_step = ps.make_actor_step(cfg, 1, donate=False)
    critic_step = ps.make_critic_step(cfg, 1, donate=False)
    n = args.minibatches

    def update(grouped: bool, seed: int):
        widths = (row_widths(raw["segment_ids"], args.multiple) if grouped
                  else np.full(len(lengths), width))
        groups = minibatch_rows(widths, n, np.random.default_rng(seed), grouped)
        batch = dict(raw)
        batch["old_logprobs"] = grouped_forward(lp_fn, groups, widths)(actor, batch)
        batch["old_values"] = grouped_forward(v_fn, groups, widths)(critic, batch)
        out = []
        for rows in minibatch_rows(widths, n, np.random.default_rng(seed + 1), grouped):
            mb = take_rows(batch, rows, int(widths[rows].max()))
            out.append(critic_step(critic, mb))
            out.append(actor_step(actor, mb))
        jax.block_until_ready(out)

    for grouped in (False, True):  # compile: the widths depend on the lengths, not the seed
        update(grouped, 0)
    times = {False: [], True: []}
    for r in range(args.repeats):
        for grouped in (False, True):
            t0 = time.perf_counter()
            update(grouped, 100 + r)
            times[grouped].append(time.perf_counter() - t0)
    full, cut = statistics.median(times[False]), statistics.median(times[True])
    real = sum(lengths)
    print(f"tiny model (d_model {TINY.d_model}, {TINY.n_layers} layers), {len(lengths)} rows "
          f"({args.short} short, {args.long} long), packed width {width}, "
          f"{args.minibatches} minibatches, median of {args.repeats}")
    print("| update | padded positions | ms | ratio to random minibatches |")
    print("|---|---|---|---|")
    widths = row_widths(raw["segment_ids"], args.multiple)
    grouped_pos = sum(int(widths[g].max()) * len(g) for g in np.split(np.argsort(widths), n))
    print(f"| random minibatches, full width | {len(lengths) * width} | {full * 1e3:.0f} | 1.00 |")
    print(f"| length-grouped, cut to own width | {grouped_pos} | {cut * 1e3:.0f} | "
          f"{cut / full:.2f} |")
    print(f"(real tokens: {real})")


if __name__ == "__main__":
    main()
