"""LoRA adapters (terminal_rsi.models.lora): the forward pass against the independent NumPy
reference with W + (α/r)·a·b written out there, merge, parameter count, which leaves train,
gradient steps that leave the frozen weights bit-identical, optimizer state of the adapters
alone, loading (fresh adapters on pretrained or adapter-free weights, handoffs that keep
them) and the HF export that folds them in."""

import json
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from terminal_rsi.config.sections import ModelSource
from terminal_rsi.models import hf_export, loading, lora, weights
from terminal_rsi.models import trainable as tr
from terminal_rsi.models.config import LORA_TARGETS, ModelConfig, ModelConfigError
from terminal_rsi.models.tokenizer import HFTokenizer
from terminal_rsi.models.transformer import DecoderLM, ValueModel, critic_params_from_actor
from terminal_rsi.runtime import sharding as shd
from terminal_rsi.runtime.exports import export_weights
from terminal_rsi.settings import SettingError
from terminal_rsi.training import train_state as ts
from terminal_rsi.training.grad_accum import accumulate_gradients
from terminal_rsi.training.losses import LossParts

from .reference import CHAT_TEMPLATE, numpy_logits, random_hf_weights, train_bpe, write_tiny_gguf

pytestmark = pytest.mark.xdist_group("model_weights")

BASE = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8,
                   d_ff=48, rope_theta=10000.0, max_seq_len=64)
LORA = BASE.replace(lora_rank=4, lora_alpha=8.0)
TOKENS = np.array([3, 17, 5, 60, 1, 9, 22, 40])
HF_NAMES = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj",
            "o": "self_attn.o_proj", "gate": "mlp.gate_proj", "up": "mlp.up_proj",
            "down": "mlp.down_proj"}


def _graphdef(cls, cfg):
    return shd.abstract_model(cls, cfg)[0]


def _logits(cfg, params, tokens=TOKENS, jit=False):
    def f(p, t):
        return nnx.merge(_graphdef(DecoderLM, cfg), p)(t)[0]

    return np.asarray((jax.jit(f) if jit else f)(params, jnp.asarray(tokens)[None])[0])


def _random_b(params, seed=0, std=0.3):
    """Adapters with non-zero b (a fresh adapter is the identity: b = 0)."""
    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_map_with_path(
        lambda p, x: jnp.asarray(rng.standard_normal(x.shape) * std, x.dtype)
        if tr.is_adapter(p) and p[-1].key == "b" else x, params)


@pytest.fixture(scope="module")
def hf_base(tmp_path_factory):
    from safetensors.numpy import save_file

    folder = tmp_path_factory.mktemp("hf")
    w = random_hf_weights(BASE, seed=4)
    save_file(w, str(folder / "model.safetensors"))
    return w, weights.load_hf_params(str(folder), BASE)


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("targets", [LORA_TARGETS, ("q", "v"), ("o", "down")])
def test_forward_matches_the_reference_with_w_plus_scaled_ab(hf_base, jit, targets):
    w, base = hf_base
    cfg = LORA.replace(lora_targets=targets)
    params = _random_b(lora.add_adapters(base, cfg, seed=1))
    s = cfg.lora_alpha / cfg.lora_rank
    ref_w = dict(w)
    for i, layer in params["backbone"]["layers"].items():
        for module in ("attn", "mlp"):
            for name, ad in layer[module].get("lora", {}).items():
                key = f"model.layers.{i}.{HF_NAMES[name]}.weight"  # HF [out, in]
                ref_w[key] = w[key] + s * (np.asarray(ad["a"]) @ np.asarray(ad["b"])).T
    assert sum(len(layer[m].get("lora", {})) for layer in params["backbone"]["layers"].values()
               for m in ("attn", "mlp")) == BASE.n_layers * len(targets)
    np.testing.assert_allclose(_logits(cfg, params, jit=jit), numpy_logits(ref_w, BASE, TOKENS),
                               atol=2e-4)


def test_fresh_adapters_change_nothing_and_merge_is_the_same_function(hf_base):
    _, base = hf_base
    params = lora.add_adapters(base, LORA, seed=0)
    np.testing.assert_array_equal(_logits(LORA, params), _logits(BASE, base))
    tuned = _random_b(params)
    merged = lora.merge_adapters(tuned, LORA)
    assert not tr.has_adapters(merged) and tr.has_adapters(tuned)
    np.testing.assert_allclose(_logits(BASE, merged), _logits(LORA, tuned), atol=1e-4)
    assert lora.merge_adapters(base, BASE) == dict(base)  # nothing to merge
    assert lora.add_adapters(tuned, LORA, seed=5) == dict(tuned)  # already adapted


def test_parameter_count_and_module_init():
    for cfg in (LORA, LORA.replace(lora_targets=("k",)), LORA.replace(attn_bias=True,
                                                                        qk_norm=True)):
        params = nnx.to_pure_dict(nnx.split(DecoderLM(cfg, rngs=nnx.Rngs(0)))[1])
        assert sum(x.size for x in jax.tree.leaves(params)) == cfg.num_params()
        a = params["backbone"]["layers"][0]["attn"]["lora"][cfg.lora_targets[0]]
        assert a["a"].dtype == jnp.float32 and not np.any(np.asarray(a["b"]))
        assert np.abs(a["a"]).max() <= cfg.d_model ** -0.5
    assert LORA.num_params() - BASE.num_params() == 2 * 4 * (
        (32 + 32) * 2 + (32 + 16) * 2 + 3 * (32 + 48))
    for bad in ({"lora_rank": -1}, {"lora_alpha": 0.0}, {"lora_targets": ("q", "x")},
                {"lora_rank": 2, "lora_targets": ()}):
        with pytest.raises(ModelConfigError, match="lora"):
            BASE.replace(**bad)


def test_only_adapters_and_the_value_head_train():
    actor = nnx.to_pure_dict(nnx.split(DecoderLM(LORA, rngs=nnx.Rngs(0)))[1])
    critic = critic_params_from_actor(actor)
    for params in (actor, critic):
        trainable, frozen = tr.split_trainable(params)
        names = {jax.tree_util.keystr(p) for p, x in
                 jax.tree_util.tree_leaves_with_path(trainable)}
        assert names and all("'lora'" in n or "'value_head'" in n for n in names)
        assert len(names) + len(jax.tree.leaves(frozen)) == len(jax.tree.leaves(params))
        assert jax.tree.structure(tr.join(trainable, frozen)) == jax.tree.structure(params)
    assert any("value_head" in jax.tree_util.keystr(p) for p, _ in
               jax.tree_util.tree_leaves_with_path(tr.split_trainable(critic)[0]))
    plain = nnx.to_pure_dict(nnx.split(DecoderLM(BASE, rngs=nnx.Rngs(0)))[1])
    trainable, frozen = tr.split_trainable(plain)  # no adapters: full fine-tuning
    assert jax.tree.leaves(frozen) == [] and len(jax.tree.leaves(trainable)) == len(
        jax.tree.leaves(plain))


def _batch(seed=0, b=4, length=8):
    rng = np.random.default_rng(seed)
    tok = rng.integers(0, BASE.vocab_size, (b, length + 1)).astype(np.int32)
    seg = np.ones((b, length), np.int32)
    return {"tokens": tok[:, :-1], "targets": tok[:, 1:], "segment_ids": seg,
            "positions": np.broadcast_to(np.arange(length, dtype=np.int32), (b, length)),
            "loss_mask": seg.astype(np.float32),
            "returns": rng.standard_normal((b, length)).astype(np.float32)}


@pytest.mark.parametrize("cls,loss", [(DecoderLM, ts.lm_loss),
                                      (ValueModel, ts.value_regression_loss)])
def test_training_moves_the_adapters_alone(cls, loss):
    state = ts.create_train_state(cls, LORA, ts.OptimizerConfig(learning_rate=1e-2), seed=3)
    before = jax.tree.map(np.array, state.params)
    opt_leaves = [x for x in jax.tree.leaves(state.opt_state) if x.dtype == jnp.float32]
    n_train = sum(x.size for x in jax.tree.leaves(tr.split_trainable(before)[0]))
    assert sum(x.size for x in opt_leaves) == 2 * n_train  # Adam's μ and ν, adapters only
    step = ts.make_update_step(loss, state)
    batch = _batch()
    losses = []
    for _ in range(5):
        state, m = step(state, batch)
        losses.append(float(m["loss"]))
    assert losses[-1] < losses[0]
    after = jax.tree.map(np.array, state.params)
    for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(before), jax.tree.leaves(after),
                            strict=True):
        trained = tr.is_adapter(path) or "value_head" in jax.tree_util.keystr(path)
        if not trained:
            np.testing.assert_array_equal(x, y, err_msg=jax.tree_util.keystr(path))
    moved = [p for p, x in jax.tree_util.tree_leaves_with_path(before)
             if tr.is_adapter(p) and p[-1].key == "b"]
    assert moved and all(np.any(lora_leaf(after, p)) for p in moved)


def lora_leaf(tree, path):
    for k in path:
        tree = tree[k.key]
    return tree


@pytest.mark.parametrize("jit", [False, True])
def test_adapter_gradients_equal_those_of_the_full_tree(jit):
    params = _random_b(nnx.to_pure_dict(nnx.split(DecoderLM(LORA, rngs=nnx.Rngs(1)))[1]))
    graphdef, batch = _graphdef(DecoderLM, LORA), _batch(seed=2)

    def parts_fn(p, mb):
        loss, _ = ts.lm_loss(p, graphdef, mb)
        n = jnp.sum(mb["loss_mask"])
        return LossParts(loss * n, n, {})

    acc = jax.jit(accumulate_gradients, static_argnums=(0, 3)) if jit else accumulate_gradients
    grads, _ = acc(parts_fn, params, batch, 1)
    grads2, _ = acc(parts_fn, params, batch, 2)  # microbatches: the same gradient
    full = jax.grad(lambda p: ts.lm_loss(p, graphdef, batch)[0])(params)
    want = tr.split_trainable(full)[0]
    assert jax.tree.structure(grads) == jax.tree.structure(want)
    for g, g2, w in zip(jax.tree.leaves(grads), jax.tree.leaves(grads2), jax.tree.leaves(want),
                        strict=True):
        # float32 sums in another order (jit fusion, microbatches): 1e-6 apart
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(g2, w, rtol=1e-4, atol=1e-6)


def _config(gguf, lora_rank=4, actor_weights=None):
    m = {"preset": "tiny", "gguf": gguf, "max_seq_len": None, "lora_rank": lora_rank,
         "lora_alpha": 8.0, "lora_targets": ("q", "v", "down")}
    return ml_collections.ConfigDict({"seed": 0, "model": m,
                                      "init": {"actor_weights": actor_weights}})


def test_loading_adds_adapters_and_handoffs_keep_them(tmp_path):
    pytest.importorskip("gguf")
    path = str(tmp_path / "tiny.gguf")
    write_tiny_gguf(path, seed=2)
    plain = loading.load_model(_config(path, lora_rank=0), params=True)
    m = loading.load_model(_config(path), params=True)
    assert m.config == plain.config.replace(lora_rank=4, lora_alpha=8.0,
                                            lora_targets=("q", "v", "down"))
    assert tr.has_adapters(m.params) and not tr.has_adapters(plain.params)
    tokens = np.arange(12) % plain.config.vocab_size
    np.testing.assert_array_equal(_logits(m.config, m.params, tokens),
                                  _logits(plain.config, plain.params, tokens))
    # a handoff written with adapters comes back as it was
    tuned = _random_b(m.params)
    export_weights(str(tmp_path / "lora"), "actor", tuned)
    back = loading.load_model(_config(path, actor_weights=str(tmp_path / "lora")), params=True)
    assert jax.tree.all(jax.tree.map(np.array_equal, back.params, tuned))
    # a handoff without adapters (a full fine-tune before) gets fresh ones on top
    export_weights(str(tmp_path / "plain"), "actor", plain.params)
    back = loading.load_model(_config(path, actor_weights=str(tmp_path / "plain")), params=True)
    assert tr.has_adapters(back.params)
    np.testing.assert_array_equal(_logits(back.config, back.params, tokens),
                                  _logits(plain.config, plain.params, tokens))
    critic = loading.import_params(str(tmp_path / "lora"), "actor", m.config)
    assert jax.tree.structure(critic) == jax.tree.structure(tuned)


def test_hf_export_folds_the_adapters_in(tmp_path, hf_base):
    _, base = hf_base
    tok = HFTokenizer(train_bpe(), chat_template=CHAT_TEMPLATE, eos_token="<|im_end|>")
    cfg = LORA.replace(vocab_size=tok.vocab_size)
    big = dict(base)  # widen the embedding to the BPE's vocabulary
    big["backbone"] = {**base["backbone"], "embed": jnp.resize(base["backbone"]["embed"],
                                                               (tok.vocab_size, 32))}
    big["lm_head"] = jnp.resize(base["lm_head"], (32, tok.vocab_size))
    tuned = _random_b(lora.add_adapters(big, cfg, seed=3))
    out = hf_export.export_hf(tmp_path / "hf", tuned, cfg, tok)
    assert "lora" not in open(os.path.join(out, "model.safetensors"), "rb").read(4096).decode(
        "latin-1")
    assert "lora" not in json.dumps(json.load(open(os.path.join(out, "config.json"))))
    back = loading.load_model(ml_collections.ConfigDict(
        {"seed": 0, "model": {"preset": "tiny", "hf": out}, "init": {}}), params=True)
    assert back.config == cfg.without_lora()
    tokens = np.arange(10)
    np.testing.assert_allclose(_logits(back.config, back.params, tokens),
                               _logits(cfg, tuned, tokens), atol=1e-4)


def test_lora_settings_are_checked_where_they_are_set():
    assert ModelSource().lora_rank == 0 and ModelSource().lora_targets == LORA_TARGETS
    with pytest.raises(SettingError, match="lora_targets"):
        ModelSource(lora_targets=("q", "attn"))
    with pytest.raises(SettingError, match="lora_rank"):
        ModelSource(lora_rank=-2)


def test_the_sampler_runs_merged_weights_and_matches_the_adapted_model(hf_base):
    from terminal_rsi.agent.harness import SamplerPolicy
    from terminal_rsi.models.sampling import Sampler

    _, base = hf_base
    tuned = _random_b(lora.add_adapters(base, LORA, seed=2))
    sampler = Sampler(_graphdef(DecoderLM, LORA), LORA, decode_block=4)
    assert not tr.has_adapters(sampler.serving_params(tuned))
    prompt = [3, 17, 5, 60]
    out = sampler.sample(tuned, [prompt], jax.random.key(0), max_new_tokens=6)[0]  # T = 1
    seq = prompt + [int(t) for t in out.token_ids]
    logits = _logits(LORA, tuned, np.asarray(seq))  # the adapted model, adapters unmerged
    logp = jax.nn.log_softmax(logits, axis=-1)
    for i, t in enumerate(out.token_ids):
        row = len(prompt) - 1 + i
        np.testing.assert_allclose(float(out.logprobs[i]), float(logp[row, t]), atol=1e-4)
    policy = SamplerPolicy(sampler, tuned, tokenizer=None, seed=0)
    assert policy.params is tuned  # what the trainer handed over; it samples the merge
