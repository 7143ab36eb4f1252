"""Config schemas and validation for `experiments/run.py`.

Every experiment declares a schema: a flat mapping from dotted config paths to a
`Field` (type, allowed choices or range, and a one-line doc). `validate_config`
checks a `ml_collections.ConfigDict` against it before any work is done and
raises `ConfigError` with a message that names the bad field and what is
allowed. The same schemas generate `docs/configs.md`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ml_collections

from terminal_rsi.sandbox import BACKENDS, PLAIN_POLICIES


class ConfigError(ValueError):
    """A config field is unknown, missing, ill-typed or out of range."""


_TYPE_NAMES = {int: "int", float: "float", str: "str", bool: "bool", tuple: "tuple", list: "list"}


@dataclasses.dataclass(frozen=True)
class Field:
    """Constraint on one config leaf.

    Attributes:
      type: expected Python type (`float` also accepts ints; `tuple` accepts lists).
      doc: one-line meaning, shown in errors and in docs/configs.md.
      choices: if set, the value must be one of these.
      lo, hi: inclusive numeric bounds (None = unbounded).
      optional: the value may be None.
      item_type: for sequences, the type of every element.
      check: a further check of a well-typed, non-None value: returns what is wrong with it
        (a message), or None when it is allowed.
      allowed: what `check` allows, in words (shown in errors and in docs/configs.md).
    """

    type: type
    doc: str = ""
    choices: Sequence[Any] | None = None
    lo: float | None = None
    hi: float | None = None
    optional: bool = False
    item_type: type | None = None
    check: Callable[[Any], str | None] | None = dataclasses.field(default=None, compare=False)
    allowed: str | None = None

    def describe(self) -> str:
        parts = [_TYPE_NAMES.get(self.type, self.type.__name__)]
        if self.item_type is not None:
            parts[0] += f"[{_TYPE_NAMES.get(self.item_type, self.item_type.__name__)}]"
        if self.allowed is not None:
            parts.append(self.allowed)
        if self.choices is not None:
            parts.append("one of " + ", ".join(repr(c) for c in self.choices))
        if self.lo is not None or self.hi is not None:
            lo = "-inf" if self.lo is None else repr(self.lo)
            hi = "inf" if self.hi is None else repr(self.hi)
            parts.append(f"in [{lo}, {hi}]")
        if self.optional:
            parts.append("or None")
        return ", ".join(parts)


def _type_ok(value: Any, expected: type) -> bool:
    if expected is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if expected in (tuple, list):
        return isinstance(value, tuple | list)
    return isinstance(value, expected)


def check_value(path: str, value: Any, field: Field) -> None:
    """Raise ConfigError if `value` violates `field` (named by `path`)."""
    if value is None:
        if field.optional:
            return
        raise ConfigError(f"config.{path} is None; expected {field.describe()}")
    if not _type_ok(value, field.type):
        raise ConfigError(
            f"config.{path} = {value!r} has type {type(value).__name__}; "
            f"expected {field.describe()}"
        )
    if field.item_type is not None:
        for i, item in enumerate(value):
            if not _type_ok(item, field.item_type):
                raise ConfigError(
                    f"config.{path}[{i}] = {item!r} has type {type(item).__name__}; "
                    f"expected {field.describe()}"
                )
    if field.choices is not None and value not in field.choices:
        raise ConfigError(f"config.{path} = {value!r} is not allowed; expected {field.describe()}")
    if field.lo is not None and value < field.lo or field.hi is not None and value > field.hi:
        raise ConfigError(f"config.{path} = {value!r} is out of range; expected {field.describe()}")
    problem = field.check(value) if field.check is not None else None
    if problem:
        raise ConfigError(f"config.{path} = {value!r} is not allowed: {problem}; expected "
                          f"{field.describe()}")


def sandbox_backend_problem(value: str) -> str | None:
    """What is wrong with `value` as a sandbox backend (None: it is one): a name from
    `terminal_rsi.sandbox.BACKENDS`, an http(s):// bridge URL, or comma-separated bridge URLs
    (sandbox hosts), as `open_sandbox` takes them."""
    if value in BACKENDS:
        return None
    urls = [u.strip() for u in value.split(",")]
    bad = [u for u in urls if not u.startswith(("http://", "https://"))
           or len(u.split("://", 1)[1]) == 0]
    if not bad:
        return None
    if "," in value:
        return f"not http(s):// URLs: {', '.join(repr(u) for u in bad)}"
    return "not a known sandbox backend"


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


def validate_config(config: ml_collections.ConfigDict, schema: Mapping[str, Field]) -> None:
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
BASE_SCHEMA: dict[str, Field] = {
    "experiment": Field(str, "registered experiment to run (terminal_rsi/registry.py)"),
    "seed": Field(int, "global PRNG seed", lo=0),
}

# Where episodes' sandboxes run: every experiment that opens task sandboxes has these.
SANDBOX_SCHEMA: dict[str, Field] = {
    "tasks.backend": Field(
        str, "sandbox backend (local, local-bwrap, local-plain, docker, a bridge URL, or "
        "sandbox hosts as comma-separated URLs)", check=sandbox_backend_problem,
        allowed="one of " + ", ".join(repr(b) for b in BACKENDS) + ", an http(s):// URL or "
        "comma-separated http(s):// URLs"),
    "tasks.allow_plain_sandbox": Field(
        str, "which tasks may run as plain subprocesses (backend 'local' where bubblewrap is "
        "unusable, or 'local-plain' for tasks from disk): no filesystem, network or /tmp "
        "isolation beyond a dedicated uid. 'builtin': the built-in tasks only (a laptop "
        "without bubblewrap); 'always' also lets untrusted task directories run unisolated",
        choices=PLAIN_POLICIES),
}

# Task pool and harness budgets shared by every experiment that runs episodes
# (terminal_rsi.agent rollouts, terminal_rsi.rpr phases).
EPISODE_SCHEMA: dict[str, Field] = {
    "tasks.suite": Field(str, "'builtin' or a directory of task dirs"),
    "tasks.n_per_family": Field(int, "built-in instances per family", lo=1),
    "tasks.families": Field(tuple, "families (empty: all in the split)", item_type=str),
    **SANDBOX_SCHEMA,
    "harness.max_turns": Field(int, "turn budget", lo=1),
    "harness.max_output_tokens": Field(int, "max tokens per turn", lo=1),
    "harness.max_input_tokens": Field(int, "max tokens per call", lo=1),
    "harness.summarize_threshold": Field(int, "context tokens that trigger summarization",
                                         lo=1, optional=True),
    "harness.agent_timeout_s": Field(float, "wall clock per episode (None: the task's)",
                                     lo=0.1, optional=True),
    "harness.max_observation_chars": Field(int, "observation cap (head and tail kept)", lo=1),
    "harness.max_parse_errors": Field(int, "end the episode (parse_errors) at this many "
                                      "unparseable replies (None: no limit, the paper's)",
                                      lo=1, optional=True),
}

# Optional multi-host section; add to an experiment's SCHEMA (`{**BASE_SCHEMA,
# **DISTRIBUTED_SCHEMA, ...}`) and `sharding.distributed_config()` to its config file.
# experiments/run.py calls `sharding.maybe_initialize_distributed(config)` when present.
DISTRIBUTED_SCHEMA: dict[str, Field] = {
    "distributed.enabled": Field(bool, "call jax.distributed.initialize (multi-host runs)"),
    "distributed.coordinator_address": Field(
        str, "host:port of process 0 (else env TERMINAL_RSI_COORDINATOR_ADDRESS or JAX "
        "auto-detection)", optional=True),
    "distributed.num_processes": Field(
        int, "number of processes (else env TERMINAL_RSI_NUM_PROCESSES / auto)", lo=1,
        optional=True),
    "distributed.process_id": Field(
        int, "this process's id (else env TERMINAL_RSI_PROCESS_ID / auto)", lo=0, optional=True),
}
