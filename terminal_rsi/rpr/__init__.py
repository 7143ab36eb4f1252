"""RPR phase loop (§2.4): critic warm-up, joint PPO updates, in-training eval, checkpoints.

See `terminal_rsi.rpr.phase` and docs/rpr.md. Importing this package is light; the phase
imports JAX-side modules when it runs.
"""

from terminal_rsi.rpr.phase import SCHEMA, PhaseError, PhaseResult, run, run_phase

__all__ = ["SCHEMA", "PhaseError", "PhaseResult", "run", "run_phase"]
