"""Run under XLA_FLAGS=--xla_force_host_platform_device_count=8 (tests/rpr/test_multidevice.py).

Two rollout steps of a tiny RPR phase (one critic-only, one joint) on a (data=2, fsdp=2,
tensor=2) mesh; prints one JSON line with the metrics and the parameter shardings.
"""

import json
import math
import sys
import tempfile

import jax

sys.path.insert(0, ".")

from configs.rpr_phase import get_config  # noqa: E402
from terminal_rsi.rpr import run_phase  # noqa: E402
from tests.rpr.helpers import typed  # noqa: E402


def main():
    assert jax.device_count() == 8, jax.devices()
    c = get_config()
    c.num_steps = 2
    c.model.d_model, c.model.d_ff, c.model.max_seq_len = 16, 32, 512
    # a short system prompt keeps rows at 128 tokens (the default prompt alone is ~500)
    c.harness.system_prompt = "Reply with one JSON action."
    c.rollout.cache_multiple = 128
    c.model.head_dim, c.model.n_heads, c.model.n_kv_heads = 8, 2, 2
    c.tasks.families = ("create_file", "count_lines")
    c.harness.max_output_tokens = 8
    c.rollout.batch_size = c.rollout.concurrency = 4
    c.ppo.critic_warmup_steps = 1
    c.eval.every, c.checkpoint.every = 0, 2
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 2, 2, 2
    typed(c)
    with tempfile.TemporaryDirectory() as w:
        res = run_phase(typed(c), w)
    emb = res.actor.params["backbone"]["embed"]
    finite = all(v is None or (isinstance(v, (int, float)) and math.isfinite(v))
                 for m in res.metrics for v in m.values() if not isinstance(v, bool))
    params_finite = all(bool(jax.numpy.isfinite(x).all()) for x in
                        jax.tree.leaves((res.actor.params, res.critic.params)))
    print(json.dumps({
        "steps": [m["step"] for m in res.metrics],
        "critic_only": [m["critic_only"] for m in res.metrics],
        "metrics_finite": finite, "params_finite": params_finite,
        "actor_loss": res.metrics[-1].get("actor/loss"),
        "critic_loss": [m["critic/loss"] for m in res.metrics],
        "mesh": dict(emb.sharding.mesh.shape), "embed_spec": str(emb.sharding.spec),
        "embed_shards": len(emb.addressable_shards),
    }))


if __name__ == "__main__":
    main()
