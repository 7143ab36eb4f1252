"""The one entry point: `python experiments/run.py --config=configs/<name>.py [--workdir=DIR]`.

Run from a checkout: the package next to this file wins over an installed one. The command
line itself is `terminal_rsi/experiments/run.py` (installed: `terminal-rsi` or
`python -m terminal_rsi.experiments.run`, with the same flags, from any directory).
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from terminal_rsi.experiments.run import cli  # noqa: E402

if __name__ == "__main__":
    cli()
