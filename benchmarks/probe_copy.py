"""Can the tiny default model copy words from its instruction? (issue 51)

The tiny base never solves create_file, edit_replace or hint_lookup: it writes the command's
shape with the wrong words (`echo 'bramble harbor kettle' > jungle.txt` for "containing the
line: ginger pepper zephyr"). This probe separates the model from the data. It trains the
tiny preset's shape (2 layers, d_model 128) from scratch on instruction -> command pairs of
the copy families (`create_file`, `edit_replace`: training seeds of the built-in split) and
scores reply tokens on held-out seeds, teacher-forced:

- `token acc`: argmax correct over the reply's tokens;
- `exact`: every token of the reply correct (the command would be right, greedily).

Rows: tokenizer (byte, the shipped BPE) x training data: `fresh` draws a new instance for
every row of every step (steps x batch distinct instances), `pool N` cycles over N fixed
instances (the base stage's `tasks.n_per_family` demonstrations per family). Each cell is the
mean ± sd over `--seeds` model seeds; the last column is the wall time of one run.

    python benchmarks/probe_copy.py --steps 600 --pools 96,1024 --seeds 0,1
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from terminal_rsi.models.bpe import tiny_bpe
from terminal_rsi.models.config import get_model_config
from terminal_rsi.models.tokenizer import ByteTokenizer
from terminal_rsi.models.transformer import DecoderLM
from terminal_rsi.pipeline.scales import TINY_DIMS
from terminal_rsi.tasks.builtin import heldout_seed, instance, validation_seed

FAMILIES = ("create_file", "edit_replace")
SEP = "\n>>> "


def pairs(heldout: bool):
    """(instruction, command) of the copy families, endlessly: training seeds (neither held
    out nor validation) or held-out seeds, families alternating."""
    for seed in itertools.count():
        for fam in FAMILIES:
            if heldout_seed(fam, seed) == heldout and not validation_seed(fam, seed):
                inst = instance(fam, seed)
                yield inst.instruction, inst.solution[0][0]


def encode(tok, pair, length: int):
    prompt, reply = tok.encode(pair[0] + SEP), tok.encode(pair[1] + "\n")
    ids = (prompt + reply)[:length]
    mask = np.zeros(length, np.float32)
    mask[len(prompt) - 1:len(ids) - 1] = 1.0  # positions that predict a reply token
    row = np.zeros(length, np.int32)
    row[:len(ids)] = ids
    return row, mask


def batch(tok, source, rows: int, length: int):
    x, m = zip(*(encode(tok, next(source), length) for _ in range(rows)), strict=True)
    return jnp.asarray(np.stack(x)), jnp.asarray(np.stack(m))


def scores(model, x, m):
    """(masked NLL, token accuracy, exact-reply fraction) of a batch, teacher-forced."""
    logits, _ = model(x)
    lp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32))
    target, mm = x[:, 1:], m[:, :-1]
    nll = -jnp.take_along_axis(lp, target[..., None], -1)[..., 0]
    right = (jnp.argmax(logits[:, :-1], -1) == target) * mm
    exact = jnp.all((right == mm) | (mm == 0), axis=1).mean()
    return (nll * mm).sum() / mm.sum(), right.sum() / mm.sum(), exact


def run(tok_name: str, pool: int, steps: int, seed: int, lr: float, rows: int = 8,
        length: int = 160) -> tuple[float, float, float]:
    tok = tiny_bpe() if tok_name == "bpe" else ByteTokenizer()
    dims = {k: v for k, v in TINY_DIMS.items() if k != "max_seq_len"}
    cfg = get_model_config("tiny", vocab_size=tok.vocab_size, max_seq_len=length, **dims)
    model = DecoderLM(cfg, rngs=nnx.Rngs(seed))
    warmup = min(50, steps // 4)
    schedule = optax.warmup_cosine_decay_schedule(0.0, lr, warmup, steps, lr * 0.1)
    opt = nnx.Optimizer(model, optax.adamw(schedule, weight_decay=0.1), wrt=nnx.Param)

    @nnx.jit
    def step(model, opt, x, m):
        def loss(model):
            return scores(model, x, m)[0]
        value, grads = nnx.value_and_grad(loss)(model)
        opt.update(model, grads)
        return value

    train = pairs(heldout=False)
    if pool:
        fixed = list(itertools.islice(train, pool))
        order = random.Random(seed)
        train = (order.choice(fixed) for _ in itertools.count())
    test = [batch(tok, pairs(heldout=True), 64, length)]
    t0 = time.perf_counter()
    for _ in range(steps):
        step(model, opt, *batch(tok, train, rows, length))
    _, acc, exact = nnx.jit(scores)(model, *test[0])
    return float(acc), float(exact), time.perf_counter() - t0


def cell(xs: list[float]) -> str:
    return f"{statistics.mean(xs):.3f} ± {statistics.pstdev(xs):.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--pools", default="96,1024", help="comma-separated pool sizes (0: fresh)")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--tokenizers", default="byte,bpe")
    ap.add_argument("--lr", type=float, default=3e-3)
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    pools = [0] + [int(p) for p in args.pools.split(",") if int(p)]
    print(f"{args.steps} steps of 8 rows, lr {args.lr}, seeds {seeds}; held-out seeds of "
          f"{', '.join(FAMILIES)}\n")
    print("| tokenizer | training data | token acc | exact reply | s per run |")
    print("|---|---|---|---|---|")
    for tok_name in args.tokenizers.split(","):
        for pool in pools:
            res = [run(tok_name, pool, args.steps, s, args.lr) for s in seeds]
            data = f"pool {pool}" if pool else f"fresh ({args.steps * 8} distinct)"
            print(f"| {tok_name} | {data} | {cell([r[0] for r in res])} | "
                  f"{cell([r[1] for r in res])} | {statistics.mean(r[2] for r in res):.0f} |",
                  flush=True)


if __name__ == "__main__":
    main()
