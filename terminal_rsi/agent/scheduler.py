"""Rollout scheduler: many concurrent episodes, generation batched across them (paper §3.1,
Appendix A), and oversampling. Stages collect through `engine.RolloutEngine`, which builds
these from the config.

    sched = RolloutScheduler(policy, harness, sandbox_factory, SchedulerConfig(concurrency=16),
                             scorer=EpisodeScorer("fdr", divisors))   # the stage's reward
    result = sched.collect(tasks, batch_size=256)       # launches ceil(256 * 1.125) = 288
    result.trajectories   # the first 256 to finish;  result.stats: completion-time stats

Each episode runs in its own thread (sandbox commands block only that thread). Episodes do
not call the policy directly: they submit their prompt to a `BatchingPolicy`, whose one
central loop gathers the pending prompts of all episodes waiting on the policy (it waits
until every running episode is waiting, or `max_batch_wait_s` after the first prompt) and
runs them as one `policy.generate` batch. So episodes waiting on a command never hold up
others, and generation runs at the largest batch available.

Oversampling: `collect` launches B' = ceil(B (1 + oversample)) episodes and keeps the
first B to finish with a trainable outcome (drop-policy episodes do not count). Stragglers
are cancelled at their next turn boundary (`keep_stragglers=False`), or run to the end and
are returned separately (`keep_stragglers=True`). `stats` records completion times of kept
and straggling episodes and the reward of kept versus all finished episodes, so the
selection bias toward fast episodes is visible.

Every trajectory (and every turn) records the policy version that generated it; the
one-batch-ahead mode of RPR runs a `collect` in the background (`engine.RolloutEngine.ahead`)
while the trainer updates. The train/rollout log-probability gap: `logprobs.logprob_gap`.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import itertools
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from terminal_rsi.agent.harness import (
    EpisodeCancelled,
    GenerationOutput,
    GenerationRequest,
    HarnessConfig,
    StreamedPolicy,
    run_episode,
)
from terminal_rsi.agent.trajectory import TrainingPolicy, Trajectory
from terminal_rsi.runtime.progress import progress


@dataclasses.dataclass(frozen=True)
class SchedulerConfig:
    """concurrency: episodes in flight (threads / sandboxes). oversample: B' = ceil(B (1 +
    oversample)) (the paper: 288 for 256, i.e. 0.125). keep_stragglers: let episodes past the
    first B finish and return them (else cancel them). max_batch_wait_s: how long the batching
    loop waits for more prompts after the first. progress: a bar of finished episodes on
    stderr (`terminal_rsi.runtime.progress`: rate, ETA, success, mean turns); None: only when
    stderr is a terminal (or as $TERMINAL_RSI_PROGRESS says), True: always, False: never.
    episode_streams: episode i of a `collect` samples from random stream i (`StreamedPolicy`):
    its randomness depends on the policy's seed and i only, not on what else is in flight
    (evaluation: the same actor scores the same; two actors meet the same streams)."""

    concurrency: int = 16
    oversample: float = 0.125
    keep_stragglers: bool = False
    max_batch_wait_s: float = 0.02
    progress: bool | None = None
    episode_streams: bool = False

    def __post_init__(self):
        if self.concurrency < 1:
            raise ValueError(f"SchedulerConfig.concurrency must be >= 1, got {self.concurrency}")
        if self.oversample < 0:
            raise ValueError(f"SchedulerConfig.oversample must be >= 0, got {self.oversample}")


class BatchingPolicy:
    """Gathers `generate` calls from episode threads into batched calls of `policy`."""

    def __init__(self, policy, max_batch_wait_s: float = 0.02):
        self.policy = policy
        self.tokenizer = policy.tokenizer
        self.max_batch_wait_s = max_batch_wait_s
        self._cond = threading.Condition()
        self._queue: list[tuple[list[GenerationRequest], cf.Future]] = []
        self._running = 0  # episodes that may still call generate
        self._closed = False
        self.batch_sizes: list[int] = []
        self.generated_tokens = 0
        self._thread = threading.Thread(target=self._loop, name="batching-policy", daemon=True)
        self._thread.start()

    @property
    def version(self) -> int:
        return int(getattr(self.policy, "version", 0))

    def episode_started(self) -> None:
        with self._cond:
            self._running += 1

    def episode_finished(self) -> None:
        with self._cond:
            self._running -= 1
            self._cond.notify_all()

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationOutput]:
        fut: cf.Future = cf.Future()
        with self._cond:
            if self._closed:
                raise RuntimeError("BatchingPolicy is closed")
            self._queue.append((list(requests), fut))
            self._cond.notify_all()
        return fut.result()

    def _take(self):
        with self._cond:
            while not self._queue and not self._closed:
                self._cond.wait()
            if self._closed and not self._queue:
                return None
            deadline = time.monotonic() + self.max_batch_wait_s
            while (len(self._queue) < self._running and not self._closed
                   and time.monotonic() < deadline):
                self._cond.wait(timeout=max(deadline - time.monotonic(), 0.0))
            items, self._queue = self._queue, []
            return items

    def _loop(self) -> None:
        while True:
            items = self._take()
            if items is None:
                return
            flat = [r for reqs, _ in items for r in reqs]
            try:
                outs = self.policy.generate(flat)
            except BaseException as e:  # noqa: BLE001 - hand the error to every caller
                for _, fut in items:
                    fut.set_exception(e)
                continue
            self.batch_sizes.append(len(flat))
            self.generated_tokens += sum(len(o.token_ids) for o in outs)
            k = 0
            for reqs, fut in items:
                fut.set_result(outs[k:k + len(reqs)])
                k += len(reqs)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=10)


@dataclasses.dataclass
class RolloutResult:
    trajectories: list[Trajectory]  # the first B trainable episodes to finish
    stragglers: list[Trajectory]  # finished after the first B (keep_stragglers=True)
    dropped: list[Trajectory]  # drop-policy episodes (infrastructure / verifier errors)
    stats: dict[str, float]
    errors: list[str] = dataclasses.field(default_factory=list)  # episodes that raised


def num_launch(batch_size: int, oversample: float) -> int:
    """B' = ceil(B (1 + oversample)): the episodes launched to keep the first B."""
    return int(math.ceil(batch_size * (1.0 + oversample) - 1e-9))


def _episode_policy(batcher: BatchingPolicy, config: SchedulerConfig, index: int,
                    namespace: int | None):
    """Episode `index`'s view of the batched policy: with `episode_streams`, its own random
    stream, `index` or (namespace, index)."""
    if not config.episode_streams:
        return batcher
    return StreamedPolicy(batcher, index if namespace is None else (namespace, index))


def _progress_postfix(trajs: Sequence[Trajectory]) -> dict[str, str]:
    n = max(len(trajs), 1)
    return {"success": f"{sum(t.S for t in trajs) / n:.2f}",
            "turns": f"{sum(len(t.turns) for t in trajs) / n:.1f}"}


class RolloutScheduler:
    """Runs episodes concurrently over sandboxes from `sandbox_factory` (e.g. local
    sandboxes, or a `SandboxPool`-backed factory) with cross-episode generation batching."""

    def __init__(self, policy, harness: HarnessConfig | None = None,
                 sandbox_factory: Callable[[Any], Any] | None = None,
                 config: SchedulerConfig | None = None,
                 scorer: Callable[[Trajectory], Any] | None = None):
        self.policy = policy
        self.harness = harness or HarnessConfig()
        self.sandbox_factory = sandbox_factory
        self.config = config or SchedulerConfig()
        # the stage's reward of a finished episode (`rewards.scoring.EpisodeScorer`: FDR / SPR
        # with its frozen divisors); None: episodes keep reward 0 (their report is recorded)
        self.scorer = scorer

    def num_launch(self, batch_size: int) -> int:
        return num_launch(batch_size, self.config.oversample)

    def collect(self, tasks: Iterable, batch_size: int, *,
                policy_version: int | None = None, desc: str = "rollout",
                first_index: int = 0, harnesses: Sequence[HarnessConfig] | None = None,
                stream_namespace: int | None = None) -> RolloutResult:
        """Launch B' = num_launch(B) episodes (tasks taken in order from `tasks`) and return
        the first B trainable ones to finish (see the module doc). `policy_version` (default:
        the policy's current version) is recorded in every trajectory; each turn also records
        the version that actually generated it. `desc` labels the progress bar.
        `first_index`: the launch index (`meta["launch_index"]`, and with `episode_streams`
        the random stream, (`stream_namespace`, index) when given) of the first task, for a
        caller that runs a slice of a larger launch (one process's share): its episodes
        sample as in one run. `harnesses`: one per task (default: the scheduler's)."""
        cfg = self.config
        launch = list(itertools.islice(iter(tasks), self.num_launch(batch_size)))
        if not launch:
            raise ValueError("collect needs at least one task")
        harnesses = [self.harness] * len(launch) if harnesses is None else harnesses
        if len(harnesses) < len(launch):
            raise ValueError(f"collect got {len(harnesses)} harnesses for {len(launch)} tasks")
        batcher = BatchingPolicy(self.policy, cfg.max_batch_wait_s)
        version = batcher.version if policy_version is None else int(policy_version)
        cancel = threading.Event()
        t0 = time.monotonic()
        finish: dict[int, float] = {}

        def work(i, task):
            if cancel.is_set():
                raise EpisodeCancelled("cancelled before start")
            batcher.episode_started()
            try:
                pol = _episode_policy(batcher, cfg, first_index + i, stream_namespace)
                traj = run_episode(task, pol, self.sandbox_factory, harnesses[i],
                                   policy_version=version, cancel=cancel)
                if self.scorer is not None:
                    self.scorer(traj)
                return traj
            finally:
                batcher.episode_finished()
                finish[i] = time.monotonic() - t0

        kept: list[Trajectory] = []
        stragglers: list[Trajectory] = []
        dropped: list[Trajectory] = []
        cancelled = 0
        errors: list[str] = []
        pool = cf.ThreadPoolExecutor(max_workers=cfg.concurrency, thread_name_prefix="episode")
        bar = progress(total=len(launch), desc=desc, unit="ep", force=cfg.progress)
        try:
            futs = {pool.submit(work, i, t): i for i, t in enumerate(launch)}
            for fut in cf.as_completed(futs):
                i = futs[fut]
                bar.update()  # every launched episode ends once: kept, dropped, cancelled, ...
                try:
                    traj = fut.result()
                except EpisodeCancelled:
                    cancelled += 1
                    continue
                except Exception as e:  # noqa: BLE001 - one bad episode never stops a run
                    errors.append(f"{launch[i].id}: {type(e).__name__}: {e}")
                    continue
                traj.meta["launch_index"] = first_index + i
                traj.meta["finish_s"] = finish.get(i, time.monotonic() - t0)
                if traj.training_policy == TrainingPolicy.DROP:
                    dropped.append(traj)
                elif len(kept) < batch_size:
                    kept.append(traj)
                    if len(kept) == batch_size and not cfg.keep_stragglers:
                        cancel.set()
                else:
                    stragglers.append(traj)
                bar.set_postfix(_progress_postfix(kept + stragglers), refresh=False)
        finally:
            cancel.set()
            pool.shutdown(wait=True, cancel_futures=True)
            batcher.close()
            bar.close()
        elapsed = time.monotonic() - t0
        stats = self._stats(kept, stragglers, dropped, cancelled, len(launch), elapsed, batcher,
                            errors)
        return RolloutResult(kept, stragglers, dropped, stats, errors)

    def _stats(self, kept, stragglers, dropped, cancelled, launched, elapsed, batcher,
               errors) -> dict[str, float]:
        def mean(xs):
            return float(np.mean(xs)) if len(xs) else float("nan")

        fin = kept + stragglers
        kept_t = [t.meta["finish_s"] for t in kept]
        st = {
            "launched": float(launched),
            "kept": float(len(kept)),
            "stragglers": float(len(stragglers)),
            "dropped": float(len(dropped)),
            "cancelled": float(cancelled),
            "episode_errors": float(len(errors)),
            "elapsed_s": elapsed,
            "episodes_per_s": len(fin) / max(elapsed, 1e-9),
            "success_rate": mean([t.S for t in kept]),
            "mean_turns": mean([len(t.turns) for t in kept]),
            "mean_reward_kept": mean([t.reward for t in kept]),
            "mean_reward_all_finished": mean([t.reward for t in fin]),
            "finish_s_p50_kept": float(np.median(kept_t)) if kept_t else float("nan"),
            "finish_s_max_kept": float(max(kept_t)) if kept_t else float("nan"),
            "finish_s_mean_stragglers": mean([t.meta["finish_s"] for t in stragglers]),
            "mean_turns_stragglers": mean([len(t.turns) for t in stragglers]),
            "generated_tokens": float(batcher.generated_tokens),
            "generated_tokens_per_s": batcher.generated_tokens / max(elapsed, 1e-9),
            "mean_generation_batch": mean(batcher.batch_sizes),
            "policy_calls": float(len(batcher.batch_sizes)),
        }
        return st
