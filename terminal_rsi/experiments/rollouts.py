"""Experiment "rollouts": collect one batch of episodes, write a trajectory shard and stats.

    python experiments/run.py --config=configs/rollouts.py --workdir=/tmp/rollouts
    python experiments/run.py --config=configs/rollouts.py --config.policy.kind=tiny \
        --config.rollout.batch_size=16 --config.rollout.concurrency=16

`policy.kind`: "reference" (the tasks' reference solutions as JSON actions: S = 1 through
the whole harness) or "tiny" (the `tiny` preset with random weights through the sampler, at
`harness.temperature`). Outputs: `<workdir>/trajectories/shard-00000.jsonl`
(pandas.read_json(path, lines=True)) and `<workdir>/rollout_stats.json`.
"""

from __future__ import annotations

import dataclasses
import os

from flax import nnx

from terminal_rsi.agent import Policy, ReferencePolicy, RolloutEngine, write_shard
from terminal_rsi.config.sections import BatchedRollout, Harness, Seeded, Tasks
from terminal_rsi.models.config import get_model_config
from terminal_rsi.models.loading import LoadedModel
from terminal_rsi.models.tokenizer import ByteTokenizer
from terminal_rsi.models.transformer import DecoderLM
from terminal_rsi.rewards import REWARD_NAMES, EpisodeScorer
from terminal_rsi.runtime.atomic import atomic_write_json
from terminal_rsi.settings import Section, setting
from terminal_rsi.tasks import get_suite


@dataclasses.dataclass(frozen=True)
class PolicySettings(Section):
    """Which policy acts in the episodes."""

    kind: str = setting("reference", "reference | tiny", choices=("reference", "tiny"))


@dataclasses.dataclass(frozen=True)
class RolloutTasks(Tasks):
    """The task pool and the split the episodes are drawn from."""

    split: str = setting("train", "suite split")


@dataclasses.dataclass(frozen=True)
class RolloutsHarness(Harness):
    """The harness of the episodes."""

    name: str = setting("json-linear", "harness variant name recorded in trajectories "
                        "(HarnessConfig.name)")
    reward_fn: str = setting("fdr", "reward function", choices=REWARD_NAMES)


@dataclasses.dataclass(frozen=True)
class RolloutsRollout(BatchedRollout):
    """The scheduler that collects the batch (and the tiny policy's sampler)."""

    keep_stragglers: bool = setting(False, "keep episodes finishing after the first B")
    progress: bool = setting(True, "print a progress line")


@dataclasses.dataclass(frozen=True)
class RolloutsConfig(Seeded):
    """One batch of episodes of a policy on built-in tasks."""

    policy: PolicySettings = PolicySettings()
    tasks: RolloutTasks = RolloutTasks()
    harness: RolloutsHarness = RolloutsHarness(max_turns=8, max_output_tokens=2048,
                                               max_input_tokens=16384,
                                               summarize_threshold=8192)
    rollout: RolloutsRollout = RolloutsRollout(batch_size=8, oversample=0.125, concurrency=8,
                                               cache_multiple=1024, prefill_chunk=256,
                                               decode_block=16)


CONFIG = RolloutsConfig


def make_policy(config: RolloutsConfig, engine: RolloutEngine) -> Policy:
    """The reference policy, or the `tiny` preset with random weights (seeded by
    config.seed) through the engine's sampler."""
    if config.policy.kind == "reference":
        return ReferencePolicy(engine.model.tokenizer)
    state = nnx.split(DecoderLM(engine.model.config, rngs=nnx.Rngs(config.seed)))[1]
    return engine.policy(nnx.to_pure_dict(state), seed=config.seed)


def run(config: RolloutsConfig, workdir: str) -> dict:
    """Collect the batch, write the shard and `rollout_stats.json`, print a summary line."""
    h, r, t = config.harness, config.rollout, config.tasks
    cfg = get_model_config("tiny")
    model = LoadedModel(ByteTokenizer(), cfg, nnx.split(DecoderLM(cfg, rngs=nnx.Rngs(0)))[0])
    engine = RolloutEngine.from_config(config, model, name=h.name, progress=r.progress,
                                       scorer=EpisodeScorer(h.reward_fn))
    tasks = list(get_suite(t.suite, t.split, n_per_family=t.n_per_family,
                           families=tuple(t.families) or None))
    n = engine.num_launch(r.batch_size, r.oversample)
    launch = [tasks[i % len(tasks)] for i in range(n)]
    res = engine.first(make_policy(config, engine), launch, r.batch_size,
                       oversample=r.oversample, keep_stragglers=r.keep_stragglers)
    shard = os.path.join(workdir, "trajectories", "shard-00000.jsonl")
    write_shard(shard, res.trajectories + res.stragglers + res.dropped)
    stats = {k: (None if v != v else v) for k, v in res.stats.items()}  # NaN -> null
    stats["errors"] = res.errors
    atomic_write_json(os.path.join(workdir, "rollout_stats.json"), stats)
    print(f"rollouts: {len(res.trajectories)} kept, success {res.stats['success_rate']:.2f}, "
          f"mean turns {res.stats['mean_turns']:.2f}, {res.stats['episodes_per_s']:.2f} ep/s; "
          f"shard {shard}")
    return stats
