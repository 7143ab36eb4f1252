"""Task environment build: cold vs content-hash cached, against a bare `docker build`.

    python benchmarks/bench_task_env.py [--reps 5] [--files 200]

The fixture is a small context (a Dockerfile FROM the offline task base image with a
COPY and a RUN step, plus --files small files). Rows, each over --reps repetitions:

- bare `docker build` cold (baseline): a fresh nonce in the context, so BuildKit's layer
  cache misses and the RUN step executes;
- build_context_image cold: the same, through terminal_rsi (content hash, temporary tag,
  retag);
- build_context_image cached: the same content again (the content-hash tag exists: no
  build runs);
- bare `docker build` of an unchanged context: BuildKit's own layer cache, for comparison.

Ratios are against the cold bare build in the same run. Needs a running Docker engine
and the default sandbox image's debootstrap base (the task base is built from it, offline).
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from terminal_rsi.sandbox.image import (  # noqa: E402
    TASK_BASE_IMAGE,
    EngineUnavailable,
    build_context_image,
    build_task_base_image,
)

PREFIX = f"trsi-bench-env-{secrets.token_hex(3)}"
DOCKERFILE = f"""\
FROM {TASK_BASE_IMAGE}
COPY . /task
RUN find /task -type f | wc -l > /opt/count && cat /task/nonce
WORKDIR /task
"""


def fixture(d: str, n_files: int) -> str:
    os.makedirs(os.path.join(d, "data"), exist_ok=True)
    with open(os.path.join(d, "Dockerfile"), "w") as f:
        f.write(DOCKERFILE)
    for i in range(n_files):
        with open(os.path.join(d, "data", f"f{i:04d}.txt"), "w") as f:
            f.write(f"file {i}\n" * 20)
    renew(d)
    return d


def renew(d: str) -> None:
    """A fresh nonce: a different context for both our hash and BuildKit's layer cache."""
    with open(os.path.join(d, "nonce"), "w") as f:
        f.write(secrets.token_hex(16))


def bare_build(d: str, tag: str) -> None:
    subprocess.run(["docker", "build", "--network=none", "-q", "-t", tag, d], check=True,
                   capture_output=True)


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure(d: str, reps: int) -> dict[str, list[float]]:
    rows: dict[str, list[float]] = {k: [] for k in ("bare", "cold", "cached", "bare_cached")}
    for i in range(reps):
        renew(d)
        rows["bare"].append(timed(lambda: bare_build(d, f"{PREFIX}:bare-{i}")))
        rows["bare_cached"].append(timed(lambda: bare_build(d, f"{PREFIX}:bare-{i}")))
        renew(d)
        rows["cold"].append(timed(lambda: build_context_image(d, tag_prefix=PREFIX)))
        rows["cached"].append(timed(lambda: build_context_image(d, tag_prefix=PREFIX)))
    return rows


def cleanup() -> None:
    out = subprocess.run(["docker", "image", "ls", "--format", "{{.Repository}}:{{.Tag}}",
                          PREFIX], capture_output=True, text=True).stdout.split()
    if out:
        subprocess.run(["docker", "image", "rm", *out], capture_output=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--files", type=int, default=200, help="small files in the context")
    args = ap.parse_args()
    try:
        build_task_base_image()
    except EngineUnavailable as e:
        sys.exit(f"no Docker engine: {e}")
    with tempfile.TemporaryDirectory() as tmp:
        d = fixture(tmp, args.files)
        build_context_image(d, tag_prefix=PREFIX)  # warm-up (page cache, CLI binaries)
        try:
            rows = measure(d, args.reps)
        finally:
            cleanup()
    base = statistics.median(rows["bare"])
    labels = {"bare": "bare `docker build`, cold (baseline)",
              "cold": "build_context_image, cold",
              "cached": "build_context_image, cached (content-hash hit)",
              "bare_cached": "bare `docker build`, unchanged context (BuildKit cache)"}
    print(f"task environment build, {args.reps} reps, context of {args.files} files + "
          "Dockerfile (COPY + RUN)\n")
    print("| case | median ms | min ms | max ms | median / baseline |")
    print("|---|---:|---:|---:|---:|")
    for key, label in labels.items():
        xs = rows[key]
        med = statistics.median(xs)
        print(f"| {label} | {med * 1e3:.0f} | {min(xs) * 1e3:.0f} | {max(xs) * 1e3:.0f} | "
              f"{med / base:.2f}x |")


if __name__ == "__main__":
    main()
