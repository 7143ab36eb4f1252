"""Sampler (KV cache, stopping, buckets, multi-turn) and chunked training-side log-probs.

One small model and one shared Sampler (batch bucket 4, cache bucket 32/64/128) are reused
across tests so each jitted function compiles only a few times.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from terminal_rsi.models import logprobs as lpm
from terminal_rsi.models.config import ModelConfig
from terminal_rsi.models.sampling import (
    Buckets,
    Sampler,
    SamplingError,
    StopReason,
    sample_tokens,
    sampling_logits,
)
from terminal_rsi.models.transformer import DecoderLM

CFG = ModelConfig(vocab_size=96, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8,
                  d_ff=64, max_seq_len=128)
BUCKETS = Buckets(prefill_chunk=8, cache_multiple=32, batch_multiple=4, power_of_two=False)
_MODEL = DecoderLM(CFG, rngs=nnx.Rngs(0))
GRAPHDEF, _STATE = nnx.split(_MODEL)
PARAMS = nnx.to_pure_dict(_STATE)
SAMPLER = Sampler(GRAPHDEF, CFG, buckets=BUCKETS, decode_block=4)
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10, 11, 12, 13], [20, 21, 22, 23, 24, 25]]


def _ab(ids):
    """Test detokenizer: even ids -> 'a', odd ids -> 'b'."""
    return "".join("a" if int(i) % 2 == 0 else "b" for i in ids)


@jax.jit
def _full_logits(params, tokens, segment_ids):
    return nnx.merge(GRAPHDEF, params)(tokens, None, segment_ids)[0]


def _reference_greedy(prompts, n_new, width=40):
    """Uncached greedy decode: recompute the whole (right-padded) prefix for every token."""
    b = len(prompts)
    toks = np.zeros((b, width), np.int32)
    lens = np.array([len(p) for p in prompts])
    for i, p in enumerate(prompts):
        toks[i, :len(p)] = p
    out, raw = [[] for _ in range(b)], [[] for _ in range(b)]
    for _ in range(n_new):
        seg = (np.arange(width)[None] < lens[:, None]).astype(np.int32)
        logits = np.asarray(_full_logits(PARAMS, toks, seg))
        for i in range(b):
            row = logits[i, lens[i] - 1].astype(np.float64)
            t = int(np.argmax(row))
            out[i].append(t)
            raw[i].append(row[t] - np.log(np.exp(row - row.max()).sum()) - row.max())
            toks[i, lens[i]] = t
        lens = lens + 1
    return out, raw


def _np_sampling_logprobs(logits, temp, top_p, top_k):
    """NumPy reference of the filtered sampling distribution (log-probs, -inf outside)."""
    z = logits.astype(np.float64) / temp
    order = np.argsort(-z, kind="stable")
    keep = np.zeros(z.shape, bool)
    k = top_k if top_k > 0 else len(z)
    kth = z[order[k - 1]]
    cand = [j for j in order if z[j] >= kth]
    p = np.exp(z[cand] - z[cand].max())
    p /= p.sum()
    mass = 0.0
    thr = None
    for j, pj in zip(cand, p, strict=True):
        if mass < top_p or top_p >= 1:
            thr = z[j]
        mass += pj
    keep[[j for j in cand if z[j] >= thr]] = True
    out = np.full(z.shape, -np.inf)
    zz = z[keep]
    out[keep] = zz - zz.max() - np.log(np.exp(zz - zz.max()).sum())
    return out


# ----------------------------------------------------------------------------- pure functions


class SamplingFunctionsTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_sampling_logits_match_numpy(self):
        rng = np.random.default_rng(0)
        logits = rng.standard_normal((4, 16)).astype(np.float32) * 2
        temp = np.array([0.7, 1.0, 1.3, 0.5], np.float32)
        top_p = np.array([1.0, 0.5, 0.9, 0.3], np.float32)
        top_k = np.array([0, 3, 0, 5], np.int32)
        got = np.asarray(jax.nn.log_softmax(
            self.variant(sampling_logits)(logits, temp, top_p, top_k), axis=-1))
        for i in range(4):
            want = _np_sampling_logprobs(logits[i], temp[i], top_p[i], top_k[i])
            np.testing.assert_array_equal(np.isfinite(got[i]), np.isfinite(want))
            fin = np.isfinite(want)
            np.testing.assert_allclose(got[i][fin], want[fin], rtol=1e-5, atol=1e-5)

    @chex.variants(with_jit=True, without_jit=True)
    def test_sample_tokens_frequencies_and_greedy(self):
        logits = np.array([[2.0, 1.5, 1.0, 0.2, -1.0]], np.float32)
        n = 2000
        keys = jax.random.split(jax.random.key(1), n)
        fn = self.variant(lambda k: sample_tokens(
            jnp.broadcast_to(logits, (n, 5)), k, jnp.full((n,), 0.8), jnp.ones((n,)),
            jnp.full((n,), 3, jnp.int32)))
        tok, lp, raw = (np.asarray(x) for x in fn(keys))
        want = _np_sampling_logprobs(logits[0], 0.8, 1.0, 3)
        freq = np.bincount(tok, minlength=5) / n
        np.testing.assert_allclose(freq, np.exp(want), atol=0.04)  # ~3.5 sigma
        assert freq[3] == freq[4] == 0
        np.testing.assert_allclose(lp, want[tok], rtol=1e-5)
        np.testing.assert_allclose(raw, jax.nn.log_softmax(logits[0])[tok], rtol=1e-5)
        g_tok, g_lp, _ = self.variant(sample_tokens)(
            logits, keys[:1], jnp.zeros((1,)), jnp.ones((1,)), jnp.zeros((1,), jnp.int32))
        assert int(g_tok[0]) == 0 and float(g_lp[0]) == 0.0


# ----------------------------------------------------------------------------- sampler


def test_greedy_matches_uncached_reference():
    outs = SAMPLER.sample(PARAMS, PROMPTS, jax.random.key(0), max_new_tokens=9, temperature=0)
    want, want_raw = _reference_greedy(PROMPTS, 9)
    for o, w, r in zip(outs, want, want_raw, strict=True):
        assert o.token_ids == w
        assert o.stop_reason is StopReason.LENGTH
        np.testing.assert_array_equal(o.logprobs, 0.0)
        np.testing.assert_allclose(o.raw_logprobs, r, atol=2e-5)


def test_sampler_logprobs_match_training_side():
    outs = SAMPLER.sample(PARAMS, PROMPTS, jax.random.key(3), max_new_tokens=12)
    width = 32
    toks = np.zeros((len(PROMPTS), width), np.int32)
    seg = np.zeros_like(toks)
    gen_mask = np.zeros(toks.shape, bool)
    samp = np.zeros(toks.shape, np.float32)
    for i, (p, o) in enumerate(zip(PROMPTS, outs, strict=True)):
        seq = p + o.token_ids
        toks[i, :len(seq)] = seq
        seg[i, :len(seq)] = 1
        gen_mask[i, len(p):len(seq)] = True
        samp[i, len(p):len(seq)] = o.logprobs
        np.testing.assert_array_equal(o.logprobs, o.raw_logprobs)  # T = 1, no filtering
    pos = np.broadcast_to(np.arange(width, dtype=np.int32), toks.shape)
    train = jax.jit(lpm.chunked_token_logprobs, static_argnums=1,
                    static_argnames="chunk_size")(PARAMS, GRAPHDEF, toks, pos, seg, chunk_size=8)
    gap = float(lpm.logprob_gap(samp, train, gen_mask)["logprob_gap_mean_abs"])
    want_gap = np.abs(samp - np.asarray(train))[gen_mask].mean()
    np.testing.assert_allclose(gap, want_gap, rtol=1e-5, atol=1e-9)
    assert gap < 1e-4, gap


def test_deterministic_for_a_key_and_key_matters():
    kw = dict(max_new_tokens=8, temperature=1.0, top_p=0.9)
    a = SAMPLER.sample(PARAMS, PROMPTS, jax.random.key(7), **kw)
    b = SAMPLER.sample(PARAMS, PROMPTS, jax.random.key(7), **kw)
    c = SAMPLER.sample(PARAMS, PROMPTS, jax.random.key(8), **kw)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x.logprobs, y.logprobs)
    assert [o.token_ids for o in a] != [o.token_ids for o in c]
    raw_key = jax.random.key_data(jax.random.key(7))  # raw uint32 keys are accepted too
    d = SAMPLER.sample(PARAMS, PROMPTS, raw_key, **kw)
    assert [o.token_ids for o in a] == [o.token_ids for o in d]


def test_top_k_one_and_tiny_top_p_equal_greedy():
    greedy = SAMPLER.sample(PARAMS, PROMPTS, jax.random.key(0), max_new_tokens=8, temperature=0)
    k1 = SAMPLER.sample(PARAMS, PROMPTS, jax.random.key(5), max_new_tokens=8, top_k=1,
                        temperature=1.3)
    p0 = SAMPLER.sample(PARAMS, PROMPTS, jax.random.key(6), max_new_tokens=8, top_p=1e-6)
    for g, a, b in zip(greedy, k1, p0, strict=True):
        assert a.token_ids == g.token_ids and b.token_ids == g.token_ids
        np.testing.assert_allclose(a.logprobs, 0.0, atol=1e-6)  # a point mass
        np.testing.assert_allclose(b.raw_logprobs, g.raw_logprobs, atol=1e-6)


def test_rows_independent_of_batch_composition_with_per_row_keys():
    keys = jax.random.split(jax.random.key(11), len(PROMPTS))
    batch = SAMPLER.sample(PARAMS, PROMPTS, keys, max_new_tokens=7, temperature=0.9)
    for i, p in enumerate(PROMPTS):
        alone = SAMPLER.sample(PARAMS, [p], keys[i:i + 1], max_new_tokens=7, temperature=0.9)[0]
        assert alone.token_ids == batch[i].token_ids
        np.testing.assert_allclose(alone.logprobs, batch[i].logprobs, atol=1e-5)


def test_stop_token_ids_stop_rows_independently():
    key = jax.random.key(21)
    free = SAMPLER.sample(PARAMS, PROMPTS, key, max_new_tokens=14)
    stop = free[0].token_ids[4]
    stopped = SAMPLER.sample(PARAMS, PROMPTS, key, max_new_tokens=14, stop_token_ids=[stop, 95])
    n_stopped = 0
    for f, s in zip(free, stopped, strict=True):
        cut = [j for j, t in enumerate(f.token_ids) if t in (stop, 95)]
        if cut:
            n_stopped += 1
            assert s.token_ids == f.token_ids[:cut[0] + 1]
            assert s.stop_reason is StopReason.STOP_TOKEN
        else:
            assert s.token_ids == f.token_ids and s.stop_reason is StopReason.LENGTH
        np.testing.assert_allclose(s.logprobs, f.logprobs[:len(s.logprobs)], atol=1e-6)
    assert n_stopped >= 1 and len(stopped[0].token_ids) <= 5


def test_stop_strings_keep_shortest_prefix_across_blocks():
    key = jax.random.key(33)
    free = SAMPLER.sample(PARAMS, PROMPTS, key, max_new_tokens=16)
    stops = ("aaa", "bbab")
    got = SAMPLER.sample(PARAMS, PROMPTS, key, max_new_tokens=16, stop_strings=stops,
                         detokenize=_ab)
    hits = 0
    for f, g in zip(free, got, strict=True):
        k = next((k for k in range(1, 17) if any(s in _ab(f.token_ids[:k]) for s in stops)),
                 None)
        if k is None:
            assert g.token_ids == f.token_ids and g.stop_reason is StopReason.LENGTH
            continue
        hits += 1
        assert g.token_ids == f.token_ids[:k]
        assert g.stop_reason is StopReason.STOP_STRING and g.stop_string in g.text
        assert g.text == _ab(g.token_ids)
        # Discarded ids are the rest of the decode block (blocks of 4 tokens).
        assert g.num_discarded == min(-(-k // 4) * 4, 16) - k
    assert hits >= 2
    with pytest.raises(SamplingError, match="detokenize"):
        SAMPLER.sample(PARAMS, PROMPTS, key, max_new_tokens=4, stop_strings=stops)


def test_length_and_context_limits():
    prompts = [list(range(1, 6)), [7] * 120, [9] * 128]
    outs = SAMPLER.sample(PARAMS, prompts, jax.random.key(2), max_new_tokens=12)
    assert len(outs[0].token_ids) == 12 and outs[0].stop_reason is StopReason.LENGTH
    assert len(outs[1].token_ids) == 8 and outs[1].stop_reason is StopReason.CONTEXT
    assert outs[2].token_ids == [] and outs[2].stop_reason is StopReason.CONTEXT
    assert outs[2].logprobs.shape == (0,)


def test_bucket_rounding():
    b = Buckets(prefill_chunk=8, cache_multiple=32, batch_multiple=4, power_of_two=True)
    assert [b.batch(n) for n in (1, 4, 5, 9, 17)] == [4, 4, 8, 16, 32]
    assert [b.cache(n) for n in (1, 32, 33, 65, 200)] == [32, 32, 64, 128, 256]
    assert [b.width(n) for n in (1, 8, 9)] == [8, 8, 16]
    assert [BUCKETS.cache(n) for n in (33, 65, 97)] == [64, 96, 128]


def test_bucketing_bounds_compilations():
    rng = np.random.default_rng(0)
    SAMPLER.sample(PARAMS, [[1]], jax.random.key(0), max_new_tokens=2)  # bucket (4, 32)
    before = dict(SAMPLER.compilations)
    for n_rows in (1, 2, 3, 4):
        prompts = [rng.integers(0, 96, rng.integers(1, 20)).tolist() for _ in range(n_rows)]
        SAMPLER.sample(PARAMS, prompts, jax.random.key(n_rows), max_new_tokens=int(
            rng.integers(1, 12)), temperature=float(rng.uniform(0, 1.5)),
            top_k=int(rng.integers(0, 5)), stop_token_ids=[int(rng.integers(0, 96))])
    assert SAMPLER.compilations == before  # same (batch, cache) bucket: no retrace
    SAMPLER.sample(PARAMS, [[2] * 100], jax.random.key(1), max_new_tokens=20)  # cache 128
    mid = dict(SAMPLER.compilations)
    assert all(mid[k] - before[k] <= 1 for k in ("prefill", "decode")) and mid["grow"] == 0
    SAMPLER.sample(PARAMS, [[3] * 90, [4] * 7], jax.random.key(2), max_new_tokens=30)
    assert SAMPLER.compilations == mid


def test_extend_equals_fresh_prefill_of_concatenated_history():
    kw = dict(max_new_tokens=6, stop_token_ids=[3, 17])
    turn1, state = SAMPLER.sample(PARAMS, PROMPTS, jax.random.key(4), return_state=True, **kw)
    obs = [[40, 41, 42], [50], [60, 61, 62, 63, 64, 65, 66, 67, 68, 69]]
    key2 = jax.random.key(9)
    kw2 = dict(max_new_tokens=20, temperature=0.8, top_k=20)
    turn2, state2 = SAMPLER.extend(PARAMS, state, obs, key2, **kw2)
    history = [p + t.token_ids + o for p, t, o in zip(PROMPTS, turn1, obs, strict=True)]
    fresh = SAMPLER.sample(PARAMS, history, key2, **kw2)
    for e, f in zip(turn2, fresh, strict=True):
        assert e.token_ids == f.token_ids
        np.testing.assert_allclose(e.logprobs, f.logprobs, atol=1e-5)
        np.testing.assert_allclose(e.raw_logprobs, f.raw_logprobs, atol=1e-5)
    full = [h + t.token_ids for h, t in zip(history, turn2, strict=True)]
    assert state2.history_lengths() == [len(h) for h in full]
    # A third turn with one row skipped (None): that row is untouched.
    turn3, state3 = SAMPLER.extend(PARAMS, state2, [[5, 6], None, [7]], jax.random.key(10),
                                   max_new_tokens=3, temperature=0)
    assert turn3[1] is None and state3.history_lengths()[1] == len(full[1])
    fresh3 = SAMPLER.sample(PARAMS, [full[0] + [5, 6], full[2] + [7]], jax.random.key(0),
                            max_new_tokens=3, temperature=0)
    assert [turn3[0].token_ids, turn3[2].token_ids] == [o.token_ids for o in fresh3]


def test_bad_arguments_raise_typed_errors():
    key = jax.random.key(0)
    with pytest.raises(SamplingError, match="empty"):
        SAMPLER.sample(PARAMS, [[1], []], key, max_new_tokens=2)
    with pytest.raises(SamplingError, match="top_p"):
        SAMPLER.sample(PARAMS, [[1]], key, max_new_tokens=2, top_p=0.0)
    with pytest.raises(SamplingError, match="vocabulary"):
        SAMPLER.sample(PARAMS, [[1, 500]], key, max_new_tokens=2)
    with pytest.raises(SamplingError, match="max_new_tokens"):
        SAMPLER.sample(PARAMS, [[1]], key, max_new_tokens=0)


# ----------------------------------------------------------------------------- training side


def _np_token_logprobs(tokens, segment_ids):
    """Reference: full logits (no chunking), NumPy log-softmax, per-segment shift."""
    logits = np.asarray(_full_logits(PARAMS, tokens, segment_ids), np.float64)
    b, length = tokens.shape
    out = np.zeros((b, length))
    for i in range(b):
        for j in range(1, length):
            if segment_ids[i, j] != 0 and segment_ids[i, j] == segment_ids[i, j - 1]:
                row = logits[i, j - 1]
                lse = row.max() + np.log(np.exp(row - row.max()).sum())
                out[i, j] = row[tokens[i, j]] - lse
    return out


class ChunkedLogprobsTest(chex.TestCase):
    def setUp(self):
        super().setUp()
        rng = np.random.default_rng(5)
        self.tokens = rng.integers(0, 96, (2, 11)).astype(np.int32)
        # Row 0: two packed segments then padding; row 1: one segment.
        self.seg = np.array([[1] * 5 + [2] * 4 + [0] * 2, [1] * 11], np.int32)
        self.pos = np.array([list(range(5)) + list(range(4)) + [0, 0], list(range(11))],
                            np.int32)

    @chex.variants(with_jit=True, without_jit=True)
    def test_chunked_matches_numpy_reference(self):
        fn = self.variant(lambda p, t, pos, s: lpm.chunked_token_logprobs(
            p, GRAPHDEF, t, pos, s, chunk_size=4))
        got = fn(PARAMS, self.tokens, self.pos, self.seg)
        want = _np_token_logprobs(self.tokens, self.seg)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

    @chex.variants(with_jit=True)  # op-by-op values are covered by the reference test above
    def test_chunked_equals_unchunked_values_and_grads(self):
        mask = jnp.asarray(self.seg != 0, jnp.float32)

        def loss(p, chunk):
            lp = lpm.chunked_token_logprobs(p, GRAPHDEF, self.tokens, self.pos, self.seg,
                                            chunk_size=chunk)
            return jnp.sum(lp * mask), lp

        (v3, lp3), g3 = self.variant(jax.value_and_grad(lambda p: loss(p, 3), has_aux=True))(
            PARAMS)
        (v11, lp11), g11 = self.variant(jax.value_and_grad(lambda p: loss(p, 64),
                                                           has_aux=True))(PARAMS)
        np.testing.assert_allclose(lp3, lp11, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(v3, v11, rtol=1e-6)
        chex.assert_trees_all_close(g3, g11, rtol=1e-4, atol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_logprobs_from_hidden_temperature(self):
        rng = np.random.default_rng(2)
        h = rng.standard_normal((2, 7, 5)).astype(np.float32)
        w = rng.standard_normal((5, 9)).astype(np.float32)
        t = rng.integers(0, 9, (2, 7)).astype(np.int32)
        got = self.variant(lambda h, w, t: lpm.logprobs_from_hidden(
            h, w, t, chunk_size=3, temperature=0.5))(h, w, t)
        z = (h.astype(np.float64) @ w) / 0.5
        lse = z.max(-1) + np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1))
        want = np.take_along_axis(z, t[..., None], -1)[..., 0] - lse
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

    @chex.variants(with_jit=True, without_jit=True)
    def test_logprob_gap(self):
        a = np.array([[0.0, -1.0, -2.0], [-0.5, -0.25, 0.0]], np.float32)  # rollout
        b = np.array([[9.0, -1.5, -2.0], [-0.4, -0.25, 3.0]], np.float32)  # train
        m = np.array([[0, 1, 1], [1, 1, 0]], bool)
        got = self.variant(lpm.logprob_gap)(a, b, m)
        # d = train - rollout on the masked tokens: -0.5, 0, 0.1, 0
        np.testing.assert_allclose(got["logprob_gap_mean_abs"], (0.5 + 0 + 0.1 + 0) / 4,
                                   rtol=1e-6)
        np.testing.assert_allclose(got["logprob_gap_max_abs"], 0.5, rtol=1e-6)
        np.testing.assert_allclose(got["logprob_gap_mean"], (-0.5 + 0.1) / 4, rtol=1e-5)
        rng = np.random.default_rng(0)  # against a float64 NumPy reference
        a, b = rng.normal(size=(2, 3, 7)).astype(np.float32)
        m = rng.random((3, 7)) < 0.5
        d = b.astype(np.float64)[m] - a.astype(np.float64)[m]
        got = self.variant(lpm.logprob_gap)(a, b, m)
        np.testing.assert_allclose(
            [got[k] for k in ("logprob_gap_mean_abs", "logprob_gap_max_abs",
                              "logprob_gap_mean")],
            [np.abs(d).mean(), np.abs(d).max(), d.mean()], rtol=1e-5, atol=1e-7)
        empty = self.variant(lpm.logprob_gap)(a, b, np.zeros_like(m))
        assert all(float(v) == 0.0 for v in empty.values())
