"""Per-stage training diagnostics for the ledger (issue 51): the numbers a researcher checks
first when a stage did not do what it should, in one `diagnostics` dict per stage entry.

    "diagnostics": {
      "mean/turns": turns per episode of the stage's own episodes: RPR (and the critic
          warm-up) the mean over rollout steps of `metrics.jsonl` "turns"; RSR the mean
          over its discovery and fresh-execution episodes, also apart
          ("mean/discovery/turns", "mean/fresh/turns"),
      "joint_steps": RPR steps that updated the actor (not critic-only),
      "mean/actor/clip_frac", "last/actor/clip_frac": PPO clip fraction
          (`actor/clip_frac_low` + `actor/clip_frac_high`: the tokens whose clipped,
          gradient-free branch was taken) over the joint steps, mean and last,
      "mean/actor/approx_kl", "last/actor/approx_kl": `actor/approx_kl` (k3 of
          KL(π_old ‖ π_θ) over the update) over the joint steps,
      "mean/actor/grad_norm": actor gradient norm before clipping, mean over the steps that
          updated the actor (RPR joint steps; RSR and base SFT steps: "grad_norm"),
      "mean/critic/grad_norm": the critic's, over every RPR step,
      "mean/value_ev_pre_update", "last/value_ev_pre_update": the critic's explained
          variance on each step's batch before its update (RPR; the EV on the evaluation
          episodes stays in the stage's `eval`),
      "policy_movement", "probe_sequences", "probe_tokens": mean |Δ log π| between the
          stage's input actor and its final trained actor (before model selection) on the
          run's probe (`evaluation.movement`),
      "per_family": {suite: {family: {"before", "after"}}}: held-out success of the
          stage's input actor (its input stage's evaluation) and of its exported actor,
    }

Keys a stage does not have are absent (an RSR stage has no clip fraction; a base stage
without an input actor no movement or "before"). The probe (`<run>/probe.jsonl`, frozen
once per run like the divisors and strata): the reference-solution demonstrations of the
validation tasks (a task directory suite: of its tasks), PROBE_PER_FAMILY per family,
at most PROBE_SIZE taken round-robin over the families, rendered through the evaluation
harness by the reference policy (`rsr.common.demo_policy`); every finished episode with
generated tokens is kept, verified or not.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping, Sequence

import numpy as np

from terminal_rsi.agent import read_shard, write_shard
from terminal_rsi.agent.engine import RolloutEngine, sampler_buckets
from terminal_rsi.evaluation.evaluate import eval_tasks
from terminal_rsi.evaluation.movement import probe_movement
from terminal_rsi.models.loading import load_model
from terminal_rsi.rsr.common import demo_policy
from terminal_rsi.runtime import multihost
from terminal_rsi.runtime.atomic import read_json_lines

PROBE_PER_FAMILY = 2
PROBE_SIZE = 32
# the stage's own episodes whose turns are counted, by experiment (RPR: metrics.jsonl)
EPISODE_SHARDS = {"rsr": ("discovery", "fresh")}


def finite_mean(xs: Sequence) -> float | None:
    """The mean of the finite numbers of `xs` (None when there is none)."""
    v = [float(x) for x in xs if isinstance(x, int | float) and not isinstance(x, bool)
         and np.isfinite(x)]
    return float(np.mean(v)) if v else None


def mean_last(rows: Sequence[Mapping], key: str, value=None) -> dict:
    """{"mean/<key>", "last/<key>"} of `value(row)` (default row[key]) over `rows` that give
    a finite number ({} when none does)."""
    get = value or (lambda r: r.get(key))
    xs = [x for x in (get(r) for r in rows) if finite_mean([x]) is not None]
    return {f"mean/{key}": float(np.mean(xs)), f"last/{key}": float(xs[-1])} if xs else {}


def clip_frac(row: Mapping) -> float | None:
    """A step's PPO clip fraction: its low and high clip fractions (disjoint token sets)."""
    lo, hi = row.get("actor/clip_frac_low"), row.get("actor/clip_frac_high")
    return None if lo is None or hi is None else float(lo) + float(hi)


def rpr_diagnostics(rows: Sequence[Mapping]) -> dict:
    """Diagnostics of an RPR phase (or critic warm-up) from its `metrics.jsonl` rows."""
    joint = [r for r in rows if not r.get("critic_only", False) and "actor/approx_kl" in r]
    out = {"mean/turns": finite_mean([r.get("turns") for r in rows]),
           "joint_steps": len(joint),
           **mean_last(joint, "actor/clip_frac", clip_frac),
           **mean_last(joint, "actor/approx_kl"),
           "mean/actor/grad_norm": finite_mean([r.get("actor/grad_norm") for r in joint]),
           "mean/critic/grad_norm": finite_mean([r.get("critic/grad_norm") for r in rows]),
           **mean_last(rows, "value_ev_pre_update")}
    return {k: v for k, v in out.items() if v is not None}


def sft_diagnostics(rows: Sequence[Mapping]) -> dict:
    """Diagnostics of SFT steps (RSR, base) from their `metrics.jsonl` rows."""
    g = finite_mean([r.get("grad_norm") for r in rows])
    return {} if g is None else {"mean/actor/grad_norm": g}


def episode_turns(trajectories: Sequence) -> float | None:
    """Turns per episode (mean) of `trajectories`."""
    return float(np.mean([len(t.turns) for t in trajectories])) if trajectories else None


def shard_turns(stage_dir: str, names: Sequence[str]) -> dict:
    """"mean/<name>/turns" of each `trajectories/<name>.jsonl` of the stage, and "mean/turns"
    over all of them."""
    out, every = {}, []
    for name in names:
        path = os.path.join(stage_dir, "trajectories", f"{name}.jsonl")
        trajs = read_shard(path) if os.path.exists(path) else []
        every += trajs
        if trajs:
            out[f"mean/{name}/turns"] = episode_turns(trajs)
    return {"mean/turns": episode_turns(every), **out} if every else out


def training_diagnostics(stage_dir: str, experiment: str) -> dict:
    """The diagnostics of a finished stage read from its workdir (module doc)."""
    rows = read_json_lines(os.path.join(stage_dir, "metrics.jsonl"))
    if experiment == "rpr_phase":
        return rpr_diagnostics(rows)
    return {**sft_diagnostics(rows), **shard_turns(stage_dir, EPISODE_SHARDS.get(experiment, ()))}


def family_change(before: Mapping | None, after: Mapping) -> dict:
    """{suite: {family: {"before", "after"}}}: per-family success of two ledger `eval`
    records (the input stage's, None without one, and the stage's), for each suite of
    `after` that has per-family results."""
    out = {}
    for suite, ev in after.items():
        fams = ev.get("per_family") if isinstance(ev, Mapping) else None
        if not isinstance(fams, Mapping) or not fams:
            continue
        prev = ((before or {}).get(suite) or {}).get("per_family") or {}
        out[suite] = {f: {"before": (prev.get(f) or {}).get("success"),
                          "after": (x or {}).get("success")} for f, x in fams.items()}
    return out


def spread(tasks: Sequence, n: int) -> list:
    """At most `n` tasks taken round-robin over their families (in order of appearance)."""
    by: dict[str, list] = {}
    for t in tasks:
        by.setdefault(t.family, []).append(t)
    rounds = itertools.zip_longest(*by.values())
    return [t for r in rounds for t in r if t is not None][:n]


def probe_tasks(eval_config, validation_split: bool) -> list:
    """The probe's tasks (module doc) for the evaluation config `eval_config` (typed)."""
    suite = "validation" if validation_split else "all"
    tasks = eval_config.tasks.replace(suites=(suite,), n_per_family=PROBE_PER_FAMILY)
    return spread(eval_tasks(eval_config.replace(tasks=tasks))[suite], PROBE_SIZE)


def frozen_probe(path: str, eval_config, validation_split: bool,
                 action_style: str = "compact") -> list:
    """The run's probe trajectories: read from `path`, or rendered now (module doc) and
    written there by process 0 (every process calls this together)."""
    if os.path.exists(path):
        return read_shard(path)
    h = eval_config.harness
    engine = RolloutEngine.from_config(eval_config, None, concurrency=eval_config.eval.concurrency)
    policy = demo_policy(load_model(eval_config).tokenizer, action_style, h.terminal,
                         h.action_format)
    done = engine.run(policy, probe_tasks(eval_config, validation_split), streams="probe",
                      desc="probe")
    probe = [t for t in done.trainable() if t.num_generated > 0]
    if multihost.is_writer():
        write_shard(path, probe)
    multihost.barrier("pipeline_probe_written")
    return probe


def export_movement(eval_config, input_export: str, output_export: str, probe: Sequence) -> dict:
    """`evaluation.movement.probe_movement` of the actors exported at `input_export` and
    `output_export`, loaded as the evaluation loads a stage's actor (`eval_config` typed, its
    model settings)."""
    a = load_model(eval_config.replace(init=eval_config.init.replace(
        actor_weights=input_export)), params=True)
    b = load_model(eval_config.replace(init=eval_config.init.replace(
        actor_weights=output_export)), params=True)
    return probe_movement(multihost.local_replica(a.params), multihost.local_replica(b.params),
                          a.graphdef, probe, sampler_buckets(eval_config.rollout))
