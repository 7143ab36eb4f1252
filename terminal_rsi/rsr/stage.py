"""The `rsr` experiment: one Recursive Self-Rewrite stage (paper §2.1 Eq. 2–3, App. D).

    python experiments/run.py --config=configs/rsr1.py --workdir=/tmp/rsr1 \
        --config.init.actor_weights=/tmp/base/export --config.init.critic_weights=/tmp/base/export

1. Discovery (`discovery.discover`): the retained actor θ_k^+ under the complementary
   harnesses of `discovery.harnesses` — `hints` (H0 + `discovery.hints`), `hot` (sampling
   temperature `discovery.hot_temperature`, `discovery.hot_samples` samples per task),
   `long` (`discovery.long_factor` × the turn and output budgets) — and, with `external`,
   an external policy: for the built-in suite of the tiny default this is the
   reference-solution policy (`common.demo_policy`), i.e. the "successes found elsewhere"
   are the tasks' reference solutions replayed through the harness. Only S = 1 episodes
   are kept (at most `discovery.max_per_task` per task).
2. Planning (`planner`): `planner.kind = digest` (deterministic: 1 runbook per success) or
   `policy` (K = `planner.k` runbooks sampled from the actor with the planning
   instruction).
3. Review (`reviewer.Reviewer`): schema, artifact, compatibility; each rejection's reason
   codes are counted.
4. Fresh execution: the current actor under H0 with private guidance I_exec ⊕ x_pub ⊕ b,
   M = `execution.m` repeats per accepted runbook; a run is accepted iff the protected
   verifier passes (S = 1) and the leak screen passes on its public view.
5. Q_clean: the public views P(τ̃) of the accepted runs, as a multiset (repeats kept).
   With `sft.rehearsal_samples` > 0 (off in the paper's recipe), the input actor's own
   verified H0 successes (`rehearsal_set`, that many samples per training task) join it, so
   that families absent from a small Q_clean are not forgotten.
   The actor is fine-tuned with Eq. 3 (`sft.steps` steps, or `sft.epochs` passes over
   Q_clean capped at `sft.steps`; minibatches drawn uniformly
   from the multiset) through the SFT step shared with `base_sft`. The critic is not
   trained: its input weights (`init.critic_weights`, or `critic_params_from_actor` of the
   input actor when None) are re-exported and checked bit-identical (Δφ = 0), else
   `CriticChanged` is raised.

Writes (C2): export/actor, export/critic, metrics.jsonl (one line per SFT step),
trajectories/discovery.jsonl (all discovery episodes; meta.discovery_harness, S),
trajectories/fresh.jsonl (fresh executions with guidance; meta: runbook text, accepted,
leak reasons), trajectories/q_clean.jsonl (the accepted public views),
trajectories/rehearsal.jsonl (the self-rehearsal episodes), summary.json
(discovery success per harness, runbooks accepted / rejected by reason, fresh acceptance
rate, Q_clean size per family, NLL before/after, success on the rewritten tasks under H0
before/after, critic_bit_identical).
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time

import jax
import ml_collections
import numpy as np

from terminal_rsi.configuration import BASE_SCHEMA, EPISODE_SCHEMA, Field
from terminal_rsi.rsr import common as cm

SCHEMA = {
    **BASE_SCHEMA, **EPISODE_SCHEMA, **cm.MODEL_SCHEMA, **cm.INIT_SCHEMA,
    "tasks.train_split": cm.TASK_SCHEMA["tasks.train_split"], **cm.HARNESS_SCHEMA,
    **cm.ROLLOUT_SCHEMA, **cm.OPT_SCHEMA, **cm.SFT_SCHEMA,
    "discovery.harnesses": Field(tuple, "complementary harnesses: hints, hot, long, external",
                                 item_type=str),
    "discovery.hints": Field(tuple, "hints of the `hints` harness", item_type=str),
    "discovery.hot_temperature": Field(float, "temperature of the `hot` harness", lo=0.0),
    "discovery.hot_samples": Field(int, "samples per task of the `hot` harness", lo=1),
    "discovery.long_factor": Field(int, "budget multiplier of the `long` harness", lo=1),
    "discovery.max_per_task": Field(int, "verified successes kept per task", lo=1),
    "planner.kind": Field(str, "digest | policy", choices=("digest", "policy")),
    "planner.k": Field(int, "K: runbooks sampled per success (policy planner)", lo=1),
    "planner.max_tokens": Field(int, "max tokens of a sampled runbook", lo=1),
    "planner.temperature": Field(float, "planner sampling temperature", lo=0.0),
    "execution.m": Field(int, "M: fresh executions per accepted runbook", lo=1),
    "sft.epochs": Field(float, "size the SFT by Q_clean: ceil(epochs · |Q_clean| / batch_size) "
                        "steps, at most sft.steps (None: always sft.steps)", lo=1e-9,
                        optional=True),
    "sft.rehearsal_samples": Field(int, "self-rehearsal: samples per training task of the "
                                   "input actor under H0; its verified successes join Q_clean "
                                   "in the fine-tune (0: off, the paper)", lo=0),
    "execution.instruction": Field(str, "I_exec (None: guidance.EXEC_INSTRUCTION)",
                                   optional=True),
    "eval.rewritten": Field(bool, "measure success on the rewritten tasks under H0 "
                            "before and after fine-tuning"),
    "eval.temperature": Field(float, "temperature of that measurement (0: greedy)", lo=0.0),
}


class CriticChanged(RuntimeError):
    """The critic exported by an RSR stage differs from its input (Δφ must be 0)."""


@dataclasses.dataclass
class RSRResult:
    summary: dict
    q_clean: list
    actor: object
    critic_params: object


def discovery_variants(config, actor_policy, tokenizer) -> list:
    from terminal_rsi.agent import SamplingSettings
    from terminal_rsi.rsr.discovery import DiscoveryVariant

    d = config.discovery
    h0 = cm.harness_from_config(config)
    out = []
    for name in d.harnesses:
        if name == "hints":
            out.append(DiscoveryVariant(name, dataclasses.replace(
                h0, name="hints", hints=tuple(d.hints)), actor_policy))
        elif name == "hot":
            out.append(DiscoveryVariant(name, dataclasses.replace(
                h0, name="hot", sampling=SamplingSettings(temperature=d.hot_temperature)),
                actor_policy, samples=d.hot_samples))
        elif name == "long":
            f = d.long_factor
            out.append(DiscoveryVariant(name, dataclasses.replace(
                h0, name="long", max_turns=h0.max_turns * f,
                max_output_tokens=h0.max_output_tokens * f,
                max_input_tokens=h0.max_input_tokens * f), actor_policy))
        elif name == "external":
            out.append(DiscoveryVariant(name, dataclasses.replace(h0, name="external"),
                                        cm.demo_policy(tokenizer, config.harness.action_style),
                                        external=True))
        else:
            raise cm.StageError(f"unknown discovery harness {name!r}; use hints, hot, long "
                                "or external")
    return out


def sft_steps(sft, q_clean_size: int) -> int:
    """SFT steps on a Q_clean of `q_clean_size`: `sft.steps`, or with `sft.epochs` set,
    ceil(epochs · size / batch_size) capped at `sft.steps` (a handful of accepted runs is not
    fine-tuned for as long as a large Q_clean, which overfits it: NLL → 1e-5 and lower
    held-out success, docs/pipeline.md)."""
    epochs = sft.get("epochs")
    if epochs is None or not q_clean_size:
        return int(sft.steps)
    return min(int(sft.steps), max(1, math.ceil(epochs * q_clean_size / sft.batch_size)))


def fresh_execute(policy, h0, tasks_runbooks, m: int, tokenizer, concurrency: int,
                  exec_instruction: str, sandbox=None) -> tuple[list, list]:
    """M guided executions per (task, runbook, privileged); returns (fresh trajectories with
    meta.accepted / meta.leaks / meta.runbook, Q_clean = accepted public views)."""
    from terminal_rsi.rsr.guidance import execution_harness, public_view
    from terminal_rsi.rsr.reviewer import leak_screen

    launch, harnesses, info = [], [], []
    for idx, (task, rb, priv) in enumerate(tasks_runbooks):
        h = execution_harness(h0, rb, instruction=exec_instruction)
        for rep in range(m):
            launch.append(task)
            harnesses.append(h)
            info.append((idx, rep, rb, priv))
    trajs = cm.collect(policy, harnesses, launch, concurrency, sandbox)
    q_clean = []
    for traj, (idx, rep, rb, priv) in zip(trajs, info, strict=True):
        leaks: list[str] = []
        pub = None
        if traj.turns:
            pub = public_view(traj)
            leaks = leak_screen(pub, rb, tokenizer, priv, exec_instruction)
        accepted = traj.S == 1 and not leaks and pub is not None
        traj.meta.update({"runbook": rb.to_text(), "runbook_index": idx, "repeat": rep,
                          "accepted": accepted, "leaks": leaks})
        if accepted:
            pub.meta.update({"runbook_index": idx, "repeat": rep})
            q_clean.append(pub)
    return trajs, q_clean


def rehearsal_set(policy, h0, tasks, samples: int, concurrency: int, sandbox=None) -> list:
    """The verified (S = 1) episodes of `samples` runs per task of `policy` under H0: the
    actor's own successes, replayed next to Q_clean in the fine-tune (`sft.rehearsal_samples`).
    Unguided, so each is its own public view. A discovery pass under H0 alone."""
    from terminal_rsi.rsr.discovery import DiscoveryVariant, discover

    if not samples:
        return []
    found, _, _ = discover(tasks, [DiscoveryVariant("rehearsal", h0, policy, samples)],
                           concurrency=concurrency, sandbox=sandbox)
    for f in found:
        f.trajectory.meta["rehearsal"] = True
    return [f.trajectory for f in found]


def _per_family(trajs) -> dict[str, int]:
    fams: dict[str, int] = {}
    for t in trajs:
        fams[t.family] = fams.get(t.family, 0) + 1
    return dict(sorted(fams.items()))


def _tree_equal(a, b) -> bool:
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    if jax.tree.structure(a) != jax.tree.structure(b) or len(la) != len(lb):
        return False
    for x, y in zip(la, lb, strict=True):
        x, y = np.asarray(x), np.asarray(y)
        if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
            return False
    return True


def run_rsr(config: ml_collections.ConfigDict, workdir: str) -> RSRResult:
    from terminal_rsi.agent import SamplingSettings, write_shard
    from terminal_rsi.checkpoint import export_weights
    from terminal_rsi.losses import Aggregation
    from terminal_rsi.models.loading import import_params, load_model
    from terminal_rsi.models.transformer import critic_params_from_actor
    from terminal_rsi.rpr.phase import config_tasks
    from terminal_rsi.rsr.discovery import discover
    from terminal_rsi.rsr.guidance import EXEC_INSTRUCTION
    from terminal_rsi.rsr.planner import make_planner
    from terminal_rsi.rsr.reviewer import Reviewer, privileged_strings
    from terminal_rsi.rsr.sft import (
        fixed_width,
        make_nll_fn,
        make_sft_step,
        mean_nll,
        train_sft,
    )
    from terminal_rsi.sampling import Buckets

    t_start = time.monotonic()
    export, trajdir = cm.stage_dirs(workdir)
    model = load_model(config)  # byte preset, or model.gguf: its tokenizer, template, shape
    tok, mcfg = model.tokenizer, model.config
    rng = np.random.default_rng(config.seed)
    cache: dict = {}
    actor = cm.create_actor(config, mcfg, config.actor_opt, config.seed)
    # the critic passes through unchanged (Δφ = 0): a host copy of the input weights
    critic_in = (import_params(config.init.critic_weights, "critic", mcfg)
                 if config.init.critic_weights else critic_params_from_actor(actor.params))
    critic_in = jax.device_get(critic_in)
    critic_ref = jax.tree.map(lambda x: np.array(x, copy=True), critic_in)
    h0 = cm.harness_from_config(config)
    tasks = config_tasks(config, config.tasks.train_split, config.tasks.n_per_family,
                         cm.StageError)
    c = config.rollout.concurrency
    sandbox = cm.task_sandbox(config)

    # 1. discovery
    actor_pol = cm.make_sampler_policy(actor, mcfg, tok, config, config.seed, cache)
    found, episodes, disc_stats = discover(tasks, discovery_variants(config, actor_pol, tok),
                                           concurrency=c, sandbox=sandbox)
    write_shard(os.path.join(trajdir, "discovery.jsonl"), episodes)
    per_task: dict[str, int] = {}
    kept = []
    for f in found:
        if per_task.get(f.task.id, 0) < config.discovery.max_per_task:
            per_task[f.task.id] = per_task.get(f.task.id, 0) + 1
            kept.append(f)
    print(f"[rsr] discovery: {len(found)} verified of {len(episodes)} episodes; "
          f"{len(per_task)} tasks", flush=True)

    # 2-3. plan and review
    p = config.planner
    planner = make_planner(p.kind, policy=actor_pol, k=p.k, max_tokens=p.max_tokens,
                           temperature=p.temperature)
    reviewer = Reviewer(h0)
    rejected = {r: 0 for r in ("schema", "artifact", "compatibility", "model")}
    rejection_details: list[dict] = []
    to_run = []
    n_plans = 0
    for f in kept:
        priv = privileged_strings(f.task, f.trajectory.report)
        for plan in planner.plan(f.task, f.trajectory, tok):
            n_plans += 1
            if plan.runbook is None:
                rejected["schema"] += 1
                rejection_details.append({"task": f.task.id, "reasons": ["schema"],
                                          "details": [plan.error]})
                continue
            rev = reviewer.review(f.task.instruction, plan.runbook, priv)
            if not rev.accepted:
                for r in rev.reasons:
                    rejected[r] += 1
                rejection_details.append({"task": f.task.id, "reasons": rev.reasons,
                                          "details": rev.details})
                continue
            to_run.append((f.task, plan.runbook, priv))
    print(f"[rsr] {n_plans} runbooks, {len(to_run)} accepted by the reviewer, rejected "
          f"{rejected}", flush=True)

    # 4. fresh execution with private guidance
    exec_instruction = config.execution.instruction or EXEC_INSTRUCTION
    fresh, q_clean = fresh_execute(actor_pol, h0, to_run, config.execution.m, tok, c,
                                   exec_instruction, sandbox)
    write_shard(os.path.join(trajdir, "fresh.jsonl"), fresh)
    write_shard(os.path.join(trajdir, "q_clean.jsonl"), q_clean)
    n_leak = sum(1 for t in fresh if t.S == 1 and t.meta["leaks"])
    print(f"[rsr] fresh execution: {len(q_clean)}/{len(fresh)} accepted "
          f"({n_leak} verified but leaking)", flush=True)

    # self-rehearsal: the input actor's own verified H0 successes, so that families absent
    # from a small Q_clean are not forgotten by fine-tuning on it alone
    rehearsal = rehearsal_set(actor_pol, h0, tasks, config.sft.rehearsal_samples, c,
                              sandbox)
    write_shard(os.path.join(trajdir, "rehearsal.jsonl"), rehearsal)
    sft_set = q_clean + rehearsal
    if config.sft.rehearsal_samples:
        print(f"[rsr] self-rehearsal: {len(rehearsal)} verified H0 successes of "
              f"{len(tasks) * config.sft.rehearsal_samples} samples", flush=True)

    # rewritten tasks (those with a clean sample): success under H0 before fine-tuning
    rewritten_ids = sorted({t.task_id for t in q_clean})
    rewritten = [t for t in tasks if t.id in rewritten_ids]
    eval_h = dataclasses.replace(h0, sampling=SamplingSettings(
        temperature=config.eval.temperature))

    def success_on_rewritten(seed):
        if not (config.eval.rewritten and rewritten):
            return None
        pol = cm.make_sampler_policy(actor, mcfg, tok, config, seed, cache)
        return float(np.mean([t.S for t in cm.collect(pol, eval_h, rewritten, c,
                                                      sandbox)]))

    before = success_on_rewritten(config.seed + 11)

    # 5. fine-tune on Q_clean (Eq. 3), critic untouched
    s = config.sft
    buckets = Buckets(cache_multiple=config.rollout.cache_multiple,
                      batch_multiple=s.num_microbatches, power_of_two=False)
    agg = Aggregation(s.aggregation)
    metrics: list[dict] = []
    nll_before = nll_after = None
    n_steps = sft_steps(s, len(sft_set))
    if sft_set and n_steps:
        width = fixed_width(sft_set, config.rollout.cache_multiple)
        nll_fn = make_nll_fn(agg)
        nll_before = mean_nll(actor, sft_set, nll_fn, batch_size=s.batch_size,
                              buckets=buckets, width=width)
        # the lr schedule spans this stage's SFT steps (known only now: they depend on Q_clean)
        actor = cm.with_optimizer(actor, cm.optimizer_config(config.actor_opt, n_steps))
        step_fn = make_sft_step(agg, s.num_microbatches, state=actor)
        actor, metrics = train_sft(actor, sft_set, step_fn, num_steps=n_steps,
                                   batch_size=s.batch_size, rng=rng, buckets=buckets,
                                   width=width)
        nll_after = mean_nll(actor, sft_set, nll_fn, batch_size=s.batch_size,
                             buckets=buckets, width=width)
    else:
        metrics = [{"step": 0, "skipped": "empty Q_clean" if not sft_set else "sft.steps=0"}]
    cm.write_jsonl(os.path.join(workdir, "metrics.jsonl"), metrics)
    after = success_on_rewritten(config.seed + 12)

    export_weights(export, "actor", actor.params, force=True)
    export_weights(export, "critic", critic_in, force=True)
    critic_out = jax.device_get(import_params(export, "critic", mcfg))
    identical = _tree_equal(critic_ref, critic_in) and _tree_equal(critic_ref, critic_out)
    if not identical:
        raise CriticChanged("the exported critic differs from the stage's input critic; an "
                            "RSR stage must leave the critic unchanged (Δφ = 0)")

    fams, rfams = _per_family(q_clean), _per_family(rehearsal)
    summary = {
        "tasks": len(tasks),
        "discovery": disc_stats,
        "discovery_verified": len(found),
        "discovery_kept": len(kept),
        "runbooks": n_plans,
        "runbooks_accepted": len(to_run),
        "runbooks_rejected": rejected,
        "rejections": rejection_details[:50],
        "fresh_executions": len(fresh),
        "fresh_verified": sum(t.S for t in fresh),
        "fresh_leaks": n_leak,
        "fresh_acceptance_rate": len(q_clean) / len(fresh) if fresh else None,
        "q_clean_size": len(q_clean),
        "q_clean_per_family": fams,
        "q_clean_unique_tasks": len(rewritten_ids),
        "rehearsal_size": len(rehearsal),
        "rehearsal_per_family": rfams,
        "nll_before": nll_before,
        "nll_after": nll_after,
        "rewritten_success_before": before,
        "rewritten_success_after": after,
        "sft_steps": n_steps if sft_set else 0,
        "critic_bit_identical": identical,
        "planner": p.kind,
        "wall_s": time.monotonic() - t_start,
    }
    cm.write_json(os.path.join(workdir, "summary.json"), summary)
    return RSRResult(summary, q_clean, actor, critic_in)


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
    res = run_rsr(config, workdir)
    s = res.summary
    print(f"[rsr] done: Q_clean {s['q_clean_size']} ({s['q_clean_per_family']}), NLL "
          f"{s['nll_before']} -> {s['nll_after']}, rewritten-task success "
          f"{s['rewritten_success_before']} -> {s['rewritten_success_after']}, critic "
          f"bit-identical {s['critic_bit_identical']}", file=sys.stderr)
    return s
