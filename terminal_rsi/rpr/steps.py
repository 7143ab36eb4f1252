"""One rollout step of the RPR phase (§2.4), as named steps (`terminal_rsi.rpr.phase` loops
over them):

    state, row = run_step(phase, state)
      collect      episodes of the current actor on the curriculum's next tasks (with
                   `rollout.policy_lag` 1: the batch launched one step earlier, and the next
                   one launched in the background before the update)
      make_batch   pack, π_old, pre-token values, advantages (masked, optionally whitened)
      update       `rpr.update.ppo_update`: critic-only through the warm-up, then joint
      evaluate     held-out success every `eval.every` steps
    save_checkpoint(phase, state)

`Phase` is what stays fixed over a run (config, model, tasks, compiled steps, files, the
batch in flight); `PhaseState` is what one step hands to the next and a checkpoint stores.

One batch ahead (`rollout.policy_lag = 1`): the rollouts of step k+1 are sampled by a copy of
the actor before step k's update (the update donates the live one) while that update runs;
every episode records its policy version, and the loss corrects for the lag with
`ppo.behavior_correction` (the sampler's log-probs are π_behav). A checkpoint waits for the
batch in flight and stores it beside the checkpoint (`ahead/step_<k>.jsonl`), so a resumed run
trains on exactly the episodes the uninterrupted one would.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import math
import os
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from terminal_rsi.agent import (
    RolloutEngine,
    RolloutResult,
    malformed_mask,
    pack_trajectories,
)
from terminal_rsi.agent.trajectory import gather_trajectories, read_shard, write_shard
from terminal_rsi.credit import AdvantageEstimator
from terminal_rsi.models.logprobs import logprob_gap
from terminal_rsi.models.sampling import Buckets
from terminal_rsi.rewards import EpisodeScorer, FamilyDivisors
from terminal_rsi.rpr import artifacts
from terminal_rsi.rpr.curriculum import Curriculum
from terminal_rsi.rpr.update import grouped_forward, minibatch_rows, ppo_update, update_widths
from terminal_rsi.runtime import multihost
from terminal_rsi.tasks import pool_tasks
from terminal_rsi.training.advantages import prepare_ppo_batch, whiten_advantages
from terminal_rsi.training.alignment import trained_mask
from terminal_rsi.training.checkpoint import RunCheckpointer
from terminal_rsi.training.losses import explained_variance
from terminal_rsi.training.train_state import TrainState

PACKED_KEYS = ("tokens", "positions", "segment_ids", "gen_mask", "rewards", "dones",
               "turn_ids")


class PhaseError(RuntimeError):
    """The phase cannot run as configured (no tasks, a batch that cannot be split, ...)."""


def config_tasks(config, split, n_per_family) -> list:
    """The tasks of `config.tasks` (suite, families) in `split`; PhaseError if there are
    none."""
    return pool_tasks(config.tasks, split, n_per_family, PhaseError)


@dataclasses.dataclass(frozen=True)
class UpdateFns:
    """The compiled functions of the update: `ppo_step.make_actor_step` / `make_critic_step`
    and `forward.make_logprob_fn` / `make_value_fn`."""

    actor_step: Callable
    critic_step: Callable
    logprobs: Callable
    values: Callable


@dataclasses.dataclass
class Phase:
    """What stays fixed over one run of the phase. `curriculum` keeps its family statistics
    (updated every step, saved in checkpoints); `eval_tasks` is loaded at the first eval."""

    config: Any
    engine: RolloutEngine  # the episodes: the actor, H0, sandboxes, the frozen reward
    pack_buckets: Buckets
    fns: UpdateFns
    num_steps: int
    warmup_steps: int  # steps 1..warmup_steps update the critic only
    curriculum: Curriculum
    divisors: FamilyDivisors
    ref_actor: TrainState | None  # π_ref of the KL penalty (None: no penalty)
    estimator: AdvantageEstimator  # `advantage.build()`: the estimator and its parameters
    traj_dir: str
    checkpointer: RunCheckpointer
    eval_tasks: list | None = None
    ahead: cf.Future | None = None  # the next step's RolloutResult (rollout.policy_lag = 1)

    def set_divisors(self, divisors: FamilyDivisors) -> None:
        """Freeze the reward's divisors (a resumed run restores its own): the engine scores
        every episode from here on with `rewards.fn` over them."""
        self.divisors = divisors
        self.engine.scorer = EpisodeScorer(self.config.rewards.fn, divisors)

    def close(self) -> None:
        """Wait for the background rollout, if any, and stop its thread."""
        self.engine.close()


@dataclasses.dataclass(frozen=True)
class PhaseState:
    """What one rollout step hands to the next (and a checkpoint stores)."""

    actor: TrainState
    critic: TrainState
    key: jax.Array
    step: int = 0  # rollout steps done
    data_position: int = 0  # training episodes launched so far
    version: int = 0  # policy version: actor updates so far


@dataclasses.dataclass(frozen=True)
class UpdateBatch:
    """The prepared PPO batch of one step and what its metrics need."""

    packed: Any  # agent.PackedBatch
    batch: dict  # `advantages.prepare_ppo_batch` arrays (+ ref_logprobs, policy_mask)
    widths: np.ndarray  # [B] width of each row in the update (`update.update_widths`)
    malformed: np.ndarray  # [B, L] tokens of malformed replies (`agent.malformed_mask`)
    trained: np.ndarray  # [B, L] the trained tokens (`alignment.trained_mask`)
    advantage_means: dict  # `advantage_means` before whitening


def finite(x) -> float | None:
    """float(x), or None when it is not finite (JSON has no NaN)."""
    x = float(x)
    return x if math.isfinite(x) else None


def mean_metrics(ms: list[dict], prefix: str) -> dict:
    """`prefix/key`: the mean of each key over the update steps' metrics ({} without any)."""
    if not ms:
        return {}
    keys = ms[0].keys()
    return {f"{prefix}/{k}": finite(np.mean([float(m[k]) for m in ms])) for k in keys}


def advantage_means(advantages, trained: np.ndarray,
                    malformed: np.ndarray) -> dict[str, float | None]:
    """Raw (pre-whitening) advantage means over the batch's trained tokens and over its
    well-formed ones: their gap is the upward bias that centering on the well-formed tokens
    alone would add (every malformed reply failed)."""
    adv = np.asarray(advantages)

    def mean(mask):
        return float(adv[mask].mean()) if mask.any() else None

    return {"adv_mean_trained": mean(trained), "adv_mean_wellformed": mean(trained & ~malformed)}


def policy(phase: Phase, state: PhaseState, seed: int, params=None):
    """A sampler policy of the current actor (or of `params` at the current version)."""
    params = state.actor.params if params is None else params
    return phase.engine.policy(params, seed=seed, version=state.version,
                               graphdef=state.actor.graphdef)


def _seed(key: jax.Array) -> int:
    """The sampling seed of a step's episodes from `key` (the same on every process: episode
    i samples from stream i of it, whichever process runs it)."""
    return int(jax.random.randint(key, (), 0, 2**31 - 1))


def _launch(phase: Phase, state: PhaseState, key: jax.Array, rng: np.random.Generator,
            params=None):
    """(a call that collects `rollout.batch_size` trainable episodes of the actor on the
    curriculum's next tasks, state with the new data position). The draw happens here, in
    order, the same on every process; each process runs its share of the tasks and keeps its
    share of the batch (`multihost.process_share`), and `gather_result` joins them."""
    r = phase.config.rollout
    pol = policy(phase, state, _seed(key), params)
    n_launch = phase.engine.num_launch(r.batch_size, r.oversample)
    tasks = phase.curriculum.launch(n_launch, state.data_position, rng)
    state = dataclasses.replace(state, data_position=state.data_position + n_launch)
    (lo, hi), (keep_lo, keep_hi) = (multihost.process_share(n)
                                    for n in (len(tasks), r.batch_size))
    return lambda: phase.engine.first(pol, tasks[lo:hi], keep_hi - keep_lo,
                                      oversample=r.oversample, policy_version=state.version,
                                      first_index=lo), state


def gather_result(res: RolloutResult) -> RolloutResult:
    """Every process's share of the step's episodes, in process order, on every process (the
    result unchanged on one process): all of them then pack the same update batch."""
    if not multihost.is_multiprocess():
        return res
    parts = multihost.gather([{"errors": list(res.errors),
                               "stats": {k: float(res.stats[k]) for k in AHEAD_STATS}}])
    return RolloutResult(
        gather_trajectories(res.trajectories), [], [],
        {"elapsed_s": max(p["stats"]["elapsed_s"] for p in parts),
         "dropped": sum(p["stats"]["dropped"] for p in parts),
         "rollout_wait_s": res.stats["rollout_wait_s"]},
        [e for p in parts for e in p["errors"]])


def collect(phase: Phase, state: PhaseState, key: jax.Array, rng: np.random.Generator):
    """The step's `RolloutResult` and the state with the new data position: collected now
    (synchronous, or the first step one batch ahead), or the batch launched one step earlier;
    with `rollout.policy_lag` 1 the next step's batch is then launched in the background,
    sampled by a copy of the actor before this step's update."""
    if phase.ahead is not None:
        t0 = time.monotonic()
        res = multihost.run_share(phase.ahead.result)
        res.stats["rollout_wait_s"] = time.monotonic() - t0
        phase.ahead = None
    else:
        run, state = _launch(phase, state, key, rng)
        res = multihost.run_share(run)
        res.stats["rollout_wait_s"] = res.stats["elapsed_s"]
    res = gather_result(res)
    if not res.trajectories:
        raise PhaseError(f"step {state.step}: no trainable episodes ({res.errors[:3]})")
    if phase.config.rollout.policy_lag and state.step < phase.num_steps:
        run, state = _launch(phase, state, jax.random.fold_in(key, 1), rng,
                             params=jax.tree.map(jnp.copy, state.actor.params))
        phase.ahead = phase.engine.ahead(run)
    return res, state


AHEAD_STATS = ("elapsed_s", "dropped")


def ahead_dir(phase: Phase) -> str:
    """`<workdir>/ahead`: the batches that were in flight at each kept checkpoint (with
    several processes, `ahead/process_<i>` holds process i's share of them)."""
    root = os.path.join(os.path.dirname(phase.checkpointer.directory), "ahead")
    if multihost.is_multiprocess():
        return os.path.join(root, f"process_{jax.process_index()}")
    return root


def ahead_path(phase: Phase, step: int) -> str:
    """Where the checkpoint of `step` keeps the batch that was in flight."""
    return os.path.join(ahead_dir(phase), f"step_{step}.jsonl")


def store_ahead(phase: Phase, step: int) -> dict:
    """Wait for the batch in flight and write it beside the checkpoint of `step`; the
    checkpoint's record of it ({} when none is in flight). Files of checkpoints no longer
    kept are removed."""
    directory, keep = ahead_dir(phase), {ahead_path(phase, s)
                                         for s in [*phase.checkpointer.all_steps(), step]}
    for name in os.listdir(directory) if os.path.isdir(directory) else []:
        if os.path.join(directory, name) not in keep:
            os.remove(os.path.join(directory, name))
    if phase.ahead is None:
        return {}
    os.makedirs(directory, exist_ok=True)
    res = phase.ahead.result()
    write_shard(ahead_path(phase, step), res.trajectories)
    return {"ahead": {"stats": {k: float(res.stats[k]) for k in AHEAD_STATS},
                      "errors": list(res.errors)}}


def restore_ahead(phase: Phase, step: int, extra: dict) -> None:
    """The batch the checkpoint of `step` stored, as the next step's rollouts (a finished
    future), when it stored one."""
    record = extra.get("ahead")
    if not record:
        return
    path = ahead_path(phase, step)
    if not os.path.exists(path):
        raise PhaseError(f"the checkpoint of step {step} had a rollout batch in flight, stored "
                         f"in {path}, which is gone; restore the file, or remove the "
                         "checkpoints after the last one without it to resume from there")
    fut: cf.Future = cf.Future()
    fut.set_result(RolloutResult(read_shard(path), [], [], dict(record["stats"]),
                                 list(record["errors"])))
    phase.ahead = fut


def make_batch(phase: Phase, state: PhaseState, trajectories: list) -> UpdateBatch:
    """Pack the episodes; π_old (and π_ref) and the pre-token values, each row group at its
    own width; advantages (`phase.estimator`); the policy mask of `ppo.mask_malformed`
    and the whitening of `ppo.normalize_advantages`."""
    p, fns = phase.config.ppo, phase.fns
    packed = pack_trajectories(trajectories, buckets=phase.pack_buckets)
    batch = {k: getattr(packed, k) for k in PACKED_KEYS}
    rows, n = batch["tokens"].shape[0], p.num_minibatches * p.num_microbatches
    if rows % n:
        raise PhaseError(f"packed batch of {rows} rows is not divisible by "
                         f"num_minibatches * num_microbatches = {n}")
    widths = update_widths(packed.segment_ids, phase.config.rollout.cache_multiple,
                           p.length_grouping)
    groups = minibatch_rows(widths, p.num_minibatches, np.random.default_rng(0),
                            p.length_grouping)
    logprobs = grouped_forward(fns.logprobs, groups, widths)
    batch = prepare_ppo_batch(state.actor, state.critic, batch,
                              num_microbatches=p.num_microbatches, logprob_fn=logprobs,
                              value_fn=grouped_forward(fns.values, groups, widths),
                              estimator=phase.estimator, next_row=packed.next_row)
    # π_behav of the behaviour correction: the sampler's log-probs, token-in/token-out
    batch["behavior_logprobs"] = packed.logprobs
    if phase.ref_actor is not None:
        batch["ref_logprobs"] = logprobs(phase.ref_actor, batch)
    malformed = malformed_mask(packed, trajectories)
    if p.mask_malformed:
        batch["policy_mask"] = packed.gen_mask & ~malformed
    trained = np.asarray(trained_mask(packed.gen_mask, batch["segment_ids"]))
    means = advantage_means(batch["advantages"], trained, malformed)
    if p.normalize_advantages:
        # statistics over every trained token, malformed replies included: they are part of
        # the on-policy sample, and all of them failed, so the kept tokens alone are a
        # reward-selected subset whose mean is biased upward (centering on it would push
        # down the successes the critic already expected)
        batch["advantages"] = whiten_advantages(batch["advantages"], batch["gen_mask"],
                                                batch["segment_ids"])
    return UpdateBatch(packed, batch, widths, malformed, trained, means)


def write_step_artifacts(phase: Phase, state: PhaseState, trajectories: list,
                         ub: UpdateBatch) -> None:
    """The step's episodes and its packed credit arrays (`rpr.artifacts`, contract C2),
    written by process 0."""
    name = artifacts.step_name("step", state.step)
    for t in trajectories:
        t.meta.update(rpr_step=state.step, rpr_mode=phase.config.mode)
    credit = artifacts.credit_arrays(ub.packed, multihost.host_copy(ub.batch))
    if multihost.is_writer():
        write_shard(os.path.join(phase.traj_dir, f"{name}.jsonl"), trajectories)
        artifacts.write_credit(os.path.join(phase.traj_dir, f"{name}.credit.npz"), credit)


def batch_metrics(phase: Phase, state: PhaseState, ub: UpdateBatch) -> dict:
    """Before the update: sampler vs trainer log-prob gap, the critic's explained variance,
    policy lag (mean, max and the share of rows at each lag 0..rollout.policy_lag) and the
    malformed-token share."""
    packed, batch, trained = ub.packed, ub.batch, ub.trained
    real = packed.policy_version[packed.policy_version >= 0]
    lag = state.version - real
    hist = {f"policy_lag_frac_{k}": float(np.mean(lag == k)) if lag.size else 0.0
            for k in range(phase.config.rollout.policy_lag + 1)}
    return {
        "truncated_rows": int(packed.truncated.sum()),
        "malformed_token_frac": float(ub.malformed.sum() / max(packed.gen_mask.sum(), 1)),
        **ub.advantage_means,
        "policy_lag_mean": float(np.mean(lag)) if lag.size else 0.0,
        "policy_lag_max": int(np.max(lag)) if lag.size else 0,
        **hist,
        "value_ev_pre_update": finite(explained_variance(batch["old_values"], batch["returns"],
                                                         trained)),
        **{k: float(v) for k, v in logprob_gap(packed.logprobs, batch["old_logprobs"],
                                               packed.gen_mask).items()},
    }


def update(phase: Phase, state: PhaseState, ub: UpdateBatch, rng: np.random.Generator):
    """`ppo_update` of the step: critic-only for steps <= `phase.warmup_steps` (the actor
    stays bit-identical), else joint (the policy version advances). Returns (state, metrics
    of the update)."""
    p = phase.config.ppo
    critic_only = state.step <= phase.warmup_steps
    actor, critic, cms, ams = ppo_update(
        state.actor, state.critic, ub.batch, ub.widths, rng, actor_step=phase.fns.actor_step,
        critic_step=phase.fns.critic_step, epochs=p.epochs, critic_epochs=p.critic_epochs,
        num_minibatches=p.num_minibatches, length_grouping=p.length_grouping,
        update_actor=not critic_only)
    state = dataclasses.replace(state, actor=actor, critic=critic,
                                version=state.version + (0 if critic_only else 1))
    return state, {"critic_only": critic_only, "critic_updates": len(cms),
                   "actor_updates": len(ams), **mean_metrics(cms, "critic"),
                   **mean_metrics(ams, "actor")}


def episode_metrics(trajectories: list) -> dict:
    """Means over the step's training episodes."""
    return {
        "episodes": len(trajectories),
        "reward_binary": float(np.mean([t.S for t in trajectories])),
        "reward_dense": float(np.mean([t.reward for t in trajectories])),
        "turns": float(np.mean([len(t.turns) for t in trajectories])),
        "generated_tokens": float(np.mean([t.num_generated for t in trajectories])),
    }


def evaluate(phase: Phase, state: PhaseState, key: jax.Array) -> dict:
    """Strict success and dense reward of the current actor on `eval.num_tasks` held-out
    tasks; the episodes go to `trajectories/eval_<step>.jsonl`."""
    c = phase.config
    if phase.eval_tasks is None:
        phase.eval_tasks = config_tasks(c, c.tasks.eval_split,
                                        c.tasks.eval_n_per_family)[:c.eval.num_tasks]
    # several processes: each evaluates its share of the tasks, the episodes are gathered
    episodes = phase.engine.run(policy(phase, state, _seed(key)), phase.eval_tasks,
                                streams="eval", desc="eval").trainable()
    for t in episodes:
        t.meta.update(rpr_step=state.step, rpr_eval=True)
    if multihost.is_writer():
        write_shard(os.path.join(phase.traj_dir,
                                 f"{artifacts.step_name('eval', state.step)}.jsonl"),
                    episodes)
    n = len(episodes) or float("nan")  # no episode: NaN, recorded as None
    return {"eval/success": sum(t.S for t in episodes) / n,
            "eval/reward_dense": sum(t.reward for t in episodes) / n,
            "eval/episodes": len(episodes)}


def run_step(phase: Phase, state: PhaseState) -> tuple[PhaseState, dict]:
    """One rollout step: collect → make batch → update → evaluate. Returns the next state and
    the step's metric row (floats finite or None)."""
    t0 = time.monotonic()
    key, k_roll, k_perm, k_eval = jax.random.split(state.key, 4)
    state = dataclasses.replace(state, step=state.step + 1, key=key)
    # one generator per step: the curriculum's draw, then the update's minibatches
    rng = np.random.default_rng(np.asarray(jax.random.key_data(k_perm)).ravel())
    res, state = collect(phase, state, k_roll, rng)
    ub = make_batch(phase, state, res.trajectories)
    write_step_artifacts(phase, state, res.trajectories, ub)
    before = batch_metrics(phase, state, ub)
    state, updated = update(phase, state, ub, rng)
    phase.curriculum.update(res.trajectories)
    row = {"step": state.step, "critic_only": updated.pop("critic_only"),
           "policy_version": state.version, "data_position": state.data_position,
           **episode_metrics(res.trajectories), **before, "dropped": int(res.stats["dropped"]),
           "episode_errors": len(res.errors), **updated,
           "rollout_s": res.stats["elapsed_s"], "rollout_wait_s": res.stats["rollout_wait_s"],
           **phase.curriculum.summary()}
    if phase.config.eval.every and state.step % phase.config.eval.every == 0:
        row.update(evaluate(phase, state, k_eval))
    row["step_s"] = time.monotonic() - t0
    return state, {k: (finite(v) if isinstance(v, float) else v) for k, v in row.items()}


def save_checkpoint(phase: Phase, state: PhaseState) -> None:
    """A full resume checkpoint of the step (both train states, PRNG key, policy version,
    data position, divisor table, curriculum statistics, the batch in flight), waited for."""
    ckpt = phase.checkpointer
    ckpt.save(state.step, actor=state.actor, critic=state.critic, rngs={"phase": state.key},
              policy_version=state.version, data_position=state.data_position,
              extra={"divisors": phase.divisors.to_dict(), "mode": phase.config.mode,
                     "curriculum": phase.curriculum.to_dict(),
                     **store_ahead(phase, state.step)},
              force=True)
    ckpt.wait()
