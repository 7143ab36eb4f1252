"""Progress bars with the project's defaults, and console lines that do not tear them.

    bar = progress(total=120, desc="sft", unit="step")    # a tqdm bar on stderr
    for row in rows:
        bar.set_postfix(loss=f"{row['loss']:.3f}", refresh=False)
        bar.update()
    echo("[base_sft] step 10/120 ...")                     # stdout, bars redrawn below
    bar.close()

Bars go to stderr with rate and ETA, and vanish when closed (the one-line stage summaries
stay). They are drawn only when stderr is a terminal, so logs, pipes and tests never get
them, unless forced: `force=True` (or False: never), else `$TERMINAL_RSI_PROGRESS`
(`always`, `never` or `auto`; experiments/run.py's `--progress` sets it).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import Any

from tqdm import tqdm

ENV = "TERMINAL_RSI_PROGRESS"
MODES = ("auto", "always", "never")


def progress(iterable: Iterable | None = None, *, total: float | None = None,
             desc: str | None = None, unit: str = "it", force: bool | None = None,
             **kwargs: Any) -> tqdm:
    """A tqdm bar on stderr (`leave=False`; other tqdm arguments pass through). Shown when
    `force` is True, hidden when False; None: `$TERMINAL_RSI_PROGRESS` decides, and `auto`
    (the default) shows it only when stderr is a terminal. A hidden bar is a no-op."""
    if force is None:
        mode = os.environ.get(ENV, "auto").strip().lower() or "auto"
        if mode not in MODES:
            raise ValueError(f"${ENV}={mode!r}; expected one of {', '.join(MODES)}")
        force = {"always": True, "never": False}.get(mode)
    options = {"file": sys.stderr, "leave": False, "dynamic_ncols": True, "mininterval": 0.5,
               **kwargs}
    # disable=None: tqdm hides the bar when its file is not a terminal
    return tqdm(iterable, total=total, desc=desc, unit=unit,
                disable=None if force is None else not force, **options)


def echo(line: str, file=None) -> None:
    """Print `line` (default: to stdout) above any progress bar on the terminal, flushed."""
    out = sys.stdout if file is None else file
    tqdm.write(line, file=out)
    out.flush()
