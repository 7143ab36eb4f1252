"""A stage table from one or more run ledgers (seeds), as the README reports it.

    python -m terminal_rsi.pipeline.table runs/rsi_s0 runs/rsi_s1 runs/rsi_s2

Rows: stages in graph order; columns: Mean@k strict success per suite, as mean ± standard
deviation over the runs (seeds) that evaluated the stage, and the stage wall time.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence

import numpy as np

SUITES = ("heldout_instances", "heldout_families")


def load_ledger(run_dir: str) -> dict:
    with open(os.path.join(run_dir, "ledger.json")) as f:
        return json.load(f)


def _cell(xs: list[float]) -> str:
    if not xs:
        return "-"
    m = 100 * float(np.mean(xs))
    if len(xs) == 1:
        return f"{m:.1f}"
    return f"{m:.1f} ± {100 * float(np.std(xs, ddof=1)):.1f}"


def stage_table(ledgers: Sequence[dict], suites: Sequence[str] = SUITES) -> str:
    names: list[str] = []
    for led in ledgers:
        for s in led.get("stages", []):
            if s["name"] not in names:
                names.append(s["name"])
    k = next((e.get("k") for led in ledgers for s in led.get("stages", [])
              for e in (s.get("eval") or {}).values() if isinstance(e, dict) and e.get("k")), 3)
    head = (["stage"] + [f"{x} Mean@{k} (%)" for x in suites]
            + [f"{suites[0]} process reward (%)", "wall s"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for n in names:
        entries = [s for led in ledgers for s in led.get("stages", []) if s["name"] == n]
        cells = [n]
        for suite in suites:
            cells.append(_cell([e["eval"][suite]["mean_at_k"] for e in entries
                                if (e.get("eval") or {}).get(suite, {}).get("mean_at_k")
                                is not None]))
        cells.append(_cell([e["eval"][suites[0]]["process_reward"] for e in entries
                            if (e.get("eval") or {}).get(suites[0], {}).get(
                                "process_reward") is not None]))
        walls = [e["wall_s"] for e in entries if e.get("wall_s") is not None]
        cells.append(f"{np.mean(walls):.0f}" if walls else "-")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append(f"({len(ledgers)} run(s); mean ± sd over runs)")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    if not argv:
        print(__doc__)
        sys.exit(2)
    print(stage_table([load_ledger(d) for d in argv]))


if __name__ == "__main__":
    main(sys.argv[1:])
