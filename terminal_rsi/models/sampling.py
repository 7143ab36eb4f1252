"""Token-in/token-out sampler: batched, jitted generation over the DecoderLM KV cache.

Rollouts need the exact sampled token ids and their log-probabilities (paper §2.1, T1's
Token-In, Token-Out contract); this module produces them. The training-side recomputation
of the same log-probabilities (chunked along the sequence, §2.4 and Appendix A) lives in
`terminal_rsi.models.logprobs` (`chunked_token_logprobs`, and `logprob_gap` between the two).

Usage
-----
    sampler = Sampler(graphdef, model_config, buckets=Buckets(), decode_block=16)
    outs = sampler.sample(params, prompts, key, max_new_tokens=256, temperature=1.0,
                          top_p=1.0, top_k=0, stop_token_ids=tok.stop_ids,
                          stop_strings=("</action>",), detokenize=tok.decode)
    outs[i].token_ids, outs[i].logprobs, outs[i].raw_logprobs, outs[i].stop_reason

Multi-turn (linear history): `outs, state = sampler.sample(..., return_state=True)`, then
`outs, state = sampler.extend(params, state, observation_tokens, key, ...)` appends each
row's observation tokens after its generated ids and generates the next turn, reusing the
cache (the history is never recomputed). The state's cache buffers are donated to the next
call: use each state once, with the same `params` that built it.

How it runs
-----------
- Rows are right-padded; each row's cache slot equals its position (see
  `terminal_rsi.models.transformer`), so rows of different lengths decode side by side.
- Prefill: the prompt (or, in `extend`, the tokens since the cache's end) is written in
  chunks of `Buckets.prefill_chunk` tokens, one jitted call per chunk; the logits of each
  row's last token are kept.
- Decode: a jitted `lax.while_loop` of up to `decode_block` steps; each step samples one
  token per live row, records its log-probabilities and feeds it back at the row's next
  position. Rows finish independently (stop token, length, context); finished rows are not
  fed. The loop leaves early once all rows are done. Inside a block the cache is read-only
  (transposed once per block; a transient second copy of the K/V cache): new keys/values
  go to a [B, decode_block, K, hd] block buffer and are scattered into the cache once per
  block. The decode step reuses the model's own submodules (embedding, norms,
  `Attention.project_qkv`, MLP, unembedding); only the attention over cache ∪ block buffer
  is written here (same math as `transformer.dot_product_attention`; the tests compare it
  with the uncached model). After each block the host checks stop strings and stops when
  all rows are done.
- Shapes come from buckets: batch rounded up to `Buckets.batch_multiple` (and to a power of
  two with `power_of_two`), cache length to `Buckets.cache_multiple` (power of two likewise),
  prompt width to `prefill_chunk`. Jitted functions are compiled once per (batch, cache)
  bucket; `Sampler.compilations` counts traces per function.

Sampling distribution (per row; temperature, top_p, top_k, max_new_tokens are call args)
-----------------------------------------------------------------------------------------
z = logits / T; top-k keeps logits ≥ the k-th largest (ties kept; k = 0 means unrestricted);
top-p then keeps the smallest prefix of the sorted distribution whose mass reaches p (the
top token is always kept; ties at the threshold kept; p = 1 keeps everything). The token is
drawn from softmax(z) restricted to the kept set. `logprobs` is the log-probability under
that distribution; `raw_logprobs` is log softmax(logits) (untempered, unfiltered). T = 0 is
greedy (argmax of the raw logits) and its sampling log-probability is 0 (a point mass).
At T = 1 with no top-k/top-p, `logprobs == raw_logprobs` exactly.

Randomness: row b uses key_b = fold_in(key, b) (or `key[b]` when one key per prompt is
given) and its n-th generated token of a call uses fold_in(key_b, n). A row's tokens thus
depend only on its key and its own tokens, not on batch composition or padding.

Stopping (`SampleOutput.stop_reason`) and the stop-string policy
-----------------------------------------------------------------
- STOP_TOKEN: the row sampled an id in `stop_token_ids`; the stop token is kept (it is
  part of the action and gets a log-probability like any other sampled token).
- STOP_STRING: the detokenized text of the ids generated *in this call* (prompt excluded)
  contains one of `stop_strings`. The output keeps the shortest prefix of generated ids
  whose text contains it, i.e. up to and including the token that completes the stop
  string (the whole token is kept even if it carries text past the stop string; ids are
  never split or re-tokenized). Tokens the row generated after that token inside the same
  decode block are discarded and counted in `SampleOutput.num_discarded`; the cache rolls
  back to the kept ids. If the same token completes a stop string and is a stop token,
  the reason is STOP_TOKEN.
- LENGTH: `max_new_tokens` ids were generated in this call.
- CONTEXT: the row's total length (history + generated) reached `max_context` (default
  `config.max_seq_len`); a row whose history already fills it generates nothing.
A termination (stop token/string) beats a truncation on the same token, and CONTEXT beats
LENGTH when both happen on the same token.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from terminal_rsi.models.config import ModelConfig
from terminal_rsi.models.lora import merge_adapters
from terminal_rsi.models.trainable import has_adapters
from terminal_rsi.models.transformer import (
    MASK_VALUE,
    Cache,
    DecoderLM,
    init_cache,
    rotary_angles,
)

__all__ = ["Buckets", "SampleOutput", "Sampler", "SamplerState", "SamplingError", "StopReason",
           "sample_tokens", "sampling_logits"]


class SamplingError(ValueError):
    """Bad sampler arguments (empty prompt, id out of vocabulary, invalid top-p, ...)."""


class StopReason(enum.Enum):
    STOP_TOKEN = "stop_token"
    STOP_STRING = "stop_string"
    LENGTH = "length"
    CONTEXT = "context"


# Device-side reason codes (0 = still running / padding row).
_RUNNING, _STOP_TOKEN, _STOP_STRING, _LENGTH, _CONTEXT = 0, 1, 2, 3, 4
_REASONS = {_STOP_TOKEN: StopReason.STOP_TOKEN, _STOP_STRING: StopReason.STOP_STRING,
            _LENGTH: StopReason.LENGTH, _CONTEXT: StopReason.CONTEXT}


@dataclasses.dataclass(frozen=True)
class Buckets:
    """Shape buckets bounding recompilation.

    prefill_chunk: tokens per prefill call; prompt widths are padded to a multiple of it.
    cache_multiple: the cache length is rounded up to a multiple of this.
    batch_multiple: the batch is rounded up to a multiple of this.
    power_of_two: additionally round cache length and batch up to a power of two
      (so the number of buckets grows with log of the longest context / largest batch).
    """

    prefill_chunk: int = 128
    cache_multiple: int = 256
    batch_multiple: int = 1
    power_of_two: bool = True

    def __post_init__(self):
        for name in ("prefill_chunk", "cache_multiple", "batch_multiple"):
            if getattr(self, name) <= 0:
                raise SamplingError(f"Buckets.{name} = {getattr(self, name)} must be > 0")

    def _round(self, n: int, multiple: int) -> int:
        n = max(int(n), 1)
        r = -(-n // multiple) * multiple
        if self.power_of_two:
            p = 1 << (r - 1).bit_length()
            r = max(p, multiple)
            r = -(-r // multiple) * multiple
        return r

    def batch(self, n: int) -> int:
        return self._round(n, self.batch_multiple)

    def cache(self, n: int) -> int:
        return self._round(n, self.cache_multiple)

    def width(self, n: int) -> int:
        return -(-max(int(n), 1) // self.prefill_chunk) * self.prefill_chunk


@dataclasses.dataclass
class SampleOutput:
    """One row's generation.

    token_ids: the sampled ids, exactly as sampled (stop token included).
    logprobs: [n] float32, log-probability of each id under the sampling distribution.
    raw_logprobs: [n] float32, log-probability under the untempered, unfiltered model.
    stop_reason: why generation ended (see the module docstring).
    stop_string: the stop string that matched (STOP_STRING only).
    num_discarded: ids generated after a stop string's token and dropped (never returned).
    text: detokenized `token_ids` when a detokenizer was given, else None.
    """

    token_ids: list[int]
    logprobs: np.ndarray
    raw_logprobs: np.ndarray
    stop_reason: StopReason
    stop_string: str | None = None
    num_discarded: int = 0
    text: str | None = None


@dataclasses.dataclass
class SamplerState:
    """Per-row continuation state between turns (returned with `return_state=True`).

    cache: the KV cache pytree ([B_bucket, S, ...]); its buffers are donated to the next
      `extend`, so use each state once.
    cache_len: [B_bucket] number of leading tokens of each row's history held in the cache.
    pending: per real row, the history tokens after `cache_len` that are not in the cache yet
      (normally the last sampled token); `extend` prefills them before the new tokens.
    num_rows: number of real rows (rows past it are batch padding).
    """

    cache: Cache
    cache_len: np.ndarray
    pending: list[list[int]]
    num_rows: int

    def history_lengths(self) -> list[int]:
        """Total history length (cached + pending) of each real row."""
        return [int(self.cache_len[i]) + len(self.pending[i]) for i in range(self.num_rows)]


# ----------------------------------------------------------------------------- pure functions


def sampling_logits(logits: jax.Array, temperature: jax.Array, top_p: jax.Array,
                    top_k: jax.Array) -> jax.Array:
    """Logits of the sampling distribution: tempered, then top-k, then top-p filtered.

    logits: [B, V] float32 raw logits; temperature, top_p: [B] float32; top_k: [B] int32
    (0 = unrestricted). Returns [B, V] float32 with -inf outside the kept set. Rows with
    temperature 0 are returned untempered (the caller takes their argmax).
    """
    b, v = logits.shape
    t = jnp.where(temperature > 0, temperature, 1.0).astype(jnp.float32)
    z = logits.astype(jnp.float32) / t[:, None]

    def filtered(z):
        srt = -jnp.sort(-z, axis=-1)  # descending
        k = jnp.where(top_k > 0, jnp.minimum(top_k, v), v).astype(jnp.int32)
        kth = jnp.take_along_axis(srt, (k - 1)[:, None], axis=-1)
        z = jnp.where(z < kth, -jnp.inf, z)
        srt = jnp.where(jnp.arange(v)[None, :] < k[:, None], srt, -jnp.inf)
        probs = jax.nn.softmax(srt, axis=-1)
        mass_before = jnp.cumsum(probs, axis=-1) - probs
        keep = (mass_before < top_p[:, None]) | (top_p[:, None] >= 1.0)
        keep = keep & (jnp.arange(v)[None, :] < k[:, None])
        n_keep = jnp.maximum(jnp.sum(keep, axis=-1), 1)
        threshold = jnp.take_along_axis(srt, (n_keep - 1)[:, None], axis=-1)
        return jnp.where(z < threshold, -jnp.inf, z)

    needs = jnp.any((top_k > 0) | (top_p < 1.0))
    return jax.lax.cond(needs, filtered, lambda z: z, z)


def sample_tokens(logits: jax.Array, keys: jax.Array, temperature: jax.Array,
                  top_p: jax.Array, top_k: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Draw one token per row.

    logits: [B, V] raw float32; keys: [B] typed PRNG keys; temperature, top_p: [B] float32;
    top_k: [B] int32. Returns (tokens [B] int32, logprobs [B] under the sampling
    distribution (0 for greedy rows), raw_logprobs [B] = log softmax(logits)[token]).
    """
    z = sampling_logits(logits, temperature, top_p, top_k)
    drawn = jax.vmap(jax.random.categorical)(keys, z)
    greedy = jnp.argmax(logits, axis=-1)
    sampled = temperature > 0
    tok = jnp.where(sampled, drawn, greedy).astype(jnp.int32)
    lp = jnp.take_along_axis(jax.nn.log_softmax(z, axis=-1), tok[:, None], axis=-1)[:, 0]
    lp = jnp.where(sampled, lp, 0.0)
    raw = jnp.take_along_axis(jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1),
                              tok[:, None], axis=-1)[:, 0]
    return tok, lp, raw


# ----------------------------------------------------------------------------- sampler


def _as_row_keys(key, n: int, b: int) -> jax.Array:
    """One typed key per padded row: fold_in(key, row) or the given per-prompt keys."""
    key = jnp.asarray(key)
    if not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.wrap_key_data(key)
    if key.ndim == 0:
        return jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(b))
    if key.shape != (n,):
        raise SamplingError(f"key has shape {key.shape}; pass one key, or one key per prompt "
                            f"(shape ({n},))")
    extra = jax.vmap(lambda i: jax.random.fold_in(key[0], i))(jnp.arange(n, b) + 1_000_003)
    return jnp.concatenate([key, extra]) if b > n else key


class Sampler:
    """Jitted KV-cache sampler for a `DecoderLM` in split form (see the module docstring).

    graphdef: `nnx.graphdef` of the DecoderLM; config: its ModelConfig.
    buckets: shape buckets; decode_block: decode steps per jitted call (stop strings are
    checked between blocks); max_context: longest history + generation per row (default
    config.max_seq_len); pad_id: id written in padded slots (never attended to).
    """

    def __init__(self, graphdef: nnx.GraphDef, config: ModelConfig, *,
                 buckets: Buckets | None = None, decode_block: int = 16,
                 max_context: int | None = None, pad_id: int = 0,
                 detokenize: Callable[[Sequence[int]], str] | None = None):
        if decode_block <= 0:
            raise SamplingError(f"decode_block = {decode_block} must be > 0")
        # with LoRA adapters the sampler runs the plain model on merged weights (W + (α/r)·a·b,
        # `serving_params`): no adapter matmuls at each decoded token
        self.graphdef = (nnx.graphdef(nnx.eval_shape(
            lambda: DecoderLM(config.without_lora(), rngs=nnx.Rngs(0))))
            if config.lora_rank else graphdef)
        self.config = config
        self.buckets = buckets or Buckets()
        self.decode_block = int(decode_block)
        self.max_context = int(max_context or config.max_seq_len)
        self.pad_id = int(pad_id)
        self.detokenize = detokenize
        self.compilations: dict[str, int] = {"prefill": 0, "decode": 0, "grow": 0}
        self._prefill = jax.jit(self._prefill_impl, donate_argnums=(1, 6))
        self._decode = jax.jit(self._decode_impl, donate_argnums=(1,))
        self._grow = jax.jit(self._grow_impl, static_argnums=(1,))

    def serving_params(self, params):
        """The params the sampler runs on: LoRA adapters merged into their matrices
        (`terminal_rsi.models.lora.merge_adapters`), others unchanged. `sample` and `extend`
        merge per call; a caller that samples many times with the same weights (SamplerPolicy)
        merges once."""
        return merge_adapters(params, self.config) if has_adapters(params) else params

    # -- jitted pieces ---------------------------------------------------------------

    def _prefill_impl(self, params, cache, tokens, positions, segment_ids, last_idx, logits):
        """Write one chunk [B, C] into the cache; keep logits of rows whose last token is in it."""
        self.compilations["prefill"] += 1  # runs at trace time only
        model = nnx.merge(self.graphdef, params)
        hidden, cache = model.hidden_states(tokens, positions, segment_ids, cache)
        idx = jnp.clip(last_idx, 0, tokens.shape[1] - 1)
        h_last = jnp.take_along_axis(hidden, idx[:, None, None], axis=1)[:, 0]
        new = model.unembed(h_last)
        return cache, jnp.where((last_idx >= 0)[:, None], new, logits)

    def _decode_impl(self, params, carry, consts):
        """Up to `decode_block` steps of sample-then-feed; see the module docstring.

        Inside a block the big cache is read-only: each step's keys/values go to a small
        block buffer [B, N, K, hd] at column i (the same column for every row), and
        attention runs over (cache slots < the row's block-start position) ∪ (block columns
        fed so far). The block is scattered into the cache once at the end. Writing into
        the [B, S, ...] cache every step costs O(S) memory traffic per token on XLA:CPU
        (the per-row scatter is not done in place), which made the per-token cost grow
        ~3x from context 128 to 1024; with the block buffer it is one O(S) pass per block.
        """
        self.compilations["decode"] += 1
        model = nnx.merge(self.graphdef, params)
        cfg = self.config
        bb = model.backbone
        cache = carry["cache"]
        b, s_len = cache["segment_ids"].shape
        n_steps = self.decode_block
        n_kv, hd = cfg.n_kv_heads, cfg.head_dim
        group = cfg.n_heads // n_kv
        stop_ids = consts["stop_ids"]
        pos0 = carry["pos"]
        cache_ok = (cache["segment_ids"] != 0) & (jnp.arange(s_len)[None, :] < pos0[:, None])
        cols = jnp.arange(n_steps)
        # Read-only cache in the layouts the attention dots want ([B, K, hd, S] keys,
        # [B, K, S, hd] values), transposed once per block rather than once per step.
        cache_kt = [jnp.transpose(lc["k"], (0, 2, 3, 1)) for lc in cache["layers"]]
        cache_vt = [jnp.transpose(lc["v"], (0, 2, 1, 3)) for lc in cache["layers"]]

        def forward(tok, pos, i, blocks, fed):
            """One token per row at `pos` -> (logits [B, V], blocks with column i written)."""
            mask = jnp.concatenate([cache_ok, fed & (cols[None, :] <= i)], axis=1)
            x = jnp.take(bb.embed[...], tok[:, None], axis=0).astype(cfg.jnp_dtype)
            rope = rotary_angles(pos[:, None], hd, cfg.rope_theta)
            new_blocks = []
            for layer, ck, cv, (bk, bv) in zip(bb.layers, cache_kt, cache_vt, blocks,
                                               strict=True):
                attn = layer.attn
                q, k, v = attn.project_qkv(layer.attn_norm(x), rope)
                bk = jax.lax.dynamic_update_slice(bk, k.astype(bk.dtype), (0, i, 0, 0))
                bv = jax.lax.dynamic_update_slice(bv, v.astype(bv.dtype), (0, i, 0, 0))
                new_blocks.append((bk, bv))
                qg = q[:, 0].reshape(b, n_kv, group, hd)
                ck, cv = ck.astype(q.dtype), cv.astype(q.dtype)
                scores = jnp.concatenate([
                    jnp.einsum("bkgd,bkds->bkgs", qg, ck, preferred_element_type=jnp.float32),
                    jnp.einsum("bkgd,bskd->bkgs", qg, bk.astype(q.dtype),
                               preferred_element_type=jnp.float32)], axis=-1) * hd ** -0.5
                scores = jnp.where(mask[:, None, None, :], scores, MASK_VALUE)
                probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
                out = (jnp.einsum("bkgs,bksd->bkgd", probs[..., :s_len], cv)
                       + jnp.einsum("bkgs,bskd->bkgd", probs[..., s_len:], bv.astype(q.dtype)))
                out = out.reshape(b, 1, cfg.n_heads, hd)
                x = x + jnp.einsum("blhk,hkd->bld", out, attn.o[...].astype(q.dtype))
                x = x + layer.mlp(layer.mlp_norm(x))
            return model.unembed(bb.final_norm(x))[:, 0], new_blocks

        def cond(c):
            i, st, _ = c
            return (i < n_steps) & ~jnp.all(st["done"])

        def body(c):
            i, st, out = c
            keys = jax.vmap(jax.random.fold_in)(consts["keys"], st["n_gen"])
            tok, lp, raw = sample_tokens(st["logits"], keys, consts["temperature"],
                                         consts["top_p"], consts["top_k"])
            live = ~st["done"]
            out = {"tokens": out["tokens"].at[:, i].set(tok),
                   "logprobs": out["logprobs"].at[:, i].set(lp),
                   "raw_logprobs": out["raw_logprobs"].at[:, i].set(raw)}
            n_gen = st["n_gen"] + live.astype(jnp.int32)
            hit_stop = live & jnp.any(tok[:, None] == stop_ids[None, :], axis=-1)
            hit_ctx = live & (st["pos"] + 1 >= consts["max_context"])
            hit_len = live & (n_gen >= consts["max_new"])
            reason = jnp.where(hit_len, _LENGTH, st["reason"])
            reason = jnp.where(hit_ctx, _CONTEXT, reason)
            reason = jnp.where(hit_stop, _STOP_TOKEN, reason)
            done = st["done"] | hit_stop | hit_ctx | hit_len
            feed = ~done  # finished rows are not fed; their block columns stay unused
            fed = st["fed"].at[:, i].set(feed)
            logits, blocks = forward(tok, st["pos"], i, st["blocks"], fed)
            st = {"logits": logits, "pos": st["pos"] + feed.astype(jnp.int32), "n_gen": n_gen,
                  "done": done, "reason": reason, "blocks": blocks, "fed": fed}
            return i + 1, st, out

        blk = (b, n_steps, n_kv, hd)
        st0 = {k: carry[k] for k in ("logits", "pos", "n_gen", "done", "reason")}
        st0["blocks"] = [(jnp.zeros(blk, lc["k"].dtype), jnp.zeros(blk, lc["v"].dtype))
                         for lc in cache["layers"]]
        st0["fed"] = jnp.zeros((b, n_steps), bool)
        out = {"tokens": jnp.zeros((b, n_steps), jnp.int32),
               "logprobs": jnp.zeros((b, n_steps), jnp.float32),
               "raw_logprobs": jnp.zeros((b, n_steps), jnp.float32)}
        _, st, out = jax.lax.while_loop(cond, body, (jnp.int32(0), st0, out))

        # Fed rows are fed contiguously from column 0, at positions pos0 + column.
        rows = jnp.broadcast_to(jnp.arange(b)[:, None], (b, n_steps))
        slots = jnp.where(st["fed"], pos0[:, None] + cols[None, :], s_len)
        new_cache = {
            "layers": [{"k": lc["k"].at[rows, slots].set(bk, mode="drop"),
                        "v": lc["v"].at[rows, slots].set(bv, mode="drop")}
                       for lc, (bk, bv) in zip(cache["layers"], st["blocks"], strict=True)],
            "segment_ids": cache["segment_ids"].at[rows, slots].set(1, mode="drop")}
        new_carry = {k: st[k] for k in ("logits", "pos", "n_gen", "done", "reason")}
        new_carry["cache"] = new_cache
        return new_carry, out

    def _grow_impl(self, cache, new_len):
        self.compilations["grow"] += 1
        pad = new_len - cache["segment_ids"].shape[1]

        def p(x):
            return jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))

        return jax.tree.map(p, cache)

    # -- public API --------------------------------------------------------------------

    def sample(self, params, prompts: Sequence[Sequence[int]], key, *, max_new_tokens: int,
               temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
               stop_token_ids: Sequence[int] = (), stop_strings: Sequence[str] = (),
               detokenize: Callable[[Sequence[int]], str] | None = None,
               return_state: bool = False):
        """Generate a continuation of each prompt.

        params: DecoderLM pure-dict params; prompts: non-empty lists of token ids;
        key: one PRNG key (typed or raw uint32 [2]) or one per prompt.
        Returns list[SampleOutput] (one per prompt), or (outputs, SamplerState) with
        `return_state=True` for a later `extend`.
        """
        n = len(prompts)
        if n == 0:
            raise SamplingError("prompts is empty; pass at least one prompt")
        for i, p in enumerate(prompts):
            if len(p) == 0:
                raise SamplingError(f"prompt {i} is empty; every row needs at least one token "
                                    "(e.g. the BOS id or the chat template's prefix)")
        b = self.buckets.batch(n)
        state = SamplerState(cache=None, cache_len=np.zeros(b, np.int64),
                             pending=[list(map(int, p)) for p in prompts], num_rows=n)
        outs, state = self._generate(params, state, [[] for _ in range(n)], key,
                                     max_new_tokens=max_new_tokens, temperature=temperature,
                                     top_p=top_p, top_k=top_k, stop_token_ids=stop_token_ids,
                                     stop_strings=stop_strings, detokenize=detokenize)
        return (outs, state) if return_state else outs

    def extend(self, params, state: SamplerState, new_tokens: Sequence[Sequence[int] | None],
               key, **kwargs) -> tuple[list[SampleOutput | None], SamplerState]:
        """Append `new_tokens[i]` (e.g. an observation) to row i's history and generate.

        Rows whose entry is None are skipped (their output is None, their history unchanged).
        Keyword arguments are those of `sample` (without `return_state`). The history is not
        recomputed: only the tokens after the cache's end are prefilled. Consumes `state`.
        """
        if len(new_tokens) != state.num_rows:
            raise SamplingError(f"new_tokens has {len(new_tokens)} rows; the state has "
                                f"{state.num_rows}")
        kwargs.pop("return_state", None)
        return self._generate(params, state, new_tokens, key, **kwargs)

    # -- host loop -------------------------------------------------------------------

    def _generate(self, params, state: SamplerState, new_tokens, key, *, max_new_tokens: int,
                  temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
                  stop_token_ids: Sequence[int] = (), stop_strings: Sequence[str] = (),
                  detokenize=None):
        params = self.serving_params(params)
        cfg, bk = self.config, self.buckets
        n = state.num_rows
        b = state.cache_len.shape[0]
        detok = detokenize or self.detokenize
        stop_strings = tuple(s for s in stop_strings if s)
        if stop_strings and detok is None:
            raise SamplingError("stop_strings need a detokenizer: pass detokenize= "
                                "(e.g. tokenizer.decode) to sample/extend or to Sampler")
        if max_new_tokens < 1:
            raise SamplingError(f"max_new_tokens = {max_new_tokens} must be >= 1")
        if not temperature >= 0:
            raise SamplingError(f"temperature = {temperature} must be >= 0 (0 = greedy)")
        if not 0 < top_p <= 1:
            raise SamplingError(f"top_p = {top_p} must be in (0, 1]")
        if top_k < 0:
            raise SamplingError(f"top_k = {top_k} must be >= 0 (0 = unrestricted)")
        for s in stop_token_ids:
            if not 0 <= int(s) < cfg.vocab_size:
                raise SamplingError(f"stop token id {s} outside the vocabulary [0, "
                                    f"{cfg.vocab_size})")

        active = np.zeros(b, bool)
        pending = [None] * n
        for i in range(n):
            if new_tokens[i] is None:
                continue
            toks = state.pending[i] + [int(t) for t in new_tokens[i]]
            if toks and (min(toks) < 0 or max(toks) >= cfg.vocab_size):
                raise SamplingError(f"row {i} has a token id outside the vocabulary [0, "
                                    f"{cfg.vocab_size})")
            pending[i] = toks
            active[i] = int(state.cache_len[i]) + len(toks) < self.max_context and bool(toks)
        start_len = state.cache_len.copy()
        for i in range(n):
            if active[i]:
                start_len[i] += len(pending[i])

        # Cache big enough for every live row's prefill and decode feeds.
        need = max([min(int(start_len[i]) + max_new_tokens, self.max_context)
                    for i in range(n) if active[i]] + [1])
        cache = state.cache
        s_len = bk.cache(need)
        if cache is None:
            cache = init_cache(cfg, b, s_len)
        elif cache["segment_ids"].shape[1] < need:
            cache = self._grow(cache, s_len)
        s_len = cache["segment_ids"].shape[1]

        # Prefill the pending tokens of live rows, chunk by chunk.
        logits = jnp.zeros((b, cfg.vocab_size), jnp.float32)
        lens = np.array([len(pending[i]) if active[i] else 0 for i in range(n)]
                        + [0] * (b - n))
        if active.any():
            c = bk.prefill_chunk
            width = bk.width(lens.max())
            toks = np.full((b, width), self.pad_id, np.int32)
            for i in range(n):
                if active[i]:
                    toks[i, :lens[i]] = pending[i]
            cols = np.arange(width)
            seg = (cols[None, :] < lens[:, None]).astype(np.int32)
            pos = (state.cache_len[:, None] + cols[None, :]).astype(np.int32)
            pos = np.where(seg > 0, pos, 0).astype(np.int32)
            for j in range(0, width, c):
                last = lens - 1 - j
                last = np.where((lens > 0) & (last >= 0) & (last < c), last, -1).astype(np.int32)
                if not (seg[:, j:j + c].any() or (last >= 0).any()):
                    continue
                cache, logits = self._prefill(params, cache, toks[:, j:j + c], pos[:, j:j + c],
                                              seg[:, j:j + c], last, logits)

        reason0 = np.zeros(b, np.int32)
        for i in range(n):
            if pending[i] is not None and not active[i]:
                reason0[i] = _CONTEXT
        n_stop = max(8, -(-len(stop_token_ids) // 8) * 8)
        stop_arr = np.full(n_stop, -1, np.int32)
        stop_arr[:len(stop_token_ids)] = np.asarray(stop_token_ids, np.int32)
        consts = {
            "keys": _as_row_keys(key, n, b),
            "temperature": jnp.full((b,), temperature, jnp.float32),
            "top_p": jnp.full((b,), top_p, jnp.float32),
            "top_k": jnp.full((b,), top_k, jnp.int32),
            "max_new": jnp.full((b,), max_new_tokens, jnp.int32),
            "max_context": jnp.int32(self.max_context),
            "stop_ids": jnp.asarray(stop_arr),
        }
        carry = {"cache": cache, "logits": logits, "pos": jnp.asarray(start_len, jnp.int32),
                 "n_gen": jnp.zeros((b,), jnp.int32), "done": jnp.asarray(~active),
                 "reason": jnp.asarray(reason0)}

        ids: list[list[int]] = [[] for _ in range(b)]
        lps: list[list[float]] = [[] for _ in range(b)]
        raws: list[list[float]] = [[] for _ in range(b)]
        final_reason = reason0.copy()
        matched: list[str | None] = [None] * b
        discarded = np.zeros(b, np.int64)
        host_done = ~active
        n_prev = np.zeros(b, np.int64)
        while not host_done.all():
            carry, out = self._decode(params, carry, consts)
            n_gen = np.asarray(carry["n_gen"])
            dev_reason = np.asarray(carry["reason"])
            dev_done = np.asarray(carry["done"])
            tok = np.asarray(out["tokens"])
            lp = np.asarray(out["logprobs"])
            raw = np.asarray(out["raw_logprobs"])
            newly_stopped = np.zeros(b, bool)
            for i in range(n):
                if host_done[i]:
                    continue
                k = int(n_gen[i] - n_prev[i])
                ids[i].extend(int(t) for t in tok[i, :k])
                lps[i].extend(lp[i, :k].tolist())
                raws[i].extend(raw[i, :k].tolist())
                if k and stop_strings:
                    cut = _first_stop(detok, ids[i], int(n_prev[i]), stop_strings)
                    if cut is not None:
                        kept, s = cut
                        same_token_stop = kept == len(ids[i]) and dev_reason[i] == _STOP_TOKEN
                        if not same_token_stop:
                            discarded[i] = len(ids[i]) - kept
                            del ids[i][kept:], lps[i][kept:], raws[i][kept:]
                            final_reason[i] = _STOP_STRING
                            matched[i] = s
                            host_done[i] = True
                            newly_stopped[i] = True
                            continue
                if dev_done[i]:
                    final_reason[i] = dev_reason[i]
                    host_done[i] = True
            n_prev = n_gen.astype(np.int64)
            host_done[n:] = True
            if newly_stopped.any() and not host_done.all():
                carry = dict(carry, done=jnp.asarray(dev_done | newly_stopped))

        outs: list[SampleOutput | None] = []
        new_len = state.cache_len.copy()
        new_pending: list[list[int]] = []
        for i in range(n):
            if pending[i] is None:
                outs.append(None)
                new_pending.append(state.pending[i])
                continue
            if not active[i]:  # history already fills the context: nothing generated
                new_pending.append(pending[i])
            else:
                new_len[i] = start_len[i] + len(ids[i]) - 1
                new_pending.append(ids[i][-1:])
            outs.append(SampleOutput(
                token_ids=ids[i], logprobs=np.asarray(lps[i], np.float32),
                raw_logprobs=np.asarray(raws[i], np.float32),
                stop_reason=_REASONS[int(final_reason[i])], stop_string=matched[i],
                num_discarded=int(discarded[i]),
                text=detok(ids[i]) if detok is not None else None))
        new_state = SamplerState(cache=carry["cache"], cache_len=new_len, pending=new_pending,
                                 num_rows=n)
        return outs, new_state


def _first_stop(detok, ids: list[int], checked: int,
                stop_strings: tuple[str, ...]) -> tuple[int, str] | None:
    """Shortest prefix length k > checked whose text contains a stop string, and that string."""

    def hit(k: int) -> str | None:
        text = detok(ids[:k])
        for s in stop_strings:
            if s in text:
                return s
        return None

    if hit(len(ids)) is None:
        return None
    lo, hi = checked, len(ids)  # hit(lo) is None (checked before), hit(hi) is not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if hit(mid) is None:
            lo = mid
        else:
            hi = mid
    return hi, hit(hi)
