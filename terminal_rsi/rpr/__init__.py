"""RPR phase loop (§2.4): critic warm-up, joint PPO updates, in-training eval, checkpoints.

See `terminal_rsi.rpr.phase`, its typed config `terminal_rsi.rpr.config.PhaseConfig`, and
docs/rpr.md.
"""

from terminal_rsi.rpr.config import PhaseConfig
from terminal_rsi.rpr.phase import PhaseResult, run, run_phase
from terminal_rsi.rpr.steps import PhaseError

__all__ = ["PhaseConfig", "PhaseError", "PhaseResult", "run", "run_phase"]
