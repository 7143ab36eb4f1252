"""Config validation and the experiments/run.py entry point."""

import importlib.util
import os
import subprocess
import sys

import ml_collections
import pytest

from terminal_rsi.config import registry
from terminal_rsi.config.configuration import (
    BASE_SCHEMA,
    EPISODE_SCHEMA,
    SANDBOX_SCHEMA,
    ConfigError,
    Setting,
    sandbox_backend_problem,
    validate_config,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCHEMA = {
    **BASE_SCHEMA,
    "model.name": Setting(str, "preset", choices=("tiny", "big")),
    "model.layers": Setting(int, "depth", lo=1, hi=64),
    "lr": Setting(float, "learning rate", lo=0.0),
    "seeds": Setting(tuple, "seeds", item_type=int),
    "note": Setting(str, "free text", optional=True),
}


def _base():
    return {"experiment": "x", "seed": 0, "model": {"name": "tiny", "layers": 2}, "lr": 1e-3,
            "seeds": (1, 2), "note": None}


def test_valid_config_passes():
    validate_config(ml_collections.ConfigDict(_base()), SCHEMA)
    validate_config(ml_collections.ConfigDict({**_base(), "lr": 1}), SCHEMA)  # int is a float


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda c: c["model"].update(name="huge"),
         r"config.model.name = 'huge' is not allowed; expected str, one of 'tiny', 'big'"),
        (lambda c: c["model"].update(layers=0), r"config.model.layers = 0 is out of range"),
        (lambda c: c["model"].update(layers=2.5), r"config.model.layers = 2.5 has type float"),
        (lambda c: c.update(seeds=(1, "a")), r"config.seeds\[1\] = 'a'"),
        (lambda c: c["model"].update(dropout=0.1),
         r"config.model.dropout is not a known field; allowed here: model.layers, model.name"),
        (lambda c: c.pop("lr"), r"config.lr is missing"),
        (lambda c: c.update(lr=None), r"config.lr is None"),
        (lambda c: c.update(lr=True), r"config.lr = True has type bool"),
        (lambda c: c.update(seed=-1), r"config.seed = -1 is out of range"),
    ],
)
def test_bad_fields_are_named(mutate, message):
    d = _base()
    mutate(d)
    with pytest.raises(ConfigError, match=message):
        validate_config(ml_collections.ConfigDict(d), SCHEMA)


@pytest.mark.parametrize("backend", ["local", "local-bwrap", "local-plain", "docker",
                                     "http://sandbox-1:8765", "https://a:1, https://b:2"])
def test_sandbox_backends_that_validate(backend):
    assert sandbox_backend_problem(backend) is None
    validate_config(ml_collections.ConfigDict({
        "experiment": "x", "seed": 0,
        "tasks": {"backend": backend, "allow_plain_sandbox": "never", "allow_network": False}}),
        {**BASE_SCHEMA, **SANDBOX_SCHEMA})


@pytest.mark.parametrize("backend, fragment", [
    ("bogus", "not a known sandbox backend"),
    ("Local", "not a known sandbox backend"),
    ("http://", "not a known sandbox backend"),
    ("http://a:1,bogus", "not http(s):// URLs: 'bogus'"),
    ("http://a:1,", "not http(s):// URLs: ''"),
])
def test_a_bad_sandbox_backend_is_named_with_the_valid_values(backend, fragment):
    cfg = ml_collections.ConfigDict({"experiment": "x", "seed": 0, "tasks": {
        "backend": backend, "allow_plain_sandbox": "never", "allow_network": False}})
    with pytest.raises(ConfigError) as e:
        validate_config(cfg, {**BASE_SCHEMA, **SANDBOX_SCHEMA})
    msg = str(e.value)
    assert msg.startswith(f"config.tasks.backend = {backend!r} is not allowed: ")
    assert fragment in msg
    assert "'local', 'local-bwrap', 'local-plain', 'docker', an http(s):// URL" in msg


def test_every_schema_with_a_backend_shares_one_definition():
    for name in registry.EXPERIMENTS:
        schema = registry.get_experiment(name).SCHEMA
        if "tasks.backend" in schema:
            for key, field in SANDBOX_SCHEMA.items():
                assert schema[key] == field, (name, key)
    assert EPISODE_SCHEMA["tasks.allow_plain_sandbox"].choices == ("never", "builtin", "always")


def test_unknown_experiment():
    with pytest.raises(ConfigError, match="not a registered experiment; choose one of"):
        registry.get_experiment("nope")


CONFIG_FILES = sorted(f for f in os.listdir(os.path.join(ROOT, "configs"))
                      if f.endswith(".py") and not f.startswith("_"))


@pytest.mark.parametrize("filename", CONFIG_FILES)
def test_every_config_file_validates(filename):
    path = os.path.join(ROOT, "configs", filename)
    spec = importlib.util.spec_from_file_location(f"configs_{filename[:-3]}", path)
    config_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(config_module)
    config = config_module.get_config()
    validate_config(config, registry.get_experiment(config.experiment).SCHEMA)


def _run(*args, timeout=120):
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "experiments", "run.py"), *args],
        capture_output=True, text=True, timeout=timeout, cwd=ROOT,
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["--config=configs/does_not_exist.py"], "could not load the config file"),
        (["--config=configs/credit_diagnostic.py", "--config.no_such=1"],
         "a config override names a field the config file does not define"),
        (["--config=configs/credit_diagnostic.py", "--config.num_turns=abc"],
         "flag --config.num_turns=abc"),
        (["--config=configs/credit_diagnostic.py", "--config.gamma_turn=2.0"],
         "config.gamma_turn = 2.0 is out of range; expected float, in [0.0, 1.0]"),
        (["--config=configs/credit_diagnostic.py", "--config.dtype=float16"],
         "config.dtype = 'float16' is not allowed"),
        ([], "--config is required"),
        (["--config=configs/rpr2_spr.py", "--config.tasks.backend=bogus"],
         "config.tasks.backend = 'bogus' is not allowed"),
        (["--config=configs/evaluate.py", "--config.tasks.backend=ftp://x"],
         "config.tasks.backend = 'ftp://x' is not allowed"),
        (["--config=configs/credit_diagnostic.py", "--progress=sometimes"],
         "flag --progress=sometimes"),
    ],
)
def test_run_py_bad_input_is_one_line(args, message):
    proc = _run(*args)
    assert proc.returncode == 2, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("override, readable", [
    ("--config.sed=1", "'sed' in --config.sed=1; did you mean --config.seed=1?"),
    ("--config.tasks.bakend=x", "'bakend' in --config.tasks.bakend=x; did you mean "
     "--config.tasks.backend=x?"),
    ("--config.taks.backend=x", "'taks' in --config.taks.backend=x; did you mean "
     "--config.tasks.backend=x?"),
    ("--config.zzz=1", "'zzz' in --config.zzz=1"),
])
def test_a_misspelled_override_reads_as_text(override, readable):
    proc = _run("--config=configs/rpr2_spr.py", override)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        f"error: a config override names a field the config file does not define: {readable}"]
    for raw in ("\\n", "\\'", '\\"', "KeyError", "Traceback"):  # no repr() leaking through
        assert raw not in proc.stderr


def test_unknown_override_message_without_a_hint_or_a_name():
    from terminal_rsi.config.configuration import unknown_override_message

    e = AttributeError(KeyError("'no_such'"))
    assert unknown_override_message(e, ["--config.no_such=1", "--config.seed=2"]) == (
        "a config override names a field the config file does not define: 'no_such' in "
        "--config.no_such=1")
    e = AttributeError("Attribute <class 'int'>.x does not exist")
    assert unknown_override_message(e, ["--config.seed.x=1"]) == (
        "a config override names a field the config file does not define (Attribute <class "
        "'int'>.x does not exist); overrides given: --config.seed.x=1")


def test_run_py_runs_the_diagnostic(tmp_path):
    proc = _run("--config=configs/credit_diagnostic.py", f"--workdir={tmp_path}",
                "--config.methods=('scan',)", "--config.seeds=(42,)", timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "zeroed trace" in proc.stdout
    assert (tmp_path / "credit_diagnostic.json").exists()


def test_the_pipeline_passes_the_sandbox_settings_to_every_stage(tmp_path):
    from configs.rpr2_spr import get_config
    from terminal_rsi.pipeline.config import SCHEMA, resolved
    from terminal_rsi.pipeline.runner import Pipeline

    c = get_config()
    assert c.tasks.backend == "local" and c.tasks.allow_plain_sandbox == "builtin"  # README's job
    c.scale = "test"
    c.tasks.backend, c.tasks.allow_plain_sandbox = "local-bwrap", "never"
    validate_config(c, SCHEMA)
    p = Pipeline(resolved(c), str(tmp_path))
    p.resolve_all()
    for cfg in [p.stage_config(n) for n in p.order] + [p.eval_base_config()]:
        assert (cfg.tasks.backend, cfg.tasks.allow_plain_sandbox) == ("local-bwrap", "never")
