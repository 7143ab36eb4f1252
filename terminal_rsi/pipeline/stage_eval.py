"""What the pipeline measures around its stages: the run's frozen reward divisors and difficulty
strata (fitted once per run dir, before any stage), a warm-up critic's evaluation (its EV on its
input stage's evaluation episodes), a bypassed stage's evaluation (its input's), and the
training numbers the ledger keeps (`train_stats`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping

from terminal_rsi.agent import read_shard
from terminal_rsi.evaluation.evaluate import critic_explained_variance, eval_tasks, load_critic
from terminal_rsi.evaluation.strata import StrataTable, fit_strata
from terminal_rsi.models.loading import model_config
from terminal_rsi.models.sampling import Buckets
from terminal_rsi.rewards import FamilyDivisors, calibrate_family_divisors
from terminal_rsi.runtime import multihost
from terminal_rsi.runtime.atomic import atomic_write_json, read_json_lines
from terminal_rsi.tasks import get_suite
from terminal_rsi.tasks.registry import PROCEDURAL_SUITES


def frozen_divisors(path: str, suite: str, divisor_samples: int) -> FamilyDivisors:
    """Family divisors D_f = q0.90 of each family's check counts (§2.2), calibrated once per
    run dir (saved at `path`) from the tasks' declared check counts (structure, not outcomes)
    of every family of `suite` (`divisor_samples` instances per family of a procedural
    suite), and frozen for every stage (FDR, SPR, rescoring). Families without declared
    counts use the fallback (82)."""
    if os.path.exists(path):
        return FamilyDivisors.load(path)
    if suite in PROCEDURAL_SUITES:
        tasks = get_suite(suite, "all", n_per_family=divisor_samples)
    else:
        tasks = get_suite(suite, "all")
    counts: dict[str, list[int]] = {}
    for t in tasks:
        if t.expected_checks:
            counts.setdefault(t.family, []).append(int(t.expected_checks))
    table = calibrate_family_divisors(counts, source=f"{suite} declared check counts",
                                      notes="terminal_rsi.pipeline: frozen per run")
    table.save(path)
    return table


def frozen_strata(path: str, eval_config) -> StrataTable:
    """The difficulty strata of the evaluation tasks of `eval_config`, fitted once (saved at
    `path`) before any evaluation."""
    if os.path.exists(path):
        return StrataTable.load(path)
    tasks = [t for ts in eval_tasks(eval_config).values() for t in ts]
    table = fit_strata(list({t.id: t for t in tasks}.values()))
    table.save(path)
    return table


def critic_only_eval(critic_export: str, eval_config, src: str, src_eval: Mapping,
                     run_dir: str, edir: str) -> dict:
    """A warm-up critic: its actor is its input stage `src`'s, so that stage's evaluation
    episodes (`src_eval`, trajectory paths relative to `run_dir`) are reused; only the
    critic's explained variance on them is new. Written to `<edir>/metrics.json`."""
    graphdef, params = load_critic(critic_export, model_config(eval_config))
    buckets = Buckets(prefill_chunk=eval_config.rollout.prefill_chunk,
                      cache_multiple=eval_config.rollout.cache_multiple)
    out = {}
    for suite, ev in src_eval.items():
        path = os.path.join(run_dir, ev["trajectories"])
        trajs = [t for t in read_shard(path) if t.terminal_reason is not None]
        out[suite] = {"k": ev.get("k"), "num_tasks": ev.get("num_tasks"),
                      "actor_from": src, "trajectories": ev["trajectories"],
                      "explained_variance": critic_explained_variance(
                          graphdef, params, trajs, buckets)}
    if multihost.is_writer():
        os.makedirs(edir, exist_ok=True)
        atomic_write_json(os.path.join(edir, "metrics.json"), out)
    return out


def bypassed_eval(src: str, src_eval: Mapping) -> dict:
    """A bypassed stage has its input `src`'s actor and critic: the same evaluation."""
    return {k: {**v, "bypassed_from": src} for k, v in src_eval.items()}


def numbers(d: Mapping, prefix: str = "") -> dict:
    """The numeric entries of `d` as floats (bools as 0/1, non-finite as None)."""
    out = {}
    for k, v in d.items():
        if isinstance(v, bool):
            out[prefix + k] = float(v)
        elif isinstance(v, int | float):
            out[prefix + k] = float(v) if math.isfinite(float(v)) else None
    return out


def train_stats(stage_dir: str) -> dict:
    """Numbers from `summary.json` and the last `metrics.jsonl` line (prefixed final/);
    "steps" counts the training steps taken (a stage that skipped training, e.g. RSR with an
    empty Q_clean, writes one row with "skipped" and took none)."""
    stats: dict = {}
    p = os.path.join(stage_dir, "summary.json")
    if os.path.exists(p):
        with open(p) as f:
            stats.update(numbers(json.load(f)))
    rows = read_json_lines(os.path.join(stage_dir, "metrics.jsonl"))
    if rows:
        stats["steps"] = float(sum(1 for r in rows if "skipped" not in r))
        stats.update(numbers(rows[-1], "final/"))
    return stats
