"""LoRA adapters (Hu et al., 2021) on the actor's and the critic's projection matrices.

With `ModelConfig.lora_rank = r > 0`, every target matrix W (flattened to [fan_in, fan_out]:
q, k, v [D, H·hd], o [H·hd, D], gate, up [D, F], down [F, D]) of every layer gains an
adapter a [fan_in, r], b [r, fan_out] in float32, and the projection of x becomes

    y = x·W + (α / r) · (x·a)·b          a ~ U(±1/√fan_in), b = 0 (so y = x·W at the start)

The adapters live in the model's params under `.../attn/lora/<target>/{a,b}` and
`.../mlp/lora/<target>/{a,b}`, so checkpoints, handoffs, resume and sampling carry them like
any parameter. A params tree that holds adapters trains only them (and a critic's value head):
`terminal_rsi.models.trainable.split_trainable` gives the part that gradients and the optimizer see,
the frozen leaves as None, and `join` puts the two back. A tree without adapters trains whole
(full fine-tuning). `merge_adapters` folds W += (α / r)·a·b and drops the adapters (an export for
serving, `terminal_rsi.models.hf_export`); `add_adapters` gives pretrained weights fresh ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from terminal_rsi.models.config import LORA_TARGETS as TARGETS
from terminal_rsi.models.trainable import ADAPTER_KEY, has_adapters

ATTN_TARGETS, MLP_TARGETS = TARGETS[:4], TARGETS[4:]


def scale(config) -> float:
    """α / r of the adapters of `config`."""
    return config.lora_alpha / config.lora_rank


def init_adapter(key: jax.Array, fan_in: int, fan_out: int, rank: int) -> dict[str, jax.Array]:
    """A fresh adapter: a ~ U(-1/√fan_in, 1/√fan_in) [fan_in, r] (PEFT's Kaiming-uniform
    bound), b = 0 [r, fan_out]; float32."""
    bound = fan_in ** -0.5
    a = jax.random.uniform(key, (fan_in, rank), jnp.float32, -bound, bound)
    return {"a": a, "b": jnp.zeros((rank, fan_out), jnp.float32)}


def delta(x: jax.Array, adapter: Mapping[str, jax.Array], s: float) -> jax.Array:
    """s · (x·a)·b for x [..., fan_in] in x's dtype (the adapter's part of a projection)."""
    a, b = adapter["a"].astype(x.dtype), adapter["b"].astype(x.dtype)
    return (x @ a) @ b * jnp.asarray(s, x.dtype)


def _map_layers(params: Mapping[str, Any], fn) -> dict:
    """`params` with fn(layer) in place of each decoder layer (a list or an int-keyed dict,
    as `nnx.to_pure_dict` gives)."""
    src = params["backbone"]["layers"]
    if isinstance(src, Mapping):
        layers = {i: fn(layer) for i, layer in src.items()}
    else:
        layers = [fn(layer) for layer in src]
    return {**params, "backbone": {**params["backbone"], "layers": layers}}


def merge_adapters(params: Mapping[str, Any], config) -> dict:
    """Params without adapters whose matrices hold W + (α / r)·a·b (a float32 sum, stored in
    W's dtype): the same function for `config.without_lora()`. Params without adapters
    come back unchanged."""
    if not has_adapters(params):
        return dict(params)
    s = scale(config)

    def fold(layer):
        new = dict(layer)
        for module in ("attn", "mlp"):
            new[module] = {k: v for k, v in layer[module].items() if k != ADAPTER_KEY}
            for name, ad in layer[module].get(ADAPTER_KEY, {}).items():
                w = jnp.asarray(layer[module][name])
                d = s * (jnp.asarray(ad["a"], jnp.float32) @ jnp.asarray(ad["b"], jnp.float32))
                new[module][name] = (w.astype(jnp.float32) + d.reshape(w.shape)).astype(w.dtype)
        return new

    return _map_layers(params, fold)


def add_adapters(params: Mapping[str, Any], config, seed: int) -> dict:
    """`params` (a DecoderLM or ValueModel tree without adapters) with fresh adapters for
    `config`'s rank and targets (`init_adapter`; keys from `seed`); unchanged when
    lora_rank = 0 or the tree already holds adapters."""
    if not config.lora_rank or has_adapters(params):
        return dict(params)
    dims = config.projection_dims()
    keys = iter(jax.random.split(jax.random.key(seed), config.n_layers * len(TARGETS)))

    def add(layer):
        new = dict(layer)
        for module, names in (("attn", ATTN_TARGETS), ("mlp", MLP_TARGETS)):
            chosen = [n for n in names if n in config.lora_targets]
            if chosen:
                new[module] = {**layer[module], ADAPTER_KEY: {
                    n: init_adapter(next(keys), *dims[n], config.lora_rank) for n in chosen}}
        return new

    return _map_layers(params, add)
