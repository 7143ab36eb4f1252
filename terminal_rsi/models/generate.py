"""A minimal greedy decoder over the KV cache (reference and acceptance tests only).

The real sampler (temperature, top-p, logprobs, batching of episodes) lives in
`terminal_rsi/models/sampling.py`; this one shows the cache protocol end to end:
prefill the padded prompt in one call, then one token per row per call.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from terminal_rsi.models.transformer import DecoderLM, init_cache


def greedy_decode(model: DecoderLM, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                  stop_ids: Sequence[int] = (), pad_id: int = 0) -> list[list[int]]:
    """Greedy continuation of each prompt (rows right-padded; each row at its own position).

    Returns the generated ids per row, up to and including the first stop id.
    """
    b = len(prompts)
    lens = np.array([len(p) for p in prompts])
    width = int(lens.max())
    tokens = np.full((b, width), pad_id, np.int32)
    seg = np.zeros((b, width), np.int32)
    for i, p in enumerate(prompts):
        tokens[i, :len(p)] = p
        seg[i, :len(p)] = 1
    pos = np.broadcast_to(np.arange(width, dtype=np.int32), (b, width))
    graphdef, params = nnx.split(model)
    cache = init_cache(model.config, b, width + max_new_tokens)

    @jax.jit
    def prefill(params, cache, tokens, pos, seg):
        logits, cache = nnx.merge(graphdef, params)(tokens, pos, seg, cache)
        last = jnp.take_along_axis(logits, (jnp.asarray(lens) - 1)[:, None, None], axis=1)
        return jnp.argmax(last[:, 0], axis=-1).astype(jnp.int32), cache

    @jax.jit
    def decode(params, cache, tok, pos):
        logits, cache = nnx.merge(graphdef, params)(
            tok[:, None], pos[:, None], jnp.ones_like(tok)[:, None], cache)
        return jnp.argmax(logits[:, 0], axis=-1).astype(jnp.int32), cache

    nxt, cache = prefill(params, cache, tokens, pos, seg)
    out = [[] for _ in range(b)]
    done = np.zeros(b, bool)
    cur = jnp.asarray(lens, jnp.int32)
    for _ in range(max_new_tokens):
        ids = np.asarray(nxt)
        for i in range(b):
            if not done[i]:
                out[i].append(int(ids[i]))
                done[i] = ids[i] in stop_ids
        if done.all():
            break
        nxt, cache = decode(params, cache, nxt, cur)
        cur = cur + 1
    return out
