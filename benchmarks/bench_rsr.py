"""The RSR / base_sft SFT step (Eq. 3) vs the plain LM step of terminal_rsi.training.train_state.

Baseline: `make_update_step(lm_loss)` (next-token NLL over a loss mask, one jitted donated
step). Measured: `terminal_rsi.rsr.sft.make_sft_step` on the same [B, L] batch (generated-
token mask, `sft_loss` aggregation, exact microbatch accumulation machinery), with 1 and 2
microbatches. Steps are timed interleaved and the median per step is reported; the ratio
is SFT / LM (target: <= 1.15, i.e. the masking and accumulation cost little).

    python benchmarks/bench_rsr.py --batch 8 --seq 256 --repeats 7
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

from terminal_rsi.models.config import get_model_config  # noqa: E402
from terminal_rsi.models.transformer import DecoderLM  # noqa: E402
from terminal_rsi.rsr.sft import make_sft_step  # noqa: E402
from terminal_rsi.training.losses import Aggregation  # noqa: E402
from terminal_rsi.training.train_state import (  # noqa: E402
    OptimizerConfig,
    create_train_state,
    lm_loss,
    make_update_step,
)


def batch(cfg, b, length, seed=0):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 256, (b, length)).astype(np.int32)
    gen = np.zeros((b, length), bool)
    gen[:, length // 2:] = True
    seg = np.ones((b, length), np.int32)
    pos = np.tile(np.arange(length, dtype=np.int32), (b, 1))
    targets = np.roll(tokens, -1, axis=1)
    return {"tokens": tokens, "positions": pos, "segment_ids": seg, "gen_mask": gen,
            "targets": targets, "loss_mask": np.roll(gen, -1, axis=1)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--d_model", type=int, default=128)
    ap.add_argument("--n_layers", type=int, default=2)
    a = ap.parse_args()
    cfg = get_model_config("tiny", d_model=a.d_model, n_layers=a.n_layers, n_heads=4,
                           n_kv_heads=2, head_dim=a.d_model // 4, d_ff=3 * a.d_model)
    opt = OptimizerConfig(1e-3)
    b = batch(cfg, a.batch, a.seq)
    lm_b = {k: b[k] for k in ("tokens", "positions", "segment_ids", "targets", "loss_mask")}
    sft_b = {k: b[k] for k in ("tokens", "positions", "segment_ids", "gen_mask")}
    runs = {}
    st = create_train_state(DecoderLM, cfg, opt, seed=0)
    runs["lm_step (baseline)"] = [make_update_step(lm_loss, st), st, lm_b]
    for m in (1, 2):
        s = create_train_state(DecoderLM, cfg, opt, seed=0)
        runs[f"sft_step m={m}"] = [make_sft_step(Aggregation.SEQUENCE_SUM, m, state=s), s,
                                   sft_b]
    times = {k: [] for k in runs}
    for r in runs.values():  # compile
        r[1], out = r[0](r[1], r[2])
        jax.block_until_ready(out)
    for _ in range(a.repeats):
        for k, r in runs.items():
            t0 = time.perf_counter()
            r[1], out = r[0](r[1], r[2])
            jax.block_until_ready(out)
            times[k].append(time.perf_counter() - t0)
    base = statistics.median(times["lm_step (baseline)"])
    print(f"B={a.batch} L={a.seq} d_model={a.d_model} n_layers={a.n_layers} "
          f"repeats={a.repeats} ({jax.devices()[0].platform})")
    print("| step | median ms | ratio vs lm_step |\n|---|---|---|")
    for k, v in times.items():
        med = statistics.median(v)
        print(f"| {k} | {med * 1e3:.1f} | {med / base:.2f} |")


if __name__ == "__main__":
    main()
