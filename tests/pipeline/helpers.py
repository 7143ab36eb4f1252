"""Shared pieces of the pipeline tests."""

import os

from terminal_rsi.config.configuration import validate_config
from terminal_rsi.configs.rpr2_spr import get_config
from terminal_rsi.pipeline.config import SCHEMA, resolved


def small_config(**fields):
    """configs/rpr2_spr.py at the `test` scale with target rpr1_fdr, validated and resolved;
    `fields` set top-level config fields first (e.g. model="smollm2_135m")."""
    c = get_config()
    c.scale = "test"
    for k, v in fields.items():
        setattr(c, k, v)
    c.pipeline.targets = ("rpr1_fdr",)
    validate_config(c, SCHEMA)
    return resolved(c)


def trained_export(run_dir: str, stage: str) -> str:
    """The export dir holding what `stage` trained: `<stage>/rejected` when model selection
    handed its inputs on instead, else `<stage>/export`."""
    rejected = os.path.join(run_dir, stage, "rejected")
    return rejected if os.path.isdir(rejected) else os.path.join(run_dir, stage, "export")
