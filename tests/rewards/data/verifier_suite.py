"""A verifier test suite run by tests/rewards/test_ctrf_real.py with pytest-json-ctrf.

Not collected by the project's own test run (its name does not start with test_).
Expected per-test statuses are in EXPECTED below; 14 checks, 3 of them hygiene checks.
"""

import pytest

# name -> (CTRF status, hygiene?) as pytest-json-ctrf 0.6.x reports them
EXPECTED = {
    "test_output_file_exists": ("passed", False),
    "test_output_matches": ("failed", False),
    "test_skipped": ("skipped", False),
    "test_xfail": ("skipped", False),  # xfail -> skipped, rawStatus "xfailed"
    "test_xpass": ("passed", False),  # non-strict xpass -> passed
    "test_param[1]": ("passed", False),
    "test_param[2]": ("failed", False),
    "test_param[3]": ("passed", False),
    "test_setup_error": ("failed", False),  # error in setup -> failed, rawStatus setup_failed
    "test_teardown_error": ("failed", False),  # passed call, error in teardown -> failed
    "test_raises_exception": ("failed", False),
    "test_marked_hygiene": ("passed", True),  # @pytest.mark.hygiene -> tag "hygiene"
    "test_tests_dir_untouched": ("passed", True),  # name pattern
    "test_no_stray_processes": ("failed", True),  # name pattern
}


@pytest.fixture
def broken_setup():
    raise RuntimeError("fixture setup exploded")


@pytest.fixture
def broken_teardown():
    yield 1
    raise RuntimeError("fixture teardown exploded")


def test_output_file_exists():
    assert True


def test_output_matches():
    assert 1 + 1 == 3


@pytest.mark.skip(reason="not applicable")
def test_skipped():
    pass


@pytest.mark.xfail(reason="known bug")
def test_xfail():
    assert 1 == 2


@pytest.mark.xfail(reason="fixed upstream")
def test_xpass():
    assert 1 == 1


@pytest.mark.parametrize("n", [1, 2, 3])
def test_param(n):
    assert n != 2


def test_setup_error(broken_setup):
    pass


def test_teardown_error(broken_teardown):
    assert broken_teardown == 1


def test_raises_exception():
    raise ValueError("boom")


@pytest.mark.hygiene
def test_marked_hygiene():
    pass


def test_tests_dir_untouched():
    pass


def test_no_stray_processes():
    assert "sleep 1000" == ""
