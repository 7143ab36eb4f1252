"""What the protected verifier costs: episode wall time on the built-in suite, before and after.

    python benchmarks/bench_verify_cost.py [--baseline REF] [--rounds 3] [--skip-docker]

Runs the same episodes with two checkouts of terminal_rsi in one run: this tree, and
`--baseline` (a git ref, checked out into a temporary worktree; default ``defc098``, the last
commit before the verifier ran out of the agent's reach). Each episode is the reference
policy typing the task's solution into a terminal session (``harness.terminal = "session"``)
then the verifier in the harness's default mode, on every built-in family (the 20 procedural
ones and the 4 terminal ones, seed 0). Each round runs both trees once per backend, in
fresh subprocesses, alternating which goes first; the table gives, per backend and tree,
the median over rounds of the suite's mean episode wall time and mean verification time,
the reference's successes, and the ratio to the baseline. Needs root for the local backend's
full isolation, tmux, and for the Docker rows a running engine with the sandbox image.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
from terminal_rsi.agent import HarnessConfig, ReferencePolicy
from terminal_rsi.agent.harness import run_episode
from terminal_rsi.models.tokenizer import ByteTokenizer
from terminal_rsi.tasks import open_task_sandbox
from terminal_rsi.tasks.builtin import FAMILIES, TERMINAL_FAMILIES, make_task
import terminal_rsi
assert terminal_rsi.__file__.startswith(sys.argv[1]), terminal_rsi.__file__
backend = sys.argv[2]
tok = ByteTokenizer()
harness = HarnessConfig(max_turns=8, terminal="session")
rows = []
for family in [*FAMILIES, *TERMINAL_FAMILIES]:
    task = make_task(family, 0)
    tr = run_episode(task, ReferencePolicy(tok, terminal="session"),
                     lambda t: open_task_sandbox(t, backend), harness)
    rows.append({"family": family, "S": int(tr.S or 0), "total_s": tr.timings["total_s"],
                 "verify_s": tr.timings.get("verify_s", 0.0), "error": tr.error or ""})
print(json.dumps(rows))
"""


def worktree(ref: str, tmp: str) -> str:
    """A detached checkout of `ref` of this repository under `tmp`."""
    path = os.path.join(tmp, "baseline")
    subprocess.run(["git", "-C", HERE, "worktree", "add", "--detach", path, ref], check=True,
                   capture_output=True)
    return path


def run_child(tree: str, backend: str) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=tree, TERMINAL_RSI_PROGRESS="never")
    out = subprocess.run([sys.executable, "-c", CHILD, tree, backend], env=env, cwd=tree,
                         capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        raise RuntimeError(f"{tree} on {backend} failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", default="defc098", help="git ref of the baseline tree")
    ap.add_argument("--rounds", type=int, default=3, help="runs of the suite per tree")
    ap.add_argument("--skip-docker", action="store_true", help="local-bwrap only")
    args = ap.parse_args()
    backends = ["local-bwrap"] + ([] if args.skip_docker else ["docker"])
    with tempfile.TemporaryDirectory(prefix="trsi-bench-verify-") as tmp:
        trees = {"baseline": worktree(args.baseline, tmp), "this tree": HERE}
        try:
            results = {(b, t): [] for b in backends for t in trees}
            for r in range(args.rounds):
                order = list(trees) if r % 2 == 0 else list(trees)[::-1]
                for b in backends:
                    for name in order:
                        results[(b, name)].append(run_child(trees[name], b))
        finally:
            subprocess.run(["git", "-C", HERE, "worktree", "remove", "--force",
                            trees["baseline"]], capture_output=True)
    print(f"baseline {args.baseline}; {len(results[(backends[0], 'baseline')][0])} episodes "
          f"per suite, {args.rounds} rounds; medians over rounds of the suite means\n")
    print("| backend | tree | episode ms | verify ms | S | episode / baseline | "
          "verify / baseline |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for b in backends:
        base = None
        for name in trees:
            runs = results[(b, name)]
            ep = statistics.median(statistics.mean(x["total_s"] for x in run) for run in runs)
            ve = statistics.median(statistics.mean(x["verify_s"] for x in run) for run in runs)
            ok = min(sum(x["S"] for x in run) for run in runs)
            base = base or (ep, ve)
            print(f"| {b} | {name} | {ep * 1e3:.0f} | {ve * 1e3:.0f} | {ok}/{len(runs[0])} | "
                  f"{ep / base[0]:.2f}x | {ve / base[1]:.2f}x |")
        for name in trees:
            bad = sorted({x["family"] for run in results[(b, name)] for x in run
                          if not x["S"]})
            if bad:
                print(f"\n{b}, {name}: the reference did not pass {bad}")


if __name__ == "__main__":
    main()
