"""Transformer pieces vs NumPy references; packing, padding and KV cache exactness."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized
from flax import nnx

from terminal_rsi.models import transformer as tf
from terminal_rsi.models.config import ModelConfig, ModelConfigError, get_model_config
from terminal_rsi.models.weights import _hf_converters, _materialize

from .reference import _rope, numpy_hidden, numpy_logits, random_hf_weights

CFG = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8,
                  d_ff=48, rope_theta=10000.0, max_seq_len=64)


def model_from_hf(w, cfg, cls=tf.DecoderLM, target="actor"):
    conv = _hf_converters(cfg, target, lambda n: w[n], lambda n: n in w)
    params = _materialize(conv, cls, cfg)
    graphdef = nnx.graphdef(nnx.eval_shape(lambda: cls(cfg, rngs=nnx.Rngs(0))))
    return nnx.merge(graphdef, params)


class PureFunctionsTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_rms_norm(self):
        x = np.random.default_rng(0).standard_normal((3, 5, 16)).astype(np.float32)
        wt = np.linspace(0.5, 1.5, 16).astype(np.float32)
        got = self.variant(lambda a, b: tf.rms_norm(a, b, 1e-5))(x, wt)
        want = x / np.sqrt((x ** 2).mean(-1, keepdims=True) + 1e-5) * wt
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_rotary_matches_rotate_half_formula(self):
        rng = np.random.default_rng(1)
        x = rng.standard_normal((2, 6, 3, 8)).astype(np.float32)
        pos = rng.integers(0, 50, (2, 6)).astype(np.int32)
        got = self.variant(lambda a, p: tf.rotary_embedding(a, p, 500.0))(x, pos)
        want = np.stack([_rope(x[b].astype(np.float64), pos[b].astype(np.float64), 500.0)
                         for b in range(2)])
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)

    @chex.variants(with_jit=True, without_jit=True)
    def test_gqa_attention_matches_loop(self):
        rng = np.random.default_rng(2)
        b, lq, s, h, k, hd = 2, 3, 5, 4, 2, 4
        q = rng.standard_normal((b, lq, h, hd)).astype(np.float32)
        kk = rng.standard_normal((b, s, k, hd)).astype(np.float32)
        vv = rng.standard_normal((b, s, k, hd)).astype(np.float32)
        mask = rng.random((b, lq, s)) < 0.6
        mask[..., 0] = True
        got = self.variant(tf.dot_product_attention)(q, kk, vv, mask)
        want = np.zeros((b, lq, h, hd))
        for bi in range(b):
            for i in range(lq):
                for hh in range(h):
                    kv = hh // (h // k)
                    sc = np.array([q[bi, i, hh] @ kk[bi, j, kv] / 2.0 if mask[bi, i, j]
                                   else -np.inf for j in range(s)])
                    p = np.exp(sc - sc.max())
                    p /= p.sum()
                    want[bi, i, hh] = p @ vv[bi, :, kv]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

    def test_segment_causal_mask(self):
        seg = jnp.array([[1, 1, 2, 2, 0]])
        m = np.asarray(tf.segment_causal_mask(seg))[0]
        want = np.array([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 1, 1, 0],
                         [0, 0, 0, 0, 0]], bool)
        np.testing.assert_array_equal(m, want)


class ModelTest(chex.TestCase):
    def test_logits_match_numpy_forward(self):
        w = random_hf_weights(CFG, seed=1)
        model = model_from_hf(w, CFG)
        toks = np.array([3, 17, 5, 60, 1, 9, 22])
        logits, cache = jax.jit(lambda t: model(t))(toks[None])
        assert cache is None and logits.dtype == jnp.float32
        np.testing.assert_allclose(logits[0], numpy_logits(w, CFG, toks), rtol=1e-4, atol=1e-4)

    def test_packed_and_padded_rows_are_exact(self):
        w = random_hf_weights(CFG, seed=1)
        model = model_from_hf(w, CFG)
        a, b = np.array([5, 6, 7, 8, 9]), np.array([11, 12, 13])
        ref_a, ref_b = numpy_logits(w, CFG, a), numpy_logits(w, CFG, b)
        pad = 0
        tokens = np.array([
            np.r_[a, b, pad],                   # packed: segments 1, 2, then padding
            np.r_[[pad] * 4, a],                # left padded
            np.r_[b, [pad] * 6],                # right padded
        ])
        seg = np.array([[1] * 5 + [2] * 3 + [0], [0] * 4 + [1] * 5, [1] * 3 + [0] * 6])
        pos = np.array([[0, 1, 2, 3, 4, 0, 1, 2, 0], [0] * 4 + [0, 1, 2, 3, 4],
                        list(range(3)) + [0] * 6])
        logits, _ = jax.jit(model)(tokens, pos, seg)
        logits = np.asarray(logits)
        np.testing.assert_allclose(logits[0, :5], ref_a, atol=1e-4)
        np.testing.assert_allclose(logits[0, 5:8], ref_b, atol=1e-4)
        np.testing.assert_allclose(logits[1, 4:], ref_a, atol=1e-4)
        np.testing.assert_allclose(logits[2, :3], ref_b, atol=1e-4)
        assert np.isfinite(logits).all()

    def test_hidden_states_and_unembed(self):
        w = random_hf_weights(CFG, seed=1)
        model = model_from_hf(w, CFG)
        toks = np.array([[4, 2, 9]])
        hidden, _ = model.hidden_states(toks)
        np.testing.assert_allclose(hidden[0], numpy_hidden(w, CFG, toks[0]), atol=1e-4)
        np.testing.assert_allclose(model.unembed(hidden), model(toks)[0], atol=1e-5)
        assert model.unembedding().shape == (CFG.d_model, CFG.vocab_size)

    def test_kv_cache_prefill_then_decode_matches_full_forward(self):
        cfg = CFG.replace(tie_embeddings=True, qk_norm=True, attn_bias=True)
        w = random_hf_weights(cfg, seed=3)
        model = model_from_hf(w, cfg)
        seqs = [np.array([1, 2, 3, 4, 5, 6, 7]), np.array([9, 8, 7, 6, 5, 4, 3])]
        n_prompt = [3, 5]
        # Right-padded prompts of different lengths, then one token per row per step.
        width = max(n_prompt)
        toks = np.zeros((2, width), np.int32)
        seg = np.zeros((2, width), np.int32)
        for i, (s, n) in enumerate(zip(seqs, n_prompt, strict=True)):
            toks[i, :n], seg[i, :n] = s[:n], 1
        pos = np.broadcast_to(np.arange(width), (2, width))
        cache = tf.init_cache(cfg, 2, 12)
        step = jax.jit(model)
        logits, cache = step(toks, pos, seg, cache)
        got = [[np.asarray(logits[i, n - 1])] for i, n in enumerate(n_prompt)]
        cur = np.array(n_prompt)
        for _ in range(2):
            nxt = np.array([seqs[i][cur[i]] for i in range(2)])
            logits, cache = step(nxt[:, None], cur[:, None], np.ones((2, 1), np.int32), cache)
            for i in range(2):
                got[i].append(np.asarray(logits[i, 0]))
            cur = cur + 1
        for i, n in enumerate(n_prompt):
            ref = numpy_logits(w, cfg, seqs[i][:n + 2])[n - 1:n + 2]
            np.testing.assert_allclose(np.stack(got[i]), ref, atol=1e-4)

    def test_param_count_and_presets(self):
        for name in ("tiny", "smollm2_135m"):
            cfg = get_model_config(name)
            _, state = nnx.split(nnx.eval_shape(lambda c=cfg: tf.DecoderLM(c, rngs=nnx.Rngs(0))))
            n = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.to_pure_dict(state)))
            assert n == cfg.num_params()
        assert 1e6 <= get_model_config("tiny").num_params() <= 5e6
        assert get_model_config("smollm2_135m").num_params() == 134_515_008
        assert 25e9 <= get_model_config("qwen3_27b_class").num_params() <= 29e9
        with pytest.raises(ModelConfigError, match="n_kv_heads"):
            CFG.replace(n_kv_heads=3)
        with pytest.raises(ModelConfigError, match="unknown model preset"):
            get_model_config("gpt5")

    def test_bfloat16_compute_is_close_to_float32(self):
        w = random_hf_weights(CFG, seed=1)
        m32 = model_from_hf(w, CFG)
        m16 = model_from_hf(w, CFG.replace(dtype="bfloat16", param_dtype="bfloat16"))
        toks = np.array([[3, 4, 5, 6]])
        l32, l16 = m32(toks)[0], m16(toks)[0]
        assert l16.dtype == jnp.float32
        assert m16.backbone.embed[...].dtype == jnp.bfloat16
        np.testing.assert_allclose(l16, l32, atol=0.15)


class ValueModelTest(parameterized.TestCase):
    def test_from_actor_copies_backbone_and_zero_head(self):
        w = random_hf_weights(CFG, seed=1)
        actor = model_from_hf(w, CFG)
        critic = tf.ValueModel.from_actor(actor)
        toks = np.array([[1, 2, 3]])
        np.testing.assert_array_equal(critic(toks), np.zeros((1, 3)))
        np.testing.assert_array_equal(critic.backbone.embed[...], actor.backbone.embed[...])
        # Separate parameters: changing the critic does not change the actor.
        critic.backbone.embed[...] = critic.backbone.embed[...] + 1.0
        assert not np.allclose(critic.backbone.embed[...], actor.backbone.embed[...])

    def test_values_are_head_of_backbone_hidden(self):
        w = random_hf_weights(CFG, seed=1)
        actor = model_from_hf(w, CFG)
        critic = tf.ValueModel.from_actor(actor)
        head = np.linspace(-1, 1, CFG.d_model).astype(np.float32)
        critic.value_head["w"][...] = jnp.asarray(head)
        critic.value_head["b"][...] = jnp.asarray(0.5)
        toks = np.array([7, 3, 1, 2])
        want = numpy_hidden(w, CFG, toks) @ head + 0.5
        np.testing.assert_allclose(critic(toks[None])[0], want, atol=1e-4)

    def test_critic_params_from_actor_pure(self):
        from terminal_rsi.runtime import sharding as shd

        rng = np.random.default_rng(0)

        def random_params(cls):  # the module's exact tree, filled without compiling an init
            abstract = nnx.to_pure_dict(shd.abstract_model(cls, CFG)[1])
            return jax.tree.map(lambda a: jnp.asarray(
                rng.standard_normal(a.shape).astype(a.dtype)), abstract)

        ap, cp = random_params(tf.DecoderLM), random_params(tf.ValueModel)
        new = tf.critic_params_from_actor(ap, cp)
        assert jax.tree.structure(new) == jax.tree.structure(cp)
        chex.assert_trees_all_equal(new["backbone"], ap["backbone"])
        assert float(jnp.abs(new["value_head"]["w"]).sum()) == 0.0
