"""Typed settings (terminal_rsi.settings) and their ConfigDict bridge (configuration.build,
config_dict, schema_of): each setting written once, checked alike everywhere."""

from __future__ import annotations

import dataclasses
import enum
import importlib.util
import os
from collections.abc import Callable

import ml_collections
import pytest

from terminal_rsi.config import configuration, registry
from terminal_rsi.config.configuration import ConfigError, build, config_dict, schema_of
from terminal_rsi.rpr.config import PhaseConfig
from terminal_rsi.settings import (
    Section,
    SettingError,
    flat_defaults,
    flat_specs,
    from_tree,
    setting,
    shared_section,
)
from terminal_rsi.training.losses import Aggregation

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclasses.dataclass(frozen=True)
class Inner(Section):
    rate: float = setting(0.5, "a rate", lo=0.0, hi=1.0)
    names: tuple[str, ...] = setting(("a",), "some names")


@dataclasses.dataclass(frozen=True)
class Outer(Section):
    steps: int = setting(3, "steps", lo=1)
    color: Color = setting(Color.RED, "a color")
    limit: int | None = setting(None, "a limit (None: none)", lo=0)
    inner: Inner = Inner()
    other: Inner = Inner(rate=0.25)

    def __post_init__(self):
        super().__post_init__()
        if self.limit is not None and self.limit > 10 * self.steps:
            raise SettingError(f"limit = {self.limit} exceeds 10 x steps = {10 * self.steps}")


def test_defaults_types_and_coercion():
    o = Outer(steps=2, color="blue", inner=Inner(rate=1, names=["x", "y"]))
    assert o.color is Color.BLUE
    assert isinstance(o.inner.rate, float) and o.inner.rate == 1.0
    assert o.inner.names == ("x", "y")
    assert o.other.rate == 0.25 and Outer().other == Inner(rate=0.25)
    assert hash(o) == hash(Outer(steps=2, color=Color.BLUE, inner=Inner(1.0, ("x", "y"))))


@pytest.mark.parametrize("kwargs, message", [
    ({"steps": 0}, "Outer.steps = 0 is out of range; expected int, in [1, inf]"),
    ({"steps": 2.5}, "Outer.steps = 2.5 has type float; expected int"),
    ({"steps": True}, "Outer.steps = True has type bool"),
    ({"color": "green"}, "Outer.color = 'green' is not allowed; expected str, one of 'red', "
                         "'blue'"),
    ({"limit": -1}, "Outer.limit = -1 is out of range; expected int, in [0, inf], or None"),
    ({"limit": 100}, "limit = 100 exceeds 10 x steps = 30"),
    ({"inner": {"rate": 0.1}}, "Outer.inner = {'rate': 0.1}; expected a Inner"),
])
def test_bad_values_name_the_field(kwargs, message):
    with pytest.raises(SettingError) as e:
        Outer(**kwargs)
    assert message in str(e.value)


def test_item_types_are_checked():
    with pytest.raises(SettingError, match=r"Inner.names\[1\] = 3 has type int"):
        Inner(names=("a", 3))


def test_a_field_without_setting_is_refused():
    @dataclasses.dataclass(frozen=True)
    class Bad(Section):
        x: int = 1

    with pytest.raises(TypeError, match="Bad.x is declared without setting"):
        Bad()


def test_section_reads_as_a_mapping():
    o = Outer()
    assert o["steps"] == 3 and o.get("limit") is None and o.get("nope", 7) == 7
    assert list(o) == ["steps", "color", "limit", "inner", "other"]
    assert dict(o.inner) == {"rate": 0.5, "names": ("a",)}
    assert "steps" in o and "nope" not in o
    with pytest.raises(KeyError):
        o["nope"]


def test_to_dict_nests_sections_and_unwraps_enums():
    assert Outer(color=Color.BLUE).to_dict() == {
        "steps": 3, "color": "blue", "limit": None, "inner": {"rate": 0.5, "names": ("a",)},
        "other": {"rate": 0.25, "names": ("a",)}}


def test_flat_specs_and_defaults():
    specs = flat_specs(Outer)
    assert sorted(specs) == ["color", "inner.names", "inner.rate", "limit", "other.names",
                             "other.rate", "steps"]
    assert specs["limit"].optional and specs["limit"].type is int
    assert specs["inner.names"].type is tuple and specs["inner.names"].item_type is str
    assert specs["color"].choices == ("red", "blue")
    assert flat_defaults(Outer) == {"steps": 3, "color": "red", "limit": None,
                                    "inner.rate": 0.5, "inner.names": ("a",),
                                    "other.rate": 0.25, "other.names": ("a",)}


def test_from_tree_fills_defaults():
    o = from_tree(Outer, {"steps": 5, "other": {"names": ["z"]}})
    assert o == Outer(steps=5, other=Inner(rate=0.25, names=("z",)))


@dataclasses.dataclass(frozen=True)
class StageInner(Inner):
    """A stage's section: the shared settings and one of the stage's own."""

    label: str = setting("x", "the stage's own setting")


@dataclasses.dataclass(frozen=True)
class RuntimeInner(Inner):
    """A runtime object of the concept: the section plus a runtime-only setting."""

    callback: Callable[[int], int] | None = setting(None, "a runtime-only callable")


def test_from_config_passes_what_the_classes_share():
    """`Runtime.from_config(section)` passes the settings of the most derived class both
    derive from; a stage's own field stays behind; a plain mapping's unknown key is an
    error, never dropped silently; overrides win and are checked like any value."""
    assert shared_section(RuntimeInner, StageInner) is Inner
    assert shared_section(RuntimeInner, RuntimeInner) is RuntimeInner
    with pytest.raises(SettingError, match="share no settings"):
        shared_section(RuntimeInner, Outer)
    r = RuntimeInner.from_config(StageInner(rate=0.75, names=("b",), label="y"),
                                 callback=abs)
    assert (r.rate, r.names, r.callback) == (0.75, ("b",), abs)
    assert RuntimeInner.from_config({"rate": 1}).rate == 1.0
    with pytest.raises(SettingError, match="RuntimeInner has no setting 'label'"):
        RuntimeInner.from_config({"rate": 0.5, "label": "y"})
    with pytest.raises(SettingError, match="RuntimeInner.rate = 2.0 is out of range"):
        RuntimeInner.from_config(StageInner(), rate=2.0)
    with pytest.raises(SettingError, match="RuntimeInner.callback = 3 has type int; "
                       "expected callable"):
        RuntimeInner(callback=3)


def test_config_dict_round_trip_and_overrides():
    c = config_dict(Outer, "demo")
    assert c.experiment == "demo" and c.limit is None
    c.limit = 4  # a typed placeholder accepts its type
    with pytest.raises(TypeError):
        c.steps = "many"  # ml_collections keeps each default's type
    assert build(Outer, c) == Outer(limit=4)


def test_build_errors_are_config_errors_with_the_path():
    c = config_dict(Outer, "demo")
    c.inner.rate = 2.0
    with pytest.raises(ConfigError, match=r"config.inner.rate = 2.0 is out of range"):
        build(Outer, c)
    c = config_dict(Outer, "demo")
    c.limit = 100
    with pytest.raises(ConfigError, match="config: limit = 100 exceeds"):
        build(Outer, c)
    c = config_dict(Outer, "demo")
    with c.unlocked():
        c.inner.speed = 1
    with pytest.raises(ConfigError, match="config.inner.speed is not a known field; allowed "
                                          "here: inner.names, inner.rate"):
        build(Outer, c)
    c = ml_collections.ConfigDict({"experiment": "demo", "steps": 1})
    with pytest.raises(ConfigError, match="config.color is missing"):
        build(Outer, c)


def _load(path):
    spec = importlib.util.spec_from_file_location("cfg_" + os.path.basename(path)[:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def test_phase_config_file_holds_only_differences_and_builds():
    c = _load(os.path.join(ROOT, "configs", "rpr_phase.py"))
    cfg = registry.get_experiment("rpr_phase").check(c)
    assert isinstance(cfg, PhaseConfig)
    assert cfg.model.d_model == 32 and cfg.ppo.clip_high == 5.0
    defaults = configuration.flatten(config_dict(PhaseConfig, "rpr_phase"))
    changed = {k for k, v in configuration.flatten(c).items() if defaults[k] != v}
    assert changed == {"model.d_model", "model.n_layers", "model.n_heads", "model.n_kv_heads",
                       "model.head_dim", "model.d_ff", "model.max_seq_len", "tasks.families"}
    assert set(schema_of(PhaseConfig)) == set(defaults)


def test_a_phase_setting_reaches_the_losses():
    c = _load(os.path.join(ROOT, "configs", "rpr_phase.py"))
    c.ppo.entropy_coef, c.harness.temperature = 0.01, 0.6
    cfg = registry.get_experiment("rpr_phase").check(c)
    loss = cfg.loss_config()  # the ppo section's loss settings, the rollouts' temperature
    assert (loss.entropy_coef, loss.temperature, loss.clip_high) == (0.01, 0.6, 5.0)
    assert loss.aggregation is Aggregation.SAMPLE_MEAN


def test_phase_cross_field_check_reaches_the_user():
    c = _load(os.path.join(ROOT, "configs", "rpr_phase.py"))
    c.harness.temperature = 0.0
    with pytest.raises(ConfigError, match=r"PPOConfig.temperature = 0.0 is not allowed: PPO "
                       r"optimizes the sampling policy .* \(harness.temperature\)"):
        registry.get_experiment("rpr_phase").check(c)
