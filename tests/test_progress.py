"""terminal_rsi.runtime.progress: bars on stderr only when it is a terminal (or forced), rate and
ETA shown, console lines printed above them."""

import io
import sys

import pytest

from terminal_rsi.runtime import progress as pg


class _Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture
def stderr(monkeypatch):
    monkeypatch.delenv(pg.ENV, raising=False)

    def use(stream):
        monkeypatch.setattr(sys, "stderr", stream)
        return stream

    return use


def _drive(bar, n=3):
    for _ in range(n):
        bar.update()
    bar.refresh()
    bar.close()


def test_hidden_when_stderr_is_not_a_terminal(stderr):
    err = stderr(io.StringIO())
    bar = pg.progress(total=3, desc="sft", unit="step")
    assert bar.disable
    _drive(bar)
    assert err.getvalue() == ""


def test_shown_on_a_terminal_with_rate_and_eta(stderr):
    err = stderr(_Terminal())
    bar = pg.progress(total=3, desc="sft", unit="step")
    assert not bar.disable
    _drive(bar)
    text = err.getvalue()
    assert "sft" in text and "3/3" in text and "step/s" in text and "<" in text  # rate, ETA


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_forced_on_when_stderr_is_not_a_terminal(stderr, monkeypatch, how):
    err = stderr(io.StringIO())
    if how == "environment":
        monkeypatch.setenv(pg.ENV, "always")
        bar = pg.progress(total=3, desc="rollout", unit="ep")
    else:
        bar = pg.progress(total=3, desc="rollout", unit="ep", force=True)
    assert not bar.disable
    _drive(bar)
    assert "rollout" in err.getvalue() and "3/3" in err.getvalue()


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_forced_off_on_a_terminal(stderr, monkeypatch, how):
    err = stderr(_Terminal())
    if how == "environment":
        monkeypatch.setenv(pg.ENV, "never")
        bar = pg.progress(total=3)
    else:
        bar = pg.progress(total=3, force=False)
    assert bar.disable
    _drive(bar)
    assert err.getvalue() == ""


def test_a_bad_environment_value_is_named(stderr, monkeypatch):
    stderr(io.StringIO())
    monkeypatch.setenv(pg.ENV, "sometimes")
    with pytest.raises(ValueError, match="TERMINAL_RSI_PROGRESS='sometimes'; expected one of"):
        pg.progress(total=1)


def test_echo_prints_whole_lines_to_stdout(stderr, capsys):
    stderr(io.StringIO())
    with pg.progress(total=2) as bar:
        pg.echo("[stage] step 1/2")
        bar.update()
    pg.echo("[stage] done", file=sys.stderr)
    assert capsys.readouterr().out == "[stage] step 1/2\n"
    assert sys.stderr.getvalue() == "[stage] done\n"
