"""Credit assignment: TB-GAE (paper §2.3) and per-token GAE with observation skipping, and the
estimators by name (`ESTIMATORS`: `TurnBoundaryGAE`, `TokenGAE`)."""

from terminal_rsi.credit.estimators import (
    ESTIMATORS,
    REWARD_TO_GO,
    AdvantageEstimator,
    TokenGAE,
    TurnBoundaryGAE,
)
from terminal_rsi.credit.turn_boundary_gae import (
    Carry,
    bootstrap_carry,
    empty_carry,
    gae,
    tb_gae,
    tb_gae_checked,
    validate_tb_gae_inputs,
)

__all__ = [
    "ESTIMATORS",
    "REWARD_TO_GO",
    "AdvantageEstimator",
    "Carry",
    "TokenGAE",
    "TurnBoundaryGAE",
    "bootstrap_carry",
    "empty_carry",
    "gae",
    "tb_gae",
    "tb_gae_checked",
    "validate_tb_gae_inputs",
]
