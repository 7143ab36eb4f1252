"""Contract C1: experiments/run.py writes <workdir>/config.json (atomically) before run()."""

import json
import os
import types

from terminal_rsi.config import registry
from terminal_rsi.experiments import run as run_module

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _load_run_module():
    return run_module  # the command line of experiments/run.py and `terminal-rsi`


def test_config_json_is_written_before_run(tmp_path, monkeypatch):
    run_py = _load_run_module()
    real = registry.get_experiment("credit_diagnostic")
    seen = {}

    def probe_run(config, workdir):
        # what the experiment sees when it starts: the file is already there
        with open(os.path.join(workdir, "config.json")) as f:
            seen["file"] = json.load(f)
        seen["config"] = {"experiment": "credit_diagnostic", **config.to_dict()}  # typed

    probe = types.SimpleNamespace(SCHEMA=real.SCHEMA, check=real.check, run=probe_run)
    monkeypatch.setattr(registry, "get_experiment", lambda name: probe)
    workdir = tmp_path / "w"
    run_py.parse_flags(["run.py", f"--config={ROOT}/configs/credit_diagnostic.py",
                         f"--workdir={workdir}"])
    run_py.main(["run.py"])
    assert seen["file"]["experiment"] == "credit_diagnostic"
    expected = json.loads(json.dumps(seen["config"]))  # tuples -> lists
    assert seen["file"] == expected
    assert sorted(os.listdir(workdir)) == ["config.json"]  # no temp file left behind


def test_write_config_replaces_atomically(tmp_path):
    from configs.rpr_phase import get_config

    run_py = _load_run_module()
    c = get_config()
    path = run_py.write_config(c, str(tmp_path))
    c.seed = 7
    run_py.write_config(c, str(tmp_path))
    with open(path) as f:
        d = json.load(f)
    assert d["seed"] == 7 and d["tasks"]["families"] == list(c.tasks.families)
    assert os.listdir(tmp_path) == ["config.json"]


def test_console_flags_quiet_library_logging_and_set_the_progress_mode(monkeypatch):
    from absl import flags, logging

    from terminal_rsi.runtime import progress

    run_py = _load_run_module()
    monkeypatch.setenv(progress.ENV, "auto")  # restored afterwards
    config = f"--config={ROOT}/configs/credit_diagnostic.py"
    try:
        run_py.parse_flags(["run.py", config, "--progress=never"])
        assert logging.get_verbosity() == logging.WARNING  # absl's app.run would say INFO
        assert os.environ[progress.ENV] == "never"
        flags.FLAGS["verbosity"].unparse()
        run_py.parse_flags(["run.py", config, "--verbosity=0"])
        assert logging.get_verbosity() == logging.INFO  # asked for: kept
    finally:  # flag values outlive the call in this process
        flags.FLAGS["verbosity"].unparse()
        flags.FLAGS["progress"].unparse()
