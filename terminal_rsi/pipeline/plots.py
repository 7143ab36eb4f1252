"""PNG plots of a pipeline run (paper Fig. 5-9, 11), drawn from the ledger and stage dirs.

- progression.png: Mean@k strict success per stage and suite (and their equal-weight mean).
- training_curves.png: each training stage's metrics on its own native clock (its own step
  axis; stages are separate panels, never resampled onto a shared axis), raw observations
  pale and causal means of up to five observations dark (as Fig. 7).
- critic_ev.png: critic explained variance per stage, pre-update batch EV on the stage's
  own step axis, and the EV on evaluation episodes per stage.
- reward_profile.png: per-family mean FDR and SPR reward on the evaluation episodes (polar
  panels as Fig. 11), one curve per RPR stage.

matplotlib is imported here only (Agg backend).
"""

from __future__ import annotations

import os

import numpy as np

from terminal_rsi.runtime.atomic import read_json_lines

TRAIN_KEYS = ("reward_binary", "reward_dense", "turns", "eval/success")
FALLBACK_KEYS = ("loss", "nll", "train/loss", "sft/loss", "accuracy", "token_accuracy")


def causal_mean(x: np.ndarray, window: int = 5) -> np.ndarray:
    """Mean of the last up-to-`window` observations at each index (NaNs skipped)."""
    out = np.full(len(x), np.nan)
    for i in range(len(x)):
        w = x[max(0, i - window + 1):i + 1]
        w = w[np.isfinite(w)]
        if w.size:
            out[i] = w.mean()
    return out


def _series(rows: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = [], []
    for i, r in enumerate(rows):
        v = r.get(key)
        if isinstance(v, int | float) and not isinstance(v, bool):
            xs.append(r.get("step", i + 1))
            ys.append(float(v))
    return np.asarray(xs, float), np.asarray(ys, float)


def _keys_for(rows: list[dict]) -> list[str]:
    have = {k for r in rows for k, v in r.items() if isinstance(v, int | float)}
    keys = [k for k in TRAIN_KEYS + FALLBACK_KEYS if k in have]
    if not keys:
        keys = sorted(k for k in have if k != "step")[:3]
    return keys[:4]


def make_all(run_dir: str, ledger: dict) -> list[str]:
    """Draw every plot the ledger has data for into `<run_dir>/plots/`; returns their keys."""
    import matplotlib  # the optional plotting engine, loaded only when plots are drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = os.path.join(run_dir, "plots")
    os.makedirs(out_dir, exist_ok=True)
    stages = ledger.get("stages", [])
    ev_stages = [s for s in stages if s.get("eval") and any(
        isinstance(e, dict) and e.get("mean_at_k") is not None for e in s["eval"].values())]
    trained = [(s["name"], read_json_lines(os.path.join(run_dir, s["dir"], "metrics.jsonl")))
               for s in stages if s.get("status") == "done"]
    # rows without a numeric series (an RSR stage whose Q_clean was empty logs only
    # "skipped") get no row of their own
    trained = [(n, r) for n, r in trained if r and _keys_for(r)]
    made = []
    for name, draw in (("progression", lambda: _progression(plt, ev_stages)),
                       ("training_curves", lambda: _training_curves(plt, trained)),
                       ("critic_ev", lambda: _critic_ev(plt, trained, stages)),
                       ("reward_profile", lambda: _reward_profile(plt, stages, ev_stages))):
        fig = draw()  # one figure open at a time
        if fig is None:
            continue
        tmp = os.path.join(out_dir, f".{name}.tmp.png")
        fig.savefig(tmp, dpi=90, bbox_inches="tight")
        plt.close(fig)
        os.replace(tmp, os.path.join(out_dir, f"{name}.png"))
        made.append(name)
    return made


def _progression(plt, ev_stages: list[dict]):
    """Mean@k strict success per stage and suite, and their equal-weight mean (None: no
    evaluated stage)."""
    if not ev_stages:
        return None
    suites = sorted({k for s in ev_stages for k in s["eval"]})
    fig, ax = plt.subplots(figsize=(1.4 * len(ev_stages) + 3, 3.6))
    x = np.arange(len(ev_stages))
    means = []
    for suite in suites:
        y = [s["eval"].get(suite, {}).get("mean_at_k") for s in ev_stages]
        y = np.array([np.nan if v is None else v for v in y], float)
        means.append(y)
        k = next((s["eval"][suite].get("k") for s in ev_stages if suite in s["eval"]), "k")
        ax.plot(x, 100 * y, marker="o", label=f"{suite} (Mean@{k})")
    ax.plot(x, 100 * np.nanmean(np.vstack(means), axis=0), "k--", marker="*",
            label="equal-weight mean")
    ax.set_xticks(x, [s["name"] for s in ev_stages], rotation=20)
    ax.set_ylabel("strict success (%)")
    ax.set_title("Success per stage (ordinal stage axis, not equal compute)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return fig


def _training_curves(plt, trained: list[tuple[str, list[dict]]]):
    """One row per trained stage, each on its own step axis (None: no stage has metrics)."""
    if not trained:
        return None
    ncol = max(len(_keys_for(r)) for _, r in trained)
    fig, axes = plt.subplots(len(trained), ncol, figsize=(3.2 * ncol, 2.3 * len(trained)),
                             squeeze=False)
    for i, (name, rows) in enumerate(trained):
        keys = _keys_for(rows)
        for j in range(ncol):
            ax = axes[i][j]
            if j >= len(keys):
                ax.axis("off")
                continue
            xs, ys = _series(rows, keys[j])
            ax.plot(xs, ys, color="tab:blue", alpha=0.3, marker=".", lw=1)
            ax.plot(xs, causal_mean(ys), color="tab:blue", lw=2)
            ax.set_title(f"{name}: {keys[j]}", fontsize=8)
            ax.set_xlabel(f"{name} step", fontsize=7)
            ax.tick_params(labelsize=7)
    fig.suptitle("Training curves, each on its own native clock (pale: raw; dark: causal "
                 "mean of <= 5)", fontsize=9)
    fig.tight_layout()
    return fig


def _critic_ev(plt, trained: list[tuple[str, list[dict]]], stages: list[dict]):
    """Pre-update batch EV per trained stage and the EV on evaluation episodes per stage
    (None: neither was logged)."""
    ev_rows = [(n, _series(r, "value_ev_pre_update")) for n, r in trained]
    ev_rows = [(n, s) for n, s in ev_rows if len(s[0])]
    eval_ev = []
    for s in stages:
        xs = [e["explained_variance"] for e in (s.get("eval") or {}).values()
              if isinstance(e, dict) and e.get("explained_variance") is not None]
        eval_ev.append((s["name"], float(np.mean(xs)) if xs else np.nan))
    eval_ev = [(n, v) for n, v in eval_ev if np.isfinite(v)]
    if not (ev_rows or eval_ev):
        return None
    fig, axes = plt.subplots(1, len(ev_rows) + 1, figsize=(3.2 * (len(ev_rows) + 1), 2.8),
                             squeeze=False)
    for j, (name, (xs, ys)) in enumerate(ev_rows):
        ax = axes[0][j]
        ax.plot(xs, ys, marker="o", color="tab:green")
        ax.axhline(0, color="gray", lw=0.8)
        ax.set_title(f"{name}: batch EV (pre-update)", fontsize=8)
        ax.set_xlabel(f"{name} step", fontsize=7)
    ax = axes[0][-1]
    if eval_ev:
        ax.bar(range(len(eval_ev)), [v for _, v in eval_ev], color="tab:green")
        ax.set_xticks(range(len(eval_ev)), [n for n, _ in eval_ev], rotation=30,
                      fontsize=7)
    ax.axhline(0, color="gray", lw=0.8)
    ax.set_title("critic EV on eval episodes", fontsize=8)
    fig.suptitle("Critic explained variance 1 - Var(G - V) / Var(G)", fontsize=9)
    fig.tight_layout()
    return fig


def _reward_profile(plt, stages: list[dict], ev_stages: list[dict]):
    """Per-family mean FDR and SPR on the evaluation episodes, one curve per RPR stage (any
    evaluated stage when no RPR stage has per-family results; None: none has)."""
    prof = [s for s in stages if s.get("eval") and s["name"].startswith("rpr")
            and any(isinstance(e, dict) and e.get("per_family") for e in s["eval"].values())]
    if not prof:
        prof = [s for s in ev_stages if any(e.get("per_family") for e in s["eval"].values())]
    if not prof:
        return None
    fams = sorted({f for s in prof for e in s["eval"].values() if isinstance(e, dict)
                   for f in (e.get("per_family") or {})})
    fig, axes = plt.subplots(1, 2, figsize=(9, 4.2), subplot_kw={"projection": "polar"})
    ang = np.linspace(0, 2 * np.pi, len(fams), endpoint=False)
    ang = np.concatenate([ang, ang[:1]])
    for ax, key in zip(axes, ("fdr", "spr"), strict=True):
        top = 0.0
        for s in prof:
            pf = {}
            for e in s["eval"].values():
                if isinstance(e, dict):
                    pf.update(e.get("per_family") or {})
            y = np.array([pf.get(f, {}).get(key, np.nan) for f in fams], float)
            top = max(top, float(np.nanmax(y)) if np.isfinite(y).any() else 0.0)
            ax.plot(ang, np.concatenate([y, y[:1]]), marker="o", label=s["name"])
        ax.set_ylim(0.0, max(top * 1.1, 0.1))  # rewards are >= 0: the centre is 0
        ax.set_xticks(ang[:-1], fams, fontsize=7)
        ax.set_title(f"mean {key.upper()} per family", fontsize=9)
    axes[1].legend(fontsize=7, loc="upper right", bbox_to_anchor=(1.35, 1.1))
    fig.tight_layout()
    return fig
