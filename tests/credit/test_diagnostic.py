"""The TB-GAE component diagnostic: its measurements and its config's checks."""

import jax
import numpy as np
import pytest

from configs.credit_diagnostic import get_config
from terminal_rsi.config.configuration import ConfigError, build
from terminal_rsi.credit.diagnostic import check_seed, mean_over_seeds
from terminal_rsi.experiments.credit_diagnostic import CreditDiagnosticConfig


def test_one_seed_matches_the_double_sum_and_the_control_differs():
    with jax.enable_x64(True):
        row = check_seed(42, method="scan", dtype=np.float64, num_generated=12, num_turns=3,
                         num_observations=10, split_at=5, gamma_turn=0.9, lambda_turn=0.8,
                         terminal_reward=1.0)
    assert row["reference_error"] < 1e-9 and row["insertion_error"] < 1e-9
    assert row["continuation_error"] < 1e-9 and row["negative_control_error"] > 1e-6
    means = mean_over_seeds([row, {**row, "reference_error": 1.0}], ("scan",))
    assert means["scan"]["reference_error"] == pytest.approx((row["reference_error"] + 1) / 2)


@pytest.mark.parametrize("field, value, message", [
    ("num_turns", 21, "num_turns = 21 must be <= num_generated (20)"),
    ("split_at", 20, "split_at = 20 must be < num_generated (20)"),
    ("methods", ("scan", "fast"), "config.methods = ('scan', 'fast') is not allowed: unknown"),
])
def test_the_config_checks_its_fields(field, value, message):
    config = get_config()
    config[field] = value
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build(CreditDiagnosticConfig, config)
