"""Static HTML report of a run: a headline (per-stage success per suite, the validation
decision and its reason, critic EV, the progression plot), notes, plots, per-family table,
the folded stage record, a trajectory browser and token-level TB-GAE credit heatmaps
(docs/report.md).

    python experiments/run.py --config=configs/report.py --config.run=<run or stage dir>

`build_report(run, out=None)` writes `<run>/report/index.html` (open it from disk; no
server, no network). Nothing heavy is imported here; matplotlib only when a plot is drawn.
"""

from terminal_rsi.report.build import ReportOptions, build_report
from terminal_rsi.report.data import CreditMismatch, ReportInputError

__all__ = ["CreditMismatch", "ReportInputError", "ReportOptions", "build_report"]
