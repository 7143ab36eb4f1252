"""Sampler and chunked-logprob benchmark (issue: token-in/token-out generation).

Measures, in one run, ratios against a baseline:

1. Greedy decode tokens/s of the KV-cache `Sampler` vs generation without a cache
   (every token recomputes the whole prefix: one jitted full forward over a fixed
   [B, prompt + new] buffer per token), for the `tiny` preset and the `smollm2_135m` shape
   (random init, no weights), at batch 1 and 16. Decode-only cost per token is
   (t(1 + N) - t(1)) / N, where t(n) is the wall time of `sample(max_new_tokens=n)`
   (t(1) = prefill + first token); compile time is excluded (warm-up call first).
2. Per-token decode cost at context 128 vs 1024 (batch 1; target: within 1.5x).
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

from terminal_rsi import logprobs as lpm  # noqa: E402
from terminal_rsi.models.config import get_model_config  # noqa: E402
from terminal_rsi.models.transformer import DecoderLM  # noqa: E402
from terminal_rsi.sampling import Buckets, Sampler  # noqa: E402


def _model(name: str):
    cfg = get_model_config(name)
    graphdef, state = nnx.split(nnx.eval_shape(lambda: DecoderLM(cfg, rngs=nnx.Rngs(0))))
    params = jax.jit(lambda: nnx.to_pure_dict(nnx.state(DecoderLM(cfg, rngs=nnx.Rngs(0)))))()
    return cfg, graphdef, params


def _timed(fn, repeats: int = 1) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _prompts(batch, length, vocab, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, min(vocab, 256), (batch, length)).tolist()


def sampler_decode_cost(cfg, graphdef, params, batch, prompt_len, new, buckets, repeats=1):
    """(seconds per decode step, tokens/s over the whole call of 1 + new tokens)."""
    sampler = Sampler(graphdef, cfg, buckets=buckets, decode_block=new)
    prompts = _prompts(batch, prompt_len, cfg.vocab_size)
    key = jax.random.key(0)

    def run(n):
        outs = sampler.sample(params, prompts, key, max_new_tokens=n, temperature=0)
        assert all(len(o.token_ids) == n for o in outs)

    run(1 + new)  # compile (same buckets for both lengths)
    t1 = _timed(lambda: run(1), repeats)
    tn = _timed(lambda: run(1 + new), repeats)
    return max(tn - t1, 1e-9) / new, batch * (1 + new) / tn


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

    return _timed(run) / steps


def decode_table(names, batches, prompt_len, new, nocache_steps):
    rows = []
    buckets = Buckets(prefill_chunk=64, cache_multiple=64, power_of_two=False)
    for name in names:
        cfg, graphdef, params = _model(name)
        for b in batches:
            per_tok, _ = sampler_decode_cost(cfg, graphdef, params, b, prompt_len, new, buckets)
            base = nocache_decode_cost(cfg, graphdef, params, b, prompt_len, new,
                                       nocache_steps[name])
            rows.append((name, b, b / per_tok, b / base, base / per_tok))
            print(f"  decode {name} batch {b}: cache {b / per_tok:.1f} tok/s, "
                  f"no cache {b / base:.1f} tok/s", flush=True)
    return rows


def context_table(names, new):
    rows = []
    buckets = Buckets(prefill_chunk=128, cache_multiple=128, power_of_two=False)
    for name in names:
        cfg, graphdef, params = _model(name)
        cost = {}
        for ctx in (128, 1024):
            cost[ctx], _ = sampler_decode_cost(cfg, graphdef, params, 1, ctx, new, buckets,
                                               repeats=2)
        rows.append((name, cost[128] * 1e3, cost[1024] * 1e3, cost[1024] / cost[128],
                     buckets.cache(128 + 1 + new), buckets.cache(1024 + 1 + new)))
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
    args = ap.parse_args()
    names = ["tiny"] if args.quick else ["tiny", "smollm2_135m"]
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}", flush=True)
    dec = decode_table(names, (1, 16), prompt_len=32, new=16,
                       nocache_steps={"tiny": 8, "smollm2_135m": 3})
    ctx = context_table(names, new=16)
    mem = memory_table()

    print("\n### Decode throughput (greedy, prompt 32, 16 new tokens; decode-only)\n")
    print("| model | batch | KV-cache sampler tok/s | no-cache tok/s | speed-up |")
    print("|---|---:|---:|---:|---:|")
    for name, b, c, n, r in dec:
        print(f"| {name} | {b} | {c:.1f} | {n:.1f} | {r:.1f}x |")
    print("\n### Per-token decode cost vs context (batch 1; target ratio <= 1.5)\n")
    print("| model | ms/token @128 | ms/token @1024 | ratio | cache slots |")
    print("|---|---:|---:|---:|---:|")
    for name, a, b, r, s1, s2 in ctx:
        print(f"| {name} | {a:.2f} | {b:.2f} | {r:.2f} | {s1} / {s2} |")
    print("\n### Log-prob peak memory, L=8192, V=49152, D=576 (compiled memory_analysis; "
          "target ratio <= 0.25)\n")
    print("| pass | unchunked MiB | chunked (1024) MiB | ratio |")
    print("|---|---:|---:|---:|")
    for label, u, c, r in mem:
        print(f"| {label} | {u:.0f} | {c:.0f} | {r:.3f} |")


if __name__ == "__main__":
    main()
