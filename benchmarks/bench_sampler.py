"""Sampler and chunked-logprob benchmark (issue: token-in/token-out generation).

Measures, in one run, ratios against a baseline:

1. Greedy decode tokens/s of the KV-cache `Sampler` vs generation without a cache
   (every token recomputes the whole prefix: one jitted full forward over a fixed
   [B, prompt + new] buffer per token), for the `tiny` preset and the `smollm2_135m` shape
   (random init, no weights), at batch 1 and 16. Decode-only: the Sampler's jitted decode
   block (16 sample-and-feed steps) is timed on its own, best of 5, compile excluded.
   Beside it the floor: the same number of bare one-token forwards with the same cache in
   one jitted loop (`floor_step_fn`; target: the sampler within 1.5x of it).
2. Per-token decode cost at context 128 vs 1024 (batch 1; target: within 1.3x), sampler and
   floor; all timers run interleaved, best of 9 each (the host is shared and noisy).
3. Peak temporary memory of log-probabilities over [1, 8192] tokens with vocab 49152
   (d_model 576) chunked (1024) vs unchunked, forward and forward+grad, read from the
   compiled executables' `memory_analysis()` (nothing is allocated; target: <= 1/4).

    python benchmarks/bench_sampler.py            # full table (a few minutes on 2 CPU cores)
    python benchmarks/bench_sampler.py --quick    # tiny model only (smoke test)
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402
from timing import best_of  # noqa: E402

from terminal_rsi.models import logprobs as lpm  # noqa: E402
from terminal_rsi.models.config import get_model_config  # noqa: E402
from terminal_rsi.models.sampling import Buckets, Sampler  # noqa: E402
from terminal_rsi.models.transformer import (
    DecoderLM,  # noqa: E402
    init_cache,  # noqa: E402
)


def _model(name: str):
    cfg = get_model_config(name)
    graphdef, state = nnx.split(nnx.eval_shape(lambda: DecoderLM(cfg, rngs=nnx.Rngs(0))))
    params = jax.jit(lambda: nnx.to_pure_dict(nnx.state(DecoderLM(cfg, rngs=nnx.Rngs(0)))))()
    return cfg, graphdef, params


def _prompts(batch, length, vocab, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, min(vocab, 256), (batch, length)).tolist()


def filled_cache(cfg, batch, ctx, s_len):
    """A KV cache of `s_len` slots whose first `ctx` slots count as occupied."""
    cache = init_cache(cfg, batch, s_len)
    cache["segment_ids"] = jnp.broadcast_to(
        (jnp.arange(s_len) < ctx).astype(jnp.int32), (batch, s_len))
    return cache


def decode_step_fn(cfg, graphdef, params, batch, ctx, s_len, block=16):
    """A zero-argument timer of the Sampler's jitted decode block (all rows live).

    Each call times `block` sample-and-feed steps at position `ctx` over a cache of `s_len`
    slots (first `ctx` slots occupied), carry donated as in `Sampler.sample`, and returns
    seconds per step. Prefill and compilation are excluded (compiled here).
    """
    sampler = Sampler(graphdef, cfg, decode_block=block)
    # The same function `Sampler.sample` runs per block, with the carry donated as there.
    fn = jax.jit(sampler._decode_impl, donate_argnums=(1,))

    def fresh_carry():
        return jax.block_until_ready({
            "cache": filled_cache(cfg, batch, ctx, s_len),
            "logits": jnp.zeros((batch, cfg.vocab_size), jnp.float32),
            "pos": jnp.full((batch,), ctx, jnp.int32), "n_gen": jnp.zeros((batch,), jnp.int32),
            "done": jnp.zeros((batch,), bool), "reason": jnp.zeros((batch,), jnp.int32)})

    consts = {"keys": jax.random.split(jax.random.key(0), batch),
              "temperature": jnp.zeros((batch,)), "top_p": jnp.ones((batch,)),
              "top_k": jnp.zeros((batch,), jnp.int32),
              "max_new": jnp.full((batch,), 10**6, jnp.int32),
              "max_context": jnp.int32(10**6), "stop_ids": jnp.full((8,), -1, jnp.int32)}
    jax.block_until_ready(fn(params, fresh_carry(), consts))  # compile

    def timed():
        carry = fresh_carry()
        t0 = time.perf_counter()
        jax.block_until_ready(fn(params, carry, consts))
        return (time.perf_counter() - t0) / block

    return timed


def floor_step_fn(cfg, graphdef, params, batch, ctx, s_len, block=16):
    """A zero-argument timer of the floor under the sampler: `block` bare one-token forwards
    with the same cache shapes in one jitted loop (argmax fed back, cache donated, nothing
    else: no sampling, no stop or budget checks). Returns seconds per step."""

    def impl(params, cache, tok):
        model = nnx.merge(graphdef, params)

        def body(i, carry):
            cache, tok = carry
            pos = jnp.full((batch, 1), ctx, jnp.int32) + i
            logits, cache = model(tok, pos, jnp.ones((batch, 1), jnp.int32), cache)
            return cache, jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)[:, None]

        return jax.lax.fori_loop(0, block, body, (cache, tok))

    fn = jax.jit(impl, donate_argnums=(1,))

    tok = jnp.zeros((batch, 1), jnp.int32)
    jax.block_until_ready(fn(params, filled_cache(cfg, batch, ctx, s_len), tok))  # compile

    def timed():
        cache = jax.block_until_ready(filled_cache(cfg, batch, ctx, s_len))
        t0 = time.perf_counter()
        jax.block_until_ready(fn(params, cache, tok))
        return (time.perf_counter() - t0) / block

    return timed


def decode_step_cost(cfg, graphdef, params, batch, ctx, s_len, block=16, repeats=5):
    """Best-of-`repeats` seconds per decode step (see `decode_step_fn`)."""
    timed = decode_step_fn(cfg, graphdef, params, batch, ctx, s_len, block)
    return min(timed() for _ in range(repeats))


def nocache_decode_cost(cfg, graphdef, params, batch, prompt_len, new, steps):
    """Seconds per token when every token recomputes the full [B, prompt + new] prefix."""
    width = prompt_len + new

    @jax.jit
    def step(params, buf, length):
        logits, _ = nnx.merge(graphdef, params)(buf)  # causal: padding after `length` unused
        nxt = jnp.argmax(logits[:, length - 1], axis=-1).astype(jnp.int32)
        return jax.lax.dynamic_update_slice(buf, nxt[:, None], (0, length)), length + 1

    buf = np.zeros((batch, width), np.int32)
    buf[:, :prompt_len] = np.asarray(_prompts(batch, prompt_len, cfg.vocab_size))
    buf = jnp.asarray(buf)
    length = jnp.int32(prompt_len)
    jax.block_until_ready(step(params, buf, length))  # compile

    def run():
        b, n = buf, length
        for _ in range(steps):
            b, n = step(params, b, n)
        jax.block_until_ready(b)

    return best_of(run, 1) / steps


def decode_table(names, batches, prompt_len, new, nocache_steps):
    rows = []
    buckets = Buckets(prefill_chunk=64, cache_multiple=64, power_of_two=False)
    for name in names:
        cfg, graphdef, params = _model(name)
        for b in batches:
            s_len = buckets.cache(prompt_len + new)
            timers = (decode_step_fn(cfg, graphdef, params, b, prompt_len, s_len, block=new),
                      floor_step_fn(cfg, graphdef, params, b, prompt_len, s_len, block=new))
            per_tok, floor = interleaved_best(timers, 5)
            base = nocache_decode_cost(cfg, graphdef, params, b, prompt_len, new,
                                       nocache_steps[name])
            rows.append((name, b, b / per_tok, b / floor, per_tok / floor, b / base,
                         base / per_tok))
            print(f"  decode {name} batch {b}: cache {b / per_tok:.1f} tok/s, floor "
                  f"{b / floor:.1f}, no cache {b / base:.1f} tok/s", flush=True)
    return rows


def interleaved_best(timers, repeats):
    """Best time of each timer over `repeats` rounds that run them in turn (robust to a noisy
    shared host: every timer sees the same conditions)."""
    best = [float("inf")] * len(timers)
    for _ in range(repeats):
        for i, timed in enumerate(timers):
            best[i] = min(best[i], timed())
    return best


def context_table(names, new, repeats=9):
    rows = []
    buckets = Buckets(prefill_chunk=128, cache_multiple=128, power_of_two=False)
    for name in names:
        cfg, graphdef, params = _model(name)
        timers = [make(cfg, graphdef, params, 1, ctx, buckets.cache(ctx + new), block=new)
                  for ctx in (128, 1024) for make in (decode_step_fn, floor_step_fn)]
        s128, f128, s1024, f1024 = interleaved_best(timers, repeats)
        rows.append((name, s128 * 1e3, s1024 * 1e3, s1024 / s128, f128 * 1e3, f1024 * 1e3,
                     f1024 / f128, buckets.cache(128 + new), buckets.cache(1024 + new)))
        print(f"  context {name}: {rows[-1]}", flush=True)
    return rows


def memory_table(vocab=49152, length=8192, d=576, chunk=1024):
    h = jax.ShapeDtypeStruct((1, length, d), jnp.float32)
    w = jax.ShapeDtypeStruct((d, vocab), jnp.float32)
    t = jax.ShapeDtypeStruct((1, length), jnp.int32)

    def unchunked(h, w, t):
        logits = jnp.einsum("bld,dv->blv", h, w)
        lp = jax.nn.log_softmax(logits, axis=-1)
        return jnp.take_along_axis(lp, t[..., None], axis=-1)[..., 0]

    def chunked(h, w, t):
        return lpm.logprobs_from_hidden(h, w, t, chunk_size=chunk)

    def grad_of(f):
        return jax.grad(lambda h, w, t: jnp.sum(f(h, w, t)), argnums=(0, 1))

    def peak(f):
        m = jax.jit(f).lower(h, w, t).compile().memory_analysis()
        return m.temp_size_in_bytes + m.output_size_in_bytes

    rows = []
    for label, a, b in (("forward", unchunked, chunked),
                        ("forward+grad", grad_of(unchunked), grad_of(chunked))):
        pu, pc = peak(a), peak(b)
        rows.append((label, pu / 2**20, pc / 2**20, pc / pu))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="tiny model only")
    ap.add_argument("--context-only", action="store_true", help="only the context table")
    args = ap.parse_args()
    names = ["tiny"] if args.quick else ["tiny", "smollm2_135m"]
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}", flush=True)
    dec = [] if args.context_only else decode_table(
        names, (1, 16), prompt_len=32, new=16, nocache_steps={"tiny": 8, "smollm2_135m": 3})
    ctx = context_table(names, new=16)
    mem = [] if args.context_only else memory_table()

    print("\n### Decode throughput (greedy, context 32, 16-step blocks; decode-only; floor: "
          "bare one-token forwards with the same cache, target sampler/floor <= 1.5)\n")
    print("| model | batch | KV-cache sampler tok/s | floor tok/s | sampler/floor | "
          "no-cache tok/s | speed-up vs no cache |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, b, c, f, rf, n, r in dec:
        print(f"| {name} | {b} | {c:.1f} | {f:.1f} | {rf:.2f} | {n:.1f} | {r:.1f}x |")
    print("\n### Per-token decode cost vs context (batch 1; target ratio <= 1.3)\n")
    print("| model | sampler ms/token @128 | @1024 | ratio | floor ms/token @128 | @1024 | "
          "ratio | cache slots |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, a, b, r, fa, fb, fr, s1, s2 in ctx:
        print(f"| {name} | {a:.2f} | {b:.2f} | {r:.2f} | {fa:.2f} | {fb:.2f} | {fr:.2f} | "
              f"{s1} / {s2} |")
    print("\n### Log-prob peak memory, L=8192, V=49152, D=576 (compiled memory_analysis; "
          "target ratio <= 0.25)\n")
    print("| pass | unchunked MiB | chunked (1024) MiB | ratio |")
    print("|---|---:|---:|---:|")
    for label, u, c, r in mem:
        print(f"| {label} | {u:.0f} | {c:.0f} | {r:.3f} |")


if __name__ == "__main__":
    main()
