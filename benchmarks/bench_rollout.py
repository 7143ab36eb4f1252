"""Rollout throughput: episodes/min and generated tokens/s, 1 vs N concurrent episodes, one-
batch-ahead asynchronous step time against max(rollout, update), and the cost of unparseable
replies with and without `HarnessConfig.max_parse_errors`.

    python benchmarks/bench_rollout.py [--episodes 16] [--concurrency 16] [--max-new 32]
    python benchmarks/bench_rollout.py --parse-errors      # only the max_parse_errors table
    python benchmarks/bench_rollout.py --phase [--phase-steps 8] [--phase-batch 8]
                                         # the RPR phase itself, policy_lag 0 vs 1

The policy is the `tiny` preset (random weights, byte tokenizer) through the jitted KV-cache
sampler, on built-in tasks with local sandboxes; every episode runs the full harness and the
protected verifier. Compilation is excluded (one warm-up collect per setting). The "update"
of the async rows is a jitted matmul chain sized to take about as long as a rollout, so the
ideal async step is max(rollout, update) and the synchronous one rollout + update. On a CPU-
only machine the update and the sampler share the same cores, so overlap is partial. The
async table is printed twice: with the tiny model, and with a latency-bound policy (100 ms
per call, as a remote accelerator) whose rollouts leave the cores free.

`--phase` runs the real RPR phase (`configs/rpr_phase.py`, tiny model, every step joint) at
`rollout.policy_lag` 0 and 1 and reads each step's rollout, wait and step times from its
metrics rows; the update time is a step's time minus its wait for rollouts.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from configs.rpr_phase import get_config  # noqa: E402
from terminal_rsi.agent import HarnessConfig, ReferencePolicy, SamplerPolicy  # noqa: E402
from terminal_rsi.agent.engine import RolloutEngine  # noqa: E402
from terminal_rsi.agent.scheduler import RolloutScheduler, SchedulerConfig  # noqa: E402
from terminal_rsi.config import registry  # noqa: E402
from terminal_rsi.models.config import get_model_config  # noqa: E402
from terminal_rsi.models.sampling import Buckets, Sampler  # noqa: E402
from terminal_rsi.models.tokenizer import ByteTokenizer  # noqa: E402
from terminal_rsi.models.transformer import DecoderLM  # noqa: E402
from terminal_rsi.rpr import run_phase  # noqa: E402
from terminal_rsi.tasks import get_suite  # noqa: E402

FAMILIES = ["create_file", "count_lines", "sort_uniq", "edit_replace"]


def tasks(n, start_seed=0):
    return list(get_suite("builtin", "train", families=FAMILIES, n_per_family=-(-n // 4),
                          start_seed=start_seed))[:n]


def make_update(seconds_target: float):
    """A jitted stand-in for a train step (matmul chain), calibrated to ~seconds_target."""
    @jax.jit
    def step(x, n):
        def body(_, y):
            return jnp.tanh(y @ y) * 0.5
        return jax.lax.fori_loop(0, n, body, x)

    x = jnp.ones((256, 256), jnp.float32) / 256
    step(x, 1).block_until_ready()
    t0 = time.perf_counter()
    step(x, 20).block_until_ready()
    per = (time.perf_counter() - t0) / 20
    n = max(1, int(seconds_target / max(per, 1e-6)))
    return lambda: step(x, n).block_until_ready()


class LatencyPolicy(ReferencePolicy):
    """A latency-bound stand-in policy: a fixed 100 ms per call (like a remote accelerator at
    small batch) that emits reference solutions and leaves the CPU free while it waits."""

    def generate(self, requests):
        time.sleep(0.1)
        return super().generate(requests)


def latency_rows(args, tok):
    # ---- the scheduler alone: the latency-bound policy, so sandbox time and generation
    # overlap and batching are visible apart from CPU contention.
    lrows = []
    for conc in (1, args.concurrency):
        sched = RolloutScheduler(LatencyPolicy(tok), HarnessConfig(max_turns=4),
                                 config=SchedulerConfig(concurrency=conc, oversample=0.0,
                                                        max_batch_wait_s=0.05))
        res = sched.collect(tasks(args.episodes, 6000), args.episodes)
        st = res.stats
        lrows.append((conc, 60 * len(res.trajectories) / st["elapsed_s"], st["success_rate"],
                      st["mean_generation_batch"], st["policy_calls"]))
    print()
    print("| latency-bound policy (100 ms/call) | episodes/min | ratio | success | "
          "mean gen batch | policy calls |")
    print("|---|---|---|---|---|---|")
    for conc, epm, succ, mb, calls in lrows:
        print(f"| concurrency {conc} | {epm:.1f} | {epm / lrows[0][1]:.2f}x | {succ:.2f} | "
              f"{mb:.1f} | {calls:.0f} |")


def parse_error_rows(args, policy):
    """Episodes whose every reply is unparseable (the random tiny model), 3 turns, with no
    parse-error limit (the paper's harness: each error becomes an observation) vs
    `max_parse_errors = 1`: rollout wall time, packed tokens, and a jitted critic forward over
    the packed batch (the update's per-token cost scales the same way)."""
    from timing import best_of

    from terminal_rsi.agent import pack_trajectories
    from terminal_rsi.models.transformer import ValueModel
    from terminal_rsi.runtime import sharding as shd
    from terminal_rsi.training.forward import make_value_fn
    from terminal_rsi.training.train_state import OptimizerConfig, create_train_state

    cfg = get_model_config("tiny")
    critic = create_train_state(ValueModel, cfg, OptimizerConfig(1e-3), shd.make_mesh({}),
                                seed=1)
    value_fn = make_value_fn()
    buckets = Buckets(prefill_chunk=128, cache_multiple=128)
    rows = []
    for limit in (None, 1):
        harness = HarnessConfig(max_turns=3, max_output_tokens=args.max_new,
                                max_observation_chars=300, max_parse_errors=limit)
        sched = RolloutScheduler(policy, harness, config=SchedulerConfig(
            concurrency=args.concurrency, oversample=0.0, max_batch_wait_s=0.05))
        sched.collect(tasks(args.episodes, 7000), args.episodes)  # compile this setting
        res = sched.collect(tasks(args.episodes, 8000), args.episodes)
        packed = pack_trajectories(res.trajectories, buckets=buckets)
        batch = {k: jnp.asarray(getattr(packed, k))
                 for k in ("tokens", "positions", "segment_ids")}
        value_fn(critic, batch).block_until_ready()
        fwd = best_of(lambda b=batch: value_fn(critic, b).block_until_ready())
        n_err = sum(bool(t.parse_error) for tr in res.trajectories for t in tr.turns)
        rows.append((limit, res.stats["elapsed_s"],
                     float(np.mean([len(tr.turns) for tr in res.trajectories])),
                     int((packed.segment_ids > 0).sum()), packed.tokens.shape, fwd, n_err))
    print()
    print(f"unparseable replies ({args.episodes} episodes, 3 turns, {args.max_new} tokens max)")
    print("| max_parse_errors | rollout s | turns/episode | parse errors | packed tokens | "
          "packed [B, L] | critic forward s | rollout ratio | tokens ratio | forward ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    b = rows[0]
    for limit, wall, turns, tokens, shape, fwd, n_err in rows:
        print(f"| {limit} | {wall:.1f} | {turns:.1f} | {n_err} | {tokens} | {list(shape)} | "
              f"{fwd:.3f} | {wall / b[1]:.2f}x | {tokens / b[3]:.2f}x | {fwd / b[5]:.2f}x |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-new", type=int, default=32)
    ap.add_argument("--turns", type=int, default=2)
    ap.add_argument("--async-steps", type=int, default=3)
    ap.add_argument("--skip-model", action="store_true",
                    help="only the latency-bound scheduler rows")
    ap.add_argument("--parse-errors", action="store_true",
                    help="only the max_parse_errors rows")
    ap.add_argument("--phase", action="store_true",
                    help="only the RPR phase rows, policy_lag 0 vs 1")
    ap.add_argument("--phase-steps", type=int, default=8)
    ap.add_argument("--phase-batch", type=int, default=8)
    ap.add_argument("--phase-max-new", type=int, default=None,
                    help="the phase's harness.max_output_tokens (default: the config's)")
    ap.add_argument("--async-only", action="store_true",
                    help="only the async tables (tiny model, latency-bound policy)")
    args = ap.parse_args()
    if args.phase:
        phase_rows(args)
        return

    tok = ByteTokenizer()
    if args.skip_model:
        latency_rows(args, tok)
        return
    cfg = get_model_config("tiny")
    graphdef, state = nnx.split(DecoderLM(cfg, rngs=nnx.Rngs(0)))
    sampler = Sampler(graphdef, cfg, decode_block=16,
                      buckets=Buckets(prefill_chunk=256, cache_multiple=1024))
    policy = SamplerPolicy(sampler, nnx.to_pure_dict(state), tok, seed=0)
    if args.parse_errors:
        parse_error_rows(args, policy)
        return
    harness = HarnessConfig(max_turns=args.turns, max_output_tokens=args.max_new)

    # Compile every batch bucket once up front (the cross-episode batch size varies with
    # timing), so no timed run pays for compilation.
    key = jax.random.key(1)
    b = 1
    while b <= max(args.concurrency, 1):
        sampler.sample(policy.params, [[1] * 800] * b, key, max_new_tokens=args.max_new)
        b *= 2
    if b // 2 < args.concurrency:
        sampler.sample(policy.params, [[1] * 800] * args.concurrency, key,
                       max_new_tokens=args.max_new)

    if not args.async_only:
        throughput_rows(args, policy, harness, sampler, cfg, tok)
    async_rows(args, policy, harness, "tiny model")
    async_rows(args, LatencyPolicy(tok), HarnessConfig(max_turns=4), "latency-bound policy")


def throughput_rows(args, policy, harness, sampler, cfg, tok):
    """Episodes/min and tokens/s at concurrency 1 vs N, then the latency-bound and
    unparseable-reply tables."""
    rows = []
    base = None
    for conc in (1, args.concurrency):
        sched = RolloutScheduler(policy, harness, config=SchedulerConfig(
            concurrency=conc, oversample=0.0, max_batch_wait_s=0.05))
        # warm-up at the measured size: compile this setting's (batch, cache) buckets
        sched.collect(tasks(args.episodes, 1000), args.episodes)
        before = dict(sampler.compilations)
        res = sched.collect(tasks(args.episodes), args.episodes)
        recompiled = sum(sampler.compilations.values()) - sum(before.values())
        st = res.stats
        if res.errors:
            raise SystemExit(f"episodes failed: {res.errors[:3]}")
        epm = 60 * len(res.trajectories) / st["elapsed_s"]
        if base is None:
            base = (epm, st["generated_tokens_per_s"])
        rows.append((f"concurrency {conc}", len(res.trajectories), st["elapsed_s"], epm,
                     st["generated_tokens_per_s"], st["mean_generation_batch"],
                     epm / base[0], st["generated_tokens_per_s"] / base[1], recompiled))
    print(f"tiny model ({cfg.num_params() / 1e6:.2f} M params), {args.turns} turns x "
          f"{args.max_new} tokens max, built-in tasks, local sandboxes, jax {jax.__version__}")
    print("| setting | episodes | wall s | episodes/min | gen tokens/s | mean gen batch | "
          "episodes/min ratio | tokens/s ratio | compilations in timed run |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]:.1f} | {r[3]:.1f} | {r[4]:.0f} | {r[5]:.1f} | "
              f"{r[6]:.2f}x | {r[7]:.2f}x | {r[8]} |")

    latency_rows(args, tok)
    parse_error_rows(args, policy)


def async_rows(args, policy, harness, label):
    """One batch ahead vs synchronous with a stand-in update sized to one rollout."""
    b = min(8, args.concurrency)
    sched = RolloutScheduler(policy, harness, config=SchedulerConfig(
        concurrency=b, oversample=0.0, max_batch_wait_s=0.05))
    sched.collect(tasks(b, 2000), b)
    t0 = time.perf_counter()
    sched.collect(tasks(b, 3000), b)
    rollout_s = time.perf_counter() - t0
    update = make_update(rollout_s)
    t0 = time.perf_counter()
    update()
    update_s = time.perf_counter() - t0
    k = args.async_steps
    t0 = time.perf_counter()
    for i in range(k):
        sched.collect(tasks(b, 4000 + 100 * i), b)
        update()
    sync_step = (time.perf_counter() - t0) / k
    engine = RolloutEngine(harness, None, concurrency=b)  # its one background rollout thread
    ahead = engine.ahead(sched.collect, tasks(b, 5000), b)  # fill the pipeline
    ahead.result()
    ahead = engine.ahead(sched.collect, tasks(b, 5100), b)
    t0 = time.perf_counter()
    for i in range(k):
        ahead.result()  # batch i, rolled out while the previous update ran
        ahead = engine.ahead(sched.collect, tasks(b, 5200 + 100 * i), b)
        update()
        policy.version += 1
    async_step = (time.perf_counter() - t0) / k
    ahead.result()
    engine.close()
    ideal = max(rollout_s, update_s)
    print()
    print(f"| async, {label} ({b} episodes/batch) | seconds | ratio to max(rollout, update) |")
    print("|---|---|---|")
    for name, v in (("rollout alone", rollout_s), ("update alone", update_s),
                    ("max(rollout, update)", ideal), ("rollout + update", rollout_s + update_s),
                    ("synchronous step", sync_step), ("one-batch-ahead step", async_step)):
        print(f"| {name} | {v:.2f} | {v / ideal:.2f} |")


def phase_rows(args):
    """The RPR phase at policy_lag 0 and 1: medians over the steps after the first two
    (compilation), each step joint (no critic warm-up), no evaluation, one checkpoint."""
    rows = {}
    for lag in (0, 1):
        c = get_config()
        c.num_steps, c.rollout.batch_size = args.phase_steps, args.phase_batch
        c.rollout.policy_lag, c.ppo.critic_warmup_steps = lag, 0
        c.eval.every, c.checkpoint.every = 0, args.phase_steps
        if args.phase_max_new:
            c.harness.max_output_tokens = args.phase_max_new
        with tempfile.TemporaryDirectory() as workdir:
            res = run_phase(registry.get_experiment("rpr_phase").check(c), workdir)
        timed = res.metrics[2:]
        med = {k: float(np.median([m[k] for m in timed]))
               for k in ("rollout_s", "rollout_wait_s", "step_s")}
        med["update_s"] = float(np.median([m["step_s"] - m["rollout_wait_s"] for m in timed]))
        rows[lag] = med
    rollout_s, update_s = rows[0]["rollout_s"], rows[0]["update_s"]
    ideal = max(rollout_s, update_s)
    print(f"RPR phase (configs/rpr_phase.py, {args.phase_batch} episodes/step, "
          f"max_output_tokens {c.harness.max_output_tokens}, medians of steps "
          f"3..{args.phase_steps}), jax {jax.__version__}, {os.cpu_count()} CPUs")
    print("| policy_lag | rollout s | wait for rollout s | update s | step s | "
          "step / max(rollout, update) of lag 0 | step ratio to lag 0 |")
    print("|---|---|---|---|---|---|---|")
    for lag, m in rows.items():
        print(f"| {lag} | {m['rollout_s']:.2f} | {m['rollout_wait_s']:.2f} | "
              f"{m['update_s']:.2f} | {m['step_s']:.2f} | {m['step_s'] / ideal:.2f} | "
              f"{m['step_s'] / rows[0]['step_s']:.2f} |")


if __name__ == "__main__":
    main()
