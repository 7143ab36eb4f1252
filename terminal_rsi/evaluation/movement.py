"""Policy movement of a stage: how far its output actor moved from its input actor, measured
on a fixed probe set of token sequences (issue 51).

    movement = Σ_{b,t} m[b,t] · |log π_out(x_t | x_<t) - log π_in(x_t | x_<t)| / Σ m

over the probe's predicted generated positions m = `alignment.trained_mask` (the tokens the
losses train: generated, with a prefix in their segment), with log π from the training-side
forward (`forward.actor_logprobs`, chunked) at `temperature` (1: the model's own
distribution). The masked mean of absolute differences is `logprob_gap`'s
`logprob_gap_mean_abs` (0 without a masked token). One forward per actor over the packed
probe.

`policy_movement` is the pure function (jit it with `graphdef` static, `movement_fn`);
`probe_movement` packs probe trajectories and returns the number with its token count. The
pipeline's probe is the reference-solution demonstrations of the validation tasks rendered
through the evaluation harness, the same for every stage of a run
(`terminal_rsi.pipeline.diagnostics`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from terminal_rsi.agent import pack_trajectories
from terminal_rsi.models.logprobs import logprob_gap
from terminal_rsi.training.alignment import trained_mask
from terminal_rsi.training.forward import FORWARD_KEYS, actor_logprobs

PROBE_KEYS = (*FORWARD_KEYS, "gen_mask")


def policy_movement(params_in, params_out, graphdef, batch, temperature: float = 1.0):
    """Mean |log π_out - log π_in| (float32 scalar) over the predicted generated positions of
    `batch` (PROBE_KEYS, [B, L] each) for two param trees of the DecoderLM `graphdef`."""
    lp_in, _ = actor_logprobs(params_in, graphdef, batch, temperature=temperature)
    lp_out, _ = actor_logprobs(params_out, graphdef, batch, temperature=temperature)
    mask = trained_mask(batch["gen_mask"], batch["segment_ids"])
    return logprob_gap(lp_in, lp_out, mask)["logprob_gap_mean_abs"]


@functools.cache
def movement_fn(graphdef, temperature: float = 1.0):
    """`policy_movement` jitted for one model graph (compiled once per graph and shape)."""
    return jax.jit(lambda params_in, params_out, batch: policy_movement(
        params_in, params_out, graphdef, batch, temperature))


def probe_batch(trajectories: Sequence, buckets) -> dict:
    """The packed PROBE_KEYS arrays of the probe trajectories (`agent.pack_trajectories`)."""
    packed = pack_trajectories(list(trajectories), buckets=buckets)
    return {k: jnp.asarray(getattr(packed, k)) for k in PROBE_KEYS}


def probe_movement(params_in, params_out, graphdef, trajectories: Sequence, buckets,
                   temperature: float = 1.0) -> dict:
    """{"policy_movement": mean |Δ log π| (None without a probe token), "probe_sequences",
    "probe_tokens"} of two actors on the probe `trajectories`."""
    trajs = [t for t in trajectories if t.num_generated > 0]
    if not trajs:
        return {"policy_movement": None, "probe_sequences": 0, "probe_tokens": 0}
    batch = probe_batch(trajs, buckets)
    tokens = int(np.asarray(trained_mask(batch["gen_mask"], batch["segment_ids"])).sum())
    value = float(movement_fn(graphdef, float(temperature))(params_in, params_out, batch))
    return {"policy_movement": value if tokens and np.isfinite(value) else None,
            "probe_sequences": len(trajs), "probe_tokens": tokens}
