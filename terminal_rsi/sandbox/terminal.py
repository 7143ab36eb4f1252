"""A terminal session per sandbox: tmux, driven in control mode, as Terminal-Bench uses it.

    with open_sandbox(spec, backend="local") as sb:
        term = sb.open_session()
        term.run("cd sub; export X=1\\n", timeout=5)      # typed literally; \\n is Enter
        out = term.run("python3 -m http.server 8000 &\\n", timeout=2)
        sb.exec("curl -s localhost:8000")                 # exec sees what the session left
        term.run("sleep 100\\n", timeout=0.5).done        # False: still running
        term.run("C-c", timeout=2)                        # a tmux key name is pressed

One interactive ``bash`` runs in a tmux pane for the life of the session, so ``cd``,
``export``, functions, an activated virtualenv and background jobs persist between
commands and turns, and an interactive program (a REPL, a y/n prompt, ``less``) reads what
is typed next. The backend starts one tmux *control-mode* client inside the sandbox
(`TMUX_ARGV`) and hands this module a byte pipe to it (:class:`Channel`); the client is the
session's lifeline (when it ends, the backend ends everything the session started).

Operations (all backends alike, including the HTTP bridge, which forwards them):

``send(keystrokes)``
    Terminus semantics: a string that is exactly a tmux key name (``C-c``, ``C-d``, ``Up``,
    ``Escape``, ``Enter``, ``M-x``, ``F5`` ...) presses that key; anything else is typed
    literally, byte for byte (``send-keys -H``), with each newline pressed as Enter. Nothing
    is appended: text without a trailing newline is typed but not run.
``wait(timeout, prompts=n)``
    Until the shell has shown ``n`` more prompts (the command is done), or, with ``n=0``,
    until the output has been quiet for ``settle_s``; at most ``timeout`` seconds. A
    command still running at the timeout keeps running.
``read()``
    The output that arrived since the last read (the pane's byte stream as tmux forwards
    it, not a screen scrape: scrollback is never lost), with escape sequences removed and
    carriage returns applied, head and tail kept within ``max_output_bytes``.
``run(keystrokes, timeout)``
    ``send`` + ``wait`` (for as many prompts as Enter presses) + ``read``: a
    :class:`SessionOutput` saying whether the command finished.

Completion (prompts that cannot be forged). The driver must not take the agent's word that a
command finished: RSR keeps a turn by its ``done`` and ``exit_code``. So a printed prompt is
only a doorbell, and what counts is read where the agent's processes cannot write:

- **The shell's claim.** At each prompt the shell's ``PROMPT_COMMAND`` (`shell_env`) numbers
  the prompt and writes the *claim* ``<pid>.<n>.<status>`` (hex: its own pid, its prompt
  number, ``$?``) to ``/proc/self/comm``; ``PS1`` ends in the invisible doorbell ``ESC ]
  7770 ; ; <claim> BEL`` (the hook appends it again when a ``.bashrc`` or the agent resets
  ``PS1``). The kernel lets only a process itself write its ``comm`` (another process, of
  any uid, gets EINVAL), and a forked subshell inherits its parent's, whose pid is not its
  own. Nothing in the shell is secret, so there is no token to steal: ``env``, ``set`` and
  ``$PS1`` show the hook and the doorbell, and replaying them proves nothing.
- **The session's own pane.** tmux tags output with its pane (``%output %<id>``): only the
  pane the session started in (its id learned at start) is read and rings, and keys go to
  that pane, so a window or pane the agent opens (``tmux new-window``) neither rings nor
  takes the keys.
- **Read out of band.** After a doorbell the driver reads the pane's foreground process
  group (``tpgid`` in ``/proc/<pane pid>/stat``), and a prompt counts only when that
  group's leader runs the session's bash and its ``comm`` holds a claim with its own pid:
  a shell is in the foreground at (or just past) that prompt now. The local backends and a
  Docker engine on this host give the sandbox's ``/proc`` (``proc_root``): the driver reads
  it itself (a few file reads). Otherwise the newest claims rung are checked in the
  sandbox by a tmux ``if-shell`` (a ``/bin/sh`` the tmux server forks, 2-4 ms; its answer
  is in the command's reply, which pane output cannot fake, with a per-check nonce). The
  prompts count from the numbers (those a shell showed since its last checked claim: a
  redisplayed prompt adds none, a missed check is made up by the next) and ``exit_code``
  is the claim's status. A nested ``bash`` counts the same way (its own pid and numbers);
  a REPL, an editor or a running command is no shell in the foreground: not done.

So a doorbell printed by a running command, a background job, another pane or a replay of
the hook neither ends a wait nor sets ``exit_code``. What remains (docs/sandbox.md): the
agent can still make its *own* shell say what it wants, by driving it rather than by
printing: typed commands (rewrite ``PROMPT_COMMAND``, write a claim to ``/proc/self/comm``
then ``read -e``, run a bash with another hook: all in the transcript), or ptrace of the
shell (same uid, where no Yama or seccomp policy forbids it); an agent that is root in its
container can replace ``/bin/bash``; the in-sandbox check runs as the sandbox's user, so an
agent can subvert it through its tmux server's environment (``set-environment -g
LD_PRELOAD``) or, as root, by replacing ``/bin/sh`` (reading ``/proc`` from the driver has
neither gap); and the tmux client's pipes are reachable through ``/proc/<client>/fd``
(same uid), which only running the client as another uid closes. A shell whose hook is
removed only makes ``wait`` run to its timeout, as do prompts of a nested shell that exits
before its check (``bash\\nexit\\n`` typed at once: not done, conservatively). A session
without tmux (`pty_session.PtySession`) reads no ``/proc``: it counts doorbells that carry
its token, which is readable in its ``PS1``.
"""

from __future__ import annotations

import abc
import collections
import dataclasses
import functools
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from terminal_rsi.sandbox.base import MAX_COMMAND_BYTES, MiB, OutputCap, check_text
from terminal_rsi.sandbox.errors import BadRequest, SandboxLost

SESSION_NAME = "trsi"
WIDTH, HEIGHT = 200, 50
SETTLE_S = 0.15
MAX_WAIT_S = 24 * 3600.0
_OSC_ID = b"7770"
# tmux key names a whole keystrokes string may be (anything else is typed literally)
_NAMED_KEYS = ("Enter", "Escape", "Tab", "BTab", "BSpace", "Space", "Up", "Down", "Left",
               "Right", "Home", "End", "PageUp", "PageDown", "PgUp", "PgDn", "NPage", "PPage",
               "Insert", "IC", "DC", "Delete")
_KEY_ALT = "|".join(_NAMED_KEYS) + "|F(?:[1-9]|1[0-2])"
_KEY_RE = re.compile(rf"(?:[CMS]-)+(?:[!-~]|{_KEY_ALT})|{_KEY_ALT}")
HEX_CHUNK = 2048  # bytes per send-keys command
SHELL = "/bin/bash"
PROMPT_WRAP = 0x100000  # a shell's prompt number wraps here (a claim fits comm's 15 bytes)
# a claim: pid (pid_max <= 2**22), prompt number, $? (hex); also the shell's comm
_CLAIM_RE = re.compile(rb"([0-9a-f]{1,6})\.([0-9a-f]{1,5})\.([0-9a-f]{1,2})")
MAX_PENDING_CLAIMS = 64  # doorbells waiting for a check in the sandbox (a flood drops old)


def is_key_name(keystrokes: str) -> bool:
    """True when ``keystrokes`` is exactly one tmux key name (``C-c``, ``Up``, ``M-x``...)."""
    return bool(_KEY_RE.fullmatch(keystrokes))


def expected_prompts(keystrokes: str) -> int:
    """Prompts the shell shows once ``keystrokes`` are handled: one per Enter (a newline or
    the Enter / C-m / C-j key) and one for C-c (a new prompt); 0 for other keys."""
    if is_key_name(keystrokes):
        return int(keystrokes in ("Enter", "C-m", "C-j", "C-c"))
    return keystrokes.count("\n")


def session_keystrokes(command: str) -> str:
    """A shell command as typed to run it in a session: a key name as it is, other text
    with a trailing newline (added when it has none)."""
    return command if is_key_name(command) or command.endswith("\n") else command + "\n"


def _doorbell(token: str) -> str:
    """The end of ``PS1``: the invisible OSC doorbell with the prompt's claim (\\[ \\]: zero
    width; it closes the prompt, so the prompt's text is in the output when it rings)."""
    return "\\[\\033]" + _OSC_ID.decode() + f";{token};" + "${__trsi_claim}\\007\\]"


def _prompt_hook(token: str) -> str:
    """``PROMPT_COMMAND``: number the prompt, write the claim to this process's own comm
    (see the module doc), and put the doorbell back at the end of ``PS1`` when something
    (a ``.bashrc``, a nested shell's defaults) replaced it. No fork; ``$?`` and ``$_`` are
    unchanged for the next command (bash restores them after the hook)."""
    return ("__trsi_rc=$? __trsi_n=$(((__trsi_n+1)%" + hex(PROMPT_WRAP) + ")); "
            'printf -v __trsi_claim %x.%x.%x $$ "$__trsi_n" "$__trsi_rc"; '
            'printf %s "$__trsi_claim" 2>/dev/null >/proc/self/comm; '
            f"[[ $PS1 == *']{_OSC_ID.decode()};'* ]] || PS1+='{_doorbell(token)}'")


def shell_env(token: str = "") -> dict[str, str]:
    """The session shell's own variables: a plain prompt that rings the doorbell, the hook
    that makes each prompt's claim, no history file, and ``IGNOREEOF`` so a stray C-d at
    the prompt does not end the shell. ``token``: only for a session without tmux, which
    has no other way to tell its doorbell (a tmux session's shell gets none: nothing in it
    is secret, see the module doc)."""
    return {
        "PS1": "\\w\\$ " + _doorbell(token),
        "PROMPT_COMMAND": _prompt_hook(token),
        "HISTFILE": "/dev/null",
        "IGNOREEOF": "10",
        "TERM": "screen",  # a pty shell's (under tmux its default-terminal, tmux-256color)
    }


def tmux_argv(socket_path: str, tmux: str = "tmux", env: Mapping[str, str] | None = None,
              width: int = WIDTH, height: int = HEIGHT) -> list[str]:
    """The control-mode client that starts the session's server and shell (the argv a
    backend runs in the sandbox with a pipe on stdin and stdout)."""
    argv = [tmux, "-C", "-f", "/dev/null", "-S", socket_path, "new-session", "-s",
            SESSION_NAME, "-x", str(width), "-y", str(height)]
    for k, v in (env or {}).items():
        argv += ["-e", f"{k}={v}"]
    return argv + ["--", SHELL, "--noprofile", "--norc", "-i"]


# ---------------------------------------------------------------------------- output text

_OSC = re.compile(r"\x1b\][^\x07\x1b]*(?:\x07|\x1b\\|$)")
_CSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
_ESC = re.compile(r"\x1b(?:[()*+][0-9A-Za-z]|[ -/]*[0-~]|$)")
_CTRL = re.compile(r"[\x00-\x07\x0b\x0c\x0e-\x1f\x7f]")


def _overlay(line: str) -> str:
    """A line with carriage returns applied: each segment overwrites the start of the line
    (in place: linear in the line, whatever the agent prints)."""
    out: list[str] = []
    for seg in line.split("\r"):
        if len(seg) >= len(out):
            out = list(seg)
        else:
            out[:len(seg)] = seg
    return "".join(out)


def _backspace(line: str) -> str:
    out: list[str] = []
    for c in line:
        if c == "\b":
            if out:
                out.pop()
        else:
            out.append(c)
    return "".join(out)


def terminal_text(raw: str) -> str:
    """What a reader of the terminal sees in ``raw`` pane output: escape sequences
    removed, CR LF as a newline, a lone CR overwriting its line, backspaces applied, other
    control characters dropped (newline and tab kept)."""
    text = _ESC.sub("", _CSI.sub("", _OSC.sub("", raw)))
    text = text.replace("\r\n", "\n")
    lines = []
    for line in text.split("\n"):
        if "\b" in line:
            line = _backspace(line)
        if "\r" in line:
            line = _overlay(line)
        lines.append(_CTRL.sub("", line))
    return "\n".join(lines)


# tmux control mode writes bytes below 32 and the backslash as ``\\ooo`` (a literal backslash
# is always escaped, so these are all escapes; the backslash's goes last)
_ESCAPES = tuple((b"\\%03o" % c, bytes((c,))) for c in (*range(32), 92))


def _unescape(data: bytes) -> bytes:
    """The pane's bytes of a ``%output`` line."""
    if b"\\" not in data:
        return data
    for esc, byte in _ESCAPES:
        data = data.replace(esc, byte)
    return data


# ---------------------------------------------------------------------------- session


@dataclasses.dataclass(frozen=True)
class Claim:
    """What a doorbell says: shell ``pid`` shows its prompt number ``n`` after a command
    that exited with ``status``; ``text`` as the shell wrote it (``<pid>.<n>.<status>``,
    hex)."""

    pid: int
    n: int
    status: int
    text: str


def parse_claim(raw: bytes) -> Claim | None:
    """The claim in a doorbell's bytes (agent-reachable text: None unless well formed)."""
    m = _CLAIM_RE.fullmatch(raw)
    if m is None:
        return None
    pid, n, status = (int(g, 16) for g in m.groups())
    return Claim(pid, n, status, raw.decode()) if pid > 0 else None


class Channel(abc.ABC):
    """A byte pipe to the session's tmux control client in the sandbox (backend-made)."""

    @abc.abstractmethod
    def write(self, data: bytes) -> None:
        """Send bytes to the client's stdin; OSError when it is gone."""

    @abc.abstractmethod
    def read(self) -> bytes:
        """Block for the next bytes of the client's stdout; b"" at its end."""

    @abc.abstractmethod
    def close(self) -> None:
        """End the client and everything the session started (idempotent)."""


@dataclasses.dataclass(frozen=True)
class SessionOutput:
    """What a reader of the terminal got.

    text: new output since the previous read (see `terminal_text`), head and tail kept.
    done: the shell showed every prompt waited for (the command finished).
    exit_code: ``$?`` of the last command, from the last prompt whose claim held (module
      doc; None: none yet).
    truncated: output was cut to the cap. alive: the shell still runs.
    duration_s: seconds waited.
    """

    text: str
    done: bool
    exit_code: int | None = None
    truncated: bool = False
    alive: bool = True
    duration_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> SessionOutput:
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls)})


class TerminalSession(abc.ABC):
    """The operations every backend's session offers (see the module doc)."""

    max_output_bytes: int

    @abc.abstractmethod
    def send(self, keystrokes: str) -> None:
        """Type ``keystrokes`` (or press it, when it is a tmux key name)."""

    @abc.abstractmethod
    def wait(self, timeout: float, prompts: int = 0, settle_s: float = SETTLE_S) -> bool:
        """Wait for ``prompts`` more prompts (0: for quiet output); True if they came."""

    @abc.abstractmethod
    def read(self) -> SessionOutput:
        """The output that is new since the last read."""

    @abc.abstractmethod
    def run(self, keystrokes: str, timeout: float) -> SessionOutput:
        """Send, wait until done or ``timeout``, read."""

    @property
    @abc.abstractmethod
    def alive(self) -> bool:
        """The session's shell is still running."""

    @abc.abstractmethod
    def close(self) -> None:
        """End the session and every process it started (idempotent)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def check_keystrokes(keystrokes: Any) -> str:
    return check_text(keystrokes, "keystrokes", MAX_COMMAND_BYTES)


def check_wait(timeout: Any, what: str = "timeout") -> float:
    if isinstance(timeout, bool) or not (isinstance(timeout, int | float)
                                         and 0 <= timeout <= MAX_WAIT_S):
        raise BadRequest(f"{what} must be a number of seconds in [0, {MAX_WAIT_S:g}], got "
                         f"{timeout!r}")
    return float(timeout)


class StreamSession(TerminalSession):
    """A session over a byte pipe: a reader thread, the prompt markers, the output window,
    ``wait`` / ``read`` / ``run``. Subclasses say how keystrokes are sent (`send`) and how
    the pipe's bytes become pane output (`_feed`).

    Args:
      channel: the pipe to the session's client in the sandbox.
      token: the doorbell token the shell was started with (`shell_env`; a pty session's,
        whose doorbells are its prompts: "" for tmux, whose doorbells are checked).
      max_output_bytes: cap on one read (head and tail kept).
      on_close: called once after the channel is closed (the backend's cleanup).
      start_timeout: seconds to wait for the first prompt.
    """

    def __init__(self, channel: Channel, token: str, max_output_bytes: int = 1 * MiB,
                 on_close: Callable[[], None] | None = None, start_timeout: float = 30.0):
        self.channel = channel
        self.max_output_bytes = max_output_bytes
        self._marker = b"\x1b]" + _OSC_ID + b";" + token.encode() + b";"
        self._on_close = on_close
        self._cond = threading.Condition()
        self._write_lock = threading.Lock()
        self._cap = OutputCap(max_output_bytes)
        self._carry = b""
        self._prompts = 0
        self._last_status: int | None = None
        self._last_output = time.monotonic()
        self._alive = True
        self._closed = False
        self._errors: list[str] = []
        self._last_claim = b""
        self._reader = threading.Thread(target=self._read_loop, daemon=True,
                                        name="trsi-session-reader")
        self._reader.start()
        try:
            self._begin()
        except SandboxLost as e:
            self._errors.append(str(e))
            started = False
        else:
            with self._cond:  # the first prompt ever (the reader may have counted it)
                started = self._wait(time.monotonic() + check_wait(start_timeout), 1,
                                     SETTLE_S)
        if not started:
            why = "; ".join(self._errors[-3:]) or "no prompt appeared"
            self.close()
            raise SandboxLost(f"the terminal session did not start within {start_timeout:g} s:"
                              f" {why}")
        self.read()  # the first prompt is not news

    def _begin(self) -> None:
        """Called once the reader runs, before the first prompt is awaited."""

    # -- the reader thread
    def _read_loop(self) -> None:
        try:
            while True:
                data = self.channel.read()
                if not data:
                    break
                self._feed(data)
        except OSError as e:
            self._errors.append(f"reading the session failed: {e}")
        finally:
            self._ended()

    def _feed(self, data: bytes) -> None:
        """Bytes from the channel; by default they are the pane's output."""
        self._output(data)

    def _ended(self) -> None:
        with self._cond:
            self._alive = False
            self._cond.notify_all()

    def _output(self, data: bytes) -> None:
        scan = self._carry + data
        claims = []
        start = 0
        while (i := scan.find(self._marker, start)) >= 0:
            end = scan.find(b"\x07", i)
            if end < 0:
                break
            claims.append(scan[i + len(self._marker):end])
            start = end + 1
        keep = len(self._marker) + 32  # a marker, the longest claim and its BEL
        j = scan.rfind(b"\x1b", max(start, len(scan) - keep))
        self._carry = scan[j:] if j >= 0 else b""  # a marker may go on in the next chunk
        with self._cond:
            self._cap.feed(data)
            self._last_output = time.monotonic()
            if claims:
                self._rang(claims)
            self._cond.notify_all()
        if claims:
            self._after_rang()

    def _rang(self, claims: list[bytes]) -> None:
        """Doorbells rang (called holding ``_cond``). Without an out-of-band check (a pty
        session) each is a prompt, but for a redisplayed one (the same claim again), and
        its status is ``exit_code``."""
        for raw in claims:
            if raw == self._last_claim:
                continue
            self._last_claim = raw
            claim = parse_claim(raw)
            self._prompts += 1
            self._last_status = claim.status if claim is not None else None

    def _after_rang(self) -> None:
        """Called on the reader thread after doorbells rang, not holding ``_cond``."""

    def _write(self, data: bytes) -> None:
        with self._cond:  # quiet is measured from the keys sent, too (their echo follows)
            self._last_output = time.monotonic()
        with self._write_lock:
            if self._closed:
                raise SandboxLost("the terminal session is closed")
            try:
                self.channel.write(data)
            except OSError as e:
                raise SandboxLost(f"the terminal session ended: {e}") from e

    # -- operations
    def wait(self, timeout: float, prompts: int = 0, settle_s: float = SETTLE_S) -> bool:
        with self._cond:
            return self._wait(time.monotonic() + check_wait(timeout),
                              self._prompts + prompts if prompts else None, settle_s)

    def _wait(self, deadline: float, target: int | None, settle_s: float) -> bool:
        """Until the prompt count reaches ``target`` (None: until the output is quiet for
        ``settle_s``), the shell ends, or ``deadline``. Called holding ``_cond``."""
        while True:
            now = time.monotonic()
            if target is not None and self._prompts >= target:
                return True
            if target is None and now - self._last_output >= settle_s:
                return True
            if not self._alive or now >= deadline:
                return False
            nap = deadline - now
            if target is None:
                nap = min(nap, self._last_output + settle_s - now)
            self._cond.wait(max(nap, 0.001))

    def read(self) -> SessionOutput:
        with self._cond:
            cap, self._cap = self._cap, OutputCap(self.max_output_bytes)
            status, alive = self._last_status, self._alive
        head = bytes(cap.head)
        tail = bytes(cap.tail[-cap.tail_limit:]) if cap.tail_limit else b""
        kept = len(head) + len(tail)
        if cap.total > kept:
            text = (terminal_text(head.decode(errors="replace"))
                    + f"\n...[{cap.total - kept} bytes truncated]...\n"
                    + terminal_text(tail.decode(errors="replace")))
        else:
            text = terminal_text((head + tail).decode(errors="replace"))
        return SessionOutput(text=text, done=True, exit_code=status,
                             truncated=cap.total > kept, alive=alive)

    def run(self, keystrokes: str, timeout: float) -> SessionOutput:
        deadline = time.monotonic() + check_wait(timeout)
        n = expected_prompts(check_keystrokes(keystrokes))
        t0 = time.monotonic()
        with self._cond:  # counted before sending: a fast prompt must not be missed
            target = self._prompts + n if n else None
        self.send(keystrokes)
        with self._cond:
            done = self._wait(deadline, target, SETTLE_S)
        out = self.read()
        return dataclasses.replace(out, done=done and out.alive,
                                   duration_s=time.monotonic() - t0)

    @property
    def alive(self) -> bool:
        return self._alive and not self._closed

    def close(self) -> None:
        with self._write_lock:
            if self._closed:
                return
            self._closed = True
        try:
            self.channel.close()
        finally:
            self._reader.join(timeout=5.0)
            if self._on_close is not None:
                self._on_close()


def _check_command(pane_pid: int, claim: Claim, nonce: str) -> str:
    """The tmux command that checks ``claim`` out of band (module doc): a ``/bin/sh`` the
    tmux server forks tests the pane's foreground process group, that process's binary and
    its comm; the reply's branch says yes only with ``nonce``. (tmux expands formats in the
    shell command: ``####`` is ``##``.)"""
    pid = claim.pid
    test = (f'IFS=" "; read -r s </proc/{pane_pid}/stat && s=${{s####*) }} && set -- $s && '
            f'[ "$6" = {pid} ] && read -r c </proc/{pid}/comm && [ "$c" = {claim.text} ] && '
            f"[ /proc/{pid}/exe -ef {SHELL} ]")
    return (f"if-shell '{test}' 'display-message -p trsi-yes-{nonce}' "
            "'display-message -p trsi-no'")


def _read_at(dir_fd: int, path: str) -> bytes:
    """The first 4 KiB of a file below ``dir_fd`` (a /proc file: one read)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dir_fd)
    try:
        return os.read(fd, 4096)
    finally:
        os.close(fd)


Reply = Callable[[list[bytes], bool], None]  # a command's reply: its lines, and not %error


class TmuxSession(StreamSession):
    """A session driven through a tmux control-mode client (`tmux_argv`) at the far end
    of the channel: keys go in as ``send-keys`` commands to the session's pane, its output
    comes back as ``%output`` notifications, and each doorbell is checked out of band before
    a prompt counts (module doc). Every command this client sends gets one reply block
    (``%begin`` ... ``%end`` / ``%error`` with flags 1), in order; blocks with flags 0 (hooks
    the agent may set) are skipped.

    Args: as `StreamSession`; ``token`` is accepted for the backends' common call and
    should be "" (a tmux session's shell needs none). ``proc_root``: a directory through
    which this process can read the sandbox's ``/proc`` itself (the local backends: the
    sandbox's root, ``/proc/<pid inside>/root``, or ``/``), so a check costs a few file
    reads here instead of a process in the sandbox; None (Docker), or when it cannot be
    read: checks run in the sandbox through tmux.
    """

    def __init__(self, channel: Channel, token: str = "", max_output_bytes: int = 1 * MiB,
                 on_close: Callable[[], None] | None = None, start_timeout: float = 30.0,
                 proc_root: str | None = None):
        self._proc_root = proc_root
        self._root_fd: int | None = None  # proc_root, opened at the first check
        self._shell_exe: tuple[int, int] | None = None  # (dev, inode) of the session's bash
        self._line_buf = b""
        self._block: list[bytes] | None = None  # the reply block being read
        self._block_id = b""  # its "<time> <number> <flags>", which its end line repeats
        self._replies: collections.deque[Reply] = collections.deque()
        self._pane = b""  # the session's pane (b"%0") and its shell's pid, learned at start
        self._pane_pid = 0
        self._rung = False  # a doorbell rang since the last check
        self._pending: dict[bytes, Claim] = {}  # claims to check in the sandbox, newest last
        self._checking = False  # a check is in flight (one at a time)
        self._shown: dict[int, int] = {}  # shell pid -> its prompt number last checked
        super().__init__(channel, token, max_output_bytes, on_close, start_timeout)

    # -- the control protocol (reader thread)
    def _feed(self, data: bytes) -> None:
        *lines, self._line_buf = (self._line_buf + data).split(b"\n")
        for line in lines:
            if self._block is not None:
                self._block_line(line)
            elif line.startswith(b"%output "):
                pane, _, out = line[8:].partition(b" ")
                if not self._pane or pane == self._pane:  # another pane's output is not ours
                    self._output(_unescape(out))
            elif line.startswith(b"%begin "):
                self._block, self._block_id = [], line[7:]
            elif line.startswith(b"%exit"):
                self._ended()
            elif line and not line.startswith(b"%"):
                self._error(line)

    def _block_line(self, line: bytes) -> None:
        """A line inside a reply block: its content, or its end (the same id: content the
        agent's hooks print cannot end a block early without guessing it)."""
        if line not in (b"%end " + self._block_id, b"%error " + self._block_id):
            if len(self._block) < 64:
                self._block.append(line)
            return
        lines, ok, ours = self._block, line.startswith(b"%end "), self._block_id.endswith(b" 1")
        self._block = None
        if not ours:
            return
        if not ok:
            for e in lines:
                self._error(e)
        if self._replies:
            self._replies.popleft()(lines, ok)

    def _error(self, line: bytes) -> None:
        self._errors[:] = [*self._errors[-4:], line.decode(errors="replace")]

    def _command(self, command: str, *replies: Reply) -> None:
        """Send one tmux command; ``replies`` take its reply block and those of the commands
        it inserts (``if-shell``'s branch), in order."""
        with self._write_lock:
            if self._closed:
                raise SandboxLost("the terminal session is closed")
            self._replies.extend(replies)
            try:
                self.channel.write(command.encode() + b"\n")
            except OSError as e:
                raise SandboxLost(f"the terminal session ended: {e}") from e

    @staticmethod
    def _ignore(lines: list[bytes], ok: bool) -> None:
        """A reply with nothing to use (an error's lines are kept by `_block_line`)."""

    # -- start: the session's pane
    def _begin(self) -> None:
        self._command(f"display-message -p -t {SESSION_NAME} '#{{pane_id}} #{{pane_pid}}'",
                      self._on_pane)

    def _on_pane(self, lines: list[bytes], ok: bool) -> None:
        pane, _, pid = (lines[0] if ok and lines else b"").partition(b" ")
        if not (pane.startswith(b"%") and pid.isdigit()):
            self._error(b"tmux did not name the session's pane: " + b" | ".join(lines))
            return
        with self._cond:
            self._pane, self._pane_pid = pane, int(pid)
        self._check()

    # -- doorbells and their checks
    def _rang(self, claims: list[bytes]) -> None:
        self._rung = True
        for raw in claims:
            claim = parse_claim(raw)
            if claim is not None and self._shown.get(claim.pid) != claim.n:
                self._pending.pop(raw, None)
                self._pending[raw] = claim
                if len(self._pending) > MAX_PENDING_CLAIMS:
                    del self._pending[next(iter(self._pending))]

    def _after_rang(self) -> None:
        self._check()

    def _check(self) -> None:
        """After doorbells: read the truth here (`_truth_here`), or check the newest
        pending claim in the sandbox (its answer checks the next); one check at a time,
        none before the pane is known."""
        while True:
            with self._cond:
                if self._checking or not self._pane_pid:
                    return
                here = self._proc_root is not None
                if here and not self._rung:
                    return
                claim = None
                if not here:
                    if not self._pending:
                        return
                    claim = self._pending.popitem()[1]
                    if self._shown.get(claim.pid) == claim.n:
                        continue  # checked meanwhile
                self._rung, self._checking = False, True
            if not here:
                self._check_in_sandbox(claim)
                return
            truth = self._truth_here()
            if truth is None and self._shell_exe is None:
                self._drop_root()  # it does not show the session's shell: check in the sandbox
                continue
            with self._cond:
                self._pending.clear()
            self._settle(truth)

    def _check_in_sandbox(self, claim: Claim) -> None:
        nonce = secrets.token_hex(8)
        try:
            self._command(_check_command(self._pane_pid, claim, nonce), self._checked_shell,
                          functools.partial(self._checked, claim, b"trsi-yes-" + nonce.encode()))
        except SandboxLost:
            with self._cond:
                self._checking = False

    def _checked_shell(self, lines: list[bytes], ok: bool) -> None:
        """``if-shell``'s own reply; when it failed no branch follows (its reply is void)."""
        if not ok and self._replies:
            self._replies.popleft()([], False)

    def _checked(self, claim: Claim, yes: bytes, lines: list[bytes], ok: bool) -> None:
        self._settle(claim if ok and lines == [yes] else None)
        self._check()

    def _drop_root(self) -> None:
        """Stop reading ``proc_root`` (checks run in the sandbox from now on)."""
        with self._cond:
            fd, self._root_fd, self._proc_root = self._root_fd, None, None
            self._checking = False
        if fd is not None:
            os.close(fd)

    def _truth_here(self) -> Claim | None:
        """The same facts as `_check_command`, read from here, without a claim to test: the
        pane's foreground process group, and the claim in its leader's comm when it is the
        leader's own (its pid) and the leader runs the session's bash. A doorbell only
        says when to look, so a flood of forged ones cannot hide the real one. The first
        one read must be the session's bash at its first prompt (else None, and the caller
        stops reading here: ``proc_root`` is not this sandbox's)."""
        try:
            if self._root_fd is None:
                self._root_fd = os.open(self._proc_root, os.O_PATH | os.O_DIRECTORY)
            stat = _read_at(self._root_fd, f"proc/{self._pane_pid}/stat")
            fg = int(stat[stat.rindex(b")") + 2:].split()[5])
            claim = parse_claim(_read_at(self._root_fd, f"proc/{fg}/comm").rstrip(b"\n"))
            if claim is None or claim.pid != fg:
                return None
            exe = os.stat(f"proc/{fg}/exe", dir_fd=self._root_fd)
        except (OSError, ValueError, IndexError):
            return None
        if self._shell_exe is None and fg == self._pane_pid:
            # the first prompt (nothing typed yet): the session's own bash, whose binary
            # every later claim's process must run
            self._shell_exe = (exe.st_dev, exe.st_ino)
        return claim if (exe.st_dev, exe.st_ino) == self._shell_exe else None

    def _settle(self, claim: Claim | None) -> None:
        """A check's answer: a claim that held (else None). The prompts its shell showed
        since its last checked claim count, and its status is ``exit_code``."""
        with self._cond:
            self._checking = False
            if claim is not None:
                before = self._shown.get(claim.pid, 0)
                self._shown[claim.pid] = claim.n
                # a lower number: that pid runs a new shell (exec bash) or the count wrapped
                self._prompts += claim.n - before if claim.n >= before else claim.n
                self._last_status = claim.status
            self._cond.notify_all()

    def close(self) -> None:
        super().close()
        fd, self._root_fd = self._root_fd, None
        if fd is not None:
            os.close(fd)

    # -- keys
    def send(self, keystrokes: str) -> None:
        check_keystrokes(keystrokes)
        if not self.alive:
            raise SandboxLost("the terminal session's shell has exited")
        target = self._pane.decode()
        if is_key_name(keystrokes):
            self._keys(f"send-keys -t {target} {keystrokes}")
            return
        data = keystrokes.encode().replace(b"\n", b"\r")  # Enter sends CR, as keyboards do
        for i in range(0, len(data), HEX_CHUNK):
            hexes = " ".join(f"{b:02x}" for b in data[i:i + HEX_CHUNK])
            self._keys(f"send-keys -t {target} -H {hexes}")

    def _keys(self, command: str) -> None:
        with self._cond:  # quiet is measured from the keys sent, too (their echo follows)
            self._last_output = time.monotonic()
        self._command(command, self._ignore)


def new_token() -> str:
    return secrets.token_hex(8)


__all__ = ["Channel", "Claim", "SessionOutput", "StreamSession", "TerminalSession",
           "TmuxSession", "expected_prompts", "is_key_name", "new_token", "parse_claim",
           "session_keystrokes", "shell_env", "terminal_text", "tmux_argv"]
