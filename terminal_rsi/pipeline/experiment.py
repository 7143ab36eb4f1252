"""Experiment "pipeline": the Terminal-RSI stage graph end to end (paper Fig. 2-3, §3.1-3.4).

    python experiments/run.py --config=configs/rpr2_spr.py --workdir=runs/rsi   # the main job
    python experiments/run.py --config=configs/rpr2_spr.py --config.scale=ci    # CI-sized
    python experiments/run.py --config=configs/terminal_rsi.py                  # both RPR-2
    python experiments/run.py --config=configs/rpr2_spr_smollm2.py            # SmolLM2-135M

Runs the prerequisites of `pipeline.targets` in graph order (reusing finished stages),
evaluates every stage (k = 3, held-out instances and held-out families), and keeps
`<workdir>/ledger.json` and `<workdir>/plots/*.png` current. See terminal_rsi.pipeline.runner
and docs/pipeline.md.
"""

from __future__ import annotations

import sys

import ml_collections

from terminal_rsi.pipeline.runner import Pipeline, PipelineError, StageFailed
from terminal_rsi.pipeline.table import stage_table


def run(config: ml_collections.ConfigDict, workdir: str):
    try:
        pipe = Pipeline(config, workdir)
        ledger = pipe.run()
    except (StageFailed, PipelineError) as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    print(stage_table([ledger.to_dict()]))
    print(f"[pipeline] ledger {ledger.path}; trained now: {', '.join(pipe.executed) or 'none'}")
    return ledger
