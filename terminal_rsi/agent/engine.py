"""The rollout engine: the one assembly every stage's episodes run through.

    engine = RolloutEngine.from_config(config, model, scorer=EpisodeScorer("fdr"))
    policy = engine.policy(actor.params, seed=config.seed)   # the actor through the sampler
    done = engine.run(policy, tasks, streams="discovery/hints")  # every episode, in order
    res = engine.first(policy, tasks, batch_size=64)   # the first B trainable to finish (RPR)
    future = engine.ahead(fn)                          # one rollout call in the background

Built once per stage from its typed config (`harness`, `rollout`, `tasks` sections), the
engine owns what every episode needs: the harness (`harness_from_config`), the sandbox
factory of the task pool (`tasks.task_sandbox_factory`), the stage's reward
(`rewards.EpisodeScorer`), the model (tokenizer, shape) and its compiled sampler (one per
shape and process, `cached_sampler`), the concurrency and the split of a launch over
processes. RSR discovery, fresh execution and rehearsal, base SFT demonstrations, RPR and
evaluation all collect here; episodes run in `scheduler.RolloutScheduler` (a thread per
episode, generation batched across them).

Random streams: every episode samples from its own stream, (seed, streams, launch index),
whatever else is in flight and whichever process runs it (`harness.StreamedPolicy`). So
`run`, which keeps every episode, replays exactly for a seed (RSR and evaluation replay);
`first` keeps the first B to finish, which depends on timing: each kept episode replays,
but which ones are kept does not (RPR is not replayable for a seed). `streams` names the
purpose of a `run` (discovery under a harness, fresh execution, ...), so two runs of one
policy draw different streams; None: the plain launch index (evaluation: the same actor
meets the same streams in every suite run).

Several processes (every one calls together): each runs its contiguous share of a launch
(`multihost.process_share`) and `run` returns all episodes, in launch order, on every
process; `first` returns this process's share (`RolloutResult`), the caller gathers.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import zlib
from collections.abc import Callable, Sequence
from typing import Any

from terminal_rsi.agent.harness import HarnessConfig, SamplerPolicy
from terminal_rsi.agent.scheduler import (
    RolloutResult,
    RolloutScheduler,
    SchedulerConfig,
    num_launch,
)
from terminal_rsi.agent.trajectory import TrainingPolicy, Trajectory, gather_trajectories
from terminal_rsi.models.sampling import Buckets, Sampler
from terminal_rsi.runtime import multihost
from terminal_rsi.tasks import task_sandbox_factory

_SAMPLERS: dict[Any, Sampler] = {}  # compiled samplers of this process, by shape


def sampler_buckets(rollout) -> Buckets:
    """The sampler's shape buckets from a `rollout` section (prefill_chunk, cache_multiple)."""
    return Buckets(prefill_chunk=rollout.prefill_chunk, cache_multiple=rollout.cache_multiple)


def cached_sampler(graphdef, mcfg, rollout, pad_id: int) -> Sampler:
    """The `Sampler` of a model shape and `rollout` section (decode_block and buckets),
    compiled once per process and shared by every stage and engine that samples it."""
    buckets = sampler_buckets(rollout)
    key = (graphdef, mcfg, int(rollout.decode_block), buckets, int(pad_id))
    if key not in _SAMPLERS:
        _SAMPLERS[key] = Sampler(graphdef, mcfg, decode_block=rollout.decode_block,
                                 buckets=buckets, pad_id=int(pad_id))
    return _SAMPLERS[key]


def harness_from_config(config, **overrides) -> HarnessConfig:
    """The target harness H0 of a stage: `config.harness`, verified on `config.tasks.backend`
    (`overrides`, e.g. a name or a temperature, replace fields)."""
    return HarnessConfig.from_config(config.harness, **{
        "name": "H0", "verify_backend": config.tasks.backend, **overrides})


def stream_namespace(name: str) -> int:
    """The stream namespace of a named `run` (a stable 31-bit hash of `name`)."""
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


@dataclasses.dataclass
class Episodes:
    """Every finished episode of a `run`, in launch order (`meta["launch_index"]`), dropped
    ones included; `errors`: the episodes that raised (one line each; they are absent)."""

    trajectories: list[Trajectory]
    errors: list[str]

    def trainable(self) -> list[Trajectory]:
        return [t for t in self.trajectories if t.training_policy != TrainingPolicy.DROP]

    def dropped(self) -> list[Trajectory]:
        return [t for t in self.trajectories if t.training_policy == TrainingPolicy.DROP]


class RolloutEngine:
    """Episodes of any policy over a stage's tasks (module doc)."""

    def __init__(self, harness: HarnessConfig, sandbox_factory: Callable[[Any], Any] | None,
                 *, concurrency: int, scorer: Callable[[Trajectory], Any] | None = None,
                 progress: bool | None = None, rollout=None, model=None):
        self.harness = harness
        self.sandbox_factory = sandbox_factory
        self.concurrency = int(concurrency)
        self.scorer = scorer
        self.progress = progress
        self.rollout = rollout  # the `rollout` section the sampler's shapes come from
        self.model = model  # `models.loading.LoadedModel` (tokenizer, config, graphdef)
        self._pool: cf.ThreadPoolExecutor | None = None

    @classmethod
    def from_config(cls, config, model=None, *, scorer=None, concurrency: int | None = None,
                    progress: bool | None = None, **harness_overrides) -> RolloutEngine:
        """The engine of a stage config and its `model` (a `LoadedModel`; None: only
        scripted policies): H0 from `harness` (`harness_overrides` replace fields), the
        sandboxes of `tasks`, `rollout.concurrency` episodes at a time (unless `concurrency`
        is given), the sampler's shapes from `rollout`."""
        return cls(harness_from_config(config, **harness_overrides),
                   task_sandbox_factory(config.tasks),
                   concurrency=config.rollout.concurrency if concurrency is None
                   else concurrency, scorer=scorer, progress=progress, rollout=config.rollout,
                   model=model)

    def policy(self, params, *, seed: int, version: int = 0, graphdef=None) -> SamplerPolicy:
        """A policy sampling `params` of the engine's model (its compiled sampler; `graphdef`:
        the params' graph, default the model's) from streams of `seed`. With several processes
        every one must call this together: each samples with a local copy of the weights
        (`multihost.local_replica`), so sampling issues no collective."""
        if self.model is None or self.rollout is None:
            raise ValueError("this engine has no model to sample: build it with "
                             "RolloutEngine.from_config(config, model)")
        m = self.model
        sampler = cached_sampler(m.graphdef if graphdef is None else graphdef, m.config,
                                 self.rollout, int(m.tokenizer.pad_id))
        return SamplerPolicy(sampler, multihost.local_replica(params), m.tokenizer,
                             seed=seed, version=version)

    def _scheduler(self, policy, oversample: float, keep_stragglers: bool) -> RolloutScheduler:
        return RolloutScheduler(policy, self.harness, self.sandbox_factory, SchedulerConfig(
            concurrency=self.concurrency, oversample=oversample,
            keep_stragglers=keep_stragglers, progress=self.progress, episode_streams=True),
            scorer=self.scorer)

    def run(self, policy, tasks: Sequence, *, harness: HarnessConfig | Sequence | None = None,
            streams: str | None = None, desc: str = "episodes") -> Episodes:
        """One episode per task of `tasks`, all of them kept, in launch order, on every
        process (each process runs its share). `harness`: the engine's H0 (None), one
        harness, or one per task. `streams`: the namespace of this run's random streams
        (module doc)."""
        tasks = list(tasks)
        harnesses = (list(harness) if isinstance(harness, list | tuple)
                     else [harness or self.harness] * len(tasks))
        if len(harnesses) != len(tasks):
            raise ValueError(f"run got {len(harnesses)} harnesses for {len(tasks)} tasks")
        lo, hi = multihost.process_share(len(tasks))
        namespace = None if streams is None else stream_namespace(streams)

        def share() -> tuple[list, list]:
            if hi == lo:  # more processes than episodes
                return [], []
            res = self._scheduler(policy, 0.0, True).collect(
                tasks[lo:hi], hi - lo, desc=desc, first_index=lo, harnesses=harnesses[lo:hi],
                stream_namespace=namespace)
            done = res.trajectories + res.stragglers + res.dropped
            return sorted(done, key=lambda t: t.meta["launch_index"]), list(res.errors)

        mine, errors = multihost.run_share(share)
        if multihost.is_multiprocess():
            mine, errors = gather_trajectories(mine), multihost.gather(errors)
        return Episodes(mine, errors)

    def first(self, policy, tasks: Sequence, batch_size: int, *, oversample: float = 0.0,
              policy_version: int | None = None, first_index: int = 0,
              keep_stragglers: bool = False, desc: str = "rollout") -> RolloutResult:
        """The first `batch_size` trainable episodes of `tasks` to finish (launching
        ceil(B (1 + oversample)) of them, `RolloutScheduler.collect`); stragglers are
        cancelled (or, with `keep_stragglers`, run to the end and returned apart).
        `first_index`: the launch index of `tasks[0]` in a larger launch (one process's
        share), which fixes each episode's random stream."""
        return self._scheduler(policy, oversample, keep_stragglers).collect(
            tasks, batch_size, policy_version=policy_version, desc=desc,
            first_index=first_index)

    @staticmethod
    def num_launch(batch_size: int, oversample: float) -> int:
        """How many episodes `first` launches for `batch_size` at `oversample`."""
        return num_launch(batch_size, oversample)

    def ahead(self, fn: Callable, *args, **kwargs) -> cf.Future:
        """Run `fn` (a rollout call) on the engine's one background thread: the one-batch-
        ahead mode of RPR (`rollout.policy_lag` 1) starts the next batch here."""
        if self._pool is None:
            self._pool = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollout-ahead")
        return self._pool.submit(fn, *args, **kwargs)

    def close(self) -> None:
        """Wait for the background rollout, if any, and stop its thread."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
