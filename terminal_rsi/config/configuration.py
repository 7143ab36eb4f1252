"""The config layer of `experiments/run.py`: ml_collections ConfigDicts <-> typed configs.

A typed config is a frozen `terminal_rsi.settings.Section` dataclass; each setting is written
once there. From it this module derives:

- `config_dict(cls, experiment)`: the ConfigDict of its defaults, which a config file under
  `configs/` starts from (it then sets only what differs);
- `schema_of(cls)`: the flat schema {dotted path: Setting}, which `validate_config` checks a
  ConfigDict against before any work (unknown, missing, ill-typed or out-of-range fields
  raise `ConfigError` with one line naming the field and what is allowed) and from which
  `docs/configs.md` is generated;
- `build(cls, config)`: the typed config of a validated ConfigDict, which the stage runs.

The `pipeline` experiment, whose config also carries free `stages.<stage>.<field>` overrides
of its stages' configs, derives its schema with `schema_of` and adds those paths itself.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections
from ml_collections import config_dict as mlc

from terminal_rsi.config import sections
from terminal_rsi.settings import (
    Section,
    Setting,
    SettingError,
    flat_defaults,
    flat_specs,
    from_tree,
)


class ConfigError(SettingError):
    """A config field is unknown, missing, ill-typed or out of range (a `SettingError`: code
    that catches the library's setting errors catches these too)."""


def config_file_name(path: str) -> str | None:
    """`<name>` of a path of the form `configs/<name>.py` (a config file of the package,
    `terminal_rsi/configs/`), else None."""
    parent, name = posixpath.split(posixpath.normpath(path.replace(os.sep, "/")))
    return name[:-3] if parent == "configs" and name.endswith(".py") else None


def check_value(path: str, value: Any, field: Setting) -> None:
    """Raise ConfigError if `value` violates `field` (named by `path`)."""
    problem = field.error(f"config.{path}", value)
    if problem:
        raise ConfigError(problem)


def unknown_override_message(error: Exception, overrides: Sequence[str]) -> str:
    """One readable line for a `--config.<path>` override that names no field of the config
    file (`error`: the KeyError ml_collections raises, perhaps inside an AttributeError; its
    text is a quoted name, perhaps with a line "Did you mean ..."). E.g. for `--config.sed=1`:
    "a config override names a field the config file does not define: 'sed' in
    --config.sed=1; did you mean --config.seed=1?"."""
    while error.args and isinstance(error.args[0], BaseException):  # AttributeError(KeyError)
        error = error.args[0]
    text = error.args[0] if error.args and isinstance(error.args[0], str) else str(error)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    quoted = re.fullmatch(r"""(['"])(.+)\1""", lines[0]) if lines else None
    head = "a config override names a field the config file does not define"
    if quoted is None:  # e.g. an override below a leaf: config.seed.x
        detail = " ".join(lines) or type(error).__name__
        return f"{head} ({detail}); overrides given: {' '.join(overrides)}"
    name = quoted.group(2)
    hint = re.search(r'Did you mean "([^"]+)"', text)

    def parts(o):
        flag, sep, value = o.partition("=")
        return flag.removeprefix("--config.").split("."), sep + value

    culprits = [o for o in overrides if name in parts(o)[0]]
    if not culprits:
        out = f"{head}: {name!r}; overrides given: {' '.join(overrides)}"
        return out + (f"; did you mean {hint.group(1)!r}?" if hint else "")
    out = f"{head}: {name!r} in {culprits[0]}"
    if hint:
        path, rest = parts(culprits[0])
        fixed = ".".join(hint.group(1) if p == name else p for p in path)
        out += f"; did you mean --config.{fixed}{rest}?"
    return out


def flatten(config: ml_collections.ConfigDict | Mapping[str, Any], prefix: str = "") -> dict:
    """Flatten nested ConfigDicts/dicts into {dotted.path: leaf}."""
    out = {}
    items = config.items() if hasattr(config, "items") else ()
    for key, value in items:
        path = f"{prefix}{key}"
        if isinstance(value, ml_collections.ConfigDict | dict):
            out.update(flatten(value, prefix=path + "."))
        else:
            out[path] = value
    return out


def validate_config(config: ml_collections.ConfigDict, schema: Mapping[str, Setting]) -> None:
    """Validate every leaf of `config` against `schema`; raise ConfigError on the first problem.

    Unknown leaves name the allowed fields under the same parent; missing fields
    (in the schema but not in the config) are errors too.
    """
    leaves = flatten(config)
    for path, value in sorted(leaves.items()):
        if path not in schema:
            parent = path.rpartition(".")[0]
            siblings = sorted(
                p for p in schema if p.rpartition(".")[0] == parent and p != path
            ) or sorted(schema)
            raise ConfigError(
                f"config.{path} is not a known field; allowed here: "
                + ", ".join(siblings)
            )
        check_value(path, value, schema[path])
    missing = sorted(set(schema) - set(leaves))
    if missing:
        raise ConfigError(
            f"config.{missing[0]} is missing ({schema[missing[0]].describe()}); "
            "add it to the config file"
        )


# Fields every experiment config carries.
BASE_SCHEMA: dict[str, Setting] = flat_specs(sections.Run)

# Where episodes' sandboxes run: every experiment that opens task sandboxes has these.
SANDBOX_SCHEMA: dict[str, Setting] = {
    f"tasks.{k}": v for k, v in flat_specs(sections.Tasks).items()
    if k in ("backend", "allow_plain_sandbox", "allow_network")}
sandbox_backend_problem = sections.sandbox_backend_problem

# Task pool and harness budgets shared by every experiment that runs episodes
# (terminal_rsi.agent rollouts, terminal_rsi.rpr phases).
EPISODE_SCHEMA: dict[str, Setting] = {
    **{f"tasks.{k}": v for k, v in flat_specs(sections.Tasks).items()},
    **{f"harness.{k}": v for k, v in flat_specs(sections.Harness).items()
       if k not in ("temperature", "system_prompt")},
}

# Optional multi-host section; add to an experiment's SCHEMA (`{**BASE_SCHEMA,
# **DISTRIBUTED_SCHEMA, ...}`) and `distributed_config()` to its config file.
# experiments/run.py calls `sharding.maybe_initialize_distributed(config)` when present.
DISTRIBUTED_SCHEMA: dict[str, Setting] = {
    f"distributed.{k}": v for k, v in flat_specs(sections.Distributed).items()}


def schema_of(cls: type[Section]) -> dict[str, Setting]:
    """The flat schema of a typed config: `experiment` and every leaf of `cls`."""
    return {"experiment": BASE_SCHEMA["experiment"], **flat_specs(cls)}


def config_dict(cls: type[Section], experiment: str) -> ml_collections.ConfigDict:
    """The ConfigDict of `cls`'s defaults for experiment `experiment`, which a config file
    starts from. A setting whose default is None becomes a typed placeholder, so that
    `--config.<path>=<value>` can set it."""
    c = section_dict(cls)
    with c.unlocked():
        c.experiment = experiment
    return c


def distributed_config(**values: Any) -> ml_collections.ConfigDict:
    """The optional `distributed` section (`sections.Distributed`) for a config file, e.g.
    `config.distributed = distributed_config(enabled=True)`."""
    return section_dict(sections.Distributed, **values)


def section_dict(cls: type[Section], **values: Any) -> ml_collections.ConfigDict:
    """The ConfigDict of `cls`'s defaults with `values` (leaf names) set; a None default is a
    typed placeholder."""
    specs = flat_specs(cls)
    defaults = {**flat_defaults(cls), **values}
    unknown = set(defaults) - set(specs)
    if unknown:
        raise ConfigError(f"{cls.__name__} has no setting {sorted(unknown)[0]!r}; its settings: "
                          + ", ".join(specs))
    c = ml_collections.ConfigDict()
    for path, value in defaults.items():
        node = c
        *parents, leaf = path.split(".")
        for p in parents:
            if p not in node:
                node[p] = ml_collections.ConfigDict()
            node = node[p]
        node[leaf] = mlc.placeholder(specs[path].type) if value is None else value
    return c


def build(cls: type[Section], config: ml_collections.ConfigDict | Mapping[str, Any]) -> Section:
    """The typed config `cls` of `config` (checked against `schema_of(cls)` first; a check
    across fields that fails raises ConfigError too)."""
    validate_config(config, schema_of(cls))
    tree = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    tree.pop("experiment", None)
    try:
        return from_tree(cls, tree)
    except SettingError as e:
        raise ConfigError(f"config: {e}") from None
