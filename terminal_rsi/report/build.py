"""Build the static HTML report of a run dir (C5 ledger) or of a single stage dir (C2).

Output folder (default `<run>/report/`):

    index.html          the page (open it from disk; no server, no network)
    report.css, report.js
    data.js             window.TRSI_REPORT = {...}: headline, notes, stages, training numbers,
                        diagnostics, plots, family table, episode index
    episodes/NNNNNN.js  TRSI_EPISODE(id, {...}): one episode's turns, checks and credit rows,
                        loaded on demand with a <script> tag (works from file://)
    plots/*.png         the ledger's plots (copied) or ones drawn from metrics.jsonl

The page opens with the headline (`data.headline`: per stage Mean@k and pass@k per suite,
the validation score against its input's with the decision and its reason, critic EV on the
evaluation episodes, wall time of training + evaluation + validation) and the progression
plot; notes follow, one line per kind (`data.group_notes`: e.g. "13 trajectory shards
truncated", the shards folded beneath); after the plots, the training diagnostics
(`data.diagnostics`: per stage turns per episode, PPO clip fraction and approximate KL, actor
gradient norm, critic EV, policy movement; per family the held-out success before and after
each stage); the stage record (times, inputs, errors, every training number) is folded,
with a table of selected training numbers (`data.train_numbers`).
A shard two stages name (a critic warm-up's eval reuses its input's episodes) is listed once,
under the first; validation episodes (`<stage>/validation/*.jsonl`) are listed too.

All text reaches the page as JSON and is inserted with textContent, never as HTML, so
observations with arbitrary bytes or markup are shown, not executed.
"""

from __future__ import annotations

import dataclasses
import datetime
import html
import json
import math
import os
import pathlib
import re
import shutil
import tempfile
from collections.abc import Sequence
from typing import Any

import numpy as np

from terminal_rsi.agent.trajectory import (
    TRAINING_POLICY,
    TrainingPolicy,
    TrajectoryFormatError,
    read_shard,
)
from terminal_rsi.report import data as D

ASSETS = pathlib.Path(__file__).resolve().parent / "assets"
MARKER = ".terminal_rsi_report"
PREFERRED_CURVES = ("reward_binary", "reward_dense", "value_ev_pre_update", "eval/success",
                    "critic/loss", "actor/loss", "loss", "accuracy")
_SERIES = re.compile(r"^([A-Za-z]+)_(\d+)\.jsonl$")  # numbered per-step shards
_SKIP_CURVES = ("step", "policy_version", "data_position", "critic_only")
EVAL_KEYS = ("k", "num_tasks", "mean_at_k", "pass_at_k", "process_reward", "explained_variance",
             "strata", "trajectories")


@dataclasses.dataclass
class ReportOptions:
    """max_episodes_per_shard: episodes shown per shard (the first ones; 0 = all).
    max_train_shards: shards per numbered series of a stage (`step_*.jsonl`, `eval_*.jsonl`;
    evenly spaced, first and last kept; other shards are always included; 0 = all).
    title: page title."""

    max_episodes_per_shard: int = 32
    max_train_shards: int = 8
    title: str = ""


def _clean(x: Any) -> Any:
    """JSON-safe copy: non-finite floats -> None, tuples -> lists, unknown -> str."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    if isinstance(x, bool) or x is None or isinstance(x, int | str):
        return x
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, np.generic):
        return _clean(x.item())
    return str(x)


def _js_json(obj: Any) -> str:
    return json.dumps(_clean(obj), ensure_ascii=True, allow_nan=False, separators=(",", ":"))


def _pick_train_shards(paths: list[pathlib.Path], k: int) -> list[pathlib.Path]:
    if k <= 0 or len(paths) <= k:
        return paths
    if k == 1:
        return [paths[-1]]
    idx = sorted({round(i * (len(paths) - 1) / (k - 1)) for i in range(k)})
    return [paths[i] for i in idx]


def _stage_config(stage_dir: pathlib.Path) -> dict | None:
    p = stage_dir / "config.json"
    if not p.exists():
        return None
    cfg = D.read_json(p, "stage config")
    if not isinstance(cfg, dict):
        raise D.ReportInputError(f"stage config {p} must be a JSON object")
    return cfg


def _preset(cfg: dict | None) -> str | None:
    model = (cfg or {}).get("model")
    if isinstance(model, str):  # the pipeline's config: model = "<preset>"
        return model
    return model.get("preset") if isinstance(model, dict) else None


class _Builder:
    def __init__(self, run: pathlib.Path, options: ReportOptions):
        self.run = run
        self.opt = options
        self.notes: list[tuple[str, str]] = []  # (kind, text): data.group_notes folds them
        self.shown: dict[str, str] = {}  # real path of a loaded shard -> its stage
        self.episodes: list[dict] = []  # index rows
        self.details: list[dict] = []
        self.families: list[dict] = []
        self.tokenizers: dict[tuple, tuple] = {}

    def note(self, kind: str, text: str) -> None:
        self.notes.append((kind, text))

    # -- input ---------------------------------------------------------------------------

    def ledger(self) -> tuple[dict, bool]:
        path = self.run / "ledger.json"
        if path.exists():
            return D.check_ledger(D.read_json(path, "ledger"), path), False
        markers = ("config.json", "metrics.jsonl", "trajectories", "summary.json")
        if not any((self.run / m).exists() for m in markers):
            raise D.ReportInputError(
                f"{self.run} is neither a run dir (no ledger.json) nor a stage dir (none of "
                f"{', '.join(markers)}); pass config.run=<workdir of a run or stage>")
        cfg = _stage_config(self.run) or {}
        status = "done" if (self.run / "summary.json").exists() or \
            (self.run / "export").exists() else "unknown"
        error = _tail(self.run / "error.txt")
        if error:
            status = "failed"
            error = error.strip().splitlines()[-1]
        stage = {"name": self.run.name, "experiment": cfg.get("experiment", "?"),
                 "status": status, "dir": ".", "error": error}
        summary = self.run / "summary.json"
        if summary.exists():
            s = D.read_json(summary, "stage summary")
            if isinstance(s, dict):
                stage["train"] = _flat_scalars(s)
        return {"format": D.LEDGER_FORMAT, "run": str(self.run), "stages": [stage],
                "plots": {}}, True

    def tokenizer(self, preset: str | None, cfg: dict | None):
        key = (preset, *D.model_source(cfg))
        if key not in self.tokenizers:
            self.tokenizers[key] = D.load_tokenizer(preset, cfg)
        return self.tokenizers[key]

    def stage_shards(self, stage: dict, stage_dir: pathlib.Path) -> list[pathlib.Path]:
        def jsonl(sub: str) -> list[pathlib.Path]:
            d = stage_dir / sub
            return sorted(d.glob("*.jsonl")) if d.is_dir() else []

        found = jsonl("trajectories")
        series: dict[str, list[pathlib.Path]] = {}  # step_00001.jsonl, eval_00003.jsonl, ...
        other = []
        for p in found:
            m = _SERIES.match(p.name)
            if m:
                series.setdefault(m.group(1), []).append(p)
            else:
                other.append(p)
        shards = other + [q for prefix in sorted(series, key=lambda k: (k != "step", k))
                          for q in _pick_train_shards(series[prefix], self.opt.max_train_shards)]
        shards += jsonl("eval") + jsonl("validation")
        shards += self.ledger_shards(stage)
        seen, out = set(), []
        for p in shards:
            key = os.path.realpath(p)
            if key in seen:
                continue
            seen.add(key)
            if key in self.shown and self.shown[key] != stage["name"]:
                self.note("shared", f"stage {stage['name']}: {self._rel(p)} is shown under "
                                    f"stage {self.shown[key]}")
                continue
            self.shown[key] = stage["name"]
            out.append(p)
        return out

    def ledger_shards(self, stage: dict) -> list[pathlib.Path]:
        """The shards the ledger names: each eval suite's and the validation record's."""
        named = [(f"eval suite {suite}", ev.get("trajectories"))
                 for suite, ev in sorted((stage.get("eval") or {}).items())
                 if isinstance(ev, dict)]
        val = stage.get("validation")
        if isinstance(val, dict):
            named.append(("validation", val.get("trajectories")))
        out = []
        for what, rel in named:
            if not isinstance(rel, str) or not rel:
                continue
            if not (self.run / rel).exists():
                self.note("missing", f"stage {stage['name']}: {what} lists trajectories "
                                     f"{rel}, which do not exist")
                continue
            out.append(self.run / rel)
        return out

    def load_shard(self, stage: str, shard: pathlib.Path, tok, divisors, stage_eps: list):
        try:
            trajs = read_shard(shard)
        except TrajectoryFormatError as e:
            raise D.ReportInputError(f"malformed trajectory shard: {e}") from e
        except (OSError, UnicodeDecodeError) as e:
            raise D.ReportInputError(f"cannot read trajectory shard {shard}: {e}") from e
        cap = self.opt.max_episodes_per_shard
        shown = trajs if cap <= 0 else trajs[:cap]
        if len(shown) < len(trajs):
            self.note("truncated", f"{self._rel(shard)}: showing the first {len(shown)} of "
                                   f"{len(trajs)} episodes (max_episodes_per_shard)")
        credit: dict[int, list[dict]] = {}
        cpath = shard.with_name(shard.name[:-len(".jsonl")] + ".credit.npz")
        if cpath.exists():
            arrays = D.read_credit(cpath, len(trajs))
            credit, warns = D.episode_credit(trajs, arrays, tok, self._rel(cpath),
                                             limit=len(shown))
            self.notes += [("credit", w) for w in warns]
        name = shard.name[:-len(".jsonl")]
        for i, traj in enumerate(shown):
            rw = D.episode_rewards(traj, divisors)
            stage_eps.append((traj, rw))
            eid = len(self.episodes)
            reason = traj.terminal_reason.value if traj.terminal_reason else None
            self.episodes.append({
                "id": eid, "stage": stage, "shard": name, "index": i,
                "episode_id": traj.episode_id, "task_id": traj.task_id, "family": traj.family,
                "harness": traj.harness, "policy_version": traj.policy_version,
                "S": traj.S, "P": traj.P, "N": traj.N, "reward": traj.reward,
                "reward_fn": traj.reward_fn, "reason": reason, "turns": len(traj.turns),
                "generated": traj.num_generated, "credit": i in credit,
                "file": f"episodes/{eid:06d}.js"})
            self.details.append(self.detail(eid, traj, tok, rw, credit.get(i)))

    def detail(self, eid: int, traj, tok, rw: dict, credit_rows) -> dict:
        turns = []
        for i, t in enumerate(traj.turns):
            turns.append({
                "index": i, "segment": t.segment, "action": D.decode(tok, t.sampled_ids),
                "observation": D.decode(tok, t.observation_ids),
                "prompt": D.decode(tok, t.prompt_ids) if t.prompt_ids else None,
                "n_sampled": len(t.sampled_ids), "n_observation": len(t.observation_ids),
                "stop_reason": t.stop_reason, "parse_error": t.parse_error,
                "mean_logprob": (sum(t.logprobs) / len(t.logprobs)) if t.logprobs else None})
        meta = dict(traj.meta or {})
        checks = meta.pop("checks", None)
        return {
            "id": eid, "task_id": traj.task_id, "family": traj.family,
            "episode_id": traj.episode_id, "harness": traj.harness,
            "instruction": D.instruction_of(traj, tok),
            "turns": turns, "segments": [dataclasses.asdict(s) for s in traj.segments],
            "report": traj.report, "checks": checks if isinstance(checks, list) else None,
            "S": traj.S, "P": traj.P, "N": traj.N, "reward": traj.reward,
            "reward_fn": traj.reward_fn, "rewards": rw,
            "reason": traj.terminal_reason.value if traj.terminal_reason else None,
            "declared_complete_turn": traj.declared_complete_turn, "error": traj.error,
            "timings": traj.timings, "meta": meta, "credit": credit_rows}

    # -- plots ---------------------------------------------------------------------------

    def plots(self, ledger: dict, out: pathlib.Path, metrics: dict[str, list[dict]]) -> list:
        """The ledger's plots, copied; training curves and (for more than one stage) the
        progression plot drawn when the ledger lacks them."""
        plots = []
        pdir = out / "plots"
        pdir.mkdir(exist_ok=True)
        for key, rel in (ledger.get("plots") or {}).items():
            src = self.run / str(rel)
            if not src.is_file():
                self.note("missing", f"ledger plot {key}: {rel} does not exist")
                continue
            safe = re.sub(r"[^A-Za-z0-9_-]", "_", str(key)) or "plot"  # a file name, no path
            suffix = src.suffix if re.fullmatch(r"\.[A-Za-z0-9]+", src.suffix) else ".png"
            dst = pdir / (safe + suffix)
            shutil.copyfile(src, dst)
            plots.append({"name": key, "file": f"plots/{dst.name}", "source": str(rel)})
        have = {p["name"] for p in plots}
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            self.note("other", "matplotlib is not installed: no plots drawn from metrics "
                               "(pip install 'terminal_rsi[report]')")
            return plots
        if "training_curves" not in have and any(metrics.values()):
            f = _draw_training_curves(metrics, pdir / "training_curves.png")
            if f:
                plots.append({"name": "training_curves", "file": "plots/training_curves.png",
                              "source": "drawn from the stages' metrics.jsonl"})
        if "progression" not in have and len(ledger.get("stages") or ()) > 1:
            f = _draw_progression(ledger, self.episodes, pdir / "progression.png")
            if f:
                plots.append({"name": "progression", "file": "plots/progression.png",
                              "source": f})
        order = {"progression": 0, "training_curves": 1}
        return sorted(plots, key=lambda p: (order.get(p["name"], 2), p["name"]))

    def _rel(self, p: pathlib.Path) -> str:
        try:
            return str(p.relative_to(self.run))
        except ValueError:
            return str(p)

    # -- main ----------------------------------------------------------------------------

    def build(self, out: pathlib.Path) -> dict:
        ledger, single = self.ledger()
        run_cfg = None if single else _stage_config(self.run)
        stages, metrics = [], {}
        for s in ledger["stages"]:
            stages.append(self.stage(s, run_cfg, metrics))
        plots = self.plots(ledger, out, metrics)
        return {
            "format": "terminal_rsi.report/1", "title": self.opt.title or
            f"Run report: {self.run.name}", "run": str(self.run),
            "single_stage": single, "ledger_updated": ledger.get("updated"),
            "generated": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "headline": D.headline(ledger["stages"]),
            "train_numbers": D.train_numbers(ledger["stages"]),
            "diagnostics": D.diagnostics(ledger["stages"]),
            "stages": stages, "plots": plots, "families": self.families,
            "episodes": self.episodes, "warnings": [text for _, text in self.notes],
            "notes": D.group_notes(self.notes),
        }

    def stage(self, s: dict, run_cfg: dict | None, metrics: dict[str, list[dict]]) -> dict:
        """Read one ledger stage (its dir's config, metrics and shards) into its page view."""
        sdir = self.run / str(s.get("dir") or s["name"])
        cfg = _stage_config(sdir) if sdir.is_dir() else None
        preset = _preset(cfg) or _preset(run_cfg)
        tok, tok_desc = self.tokenizer(preset, cfg or run_cfg)
        divisors, div_desc = D.divisors_for(cfg, (sdir, self.run))
        mpath = sdir / "metrics.jsonl"
        if mpath.is_file():
            metrics[s["name"]] = D.read_metrics(mpath)
        stage_eps: list = []
        shards = self.stage_shards(s, sdir) if sdir.is_dir() else []
        for shard in shards:
            self.load_shard(s["name"], shard, tok, divisors, stage_eps)
        self.families += _ledger_family_rows(s) + D.validation_family_rows(s)
        self.families += D.family_rows(s["name"], stage_eps)
        evals = {suite: {k: ev.get(k) for k in EVAL_KEYS if k in ev}
                 for suite, ev in (s.get("eval") or {}).items()}
        return {
            "name": s["name"], "experiment": s.get("experiment"), "status": s.get("status"),
            "dir": s.get("dir"), "inputs": s.get("inputs"), "outputs": s.get("outputs"),
            "config_hash": s.get("config_hash"), "started": s.get("started"),
            "finished": s.get("finished"), "wall_s": s.get("wall_s"),
            "eval_wall_s": s.get("eval_wall_s"), "walls": D.stage_walls(s),
            "validation": D.validation_view(s),
            "train": s.get("train"), "eval": evals, "error": s.get("error"),
            "traceback": _tail(sdir / "error.txt"),
            "tokenizer": tok_desc, "divisors": div_desc,
            "shards": [self._rel(p) for p in shards],
            "metrics_steps": len(metrics.get(s["name"], []))}


def _ledger_family_rows(s: dict) -> list[dict]:
    """The family table rows of a stage's ledger eval (its per_family numbers)."""
    return [{"stage": s["name"], "source": f"ledger eval: {suite}", "family": fam,
             "n": st.get("n"), "success": st.get("success"),
             "mean_p_over_n": st.get("mean_p_over_n"), "fdr": st.get("fdr"), "spr": st.get("spr")}
            for suite, ev in sorted((s.get("eval") or {}).items())
            for fam, st in sorted((ev.get("per_family") or {}).items()) if isinstance(st, dict)]


def _flat_scalars(d: dict, prefix: str = "") -> dict:
    """Numbers and strings of a nested dict (summary.json), keys joined with '/'."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat_scalars(v, f"{prefix}{k}/"))
        elif isinstance(v, int | float | str | bool) or v is None:
            out[f"{prefix}{k}"] = v
    return out


def _tail(path: pathlib.Path, chars: int = 4000) -> str | None:
    """The end of a stage's error.txt (its traceback), if there is one."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    return text if len(text) <= chars else "…" + text[-chars:]


def _plt():
    import matplotlib  # the optional plotting engine ('terminal_rsi[report]'), on first plot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _draw_training_curves(metrics: dict[str, list[dict]], path: pathlib.Path) -> bool:
    keys: list[str] = []
    numeric = []
    for rows in metrics.values():
        for r in rows:
            for k, v in r.items():
                if isinstance(v, int | float) and not isinstance(v, bool) and \
                        k not in _SKIP_CURVES and not k.endswith("_s") and k not in numeric:
                    numeric.append(k)
    keys = [k for k in PREFERRED_CURVES if k in numeric]
    keys += [k for k in numeric if k not in keys][:max(0, 6 - len(keys))]
    keys = keys[:6]
    if not keys:
        return False
    plt = _plt()
    cols = min(3, len(keys))
    nrows = math.ceil(len(keys) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 2.8 * nrows), squeeze=False)
    for ax, key in zip(axes.flat, keys, strict=False):
        for stage, rows in metrics.items():
            pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), int | float)
                   and not isinstance(r.get(key), bool) and math.isfinite(r[key])]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker=".", label=stage)
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def _draw_progression(ledger: dict, episodes: Sequence[dict], path: pathlib.Path):
    names = [s["name"] for s in ledger["stages"]]
    suites: dict[str, list] = {}
    for i, s in enumerate(ledger["stages"]):
        for suite, ev in (s.get("eval") or {}).items():
            v = ev.get("mean_at_k") if isinstance(ev, dict) else None
            if isinstance(v, int | float):
                suites.setdefault(suite, [None] * len(names))[i] = v
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(4.5, 1.2 * len(names)), 3.0))
    if suites:
        for suite, ys in suites.items():
            pts = [(x, y) for x, y in enumerate(ys) if y is not None]
            ax.plot(*zip(*pts, strict=True), marker="o", label=suite)
        ax.set_ylabel("mean@k (ledger eval)")
        ax.legend(fontsize=7)
        source = "drawn from the ledger's eval mean_at_k"
    else:
        # episodes the verifier judged as the policy's outcome (keep_reward reasons)
        verdicts = {r.value for r, pol in TRAINING_POLICY.items()
                    if pol == TrainingPolicy.KEEP_REWARD}
        rates = []
        for n in names:
            eps = [e for e in episodes if e["stage"] == n and e["reason"] in verdicts]
            rates.append(sum(e["S"] for e in eps) / len(eps) if eps else 0.0)
        ax.bar(range(len(names)), rates, color="#4a7bb7")
        ax.set_ylabel("success of shown episodes")
        source = "drawn from the episodes in this report (no ledger eval)"
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=20, fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_title("progression by stage", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return source


_INDEX = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>{title}</title>
<link rel="stylesheet" href="report.css">
</head>
<body>
<header><h1>{title}</h1><div id="run-info">{run}</div></header>
<noscript>This report needs JavaScript (it runs locally; nothing is fetched from the
network).</noscript>
<nav><a href="#headline">Headline</a> <a href="#notes">Notes</a> <a href="#plots">Plots</a>
<a href="#diagnostics">Diagnostics</a> <a href="#families">Families</a>
<a href="#stages">Stage details</a> <a href="#browser">Trajectories</a></nav>
<section id="headline"><h2>Headline</h2><div id="headline-table"></div>
<div id="headline-plot"></div></section>
<section id="notes" hidden><h2>Notes</h2><ul id="note-list"></ul></section>
<section id="plots"><h2>Plots</h2><div id="plot-list"></div></section>
<section id="diagnostics"><h2>Training diagnostics</h2><div id="diagnostics-table"></div>
<h3>Per-family held-out success before → after each stage</h3>
<div id="diagnostics-family-table"></div></section>
<section id="families"><h2>Per-family results</h2><div id="family-table"></div></section>
<section id="stages"><h2>Stage details</h2><details id="stage-details"><summary>status,
times, inputs, errors, what the report read, selected training numbers</summary>
<div id="stage-table"></div>
<h3>Training numbers</h3><div id="train-table"></div></details></section>
<section id="browser"><h2>Trajectories</h2>
<div id="filters"></div>
<div id="episode-count" data-count="0"></div>
<div id="browser-panes"><div id="episode-list"></div><div id="episode-detail"></div></div>
</section>
<script src="data.js"></script>
<script src="report.js"></script>
</body>
</html>
"""


def build_report(run: str | os.PathLike, out: str | os.PathLike | None = None,
                 options: ReportOptions | None = None) -> pathlib.Path:
    """Write the report of `run` (a run dir with ledger.json, or one stage dir) into `out`
    (default `<run>/report`); returns the path of index.html. ReportInputError names the
    file when an input is missing or malformed. The folder is built aside and swapped in,
    so a failed build leaves the previous report intact; an existing `out` that is not a
    report folder is refused."""
    run = pathlib.Path(run).expanduser().resolve()
    out = pathlib.Path(out).expanduser().resolve() if out else run / "report"
    options = options or ReportOptions()
    if not run.exists():
        raise D.ReportInputError(f"run dir not found: {run}")
    if not run.is_dir():
        raise D.ReportInputError(f"run path is not a directory: {run}")
    if out.exists() and any(out.iterdir()) and not (out / MARKER).exists():
        raise D.ReportInputError(f"output dir {out} exists and is not a report folder; "
                                 "choose an empty or new config.output")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        (tmp / "episodes").mkdir()
        builder = _Builder(run, options)
        page = builder.build(tmp)
        for det in builder.details:
            (tmp / "episodes" / f"{det['id']:06d}.js").write_text(
                f"TRSI_EPISODE({det['id']},{_js_json(det)});\n", encoding="ascii")
        (tmp / "data.js").write_text(f"window.TRSI_REPORT={_js_json(page)};\n",
                                     encoding="ascii")
        for name in ("report.js", "report.css"):
            shutil.copyfile(ASSETS / name, tmp / name)
        (tmp / "index.html").write_text(_INDEX.format(
            title=html.escape(page["title"]), run=html.escape(str(run))), encoding="utf-8")
        (tmp / MARKER).write_text("terminal_rsi.report/1\n")
        os.chmod(tmp, 0o755)
        if out.exists():
            old = pathlib.Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
            os.replace(out, old / "r")
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out / "index.html"
