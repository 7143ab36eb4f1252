"""The recursive pipeline (paper Fig. 2-3): stage graph and handoff rules
(`terminal_rsi.pipeline.graph`), runner with reuse and prerequisites (`runner`), the stage
ledger (`ledger`, contract C5), plots (`plots`), size presets (`scales`) and the `pipeline`
experiment (`experiment`). See docs/pipeline.md.
"""

from terminal_rsi.pipeline.graph import (
           GRAPH,
           STAGES,
           GraphError,
           StageSpec,
           graph_for,
           prerequisites,
)
from terminal_rsi.pipeline.ledger import FORMAT, Ledger, LedgerError, validate_ledger

__all__ = ["FORMAT", "GRAPH", "STAGES", "GraphError", "Ledger", "LedgerError", "StageSpec",
           "graph_for", "prerequisites", "validate_ledger"]
