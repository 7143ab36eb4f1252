"""RSR that cannot forget from a tiny Q_clean: the SFT trust region toward the input actor
(`sft.kl_coef`, `losses.kl_to_reference`) and the empty-Q_clean floor (no SFT step)."""

import json
import os
from types import SimpleNamespace as NS

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from absl.testing import parameterized

from terminal_rsi.agent import HarnessConfig, RolloutEngine
from terminal_rsi.models.loading import import_params
from terminal_rsi.models.tokenizer import ByteTokenizer
from terminal_rsi.rsr import stage as stage_mod
from terminal_rsi.rsr.base_sft import runbook_for_task
from terminal_rsi.rsr.common import RSR_SCORER
from terminal_rsi.rsr.guidance import EXEC_INSTRUCTION
from terminal_rsi.rsr.reviewer import privileged_strings
from terminal_rsi.rsr.sft import make_sft_step, sft_loss_parts
from terminal_rsi.rsr.stage import fresh_execute, run_rsr
from terminal_rsi.tasks.builtin import make_task
from terminal_rsi.training.alignment import trained_mask
from terminal_rsi.training.losses import Aggregation, kl_to_reference
from tests.rpr.helpers import states, toy_batch
from tests.rsr.helpers import follower_policy, tiny_stage_config

SFT_KEYS = ("tokens", "positions", "segment_ids", "gen_mask")


def _np_kl_loss(logits, ref_logits, mask, seg, aggregation):
    """NumPy reference (float64, softmax by hand): kl_t = KL(softmax(z[t-1]) ‖ softmax(r[t-1]))
    at masked positions t whose previous position lies in the same non-zero segment (else 0),
    aggregated over samples (row, segment) like Eq. 3; returns (loss, Σ kl)."""
    def log_softmax(z):
        z = np.asarray(z, np.float64)
        return z - (np.log(np.sum(np.exp(z - z.max()))) + z.max())

    per_sample: dict = {}
    b_n, length = mask.shape
    for b in range(b_n):
        for t in range(length):
            if not mask[b, t]:
                continue
            key = (b, int(seg[b, t]) if seg is not None else 0)
            kl = 0.0
            same = seg is None or (seg[b, t] != 0 and seg[b, t] == seg[b, t - 1])
            if t >= 1 and same:
                lp, lq = log_softmax(logits[b, t - 1]), log_softmax(ref_logits[b, t - 1])
                kl = float(np.sum(np.exp(lp) * (lp - lq)))
            per_sample.setdefault(key, []).append(kl)
    total = sum(sum(v) for v in per_sample.values())
    if aggregation is Aggregation.TOKEN_MEAN:
        loss = total / sum(len(v) for v in per_sample.values())
    elif aggregation is Aggregation.SEQUENCE_SUM:
        loss = total / len(per_sample)
    else:
        loss = float(np.mean([np.mean(v) for v in per_sample.values()]))
    return loss, total


def _toy_logits(seed=0, b=3, length=7, v=5):
    rng = np.random.default_rng(seed)
    seg = np.array([[1, 1, 1, 1, 2, 2, 0],
                    [1, 1, 1, 1, 1, 1, 1],
                    [1, 1, 2, 2, 2, 0, 0]], np.int32)
    gen = np.array([[0, 1, 1, 0, 1, 1, 0],   # position 4 starts segment 2: no prefix
                    [0, 0, 1, 1, 1, 0, 1],
                    [1, 1, 0, 1, 1, 0, 0]], bool)
    return (rng.normal(size=(b, length, v)).astype(np.float32) * 2,
            rng.normal(size=(b, length, v)).astype(np.float32) * 2, seg, gen)


class KLToReferenceTest(parameterized.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(*Aggregation)
    def test_matches_numpy_reference(self, aggregation):
        logits, ref, seg, gen = _toy_logits()
        fn = self.variant(lambda z, r, m, s: kl_to_reference(z, r, m, aggregation,
                                                             segment_ids=s))
        # the raw gen mask (a segment-start token counts as a sample token with KL 0) and
        # the trained mask of the SFT loss
        for mask in (gen, np.asarray(trained_mask(gen, seg))):
            parts = fn(logits, ref, mask, seg)
            want, want_sum = _np_kl_loss(logits, ref, mask, seg, aggregation)
            np.testing.assert_allclose(float(parts.loss), want, rtol=1e-5)
            np.testing.assert_allclose(float(parts.stats["kl_ref_sum"]), want_sum, rtol=1e-5)
            assert float(parts.stats["tokens"]) == mask.sum()

    @chex.variants(with_jit=True, without_jit=True)
    def test_without_segments_rows_are_samples(self):
        logits, ref, _, gen = _toy_logits(seed=1)
        fn = self.variant(lambda z, r, m: kl_to_reference(z, r, m, Aggregation.SAMPLE_MEAN))
        want, _ = _np_kl_loss(logits, ref, gen, None, Aggregation.SAMPLE_MEAN)
        np.testing.assert_allclose(float(fn(logits, ref, gen).loss), want, rtol=1e-5)

    def test_zero_at_the_reference_and_reference_detached(self):
        logits, ref, seg, gen = _toy_logits(seed=2)
        parts = kl_to_reference(logits, logits, gen, segment_ids=seg)
        assert float(parts.total) == 0.0 and float(parts.stats["kl_ref_sum"]) == 0.0
        g_ref = jax.grad(lambda r: kl_to_reference(logits, r, gen, segment_ids=seg).total)(ref)
        assert not np.any(np.asarray(g_ref))
        g = jax.grad(lambda z: kl_to_reference(z, ref, gen, segment_ids=seg).total)(logits)
        assert np.any(np.asarray(g))  # it does pull π_θ


def _batch():
    return {k: jnp.asarray(v) for k, v in toy_batch().items() if k in SFT_KEYS}


def _sgd_state(lr=0.5):
    """The tiny actor with plain SGD: the update is linear in the gradient (Adam's first
    step is sign-like and flips on float noise near zero)."""
    actor, _ = states()
    tx = optax.sgd(lr)
    st = jax.tree.map(jnp.copy, actor)
    return st.replace(tx=tx, opt_state=tx.init(st.params))


def _kl_to(actor, ref_params, batch):
    """Token-mean KL(π_actor ‖ π_ref) over the SFT positions of `batch`, and the parameter
    distance ‖θ - θ_ref‖₂."""
    parts = sft_loss_parts(actor.params, actor.graphdef, batch, Aggregation.TOKEN_MEAN, 1.0,
                           ref_params)
    dist = optax.tree.norm(jax.tree.map(jnp.subtract, actor.params, ref_params))
    return float(parts.stats["kl_ref_sum"] / parts.stats["tokens"]), float(dist)


def _rel_diff(a, b) -> float:
    """‖a - b‖₂ / ‖b‖₂ over two pytrees."""
    return float(optax.tree.norm(jax.tree.map(jnp.subtract, a, b)) / optax.tree.norm(b))


@pytest.mark.parametrize("aggregation", [Aggregation.SEQUENCE_SUM, Aggregation.SAMPLE_MEAN])
def test_equal_params_give_the_plain_eq3_update(aggregation):
    """At θ = θ_ref the KL and its gradient are 0: the loss parts, the gradient and the first
    step with kl_coef > 0 equal those of the plain step (which ignores ref_params)."""
    batch = _batch()
    st = _sgd_state()
    ref = jax.tree.map(jnp.copy, st.params)
    plain = sft_loss_parts(st.params, st.graphdef, batch, aggregation)
    trust = sft_loss_parts(st.params, st.graphdef, batch, aggregation, 10.0, ref)
    assert abs(float(trust.stats["kl_ref_sum"])) < 1e-6
    np.testing.assert_allclose(float(trust.loss), float(plain.loss), rtol=1e-5)
    # the KL term adds no gradient at θ_ref (the same full-logits path at a vanishing and a
    # large coefficient), and the total matches the plain (chunked log-prob) path
    g0, g_tiny, g_big = [jax.jit(jax.grad(lambda p, c=c: sft_loss_parts(
        p, st.graphdef, batch, aggregation, c, ref).total))(st.params) for c in (0.0, 1e-12, 10.0)]
    assert _rel_diff(g_big, g_tiny) < 1e-5   # float32 round-off only (measured ~7e-7)
    assert _rel_diff(g_big, g0) < 1e-4
    s0, m0 = make_sft_step(aggregation, donate=False)(jax.tree.map(jnp.copy, st), batch, ref)
    s1, m1 = make_sft_step(aggregation, donate=False, kl_coef=10.0)(
        jax.tree.map(jnp.copy, st), batch, ref_params=ref)
    # (in one compiled program the two forwards may fuse differently: round-off, ~1e-8)
    assert "kl_ref" not in m0 and abs(float(m1["kl_ref"])) < 1e-6
    for key in ("loss", "grad_norm", "tokens", "nll_per_token"):
        np.testing.assert_allclose(float(m0[key]), float(m1[key]), rtol=1e-4)
    d0, d1 = (jax.tree.map(jnp.subtract, x.params, st.params) for x in (s0, s1))
    assert float(optax.tree.norm(d0)) > 0 and _rel_diff(d1, d0) < 1e-4
    # the reference stays what it was (not donated, not updated)
    chex.assert_trees_all_equal(ref, st.params)


def test_kl_step_accumulates_exactly_over_microbatches():
    """Away from the reference (π_ref: the params scaled by 0.9) the trust-region step gives
    the same loss, kl_ref and gradient norm on 1 and 2 microbatches."""
    batch = _batch()
    st = _sgd_state()
    ref = jax.tree.map(lambda x: 0.9 * x, st.params)
    outs = [make_sft_step(Aggregation.SAMPLE_MEAN, m, donate=False, kl_coef=2.0)(
        jax.tree.map(jnp.copy, st), batch, ref_params=ref)[1] for m in (1, 2)]
    assert float(outs[0]["kl_ref"]) > 1e-4
    for key in ("loss", "kl_ref", "grad_norm", "nll_per_token", "tokens"):
        np.testing.assert_allclose(float(outs[0][key]), float(outs[1][key]), rtol=1e-4)


def test_kl_step_needs_reference_params():
    batch = _batch()
    with pytest.raises(ValueError, match="ref_params"):
        make_sft_step(kl_coef=1.0, donate=False)(_sgd_state(), batch)


def test_large_kl_coef_keeps_the_actor_near_its_input():
    """Same batches, same optimizer: with a large kl_coef the fine-tuned actor ends closer to
    the input actor, in KL on the SFT positions and in parameter distance, and its metrics
    log kl_ref."""
    batch = _batch()
    actor, _ = states()
    ref = jax.tree.map(jnp.copy, actor.params)
    out = {}
    for coef in (0.0, 30.0):
        st = jax.tree.map(jnp.copy, actor)
        step = make_sft_step(Aggregation.TOKEN_MEAN, donate=False, kl_coef=coef)
        for _ in range(15):
            st, mt = step(st, batch, ref_params=ref)
        assert ("kl_ref" in mt) == (coef > 0)
        out[coef] = _kl_to(st, ref, batch)
    (kl0, d0), (kl1, d1) = out[0.0], out[30.0]
    assert kl0 > 0 and kl1 < 0.1 * kl0, out  # measured: 3.8 vs 0.018 nats per token
    assert d1 < d0, out


# ----------------------------------------------------------------------------- the floor


def test_finetune_takes_no_step_on_an_empty_q_clean():
    """Self-rehearsal alone never trains: 0 steps, the input actor back unchanged, and why."""
    actor, _ = states()
    st = NS(config=tiny_stage_config(**{"sft.rehearsal_samples": 2, "sft.epochs": 1.0,
                                        "sft.kl_coef": 1.0}))
    rehearsal = [object()] * 5  # never packed: no step is taken
    ft = stage_mod.finetune(st, actor, [], rehearsal, np.random.default_rng(0))
    assert ft.steps == 0 and ft.skipped == "empty Q_clean" and ft.actor is actor
    assert ft.nll_before is None and ft.nll_after is None
    assert ft.metrics == [{"step": 0, "skipped": "empty Q_clean"}]


TOK = ByteTokenizer()
SYSTEM = "Reply with one JSON action."


def _verified_runs():
    """Verified count_lines episodes of a runbook follower (stand-ins for rehearsal)."""
    h0 = HarnessConfig(name="H0", system_prompt=SYSTEM, max_turns=1, max_output_tokens=128,
                       max_input_tokens=1024, summarize_threshold=None,
                       temperature=0.0)
    tasks = [make_task("count_lines", s) for s in (0, 1)]
    todo = [(t, runbook_for_task(t), privileged_strings(t)) for t in tasks]
    engine = RolloutEngine(h0, None, concurrency=2, scorer=RSR_SCORER)
    _, clean = fresh_execute(engine, follower_policy(TOK), h0, todo, 1, TOK, EXEC_INSTRUCTION)
    assert len(clean) == 2
    return clean


def test_stage_with_empty_q_clean_exports_its_input_actor(tmp_path, monkeypatch):
    """A random tiny actor finds nothing under the `hot` harness, so Q_clean is empty, while
    self-rehearsal (patched in) holds verified successes: the stage takes no SFT step,
    exports its input actor bit for bit and says why in summary.json."""
    runs = _verified_runs()
    monkeypatch.setattr(stage_mod, "rehearsal_set", lambda *a, **k: list(runs))
    cfg = tiny_stage_config(**{"discovery.harnesses": ("hot",), "harness.system_prompt": SYSTEM,
                               "eval.rewritten": False, "sft.rehearsal_samples": 1,
                               "sft.kl_coef": 0.5})
    wd = str(tmp_path / "rsr")
    res = run_rsr(cfg, wd)
    s = json.load(open(os.path.join(wd, "summary.json")))
    assert s["q_clean_size"] == 0 and s["rehearsal_size"] == 2
    assert s["sft_steps"] == 0 and s["sft_skipped"] == "empty Q_clean"
    assert s["sft_skipped_empty_q_clean"] == 1 and s["nll_before"] is None
    assert s["critic_bit_identical"] is True
    rows = [json.loads(x) for x in open(os.path.join(wd, "metrics.jsonl"))]
    assert rows == [{"step": 0, "skipped": "empty Q_clean"}]
    model_cfg = stage_mod.load_model(cfg).config
    exported = jax.device_get(import_params(os.path.join(wd, "export"), "actor", model_cfg))
    want = jax.device_get(stage_mod.cm.create_actor(cfg, model_cfg, cfg.actor_opt,
                                                    cfg.seed).params)
    chex.assert_trees_all_equal(exported, want)
    chex.assert_trees_all_equal(jax.device_get(res.actor.params), want)
