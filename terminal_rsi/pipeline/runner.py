"""Run the stage graph: resolve stage configs, reuse finished stages, run prerequisites first,
evaluate every stage, keep the ledger and the plots (docs/pipeline.md).

    pipe = Pipeline(config, run_dir)       # config: configs/rpr2_spr.py (experiment "pipeline")
    pipe.run()                             # config.pipeline.targets, e.g. ("rpr2_spr",)
    pipe.executed                          # stages actually trained by this call

Each stage goes resolve → run → hand off → validate → evaluate:

- resolve (`terminal_rsi.pipeline.resolve`): every needed stage config is built from its
  layers (the stage's own config file, the pipeline's seed and model, the scale preset, the
  user's shared and `config.stages.<stage>.*` settings, then the graph rules; a scale key
  that takes effect nowhere, a value replaced by a layer not declared to replace it, or a
  user value for a key the graph derives, is refused with what to set instead) and
  validated against its experiment's schema before any stage runs; so is its config hash.
  The run prints each stage's settings that differ from its config file, with the layer
  that set each, and the ledger keeps them (`settings`).
- run (`Pipeline.run_stage`): the stage's experiment in `<run_dir>/<stage>`, or for a
  bypassed stage a copy of its inputs.
- hand off (`terminal_rsi.pipeline.handoff`): the stage's weights-only exports are checked
  and the pass-through rules applied.
- validate (`Pipeline.validate_stage`, `terminal_rsi.pipeline.validation`): the stage's
  actors (its final export and, for RSR and RPR, the candidates it exported during
  training) are scored on the validation split; the best is kept only if it beats the
  input's, otherwise the input is handed on unchanged. The ledger records the decision and
  why.
- evaluate (`Pipeline.evaluate_stage`): k runs per held-out task (`evaluation.evaluate`); a
  critic warm-up is evaluated by its critic's EV on its input stage's episodes
  (`terminal_rsi.pipeline.stage_eval`).
- diagnose (`Pipeline.diagnose`, `terminal_rsi.pipeline.diagnostics`): when the stage has
  run, its training diagnostics (turns, clip fraction, approximate KL, gradient norms,
  critic EV from its workdir; the policy movement from its input actor on the run's probe)
  go to the ledger's `diagnostics`; its evaluation adds per-family success before and after.

Config hash: sha256 of the resolved stage config with the input paths replaced by
"<stage>/export" plus the hashes of the input stages and the evaluation and validation
settings (a validation decision changes what a stage exports), so a change upstream
invalidates every stage downstream. A stage is reused when the ledger says done with the
same hash and its exports exist; a stage dir left by a crashed run with the same hash is
resumed by the experiment itself (rpr_phase resumes from its checkpoints); a stage dir of
another hash is removed before the stage reruns.
"""

from __future__ import annotations

import functools
import gc
import json
import os
import shutil
import time
import traceback
from collections.abc import Callable, Sequence

import ml_collections

from terminal_rsi.config import registry
from terminal_rsi.config.configuration import build
from terminal_rsi.evaluation.config import EvalConfig
from terminal_rsi.evaluation.evaluate import evaluate
from terminal_rsi.pipeline import plots
from terminal_rsi.pipeline.config import resolved
from terminal_rsi.pipeline.diagnostics import (
    export_movement,
    family_change,
    frozen_probe,
    training_diagnostics,
)
from terminal_rsi.pipeline.graph import RPR1, graph_for, prerequisites
from terminal_rsi.pipeline.handoff import check_handoff, copy_inputs, exports_ok
from terminal_rsi.pipeline.ledger import PLOTS, Ledger, now_iso
from terminal_rsi.pipeline.resolve import (
    PipelineError,
    ResolvedStage,
    check_scale,
    eval_base_config,
    get_path,
    graph_rules,
    resolve_stage,
    set_path,
    settings_block,
    settings_record,
    shared_layers,
    shared_settings,
    stage_hash,
)
from terminal_rsi.pipeline.scales import get_scale
from terminal_rsi.pipeline.stage_eval import (
    bypassed_eval,
    critic_only_eval,
    frozen_divisors,
    frozen_strata,
    train_stats,
)
from terminal_rsi.pipeline.validation import (
    best_candidate,
    bypassed_record,
    decide,
    has_validation_split,
    rejected_dir,
    replace_exports,
    validation_config,
)
from terminal_rsi.runtime import multihost
from terminal_rsi.runtime.atomic import atomic_write_json, atomic_write_text
from terminal_rsi.runtime.exports import candidate_exports
from terminal_rsi.runtime.progress import echo
from terminal_rsi.tasks.registry import heldout_families_problem


class StageFailed(RuntimeError):
    """A stage raised; the ledger records the error and the run stops."""


class Pipeline:
    """One run directory of the stage graph (see the module doc)."""

    def __init__(self, config: ml_collections.ConfigDict, run_dir: str, *,
                 log: Callable[[str], None] | None = None):
        self.config = config = resolved(config)  # the scale's validation settings filled in
        self.run_dir = os.path.abspath(run_dir)
        self.log = log or echo  # stdout, above any progress bar
        self.scale = get_scale(config.scale)
        self.graph = graph_for(config.pipeline.base, tuple(config.pipeline.bypass),
                               pretrained=config.model != "tiny")
        self.bypass = tuple(config.pipeline.bypass)
        self.targets = tuple(config.pipeline.targets)
        self.order = prerequisites(self.targets, self.graph)
        self.executed: list[str] = []
        self.evaluated: list[str] = []
        self._resolved: dict[str, ResolvedStage] = {}
        self._hashes: dict[str, str] = {}
        os.makedirs(self.run_dir, exist_ok=True)
        self.ledger = Ledger(self.run_dir, [(n, self.graph[n].experiment) for n in self.order])
        multihost.barrier("pipeline_ledger_read")  # every process read it before any write

    # ------------------------------------------------------------------ paths

    def stage_dir(self, name: str) -> str:
        return os.path.join(self.run_dir, name)

    def export_dir(self, name: str) -> str:
        return os.path.join(self.run_dir, name, "export")

    def input_exports(self, name: str) -> dict[str, str]:
        """role -> export dir of the stage that produces stage `name`'s input."""
        return {role: self.export_dir(dep) for role, dep in self.graph[name].inputs.items()}

    @property
    def divisors_path(self) -> str:
        return os.path.join(self.run_dir, "divisors.json")

    @property
    def strata_path(self) -> str:
        return os.path.join(self.run_dir, "strata.json")

    @property
    def probe_path(self) -> str:
        return os.path.join(self.run_dir, "probe.jsonl")

    # ------------------------------------------------------------------ resolve

    def shared_settings(self) -> dict:
        """Dotted key -> value applied to every stage config that has the key."""
        return shared_settings(self.config, self.scale, self.divisors_path)

    def resolved_stage(self, name: str) -> ResolvedStage:
        """Stage `name` resolved (`resolve.resolve_stage`: its config and which layer set
        each setting; memoized)."""
        if name not in self._resolved:
            spec = self.graph[name]
            if name in self.bypass:  # a pass-through: no experiment runs
                self._resolved[name] = ResolvedStage(ml_collections.ConfigDict(
                    {"experiment": spec.experiment, "bypass": True}))
            else:
                self._resolved[name] = resolve_stage(
                    spec, self.config, self.scale,
                    shared_layers(self.config, self.scale, self.divisors_path),
                    lambda: self._graph_rules(name))
        return self._resolved[name]

    def stage_config(self, name: str) -> ml_collections.ConfigDict:
        """The resolved, validated config of stage `name` (memoized)."""
        return self.resolved_stage(name).config

    def settings(self, name: str) -> dict:
        """Stage `name`'s settings that differ from its config file, with the layer that set
        each (`resolve.settings_record`; the ledger's `settings`)."""
        return settings_record(self.resolved_stage(name), self.run_dir)

    def _graph_rules(self, name: str) -> dict:
        spec = self.graph[name]
        lr1 = (float(self.stage_config(RPR1).actor_opt.learning_rate)
               if spec.kind == "rpr" and name != RPR1 else None)
        return graph_rules(spec, self.config.pipeline, self.export_dir, lr1,
                           self.config.validation.candidates if self.validating else 1)

    def config_hash(self, name: str) -> str:
        if name not in self._hashes:
            spec = self.graph[name]
            deps = {role: self.config_hash(dep) for role, dep in spec.inputs.items()}
            self._hashes[name] = stage_hash(spec, self.stage_config(name), self.run_dir, deps,
                                            self.eval_base_config(),
                                            bypass=name in self.bypass,
                                            selection=self.selection_settings())
        return self._hashes[name]

    def eval_base_config(self) -> ml_collections.ConfigDict:
        """`configs/evaluate.py` resolved for this run (`resolve.eval_base_config`)."""
        return eval_base_config(self.config, self.scale, self.shared_settings(), self.run_dir)

    def selection_settings(self) -> dict | None:
        """The validation settings in force (None: no model selection in this run)."""
        return self.config.validation.to_dict() if self.validating else None

    @functools.cached_property
    def validating(self) -> bool:
        """Model selection on: enabled and the task suite has a validation split (read once:
        the config does not change during a run)."""
        return bool(self.config.validation.enabled
                    and has_validation_split(self.eval_base_config().tasks.suite))

    def selects(self, name: str) -> bool:
        """Stage `name` is scored on validation (model selection on; it has an actor)."""
        return self.validating and self.graph[name].evaluate == "actor"

    def resolve_all(self) -> None:
        """Resolve and validate the scale, every needed stage config, and the evaluation's
        held-out families, before any work."""
        check_scale(self.config, self.scale)
        for n in self.order:
            self.stage_config(n)
            self.config_hash(n)
        tasks = self.eval_base_config().tasks
        problem = heldout_families_problem(tasks.suite, tasks.heldout_families or (),
                                           "eval.heldout_families")
        if problem:
            raise PipelineError(problem)

    def frozen_divisors(self):
        """The run's frozen family divisors (`stage_eval.frozen_divisors`)."""
        return frozen_divisors(self.divisors_path, self.eval_base_config().tasks.suite,
                               self.config.pipeline.divisor_samples)

    def frozen_strata(self):
        """The run's difficulty strata, fitted once before any evaluation."""
        return frozen_strata(self.strata_path, self.eval_base_config())

    @functools.cached_property
    def probe(self) -> list:
        """The run's probe of policy movement (`diagnostics.frozen_probe`), rendered once per
        run dir when a stage first needs it, in the base stage's demonstration style."""
        style = get_path(self.stage_config("base"), "harness.action_style") if \
            "base" in self.graph else None
        return frozen_probe(self.probe_path, build(EvalConfig, self.eval_base_config()),
                            has_validation_split(self.eval_base_config().tasks.suite),
                            style or "compact")

    # ------------------------------------------------------------------ run

    def run(self, targets: Sequence[str] | None = None) -> Ledger:
        order = prerequisites(targets, self.graph) if targets else self.order
        self.resolve_all()
        if multihost.is_writer():  # written once, before any stage; every process reads them
            self.frozen_divisors()
            self.frozen_strata()
        multihost.barrier("pipeline_frozen")
        self.record_settings(order)
        for n in order:
            self.ensure(n)
        self.plot()
        return self.ledger

    def record_settings(self, order: Sequence[str]) -> None:
        """Print each stage's settings that differ from its config file, with the layer that
        set each (one block per stage), and keep them in the ledger."""
        for n in order:
            rec = self.settings(n)
            self.ledger.entry(n)["settings"] = rec
            self.log(f"[pipeline] {n}: bypassed (its inputs handed on)" if n in self.bypass
                     else settings_block(n, self.graph[n].config_file, rec,
                                         self.resolved_stage(n).layers))
        self.ledger.save()

    def ensure(self, name: str) -> None:
        """Make stage `name` done: its inputs first, then reuse or run, then evaluate."""
        for dep in self.graph[name].inputs.values():
            self.ensure(dep)
        h = self.config_hash(name)
        e = self.ledger.entry(name)
        if (e["status"] == "done" and e.get("config_hash") == h
                and exports_ok(self.export_dir(name), self.graph[name].kind)):
            if self.selects(name) and not e.get("validation"):  # stopped before its choice
                self.validate_stage(name)
                self.evaluate_stage(name)
            elif not e.get("eval"):
                self.evaluate_stage(name)
            return
        self.run_stage(name, h)
        self.validate_stage(name)
        self.evaluate_stage(name)
        self.plot()
        gc.collect()  # the stage's states (GBs for a 135 M model) before the next stage

    def prepare_stage_dir(self, name: str, h: str) -> str:
        """`<run_dir>/<name>`, emptied if a run of another config hash left it, with its
        marker (stage.json) and resolved config (config.json); process 0 prepares it while
        the others wait."""
        sdir = self.stage_dir(name)
        if multihost.is_writer():
            self._prepare_stage_dir(name, h, sdir)
        multihost.barrier(f"pipeline_{name}_prepared")
        return sdir

    def _prepare_stage_dir(self, name: str, h: str, sdir: str) -> None:
        marker = os.path.join(sdir, "stage.json")
        if os.path.isdir(sdir):
            old = None
            if os.path.exists(marker):
                with open(marker) as f:
                    old = json.load(f).get("config_hash")
            if old != h:
                self.log(f"[pipeline] {name}: config changed; removing the old stage dir {sdir}")
                shutil.rmtree(sdir)
        os.makedirs(sdir, exist_ok=True)
        atomic_write_json(marker, {"config_hash": h, "experiment": self.graph[name].experiment})
        atomic_write_json(os.path.join(sdir, "config.json"), self.stage_config(name).to_dict())
        shutil.rmtree(os.path.join(sdir, "rejected"), ignore_errors=True)  # an earlier try's

    def run_stage(self, name: str, h: str) -> None:
        """Run stage `name` (config hash `h`) and hand off its exports; the ledger follows."""
        spec = self.graph[name]
        sdir = self.prepare_stage_dir(name, h)
        self.ledger.update(
            name, status="running", config_hash=h, started=now_iso(), finished=None,
            wall_s=None, error=None, eval={}, train={}, validation={}, eval_wall_s=None,
            diagnostics={},
            inputs={role: f"{dep}/export" for role, dep in spec.inputs.items()},
            outputs={"export": f"{name}/export", "checkpoints": f"{name}/checkpoints"})
        self.log(f"[pipeline] {name}: running {spec.experiment} in {sdir}")
        t0 = time.monotonic()
        try:
            self.execute(name)
            multihost.barrier(f"pipeline_{name}_ran")  # process 0's files are written
            check_handoff(spec, self.export_dir(name), self.input_exports(name))
        except Exception as ex:  # noqa: BLE001 - recorded, then the run stops
            err = f"{type(ex).__name__}: {ex}"
            if multihost.is_writer():
                atomic_write_text(os.path.join(sdir, "error.txt"), traceback.format_exc())
            self.ledger.update(name, status="failed", error=err, finished=now_iso(),
                               wall_s=time.monotonic() - t0)
            raise StageFailed(f"stage {name} ({spec.experiment}) failed: {err}. Traceback in "
                              f"{sdir}/error.txt; the ledger is {self.ledger.path}. Fix it and "
                              "rerun the same command: finished stages are reused.") from ex
        self.executed.append(name)
        wall = time.monotonic() - t0
        self.ledger.update(name, status="done", finished=now_iso(), wall_s=wall,
                           train=train_stats(sdir), diagnostics=self.diagnose(name))
        self.log(f"[pipeline] {name}: done in {wall:.0f}s")

    def execute(self, name: str) -> None:
        """The stage's experiment on its resolved config; a bypassed stage (ablation,
        `pipeline.bypass`) copies its inputs' exports instead."""
        if name in self.bypass:
            if multihost.is_writer():
                copy_inputs(self.graph[name], self.export_dir(name), self.input_exports(name))
                atomic_write_json(os.path.join(self.stage_dir(name), "summary.json"),
                                  {"bypassed": 1})
            return
        registry.get_experiment(self.graph[name].experiment).run(  # the typed settings
            self.resolved_stage(name).typed, self.stage_dir(name))

    def diagnose(self, name: str) -> dict:
        """The training diagnostics of stage `name`, just trained (`terminal_rsi.pipeline.
        diagnostics`): from its workdir, and the policy movement from its input actor to its
        final trained actor on the run's probe ({} for a bypassed stage: nothing trained)."""
        if name in self.bypass:
            return {}
        spec = self.graph[name]
        out = training_diagnostics(self.stage_dir(name), spec.experiment)
        if "actor" in spec.inputs and spec.kind != "warmup":
            try:
                out.update(export_movement(build(EvalConfig, self.eval_base_config()),
                                           self.input_exports(name)["actor"],
                                           self.export_dir(name), self.probe))
            except Exception as ex:  # noqa: BLE001 - a diagnostic never stops a run
                self.log(f"[pipeline] {name}: no policy movement: {type(ex).__name__}: {ex}")
        return out

    def train_stats(self, name: str) -> dict:
        """Numbers from the stage's `summary.json` and last `metrics.jsonl` line."""
        return train_stats(self.stage_dir(name))

    # ------------------------------------------------------------------ validate

    def validate_stage(self, name: str) -> dict | None:
        """Score stage `name`'s actor on the validation split and keep it only if it beats
        its input's (`terminal_rsi.pipeline.validation`); the record goes to the ledger.
        None (nothing recorded) without model selection or for a stage without an actor."""
        spec = self.graph[name]
        if not self.selects(name):
            return None
        source = spec.inputs.get("actor")
        source_record = self.ledger.entry(source).get("validation") if source else None
        if name in self.bypass:
            rec = bypassed_record(source, source_record)
            self.ledger.update(name, validation=rec)
            return rec
        t0 = time.monotonic()
        v = self.config.validation
        scored = [self.score_on_validation(name, step, d) for step, d in self.candidates(name)]
        best = scored[best_candidate([c["score"] for c in scored])]
        rec = decide(name, best["score"], source, source_record, v.min_gain, v.k,
                     candidate=best["candidate"] if len(scored) > 1 else None)
        sources = (self.input_exports(name) if rec["decision"] == "input" else
                   None if best["dir"] == self.export_dir(name) else
                   dict.fromkeys(spec.inputs, best["dir"]))
        if sources is not None:  # process 0 swaps the exports while the others wait
            if multihost.is_writer():
                replace_exports(spec, self.stage_dir(name), self.export_dir(name), sources)
            multihost.barrier(f"pipeline_{name}_exports_replaced")
            rec["rejected"] = os.path.relpath(rejected_dir(self.stage_dir(name)), self.run_dir)
        rec.update(metric="mean_at_k", k=v.k, num_tasks=best["num_tasks"],
                   score=best["score"], wall_s=time.monotonic() - t0,
                   per_family=best["per_family"], trajectories=best["trajectories"],
                   candidates=[{k: c[k] for k in ("candidate", "step", "score")}
                               for c in scored],
                   chosen_candidate=None if rec["decision"] == "input" else best["candidate"])
        self.log(f"[pipeline] {name}: {rec['reason']}")
        self.ledger.update(name, validation=rec)
        return rec

    def reward_fn(self, name: str) -> str:
        """The reward function stage `name` trains with (its episodes are scored by it); a
        stage without one (base, RSR: the verdict alone) is scored by the evaluation's own
        `eval.reward_fn`."""
        return (get_path(self.stage_config(name), "rewards.fn")
                or get_path(self.eval_base_config(), "eval.reward_fn"))

    def candidates(self, name: str) -> list[tuple[int | None, str]]:
        """(step, export dir) of the actors stage `name` offers for model selection: its
        candidates (`exports.candidate_exports`) by step, then its final export (None)."""
        return candidate_exports(self.stage_dir(name)) + [(None, self.export_dir(name))]

    def score_on_validation(self, name: str, step: int | None, actor_dir: str) -> dict:
        """Validation Mean@k of the actor exported at `actor_dir` (stage `name`'s candidate of
        `step`, None: its final export), its trajectories under
        `<stage>/validation[/step_<n>]`."""
        fn = self.reward_fn(name)
        cfg = validation_config(self.eval_base_config(), self.config.validation, actor_dir, fn)
        label = "final" if step is None else f"step {step}"
        sub = "validation" if step is None else os.path.join("validation", f"step_{step}")
        res = evaluate(build(EvalConfig, cfg), os.path.join(self.stage_dir(name), sub),
                       log=self.log)["validation"]
        self.log(f"[pipeline] {name}: validation Mean@{self.config.validation.k} of the "
                 f"{label} actor {res['mean_at_k']:.3f}")
        return {"candidate": label, "dir": actor_dir, "score": float(res["mean_at_k"]),
                "step": step,
                "num_tasks": res["num_tasks"],
                "per_family": {f: x["success"] for f, x in res["per_family"].items()},
                "trajectories": f"{name}/{sub}/{res['trajectories']}"}

    # ------------------------------------------------------------------ evaluate

    def evaluate_stage(self, name: str) -> dict:
        """Evaluate stage `name` (its actor on the held-out suites; a critic warm-up by its
        EV on its input's episodes; a bypassed stage by its input's results) into the
        ledger."""
        spec = self.graph[name]
        t0 = time.monotonic()
        if name in self.bypass:  # same actor and critic as the input: same evaluation
            src = spec.inputs["actor"]
            res = bypassed_eval(src, self.ledger.entry(src).get("eval") or {})
            self.evaluated.append(name)
            self.ledger.update(name, eval=res)
            return res
        fn = self.reward_fn(name)
        cfg = self.eval_base_config()
        set_path(cfg, "eval.reward_fn", fn)
        set_path(cfg, "init.critic_weights", self.export_dir(name))
        edir = os.path.join(self.stage_dir(name), "eval")
        if spec.evaluate == "critic":
            src = spec.inputs["actor"]
            res = critic_only_eval(self.export_dir(name), cfg, src,
                                   self.ledger.entry(src).get("eval") or {}, self.run_dir, edir)
        else:
            set_path(cfg, "init.actor_weights", self.export_dir(name))
            res = evaluate(build(EvalConfig, cfg), edir, log=self.log)
            for suite in res.values():
                if suite.get("trajectories"):
                    suite["trajectories"] = f"{name}/eval/{suite['trajectories']}"
        for suite in res.values():
            suite["reward_fn"] = fn
        self.evaluated.append(name)
        src = spec.inputs.get("actor")  # per-family success before (its input) and after
        before = self.ledger.entry(src).get("eval") if src else None
        diag = {**(self.ledger.entry(name).get("diagnostics") or {}),
                "per_family": family_change(before, res)}
        self.ledger.update(name, eval=res, eval_wall_s=time.monotonic() - t0,
                           diagnostics=diag)
        self.log(f"[pipeline] {name}: evaluated in {time.monotonic() - t0:.0f}s")
        return res

    # ------------------------------------------------------------------ plots

    def plot(self) -> None:
        if not multihost.is_writer():
            return
        try:
            made = plots.make_all(self.run_dir, self.ledger.to_dict())
        except Exception as ex:  # noqa: BLE001 - a plot never stops a run
            self.log(f"[pipeline] plotting failed: {type(ex).__name__}: {ex}")
            return
        self.ledger.plots = {k: PLOTS[k] for k in made}
        self.ledger.save()
