"""Decoder-only transformer (actor) and value model (critic) in Flax NNX.

LLaMA/Qwen family: RMSNorm (pre-norm), rotary position embeddings in the Hugging Face
LLaMA "rotate_half" layout, grouped-query attention (optional QK-norm and q/k/v biases),
SwiGLU MLP, optional tied embeddings. Parameters are stored in `config.param_dtype`,
matmuls run in `config.dtype`, logits and values come out in float32.

Calling convention (shared by everything built on these models)
----------------------------------------------------------------
All entry points take the same three [B, L] int32 arrays:

- `tokens`: token ids.
- `positions`: rotary position of each token (0 at the first real token of its sequence).
  For packed rows positions restart at 0 in each segment; for left-padded rows the first
  real token has position 0. Default: `arange(L)` in every row.
- `segment_ids`: which sequence a token belongs to; 0 marks padding. A query attends to
  keys of the same non-zero segment that are at or before it, so packed rows and left/right
  padded rows give exactly the logits of the unpadded sequences. Default: all ones.

`DecoderLM.__call__(tokens, positions, segment_ids, cache=None) -> (logits [B, L, V] f32,
new_cache)`; `new_cache` is None when `cache` is None.

`DecoderLM.hidden_states(...) -> (hidden [B, L, D], new_cache)` returns the final-norm
hidden states only; `DecoderLM.unembed(hidden)` applies the unembedding ([D, V] matrix from
`DecoderLM.unembedding()`), so chunked log-prob code can unembed a slice of positions at a
time without building [B, L, V].

`ValueModel.__call__(tokens, positions, segment_ids) -> values [B, L] f32`.

KV cache (for the sampler)
--------------------------
`init_cache(config, batch_size, max_len)` returns a pytree
`{"layers": [{"k": [B, S, K, hd], "v": [B, S, K, hd]}, ...], "segment_ids": [B, S]}` with
S = max_len. Cache slot == position: a call with a cache writes token t of row b into slot
`positions[b, t]` (padding tokens, segment 0, are not written) and then attends to the slots
`s <= positions[b, t]` whose stored segment id equals the query's segment id. Prefill a
(left- or right-) padded prompt with one call, then decode one token per row with L = 1,
`positions` = next position of each row and `segment_ids` = 1. Rows may be at different
positions. Positions must be < S (slots at or past S are silently dropped). Packed rows
(several segments per row) are for training only and must not use a cache.

Training code uses the split form: `graphdef, params = nnx.split(model)` with params as a
pure dict (`nnx.to_pure_dict`), and `nnx.merge(graphdef, params)` inside jitted functions.
Every parameter carries `logical_axes` metadata (names in `sharding.DEFAULT_RULES`).
"""

from __future__ import annotations

from typing import Any

import chex
import jax
import jax.numpy as jnp
from flax import nnx

from terminal_rsi.models import lora
from terminal_rsi.models.config import ModelConfig

Cache = dict[str, Any]
MASK_VALUE = -1e30  # finite, so fully masked (padding) query rows stay finite


def _param(rngs: nnx.Rngs, shape, axes, dtype, std: float | None) -> nnx.Param:
    """A Param with `logical_axes` metadata; std None means ones, 0.0 means zeros."""
    if std is None:
        value = jnp.ones(shape, dtype)
    elif std == 0.0:
        value = jnp.zeros(shape, dtype)
    else:
        value = (std * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(dtype)
    return nnx.Param(value, logical_axes=tuple(axes))


# ----------------------------------------------------------------------------- pure functions


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """RMSNorm over the last axis, computed in float32: x / sqrt(mean(x²) + eps) * weight."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (y * weight.astype(jnp.float32)).astype(x.dtype)


def rotary_angles(positions: jax.Array, head_dim: int, theta: float):
    """positions [B, L] -> (cos, sin), each [B, L, 1, hd] float32, HF "rotate_half" layout:
    angles = [pos·inv_freq, pos·inv_freq] (halves concatenated), inv_freq_i = θ^(-2i/hd)."""
    chex.assert_rank(positions, 2)
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    freqs = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, L, hd/2]
    angles = jnp.concatenate([freqs, freqs], axis=-1)[:, :, None, :]  # [B, L, 1, hd]
    return jnp.cos(angles), jnp.sin(angles)


def apply_rotary(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x [B, L, N, hd]: x·cos + rotate_half(x)·sin, rotate_half([a, b]) = [-b, a]."""
    x32 = x.astype(jnp.float32)
    x1, x2 = jnp.split(x32, 2, axis=-1)
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    return (x32 * cos + rotated * sin).astype(x.dtype)


def rotary_embedding(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
    """Apply rotary embeddings in the HF LLaMA "rotate_half" layout.

    x: [B, L, N, hd]; positions: [B, L]. With inv_freq_i = θ^(-2i/hd) and
    angles = [pos·inv_freq, pos·inv_freq] (concatenated halves):
    out = x·cos(angles) + rotate_half(x)·sin(angles), rotate_half([a, b]) = [-b, a].
    """
    chex.assert_rank(x, 4)
    return apply_rotary(x, *rotary_angles(positions, x.shape[-1], theta))


def segment_causal_mask(segment_ids: jax.Array) -> jax.Array:
    """[B, L] segment ids -> [B, L, L] bool: key j visible to query i iff j <= i and
    segment_ids[i] == segment_ids[j] != 0 (packing and padding without a cache)."""
    chex.assert_rank(segment_ids, 2)
    length = segment_ids.shape[1]
    causal = jnp.arange(length)[:, None] >= jnp.arange(length)[None, :]
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    return causal[None] & same & (segment_ids[:, :, None] != 0)


def cache_mask(positions: jax.Array, segment_ids: jax.Array,
               cache_segment_ids: jax.Array) -> jax.Array:
    """Mask for attention over a cache whose slot index is the position.

    positions, segment_ids: [B, L] of the queries; cache_segment_ids: [B, S].
    Returns [B, L, S] bool: slot s visible iff s <= positions[b, l] and
    cache_segment_ids[b, s] == segment_ids[b, l] != 0.
    """
    slots = jnp.arange(cache_segment_ids.shape[1])
    before = slots[None, None, :] <= positions[:, :, None]
    same = cache_segment_ids[:, None, :] == segment_ids[:, :, None]
    return before & same & (segment_ids[:, :, None] != 0)


def dot_product_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """Grouped-query softmax attention.

    q: [B, L, H, hd]; k, v: [B, S, K, hd] with H % K == 0 (query head h uses kv head
    h // (H/K)); mask: [B, L, S] bool. Returns [B, L, H, hd] in q's dtype. Scores and softmax
    are float32; fully masked rows give the mean of v (finite) instead of NaN.
    """
    b, length, h, hd = q.shape
    chex.assert_shape(mask, (b, length, k.shape[1]))
    if h % k.shape[2]:
        raise ValueError(f"{h} query heads are not a multiple of {k.shape[2]} key/value heads")
    # jax.nn.dot_product_attention: f32 logits, masked with a large finite negative, softmax
    # in f32; on GPU/TPU it may pick a fused kernel.
    return jax.nn.dot_product_attention(q, k.astype(q.dtype), v.astype(q.dtype),
                                        mask=mask[:, None], scale=hd ** -0.5)


def init_cache(config: ModelConfig, batch_size: int, max_len: int | None = None,
               dtype=None) -> Cache:
    """Empty KV cache: per layer k, v [B, S, K, hd] zeros; segment_ids [B, S] zeros (empty)."""
    s = max_len or config.max_seq_len
    dtype = dtype or config.jnp_dtype
    shape = (batch_size, s, config.n_kv_heads, config.head_dim)
    return {
        "layers": [{"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}
                   for _ in range(config.n_layers)],
        "segment_ids": jnp.zeros((batch_size, s), jnp.int32),
    }


def _cache_slots(positions, segment_ids, size):
    """Slot per token: its position, or `size` (out of range: dropped) for padding."""
    return jnp.where(segment_ids != 0, positions, size)


def _write_cache(buf: jax.Array, new: jax.Array, slots: jax.Array) -> jax.Array:
    rows = jnp.broadcast_to(jnp.arange(buf.shape[0])[:, None], slots.shape)
    return buf.at[rows, slots].set(new.astype(buf.dtype), mode="drop")


# ----------------------------------------------------------------------------- modules


def _adapters(config: ModelConfig, names, rngs: nnx.Rngs) -> nnx.Dict | None:
    """LoRA adapters (`terminal_rsi.models.lora`) of the projections `names` that
    `config.lora_targets` picks; None without LoRA."""
    chosen = [n for n in names if n in config.lora_targets] if config.lora_rank else []
    if not chosen:
        return None
    dims = config.projection_dims()
    out = {}
    for n in chosen:
        ad = lora.init_adapter(rngs.params(), *dims[n], config.lora_rank)
        out[n] = nnx.Dict(a=nnx.Param(ad["a"], logical_axes=("lora", "lora")),
                          b=nnx.Param(ad["b"], logical_axes=("lora", "lora")))
    return nnx.Dict(out)


def _plus_adapter(y, x, adapters, name, config):
    """y + the LoRA term of projection `name` on input x [..., fan_in] (y's shape)."""
    if adapters is None or name not in adapters:
        return y
    return y + lora.delta(x, adapters[name], lora.scale(config)).reshape(y.shape)


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float, param_dtype, *, rngs: nnx.Rngs):
        self.weight = _param(rngs, (dim,), ("norm",), param_dtype, None)
        self.eps = eps

    def __call__(self, x):
        return rms_norm(x, self.weight[...], self.eps)


class Attention(nnx.Module):
    """GQA self-attention; q [D, H, hd], k/v [D, K, hd], o [H, hd, D]."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        c = config
        pd = c.jnp_param_dtype
        self.config = c
        std_in, std_out = c.d_model ** -0.5, (c.n_heads * c.head_dim) ** -0.5
        self.q = _param(rngs, (c.d_model, c.n_heads, c.head_dim),
                        ("embed", "heads", "head_dim"), pd, std_in)
        self.k = _param(rngs, (c.d_model, c.n_kv_heads, c.head_dim),
                        ("embed", "kv_heads", "head_dim"), pd, std_in)
        self.v = _param(rngs, (c.d_model, c.n_kv_heads, c.head_dim),
                        ("embed", "kv_heads", "head_dim"), pd, std_in)
        self.o = _param(rngs, (c.n_heads, c.head_dim, c.d_model),
                        ("heads", "head_dim", "embed"), pd, std_out)
        if c.attn_bias:
            self.q_bias = _param(rngs, (c.n_heads, c.head_dim), ("heads", "head_dim"), pd, 0.0)
            self.k_bias = _param(rngs, (c.n_kv_heads, c.head_dim), ("kv_heads", "head_dim"),
                                 pd, 0.0)
            self.v_bias = _param(rngs, (c.n_kv_heads, c.head_dim), ("kv_heads", "head_dim"),
                                 pd, 0.0)
        if c.qk_norm:
            self.q_norm = RMSNorm(c.head_dim, c.norm_eps, pd, rngs=rngs)
            self.k_norm = RMSNorm(c.head_dim, c.norm_eps, pd, rngs=rngs)
        adapters = _adapters(c, lora.ATTN_TARGETS, rngs)
        if adapters is not None:
            self.lora = adapters

    def project_qkv(self, x, rope):
        """x [B, L, D], rope = rotary_angles(positions) -> q [B, L, H, hd], k, v [B, L, K, hd]
        with rotary applied to q and k."""
        c, dt = self.config, self.config.jnp_dtype
        ad = getattr(self, "lora", None)
        q, k, v = (_plus_adapter(jnp.einsum("bld,dhk->blhk", x, w[...].astype(dt)), x, ad, n, c)
                   for n, w in (("q", self.q), ("k", self.k), ("v", self.v)))
        if c.attn_bias:
            q = q + self.q_bias[...].astype(dt)
            k = k + self.k_bias[...].astype(dt)
            v = v + self.v_bias[...].astype(dt)
        if c.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rotary(q, *rope), apply_rotary(k, *rope), v

    def __call__(self, x, rope, mask, layer_cache=None, slots=None):
        q, k, v = self.project_qkv(x, rope)
        new_cache = None
        if layer_cache is not None:
            new_cache = {"k": _write_cache(layer_cache["k"], k, slots),
                         "v": _write_cache(layer_cache["v"], v, slots)}
            k, v = new_cache["k"].astype(q.dtype), new_cache["v"].astype(q.dtype)
        out = dot_product_attention(q, k, v, mask)
        y = jnp.einsum("blhk,hkd->bld", out, self.o[...].astype(q.dtype))
        flat = out.reshape(*out.shape[:2], -1)
        return _plus_adapter(y, flat, getattr(self, "lora", None), "o", self.config), new_cache


class MLP(nnx.Module):
    """SwiGLU: down(silu(x·gate) ⊙ (x·up)); gate, up [D, F], down [F, D]."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        c, pd = config, config.jnp_param_dtype
        self.config, self.dtype = c, c.jnp_dtype
        self.gate = _param(rngs, (c.d_model, c.d_ff), ("embed", "mlp"), pd, c.d_model ** -0.5)
        self.up = _param(rngs, (c.d_model, c.d_ff), ("embed", "mlp"), pd, c.d_model ** -0.5)
        self.down = _param(rngs, (c.d_ff, c.d_model), ("mlp", "embed"), pd, c.d_ff ** -0.5)
        adapters = _adapters(c, lora.MLP_TARGETS, rngs)
        if adapters is not None:
            self.lora = adapters

    def __call__(self, x):
        dt, ad, c = self.dtype, getattr(self, "lora", None), self.config
        gate = _plus_adapter(x @ self.gate[...].astype(dt), x, ad, "gate", c)
        up = _plus_adapter(x @ self.up[...].astype(dt), x, ad, "up", c)
        h = jax.nn.silu(gate) * up
        return _plus_adapter(h @ self.down[...].astype(dt), h, ad, "down", c)


class Block(nnx.Module):
    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        pd = config.jnp_param_dtype
        self.attn_norm = RMSNorm(config.d_model, config.norm_eps, pd, rngs=rngs)
        self.attn = Attention(config, rngs=rngs)
        self.mlp_norm = RMSNorm(config.d_model, config.norm_eps, pd, rngs=rngs)
        self.mlp = MLP(config, rngs=rngs)

    def __call__(self, x, rope, mask, layer_cache=None, slots=None):
        a, new_cache = self.attn(self.attn_norm(x), rope, mask, layer_cache, slots)
        x = x + a
        return x + self.mlp(self.mlp_norm(x)), new_cache


def default_positions_and_segments(tokens, positions=None, segment_ids=None):
    """Fill in positions 0..L-1 and one segment (1) per row where not given; check shapes."""
    chex.assert_rank(tokens, 2)
    if positions is None:
        positions = jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
    if segment_ids is None:
        segment_ids = jnp.ones(tokens.shape, jnp.int32)
    chex.assert_equal_shape([tokens, positions, segment_ids])
    return positions, segment_ids


class Transformer(nnx.Module):
    """Backbone: embedding, decoder blocks, final RMSNorm (shared shape of actor and critic)."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.embed = _param(rngs, (config.vocab_size, config.d_model), ("vocab", "embed"),
                            config.jnp_param_dtype, config.d_model ** -0.5)
        self.layers = nnx.List([Block(config, rngs=rngs) for _ in range(config.n_layers)])
        self.final_norm = RMSNorm(config.d_model, config.norm_eps, config.jnp_param_dtype,
                                  rngs=rngs)

    def __call__(self, tokens, positions=None, segment_ids=None, cache: Cache | None = None):
        """tokens, positions, segment_ids [B, L] -> (hidden [B, L, D] (final-normed), cache)."""
        positions, segment_ids = default_positions_and_segments(tokens, positions, segment_ids)
        x = jnp.take(self.embed[...], tokens, axis=0).astype(self.config.jnp_dtype)
        slots = new_cache = None
        if cache is None:
            mask = segment_causal_mask(segment_ids)
        else:
            size = cache["segment_ids"].shape[1]
            slots = _cache_slots(positions, segment_ids, size)
            cache_seg = _write_cache(cache["segment_ids"], segment_ids, slots)
            mask = cache_mask(positions, segment_ids, cache_seg)
            new_cache = {"layers": [], "segment_ids": cache_seg}
        rope = rotary_angles(positions, self.config.head_dim, self.config.rope_theta)
        for i, layer in enumerate(self.layers):
            layer_cache = None if cache is None else cache["layers"][i]
            x, lc = layer(x, rope, mask, layer_cache, slots)
            if cache is not None:
                new_cache["layers"].append(lc)
        return self.final_norm(x), new_cache


class DecoderLM(nnx.Module):
    """The actor: causal LM. See the module docstring for the calling convention."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.backbone = Transformer(config, rngs=rngs)
        if not config.tie_embeddings:
            self.lm_head = _param(rngs, (config.d_model, config.vocab_size), ("embed", "vocab"),
                                  config.jnp_param_dtype, config.d_model ** -0.5)

    def unembedding(self) -> jax.Array:
        """[D, V] unembedding matrix in the compute dtype (embeddingᵀ when tied)."""
        w = self.backbone.embed[...].T if self.config.tie_embeddings else self.lm_head[...]
        return w.astype(self.config.jnp_dtype)

    def unembed(self, hidden: jax.Array) -> jax.Array:
        """hidden [..., D] -> logits [..., V] float32."""
        return jnp.einsum("...d,dv->...v", hidden.astype(self.config.jnp_dtype),
                          self.unembedding(), preferred_element_type=jnp.float32)

    def hidden_states(self, tokens, positions=None, segment_ids=None, cache=None):
        """-> (hidden [B, L, D] after the final norm, new_cache or None)."""
        return self.backbone(tokens, positions, segment_ids, cache)

    def __call__(self, tokens, positions=None, segment_ids=None, cache=None):
        """-> (logits [B, L, V] float32, new_cache or None)."""
        hidden, new_cache = self.backbone(tokens, positions, segment_ids, cache)
        return self.unembed(hidden), new_cache


class ValueModel(nnx.Module):
    """The critic: its own backbone plus a scalar head per position, V(s_t) = w·h_t + b.

    Parameters are separate from the actor's (no shared backbone). The head starts at zero.
    """

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.backbone = Transformer(config, rngs=rngs)
        self.value_head = nnx.Dict(
            w=_param(rngs, (config.d_model,), ("embed",), jnp.float32, 0.0),
            b=_param(rngs, (), (), jnp.float32, 0.0))

    def __call__(self, tokens, positions=None, segment_ids=None):
        """-> values [B, L] float32."""
        hidden, _ = self.backbone(tokens, positions, segment_ids)
        w, b = self.value_head["w"][...], self.value_head["b"][...]
        return jnp.einsum("bld,d->bl", hidden.astype(jnp.float32), w) + b

    @classmethod
    def from_actor(cls, actor: DecoderLM, *, rngs: nnx.Rngs | None = None) -> ValueModel:
        """A critic whose backbone is a copy of `actor`'s backbone and whose head is zero."""
        critic = nnx.eval_shape(lambda: cls(actor.config, rngs=nnx.Rngs(0)))
        state = nnx.state(critic)
        pure = nnx.to_pure_dict(state)
        pure["backbone"] = jax.tree.map(jnp.array, nnx.to_pure_dict(nnx.state(actor.backbone)))
        pure["value_head"] = {"w": jnp.zeros((actor.config.d_model,), jnp.float32),
                              "b": jnp.zeros((), jnp.float32)}
        graphdef = nnx.graphdef(critic)
        return nnx.merge(graphdef, pure)


def critic_params_from_actor(actor_params: dict, critic_params: dict | None = None) -> dict:
    """Pure-dict form of `ValueModel.from_actor`: copy the backbone, zero the value head.

    actor_params: `nnx.to_pure_dict` of a DecoderLM state. critic_params (optional) only
    supplies the head's dtypes/shapes; the result shares no buffers with the actor.
    """
    backbone = jax.tree.map(jnp.copy, actor_params["backbone"])
    d = actor_params["backbone"]["embed"].shape[1]
    head = {"w": jnp.zeros((d,), jnp.float32), "b": jnp.zeros((), jnp.float32)}
    if critic_params is not None:
        head = jax.tree.map(lambda x: jnp.zeros_like(x), critic_params["value_head"])
    return {"backbone": backbone, "value_head": head}
