"""JAX's persistent compilation cache (terminal_rsi.runtime.compile_cache, enabled by
experiments/run.py) on the sampler's start-up cost.

Each row is one fresh Python process that builds the tiny default's actor (random weights) and
`Sampler`, then generates once for every batch bucket in `--batches` (16 new tokens; the
compile of each (batch, cache-length) bucket dominates). Measured: the wall time of those
calls, i.e. tracing + compiling (or loading) + running. Rows:

- `cache off` (baseline): what every process paid before; the same in every process;
- `cache on, cold`: an empty cache directory (compiles and writes the entries);
- `cache on, warm`: a second process with the same directory (loads the entries);
- `second Sampler, same process`: a new Sampler instance after the first in a warm process
  (the pipeline builds one per RSR stage).

    python benchmarks/bench_compile_cache.py --batches 1,2,4,8,16
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
from terminal_rsi.runtime import compile_cache
cache = None if sys.argv[2] == "off" else compile_cache.enable(sys.argv[2])
import jax
from terminal_rsi.runtime import sharding as shd
from terminal_rsi.models.config import get_model_config
from terminal_rsi.models.tokenizer import ByteTokenizer
from terminal_rsi.models.transformer import DecoderLM
from terminal_rsi.pipeline.scales import TINY_DIMS
from terminal_rsi.models.sampling import Buckets, Sampler
from terminal_rsi.training.train_state import OptimizerConfig, create_train_state

tok = ByteTokenizer()
mcfg = get_model_config("tiny", **TINY_DIMS)
st = create_train_state(DecoderLM, mcfg, OptimizerConfig(learning_rate=1e-3), shd.make_mesh({}))
prompt = tok.encode("Solve the task in a Linux shell. " * 8)
batches = [int(b) for b in sys.argv[3].split(",")]
out = {}
for name in ("first", "second"):
    s = Sampler(st.graphdef, mcfg, decode_block=16, pad_id=int(tok.pad_id),
                buckets=Buckets(prefill_chunk=256, cache_multiple=512))
    t0 = time.perf_counter()
    for b in batches:
        s.sample(st.params, [prompt] * b, jax.random.key(0), max_new_tokens=16,
                 temperature=1.0, stop_token_ids=())
    out[name] = time.perf_counter() - t0
print(json.dumps(out))
"""


def run_child(cache: str, batches: str) -> dict:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    res = subprocess.run([sys.executable, "-c", CHILD, str(ROOT), cache, batches],
                         capture_output=True, text=True, env=env, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,2,4,8,16")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cache = os.path.join(tmp, "jax")
        off = run_child("off", args.batches)
        cold = run_child(cache, args.batches)
        warm = run_child(cache, args.batches)
    rows = [("cache off (baseline)", off["first"]), ("cache on, cold", cold["first"]),
            ("cache on, warm (new process)", warm["first"]),
            ("second Sampler, same process, cache off", off["second"]),
            ("second Sampler, same process, cache on", warm["second"])]
    print(f"sampler start-up: one call per batch bucket {args.batches}, 16 new tokens, tiny "
          "default model, jax " + __import__("jax").__version__)
    print(f"{'setting':42s} {'seconds':>9s} {'ratio to baseline':>18s}")
    for name, sec in rows:
        print(f"{name:42s} {sec:9.2f} {sec / off['first']:17.2f}x")


if __name__ == "__main__":
    main()
