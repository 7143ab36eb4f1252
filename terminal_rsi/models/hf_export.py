"""Export a trained actor as a Hugging Face model directory, for the engines users serve with.

    path = export_hf(directory, params, mcfg, tokenizer)     # actor params (pure dict)

writes, atomically (a temporary sibling folder renamed into place):

    config.json                     LlamaForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM
    generation_config.json          bos / eos / pad ids; eos lists every stop token
    model.safetensors               or model-0000i-of-0000N.safetensors + .index.json
    tokenizer.json                  the `tokenizers` pipeline the run used
    tokenizer_config.json           special tokens, the chat template, add_bos_token
    special_tokens_map.json

The tensor layout is the inverse of `weights.load_hf_params` (the table in `weights`): what
this writes, `weights.load_hf_params` + `weights.config_from_hf` + `HFTokenizer.from_file` read
back into the same params, shape and tokenizer, so the logits are identical (the `model.hf`
source does all three: `terminal_rsi.models.loading`). The architecture follows the shape:
QK-norm is Qwen3, q/k/v biases without it Qwen2, otherwise LLaMA. LoRA adapters are merged
into their matrices (`terminal_rsi.models.lora.merge_adapters`).

Only models with a Hugging Face tokenizer (`HFTokenizer`: a GGUF's or a tokenizer.json's)
export: the byte-level tokenizer of the tiny preset has no tokenizer.json form, and
`ExportError` says so. Arrays sharded over several processes are gathered; only process 0
writes.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from typing import Any

import jax
import ml_dtypes
import numpy as np

from terminal_rsi.models.config import ModelConfig
from terminal_rsi.models.lora import merge_adapters
from terminal_rsi.models.tokenizer import HFTokenizer
from terminal_rsi.models.trainable import has_adapters

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM"}
DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
MAX_SHARD_BYTES = 5 * 2**30  # Hugging Face's default shard size (5 GB)


class ExportError(ValueError):
    """The model cannot be written as a Hugging Face directory (what, and how to fix it)."""


def model_type(mcfg: ModelConfig) -> str:
    """The HF model_type of a shape: QK-norm → qwen3, q/k/v biases → qwen2, else llama."""
    if mcfg.qk_norm:
        return "qwen3"
    return "qwen2" if mcfg.attn_bias else "llama"


def _host(x) -> np.ndarray:
    """A (possibly sharded, possibly multi-process) array as one host NumPy array."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        from jax.experimental import multihost_utils  # only for multi-process arrays

        x = multihost_utils.process_allgather(x, tiled=True)
    return np.asarray(x)


def hf_tensors(params: Mapping[str, Any], mcfg: ModelConfig, dtype=np.float32) -> dict:
    """HF-named [out, in] tensors of actor params (the inverse of `weights._hf_converters`)."""
    c = mcfg
    d, h, k, hd = c.d_model, c.n_heads, c.n_kv_heads, c.head_dim
    bb = params["backbone"]

    def a(x, fn=lambda y: y):
        return np.ascontiguousarray(fn(_host(x).astype(np.float32))).astype(dtype)

    out = {"model.embed_tokens.weight": a(bb["embed"]),
           "model.norm.weight": a(bb["final_norm"]["weight"])}
    for i in range(c.n_layers):
        layer, p = bb["layers"][i], f"model.layers.{i}."
        attn = layer["attn"]
        out[p + "input_layernorm.weight"] = a(layer["attn_norm"]["weight"])
        out[p + "post_attention_layernorm.weight"] = a(layer["mlp_norm"]["weight"])
        out[p + "self_attn.q_proj.weight"] = a(attn["q"], lambda w: w.reshape(d, h * hd).T)
        out[p + "self_attn.k_proj.weight"] = a(attn["k"], lambda w: w.reshape(d, k * hd).T)
        out[p + "self_attn.v_proj.weight"] = a(attn["v"], lambda w: w.reshape(d, k * hd).T)
        out[p + "self_attn.o_proj.weight"] = a(attn["o"], lambda w: w.reshape(h * hd, d).T)
        if c.attn_bias:
            for n in ("q", "k", "v"):
                out[p + f"self_attn.{n}_proj.bias"] = a(attn[f"{n}_bias"], np.ravel)
        if c.qk_norm:
            out[p + "self_attn.q_norm.weight"] = a(attn["q_norm"]["weight"])
            out[p + "self_attn.k_norm.weight"] = a(attn["k_norm"]["weight"])
        for n in ("gate", "up", "down"):
            out[p + f"mlp.{n}_proj.weight"] = a(layer["mlp"][n], np.transpose)
    if not c.tie_embeddings:
        out["lm_head.weight"] = a(params["lm_head"], np.transpose)
    return out


def hf_config(mcfg: ModelConfig, tokenizer: HFTokenizer, dtype: str) -> dict:
    """config.json of the actor (the fields `weights.config_from_hf` and transformers read)."""
    kind = model_type(mcfg)
    return {
        "architectures": [ARCHITECTURES[kind]], "model_type": kind,
        "vocab_size": mcfg.vocab_size, "hidden_size": mcfg.d_model,
        "intermediate_size": mcfg.d_ff, "num_hidden_layers": mcfg.n_layers,
        "num_attention_heads": mcfg.n_heads, "num_key_value_heads": mcfg.n_kv_heads,
        "head_dim": mcfg.head_dim, "hidden_act": "silu",
        "max_position_embeddings": mcfg.max_seq_len, "rms_norm_eps": mcfg.norm_eps,
        "rope_theta": mcfg.rope_theta, "rope_scaling": None,
        "tie_word_embeddings": mcfg.tie_embeddings, "attention_bias": mcfg.attn_bias,
        "attention_dropout": 0.0, "mlp_bias": False, "initializer_range": 0.02,
        "use_cache": True, "torch_dtype": dtype,
        "bos_token_id": tokenizer.bos_id, "eos_token_id": tokenizer.eos_id,
        "pad_token_id": tokenizer.pad_id,
    }


def tokenizer_files(tokenizer: HFTokenizer, max_len: int) -> dict[str, dict | str]:
    """tokenizer.json (text), tokenizer_config.json, special_tokens_map.json and
    generation_config.json (dicts) of an HFTokenizer, so `HFTokenizer.from_file` and
    transformers' PreTrainedTokenizerFast rebuild it: same ids, template and stop tokens."""
    tok = tokenizer.tok
    special = {i: t for i, t in sorted(tok.get_added_tokens_decoder().items())}
    names = {"bos_token": tokenizer.bos_token, "eos_token": tokenizer.eos_token,
             "pad_token": tok.id_to_token(tokenizer.pad_id)}
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", **names,
           "chat_template": tokenizer.chat_template, "add_bos_token": tokenizer.add_bos,
           "add_eos_token": False, "clean_up_tokenization_spaces": False,
           "model_max_length": max_len,
           "added_tokens_decoder": {str(i): {"content": t.content, "special": t.special,
                                             "lstrip": t.lstrip, "rstrip": t.rstrip,
                                             "normalized": t.normalized,
                                             "single_word": t.single_word}
                                    for i, t in special.items()}}
    stops = list(tokenizer.stop_ids)
    gen = {"bos_token_id": tokenizer.bos_id, "pad_token_id": tokenizer.pad_id,
           "eos_token_id": stops if len(stops) > 1 else stops[0]}
    return {"tokenizer.json": tok.to_str(), "tokenizer_config.json": cfg,
            "special_tokens_map.json": {k: v for k, v in names.items() if v is not None},
            "generation_config.json": gen}


def write_tokenizer(folder: str, tokenizer: HFTokenizer, max_len: int) -> None:
    """The four tokenizer files of `tokenizer_files` in `folder`."""
    for name, content in tokenizer_files(tokenizer, max_len).items():
        if isinstance(content, str):
            with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
                f.write(content)
        else:
            _write_json(os.path.join(folder, name), content)


def _shards(tensors: Mapping[str, np.ndarray], max_bytes: int) -> list[dict]:
    """Tensors grouped in name order into files of at most `max_bytes` (one tensor may be
    larger than that: it gets a file of its own)."""
    out, size = [{}], 0
    for name in sorted(tensors):
        n = tensors[name].nbytes
        if out[-1] and size + n > max_bytes:
            out.append({})
            size = 0
        out[-1][name] = tensors[name]
        size += n
    return out


def write_weights(folder: str, tensors: Mapping[str, np.ndarray], max_shard_bytes: int) -> None:
    """model.safetensors, or N shards and model.safetensors.index.json (HF's layout)."""
    from safetensors.numpy import save_file  # the format's own writer

    shards = _shards(tensors, max_shard_bytes)
    meta = {"format": "pt"}  # what transformers expects of a PyTorch-loadable file
    if len(shards) == 1:
        save_file(shards[0], os.path.join(folder, "model.safetensors"), metadata=meta)
        return
    index = {"metadata": {"total_size": int(sum(t.nbytes for t in tensors.values()))},
             "weight_map": {}}
    for i, shard in enumerate(shards, 1):
        fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, os.path.join(folder, fname), metadata=meta)
        index["weight_map"].update(dict.fromkeys(shard, fname))
    _write_json(os.path.join(folder, "model.safetensors.index.json"), index)


def _write_json(path: str, obj: Any) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def export_hf(directory: str | os.PathLike, params: Mapping[str, Any], mcfg: ModelConfig,
              tokenizer, *, dtype: str = "float32", force: bool = False,
              max_shard_bytes: int = MAX_SHARD_BYTES) -> str:
    """Write actor `params` of shape `mcfg` with `tokenizer` as a Hugging Face model directory
    (module doc) at `directory`; `dtype` of the stored weights ("float32", "bfloat16",
    "float16"); `force` replaces an existing directory. Returns its absolute path."""
    path = os.path.abspath(os.fspath(directory))
    if not isinstance(tokenizer, HFTokenizer):
        raise ExportError(
            f"{type(tokenizer).__name__} has no Hugging Face tokenizer form; export a model "
            "run with model.gguf or model.hf (the byte-level tiny preset cannot be exported)")
    if dtype not in DTYPES:
        raise ExportError(f"dtype {dtype!r}; choose one of {sorted(DTYPES)}")
    if os.path.exists(path) and not force:
        raise ExportError(f"{path} exists; remove it or pass force=True to replace it")
    if has_adapters(params):  # serving engines read plain weights: fold the adapters in
        params, mcfg = merge_adapters(params, mcfg), mcfg.without_lora()
    tensors = hf_tensors(params, mcfg, DTYPES[dtype])
    if jax.process_index() != 0:
        return path
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.", dir=parent)
    try:
        write_weights(tmp, tensors, max_shard_bytes)
        _write_json(os.path.join(tmp, "config.json"), hf_config(mcfg, tokenizer, dtype))
        write_tokenizer(tmp, tokenizer, mcfg.max_seq_len)
        _swap_in(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def _swap_in(tmp: str, path: str) -> None:
    """Rename the finished folder `tmp` to `path`; an old `path` is removed only after."""
    for f in os.listdir(tmp):  # flush every file before the rename makes them visible
        fd = os.open(os.path.join(tmp, f), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    old = None
    if os.path.exists(path):
        old = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.old.",
                               dir=os.path.dirname(path))
        os.rmdir(old)
        os.rename(path, old)
    os.rename(tmp, path)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
