"""The base stage for the tiny model: supervised training on rendered demonstrations.

    python experiments/run.py --config=configs/base_sft.py --workdir=/tmp/base

1. Demonstrations: every training task (`tasks.train_split`, `tasks.families`,
   `tasks.n_per_family`) is run through the target harness H0 (`harness.*`) by the
   reference-solution policy (`common.demo_policy`, actions in `harness.action_style`);
   only strictly verified episodes (S = 1) are kept. A fraction `demos.runbook_fraction` of
   the tasks also gets a runbook-conditioned demonstration: the same actions under
   `execution_harness(H0, digest_runbook(x_pub, reference commands))`, stored *with* the
   private guidance, so the model learns to carry out a runbook it is given (what RSR's
   fresh execution asks of it).
2. SFT (`terminal_rsi.rsr.sft`, the step shared with the `rsr` stage): `sft.steps` steps of
   `sft.batch_size` demonstrations drawn uniformly with replacement, or with
   `demos.curriculum = "length"` first from the shortest demonstrations, widening linearly
   to all of them by half of training. Training starts from random weights or from
   `init.actor_weights`.
3. Evaluation: strict success on `eval.num_tasks` held-out instances (`tasks.eval_split`)
   under H0 at `eval.temperature`, and (if runbook demonstrations were used) under H0 with
   the digest runbook as private guidance; every `eval.every` steps and at the end.

Writes (C2): export/actor, export/critic (`critic_params_from_actor` of the trained actor),
metrics.jsonl (one line per SFT step; eval lines carry `eval/*` keys), trajectories/
demos.jsonl, trajectories/eval.jsonl (final held-out episodes), summary.json (demos,
train_s, held-out success overall and per family, guided success).
"""

from __future__ import annotations

import math
import os
import sys
import time

import jax
import ml_collections
import numpy as np

from terminal_rsi.configuration import BASE_SCHEMA, EPISODE_SCHEMA, Field
from terminal_rsi.progress import echo, progress
from terminal_rsi.rsr import common as cm

SCHEMA = {
    **BASE_SCHEMA, **EPISODE_SCHEMA, **cm.MODEL_SCHEMA, **cm.INIT_SCHEMA, **cm.TASK_SCHEMA,
    **cm.HARNESS_SCHEMA, **cm.ROLLOUT_SCHEMA, **cm.OPT_SCHEMA, **cm.SFT_SCHEMA,
    "demos.runbook_fraction": Field(float, "fraction of tasks that also get a runbook-"
                                    "conditioned demonstration", lo=0.0, hi=1.0),
    "demos.curriculum": Field(str, "none | length (shortest demonstrations first)",
                              choices=("none", "length")),
    "eval.num_tasks": Field(int, "held-out tasks per evaluation (0: no evaluation)", lo=0),
    "eval.temperature": Field(float, "sampling temperature of evaluation (0: greedy)",
                              lo=0.0),
    "eval.every": Field(int, "evaluate every N SFT steps (0: only at the end)", lo=0),
    "eval.guided": Field(bool, "also evaluate under H0 + digest-runbook guidance"),
}


def runbook_for_task(task):
    """The digest runbook of a task's reference solution (all turns' commands in order)."""
    from terminal_rsi.rsr.runbook import digest_runbook

    return digest_runbook(task.instruction, [c for turn in task.solution for c in turn])


def render_demonstrations(config, tasks, tokenizer, rng) -> tuple[list, dict]:
    """Reference demonstrations under H0, plus runbook-conditioned ones (module doc)."""
    from terminal_rsi.rsr.guidance import execution_harness

    h0 = cm.harness_from_config(config)
    pol = cm.demo_policy(tokenizer, config.harness.action_style)
    c = config.rollout.concurrency
    sandbox = cm.task_sandbox(config)
    plain = cm.collect(pol, h0, tasks, c, sandbox)
    n_rb = int(round(config.demos.runbook_fraction * len(tasks)))
    rb_tasks = [tasks[i] for i in sorted(rng.choice(len(tasks), n_rb, replace=False))]
    guided = cm.collect(pol, [execution_harness(h0, runbook_for_task(t)) for t in rb_tasks],
                        rb_tasks, c, sandbox)
    for t in guided:
        t.meta["demo"] = "runbook"
    for t in plain:
        t.meta["demo"] = "plain"
    kept = [t for t in plain + guided if t.S == 1]
    stats = {"demos_plain": sum(t.S for t in plain), "demos_guided": sum(t.S for t in guided),
             "demos_failed": len(plain) + len(guided) - len(kept)}
    if not kept:
        raise cm.StageError("no reference demonstration passed its verifier; check the task "
                            f"backend {config.tasks.backend!r} and the harness budgets")
    return kept, stats


def length_curriculum(trajs, num_steps: int, start_fraction: float = 0.34):
    """sampler(rng, n): draws from the shortest fraction f_k of the demonstrations, f_k
    growing linearly from `start_fraction` to 1 at half of training."""
    order = np.argsort([sum(len(x) for k in {u.segment for u in t.turns}
                            for x in [t.segment_tokens(k)[0]]) for t in trajs], kind="stable")
    state = {"k": 0}

    def sampler(rng, n):
        state["k"] += 1
        frac = min(1.0, start_fraction + (1 - start_fraction) * state["k"] /
                   max(1.0, num_steps / 2))
        m = max(1, int(math.ceil(frac * len(order))))
        return [trajs[i] for i in order[rng.integers(0, m, n)]]

    return sampler


def evaluate(actor, mcfg, tokenizer, config, tasks, *, guided: bool, seed: int,
             cache: dict) -> list:
    from terminal_rsi.agent import SamplingSettings
    from terminal_rsi.rsr.guidance import execution_harness

    h0 = cm.harness_from_config(config, sampling=SamplingSettings(
        temperature=config.eval.temperature))
    pol = cm.make_sampler_policy(actor, mcfg, tokenizer, config, seed, cache)
    harness = [execution_harness(h0, runbook_for_task(t)) for t in tasks] if guided else h0
    return cm.collect(pol, harness, tasks, config.rollout.concurrency,
                      cm.task_sandbox(config))


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
    from terminal_rsi.agent import write_shard
    from terminal_rsi.checkpoint import export_weights
    from terminal_rsi.losses import Aggregation
    from terminal_rsi.models.loading import load_model
    from terminal_rsi.models.transformer import critic_params_from_actor
    from terminal_rsi.rpr.phase import config_tasks
    from terminal_rsi.rsr.sft import make_sft_step, train_sft
    from terminal_rsi.sampling import Buckets

    t_start = time.monotonic()
    export, trajdir = cm.stage_dirs(workdir)
    model = load_model(config)  # byte preset, or model.gguf: its tokenizer, template, shape
    tok, mcfg = model.tokenizer, model.config
    rng = np.random.default_rng(config.seed)
    tasks = config_tasks(config, config.tasks.train_split, config.tasks.n_per_family,
                         cm.StageError)
    demos, demo_stats = render_demonstrations(config, tasks, tok, rng)
    write_shard(os.path.join(trajdir, "demos.jsonl"), demos)
    t_demo = time.monotonic() - t_start
    echo(f"[base_sft] {len(demos)} demonstrations ({_demo_str(demo_stats)}) in {t_demo:.0f}s")

    actor = cm.create_actor(config, mcfg, config.actor_opt, config.seed,
                            total_steps=config.sft.steps)
    s = config.sft
    step_fn = make_sft_step(Aggregation(s.aggregation), s.num_microbatches, state=actor)
    # rows padded to the batch's longest row rounded up to cache_multiple (a handful of
    # compiled shapes; padding every batch to the longest demonstration costs more on CPU)
    buckets = Buckets(cache_multiple=config.rollout.cache_multiple,
                      batch_multiple=s.num_microbatches, power_of_two=False)
    width = None
    eval_tasks = (config_tasks(config, config.tasks.eval_split, config.tasks.eval_n_per_family,
                               cm.StageError)[:config.eval.num_tasks]
                  if config.eval.num_tasks else [])
    cache: dict = {}
    metrics: list[dict] = []
    metrics_path = os.path.join(workdir, "metrics.jsonl")
    sampler = (length_curriculum(demos, s.steps) if config.demos.curriculum == "length"
               else None)
    t_train0 = time.monotonic()
    train_s = 0.0
    final_eval: list = []

    def run_eval(step: int, row: dict) -> None:
        nonlocal final_eval
        if not eval_tasks:
            return
        ev = evaluate(actor, mcfg, tok, config, eval_tasks, guided=False,
                      seed=config.seed + step, cache=cache)
        row["eval/success"] = float(np.mean([t.S for t in ev]))
        if config.eval.guided:
            gv = evaluate(actor, mcfg, tok, config, eval_tasks, guided=True,
                          seed=config.seed + step + 1, cache=cache)
            row["eval/guided_success"] = float(np.mean([t.S for t in gv]))
        final_eval = ev

    def on_step(offset: int):
        def f(k: int, row: dict) -> None:
            row["step"] = k + offset
            metrics.append(row)
            if row["step"] % 10 == 0 or row["step"] == s.steps:
                echo(f"[base_sft] step {row['step']}/{s.steps} loss {row['loss']:.3f} "
                     f"nll/token {row['nll_per_token']:.4f} "
                     f"{time.monotonic() - t_train0:.0f}s")
        return f

    # train in chunks between evaluations, under one bar of all the steps
    every = config.eval.every or s.steps
    done = 0
    cpu0 = time.process_time()
    with progress(total=s.steps, desc="base_sft", unit="step") as bar:
        while done < s.steps:
            n = min(every, s.steps - done)
            t0 = time.monotonic()
            actor, _ = train_sft(actor, demos, step_fn, num_steps=n, batch_size=s.batch_size,
                                 rng=rng, buckets=buckets, sampler=sampler, width=width,
                                 on_step=on_step(done), bar=bar)
            train_s += time.monotonic() - t0
            done += n
            if done < s.steps and config.eval.every:
                run_eval(done, metrics[-1])
                echo(f"[base_sft] eval at step {done}: {_eval_str(metrics[-1])}")
            cm.write_jsonl(metrics_path, metrics)
    train_cpu_s = time.process_time() - cpu0  # includes in-training evaluations
    if not metrics:  # sft.steps == 0: one line so that metrics.jsonl is never empty
        metrics.append({"step": 0})
    run_eval(s.steps, metrics[-1])
    cm.write_jsonl(metrics_path, metrics)
    write_shard(os.path.join(trajdir, "eval.jsonl"), final_eval)
    export_weights(export, "actor", actor.params, force=True)
    export_weights(export, "critic", jax.device_get(critic_params_from_actor(actor.params)),
                   force=True)
    last = metrics[-1]
    summary = {
        **demo_stats,
        "demos": len(demos),
        "families": sorted({t.family for t in tasks}),
        "demo_s": t_demo,
        "train_s": train_s,
        "train_cpu_s": train_cpu_s,
        "sft_steps": s.steps,
        "final_nll_per_token": last.get("nll_per_token"),
        "heldout_tasks": len(eval_tasks),
        "heldout_success": last.get("eval/success"),
        "heldout_guided_success": last.get("eval/guided_success"),
        "heldout_per_family": cm.success_by_family(final_eval),
        "num_params": mcfg.num_params(),
        "wall_s": time.monotonic() - t_start,
    }
    cm.write_json(os.path.join(workdir, "summary.json"), summary)
    echo(f"[base_sft] done: held-out success {_rate(summary['heldout_success'])} "
         f"(guided {_rate(summary['heldout_guided_success'])}) after {train_s:.0f}s of "
         "training", file=sys.stderr)
    return summary


def _rate(x: float | None) -> str:
    """A success rate as a person reads it: "0.75", or "not measured" for None."""
    return "not measured" if x is None else f"{x:.2f}"


def _demo_str(stats: dict) -> str:
    return (f"{stats['demos_plain']} plain, {stats['demos_guided']} runbook-guided, "
            f"{stats['demos_failed']} failed")


def _eval_str(row: dict) -> str:
    return " ".join(f"{k[5:]} {v:.2f}" for k, v in row.items() if k.startswith("eval/"))
