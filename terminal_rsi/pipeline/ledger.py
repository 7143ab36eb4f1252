"""The stage ledger `<run>/ledger.json` (contract C5), rewritten atomically after every event.

    {"format": "terminal_rsi.ledger/1", "run": "<abs run dir>", "updated": "<iso time>",
     "stages": [{"name", "experiment", "status", "dir", "inputs", "outputs", "config_hash",
                 "started", "finished", "wall_s", "train": {...}, "eval": {suite: {...}},
                 "eval_wall_s", "validation": {...}, "settings": {...}, "diagnostics": {...},
                 "error"},
                ...],                                                   # graph order
     "plots": {"progression": "plots/progression.png", ...}}

Paths inside are relative to the run dir. Status: pending | running | done | failed.
Readers must tolerate missing optional keys (a pending or failed stage has no eval; ledgers
written before model selection have no validation). "validation" is the stage's model
selection record (`terminal_rsi.pipeline.validation`); "eval_wall_s" the seconds its held-out
evaluation took ("wall_s" is its training). "settings" is what the run resolved for the
stage beyond its config file: dotted path -> {"value", "set_by"}, each setting whose value
differs from `configs/<stage>.py` with the layer that set it (`terminal_rsi.pipeline.resolve`:
e.g. "scale 'ci' experiments.rpr_phase", "--config.stages.rsr1", "graph: input handoff"),
rewritten by every run. "diagnostics" holds the stage's training diagnostics
(`terminal_rsi.pipeline.diagnostics`, docs/pipeline.md): turns per episode, PPO clip fraction
and approximate KL, actor gradient norm, critic explained variance, policy movement on the
run's probe (numbers, keyed by metric name with a "mean/" or "last/" prefix), and
"per_family": {suite: {family: {"before", "after"}}} held-out success before and after the
stage; an entry written before diagnostics existed has none.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from terminal_rsi.runtime import multihost
from terminal_rsi.runtime.atomic import atomic_write_json

FORMAT = "terminal_rsi.ledger/1"
STATUSES = ("pending", "running", "done", "failed")
# a stage's model selection decision (terminal_rsi.pipeline.validation)
DECISIONS = ("base", "kept", "input", "bypassed")
PLOTS = {"progression": "plots/progression.png",
         "training_curves": "plots/training_curves.png",
         "critic_ev": "plots/critic_ev.png",
         "reward_profile": "plots/reward_profile.png"}


class LedgerError(ValueError):
    """ledger.json does not follow contract C5 (the message names the entry and key)."""


def now_iso() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


class Ledger:
    """In-memory ledger bound to `<run_dir>/ledger.json`; `save()` writes it atomically."""

    def __init__(self, run_dir: str, stages: Sequence[tuple[str, str]]):
        """stages: (name, experiment) in graph order. Entries of an existing ledger.json are
        kept (a rerun continues the record); new stages start pending."""
        self.run_dir = os.path.abspath(run_dir)
        self.path = os.path.join(self.run_dir, "ledger.json")
        old: dict[str, dict] = {}
        self.plots: dict[str, str] = {}
        if os.path.exists(self.path):
            with open(self.path, encoding="utf-8") as f:
                prev = json.load(f)
            validate_ledger(prev)
            old = {s["name"]: s for s in prev["stages"]}
            self.plots = dict(prev.get("plots", {}))
        self.stages: list[dict] = []
        names = [n for n, _ in stages]
        for name, experiment in stages:
            e = old.get(name) or {"name": name, "experiment": experiment, "status": "pending",
                                  "dir": name, "inputs": {}, "outputs": {},
                                  "config_hash": None, "started": None, "finished": None,
                                  "wall_s": None, "train": {}, "eval": {}, "error": None,
                                  "validation": {}, "eval_wall_s": None,
                                  "settings": {}, "diagnostics": {}}
            e["experiment"] = experiment
            self.stages.append(e)
        # stages recorded earlier but not part of this run's graph stay in the record
        self.stages += [s for n, s in old.items() if n not in names]

    def entry(self, name: str) -> dict:
        for s in self.stages:
            if s["name"] == name:
                return s
        raise KeyError(name)

    def update(self, name: str, **fields: Any) -> dict:
        e = self.entry(name)
        e.update(fields)
        self.save()
        return e

    def to_dict(self) -> dict:
        return {"format": FORMAT, "run": self.run_dir, "updated": now_iso(),
                "stages": self.stages, "plots": self.plots}

    def save(self) -> None:
        """Validate and write the ledger (with several processes every one keeps the same
        in-memory record and process 0 alone writes it)."""
        d = self.to_dict()
        validate_ledger(d)
        if multihost.is_writer():
            atomic_write_json(self.path, _clean(d))


def eval_k(stages: Sequence[Mapping]) -> int | None:
    """The evaluation's k: the first eval suite record of `stages` (ledger entries) that
    gives one."""
    return next((ev["k"] for st in stages for ev in (st.get("eval") or {}).values()
                 if isinstance(ev, Mapping) and isinstance(ev.get("k"), int)
                 and not isinstance(ev.get("k"), bool)), None)


def suite_eval(stage: Mapping | None, suite: str) -> dict:
    """A ledger entry's evaluation record of `suite` ({} when it has none)."""
    ev = ((stage or {}).get("eval") or {}).get(suite)
    return ev if isinstance(ev, Mapping) else {}


def mean_at_k(stage: Mapping | None, suite: str):
    return suite_eval(stage, suite).get("mean_at_k")


def pass_at_k(stage: Mapping | None, suite: str):
    """pass@k at the suite's own k (the ledger's string keys)."""
    ev = suite_eval(stage, suite)
    return (ev.get("pass_at_k") or {}).get(str(ev.get("k")))


def stage_walls(stage: Mapping) -> dict:
    """Seconds of a ledger entry's training (`wall_s`), held-out evaluation (`eval_wall_s`)
    and validation (`validation.wall_s`), and their total (None where none is recorded)."""
    val = stage.get("validation") if isinstance(stage.get("validation"), Mapping) else {}
    out = {"train": number(stage.get("wall_s")), "eval": number(stage.get("eval_wall_s")),
           "validation": number(val.get("wall_s"))}
    parts = [x for x in out.values() if x is not None]
    return {**out, "total": sum(parts) if parts else None}


def number(x) -> float | None:
    """`x` as a float when it is a number (not a bool), else None (ledgers are read as given)."""
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else None


def _clean(x):
    """NaN/inf -> None (the ledger is strict JSON)."""
    if isinstance(x, float):
        return x if x == x and abs(x) != float("inf") else None
    if isinstance(x, Mapping):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    return x


def _need(d: Mapping, key: str, types, where: str, optional: bool = False):
    if key not in d:
        if optional:
            return None
        raise LedgerError(f"{where}: missing key {key!r}")
    v = d[key]
    if v is None and optional:
        return None
    if not isinstance(v, types) or isinstance(v, bool) and bool not in (
            types if isinstance(types, tuple) else (types,)):
        raise LedgerError(f"{where}: {key} = {v!r} has type {type(v).__name__}")
    return v


def _is_number(v) -> bool:
    return v is None or isinstance(v, int | float) and not isinstance(v, bool)


def validate_diagnostics(diag: Mapping, where: str) -> None:
    """Raise LedgerError unless a stage's `diagnostics` holds numbers (or None) by name and
    "per_family" is {suite: {family: {"before": x, "after": y}}} with numbers or None."""
    for k, v in diag.items():
        if k != "per_family" and not _is_number(v):
            raise LedgerError(f"{where}: diagnostics[{k!r}] = {v!r} is not a number")
    per_family = diag.get("per_family", {})
    if not isinstance(per_family, dict):
        raise LedgerError(f"{where}: diagnostics['per_family'] = {per_family!r} is not a dict")
    for suite, fams in per_family.items():
        if not isinstance(fams, dict):
            raise LedgerError(f"{where}: diagnostics['per_family'][{suite!r}] = {fams!r} is "
                              "not a dict family -> {\"before\", \"after\"}")
        for fam, rec in fams.items():
            if not isinstance(rec, dict) or set(rec) != {"before", "after"} or not all(
                    _is_number(x) for x in rec.values()):
                raise LedgerError(f"{where}: diagnostics['per_family'][{suite!r}][{fam!r}] = "
                                  f"{rec!r}; expected " '{"before": x, "after": y}'
                                  " with numbers or None")


def validate_ledger(d: Mapping) -> None:
    """Raise LedgerError unless `d` follows contract C5 (optional keys may be missing)."""
    if d.get("format") != FORMAT:
        raise LedgerError(f"ledger format {d.get('format')!r}; expected {FORMAT!r}")
    _need(d, "run", str, "ledger")
    _need(d, "updated", str, "ledger")
    stages = _need(d, "stages", list, "ledger")
    seen = set()
    for i, s in enumerate(stages):
        where = f"ledger.stages[{i}]"
        name = _need(s, "name", str, where)
        if name in seen:
            raise LedgerError(f"{where}: duplicate stage {name!r}")
        seen.add(name)
        where = f"ledger stage {name!r}"
        _need(s, "experiment", str, where)
        if s.get("status") not in STATUSES:
            raise LedgerError(f"{where}: status {s.get('status')!r} not in {STATUSES}")
        _need(s, "dir", str, where)
        for key in ("inputs", "outputs", "train", "eval", "validation", "settings",
                    "diagnostics"):
            _need(s, key, dict, where, optional=True)
        for path, rec in (s.get("settings") or {}).items():
            if not isinstance(rec, dict) or set(rec) != {"value", "set_by"} or not isinstance(
                    rec["set_by"], str):
                raise LedgerError(f"{where}: settings[{path!r}] = {rec!r}; expected "
                                  '{"value": ..., "set_by": "<layer>"}')
        _need(s, "eval_wall_s", (int, float), where, optional=True)
        if (s.get("validation") or {}).get("decision") not in (None, *DECISIONS):
            raise LedgerError(f"{where}: validation decision {s['validation']['decision']!r} "
                              f"not in {DECISIONS}")
        for p in list((s.get("inputs") or {}).values()) + list((s.get("outputs") or {}).values()):
            if not isinstance(p, str) or os.path.isabs(p):
                raise LedgerError(f"{where}: input/output paths must be relative, got {p!r}")
        _need(s, "config_hash", str, where, optional=True)
        _need(s, "wall_s", (int, float), where, optional=True)
        for k, v in (s.get("train") or {}).items():
            if v is not None and (not isinstance(v, int | float) or isinstance(v, bool)):
                raise LedgerError(f"{where}: train[{k!r}] = {v!r} is not a number")
        validate_diagnostics(s.get("diagnostics") or {}, where)
        for suite, ev in (s.get("eval") or {}).items():
            w = f"{where} eval[{suite!r}]"
            if not isinstance(ev, dict):
                raise LedgerError(f"{w}: not a dict")
            _need(ev, "k", int, w, optional=True)
            _need(ev, "num_tasks", int, w, optional=True)
            _need(ev, "mean_at_k", (int, float), w, optional=True)
            _need(ev, "pass_at_k", dict, w, optional=True)
            _need(ev, "per_family", dict, w, optional=True)
            _need(ev, "strata", dict, w, optional=True)
        if s["status"] == "failed" and not s.get("error"):
            raise LedgerError(f"{where}: a failed stage needs its error")
    _need(d, "plots", dict, "ledger", optional=True)
