"""Fixtures for tests/rewards."""

import pytest
from rewards_testutil import DATA, run_pytest_ctrf


@pytest.fixture(scope="session")
def real_report(tmp_path_factory):
    """The verifier suite (data/verifier_suite.py) run through pytest + pytest-json-ctrf."""
    work = tmp_path_factory.mktemp("ctrf_real")
    (work / "pytest.ini").write_text("[pytest]\n")
    return run_pytest_ctrf(work, DATA / "verifier_suite.py")
