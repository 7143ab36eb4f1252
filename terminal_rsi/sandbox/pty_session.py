"""A terminal session over a pseudo-terminal, for sandboxes whose image has no tmux.

The backend starts ``bash --noprofile --norc -i`` on a pty inside the sandbox (for
Docker: an exec with a tty) with `terminal.shell_env` in its environment, and hands
:class:`PtySession` the raw byte stream of the pty's master side (a tty stream is not
multiplexed: stdout and stderr arrive as one). Everything else is
`terminal.StreamSession`'s: the prompt markers, ``wait``, ``read``, ``run``.

Keystrokes follow the same rules as the tmux session: a string that is exactly a tmux key
name presses that key (`key_bytes` gives the bytes a terminal sends for it), anything else
is typed byte for byte with each newline pressed as Enter (a carriage return, as keyboards
send; the tty turns it into a newline for a program reading lines). Key names are mapped
to what xterm-like terminals send (``TERM=screen`` in the shell): cursor keys in normal
mode, modified cursor and function keys with xterm's ``;m`` parameter.
"""

from __future__ import annotations

import re

from terminal_rsi.sandbox.errors import BadRequest, SandboxLost
from terminal_rsi.sandbox.terminal import (
    StreamSession,
    check_keystrokes,
    is_key_name,
)

ESC = b"\x1b"
# named keys without modifiers
_PLAIN = {
    "Enter": b"\r", "Escape": ESC, "Tab": b"\t", "BTab": ESC + b"[Z", "BSpace": b"\x7f",
    "Space": b" ",
}
# keys xterm sends as CSI <final> (unmodified) or CSI 1;<m> <final> (modified)
_CSI_LETTER = {"Up": "A", "Down": "B", "Right": "C", "Left": "D", "Home": "H", "End": "F"}
# SS3 keys: F1-F4 (modified: CSI 1;<m> <final>)
_SS3 = {"F1": "P", "F2": "Q", "F3": "R", "F4": "S"}
# keys xterm sends as CSI <n> ~ (modified: CSI <n>;<m> ~)
_TILDE = {
    "Insert": 2, "IC": 2, "Delete": 3, "DC": 3, "PageUp": 5, "PgUp": 5, "PPage": 5,
    "PageDown": 6, "PgDn": 6, "NPage": 6, "F5": 15, "F6": 17, "F7": 18, "F8": 19, "F9": 20,
    "F10": 21, "F11": 23, "F12": 24,
}
# the characters C-<char> maps beside letters (as terminals send them)
_CTRL_EXTRA = {"@": 0x00, " ": 0x00, "2": 0x00, "[": 0x1B, "\\": 0x1C, "]": 0x1D, "^": 0x1E,
               "_": 0x1F, "?": 0x7F, "/": 0x1F}
_MODS = re.compile(r"((?:[CMS]-)*)(.+)")


def _unmappable(name: str, why: str) -> BadRequest:
    return BadRequest(f"the key {name!r} cannot be sent to this terminal ({why}); this "
                      "session runs on a plain pty (the sandbox image has no tmux): send "
                      "the bytes themselves as text, or install tmux in the image")


def _char_key(name: str, char: str, ctrl: bool, meta: bool, shift: bool) -> bytes:
    """A single-character key with modifiers."""
    if shift:
        if not char.isalpha():
            raise _unmappable(name, "S- applies to letters and named keys only")
        char = char.upper()
    if ctrl:
        if char.isalpha():
            code = ord(char.upper()) & 0x1F
        elif char in _CTRL_EXTRA:
            code = _CTRL_EXTRA[char]
        else:
            raise _unmappable(name, f"no control character for {char!r}")
        data = bytes((code,))
    else:
        data = char.encode()
    return ESC + data if meta else data


def _named_key(name: str, key: str, ctrl: bool, meta: bool, shift: bool) -> bytes:
    """A named key (Enter, Up, F5 ...) with modifiers."""
    m = 1 + shift + 2 * meta + 4 * ctrl  # xterm's modifier parameter
    if key in _CSI_LETTER:
        return ESC + (f"[1;{m}" if m > 1 else "[").encode() + _CSI_LETTER[key].encode()
    if key in _SS3:
        return ESC + (f"[1;{m}" if m > 1 else "O").encode() + _SS3[key].encode()
    if key in _TILDE:
        return ESC + f"[{_TILDE[key]}{f';{m}' if m > 1 else ''}~".encode()
    if key in _PLAIN:
        if key == "Space" and ctrl and not shift:
            return ESC * meta + b"\x00"
        if key == "Tab" and shift and not ctrl:
            return ESC * meta + _PLAIN["BTab"]
        if ctrl or shift:
            raise _unmappable(name, f"no byte sequence for {key} with C- or S-")
        return ESC * meta + _PLAIN[key]
    raise _unmappable(name, "not a key name this terminal knows")


def key_bytes(name: str) -> bytes:
    """The bytes a terminal sends for the tmux key name ``name`` (``C-c`` -> ``\\x03``,
    ``Up`` -> ``ESC [ A``, ``M-x`` -> ``ESC x``, ``C-Left`` -> ``ESC [ 1 ; 5 D``).
    BadRequest for a key name without a byte sequence (``S-1``, ``C-Enter``)."""
    if not is_key_name(name):
        raise BadRequest(f"{name!r} is not a tmux key name (C-c, Up, M-x, F5, ...)")
    match = _MODS.fullmatch(name)
    mods, key = match[1], match[2]
    if not mods and len(key) == 1:  # is_key_name only takes one character with a modifier
        raise _unmappable(name, "a bare character is typed, not pressed")
    ctrl, meta, shift = "C-" in mods, "M-" in mods, "S-" in mods
    if len(key) == 1:
        return _char_key(name, key, ctrl, meta, shift)
    return _named_key(name, key, ctrl, meta, shift)


class PtySession(StreamSession):
    """A session whose channel is the master side of the shell's pty: keystrokes are
    written as the bytes a keyboard sends; the pty's output is the pane's output."""

    def send(self, keystrokes: str) -> None:
        check_keystrokes(keystrokes)
        if not self.alive:
            raise SandboxLost("the terminal session's shell has exited")
        if is_key_name(keystrokes):
            self._write(key_bytes(keystrokes))
            return
        self._write(keystrokes.encode().replace(b"\n", b"\r"))


__all__ = ["PtySession", "key_bytes"]
