"""Pretrained weights: Hugging Face safetensors (LLaMA/Qwen family) and GGUF checkpoints.

Both loaders produce our parameter layout (pure dict, see `transformer.py`):

    HF name                                   HF shape      ours                      shape
    model.embed_tokens.weight                 [V, D]        backbone.embed            [V, D]
    model.layers.{i}.input_layernorm.weight   [D]           layers[i].attn_norm.weight
    ...self_attn.q_proj.weight                [H·hd, D]     layers[i].attn.q          [D, H, hd]
    ...self_attn.{k,v}_proj.weight            [K·hd, D]     layers[i].attn.{k,v}      [D, K, hd]
    ...self_attn.{q,k,v}_proj.bias (Qwen2)    [N·hd]        layers[i].attn.{q,k,v}_bias [N, hd]
    ...self_attn.{q,k}_norm.weight (Qwen3)    [hd]          layers[i].attn.{q,k}_norm.weight
    ...self_attn.o_proj.weight                [D, H·hd]     layers[i].attn.o          [H, hd, D]
    ...post_attention_layernorm.weight        [D]           layers[i].mlp_norm.weight
    ...mlp.{gate,up}_proj.weight              [F, D]        layers[i].mlp.{gate,up}   [D, F]
    ...mlp.down_proj.weight                   [D, F]        layers[i].mlp.down        [F, D]
    model.norm.weight                         [D]           backbone.final_norm.weight
    lm_head.weight (absent when tied)         [V, D]        lm_head                   [D, V]
    score.weight / score.bias (critic, opt.)  [1, D] / [1]  value_head.w / value_head.b

Rotary layout: HF checkpoints use the "rotate_half" layout, which is ours. GGUF files of the
`llama` architecture store Q and K rows permuted for llama.cpp's interleaved rotary
(convert_hf_to_gguf.py `permute`); `unpermute_gguf_qk` undoes it.

Loading is lazy and sharded: tensors are memory-mapped, converted one at a time, and placed
with `jax.make_array_from_callback` onto each parameter's NamedSharding, so host memory holds
about one tensor at a time and devices only their shards.

`safetensors` is parsed here directly (header + memmap; BF16 through ml_dtypes); `gguf` is
imported where used.
"""

from __future__ import annotations

import glob
import json
import os
import re
import struct
from collections.abc import Callable, Mapping
from typing import Any

import jax
import ml_dtypes
import numpy as np
from flax import nnx

from terminal_rsi.models.config import ModelConfig
from terminal_rsi.models.transformer import DecoderLM, ValueModel
from terminal_rsi.runtime import sharding as shd


class WeightLoadError(ValueError):
    """A checkpoint is missing a tensor, has a wrong shape, or has an unsupported format."""


# ----------------------------------------------------------------------------- safetensors

_ST_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16,
              "BF16": ml_dtypes.bfloat16, "I64": np.int64, "I32": np.int32, "I16": np.int16,
              "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


def read_safetensors(path: str) -> dict[str, np.ndarray]:
    """Memory-mapped arrays of one .safetensors file (or all files of a folder)."""
    if os.path.isdir(path):
        files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
        if not files:
            raise WeightLoadError(f"no *.safetensors files in {path}")
        out: dict[str, np.ndarray] = {}
        for f in files:
            out.update(read_safetensors(f))
        return out
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in _ST_DTYPES:
            raise WeightLoadError(f"{path}: tensor {name} has unsupported dtype {info['dtype']}")
        start, end = info["data_offsets"]
        raw = mm[8 + n + start:8 + n + end]
        out[name] = raw.view(_ST_DTYPES[info["dtype"]]).reshape(info["shape"])
    return out


def config_from_hf(hf_config: Mapping[str, Any] | str, **overrides) -> ModelConfig:
    """ModelConfig from a HF config.json (dict or path); llama, qwen2, qwen3 model types."""
    if isinstance(hf_config, str):
        with open(hf_config, encoding="utf-8") as f:
            hf_config = json.load(f)
    c = hf_config
    kind = c.get("model_type", "llama")
    if kind not in ("llama", "qwen2", "qwen3", "mistral"):
        raise WeightLoadError(f"model_type {kind!r} is not supported (llama, qwen2, qwen3)")
    heads = c["num_attention_heads"]
    fields = dict(
        vocab_size=c["vocab_size"], d_model=c["hidden_size"],
        n_layers=c["num_hidden_layers"], n_heads=heads,
        n_kv_heads=c.get("num_key_value_heads", heads),
        head_dim=c.get("head_dim") or c["hidden_size"] // heads,
        d_ff=c["intermediate_size"], rope_theta=float(c.get("rope_theta", 10000.0)),
        tie_embeddings=bool(c.get("tie_word_embeddings", False)),
        norm_eps=float(c.get("rms_norm_eps", 1e-6)),
        max_seq_len=int(c.get("max_position_embeddings", 2048)),
        qk_norm=kind == "qwen3", attn_bias=kind == "qwen2" or bool(c.get("attention_bias")))
    fields.update(overrides)
    return ModelConfig(**fields)


def _hf_converters(config: ModelConfig, target: str, get: Callable[[str], np.ndarray],
                   has: Callable[[str], bool]) -> dict:
    """Pure dict (our layout) of zero-argument callables returning NumPy arrays."""
    c = config
    d, h, k, hd = c.d_model, c.n_heads, c.n_kv_heads, c.head_dim

    def t(name, fn=lambda x: x):
        return lambda: fn(np.asarray(get(name)))

    layers = {}
    for i in range(c.n_layers):
        p = f"model.layers.{i}."
        attn = {
            "q": t(p + "self_attn.q_proj.weight", lambda w: w.T.reshape(d, h, hd)),
            "k": t(p + "self_attn.k_proj.weight", lambda w: w.T.reshape(d, k, hd)),
            "v": t(p + "self_attn.v_proj.weight", lambda w: w.T.reshape(d, k, hd)),
            "o": t(p + "self_attn.o_proj.weight", lambda w: w.T.reshape(h, hd, d)),
        }
        if c.attn_bias:
            attn["q_bias"] = t(p + "self_attn.q_proj.bias", lambda b: b.reshape(h, hd))
            attn["k_bias"] = t(p + "self_attn.k_proj.bias", lambda b: b.reshape(k, hd))
            attn["v_bias"] = t(p + "self_attn.v_proj.bias", lambda b: b.reshape(k, hd))
        if c.qk_norm:
            attn["q_norm"] = {"weight": t(p + "self_attn.q_norm.weight")}
            attn["k_norm"] = {"weight": t(p + "self_attn.k_norm.weight")}
        layers[i] = {
            "attn_norm": {"weight": t(p + "input_layernorm.weight")},
            "attn": attn,
            "mlp_norm": {"weight": t(p + "post_attention_layernorm.weight")},
            "mlp": {"gate": t(p + "mlp.gate_proj.weight", np.transpose),
                    "up": t(p + "mlp.up_proj.weight", np.transpose),
                    "down": t(p + "mlp.down_proj.weight", np.transpose)},
        }
    out: dict[str, Any] = {"backbone": {"embed": t("model.embed_tokens.weight"),
                                        "layers": layers,
                                        "final_norm": {"weight": t("model.norm.weight")}}}
    if target == "actor":
        if not c.tie_embeddings:
            name = "lm_head.weight" if has("lm_head.weight") else "model.embed_tokens.weight"
            out["lm_head"] = t(name, np.transpose)
    elif target == "critic":
        w = t("score.weight", lambda x: x.reshape(d)) if has("score.weight") else (
            lambda: np.zeros((d,), np.float32))
        b = t("score.bias", lambda x: x.reshape(())) if has("score.bias") else (
            lambda: np.zeros((), np.float32))
        out["value_head"] = {"w": w, "b": b}
    else:
        raise WeightLoadError(f"target {target!r} must be 'actor' or 'critic'")
    return out


def _materialize(converters: dict, model_cls, config: ModelConfig, mesh=None,
                 rules=None) -> dict:
    """Run the converters into (sharded) jax arrays with the model's shapes and dtypes."""
    _, abstract_state = shd.abstract_model(model_cls, config)
    abstract = nnx.to_pure_dict(abstract_state)
    shardings = (shd.param_shardings(model_cls, config, mesh, rules)
                 if mesh is not None else None)
    flat_conv = dict(jax.tree_util.tree_flatten_with_path(converters)[0])
    flat_abs, treedef = jax.tree_util.tree_flatten_with_path(abstract)
    flat_sh = jax.tree.leaves(shardings) if shardings is not None else [None] * len(flat_abs)
    leaves = []
    for (path, aval), sh in zip(flat_abs, flat_sh, strict=True):
        name = jax.tree_util.keystr(path)
        if path not in flat_conv:
            raise WeightLoadError(f"no source tensor for parameter {name}")
        try:
            arr = flat_conv[path]()
        except KeyError as e:
            raise WeightLoadError(f"checkpoint lacks tensor {e} (needed for {name})") from None
        if tuple(arr.shape) != tuple(aval.shape):
            raise WeightLoadError(f"parameter {name}: checkpoint gives shape {arr.shape}, the "
                                  f"model config expects {aval.shape}; check the ModelConfig")
        arr = np.asarray(arr).astype(aval.dtype)
        if sh is None:
            leaves.append(jax.numpy.asarray(arr))
        else:
            leaves.append(jax.make_array_from_callback(arr.shape, sh,
                                                       lambda idx, a=arr: a[idx]))
    return jax.tree.unflatten(jax.tree.structure(abstract), leaves)


def _model_cls(target: str):
    return {"actor": DecoderLM, "critic": ValueModel}[target]


def load_hf_params(path: str, config: ModelConfig, *, target: str = "actor", mesh=None,
                   rules=None) -> dict:
    """Params (pure dict) of a HF-layout safetensors checkpoint (file or folder).

    target: "actor" (DecoderLM) or "critic" (ValueModel: backbone from the checkpoint, value
    head from `score.*` if present, else zero). With `mesh`, arrays are created directly with
    their NamedShardings. Dtypes are cast to `config.param_dtype` (value head: float32).
    """
    tensors = read_safetensors(path)

    def get(name):
        if name not in tensors:
            raise KeyError(name)
        return tensors[name]

    conv = _hf_converters(config, target, get, lambda n: n in tensors)
    return _materialize(conv, _model_cls(target), config, mesh, rules)


# ----------------------------------------------------------------------------- GGUF


def open_gguf(path_or_reader):
    import gguf  # the GGUF reader: optional, loaded when a GGUF file is read

    if isinstance(path_or_reader, gguf.GGUFReader):
        return path_or_reader
    if not os.path.exists(path_or_reader):
        raise WeightLoadError(f"no GGUF file at {path_or_reader}")
    return gguf.GGUFReader(path_or_reader)


def gguf_metadata(reader, prefix: str = "") -> dict[str, Any]:
    """GGUF key/value metadata (strings, numbers, lists) whose key starts with `prefix`."""
    out = {}
    for key, field in reader.fields.items():
        if key.startswith(prefix):
            try:
                out[key] = field.contents()
            except Exception:  # noqa: BLE001  (exotic field types are skipped)
                continue
    return out


def config_from_gguf(path_or_reader, **overrides) -> ModelConfig:
    """ModelConfig from GGUF metadata (llama / qwen2 / qwen3 architectures)."""
    reader = open_gguf(path_or_reader)
    meta = gguf_metadata(reader)
    arch = meta["general.architecture"]
    if arch not in ("llama", "qwen2", "qwen3"):
        raise WeightLoadError(f"GGUF architecture {arch!r} is not supported")

    def m(key, default=None):
        return meta.get(f"{arch}.{key}", default)

    names = {t.name for t in reader.tensors}
    heads = m("attention.head_count")
    d = m("embedding_length")
    vocab = m("vocab_size") or len(meta["tokenizer.ggml.tokens"])
    fields = dict(
        vocab_size=int(vocab), d_model=int(d), n_layers=int(m("block_count")),
        n_heads=int(heads), n_kv_heads=int(m("attention.head_count_kv", heads)),
        head_dim=int(m("attention.key_length") or m("rope.dimension_count") or d // heads),
        d_ff=int(m("feed_forward_length")), rope_theta=float(m("rope.freq_base", 10000.0)),
        tie_embeddings="output.weight" not in names,
        norm_eps=float(m("attention.layer_norm_rms_epsilon", 1e-5)),
        max_seq_len=int(m("context_length", 2048)), qk_norm=arch == "qwen3",
        attn_bias="blk.0.attn_q.bias" in names)
    fields.update(overrides)
    return ModelConfig(**fields)


def unpermute_gguf_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Inverse of llama.cpp's `permute(w, n_head)`: rows [N·hd, ...] back to rotate_half."""
    shape = w.shape
    return w.reshape(n_heads, shape[0] // n_heads // 2, 2, *shape[1:]).swapaxes(1, 2) \
        .reshape(shape)


def permute_gguf_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's `permute` (HF rotate_half rows -> interleaved), for tests and export."""
    shape = w.shape
    return w.reshape(n_heads, 2, shape[0] // n_heads // 2, *shape[1:]).swapaxes(1, 2) \
        .reshape(shape)


def gguf_tensor(reader, name: str) -> np.ndarray:
    """Dequantized float32 tensor in row-major [rows, cols] (= HF [out, in]) order."""
    import gguf  # the GGUF reader: optional, loaded when a GGUF file is read

    for t in reader.tensors:
        if t.name == name:
            if t.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
                arr = np.asarray(t.data, dtype=np.float32)
            else:
                arr = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
            shape = tuple(int(x) for x in reversed(t.shape))
            return arr.reshape(shape)
    raise KeyError(name)


_GGUF_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_GGUF_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def _gguf_name(hf_name: str) -> str:
    if hf_name in _GGUF_NAMES:
        return _GGUF_NAMES[hf_name]
    mt = re.fullmatch(r"model\.layers\.(\d+)\.(.+)", hf_name)
    if mt and mt.group(2) in _GGUF_LAYER:
        return f"blk.{mt.group(1)}.{_GGUF_LAYER[mt.group(2)]}"
    raise KeyError(hf_name)


def load_gguf_params(path_or_reader, config: ModelConfig | None = None, *,
                     target: str = "actor", mesh=None, rules=None) -> tuple[ModelConfig, dict]:
    """(config, params) from a GGUF checkpoint; quantized tensors are dequantized (gguf).

    For the `llama` architecture, Q/K rows are un-permuted back to the rotate_half layout.
    """
    reader = open_gguf(path_or_reader)
    config = config or config_from_gguf(reader)
    arch = gguf_metadata(reader, "general.architecture")["general.architecture"]
    names = {t.name for t in reader.tensors}

    def get(hf_name):
        w = gguf_tensor(reader, _gguf_name(hf_name))
        if arch == "llama" and hf_name.endswith("q_proj.weight"):
            w = unpermute_gguf_qk(w, config.n_heads)
        elif arch == "llama" and hf_name.endswith("k_proj.weight"):
            w = unpermute_gguf_qk(w, config.n_kv_heads)
        return w

    def has(hf_name):
        try:
            return _gguf_name(hf_name) in names
        except KeyError:
            return False

    conv = _hf_converters(config, target, get, has)
    return config, _materialize(conv, _model_cls(target), config, mesh, rules)
