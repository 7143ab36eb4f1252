"""The whole Terminal-RSI graph with both RPR-2 branches: ordinary FDR (rpr2_fdr) and the
retained Long-Reward SPR branch (rpr2_spr), sharing every stage up to rsr2.

    python experiments/run.py --config=configs/terminal_rsi.py --workdir=runs/rsi

Same options as configs/rpr2_spr.py (a run dir of either job can be continued by the other:
shared stages are reused).
"""

from terminal_rsi.configs.rpr2_spr import get_config as _main


def get_config():
    c = _main()
    c.pipeline.targets = ("rpr2_fdr", "rpr2_spr")
    return c
