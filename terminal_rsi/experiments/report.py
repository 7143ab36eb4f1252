"""Experiment "report": the static HTML report of a run or stage dir (docs/report.md,
`terminal_rsi.report.build_report`).

    python experiments/run.py --config=configs/report.py --config.run=runs/main
"""

from __future__ import annotations

import dataclasses

from terminal_rsi.config.sections import Seeded
from terminal_rsi.report import ReportInputError, ReportOptions, build_report
from terminal_rsi.settings import setting


@dataclasses.dataclass(frozen=True)
class ReportConfig(Seeded):
    """Which run to report on, where the report goes and how much of it is shown."""

    run: str = setting("", "run dir (with ledger.json) or a single stage dir (required)")
    output: str = setting("", "report folder ('' = <run>/report)")
    title: str = setting("", "page title ('' = 'Run report: <run name>')")
    max_episodes_per_shard: int = setting(32, "episodes shown per shard, the first ones "
                                          "(0 = all)", lo=0)
    max_train_shards: int = setting(8, "shards per step_/eval_ series of a stage, evenly "
                                    "spaced (0 = all)", lo=0)


CONFIG = ReportConfig


def run(config: ReportConfig, workdir: str):
    """Build the report of `config.run`; a missing or unreadable run exits with one line."""
    if not config.run:
        raise SystemExit("error: config.run is empty; pass --config.run=<run dir or stage dir>")
    opts = ReportOptions(max_episodes_per_shard=config.max_episodes_per_shard,
                         max_train_shards=config.max_train_shards, title=config.title)
    try:
        index = build_report(config.run, config.output or None, opts)
    except ReportInputError as e:
        raise SystemExit(f"error: {e}") from None
    print(f"[report] wrote {index} (open it in a browser; no server needed)")
    return index
