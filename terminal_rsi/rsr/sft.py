"""The one supervised step (paper §2.1 Eq. 3), shared by the `rsr` and `base_sft` stages.

    step = make_sft_step(Aggregation.SEQUENCE_SUM, num_microbatches=2)
    actor, metrics = step(actor, batch)      # batch: SFT_KEYS, [B, L] arrays (packing)
    actor, rows = train_sft(actor, trajs, step, num_steps=50, batch_size=8, rng=rng)

L_RSR(θ) = -E_Q Σ_j m_j log π_θ(y_j | h_j): `terminal_rsi.training.losses.sft_loss` on the actor's
token log-probabilities (`terminal_rsi.training.forward.actor_logprobs`, the same alignment as PPO),
with m_j = `gen_mask` (the policy-generated decisions; prompt, observation and padding
positions carry no loss) ∧ `alignment.predictable_mask`. The step is jitted with the state
donated and accumulates gradients exactly over `num_microbatches` slices
(`terminal_rsi.training.grad_accum.accumulate_gradients`); it never touches a critic.

Trust region (`kl_coef` > 0, the `rsr` stage's `sft.kl_coef`): the loss gains
kl_coef · KL(π_θ(·|h_j) ‖ π_in(·|h_j)) at the same supervised positions, aggregated with the
same weights (`terminal_rsi.training.losses.kl_to_reference`), where π_in are the frozen params
passed to the step (`step(actor, batch, ref_params=input_params)`). It needs the full [B, L, V]
logits of both actors (one more forward pass); with kl_coef = 0 the step is the plain Eq. 3
step and ignores `ref_params`.

`train_sft` draws each minibatch uniformly with replacement from the trajectory list, so a
multiset (Q_clean with multiplicities) is sampled as Unif{...} of Eq. 2, packs it with
`terminal_rsi.agent.pack_trajectories` (one row per summarization segment) and steps.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
import optax

from terminal_rsi.agent import pack_trajectories
from terminal_rsi.runtime.progress import progress
from terminal_rsi.training.alignment import token_logprobs, trained_mask
from terminal_rsi.training.forward import actor_logits, actor_logprobs
from terminal_rsi.training.grad_accum import accumulate_gradients, jit_update
from terminal_rsi.training.losses import (
    Aggregation,
    LossParts,
    kl_to_reference,
    safe_divide,
    sft_loss,
)
from terminal_rsi.training.train_state import TrainState, apply_gradients

SFT_KEYS = ("tokens", "positions", "segment_ids", "gen_mask")


def sft_loss_parts(params, graphdef, batch, aggregation: Aggregation, kl_coef: float = 0.0,
                   ref_params=None) -> LossParts:
    """Eq. 3 loss parts of one (micro)batch: tokens/positions/segment_ids/gen_mask [B, L];
    with `kl_coef` > 0 plus kl_coef · KL(π_θ ‖ π_ref) of `ref_params` (`kl_trust_parts`)."""
    if kl_coef > 0:
        return kl_trust_parts(params, ref_params, graphdef, batch, aggregation, kl_coef)
    lp, _ = actor_logprobs(params, graphdef, batch)
    mask = trained_mask(batch["gen_mask"], batch["segment_ids"])
    return sft_loss(lp, mask, aggregation, segment_ids=batch["segment_ids"])


def kl_trust_parts(params, ref_params, graphdef, batch, aggregation: Aggregation,
                   kl_coef: float) -> LossParts:
    """Eq. 3 + kl_coef · KL(π_θ(·|h_j) ‖ π_ref(·|h_j)) on one forward of each actor (full
    logits: the NLL from `alignment.token_logprobs`, the KL from `losses.kl_to_reference`,
    both over `trained_mask` with the same weights, hence the same denominator)."""
    if ref_params is None:
        raise ValueError("an SFT step with kl_coef > 0 needs ref_params (the input actor's)")
    logits = actor_logits(params, graphdef, batch)
    ref_logits = jax.lax.stop_gradient(actor_logits(ref_params, graphdef, batch))
    seg = batch["segment_ids"]
    lp, _ = token_logprobs(logits, batch["tokens"], seg)
    mask = trained_mask(batch["gen_mask"], seg)
    nll = sft_loss(lp, mask, aggregation, segment_ids=seg)
    kl = kl_to_reference(logits, ref_logits, mask, aggregation, segment_ids=seg)
    return LossParts(nll.total + kl_coef * kl.total, nll.denom, {**nll.stats, **kl.stats})


def _finalize(parts: LossParts) -> dict:
    tokens = parts.stats["tokens"]
    out = {"loss": parts.loss, "tokens": tokens,
           "nll_per_token": safe_divide(parts.stats["nll_sum"], tokens)}
    if "kl_ref_sum" in parts.stats:
        out["kl_ref"] = safe_divide(parts.stats["kl_ref_sum"], tokens)
    return out


def make_sft_step(aggregation: Aggregation = Aggregation.SEQUENCE_SUM,
                  num_microbatches: int = 1, state: TrainState | None = None,
                  donate: bool = True, kl_coef: float = 0.0):
    """Jitted `step(actor_state, batch, ref_params=None) -> (actor_state, metrics)` for
    Eq. 3, with `kl_coef` > 0 plus the trust region toward `ref_params` (module doc; they are
    read, never updated or donated).

    metrics: loss (the aggregated objective), nll_per_token (token-mean NLL of the batch),
    tokens (supervised positions), grad_norm (before clipping), and with the trust region
    kl_ref (token-mean KL(π_θ ‖ π_ref)).
    """
    m, coef = int(num_microbatches), float(kl_coef)

    def update(st: TrainState, batch, ref_params=None):
        grads, parts = accumulate_gradients(
            lambda p, mb: sft_loss_parts(p, st.graphdef, mb, aggregation, coef, ref_params),
            st.params, {k: batch[k] for k in SFT_KEYS}, m)
        return apply_gradients(st, grads), {**_finalize(parts), "grad_norm": optax.tree.norm(grads)}

    return jit_update(update, (state,), donate, 1)


def make_nll_fn(aggregation: Aggregation = Aggregation.SEQUENCE_SUM,
                num_microbatches: int = 1):
    """Jitted `fn(params, graphdef-carrying state, batch) -> metrics` without an update
    (same metrics as the step, minus grad_norm): the NLL before/after fine-tuning."""
    m = int(num_microbatches)

    @jax.jit
    def fn(st: TrainState, batch):
        mbs = {k: batch[k] for k in SFT_KEYS}
        if m == 1:
            parts = sft_loss_parts(st.params, st.graphdef, mbs, aggregation)
        else:
            _, parts = accumulate_gradients(
                lambda p, mb: sft_loss_parts(p, st.graphdef, mb, aggregation), st.params,
                mbs, m)
        return _finalize(parts)

    return fn


def row_length(traj) -> int:
    """Longest packed row (summarization segment) of a trajectory, in tokens."""
    return max((len(traj.segment_tokens(k)[0]) for k in {t.segment for t in traj.turns}),
               default=0)


def sft_batch(trajectories: Sequence, buckets=None, max_len: int | None = None,
              width: int | None = None, rows: int | None = None) -> dict:
    """Pack trajectories into the SFT arrays (SFT_KEYS) with `pack_trajectories`; `width`
    pads every row to that fixed length and `rows` adds empty rows (no supervised token) up
    to that many, so a whole run compiles one shape."""
    packed = pack_trajectories(list(trajectories), buckets=buckets, max_len=max_len)
    out = {k: getattr(packed, k) for k in SFT_KEYS}
    if width is not None:
        cur = out["tokens"].shape[1]
        if cur > width:
            raise ValueError(f"packed rows of {cur} tokens exceed the fixed width {width}")
        out = {k: np.pad(v, ((0, 0), (0, width - cur))) for k, v in out.items()}
    if rows is not None and out["tokens"].shape[0] < rows:
        extra = rows - out["tokens"].shape[0]
        out = {k: np.pad(v, ((0, extra), (0, 0))) for k, v in out.items()}
    return out


def fixed_width(trajectories: Sequence, multiple: int = 64) -> int:
    """The longest row of `trajectories` rounded up to `multiple` (for `sft_batch`)."""
    n = max((row_length(t) for t in trajectories), default=1)
    return -(-n // multiple) * multiple


def mean_nll(state: TrainState, trajectories: Sequence, nll_fn, *, batch_size: int = 8,
             buckets=None, width: int | None = None) -> float:
    """Token-mean NLL of the generated positions of `trajectories` under `state`."""
    tot, n = 0.0, 0.0
    for i in range(0, len(trajectories), batch_size):
        chunk = list(trajectories[i:i + batch_size])
        mt = jax.device_get(nll_fn(state, sft_batch(chunk, buckets, width=width,
                                                    rows=batch_size)))
        tot += float(mt["nll_per_token"]) * float(mt["tokens"])
        n += float(mt["tokens"])
    return tot / max(n, 1.0)


def train_sft(state: TrainState, trajectories: Sequence, step_fn, *, num_steps: int,
              batch_size: int, rng: np.random.Generator, buckets=None, width: int | None = None,
              on_step: Callable[[int, dict], Any] | None = None,
              sampler: Callable[[np.random.Generator, int], Sequence] | None = None,
              bar=None, on_state: Callable[[int, Any], Any] | None = None):
    """`num_steps` SFT steps, each on `batch_size` trajectories drawn uniformly with
    replacement (or by `sampler(rng, batch_size)`, e.g. a curriculum), packed to `width`
    (None: the bucketed batch maximum, a new compile per new shape). Returns (state,
    per-step metric dicts with "step", "loss", "nll_per_token", "tokens", "grad_norm",
    "step_s"). Progress: a bar of these steps (`terminal_rsi.runtime.progress`), or `bar`, one the
    caller keeps across several calls (advanced by one per step, left open). `on_state(k,
    state)` sees the state after step k (e.g. to export a candidate actor)."""
    if not trajectories and sampler is None:
        raise ValueError("train_sft needs at least one trajectory (Q_clean is empty)")
    own_bar = bar is None
    if own_bar:
        bar = progress(total=num_steps, desc="sft", unit="step")
    rows = []
    try:
        for k in range(1, num_steps + 1):
            t0 = time.monotonic()
            if sampler is not None:
                picked = list(sampler(rng, batch_size))
            else:
                picked = [trajectories[i] for i in rng.integers(0, len(trajectories),
                                                                batch_size)]
            state, mt = step_fn(state, sft_batch(picked, buckets, width=width))
            row = {"step": k, **{key: float(v) for key, v in jax.device_get(mt).items()},
                   "step_s": time.monotonic() - t0}
            rows.append(row)
            if "loss" in row:
                bar.set_postfix(loss=f"{row['loss']:.3f}", refresh=False)
            bar.update()
            if on_step is not None:
                on_step(k, row)
            if on_state is not None:
                on_state(k, state)
    finally:
        if own_bar:
            bar.close()
    return state, rows
