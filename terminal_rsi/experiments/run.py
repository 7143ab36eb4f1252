"""The one entry point: `--config=configs/<name>.py [--config.a.b=value ...] [--workdir=DIR]`.

    python experiments/run.py --config=configs/rpr2_spr.py          # in a checkout
    terminal-rsi --config=configs/rpr2_spr.py                       # installed, from any dir
    python -m terminal_rsi.experiments.run --config=configs/rpr2_spr.py

`--config=configs/<name>.py` names the file under the working directory when there is one,
else the package's own `terminal_rsi/configs/<name>.py` (which a checkout's `configs/` links
to), so an installed package (`pip install .`) runs its configs from any directory.

Overrides use ml_collections syntax, e.g. `--config.seed=3`. The config is
validated against its experiment's schema before any work; a bad config file,
field or value prints one line naming the problem and exits with status 2.

Console: stdout carries the stages' one-line summaries; long loops (SFT steps, rollout
batches, evaluation episodes, RPR steps) draw progress bars on stderr when it is a terminal
(`--progress=always|never` overrides that). Library INFO logging (absl, orbax checkpoint
details, JAX) is off: only warnings and errors show unless `--verbosity=0` (INFO) or
`--verbosity=1` (DEBUG) asks for more.
"""

from __future__ import annotations

import importlib.resources
import json
import os
import sys
from collections.abc import Sequence

from absl import app, flags, logging
from ml_collections import config_flags

from terminal_rsi.config import registry
from terminal_rsi.config.configuration import (
    ConfigError,
    config_file_name,
    unknown_override_message,
)
from terminal_rsi.models.source import check_model_source
from terminal_rsi.runtime import compile_cache, progress, sharding
from terminal_rsi.runtime.atomic import atomic_write_text
from terminal_rsi.settings import SettingError

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Path to a config file: configs/<name>.py (the package's own when the working "
    "directory has no such file) or any other path (ml_collections).", lock_config=True
)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Directory for artifacts and checkpoints (default: runs/<experiment>)."
)
_PROGRESS = flags.DEFINE_enum(
    "progress", None, progress.MODES,
    "Progress bars on stderr: auto (only when stderr is a terminal), always, never (default: "
    f"${progress.ENV}, else auto)."
)
# absl's --verbosity: unset, run.py shows warnings and errors only (app.run would show INFO).
QUIET_VERBOSITY = logging.WARNING


def _fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        _fail(f"unexpected positional arguments {argv[1:]}; pass options as --flag=value")
    config = _CONFIG.value
    if config is None:
        _fail("--config is required, e.g. --config=configs/credit_diagnostic.py")
    try:
        experiment_name = config.get("experiment")
        if experiment_name is None:
            raise ConfigError("config.experiment is missing; the config must name its experiment")
        experiment = registry.get_experiment(experiment_name)
        checked = experiment.check(config)  # a typed config, built from the ConfigDict
        check_model_source(config)  # config.model.gguf names a model that exists
    except SettingError as e:  # ConfigError, or a setting a library check refused
        _fail(str(e))
    if "distributed" in config or os.environ.get("TERMINAL_RSI_DISTRIBUTED"):  # multi-host
        sharding.maybe_initialize_distributed(config)
    workdir = _WORKDIR.value or os.path.join("runs", experiment_name)
    write_config(config, workdir)
    cache = compile_cache.enable()  # $TERMINAL_RSI_COMPILATION_CACHE=off disables it
    logging.info("JAX compilation cache: %s", cache or "off")
    logging.info("running %s in %s", experiment_name, workdir)
    experiment.run(checked, workdir)


def write_config(config, workdir: str) -> str:
    """Write the resolved, validated config to `<workdir>/config.json` atomically (contract
    C1: every experiment can rely on it) and return the path. Tuples become lists; a value
    JSON cannot hold is written as its str()."""
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, "config.json")
    text = json.dumps(config.to_dict(), indent=2, sort_keys=True, default=str)
    atomic_write_text(path, text + "\n")
    return path


def config_file(spec: str) -> str:
    """`--config`'s value with `configs/<name>.py` made the package's own file when the working
    directory has no such file (ml_collections' `path[:argument]` form is kept); any other
    value as given."""
    path, colon, arg = spec.partition(":")
    name = config_file_name(path)
    if os.path.exists(path) or name is None:
        return spec
    packaged = importlib.resources.files("terminal_rsi.configs") / f"{name}.py"
    return str(packaged) + colon + arg if packaged.is_file() else spec


def with_packaged_config(argv: Sequence[str]) -> list[str]:
    """`argv` with the value of `--config=X` (or `--config X`) passed through `config_file`."""
    out = list(argv)
    for i, a in enumerate(out):
        if a.startswith("--config="):
            out[i] = "--config=" + config_file(a[len("--config="):])
        elif i and out[i - 1] == "--config":
            out[i] = config_file(a)
    return out


def parse_flags(argv: list[str]) -> list[str]:
    """Parse flags; turn flag and config-file errors into one line instead of a traceback."""
    try:
        rest = flags.FLAGS(with_packaged_config(argv))
        _console_defaults()
        if _CONFIG.value is not None:
            _CONFIG.value.get("experiment")  # config files load lazily: surface errors now
        return rest
    except flags.Error as e:
        _fail(str(e).splitlines()[0])
    except (KeyError, AttributeError) as e:
        _fail(unknown_override_message(e, [a for a in argv if a.startswith("--config.")]))
    except Exception as e:  # config_flags raises OSError for missing files and syntax errors
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        detail = lines[-1] if lines else type(e).__name__
        _fail(f"could not load the config file given by --config: {detail}")
    raise AssertionError("unreachable")


def _console_defaults() -> None:
    """Quiet library logging unless --verbosity was given (absl raises an unset verbosity to
    INFO, which floods the console with orbax's per-checkpoint lines), and hand --progress to
    `terminal_rsi.runtime.progress` (its environment variable, so it holds in every module)."""
    if flags.FLAGS["verbosity"].using_default_value:
        flags.FLAGS.verbosity = QUIET_VERBOSITY
    if _PROGRESS.value is not None:
        os.environ[progress.ENV] = _PROGRESS.value


def cli() -> None:
    """The console script `terminal-rsi` (setup.py) and `python -m` this module."""
    app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
    cli()
