"""Credit assignment: TB-GAE (paper §2.3) and per-token GAE with observation skipping."""

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
    "Carry",
    "bootstrap_carry",
    "empty_carry",
    "gae",
    "tb_gae",
    "tb_gae_checked",
    "validate_tb_gae_inputs",
]
