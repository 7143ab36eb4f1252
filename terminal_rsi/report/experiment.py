"""Experiment "report": the static HTML report of a run or stage dir (docs/report.md).

    python experiments/run.py --config=configs/report.py --config.run=runs/main
"""

from __future__ import annotations

import ml_collections

from terminal_rsi.configuration import BASE_SCHEMA, Field

SCHEMA = {
    **BASE_SCHEMA,
    "run": Field(str, "run dir (with ledger.json) or a single stage dir"),
    "output": Field(str, "report folder ('' = <run>/report)"),
    "title": Field(str, "page title ('' = 'Run report: <run name>')"),
    "max_episodes_per_shard": Field(int, "episodes shown per shard, the first ones (0 = all)",
                                    lo=0),
    "max_train_shards": Field(int, "shards per step_/eval_ series of a stage, evenly spaced "
                              "(0 = all)",
                              lo=0),
}


def run(config: ml_collections.ConfigDict, workdir: str):
    from terminal_rsi.report import ReportInputError, ReportOptions, build_report

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
