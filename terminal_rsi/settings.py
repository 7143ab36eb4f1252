"""Typed settings: frozen dataclasses are the one place a setting is written.

A config section is a frozen dataclass deriving from `Section`; each field says its type (the
annotation), its default, its allowed values and its one-line doc, once:

    @dataclasses.dataclass(frozen=True)
    class Checkpointing(Section):
        every: int = setting(2, "checkpoint every M steps (and at the end)", lo=1)
        max_to_keep: int = setting(3, "checkpoints kept", lo=1)

Everything else derives from that: an instance checks itself (`SettingError` naming the field
and what is allowed), `terminal_rsi.config.configuration` builds instances from an ml_collections
ConfigDict and derives the schema checks and `docs/configs.md` from these fields, and the
config files under `configs/` start from `configuration.config_dict(<Config>)` and hold only
what differs from the defaults.

Types: bool, int, float (an int is accepted and stored as float), str, `tuple[T, ...]` (a
list is accepted and stored as a tuple), an `enum.Enum` (its value is accepted), a
`Callable[..., T]` (runtime settings only: a config file cannot hold one), `X | None` (None
allowed), and a nested `Section` (a sub-section of the config). A section also reads as
a read-only mapping of its fields (`section["every"]`, `section.get("every")`, `dict(section)`),
so code written against ConfigDict sections keeps working; new code uses attributes.

A runtime object of a concept is its section or a class derived from it that adds only what
a config does not set (e.g. `agent.HarnessConfig` extends `sections.Harness` with the
harness's name and verifier backend): `Runtime.from_config(section, **overrides)` passes the
settings the section's class shares with it by inheritance, so a setting renamed in the
section is renamed in the runtime class too and cannot stop flowing, and each bound is
checked in one place.

This module has no dependency beyond the standard library, so library code anywhere can
declare its settings without importing the config layer.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

_KEY = "terminal_rsi.setting"
_TYPE_NAMES = {int: "int", float: "float", str: "str", bool: "bool", tuple: "tuple", list: "list",
               Callable: "callable"}


class SettingError(ValueError):
    """A setting has the wrong type or a value outside what its field allows."""


@dataclasses.dataclass(frozen=True)
class Setting:
    """What one setting allows.

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
        """What is allowed, in words: "float, in [0.0, inf], or None"."""
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

    def error(self, name: str, value: Any) -> str | None:
        """What is wrong with `value` as the setting called `name` (a message that names it
        and what is allowed), or None when the value is allowed."""
        expected = f"expected {self.describe()}"
        if value is None:
            return None if self.optional else f"{name} is None; {expected}"
        if not type_ok(value, self.type):
            return f"{name} = {value!r} has type {type(value).__name__}; {expected}"
        if self.item_type is not None:
            for i, item in enumerate(value):
                if not type_ok(item, self.item_type):
                    return (f"{name}[{i}] = {item!r} has type {type(item).__name__}; "
                            f"{expected}")
        if self.choices is not None and value not in self.choices:
            return f"{name} = {value!r} is not allowed; {expected}"
        if self.lo is not None and value < self.lo or self.hi is not None and value > self.hi:
            return f"{name} = {value!r} is out of range; {expected}"
        problem = self.check(value) if self.check is not None else None
        if problem:
            return f"{name} = {value!r} is not allowed: {problem}; {expected}"
        return None


def type_ok(value: Any, expected: type) -> bool:
    """`value` is an instance of `expected`, where float accepts int, tuple and list accept
    either, and bool is never an int."""
    if expected is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if expected in (tuple, list):
        return isinstance(value, tuple | list)
    return isinstance(value, expected)


def setting(default: Any = dataclasses.MISSING, doc: str = "", *,
            choices: Sequence[Any] | None = None, lo: float | None = None,
            hi: float | None = None, check: Callable[[Any], str | None] | None = None,
            allowed: str | None = None) -> Any:
    """A dataclass field of a `Section`: its default, one-line doc and allowed values (the
    type, optionality and item type come from the annotation)."""
    meta = {"doc": doc, "choices": tuple(choices) if choices is not None else None,
            "lo": lo, "hi": hi, "check": check, "allowed": allowed}
    if isinstance(default, Section):  # a frozen section is immutable: safe to share
        return dataclasses.field(default_factory=lambda: default, metadata={_KEY: meta})
    return dataclasses.field(default=default, metadata={_KEY: meta})


def section_type(tp: Any) -> type[Section] | None:
    """The Section class of a field annotation (None if the field is a leaf)."""
    return tp if isinstance(tp, type) and issubclass(tp, Section) else None


@functools.cache
def specs(cls: type) -> dict[str, Setting | type[Section]]:
    """{field name: its Setting, or the Section class of a sub-section} of a Section class,
    with types resolved from the annotations."""
    hints = typing.get_type_hints(cls)
    out: dict[str, Setting | type[Section]] = {}
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if section_type(tp) is not None:
            out[f.name] = tp
            continue
        if _KEY not in f.metadata:
            raise TypeError(f"{cls.__name__}.{f.name} is declared without setting(...); every "
                            "field of a Section needs a doc and its allowed values")
        base, optional, item = _leaf_type(tp, f"{cls.__name__}.{f.name}")
        meta = dict(f.metadata[_KEY])
        if isinstance(base, type) and issubclass(base, enum.Enum) and meta["choices"] is None:
            meta["choices"] = tuple(m.value for m in base)
            base = type(meta["choices"][0])
        out[f.name] = Setting(base, optional=optional, item_type=item, **meta)
    return out


def _leaf_type(tp: Any, name: str) -> tuple[type, bool, type | None]:
    """(base type, optional, item type) of a leaf annotation."""
    optional = False
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        optional = len(args) < len(typing.get_args(tp))
        if len(args) != 1:
            raise TypeError(f"{name}: a setting has one type (and perhaps None), not {tp}")
        tp = args[0]
    if typing.get_origin(tp) is tuple:
        args = typing.get_args(tp)
        if len(args) != 2 or args[1] is not Ellipsis:
            raise TypeError(f"{name}: tuple settings are tuple[T, ...], not {tp}")
        return tuple, optional, args[0]
    if typing.get_origin(tp) is Callable or tp is Callable:
        return Callable, optional, None
    if tp is Any:
        return object, optional, None
    if not isinstance(tp, type):
        raise TypeError(f"{name}: unsupported setting type {tp}")
    return tp, optional, None


def _coerce(value: Any, spec: Setting, enum_type: type | None) -> Any:
    """The stored form of an allowed value: int -> float, list -> tuple, value -> Enum."""
    if value is None:
        return None
    if spec.type is float and not isinstance(value, float):
        return float(value)
    if spec.type is tuple and not isinstance(value, tuple):
        return tuple(value)
    if enum_type is not None and not isinstance(value, enum_type):
        return enum_type(value)
    return value


@functools.cache
def _enum_types(cls: type) -> dict[str, type]:
    """{field name: its Enum class} of the Enum-typed leaves of a Section class."""
    out = {}
    for name, tp in typing.get_type_hints(cls).items():
        args = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
        if isinstance(args[0], type) and issubclass(args[0], enum.Enum):
            out[name] = args[0]
    return out


class Section(Mapping):
    """Base of a frozen settings dataclass (see the module doc). Subclasses that define
    `__post_init__` for checks across fields call `super().__post_init__()` first."""

    def __post_init__(self) -> None:
        cls = type(self)
        for name, spec in specs(cls).items():
            value = getattr(self, name)
            if isinstance(spec, type):
                if not isinstance(value, spec):
                    raise SettingError(f"{cls.__name__}.{name} = {value!r}; expected a "
                                       f"{spec.__name__}")
                continue
            enum_type = _enum_types(cls).get(name)
            raw = value.value if isinstance(value, enum.Enum) else value
            problem = spec.error(f"{cls.__name__}.{name}", raw)
            if problem:
                raise SettingError(problem)
            object.__setattr__(self, name, _coerce(value, spec, enum_type))

    # read-only mapping of the fields, for code written against ConfigDict sections
    def __getitem__(self, key: str) -> Any:
        if key in specs(type(self)):
            return getattr(self, key)
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(specs(type(self)))

    def __len__(self) -> int:
        return len(specs(type(self)))

    def replace(self, **changes: Any) -> Section:
        """A copy with `changes` (checked like any instance)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_config(cls, section: Mapping[str, Any], **overrides: Any) -> Any:
        """An instance of `cls` from a config section, with `overrides` (fields of `cls`).

        A typed section (a `Section` instance) passes the settings its class shares with
        `cls` by inheritance: the fields of the most derived Section class both derive from
        (`shared_section`); the section's further fields belong to its stage (which passes
        one on as an override where the runtime needs it). A plain mapping (a ConfigDict
        section, a dict) passes every key, and a key that is not a field of `cls` is a
        `SettingError`: a setting is never dropped without a word.
        """
        if isinstance(section, Section):
            names = specs(shared_section(cls, type(section)))
        else:
            names = specs(cls)
            unknown = sorted(k for k in section if k not in names)
            if unknown:
                raise SettingError(f"{cls.__name__} has no setting "
                                   f"{', '.join(repr(k) for k in unknown)}; its settings: "
                                   f"{', '.join(names)}")
        return cls(**{**{k: section[k] for k in names if k in section}, **overrides})

    def to_dict(self) -> dict[str, Any]:
        """Nested plain dict of the settings (sub-sections as dicts, Enums as their values),
        as a ConfigDict's `to_dict()` gives it."""
        out: dict[str, Any] = {}
        for name in specs(type(self)):
            value = getattr(self, name)
            out[name] = (value.to_dict() if isinstance(value, Section)
                         else value.value if isinstance(value, enum.Enum) else value)
        return out


def shared_section(cls: type[Section], other: type[Section]) -> type[Section]:
    """The most derived Section class that both `cls` and `other` derive from (SettingError
    when they share none but `Section`)."""
    for base in other.__mro__:
        if isinstance(base, type) and issubclass(base, Section) and base is not Section \
                and issubclass(cls, base):
            return base
    raise SettingError(f"a {other.__name__} is not a config section of {cls.__name__}: they "
                       "share no settings")


def flat_specs(cls: type[Section], prefix: str = "") -> dict[str, Setting]:
    """{dotted path: Setting} of every leaf of a Section class, sub-sections included."""
    out: dict[str, Setting] = {}
    for name, spec in specs(cls).items():
        if isinstance(spec, type):
            out.update(flat_specs(spec, f"{prefix}{name}."))
        else:
            out[f"{prefix}{name}"] = spec
    return out


def flat_defaults(cls: type[Section], prefix: str = "") -> dict[str, Any]:
    """{dotted path: default} of every leaf of a Section class (Enum defaults as their
    values), sub-sections included."""
    return {k: (v.value if isinstance(v, enum.Enum) else v)
            for k, v in _flat_values(cls(), prefix).items()}


def _flat_values(section: Section, prefix: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, spec in specs(type(section)).items():
        value = getattr(section, name)
        if isinstance(spec, type):
            out.update(_flat_values(value, f"{prefix}{name}."))
        else:
            out[f"{prefix}{name}"] = value
    return out


def from_tree(cls: type[Section], tree: Mapping[str, Any],
              base: Section | None = None) -> Section:
    """An instance of `cls` from a nested mapping of leaves; what `tree` leaves out keeps its
    value in `base` (default: `cls()`, whose sub-sections carry their own defaults)."""
    base = cls() if base is None else base
    kwargs = {}
    for name, spec in specs(cls).items():
        if name not in tree:
            continue
        value = tree[name]
        kwargs[name] = (from_tree(spec, value, getattr(base, name)) if isinstance(spec, type)
                        else value)
    return dataclasses.replace(base, **kwargs)
