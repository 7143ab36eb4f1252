"""The one entry point: `python experiments/run.py --config=configs/<name>.py [--workdir=DIR]`.

Overrides use ml_collections syntax, e.g. `--config.seed=3`. The config is
validated against its experiment's schema before any work; a bad config file,
field or value prints one line naming the problem and exits with status 2.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

# Run from a checkout without installing: the package next to this file wins.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from terminal_rsi import registry  # noqa: E402
from terminal_rsi.atomic import atomic_write_text  # noqa: E402
from terminal_rsi.configuration import ConfigError, validate_config  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Path to a config file under configs/ (ml_collections).", lock_config=True
)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Directory for artifacts and checkpoints (default: runs/<experiment>)."
)


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
        validate_config(config, experiment.SCHEMA)
        from terminal_rsi.models.loading import check_model_source

        check_model_source(config)  # config.model.gguf names a model that exists
    except ConfigError as e:
        _fail(str(e))
    if "distributed" in config or os.environ.get("TERMINAL_RSI_DISTRIBUTED"):  # multi-host
        from terminal_rsi import sharding

        sharding.maybe_initialize_distributed(config)
    workdir = _WORKDIR.value or os.path.join("runs", experiment_name)
    write_config(config, workdir)
    from terminal_rsi import compile_cache

    cache = compile_cache.enable()  # $TERMINAL_RSI_COMPILATION_CACHE=off disables it
    logging.info("JAX compilation cache: %s", cache or "off")
    logging.info("running %s in %s", experiment_name, workdir)
    experiment.run(config, workdir)


def write_config(config, workdir: str) -> str:
    """Write the resolved, validated config to `<workdir>/config.json` atomically (contract
    C1: every experiment can rely on it) and return the path. Tuples become lists; a value
    JSON cannot hold is written as its str()."""
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, "config.json")
    text = json.dumps(config.to_dict(), indent=2, sort_keys=True, default=str)
    atomic_write_text(path, text + "\n")
    return path


def _parse_flags(argv: list[str]) -> list[str]:
    """Parse flags; turn flag and config-file errors into one line instead of a traceback."""
    try:
        rest = flags.FLAGS(argv)
        if _CONFIG.value is not None:
            _CONFIG.value.get("experiment")  # config files load lazily: surface errors now
        return rest
    except flags.Error as e:
        _fail(str(e).splitlines()[0])
    except (KeyError, AttributeError) as e:
        overrides = [a for a in argv if a.startswith("--config.")]
        _fail(
            f"a config override names a field the config file does not define ({e}); "
            f"overrides given: {' '.join(overrides)}"
        )
    except Exception as e:  # config_flags raises OSError for missing files and syntax errors
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        detail = lines[-1] if lines else type(e).__name__
        _fail(f"could not load the config file given by --config: {detail}")
    raise AssertionError("unreachable")


if __name__ == "__main__":
    app.run(main, flags_parser=_parse_flags)
