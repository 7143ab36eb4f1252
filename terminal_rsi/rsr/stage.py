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
   M = `execution.m` repeats per accepted runbook, sampled at `execution.temperature` (None:
   H0's); a run is accepted iff the protected verifier passes (S = 1) and the leak screen
   passes on its public view.
5. Q_clean: the public views P(τ̃) of the accepted runs, as a multiset (repeats kept).
   With `sft.rehearsal_samples` > 0 (off in the paper's recipe), the input actor's own
   verified H0 successes (`rehearsal_set`, that many samples per training task) join it, so
   that families absent from a small Q_clean are not forgotten; with
   `sft.guided_rehearsal` (off in the paper's recipe) the accepted runs also join as they
   ran, runbook in the prompt, so that the actor keeps following runbooks.
   The actor is fine-tuned with Eq. 3 (`sft.steps` steps, or `sft.epochs` passes over
   Q_clean + rehearsal capped at `sft.steps`; minibatches drawn uniformly
   from the multiset) through the SFT step shared with `base_sft`; with `sft.kl_coef` > 0
   the loss adds kl_coef · KL(π_θ ‖ π_in) toward the input actor (a trust region). An empty
   Q_clean means no SFT step at all (`sft_steps` is 0, self-rehearsal alone never trains):
   the input actor is exported unchanged. The critic is not
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
before/after, sft_steps, sft_skipped (why no step was taken, or None) with its numeric flag
sft_skipped_empty_q_clean, critic_bit_identical).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from terminal_rsi.agent import HarnessConfig, RolloutEngine, write_shard
from terminal_rsi.models.loading import import_params, load_model
from terminal_rsi.models.sampling import Buckets
from terminal_rsi.models.transformer import critic_params_from_actor
from terminal_rsi.rsr import common as cm
from terminal_rsi.rsr.config import RSRConfig
from terminal_rsi.rsr.discovery import DiscoveryVariant, discover
from terminal_rsi.rsr.guidance import EXEC_INSTRUCTION, execution_harness, public_view
from terminal_rsi.rsr.planner import make_planner, plan_successes
from terminal_rsi.rsr.reviewer import Reviewer, leak_screen, privileged_strings
from terminal_rsi.rsr.sft import fixed_width, make_nll_fn, make_sft_step, mean_nll, train_sft
from terminal_rsi.runtime import multihost
from terminal_rsi.runtime.exports import (
    candidate_steps,
    export_candidate,
    export_weights,
    prune_candidates,
)
from terminal_rsi.tasks import pool_tasks
from terminal_rsi.training.losses import Aggregation
from terminal_rsi.training.train_state import TrainState

# the experiment's typed config: every setting, its default and what it allows
# (terminal_rsi.rsr.config); `run` receives an instance built from the ConfigDict
CONFIG = RSRConfig


class CriticChanged(RuntimeError):
    """The critic exported by an RSR stage differs from its input (Δφ must be 0)."""


@dataclasses.dataclass
class RSRResult:
    summary: dict
    q_clean: list
    actor: object
    critic_params: object


def discovery_variants(config, h0: HarnessConfig, actor_policy, tokenizer) -> list:
    """The complementary harnesses of `discovery.harnesses` around H0 (module doc, step 1)."""
    d = config.discovery
    out = []
    for name in d.harnesses:
        if name == "hints":
            out.append(DiscoveryVariant(name, dataclasses.replace(
                h0, name="hints", hints=tuple(d.hints)), actor_policy))
        elif name == "hot":
            out.append(DiscoveryVariant(name, dataclasses.replace(
                h0, name="hot", temperature=d.hot_temperature),
                actor_policy, samples=d.hot_samples))
        elif name == "long":
            f = d.long_factor
            out.append(DiscoveryVariant(name, dataclasses.replace(
                h0, name="long", max_turns=h0.max_turns * f,
                max_output_tokens=h0.max_output_tokens * f,
                max_input_tokens=h0.max_input_tokens * f), actor_policy))
        elif name == "external":
            demos = cm.demo_policy(tokenizer, config.harness.action_style,
                                   config.harness.terminal, config.harness.action_format)
            out.append(DiscoveryVariant(name, dataclasses.replace(h0, name="external"), demos,
                                        external=True))
        else:
            raise cm.StageError(f"unknown discovery harness {name!r}; use hints, hot, long "
                                "or external")
    return out


def sft_steps(sft, q_clean_size: int, rehearsal_size: int = 0) -> int:
    """SFT steps on Q_clean (`q_clean_size`) plus self-rehearsal (`rehearsal_size`): 0 when
    Q_clean is empty (rehearsal alone never trains: the stage keeps its input actor);
    otherwise `sft.steps`, or with `sft.epochs` set, ceil(epochs · (q_clean_size +
    rehearsal_size) / batch_size) capped at `sft.steps` (a handful of accepted runs is not
    fine-tuned for as long as a large Q_clean, which overfits it: NLL → 1e-5 and lower
    held-out success, docs/pipeline.md)."""
    if not q_clean_size:
        return 0
    if sft.epochs is None:
        return int(sft.steps)
    size = q_clean_size + rehearsal_size
    return min(int(sft.steps), max(1, math.ceil(sft.epochs * size / sft.batch_size)))


def fresh_execute(engine, policy, h0, tasks_runbooks, m: int, tokenizer,
                  exec_instruction: str) -> tuple[list, list]:
    """M guided executions per (task, runbook, privileged) through `engine` (streams
    "execution"); returns (fresh trajectories with meta.accepted / meta.leaks / meta.runbook,
    Q_clean = accepted public views). An execution that raised is absent."""
    launch, harnesses, info = [], [], []
    for idx, (task, rb, priv) in enumerate(tasks_runbooks):
        h = execution_harness(h0, rb, instruction=exec_instruction)
        for rep in range(m):
            launch.append(task)
            harnesses.append(h)
            info.append((idx, rep, rb, priv))
    trajs = engine.run(policy, launch, harness=harnesses, streams="execution",
                       desc="fresh execution").trajectories
    q_clean = []
    for traj in trajs:
        idx, rep, rb, priv = info[traj.meta["launch_index"]]
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


def rehearsal_set(engine, policy, tasks, samples: int) -> list:
    """The verified (S = 1) episodes of `samples` runs per task of `policy` under H0 (the
    engine's harness): the actor's own successes, replayed next to Q_clean in the fine-tune
    (`sft.rehearsal_samples`). Unguided, so each is its own public view. A discovery pass
    under H0 alone."""
    if not samples:
        return []
    found, _, _ = discover(engine, tasks,
                           [DiscoveryVariant("rehearsal", engine.harness, policy, samples)])
    for f in found:
        f.trajectory.meta["rehearsal"] = True
    return [f.trajectory for f in found]


def _per_family(trajs) -> dict[str, int]:
    fams: dict[str, int] = {}
    for t in trajs:
        fams[t.family] = fams.get(t.family, 0) + 1
    return dict(sorted(fams.items()))


FUNNEL_KEYS = ("tasks", "discovered", "runbooks", "reviewer_accepted", "fresh",
               "fresh_verified", "leaking", "no_public_view", "accepted")


def acceptance_funnel(tasks: list, found: list, rejections: list, to_run: list,
                      fresh: list) -> dict[str, dict]:
    """Where each family's runbooks are lost, step by step (`FUNNEL_KEYS`): the tasks of the
    family, verified discovery successes, runbooks planned, accepted by the reviewer (the
    rest by reason under "rejected": schema = the plan did not parse, artifact /
    compatibility / model = the reviewer's codes), fresh executions, verified ones, those
    the leak screen refused, those without a public view, and accepted into Q_clean (with
    the acceptance rate accepted / fresh)."""
    family = {t.id: t.family for t in tasks}
    out: dict[str, dict] = {}

    def row(fam: str) -> dict:
        return out.setdefault(fam, {**dict.fromkeys(FUNNEL_KEYS, 0), "rejected": {}})

    for t in tasks:
        row(t.family)["tasks"] += 1
    for f in found:
        row(f.task.family)["discovered"] += 1
    for rej in rejections:
        r = row(family.get(rej["task"], "?"))
        r["runbooks"] += 1
        for reason in rej["reasons"]:
            r["rejected"][reason] = r["rejected"].get(reason, 0) + 1
    for task, _, _ in to_run:
        r = row(task.family)
        r["runbooks"] += 1
        r["reviewer_accepted"] += 1
    for t in fresh:
        r = row(t.family)
        r["fresh"] += 1
        r["fresh_verified"] += int(t.S == 1)
        r["leaking"] += int(t.S == 1 and bool(t.meta.get("leaks")))
        r["no_public_view"] += int(t.S == 1 and not t.turns)
        r["accepted"] += int(bool(t.meta.get("accepted")))
    for r in out.values():
        r["acceptance_rate"] = r["accepted"] / r["fresh"] if r["fresh"] else None
    return dict(sorted(out.items()))


def funnel_line(funnel: dict[str, dict]) -> str:
    """One line of the funnel: per family, accepted / fresh and what lost the most."""
    parts = []
    for fam, r in funnel.items():
        losses = {"not planned": r["discovered"] and not r["runbooks"],
                  **{f"rejected {k}": v for k, v in r["rejected"].items()},
                  "unverified": r["fresh"] - r["fresh_verified"], "leaking": r["leaking"]}
        worst = max(losses.items(), key=lambda kv: kv[1])
        parts.append(f"{fam} {r['accepted']}/{r['fresh']}"
                     + (f" (most lost: {worst[0]})" if worst[1] else ""))
    return "; ".join(parts)


def _tree_equal(a, b) -> bool:
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    if jax.tree.structure(a) != jax.tree.structure(b) or len(la) != len(lb):
        return False
    for x, y in zip(la, lb, strict=True):
        x, y = np.asarray(x), np.asarray(y)
        if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
            return False
    return True


@dataclasses.dataclass
class StageSetup:
    """What stays fixed over one RSR stage: its config, rollout engine (model, target harness
    H0, sandboxes, the verdict as reward, the compiled sampler), training tasks, output dirs,
    and the input critic (a host copy, passed through unchanged) with a reference copy to
    check it against."""

    config: Any
    engine: RolloutEngine
    tasks: list
    export: str
    trajdir: str
    critic_in: Any
    critic_ref: Any

    @property
    def tokenizer(self):
        return self.engine.model.tokenizer

    @property
    def mcfg(self):
        return self.engine.model.config

    @property
    def h0(self) -> HarnessConfig:
        return self.engine.harness

    def policy(self, actor: TrainState, seed: int):
        """A sampler policy of `actor`'s weights, sampling from streams of `seed`."""
        return self.engine.policy(actor.params, seed=seed, graphdef=actor.graphdef)

    def write(self, name: str, trajectories: list) -> None:
        """`trajectories/<name>.jsonl` (process 0 writes; every process holds them all)."""
        if multihost.is_writer():
            write_shard(os.path.join(self.trajdir, f"{name}.jsonl"), trajectories)

    def candidate_exporter(self, n_steps: int) -> Callable[[int, TrainState], None]:
        """`train_sft`'s on_state hook: the actor (with the unchanged input critic) of each
        step of `candidate_steps(0, n_steps, candidates.count)` as a candidate for model
        selection (`<workdir>/candidates/step_<k>`)."""
        steps = set(candidate_steps(0, n_steps, self.config.candidates.count))
        workdir = os.path.dirname(self.export)

        def export(k: int, actor: TrainState) -> None:
            if k in steps:
                export_candidate(workdir, k, {"actor": actor.params, "critic": self.critic_in})
        return export


@dataclasses.dataclass
class Discovered:
    """Step 1: the verified successes (`found`) of all discovery `episodes`, at most
    `discovery.max_per_task` of them per task `kept`."""

    found: list
    episodes: list
    stats: dict
    kept: list


@dataclasses.dataclass
class Reviewed:
    """Steps 2-3: (task, runbook, privileged strings) of the accepted runbooks, how many were
    planned, and the rejections by reason code."""

    to_run: list
    n_plans: int
    rejected: dict
    rejections: list


@dataclasses.dataclass
class FineTuned:
    """Step 5: the fine-tuned actor, one metrics row per SFT step, and the mean NLL of the
    SFT set before and after (None when nothing was trained, then `skipped` says why)."""

    actor: TrainState
    metrics: list
    steps: int
    nll_before: float | None = None
    nll_after: float | None = None
    skipped: str | None = None


def setup_stage(config, workdir: str) -> tuple[StageSetup, TrainState]:
    """The stage's setup and its input actor. The critic passes through unchanged (Δφ = 0):
    init.critic_weights, or `critic_params_from_actor` of the input actor."""
    export, trajdir = cm.stage_dirs(workdir)
    model = load_model(config)  # byte preset, or model.gguf: its tokenizer, template, shape
    actor = cm.create_actor(config, model.config, config.actor_opt, config.seed)
    critic_in = multihost.host_copy(
        import_params(config.init.critic_weights, "critic", model.config)
        if config.init.critic_weights else critic_params_from_actor(actor.params))
    setup = StageSetup(config, RolloutEngine.from_config(config, model, scorer=cm.RSR_SCORER),
                       pool_tasks(config.tasks, config.tasks.train_split,
                                  config.tasks.n_per_family, cm.StageError),
                       export, trajdir, critic_in,
                       jax.tree.map(lambda x: np.array(x, copy=True), critic_in))
    return setup, actor


def keep_per_task(found: list, max_per_task: int) -> list:
    """The first `max_per_task` successes of each task, in discovery order."""
    per_task: dict[str, int] = {}
    kept = []
    for f in found:
        if per_task.get(f.task.id, 0) < max_per_task:
            per_task[f.task.id] = per_task.get(f.task.id, 0) + 1
            kept.append(f)
    return kept


def discover_successes(st: StageSetup, actor_pol) -> Discovered:
    """Step 1: the actor under the complementary harnesses (trajectories/discovery.jsonl)."""
    found, episodes, stats = discover(st.engine, st.tasks, discovery_variants(
        st.config, st.h0, actor_pol, st.tokenizer))
    st.write("discovery", episodes)
    kept = keep_per_task(found, st.config.discovery.max_per_task)
    print(f"[rsr] discovery: {len(found)} verified of {len(episodes)} episodes; "
          f"{len({f.task.id for f in kept})} tasks", flush=True)
    return Discovered(found, episodes, stats, kept)


def plan_and_review(st: StageSetup, kept: list, actor_pol) -> Reviewed:
    """Steps 2-3: runbooks planned from each kept success (`plan_successes`: split over the
    processes and gathered, so all of them execute and train on the same ones), then the
    reviewer's gate."""
    p = st.config.planner
    planner = make_planner(p.kind, policy=actor_pol, k=p.k, max_tokens=p.max_tokens,
                           temperature=p.temperature)
    reviewer = Reviewer(st.h0)
    out = Reviewed([], 0, {r: 0 for r in ("schema", "artifact", "compatibility", "model")}, [])
    for f, plans in zip(kept, plan_successes(planner, kept, st.tokenizer), strict=True):
        priv = privileged_strings(f.task, f.trajectory.report)
        for plan in plans:
            out.n_plans += 1
            if plan.runbook is None:
                out.rejected["schema"] += 1
                out.rejections.append({"task": f.task.id, "reasons": ["schema"],
                                       "details": [plan.error]})
                continue
            rev = reviewer.review(f.task.instruction, plan.runbook, priv)
            if not rev.accepted:
                for r in rev.reasons:
                    out.rejected[r] += 1
                out.rejections.append({"task": f.task.id, "reasons": rev.reasons,
                                       "details": rev.details})
                continue
            out.to_run.append((f.task, plan.runbook, priv))
    print(f"[rsr] {out.n_plans} runbooks, {len(out.to_run)} accepted by the reviewer, "
          f"rejected {out.rejected}", flush=True)
    return out


def execute_runbooks(st: StageSetup, actor_pol, to_run: list) -> tuple[list, list]:
    """Step 4: fresh execution with private guidance (trajectories/fresh.jsonl) and its
    accepted public views Q_clean (trajectories/q_clean.jsonl)."""
    ex = st.config.execution
    h0 = st.h0 if ex.temperature is None else dataclasses.replace(
        st.h0, temperature=ex.temperature)
    fresh, q_clean = fresh_execute(st.engine, actor_pol, h0, to_run, ex.m, st.tokenizer,
                                   ex.instruction or EXEC_INSTRUCTION)
    st.write("fresh", fresh)
    st.write("q_clean", q_clean)
    print(f"[rsr] fresh execution: {len(q_clean)}/{len(fresh)} accepted "
          f"({leaking(fresh)} verified but leaking)", flush=True)
    if fresh:
        funnel = acceptance_funnel(st.tasks, [], [], [], fresh)
        print(f"[rsr] accepted per family: {funnel_line(funnel)}", flush=True)
    return fresh, q_clean


def leaking(fresh: list) -> int:
    """Fresh executions that passed the verifier but failed the leak screen."""
    return sum(1 for t in fresh if t.S == 1 and t.meta["leaks"])


def rehearse(st: StageSetup, actor_pol) -> list:
    """Self-rehearsal (`sft.rehearsal_samples`, trajectories/rehearsal.jsonl): the input
    actor's own verified H0 successes, so that families absent from a small Q_clean are not
    forgotten by fine-tuning on it alone."""
    samples = st.config.sft.rehearsal_samples
    rehearsal = rehearsal_set(st.engine, actor_pol, st.tasks, samples)
    st.write("rehearsal", rehearsal)
    if samples:
        print(f"[rsr] self-rehearsal: {len(rehearsal)} verified H0 successes of "
              f"{len(st.tasks) * samples} samples", flush=True)
    return rehearsal


def guided_rehearsal(st: StageSetup, fresh: list) -> list:
    """The accepted fresh executions as they ran, runbook in the prompt
    (`sft.guided_rehearsal`; none when off): trained next to their public views so that
    fine-tuning on public views alone does not unlearn following a runbook (measured: the
    RSR-1 actors of two seeds then garbled every runbook RSR-2 gave them, 0 of 120 accepted,
    docs/pipeline.md)."""
    if not st.config.sft.guided_rehearsal:
        return []
    return [t for t in fresh if t.meta.get("accepted")]


def rewritten_success(st: StageSetup, actor: TrainState, rewritten: list,
                      seed: int) -> float | None:
    """Success of `actor` under H0 at `eval.temperature` on the rewritten tasks (None with
    `eval.rewritten` off or no rewritten task)."""
    if not (st.config.eval.rewritten and rewritten):
        return None
    eval_h = dataclasses.replace(st.h0, temperature=st.config.eval.temperature)
    trajs = st.engine.run(st.policy(actor, seed), rewritten, harness=eval_h,
                          streams="rewritten", desc="rewritten tasks").trajectories
    return cm.success(trajs, len(rewritten))


def finetune(st: StageSetup, actor: TrainState, q_clean: list, rehearsal: list,
             rng: np.random.Generator) -> FineTuned:
    """Step 5: Eq. 3 on Q_clean + rehearsal for `sft_steps` steps (none with an empty
    Q_clean: `actor` comes back unchanged), with `sft.kl_coef` > 0 plus the trust region
    toward `actor`'s params; the critic is not touched."""
    s = st.config.sft
    n_steps = sft_steps(s, len(q_clean), len(rehearsal))
    if not n_steps:
        why = "empty Q_clean" if not q_clean else "sft.steps=0"
        print(f"[rsr] no SFT step ({why}): the input actor is exported unchanged", flush=True)
        return FineTuned(actor, [{"step": 0, "skipped": why}], 0, skipped=why)
    sft_set = q_clean + rehearsal
    agg = Aggregation(s.aggregation)
    buckets = Buckets(cache_multiple=st.config.rollout.cache_multiple,
                      batch_multiple=s.num_microbatches, power_of_two=False)
    width = fixed_width(sft_set, st.config.rollout.cache_multiple)
    nll_fn = make_nll_fn(agg)

    def nll(state):
        return mean_nll(state, sft_set, nll_fn, batch_size=s.batch_size, buckets=buckets,
                        width=width)

    nll_before = nll(actor)
    # the lr schedule spans this stage's SFT steps (known only now: they depend on Q_clean)
    actor = cm.with_optimizer(actor, cm.optimizer_config(st.config.actor_opt, n_steps))
    step_fn = make_sft_step(agg, s.num_microbatches, state=actor, kl_coef=s.kl_coef)
    if s.kl_coef > 0:  # π_in: a copy, the step donates the state it trains
        step_fn = functools.partial(step_fn, ref_params=jax.tree.map(jnp.copy, actor.params))
    actor, metrics = train_sft(actor, sft_set, step_fn, num_steps=n_steps,
                               batch_size=s.batch_size, rng=rng, buckets=buckets, width=width,
                               on_state=st.candidate_exporter(n_steps))
    return FineTuned(actor, metrics, n_steps, nll_before, nll(actor))


def export_weights_checked(st: StageSetup, actor: TrainState) -> bool:
    """Export the fine-tuned actor and the input critic; the critic, and the critic read
    back, must be bit-identical to the input (Δφ = 0), else `CriticChanged`."""
    export_weights(st.export, "actor", actor.params, force=True)
    export_weights(st.export, "critic", st.critic_in, force=True)
    critic_out = multihost.host_copy(import_params(st.export, "critic", st.mcfg))
    if not (_tree_equal(st.critic_ref, st.critic_in)
            and _tree_equal(st.critic_ref, critic_out)):
        raise CriticChanged("the exported critic differs from the stage's input critic; an "
                            "RSR stage must leave the critic unchanged (Δφ = 0)")
    return True


def rsr_summary(st: StageSetup, disc: Discovered, rev: Reviewed, fresh: list, q_clean: list,
                rehearsal: list, ft: FineTuned, success: tuple, identical: bool) -> dict:
    """summary.json of the stage (module doc); `success`: rewritten-task success under H0
    (before, after) fine-tuning."""
    return {
        "tasks": len(st.tasks),
        "discovery": disc.stats,
        "discovery_verified": len(disc.found),
        "discovery_kept": len(disc.kept),
        "runbooks": rev.n_plans,
        "runbooks_accepted": len(rev.to_run),
        "runbooks_rejected": rev.rejected,
        "rejections": rev.rejections[:50],
        "fresh_executions": len(fresh),
        "fresh_verified": sum(t.S for t in fresh),
        "fresh_leaks": leaking(fresh),
        "fresh_acceptance_rate": len(q_clean) / len(fresh) if fresh else None,
        "acceptance_per_family": acceptance_funnel(st.tasks, disc.found, rev.rejections,
                                                   rev.to_run, fresh),
        "q_clean_size": len(q_clean),
        "q_clean_per_family": _per_family(q_clean),
        "q_clean_unique_tasks": len({t.task_id for t in q_clean}),
        "rehearsal_size": len(rehearsal),
        "rehearsal_per_family": _per_family(rehearsal),
        "nll_before": ft.nll_before,
        "nll_after": ft.nll_after,
        "rewritten_success_before": success[0],
        "rewritten_success_after": success[1],
        "sft_steps": ft.steps,
        "sft_skipped": ft.skipped,
        "sft_skipped_empty_q_clean": int(ft.skipped == "empty Q_clean"),
        "critic_bit_identical": identical,
        "planner": st.config.planner.kind,
    }


def run_rsr(config: RSRConfig, workdir: str) -> RSRResult:
    """One RSR stage (module doc): discover, plan and review, execute fresh, fine-tune the
    actor on Q_clean, export (critic unchanged), summarize."""
    t_start = time.monotonic()
    prune_candidates(workdir)  # an earlier attempt's candidates are not this run's
    st, actor = setup_stage(config, workdir)
    actor_pol = st.policy(actor, config.seed)
    disc = discover_successes(st, actor_pol)
    # every episode and plan samples from its own stream of the seed: the stage replays
    rev = plan_and_review(st, disc.kept, actor_pol)
    fresh, q_clean = execute_runbooks(st, actor_pol, rev.to_run)
    rehearsal = rehearse(st, actor_pol)
    # the rewritten tasks (those with a clean sample): success under H0 before and after
    rewritten_ids = {t.task_id for t in q_clean}
    rewritten = [t for t in st.tasks if t.id in rewritten_ids]
    before = rewritten_success(st, actor, rewritten, config.seed)
    guided = guided_rehearsal(st, fresh)
    ft = finetune(st, actor, q_clean, rehearsal + guided, np.random.default_rng(config.seed))
    cm.write_jsonl(os.path.join(workdir, "metrics.jsonl"), ft.metrics)
    after = rewritten_success(st, ft.actor, rewritten, config.seed)  # the same streams
    identical = export_weights_checked(st, ft.actor)
    summary = {**rsr_summary(st, disc, rev, fresh, q_clean, rehearsal, ft, (before, after),
                             identical), "guided_rehearsal_size": len(guided),
               "wall_s": time.monotonic() - t_start}
    cm.write_json(os.path.join(workdir, "summary.json"), summary)
    return RSRResult(summary, q_clean, ft.actor, st.critic_in)


def run(config: RSRConfig, workdir: str) -> dict:
    res = run_rsr(config, workdir)
    s = res.summary
    print(f"[rsr] done: Q_clean {s['q_clean_size']} ({s['q_clean_per_family']}), NLL "
          f"{s['nll_before']} -> {s['nll_after']}, rewritten-task success "
          f"{s['rewritten_success_before']} -> {s['rewritten_success_after']}, critic "
          f"bit-identical {s['critic_bit_identical']}", file=sys.stderr)
    return s
