"""Tokens/s of one forward+backward+update step: our actor/critic train states vs a baseline.

Ours: `train_state.create_train_state` + `make_update_step` (split graphdef/params form,
jit with donated state, segment-aware masks, rotary from positions, masked losses).
Baseline: the same shapes written as the plainest Flax NNX + optax program: nnx.Linear /
nnx.Embed, `jax.nn.dot_product_attention(is_causal=True)`, `nnx.Optimizer` + `nnx.jit`.
Same optax chain (clip + AdamW). Ratio = ours / baseline tokens per second (target >= 1/1.1).

    python benchmarks/bench_model.py [--steps 2] [--tokens 2048] [--preset tiny]
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402

from terminal_rsi.models.config import get_model_config  # noqa: E402
from terminal_rsi.models.transformer import DecoderLM, ValueModel  # noqa: E402
from terminal_rsi.runtime import sharding as shd  # noqa: E402
from terminal_rsi.training import train_state as ts  # noqa: E402


class PlainBlock(nnx.Module):
    def __init__(self, c, rngs):
        self.c = c
        self.n1, self.n2 = nnx.RMSNorm(c.d_model, rngs=rngs), nnx.RMSNorm(c.d_model, rngs=rngs)
        self.q = nnx.Linear(c.d_model, c.n_heads * c.head_dim, use_bias=False, rngs=rngs)
        self.kv = nnx.Linear(c.d_model, 2 * c.n_kv_heads * c.head_dim, use_bias=False,
                             rngs=rngs)
        self.o = nnx.Linear(c.n_heads * c.head_dim, c.d_model, use_bias=False, rngs=rngs)
        self.gate_up = nnx.Linear(c.d_model, 2 * c.d_ff, use_bias=False, rngs=rngs)
        self.down = nnx.Linear(c.d_ff, c.d_model, use_bias=False, rngs=rngs)

    def rope(self, x):
        hd, n = x.shape[-1], x.shape[1]
        inv = 1.0 / (self.c.rope_theta ** (jnp.arange(0, hd, 2) / hd))
        ang = jnp.arange(n)[:, None] * inv
        ang = jnp.concatenate([ang, ang], -1)[None, :, None]
        x1, x2 = jnp.split(x, 2, -1)
        return x * jnp.cos(ang) + jnp.concatenate([-x2, x1], -1) * jnp.sin(ang)

    def __call__(self, x):
        c, (b, n, _) = self.c, x.shape
        h = self.n1(x)
        q = self.q(h).reshape(b, n, c.n_heads, c.head_dim)
        k, v = jnp.split(self.kv(h).reshape(b, n, 2 * c.n_kv_heads, c.head_dim), 2, axis=2)
        a = jax.nn.dot_product_attention(self.rope(q), self.rope(k), v, is_causal=True)
        x = x + self.o(a.reshape(b, n, -1))
        g, u = jnp.split(self.gate_up(self.n2(x)), 2, -1)
        return x + self.down(jax.nn.silu(g) * u)


class PlainLM(nnx.Module):
    def __init__(self, c, rngs, value_head=False):
        self.embed = nnx.Embed(c.vocab_size, c.d_model, rngs=rngs)
        self.blocks = nnx.List([PlainBlock(c, rngs) for _ in range(c.n_layers)])
        self.norm = nnx.RMSNorm(c.d_model, rngs=rngs)
        self.head = nnx.Linear(c.d_model, 1 if value_head else c.vocab_size, use_bias=False,
                               rngs=rngs)

    def __call__(self, tokens):
        x = self.embed(tokens)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x))


def plain_step_fn(critic):
    @nnx.jit
    def step(model, optimizer, batch):
        def loss_fn(m):
            out = m(batch["tokens"])
            if critic:
                return 0.5 * jnp.mean((out[..., 0] - batch["returns"]) ** 2)
            return optax.softmax_cross_entropy_with_integer_labels(out, batch["targets"]).mean()

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    return step


def make_batch(c, b, n, seed=0):
    rng = np.random.default_rng(seed)
    tok = rng.integers(0, 256, (b, n + 1)).astype(np.int32)
    return {"tokens": tok[:, :-1], "targets": tok[:, 1:],
            "positions": np.broadcast_to(np.arange(n, dtype=np.int32), (b, n)).copy(),
            "segment_ids": np.ones((b, n), np.int32), "loss_mask": np.ones((b, n), np.float32),
            "returns": rng.standard_normal((b, n)).astype(np.float32)}


def timed(fn, steps):
    jax.block_until_ready(fn())  # compile + warm-up
    t0 = time.perf_counter()
    for _ in range(steps):
        out = fn()
    jax.block_until_ready(out)
    return (time.perf_counter() - t0) / steps


def bench(c, critic, seq, batch_size, steps):
    opt = ts.OptimizerConfig(learning_rate=1e-4, grad_clip=1.0)
    batch = make_batch(c, batch_size, seq)
    jbatch = jax.tree.map(jnp.asarray, batch)
    mesh = shd.make_mesh()
    cls, loss = (ValueModel, ts.value_regression_loss) if critic else (DecoderLM, ts.lm_loss)
    holder = {"state": ts.create_train_state(cls, c, opt, mesh)}
    step = ts.make_update_step(loss, holder["state"])

    def ours():
        holder["state"], m = step(holder["state"], jbatch)
        return m["loss"]

    model = PlainLM(c, nnx.Rngs(0), value_head=critic)
    optimizer = nnx.Optimizer(model, ts.make_optimizer(opt), wrt=nnx.Param)
    pstep = plain_step_fn(critic)
    t_ours = timed(ours, steps)
    t_base = timed(lambda: pstep(model, optimizer, jbatch), steps)
    # Interleave a second round so drift on a shared machine hits both sides.
    t_ours = min(t_ours, timed(ours, steps))
    t_base = min(t_base, timed(lambda: pstep(model, optimizer, jbatch), steps))
    tokens = batch_size * seq
    return tokens / t_ours, tokens / t_base


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--tokens", type=int, default=2048, help="tokens per step")
    args = ap.parse_args()
    c = get_model_config(args.preset)
    print(f"{args.preset}: {c.num_params() / 1e6:.2f} M params, {args.tokens} tokens/step, "
          f"{jax.device_count()} x {jax.devices()[0].platform}")
    print(f"{'model':7s} {'seq':>5s} {'batch':>5s} {'ours tok/s':>11s} {'plain tok/s':>12s} "
          f"{'ratio':>6s}")
    for critic in (False, True):
        for seq in (512, 2048):
            b = max(1, args.tokens // seq)
            ours, base = bench(c, critic, seq, b, args.steps)
            print(f"{'critic' if critic else 'actor':7s} {seq:5d} {b:5d} {ours:11.0f} "
                  f"{base:12.0f} {ours / base:6.2f}", flush=True)


if __name__ == "__main__":
    main()
