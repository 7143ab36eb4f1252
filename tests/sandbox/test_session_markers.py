"""Prompt markers that cannot be forged (issue 49): a terminal session counts a prompt, and
takes its ``exit_code``, only when the shell's claim holds out of band (module doc of
`terminal_rsi.sandbox.terminal`). Hostile tests type the forging keystrokes through
``term.run`` as a scripted agent would, on every backend; the tmux control protocol's edge
cases are driven through a scripted channel (no tmux needed)."""

from __future__ import annotations

import queue
import re
import shutil
import time

import pytest

from terminal_rsi.sandbox.errors import SandboxLost
from terminal_rsi.sandbox.terminal import (
    Channel,
    TmuxSession,
    parse_claim,
    shell_env,
)

from .conftest import BOUND_S, SPEC, need

# the exact doorbell the shell's next prompt rings (status 0), made by replaying the
# shell's own hook and PS1 in a subshell ($$ there is the shell's pid): nothing is secret
REPLAY = '(true; eval "$PROMPT_COMMAND"; printf %s "${PS1@P}")'
# forge [status] [ahead]: the doorbell of the prompt `ahead` (default 1) prompts from now
FORGE = ("forge() { printf '\\e]7770;;%x.%x.%x\\a' $$ $(((__trsi_n+${2:-1})%0x100000)) "
         "${1:-0}; }\n")
# a forger that reads the shell's current claim from its comm and rings the next prompt's
# and the current one's with status 0, every 10 ms, from the background or another pane
FORGER = b"""p=$1
while :; do
  IFS=. read -r _ n _ < /proc/$p/comm
  printf '\\e]7770;;%x.%x.0\\a' "$p" $(( (16#$n + 1) % 0x100000 ))
  printf '\\e]7770;;%x.%x.0\\a' "$p" $(( 16#$n ))
  echo other-pane-says-hi
  sleep 0.01
done
"""


@pytest.fixture(autouse=True)
def _tmux():
    need(shutil.which("tmux") is not None, "tmux (apt-get install tmux)")


@pytest.fixture
def term_of(make_sandbox):
    """(sandbox, session) on the parametrized backend, with `forge` defined."""
    sb = make_sandbox(SPEC)
    term = sb.open_session()
    assert term.run(FORGE, 10).done
    yield sb, term
    term.close()


def _until(term, text: str) -> bool:
    """Read until ``text`` shows (True) or BOUND_S passes (a REPL starting on a busy host)."""
    deadline = time.monotonic() + BOUND_S
    seen = ""
    while text not in seen and time.monotonic() < deadline:
        term.wait(0.5)
        seen += term.read().text
    return text in seen


# ---------------------------------------------------------------- hostile, every backend


def test_a_doorbell_from_a_running_command_does_not_end_the_wait(term_of):
    _, term = term_of
    assert term.run("false\n", 10).exit_code == 1
    for forged in (REPLAY, "forge 0", "forge 0; forge 0 2; forge 0 3"):
        out = term.run(f"{forged}; sleep 3; (exit 5)\n", 1)
        assert not out.done and out.alive, forged
        assert out.exit_code in (1, 5), forged  # the last real status, never the forged 0
        assert term.wait(BOUND_S, prompts=1), forged  # the real prompt still counts
        assert term.read().exit_code == 5


def test_a_forged_status_is_not_the_exit_code(term_of):
    _, term = term_of
    for forged in (REPLAY, "forge 0", "forge 0; forge 0 2"):
        out = term.run(f"{forged}; false\n", BOUND_S)
        assert out.done and out.exit_code == 1, forged
        out = term.run(f"{forged}; (exit 7)\n", BOUND_S)
        assert out.done and out.exit_code == 7, forged
    # a command still running after a replayed prompt is not done at the timeout
    out = term.run(f"{REPLAY}; sleep 5\n", 1)
    assert not out.done
    assert term.run("C-c", BOUND_S).exit_code == 130


def test_a_background_forger_changes_nothing(term_of):
    sb, term = term_of
    sb.put_files({"forger.sh": FORGER})
    assert term.run("bash forger.sh $$ >/dev/tty 2>&1 &\n", BOUND_S).done
    for _ in range(3):
        out = term.run("false\n", BOUND_S)
        assert out.done and out.exit_code == 1
        out = term.run("sleep 1.5\n", 0.5)
        assert not out.done
        assert term.wait(BOUND_S, prompts=1) and term.read().exit_code == 0
        out = term.run("(exit 3)\n", BOUND_S)
        assert out.done and out.exit_code == 3
    assert term.run("kill %1; wait\n", BOUND_S).done


def test_another_pane_neither_rings_nor_takes_the_keys(term_of):
    sb, term = term_of
    sb.put_files({"forger.sh": FORGER})
    # the agent's own tmux window (it becomes the current one) runs the forger
    assert term.run('tmux new-window "bash forger.sh $$"\n', BOUND_S).done
    out = term.run("sleep 2\n", 0.7)
    assert not out.done and "other-pane-says-hi" not in out.text
    assert term.wait(BOUND_S, prompts=1)
    out = term.run("echo typed-here; false\n", BOUND_S)  # keys still go to the session's pane
    assert out.done and out.exit_code == 1 and "\ntyped-here\n" in out.text
    assert "other-pane-says-hi" not in out.text
    assert term.run("tmux kill-window -t :1\n", BOUND_S).done


def test_nothing_in_the_shell_is_a_secret(term_of):
    """No token in the environment, ``set`` or ``PS1``: the doorbell and its hook are
    public (a replay is `REPLAY`, refused above), and only the shell writes its claim."""
    _, term = term_of
    out = term.run('env; set; echo "PS1=$PS1"\n', BOUND_S)
    assert out.done and "PROMPT_COMMAND=" in out.text and "7770;;${__trsi_claim}" in out.text
    marker = getattr(term, "_marker", None)  # a bridge client has none (its server does)
    assert marker in (None, b"\x1b]7770;;")
    # another process (here a child of the shell) cannot write the shell's comm
    out = term.run("sh -c 'printf 1.1.0 > /proc/$PPID/comm'; cat /proc/$$/comm\n", BOUND_S)
    claim = out.text.strip().splitlines()[-2]
    assert parse_claim(claim.encode()) is not None, out.text


# ---------------------------------------------------------------- completion still exact


def test_commands_nested_shells_repls_and_keys_complete_as_before(term_of):
    _, term = term_of
    for cmd, code in (("true", 0), ("false", 1), ("(exit 7)", 7), ("true\nfalse", 1),
                      ("echo $?", 0)):
        out = term.run(cmd + "\n", BOUND_S)
        assert out.done and out.exit_code == code, cmd
    assert term.run("false\n", BOUND_S).exit_code == 1
    assert "\n1\n" in term.run("echo $?\n", BOUND_S).text  # $? survives the prompt hook
    # a nested bash (its rc files may replace PS1: the hook rings the doorbell again)
    out = term.run("bash\n", BOUND_S)
    assert out.done and out.exit_code == 0
    assert term.run("false\n", BOUND_S).exit_code == 1
    out = term.run("exit 3\n", BOUND_S)
    assert out.done and out.exit_code == 3
    # a REPL is no shell prompt; leaving it is
    out = term.run("python3\n", 1)
    assert not out.done and (">>> " in out.text or _until(term, ">>> "))
    assert term.run("exit()\n", BOUND_S).done
    # C-c, a PS1 the agent replaces, a redisplayed prompt (C-l) that is no new prompt
    assert not term.run("sleep 100\n", 0.3).done
    assert term.run("C-c", BOUND_S).exit_code == 130
    assert term.run("PS1='$ '\n", BOUND_S).done
    out = term.run("false\n", BOUND_S)
    assert out.done and out.exit_code == 1 and "$ " in out.text
    term.send("C-l")
    assert not term.wait(0.5, prompts=1)
    assert term.run("true\n", BOUND_S).exit_code == 0


def test_checks_in_the_sandbox_refuse_forgeries_too(make_sandbox, monkeypatch):
    """The tmux ``if-shell`` check (where this process cannot read the sandbox's /proc:
    a remote Docker engine; forced here) refuses what the direct /proc check refuses."""
    if make_sandbox.backend == "bridge-local":
        pytest.skip("the bridge's sessions live in its server process")
    sent = []
    monkeypatch.setattr(TmuxSession, "_truth_here", lambda self: None)  # no /proc here
    real = TmuxSession._check_in_sandbox
    monkeypatch.setattr(TmuxSession, "_check_in_sandbox",
                        lambda self, claim: sent.append(claim) or real(self, claim))
    sb = make_sandbox(SPEC)
    term = sb.open_session()
    assert term.run(FORGE, 10).done
    assert not term.run(f"{REPLAY}; sleep 3\n", 1).done
    assert term.wait(BOUND_S, prompts=1)
    out = term.run("forge 0; false\n", BOUND_S)
    assert out.done and out.exit_code == 1
    out = term.run("bash\n", BOUND_S)
    assert out.done and term.run("exit 4\n", BOUND_S).exit_code == 4
    assert sent  # the checks ran in the sandbox
    term.close()


# ---------------------------------------------------------------- the control protocol

PANE_PID = 0x64


def _bell(claim: str) -> bytes:
    """A prompt and its doorbell as tmux control mode writes them (ESC, BEL escaped)."""
    return b"~$ \\033]7770;;" + claim.encode() + b"\\007"


class FakeTmux(Channel):
    """A scripted tmux control client: it answers the driver's commands (the pane, empty
    ``send-keys`` replies, ``if-shell`` checks against `fg` and `comm`: the shell's state)
    and, on each keys command, runs the next step of `script` (pane output, a shell that
    moves on, hooks' blocks)."""

    def __init__(self):
        self.lines: queue.Queue[bytes] = queue.Queue()
        self.number = 0
        self.fg, self.comm = PANE_PID, "64.1.0"
        self.script: list = []
        self.block(flags=0)  # new-session's own reply
        self.output(b"%0", _bell(self.comm))

    def inject(self, line: bytes) -> None:
        self.lines.put(line + b"\n")

    def output(self, pane: bytes, data: bytes) -> None:
        self.inject(b"%output " + pane + b" " + data)

    def shell(self, claim: str) -> None:
        """The shell (pid in ``claim``) reaches a prompt and writes its claim."""
        self.fg, self.comm = int(claim.split(".")[0], 16), claim

    def block(self, *content: bytes, flags: int = 1, end: bytes = b"%end ") -> None:
        self.number += 1
        ident = b"1700000000 %d %d" % (self.number, flags)
        for line in (b"%begin " + ident, *content, end + ident):
            self.inject(line)

    def write(self, data: bytes) -> None:
        for cmd in data.decode().splitlines():
            if cmd.startswith("display-message -p -t trsi"):
                self.block(b"%%0 %d" % PANE_PID)
            elif cmd.startswith("if-shell"):
                claim = re.search(r'\[ "\$c" = ([0-9a-f.]+) \]', cmd)[1]
                pid = int(re.search(r'\[ "\$6" = (\d+) \]', cmd)[1])
                nonce = re.search(r"trsi-yes-([0-9a-f]+)", cmd)[1]
                held = pid == self.fg and claim == self.comm
                self.block()
                self.block(b"trsi-yes-" + nonce.encode() if held else b"trsi-no")
            elif cmd.startswith("send-keys"):
                self.block()
                if self.script:
                    self.script.pop(0)()
            else:
                raise AssertionError(f"unexpected tmux command {cmd!r}")

    def read(self) -> bytes:
        return self.lines.get()

    def close(self) -> None:
        self.lines.put(b"")


@pytest.mark.parametrize("root", ["none", "not-the-sandbox"])
def test_protocol_pane_filter_hook_blocks_and_numbers(root, tmp_path):
    """Checks in the sandbox (``if-shell``): also what a session does whose ``proc_root``
    does not show its shell (it stops reading there)."""
    fake = FakeTmux()
    term = TmuxSession(fake, start_timeout=5, proc_root=None if root == "none" else str(tmp_path))
    assert term.read().exit_code == 0
    hook = (b"%end 1700000000 999 0", b"%begin 1700000000 5 1", b"trsi-yes-00",
            b"%end 1700000000 5 1", b"%output %0 " + _bell("64.2.0"))
    fake.script = [
        # another pane's doorbell is not the session's, even when its claim holds
        lambda: (fake.shell("64.2.0"), fake.output(b"%1", _bell("64.2.0"))),
        # a hook's block (flags 0) with a fake end line, reply and output: skipped whole
        lambda: fake.block(*hook, flags=0),
        # the session's pane, but a claim that does not hold (the shell says status 1)
        lambda: (fake.shell("64.3.1"), fake.output(b"%0", _bell("64.3.0"))),
        # the claim that holds counts from the last checked number: 64.1 -> 64.3 is two
        lambda: fake.output(b"%0", _bell("64.3.1")),
        lambda: (fake.shell("64.4.0"), fake.output(b"%0", b"out\\015\\012" + _bell("64.4.0"))),
        # a nested shell is checked with its own pid and numbers
        lambda: (fake.shell("c8.1.0"), fake.output(b"%0", _bell("c8.1.0"))),
        # a redisplayed prompt (C-l) is no new prompt
        lambda: fake.output(b"%0", _bell("c8.1.0")),
        lambda: (fake.shell("64.5.2"), fake.output(b"%0", _bell("64.5.2"))),
    ]
    for keys in ("a\n", "b\n", "c\n"):
        out = term.run(keys, 0.3)
        assert not out.done and out.exit_code == 0, keys
    out = term.run("d\ne\n", 5)
    assert out.done and out.exit_code == 1
    out = term.run("true\n", 5)
    assert out.done and out.exit_code == 0 and out.text == "out\n~$ "
    assert term.run("bash\n", 5).done
    n = term._prompts
    term.send("C-l")
    assert not term.wait(0.3, prompts=1) and term._prompts == n
    out = term.run("exit 2\n", 5)
    assert out.done and out.exit_code == 2
    assert not fake.script
    term.close()


def test_protocol_a_failed_start_is_typed():
    class Dead(FakeTmux):
        def write(self, data):
            raise OSError("broken pipe")

    with pytest.raises(SandboxLost, match="did not start"):
        TmuxSession(Dead(), start_timeout=5)


def test_protocol_a_failed_check_is_no_prompt():
    """An ``if-shell`` that fails (no fork: the sandbox's pids are used up) gets no
    branch: the check says no, and the replies that follow stay in step."""
    class NoFork(FakeTmux):
        def __init__(self, failures: int, then: str = ""):
            self.failures, self.then = failures, then
            super().__init__()

        def write(self, data):
            if not (data.startswith(b"if-shell") and self.failures):
                return super().write(data)
            self.failures -= 1
            self.block(b"fork failed", end=b"%error ")
            if self.then:  # the shell shows another prompt (its doorbell rings again)
                self.shell(self.then)
                self.output(b"%0", _bell(self.then))

    with pytest.raises(SandboxLost, match="fork failed"):  # the first prompt never held
        TmuxSession(NoFork(1), start_timeout=1)
    fake = NoFork(1, then="64.2.0")
    term = TmuxSession(fake, start_timeout=5)
    fake.script = [lambda: (fake.shell("64.3.1"), fake.output(b"%0", _bell("64.3.1")))]
    assert term.run("false\n", 5).exit_code == 1
    term.close()


def test_claims_and_the_shell_env():
    assert parse_claim(b"1f.a.ff") == parse_claim(b"1f.a.ff")
    c = parse_claim(b"1f.a.ff")
    assert (c.pid, c.n, c.status, c.text) == (31, 10, 255, "1f.a.ff")
    for bad in (b"", b"0.1.0", b"1f.a", b"1f.a.100", b"1F.a.0", b"1f.a.0;rm", b"x.1.0",
                b"1234567.1.0"):
        assert parse_claim(bad) is None, bad
    env = shell_env()
    assert "7770;;" in env["PS1"] and "/proc/self/comm" in env["PROMPT_COMMAND"]
    assert "7770;tok;" in shell_env("tok")["PS1"]  # a pty session's doorbell has its token


def test_close_ends_the_reader():
    term = TmuxSession(FakeTmux(), start_timeout=5)
    term.close()
    assert not term._reader.is_alive() and not term.alive
