"""The experiment config files: one `get_config()` per file (ml_collections), run with
`python experiments/run.py --config=configs/<name>.py` (or, installed, `terminal-rsi
--config=configs/<name>.py` from any directory).

They live inside the package so an installed `terminal_rsi` (`pip install .`, not only
`-e`) carries them: the pipeline loads its stages' files from here
(`terminal_rsi.pipeline.resolve.load_config_file`), and a checkout's top-level `configs/`
is a link to this directory. A config file imports another as
`from terminal_rsi.configs.<name> import get_config`. The reference of every field:
docs/configs.md.
"""

import pathlib

CONFIG_DIR = pathlib.Path(__file__).resolve().parent


def config_names() -> list[str]:
    """The config files' names (`<name>` of `configs/<name>.py`), sorted."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.py") if not p.name.startswith("_"))
