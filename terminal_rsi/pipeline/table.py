"""Stage tables from one or more run ledgers (seeds), as the README reports them.

    python -m terminal_rsi.pipeline.table runs/rsi_s0 runs/rsi_s1 runs/rsi_s2

Block 1 (`stage_table`), one row per stage in graph order: per suite strict Mean@k and
pass@k (k = the evaluation's k) as mean ± sd over the runs (seeds) that evaluated the
stage, with the spread (min–max) in brackets; the process reward and the critic's explained
variance on held-out instances (the critic of a warm-up stage on its input's episodes); the
stage's wall time including its evaluation and validation (`wall_s` + `eval_wall_s` +
`validation.wall_s`, whichever the ledger has; mean over runs); and the validation decisions
("kept 2/3, input 1/3": the model selection of `terminal_rsi.pipeline.validation`).

Block 2 (`seed_table`), for more than one run: held-out-instance Mean@k with one column per
run (its directory name), every seed whether it improved or not, then mean ± sd and the
per-seed validation letters; and a last line (`gain_line`) with each chain's gain from its
base (first evaluated stage) to its last evaluated stage, their mean ± sd, and how many
chains ended at or above their base. Numbers are percent (points for gains). Ledgers
written before model selection (no `validation`, no `eval_wall_s`) are read as they are.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence

import numpy as np

from terminal_rsi.pipeline.ledger import eval_k, mean_at_k, pass_at_k, stage_walls, suite_eval

SUITES = ("heldout_instances", "heldout_families")
LETTERS = {"base": "B", "kept": "K", "input": "I", "bypassed": "P"}
LEGEND = ("validation letters: B base, K kept (its trained actor), I input handed on (trained "
          "actor rejected), P bypassed, · no validation record")


def load_ledger(run_dir: str) -> dict:
    with open(os.path.join(run_dir, "ledger.json")) as f:
        return json.load(f)


def run_labels(run_dirs: Sequence[str]) -> list[str]:
    """Each run's directory name (the whole path where two runs share a name)."""
    names = [os.path.basename(os.path.normpath(d)) for d in run_dirs]
    return [n if names.count(n) == 1 else os.path.normpath(d) for n, d in zip(names, run_dirs,
                                                                              strict=True)]


def as_runs(ledgers: Sequence[dict] | Mapping[str, dict]) -> dict[str, dict]:
    """{label: ledger}; a plain list is labelled by each ledger's run dir name."""
    if isinstance(ledgers, Mapping):
        return dict(ledgers)
    labels = run_labels([str(led.get("run") or f"run{i}") for i, led in enumerate(ledgers)])
    return dict(zip(labels, ledgers, strict=True))


# ----------------------------------------------------------------------------- reading


def stage_names(ledgers: Sequence[dict]) -> list[str]:
    """Every stage of every ledger in graph order (a stage one run lacks keeps its place
    after the stage it follows in the runs that have it)."""
    names: list[str] = []
    for led in ledgers:
        prev = None
        for s in led.get("stages", []):
            n = s["name"]
            if n not in names:
                names.insert(names.index(prev) + 1 if prev in names else len(names), n)
            prev = n
    return names


def entry(ledger: dict, name: str) -> dict | None:
    return next((s for s in ledger.get("stages", []) if s["name"] == name), None)


def process_reward(e: dict | None, suite: str) -> float | None:
    return suite_eval(e, suite).get("process_reward")


def critic_ev(e: dict | None, suite: str) -> float | None:
    """The stage critic's explained variance on the suite's evaluation episodes."""
    return suite_eval(e, suite).get("explained_variance")


def run_eval_k(ledgers: Sequence[dict], default: int = 3) -> int:
    """The evaluation's k over every run (`ledger.eval_k`; `default` where none records one)."""
    k = eval_k([st for led in ledgers for st in led.get("stages", [])])
    return default if k is None else k


def total_wall(e: dict | None) -> float | None:
    """Training + held-out evaluation + validation seconds, whichever are recorded."""
    return stage_walls(e or {})["total"]


def decision(e: dict | None) -> str | None:
    return ((e or {}).get("validation") or {}).get("decision")


# ----------------------------------------------------------------------------- cells


def values(entries: Sequence[dict | None], get, suite: str | None = None) -> list[float]:
    xs = [get(e, suite) if suite else get(e) for e in entries]
    return [float(x) for x in xs if isinstance(x, int | float)]


def spread_cell(xs: Sequence[float], scale: float = 100.0, digits: int = 1) -> str:
    """`scale`·x (percent by default): "m" for one run, "m ± sd (min–max)" for more (sample
    sd), `digits` decimals."""
    if not xs:
        return "-"
    m = scale * float(np.mean(xs))
    if len(xs) == 1:
        return f"{m:.{digits}f}"
    return (f"{m:.{digits}f} ± {scale * float(np.std(xs, ddof=1)):.{digits}f} "
            f"({scale * min(xs):.{digits}f}–{scale * max(xs):.{digits}f})")


def wall_cell(xs: Sequence[float]) -> str:
    if not xs:
        return "-"
    if len(xs) == 1:
        return f"{xs[0]:.0f}"
    return f"{np.mean(xs):.0f} ({min(xs):.0f}–{max(xs):.0f})"


def decision_cell(entries: Sequence[dict | None]) -> str:
    """"kept 2/3, input 1/3" over the runs that have the stage ("-": no record at all)."""
    present = [e for e in entries if e is not None]
    ds = [decision(e) for e in present]
    if not any(ds):
        return "-"
    rank = {d: i for i, d in enumerate(LETTERS)}
    order = sorted(set(ds), key=lambda d: (d is None, rank.get(d, len(rank)), str(d)))
    return ", ".join(f"{d or 'no record'} {ds.count(d)}/{len(present)}" for d in order)


# ----------------------------------------------------------------------------- tables


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def stage_row(name: str, entries: Sequence[dict | None], suites: Sequence[str]) -> list[str]:
    evaluated = [e for e in entries if any(mean_at_k(e, s) is not None for s in suites)]
    cells = [name, f"{len(evaluated)}/{len(entries)}"]
    for suite in suites:
        cells += [spread_cell(values(entries, mean_at_k, suite)),
                  spread_cell(values(entries, pass_at_k, suite))]
    cells += [spread_cell(values(entries, process_reward, suites[0])),
              spread_cell(values(entries, critic_ev, suites[0]), scale=1.0, digits=2)]
    cells += [wall_cell(values(entries, total_wall)), decision_cell(entries)]
    return cells


def stage_table(ledgers: Sequence[dict] | Mapping[str, dict],
                suites: Sequence[str] = SUITES) -> str:
    """Block 1 (module doc): one row per stage, mean ± sd (min–max) over the runs."""
    runs = list(as_runs(ledgers).values())
    k = run_eval_k(runs)
    head = ["stage", "runs"]
    for suite in suites:
        head += [f"{suite} Mean@{k} (%)", f"{suite} pass@{k} (%)"]
    head += [f"{suites[0]} process reward (%)", f"{suites[0]} critic EV",
             "wall s (train+eval+validation)",
             "validation"]
    lines = [_row(head), "|" + "---|" * len(head)]
    for name in stage_names(runs):
        lines.append(_row(stage_row(name, [entry(led, name) for led in runs], suites)))
    lines.append(f"({len(runs)} run(s); mean ± sd over runs, (min–max) the spread)")
    return "\n".join(lines)


def seed_table(ledgers: Sequence[dict] | Mapping[str, dict],
               suite: str = SUITES[0]) -> str:
    """Block 2 (module doc): `suite` Mean@k per run, one column per run."""
    runs = as_runs(ledgers)
    k = run_eval_k(list(runs.values()))
    head = ["stage", *runs, "mean ± sd (min–max)", "validation (" + " ".join(runs) + ")"]
    lines = [f"{suite} Mean@{k} (%) per run", _row(head), "|" + "---|" * len(head)]
    for name in stage_names(list(runs.values())):
        entries = [entry(led, name) for led in runs.values()]
        xs = [mean_at_k(e, suite) for e in entries]
        cells = [name] + ["-" if x is None else f"{100 * x:.1f}" for x in xs]
        cells.append(spread_cell([x for x in xs if x is not None]))
        cells.append(" ".join(LETTERS.get(decision(e), "·") for e in entries))
        lines.append(_row(cells))
    lines += [LEGEND, gain_line(runs, suite)]
    return "\n".join(lines)


def chain_gain(ledger: dict, suite: str = SUITES[0]) -> tuple[str, str, float] | None:
    """(base, last, last - base) over the stages of one run with a `suite` Mean@k, in graph
    order, from the stage named "base" (a pretrained model's zero-shot row before it is not
    the chain's base) or else the first scored one (None with fewer than two)."""
    scored = [(s["name"], mean_at_k(s, suite)) for s in ledger.get("stages", [])]
    scored = [(n, x) for n, x in scored if x is not None]
    names = [n for n, _ in scored]
    scored = scored[names.index("base"):] if "base" in names else scored
    if len(scored) < 2:
        return None
    (base, b), (last, x) = scored[0], scored[-1]
    return base, last, float(x) - float(b)


def gain_line(runs: Mapping[str, dict], suite: str = SUITES[0]) -> str:
    """Each chain's base -> last-stage gain in points, mean ± sd, and how many ended at or
    above their base."""
    gains = {label: chain_gain(led, suite) for label, led in runs.items()}
    gains = {label: g for label, g in gains.items() if g is not None}
    if not gains:
        return f"gain base→last stage ({suite}): no run has two evaluated stages"
    pairs = [(b, last) for b, last, _ in gains.values()]
    common = max(set(pairs), key=pairs.count)
    per = ", ".join(f"{label} {100 * d:+.1f}" + ("" if (b, last) == common else f" ({b}→{last})")
                    for label, (b, last, d) in gains.items())
    ds = [100 * d for _, _, d in gains.values()]
    sd = f" ± {np.std(ds, ddof=1):.1f}" if len(ds) > 1 else ""
    held = sum(d >= 0 for d in ds)
    k = run_eval_k(list(runs.values()))
    return (f"gain {common[0]}→{common[1]} ({suite} Mean@{k}, points): {per}; "
            f"mean {np.mean(ds):+.1f}{sd}; {held}/{len(ds)} chains ended at or above their base")


def report(runs: Mapping[str, dict]) -> str:
    """What `main` prints: block 1, and block 2 for more than one run."""
    out = [stage_table(runs)]
    if len(runs) > 1:
        out.append(seed_table(runs))
    return "\n\n".join(out)


def main(argv: list[str]) -> None:
    if not argv:
        print(__doc__)
        sys.exit(2)
    print(report(dict(zip(run_labels(argv), [load_ledger(d) for d in argv], strict=True))))


if __name__ == "__main__":
    main(sys.argv[1:])
