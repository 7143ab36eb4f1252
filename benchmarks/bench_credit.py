"""Benchmark TB-GAE: the JAX methods against a per-token Python loop and a memory-traffic floor.

    python benchmarks/bench_credit.py [--repeats 5] [--shapes 1x262144,8x262144,256x8192]
                                      [--methods fused,scan,associative,blocked]

For each [B, L] it reports milliseconds (median of repeats, after a compile
warm-up) for:
  * floor:   NumPy copy of the five inputs plus writing the two outputs (memory traffic);
  * loop:    a per-token Python loop over NumPy arrays, as common GAE code does
             (timed on a slice of the rows and scaled linearly when the full array would
             take too long; the table says so);
  * fused (the default) / scan / associative / blocked: `terminal_rsi.credit.tb_gae`,
             jitted, float32;
then each method's time over the floor (measured in the same run) and the loop's time over
the default method's. Inputs are random multi-turn interactions with observation spans
(about 60% generated positions). The machine's load average is printed before and after:
the timings are only as good as the machine is quiet.
"""

from __future__ import annotations

import argparse
import functools
import os
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from terminal_rsi.credit import tb_gae  # noqa: E402


def make_inputs(rng, batch, length):
    """Random multi-turn rows: turns of ~40 generated tokens separated by ~25 observations."""
    turn_len = rng.integers(20, 60, size=(batch, length // 20 + 1))
    obs_len = rng.integers(5, 45, size=(batch, length // 20 + 1))
    gen = np.zeros((batch, length), bool)
    turn_ids = np.zeros((batch, length), np.int32)
    for b in range(batch):
        pos, k = 0, 0
        while pos < length:
            end = min(length, pos + turn_len[b, k])
            gen[b, pos:end] = True
            turn_ids[b, pos:end + obs_len[b, k]] = k
            pos, k = end + obs_len[b, k], k + 1
    rewards = np.where(gen & (rng.random((batch, length)) < 0.001), 1.0, 0.0).astype(np.float32)
    values = rng.normal(size=(batch, length)).astype(np.float32)
    dones = np.zeros((batch, length), bool)
    for b in range(batch):
        dones[b, np.flatnonzero(gen[b])[-1]] = True
    return rewards, values, turn_ids, gen, dones


def python_loop(rewards, values, turn_ids, gen, dones, gamma, lam):
    """The usual per-token loop, skipping observations, on NumPy arrays."""
    adv = np.zeros_like(rewards)
    for b in range(rewards.shape[0]):
        next_v, next_a, next_t, has_next = 0.0, 0.0, -1, False
        for j in range(rewards.shape[1] - 1, -1, -1):
            if not gen[b, j]:
                continue
            boundary = has_next and turn_ids[b, j] != next_t
            g, lm = (gamma, lam) if boundary else (1.0, 1.0)
            nd = 0.0 if dones[b, j] else 1.0
            delta = rewards[b, j] + g * nd * next_v - values[b, j]
            a = delta + g * lm * nd * next_a
            adv[b, j] = a
            next_v, next_a, next_t, has_next = values[b, j], a, turn_ids[b, j], True
    return adv, adv + values


def floor(rewards, values, turn_ids, gen, dones, out_a, out_r):
    for x in (rewards, values, turn_ids, gen, dones):
        x.copy()
    out_a[...] = 0.0
    out_r[...] = 0.0


def timeit(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e3


METHODS = ("fused", "scan", "associative", "blocked")  # the first is tb_gae's default
SHORT = {"fused": "fused", "scan": "scan", "associative": "assoc", "blocked": "blocked"}


def load_average() -> str:
    try:
        one, five, fifteen = os.getloadavg()
        return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f}"
    except OSError:
        return "load average unknown"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--shapes", default="1x262144,8x262144,256x8192")
    parser.add_argument("--methods", default=",".join(METHODS),
                        help="comma-separated tb_gae methods to time")
    parser.add_argument("--loop-budget", type=int, default=300_000,
                        help="max positions the Python loop runs (then scaled)")
    args = parser.parse_args()
    methods = args.methods.split(",")
    rng = np.random.default_rng(0)
    gamma, lam = 0.95, 0.9
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, float32, median of "
          f"{args.repeats}; {os.cpu_count()} CPUs, {load_average()}")
    names = [SHORT.get(m, m) for m in methods]
    header = (f"{'[B, L]':>14} {'floor ms':>9} {'loop ms':>9} "
              + " ".join(f"{n + ' ms':>10}" for n in names) + " "
              + " ".join(f"{n + '/floor':>13}" for n in names)
              + f" {'loop/' + names[0]:>12}")
    print(header)
    for spec in args.shapes.split(","):
        batch, length = (int(x) for x in spec.split("x"))
        inputs = make_inputs(rng, batch, length)
        dev = [jnp.asarray(x) for x in inputs]
        out_a, out_r = np.empty_like(inputs[0]), np.empty_like(inputs[0])
        t_floor = timeit(lambda: floor(*inputs, out_a, out_r), args.repeats)
        times = {}
        for method in methods:
            f = jax.jit(functools.partial(tb_gae, gamma_turn=gamma, lambda_turn=lam,
                                          method=method))
            jax.block_until_ready(f(*dev))  # compile
            times[method] = timeit(lambda f=f: jax.block_until_ready(f(*dev)), args.repeats)
        loop_rows = max(1, min(batch, args.loop_budget // length))
        sub = [x[:loop_rows] for x in inputs]
        ref_a, _ = python_loop(*sub, gamma, lam)
        for method in methods:
            got = np.asarray(jax.jit(functools.partial(
                tb_gae, gamma_turn=gamma, lambda_turn=lam, method=method))(
                    *[jnp.asarray(x) for x in sub])[0])
            np.testing.assert_allclose(got, ref_a, rtol=1e-4, atol=1e-4)
        t_loop = timeit(lambda: python_loop(*sub, gamma, lam), 1) * batch / loop_rows
        scaled = "*" if loop_rows < batch else " "
        row = (f"{spec:>14} {t_floor:9.2f} {t_loop:8.0f}{scaled} "
               + " ".join(f"{times[m]:10.2f}" for m in methods) + " "
               + " ".join(f"{times[m] / t_floor:13.1f}" for m in methods)
               + f" {t_loop / times[methods[0]]:12.0f}")
        print(row, flush=True)
    print("* loop timed on a subset of rows and scaled linearly to the full batch")
    print(f"after: {load_average()}")


if __name__ == "__main__":
    main()
