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

Completion is seen through the shell's prompt: ``PS1`` ends in an invisible OSC sequence
with a per-session token and ``$?``. A program that resets ``PS1`` only makes ``wait`` run
to its timeout.
"""

from __future__ import annotations

import abc
import dataclasses
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


def shell_env(token: str) -> dict[str, str]:
    """The session shell's own variables: a plain prompt that reports completion, no
    history file, and ``IGNOREEOF`` so a stray C-d at the prompt does not end the shell."""
    return {
        # the marker closes the prompt (\[ \]: zero width), so the prompt's text is in
        # the output by the time it is seen; $? is the last command's status
        "PS1": "\\w\\$ \\[\\033]" + _OSC_ID.decode() + f";{token};$?\\007\\]",
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
    return argv + ["--", "/bin/bash", "--noprofile", "--norc", "-i"]


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
    exit_code: ``$?`` of the last command the shell reported at a prompt (None: none yet).
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
      token: the prompt token the shell was started with (`shell_env`).
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
        self._reader = threading.Thread(target=self._read_loop, daemon=True,
                                        name="trsi-session-reader")
        self._reader.start()
        with self._cond:  # the first prompt ever (the reader may have counted it already)
            started = self._wait(time.monotonic() + check_wait(start_timeout), 1, SETTLE_S)
        if not started:
            why = "; ".join(self._errors[-3:]) or "no prompt appeared"
            self.close()
            raise SandboxLost(f"the terminal session did not start within {start_timeout:g} s:"
                              f" {why}")
        self.read()  # the first prompt is not news

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
        found = []
        start = 0
        while (i := scan.find(self._marker, start)) >= 0:
            end = scan.find(b"\x07", i)
            if end < 0:
                break
            status = scan[i + len(self._marker):end]
            found.append(int(status) if status.isdigit() else None)
            start = end + 1
        keep = len(self._marker) + 8
        j = scan.rfind(b"\x1b", max(start, len(scan) - keep))
        self._carry = scan[j:] if j >= 0 else b""  # a marker may go on in the next chunk
        with self._cond:
            self._cap.feed(data)
            self._last_output = time.monotonic()
            if found:
                self._prompts += len(found)
                self._last_status = found[-1]
            self._cond.notify_all()

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


class TmuxSession(StreamSession):
    """A session driven through a tmux control-mode client (`tmux_argv`) at the far end
    of the channel: keys go in as ``send-keys`` commands, pane output comes back as
    ``%output`` notifications."""

    def __init__(self, *args, **kwargs):
        self._line_buf = b""
        super().__init__(*args, **kwargs)

    def _feed(self, data: bytes) -> None:
        *lines, self._line_buf = (self._line_buf + data).split(b"\n")
        for line in lines:
            if line.startswith(b"%output "):
                self._output(_unescape((line.split(b" ", 2) + [b""])[2]))
            elif line.startswith(b"%exit"):
                self._ended()
            elif line and not line.startswith(b"%"):  # a failed command's message
                self._errors[:] = [*self._errors[-4:], line.decode(errors="replace")]

    def send(self, keystrokes: str) -> None:
        check_keystrokes(keystrokes)
        if not self.alive:
            raise SandboxLost("the terminal session's shell has exited")
        if is_key_name(keystrokes):
            self._write(f"send-keys -t {SESSION_NAME} {keystrokes}\n".encode())
            return
        data = keystrokes.encode().replace(b"\n", b"\r")  # Enter sends CR, as keyboards do
        for i in range(0, len(data), HEX_CHUNK):
            hexes = " ".join(f"{b:02x}" for b in data[i:i + HEX_CHUNK])
            self._write(f"send-keys -t {SESSION_NAME} -H {hexes}\n".encode())


def new_token() -> str:
    return secrets.token_hex(8)


__all__ = ["Channel", "SessionOutput", "StreamSession", "TerminalSession", "TmuxSession",
           "expected_prompts", "is_key_name", "new_token", "session_keystrokes", "shell_env",
           "terminal_text", "tmux_argv"]
