"""Helpers for tests/rewards: real CTRF reports written by pytest-json-ctrf."""

from __future__ import annotations

import ast
import json
import os
import pathlib
import shutil
import subprocess
import sys

DATA = pathlib.Path(__file__).parent / "data"
LEGACY_REPORT = DATA / "legacy_pytest_json_ctrf_0.3.7.json"


def run_pytest_ctrf(workdir: pathlib.Path, test_source: pathlib.Path | str,
                    legacy: bool = False) -> tuple[int, dict, pathlib.Path]:
    """Run `python -m pytest --ctrf` on one test file in `workdir`; return
    (exit code, parsed report, report path). The report is written by the real plugin, or
    with legacy=True by data/legacy_ctrf_emitter.py (the pytest-json-ctrf 0.3.x shape)."""
    workdir.mkdir(parents=True, exist_ok=True)
    target = workdir / "test_verifier.py"
    if isinstance(test_source, pathlib.Path):
        shutil.copy(test_source, target)
    else:
        target.write_text(test_source)
    report = workdir / "ctrf" / ("legacy.json" if legacy else "report.json")
    report.parent.mkdir(exist_ok=True)
    flags = ["-p", "legacy_ctrf_emitter", "--legacy-ctrf"] if legacy else ["--ctrf"]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(DATA), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-W", "ignore::pytest.PytestUnknownMarkWarning", "--rootdir", str(workdir),
         "-c", str(workdir / "pytest.ini"), str(target), *flags, str(report)],
        cwd=workdir, capture_output=True, text=True, timeout=120, env=env,
    )
    assert report.exists(), f"pytest-json-ctrf wrote no report:\n{proc.stdout}\n{proc.stderr}"
    return proc.returncode, json.loads(report.read_text()), report


def expected_statuses() -> dict[str, tuple[str, bool]]:
    """EXPECTED from data/verifier_suite.py, read without importing the suite."""
    tree = ast.parse((DATA / "verifier_suite.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and node.targets[0].id == "EXPECTED":
            return ast.literal_eval(node.value)
    raise AssertionError("EXPECTED not found in verifier_suite.py")
