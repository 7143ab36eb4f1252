"""Real-format tasks end to end: oracle + verifier wall time through our stack against a bare
`docker run` of the same commands, as ratios inside one run.

    python benchmarks/bench_real_tasks.py [--reps 3] [--tasks tb-sales-summary,...]
                                          [--json PATH] [--bare-tmux] [--warmup 1]

For every positive fixture in tests/tasks/fixtures/real (multi-container ones are
skipped: `task.environment.multi_container`), the task's image is built or found first
(`task_image`, content-hash cached; reported separately with a bare BuildKit-cached
`docker build` for comparison), then each repetition times three arms, in an order that
rotates from one repetition to the next so drift and other people's load spread evenly:

- **bare** (the baseline): run_bare.py's steps on that same prebuilt image, no build:
  `docker run -d`, `docker cp` the solution, `docker exec` it (a solution.yaml typed into
  tmux), `docker cp` the tests, `docker exec` run-tests.sh / test.sh, read the verdict,
  `docker rm -f`. A fixture that run_bare.py runs through docker compose (Harbor's
  environment/docker-compose.yaml) goes through compose here too: its `compose build` (a
  BuildKit cache hit) is timed by run_bare.py and subtracted, `up --wait` ... `down -t 0`
  stays in.
- **ours**: `check_task(task, "docker")`: open_task_sandbox (its content-hash image
  lookup included: the cached build), run_solution (the oracle typed into a tmux session),
  verify (tests placed at /tests, run, verdict), container removed.
- **split**: the same three calls made directly, each timed, plus the sandbox's close, with
  the Docker sandbox's operations traced (calls and seconds per phase); not in the ratio.

Both arms must reach the same verdict every repetition; a fixture where they do not gets a
MISMATCH row. The table gives per-fixture medians, the ratio ours / bare, and the phase
split of each arm (bare: `docker run` / solution copy+exec / the rest: tests copy + run +
verdict, with tmux start for a solution.yaml / rm; ours: start / oracle / verify / close);
the last line is the geometric mean of the ratios. A second table shows where our time
goes (traced operations per run, averaged over fixtures). Needs a Docker engine with the
fixtures' base image `trsi-task-base:bookworm`. Leaves nothing behind but the cached
`trsi-env:*` images.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "tasks" / "fixtures"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(FIXTURES))

import run_bare  # noqa: E402

from terminal_rsi.sandbox import docker_backend, terminal  # noqa: E402
from terminal_rsi.tasks.check_tasks import (  # noqa: E402
    _verdict_row,
    check_task,
    solution_problem,
)
from terminal_rsi.tasks.harbor import load_task_dir  # noqa: E402
from terminal_rsi.tasks.verify import open_task_sandbox, run_solution, task_image  # noqa: E402

REAL = FIXTURES / "real"
# the module (the package `terminal_rsi.tasks` exports a function of the same name)
verify_mod = importlib.import_module("terminal_rsi.tasks.verify")


# ----------------------------------------------------------------------------- tracing

class Tracer:
    """Wraps the Docker sandbox's operations while active: {(phase, op): [seconds, ...]}.
    Operations nest (put_tar runs a transfer script by exec; close reaps and removes)."""

    def __init__(self):
        self.phase = "-"
        self.active = False
        self.calls: dict[tuple[str, str], list[float]] = defaultdict(list)
        self._saved: list[tuple[object, str, object]] = []

    def _wrap(self, owner, attr: str, label=None) -> None:
        fn = getattr(owner, attr, None)
        if fn is None:  # renamed: trace less rather than fail
            return
        tracer = self

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            if not tracer.active:
                return fn(*args, **kwargs)
            op = label(args) if callable(label) else (label or attr)
            t0 = time.monotonic()
            try:
                return fn(*args, **kwargs)
            finally:
                tracer.calls[(tracer.phase, op)].append(time.monotonic() - t0)

        self._saved.append((owner, attr, fn))
        setattr(owner, attr, timed)

    def install(self) -> None:
        box = getattr(docker_backend, "ContainerBox", None) or getattr(docker_backend, "_Box",
                                                                       None)
        sb = docker_backend.DockerSandbox
        self._wrap(verify_mod, "task_image", "image lookup (content hash)")
        self._wrap(docker_backend, "sweep_stale", "sweep_stale")
        self._wrap(docker_backend, "_create_box", "container create+start")
        self._wrap(sb, "_probe_image", "image probe (tools, HOME)")
        self._wrap(sb, "open_session", "open_session (tmux)")
        self._wrap(sb, "_find_tmux", "└ find tmux (in open_session)")
        self._wrap(terminal.StreamSession, "run", "session.run (typed command)")
        self._wrap(sb, "put_tar", "put_tar (tar script)")
        self._wrap(sb, "get_tar", "get_tar (tar script)")
        self._wrap(sb, "exec", lambda a: "exec " + " ".join(str(a[1]).split()[:2])[:36])
        self._wrap(sb, "_reap", "reap (kill -9 -1)")
        self._wrap(sb, "close", "close")
        if box is not None:
            self._wrap(box, "destroy", "└ container remove (in close)")

    def uninstall(self) -> None:
        for owner, attr, fn in reversed(self._saved):
            setattr(owner, attr, fn)
        self._saved = []


TRACE = Tracer()


# ----------------------------------------------------------------------------- arms

def bare_opts(tmux: bool) -> argparse.Namespace:
    return argparse.Namespace(no_nop=True, compose=False, tmux=tmux, probe_compose=False,
                              no_cache=False, keep=False)


def arm_bare(task_dir: Path, image: str, tmux: bool) -> dict:
    """run_bare.py's oracle phase on `image` (compose fixtures: through compose, its
    cached `compose build` subtracted); the container removed. Seconds and the verdict."""
    fr = run_bare.FixtureRun(task_dir, bare_opts(tmux))
    runner = fr.runner()
    t0 = time.monotonic()
    try:
        if runner.use_compose:
            phase = runner.compose_phase(solution=True)
        else:
            phase = runner.docker_phase(image, solution=True)
    finally:
        t1 = time.monotonic()
        fr.cleanup()
        t2 = time.monotonic()
    build = fr.result.build_seconds or 0.0
    run_s = t1 - t0 - build
    start, sol = phase.start_seconds or 0.0, phase.solution_seconds or 0.0
    return {"seconds": run_s + (t2 - t1), "resolved": bool(phase.resolved),
            "mode": fr.result.mode, "build_subtracted": build,
            "phases": {"start": start, "oracle": sol, "verify": run_s - start - sol,
                       "close": t2 - t1},
            "solution_rc": phase.solution_rc, "detail": phase.detail[-400:]}


def arm_ours(task) -> dict:
    t0 = time.monotonic()
    row = check_task(task, "docker")
    return {"seconds": time.monotonic() - t0, "resolved": row["verdict"] == "PASS",
            "verdict": row["verdict"], "why": row.get("why", "")}


def arm_split(task) -> dict:
    TRACE.active = True
    try:
        TRACE.phase = "start"
        t0 = time.monotonic()
        sb = open_task_sandbox(task, "docker")
        t1 = time.monotonic()
        try:
            TRACE.phase = "oracle"
            solution = solution_problem(task, run_solution(task, sb))
            t2 = time.monotonic()
            TRACE.phase = "verify"
            res = verify_mod.verify(task, sb, backend="docker")
            t3 = time.monotonic()
        finally:
            TRACE.phase = "close"
            t4 = time.monotonic()
            sb.close()
            t5 = time.monotonic()
    finally:
        TRACE.active, TRACE.phase = False, "-"
    phases = {"start": t1 - t0, "oracle": t2 - t1, "verify": t3 - t2, "close": t5 - t4}
    verdict = _verdict_row(task, res, solution, False)["verdict"]
    return {"seconds": t5 - t0, "resolved": verdict == "PASS", "verdict": verdict,
            "phases": phases}


# ----------------------------------------------------------------------------- helpers

def docker_lines(*args: str) -> list[str]:
    p = subprocess.run(["docker", *args], capture_output=True, text=True)
    return p.stdout.split()


def load_note() -> dict:
    """Noise markers: the host's load and the containers running (others' tests)."""
    return {"loadavg": os.getloadavg(), "containers_running": len(docker_lines("ps", "-q"))}


def build_report(task, task_dir: Path) -> dict:
    """Our build/lookup on first use (cold only if the tag was missing), a second
    (content-hash hit) lookup, and a bare BuildKit-cached `docker build` of the same context
    under a throwaway tag (removed)."""
    t0 = time.time()
    m0 = time.monotonic()
    image = task_image(task, "docker")
    first = time.monotonic() - m0
    created = subprocess.run(["docker", "image", "inspect", "-f", "{{.Created}}", image],
                             capture_output=True, text=True).stdout.strip()
    m0 = time.monotonic()
    task_image(task, "docker")
    lookup = time.monotonic() - m0
    env = task.environment
    context = env.context or os.path.dirname(env.dockerfile)
    tag = f"trsi-bench-real-bare:{task_dir.name}-{os.getpid()}"
    m0 = time.monotonic()
    p = subprocess.run(["docker", "build", "--network=none", "-q", "-t", tag, "-f",
                        env.dockerfile, context], capture_output=True, text=True)
    bare = time.monotonic() - m0
    subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)
    try:
        from datetime import datetime
        when = datetime.fromisoformat(created.replace("Z", "+00:00")).timestamp()
        built_now = when >= t0 - 1
    except ValueError:
        built_now = None
    return {"image": image, "first_s": first, "built_now": built_now, "lookup_s": lookup,
            "bare_cached_build_s": bare if p.returncode == 0 else None}


def fixtures(names: list[str] | None) -> tuple[list, list[str]]:
    dirs = sorted(d for d in REAL.iterdir() if (d / "task.toml").exists()
                  or (d / "task.yaml").exists())
    if names:
        known = {d.name: d for d in dirs}
        missing = [n for n in names if n not in known]
        if missing:
            sys.exit(f"unknown fixtures: {', '.join(missing)} (have: {', '.join(known)})")
        dirs = [known[n] for n in names]
    out, skipped = [], []
    for d in dirs:
        task = load_task_dir(str(d))
        if task.environment.multi_container:
            skipped.append(d.name)
        else:
            out.append((d, task))
    return out, skipped


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


# ----------------------------------------------------------------------------- main

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tasks", default="",
                    help="comma-separated fixture names under tests/tasks/fixtures/real "
                         "(default: every single-container one)")
    ap.add_argument("--json", metavar="PATH", help="write the raw numbers here")
    ap.add_argument("--bare-tmux", action="store_true",
                    help="bare arm: type solution.sh and run-tests.sh into tmux too, as tb "
                         "does (run_bare.py --tmux); default: docker exec")
    ap.add_argument("--warmup", type=int, default=1,
                    help="untimed runs of every arm per fixture before timing")
    args = ap.parse_args()
    if subprocess.run(["docker", "image", "inspect", run_bare.BASE_IMAGE],
                      capture_output=True).returncode:
        sys.exit(f"the fixtures' base image {run_bare.BASE_IMAGE} is missing "
                 "(terminal_rsi.sandbox.image.build_task_base_image builds it)")
    tasks, skipped = fixtures([n for n in args.tasks.split(",") if n] or None)
    TRACE.install()
    noise = {"before": load_note()}
    t_all = time.monotonic()
    results = []
    try:
        for d, task in tasks:
            build = build_report(task, d)
            image = build["image"]
            arms = {"bare": lambda: arm_bare(d, image, args.bare_tmux),
                    "ours": lambda: arm_ours(task), "split": lambda: arm_split(task)}
            order = list(arms)
            runs: dict[str, list[dict]] = {k: [] for k in arms}
            warm_verdicts = []
            for _ in range(args.warmup):
                warm_verdicts.append({k: fn()["resolved"] for k, fn in arms.items()})
            TRACE.calls = defaultdict(list)
            for rep in range(args.reps):
                k = rep % len(order)
                for name in order[k:] + order[:k]:
                    runs[name].append(arms[name]())
            trace = {f"{ph}|{op}": list(xs) for (ph, op), xs in TRACE.calls.items()}
            agree = all(len({runs[a][i]["resolved"] for a in arms}) == 1
                        for i in range(args.reps))
            results.append({"task": d.name, "format": task.format, "build": build,
                            "bare_mode": runs["bare"][0]["mode"], "warmup": warm_verdicts,
                            "agree": agree, "runs": runs, "trace": trace})
            print(f"  {d.name}: bare {med([r['seconds'] for r in runs['bare']]):.2f}s, "
                  f"ours {med([r['seconds'] for r in runs['ours']]):.2f}s"
                  f"{'' if agree else '  MISMATCH'}", file=sys.stderr, flush=True)
    finally:
        TRACE.uninstall()
        noise["after"] = load_note()
        # a safety net: nothing of this process may stay behind
        left = docker_backend.remove_containers(pid=os.getpid())
        stray = [c for c in docker_lines("ps", "-a", "--format", "{{.Names}}")
                 if c.startswith("trsi-bare-")]
    wall = time.monotonic() - t_all

    print(f"real-format tasks: oracle + verify wall time, {args.reps} reps "
          f"(+{args.warmup} warm-up) per arm, arms alternated; baseline: bare docker "
          f"(run_bare.py's steps{', tmux' if args.bare_tmux else ''}) on the same prebuilt "
          "image, no build in either arm (ours: its content-hash cache lookup only)\n")
    print(f"host: {platform.node()}, {os.cpu_count()} CPUs; docker shared with other "
          f"tests: load {noise['before']['loadavg'][0]:.2f} -> {noise['after']['loadavg'][0]:.2f}"
          f", running containers {noise['before']['containers_running']} -> "
          f"{noise['after']['containers_running']}; total {wall:.0f}s"
          + (f"; skipped (multi-container): {', '.join(skipped)}" if skipped else "") + "\n")
    print("| task | bare median s | ours median s | ratio | bare: run / oracle / tests / rm "
          "| ours: start / oracle / verify / close |")
    print("|---|---:|---:|---:|---|---|")
    ratios = []
    for r in results:
        b = med([x["seconds"] for x in r["runs"]["bare"]])
        o = med([x["seconds"] for x in r["runs"]["ours"]])
        bp = " / ".join(f"{med([x['phases'][k] for x in r['runs']['bare']]):.2f}"
                        for k in ("start", "oracle", "verify", "close"))
        sp = " / ".join(f"{med([x['phases'][k] for x in r['runs']['split']]):.2f}"
                        for k in ("start", "oracle", "verify", "close"))
        name = r["task"] + (" (bare via compose)" if r["bare_mode"] == "compose" else "")
        verdicts = {x["resolved"] for a in ("bare", "ours") for x in r["runs"][a]}
        if not r["agree"]:
            print(f"| {name} | MISMATCH | | | bare {[x['resolved'] for x in r['runs']['bare']]}"
                  f" | ours {[x.get('verdict') for x in r['runs']['ours']]} |")
            continue
        if verdicts != {True}:
            name += " (both unresolved)"
        ratios.append(o / b)
        print(f"| {name} | {b:.2f} | {o:.2f} | {o / b:.2f}x | {bp} | {sp} |")
    if ratios:
        gm = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        print(f"\ngeometric-mean ratio ours / bare: {gm:.2f}x over {len(ratios)} tasks")
    print("\n| build (once, before timing) | ours first task_image s | was cached | ours "
          "lookup s | bare `docker build` (BuildKit cache) s |")
    print("|---|---:|---|---:|---:|")
    for r in results:
        b = r["build"]
        bare_b = "-" if b["bare_cached_build_s"] is None else f"{b['bare_cached_build_s']:.2f}"
        cached = {True: "no (built now)", False: "yes", None: "?"}[b["built_now"]]
        print(f"| {r['task']} | {b['first_s']:.2f} | {cached} | {b['lookup_s']:.3f} | "
              f"{bare_b} |")

    # where our time goes: traced operations in the split arm, per run, mean over fixtures
    agg: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for r in results:
        n = max(1, len(r["runs"]["split"]))
        for key, xs in r["trace"].items():
            ph, op = key.split("|", 1)
            agg[(ph, op)].append((len(xs) / n, sum(xs) / n))
    n_tasks = max(1, len(results))
    print("\nours, where the time goes (split arm, traced Docker-sandbox operations, per run, "
          "mean over tasks; └: nested in the row above)\n")
    print("| phase | operation | calls | ms |")
    print("|---|---|---:|---:|")
    phase_order = {"start": 0, "oracle": 1, "verify": 2, "close": 3}
    for (ph, op), vals in sorted(agg.items(), key=lambda kv: (phase_order.get(kv[0][0], 9),
                                                              -sum(v[1] for v in kv[1]))):
        calls = sum(v[0] for v in vals) / n_tasks
        ms = sum(v[1] for v in vals) / n_tasks * 1e3
        print(f"| {ph} | {op} | {calls:.1f} | {ms:.0f} |")
    if left or stray:
        print(f"\nwarning: left behind and removed now: {left} sandbox containers; "
              f"stray bare containers: {stray}")
    mismatched = [r["task"] for r in results if not r["agree"]]
    if mismatched:
        print(f"\nMISMATCH: the arms' verdicts differ on {', '.join(mismatched)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"reps": args.reps, "warmup": args.warmup, "bare_tmux": args.bare_tmux,
                       "noise": noise, "skipped": skipped, "wall_s": wall,
                       "geomean_ratio": (math.exp(sum(math.log(x) for x in ratios)
                                                  / len(ratios)) if ratios else None),
                       "tasks": results}, f, indent=1)
    if mismatched:
        sys.exit(1)


if __name__ == "__main__":
    main()
