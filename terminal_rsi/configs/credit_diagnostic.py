"""TB-GAE component diagnostic (paper/component_review.md): CPU, seconds.

python experiments/run.py --config=configs/credit_diagnostic.py --workdir=runs/credit_diagnostic

Every setting, its default and what it allows: terminal_rsi/experiments/credit_diagnostic.py
(CreditDiagnosticConfig); the defaults are the diagnostic's.
"""

import ml_collections

from terminal_rsi.config.configuration import config_dict
from terminal_rsi.experiments.credit_diagnostic import CreditDiagnosticConfig


def get_config() -> ml_collections.ConfigDict:
    return config_dict(CreditDiagnosticConfig, "credit_diagnostic")
