"""One real run dir (episodes through the harness, TB-GAE credit, a C5 ledger) and its
report, built once per session and shared read-only by the report tests."""

import pytest

from terminal_rsi.report import build_report

from .fixture_run import build_run


@pytest.fixture(scope="session")
def real_run(tmp_path_factory):
    return build_run(tmp_path_factory.mktemp("report") / "run")


@pytest.fixture(scope="session")
def built_report(real_run):
    return build_report(real_run["run"])
