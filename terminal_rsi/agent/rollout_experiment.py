"""Experiment "rollouts": collect one batch of episodes, write a trajectory shard and stats.

    python experiments/run.py --config=configs/rollouts.py --workdir=/tmp/rollouts
    python experiments/run.py --config=configs/rollouts.py --config.policy.kind=tiny \
        --config.rollout.batch_size=16 --config.rollout.concurrency=16

`policy.kind`: "reference" (the tasks' reference solutions as JSON actions: S = 1 through
the whole harness) or "tiny" (the `tiny` preset with random weights through the sampler).
Outputs: `<workdir>/trajectories/shard-00000.jsonl` (pandas.read_json(path, lines=True)) and
`<workdir>/rollout_stats.json`.
"""

from __future__ import annotations

import os

import ml_collections

from terminal_rsi.atomic import atomic_write_json
from terminal_rsi.configuration import BASE_SCHEMA, EPISODE_SCHEMA, Field

SCHEMA = {
    **BASE_SCHEMA,
    **EPISODE_SCHEMA,
    "policy.kind": Field(str, "reference | tiny", choices=("reference", "tiny")),
    "policy.temperature": Field(float, "sampling temperature (tiny)", lo=0.0),
    "tasks.split": Field(str, "suite split"),
    "harness.name": Field(str, "harness variant name recorded in trajectories"),
    "harness.reward_fn": Field(str, "reward function", choices=("binary", "fdr", "spr")),
    "rollout.batch_size": Field(int, "episodes kept (B)", lo=1),
    "rollout.concurrency": Field(int, "episodes in flight", lo=1),
    "rollout.oversample": Field(float, "B' = ceil(B (1 + oversample))", lo=0.0),
    "rollout.keep_stragglers": Field(bool, "keep episodes finishing after the first B"),
    "rollout.progress": Field(bool, "print a progress line"),
}


def _policy(config):
    from terminal_rsi.agent import ReferencePolicy, SamplerPolicy
    from terminal_rsi.models.tokenizer import ByteTokenizer

    tok = ByteTokenizer()
    if config.policy.kind == "reference":
        return ReferencePolicy(tok)
    from flax import nnx

    from terminal_rsi.models.config import get_model_config
    from terminal_rsi.models.transformer import DecoderLM
    from terminal_rsi.sampling import Buckets, Sampler

    cfg = get_model_config("tiny")
    graphdef, state = nnx.split(DecoderLM(cfg, rngs=nnx.Rngs(config.seed)))
    sampler = Sampler(graphdef, cfg, decode_block=16,
                      buckets=Buckets(prefill_chunk=256, cache_multiple=1024))
    return SamplerPolicy(sampler, nnx.to_pure_dict(state), tok, seed=config.seed)


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
    from terminal_rsi.agent import (
        HarnessConfig,
        RolloutScheduler,
        SamplingSettings,
        SchedulerConfig,
        write_shard,
    )
    from terminal_rsi.tasks import get_suite, open_task_sandbox

    h, r, t = config.harness, config.rollout, config.tasks
    harness = HarnessConfig.from_config(
        h, sampling=SamplingSettings(temperature=config.policy.temperature),
        verify_backend=t.backend)
    sched = RolloutScheduler(
        _policy(config), harness, lambda task: open_task_sandbox(
            task, t.backend, allow_plain=t.allow_plain_sandbox),
        SchedulerConfig(concurrency=r.concurrency, oversample=r.oversample,
                        keep_stragglers=r.keep_stragglers, progress=r.progress))
    tasks = list(get_suite(t.suite, t.split, n_per_family=t.n_per_family,
                           families=tuple(t.families) or None))
    n = sched.num_launch(r.batch_size)
    launch = [tasks[i % len(tasks)] for i in range(n)]
    res = sched.collect(launch, r.batch_size)
    shard = os.path.join(workdir, "trajectories", "shard-00000.jsonl")
    write_shard(shard, res.trajectories + res.stragglers + res.dropped)
    stats = {k: (None if v != v else v) for k, v in res.stats.items()}  # NaN -> null
    stats["errors"] = res.errors
    atomic_write_json(os.path.join(workdir, "rollout_stats.json"), stats)
    print(f"rollouts: {len(res.trajectories)} kept, success {res.stats['success_rate']:.2f}, "
          f"mean turns {res.stats['mean_turns']:.2f}, {res.stats['episodes_per_s']:.2f} ep/s; "
          f"shard {shard}")
    return stats
