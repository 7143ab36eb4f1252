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

import dataclasses
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from terminal_rsi.agent import RolloutEngine, write_shard
from terminal_rsi.models.loading import load_model
from terminal_rsi.models.sampling import Buckets
from terminal_rsi.models.transformer import critic_params_from_actor
from terminal_rsi.rsr import common as cm
from terminal_rsi.rsr.config import BaseSFTConfig
from terminal_rsi.rsr.guidance import execution_harness
from terminal_rsi.rsr.runbook import digest_runbook
from terminal_rsi.rsr.sft import make_sft_step, train_sft
from terminal_rsi.runtime import multihost
from terminal_rsi.runtime.exports import export_weights
from terminal_rsi.runtime.progress import echo, progress
from terminal_rsi.tasks import pool_tasks
from terminal_rsi.training.losses import Aggregation
from terminal_rsi.training.train_state import TrainState

# the experiment's typed config: every setting, its default and what it allows
# (terminal_rsi.rsr.config); `run` receives an instance built from the ConfigDict
CONFIG = BaseSFTConfig


def runbook_for_task(task):
    """The digest runbook of a task's reference solution (all turns' commands in order)."""
    return digest_runbook(task.instruction, [c for turn in task.solution for c in turn])


def render_demonstrations(engine: RolloutEngine, config, tasks, rng) -> tuple[list, dict]:
    """Reference demonstrations under H0, plus runbook-conditioned ones (module doc)."""
    h0 = engine.harness
    pol = cm.demo_policy(engine.model.tokenizer, config.harness.action_style,
                         config.harness.terminal, config.harness.action_format)
    plain = engine.run(pol, tasks, streams="demos/plain", desc="demos").trajectories
    n_rb = int(round(config.demos.runbook_fraction * len(tasks)))
    rb_tasks = [tasks[i] for i in sorted(rng.choice(len(tasks), n_rb, replace=False))]
    guided = engine.run(pol, rb_tasks, streams="demos/runbook", desc="runbook demos",
                        harness=[execution_harness(h0, runbook_for_task(t))
                                 for t in rb_tasks]).trajectories
    for t in guided:
        t.meta["demo"] = "runbook"
    for t in plain:
        t.meta["demo"] = "plain"
    kept = [t for t in plain + guided if t.S == 1]
    stats = {"demos_plain": sum(t.S for t in plain), "demos_guided": sum(t.S for t in guided),
             "demos_failed": len(tasks) + len(rb_tasks) - len(kept)}
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


def evaluate(engine: RolloutEngine, actor, config, tasks, *, guided: bool,
             seed: int) -> list:
    """One episode per task of `actor` under H0 at `eval.temperature` (with `guided`, with
    the task's digest runbook as private guidance); an episode that raised is absent."""
    h0 = dataclasses.replace(engine.harness, temperature=config.eval.temperature)
    pol = engine.policy(actor.params, seed=seed, graphdef=actor.graphdef)
    harness = [execution_harness(h0, runbook_for_task(t)) for t in tasks] if guided else h0
    return engine.run(pol, tasks, harness=harness, streams="eval/guided" if guided else "eval",
                      desc="eval").trajectories


def load_demonstrations(engine: RolloutEngine, config, rng,
                        trajdir: str) -> tuple[list, list, dict]:
    """Step 1: the training tasks and their verified demonstrations
    (trajectories/demos.jsonl) with their counts."""
    tasks = pool_tasks(config.tasks, config.tasks.train_split, config.tasks.n_per_family,
                       cm.StageError)
    demos, stats = render_demonstrations(engine, config, tasks, rng)
    write_shard(os.path.join(trajdir, "demos.jsonl"), demos)
    return tasks, demos, stats


def heldout_tasks(config) -> list:
    """The first `eval.num_tasks` held-out instances (`tasks.eval_split`); none with 0."""
    if not config.eval.num_tasks:
        return []
    return pool_tasks(config.tasks, config.tasks.eval_split, config.tasks.eval_n_per_family,
                      cm.StageError)[:config.eval.num_tasks]


@dataclasses.dataclass
class Trainer:
    """Steps 2-3: SFT of `actor` on `demos` in chunks of `eval.every` steps, each followed by
    an evaluation on `eval_tasks` written into the last metrics row."""

    config: Any
    engine: RolloutEngine
    actor: TrainState
    demos: list
    eval_tasks: list
    metrics_path: str
    metrics: list = dataclasses.field(default_factory=list)
    final_eval: list = dataclasses.field(default_factory=list)
    train_s: float = 0.0

    def heldout_eval(self, step: int, row: dict) -> None:
        """Held-out success (and guided success) of the current actor into `row`."""
        if not self.eval_tasks:
            return
        c = self.config
        n = len(self.eval_tasks)
        ev = evaluate(self.engine, self.actor, c, self.eval_tasks, guided=False,
                      seed=c.seed + step)
        row["eval/success"] = cm.success(ev, n)
        if c.eval.guided:
            gv = evaluate(self.engine, self.actor, c, self.eval_tasks, guided=True,
                          seed=c.seed + step + 1)
            row["eval/guided_success"] = cm.success(gv, n)
        self.final_eval = ev

    def on_step(self, offset: int, t_train0: float) -> Callable[[int, dict], None]:
        """train_sft's per-step callback: numbers the row, keeps it, logs every 10 steps."""
        steps = self.config.sft.steps

        def f(k: int, row: dict) -> None:
            row["step"] = k + offset
            self.metrics.append(row)
            if row["step"] % 10 == 0 or row["step"] == steps:
                echo(f"[base_sft] step {row['step']}/{steps} loss {row['loss']:.3f} "
                     f"nll/token {row['nll_per_token']:.4f} "
                     f"{time.monotonic() - t_train0:.0f}s")
        return f

    def train(self, rng: np.random.Generator) -> float:
        """All `sft.steps` steps under one progress bar, evaluating every `eval.every` steps
        and at the end; returns the CPU seconds of training (evaluations included)."""
        c, s = self.config, self.config.sft
        step_fn = make_sft_step(Aggregation(s.aggregation), s.num_microbatches,
                                state=self.actor)
        # rows padded to the batch's longest row rounded up to cache_multiple (a handful of
        # compiled shapes; padding every batch to the longest demonstration costs more on CPU)
        buckets = Buckets(cache_multiple=c.rollout.cache_multiple,
                          batch_multiple=s.num_microbatches, power_of_two=False)
        sampler = (length_curriculum(self.demos, s.steps) if c.demos.curriculum == "length"
                   else None)
        every, done = c.eval.every or s.steps, 0
        t_train0, cpu0 = time.monotonic(), time.process_time()
        with progress(total=s.steps, desc="base_sft", unit="step") as bar:
            while done < s.steps:
                n = min(every, s.steps - done)
                t0 = time.monotonic()
                self.actor, _ = train_sft(self.actor, self.demos, step_fn, num_steps=n,
                                          batch_size=s.batch_size, rng=rng, buckets=buckets,
                                          sampler=sampler, width=None,
                                          on_step=self.on_step(done, t_train0), bar=bar)
                self.train_s += time.monotonic() - t0
                done += n
                if done < s.steps and c.eval.every:
                    self.heldout_eval(done, self.metrics[-1])
                    echo(f"[base_sft] eval at step {done}: {_eval_str(self.metrics[-1])}")
                cm.write_jsonl(self.metrics_path, self.metrics)
        train_cpu_s = time.process_time() - cpu0  # includes in-training evaluations
        if not self.metrics:  # sft.steps == 0: one line so that metrics.jsonl is never empty
            self.metrics.append({"step": 0})
        self.heldout_eval(s.steps, self.metrics[-1])
        cm.write_jsonl(self.metrics_path, self.metrics)
        return train_cpu_s


def export_base(export: str, actor: TrainState) -> None:
    """export/actor, and export/critic = `critic_params_from_actor` of it (C2)."""
    export_weights(export, "actor", actor.params, force=True)
    export_weights(export, "critic", multihost.host_copy(critic_params_from_actor(actor.params)),
                   force=True)


def base_summary(tr: Trainer, tasks: list, demo_stats: dict, demo_s: float,
                 train_cpu_s: float) -> dict:
    """summary.json of the stage (module doc)."""
    last = tr.metrics[-1]
    return {
        **demo_stats,
        "demos": len(tr.demos),
        "families": sorted({t.family for t in tasks}),
        "demo_s": demo_s,
        "train_s": tr.train_s,
        "train_cpu_s": train_cpu_s,
        "sft_steps": tr.config.sft.steps,
        "final_nll_per_token": last.get("nll_per_token"),
        "heldout_tasks": len(tr.eval_tasks),
        "heldout_success": last.get("eval/success"),
        "heldout_guided_success": last.get("eval/guided_success"),
        "heldout_per_family": cm.success_by_family(tr.final_eval),
        "num_params": tr.engine.model.config.num_params(),
    }


def run(config: BaseSFTConfig, workdir: str) -> dict:
    """The base stage (module doc): demonstrations, SFT with evaluations, exports."""
    t_start = time.monotonic()
    export, trajdir = cm.stage_dirs(workdir)
    model = load_model(config)  # byte preset, or model.gguf: its tokenizer, template, shape
    engine = RolloutEngine.from_config(config, model, scorer=cm.RSR_SCORER)
    rng = np.random.default_rng(config.seed)
    tasks, demos, demo_stats = load_demonstrations(engine, config, rng, trajdir)
    t_demo = time.monotonic() - t_start
    echo(f"[base_sft] {len(demos)} demonstrations ({_demo_str(demo_stats)}) in {t_demo:.0f}s")
    actor = cm.create_actor(config, model.config, config.actor_opt, config.seed,
                            total_steps=config.sft.steps)
    tr = Trainer(config, engine, actor, demos, heldout_tasks(config),
                 os.path.join(workdir, "metrics.jsonl"))
    train_cpu_s = tr.train(rng)
    write_shard(os.path.join(trajdir, "eval.jsonl"), tr.final_eval)
    export_base(export, tr.actor)
    summary = {**base_summary(tr, tasks, demo_stats, t_demo, train_cpu_s),
               "wall_s": time.monotonic() - t_start}
    cm.write_json(os.path.join(workdir, "summary.json"), summary)
    echo(f"[base_sft] done: held-out success {_rate(summary['heldout_success'])} "
         f"(guided {_rate(summary['heldout_guided_success'])}) after {tr.train_s:.0f}s of "
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
