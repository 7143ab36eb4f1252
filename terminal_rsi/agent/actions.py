"""Structured JSON actions and observation formatting (paper §3.1, Appendix A). The JSON
schema below is the default action format; `terminal_rsi.agent.formats` adds Terminus XML
and a fenced bash block, built from the same `Action` and bounds.

Action schema (one JSON object per assistant turn)::

    {
      "analysis": "what I see and what I will do",          # string, optional
      "plan": "the next steps",                              # string, optional (Terminus)
      "commands": [                                          # list, optional (default [])
        {"keystrokes": "ls -la", "timeout": 10},             # "cmd"/"command" are aliases
        ...
      ],
      "task_complete": false                                 # bool, optional (default false)
    }

Each command is a shell command run with `bash -c` in the sandbox workspace (one fresh
process per command: working-directory changes and shell variables do not carry over
between commands; files do). `timeout` is in seconds (default `DEFAULT_COMMAND_TIMEOUT_S`,
clipped by the harness to its per-command maximum and the episode's remaining wall-clock
budget). The JSON object may be wrapped in prose or a ```json fence: the first decodable
JSON object in the text is the action.

A text that does not hold a valid action raises `ActionParseError`; the harness turns its
message into the turn's observation (the turn counts, the episode goes on). `parse_action`
raises nothing else, whatever the text: the reply is at most `MAX_ACTION_CHARS` characters,
JSON nesting deeper than `MAX_JSON_DEPTH` is refused before the decoder recurses into it, at
most `MAX_JSON_STARTS` candidate objects are tried, an action holds at most `MAX_COMMANDS`
commands of at most `MAX_KEYSTROKES_BYTES` bytes each (valid Unicode text without NUL, which
no process can receive), and a timeout is a finite positive number (larger ones are clipped
to `MAX_COMMAND_TIMEOUT_S`; the harness clips further).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Sequence
from typing import Any

from terminal_rsi.sandbox.base import text_problem
from terminal_rsi.sandbox.terminal import SessionOutput

DEFAULT_COMMAND_TIMEOUT_S = 30.0
COMMAND_KEYS = ("keystrokes", "cmd", "command")
ACTION_KEYS = ("analysis", "plan", "commands", "task_complete")

# Bounds on one reply (see the module doc). An action nests 3 levels (object, commands list,
# command object): MAX_JSON_DEPTH leaves room for prose braces around it.
MAX_ACTION_CHARS = 1 << 20
MAX_JSON_DEPTH = 16
MAX_JSON_STARTS = 64
MAX_COMMANDS = 64
MAX_KEYSTROKES_BYTES = 64 << 10
MAX_COMMAND_TIMEOUT_S = 24 * 3600.0

# a JSON string, or the rest of the text if it is unterminated (so a scan is linear)
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.|\\\Z)*+(?:"|\Z)', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")

SCHEMA_TEXT = (
    'Reply with exactly one JSON object: {"analysis": "<your reasoning>", "commands": '
    '[{"keystrokes": "<shell command>", "timeout": <seconds>}], "task_complete": <true|false>}. '
    "Each command runs with `bash -c` in the task's working directory (a fresh shell per "
    "command). Set task_complete to true when the task is done; the commands of that turn "
    "still run first."
)
# the same schema for a harness that types into a persistent terminal (Terminus semantics)
SESSION_SCHEMA_TEXT = (
    'Reply with exactly one JSON object: {"analysis": "<your reasoning>", "commands": '
    '[{"keystrokes": "<keys>", "timeout": <seconds>}], "task_complete": <true|false>}. '
    "Keystrokes are typed into one interactive bash terminal that lasts the whole task "
    "(cd, export and background jobs carry over): end a command with \\n to run it; a key "
    "name alone (C-c, C-d, Up, Escape, Tab) presses that key. timeout is the longest to wait "
    "for the command to finish; one still running then keeps running (press C-c to stop "
    "it). Set task_complete to true when the task is done; the commands of that turn still "
    "run first."
)


class ActionParseError(ValueError):
    """The model's output holds no valid action; the message says what is wrong and the
    expected schema (it becomes the turn's observation)."""


@dataclasses.dataclass(frozen=True)
class Command:
    keystrokes: str
    timeout: float = DEFAULT_COMMAND_TIMEOUT_S


@dataclasses.dataclass(frozen=True)
class RejectedCommand:
    """In place of an `ExecResult`: the sandbox refused to run the command (`BadRequest`:
    too long, a NUL, ...); `format_observation` shows the reason to the agent."""

    reason: str


@dataclasses.dataclass(frozen=True)
class Action:
    """One reply's action, whatever format it came in (`terminal_rsi.agent.formats`).
    analysis and plan are free text (Terminus's fields; the harness runs only commands)."""

    analysis: str = ""
    commands: tuple[Command, ...] = ()
    task_complete: bool = False
    plan: str = ""

    def to_json(self) -> str:
        """The action in the JSON schema (`plan` only when set)."""
        obj: dict[str, Any] = {"analysis": self.analysis}
        if self.plan:
            obj["plan"] = self.plan
        obj["commands"] = [{"keystrokes": c.keystrokes, "timeout": c.timeout}
                           for c in self.commands]
        obj["task_complete"] = self.task_complete
        return json.dumps(obj)


def _show(value: Any, limit: int = 60) -> str:
    """A short repr of `value` for an error message."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        return "a number of more than 30 digits"
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _check_nesting(text: str) -> None:
    """Refuse a reply whose brackets (outside JSON strings) nest deeper than MAX_JSON_DEPTH,
    before the decoder recurses into them (a linear scan)."""
    brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text))
    depth = 0
    for c in brackets:
        if c in "[{":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                raise ActionParseError(f"the reply nests JSON arrays/objects deeper than "
                                       f"{MAX_JSON_DEPTH} levels. {SCHEMA_TEXT}")
        elif depth:
            depth -= 1


def _depth(obj: Any) -> int:
    """Nesting depth of a decoded JSON value (iterative)."""
    deepest, stack = 0, [(obj, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict | list):
            deepest = max(deepest, d)
            if d <= MAX_JSON_DEPTH:
                stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def _first_json_object(text: str) -> Any:
    """The first decodable JSON object that looks like an action (has an action field);
    failing that, the first decodable object (its fields are then reported as unknown)."""
    dec = json.JSONDecoder()
    start = text.find("{")
    first_err = None
    fallback = None
    tries = 0
    while start >= 0:
        tries += 1
        if tries > MAX_JSON_STARTS:
            break
        try:
            obj, _ = dec.raw_decode(text, start)
        except json.JSONDecodeError as e:
            first_err = first_err or f"{e.msg} at position {e.pos}"
        except RecursionError:  # backstop: _check_nesting comes first
            first_err = first_err or f"JSON nested deeper than {MAX_JSON_DEPTH} levels"
        except ValueError as e:  # e.g. an integer past Python's digit limit
            first_err = first_err or str(e)[:120]
        else:
            if isinstance(obj, dict):
                if _depth(obj) > MAX_JSON_DEPTH:
                    first_err = first_err or f"JSON nested deeper than {MAX_JSON_DEPTH} levels"
                elif set(obj) & set(ACTION_KEYS) or not obj:
                    return obj
                elif fallback is None:
                    fallback = obj
        start = text.find("{", start + 1)
    if first_err is not None:
        raise ActionParseError(f"no valid JSON action in the reply ({first_err}). {SCHEMA_TEXT}")
    if fallback is not None:
        return fallback
    if tries > MAX_JSON_STARTS:
        raise ActionParseError(f"no JSON action among the first {MAX_JSON_STARTS} '{{' of the "
                               f"reply. {SCHEMA_TEXT}")
    raise ActionParseError(f"the reply contains no JSON object. {SCHEMA_TEXT}")


def _command(i: int, c: Any) -> Command:
    if isinstance(c, str):
        keys, c = ["keystrokes"], {"keystrokes": c}
    elif not isinstance(c, dict):
        raise ActionParseError(f"commands[{i}] must be an object with \"keystrokes\" and "
                               f"\"timeout\", got {type(c).__name__}")
    else:
        keys = [k for k in COMMAND_KEYS if k in c]
    if len(keys) != 1 or not isinstance(c[keys[0]], str):
        raise ActionParseError(f'commands[{i}] needs exactly one string "keystrokes" '
                               f"field, got fields {sorted(c)[:10]}")
    return checked_command(f"commands[{i}].{keys[0]}", f"commands[{i}].timeout", c[keys[0]],
                           c.get("timeout", c.get("duration", DEFAULT_COMMAND_TIMEOUT_S)))


def checked_command(where: str, timeout_where: str, keystrokes: str, timeout: Any) -> Command:
    """A `Command` once its keystrokes and timeout are within the module doc's bounds (the
    timeout clipped to `MAX_COMMAND_TIMEOUT_S`); else ActionParseError naming `where` /
    `timeout_where` (how the reply's format calls the two fields). Every action format
    builds its commands with it."""
    problem = text_problem(keystrokes, MAX_KEYSTROKES_BYTES)
    if problem:
        raise ActionParseError(f"{where} {problem}")
    t = timeout
    if (isinstance(t, bool) or not isinstance(t, int | float)
            or isinstance(t, float) and not math.isfinite(t) or not t > 0):
        raise ActionParseError(f"{timeout_where} must be a positive, finite number of "
                               f"seconds, got {_show(t)}")
    return Command(keystrokes, float(min(t, MAX_COMMAND_TIMEOUT_S)))


def check_command_count(n: int) -> None:
    """ActionParseError when one reply holds more than `MAX_COMMANDS` commands."""
    if n > MAX_COMMANDS:
        raise ActionParseError(f"the reply holds {n} commands; an action may hold at most "
                               f"{MAX_COMMANDS} (send the rest in the next turn)")


def check_reply_text(text: Any, schema: str) -> None:
    """ActionParseError unless `text` is a string of at most `MAX_ACTION_CHARS` characters;
    `schema` (the format's instructions) ends the message."""
    if not isinstance(text, str):
        raise ActionParseError(f"the reply must be text, got {type(text).__name__}")
    if len(text) > MAX_ACTION_CHARS:
        raise ActionParseError(f"the reply is {len(text)} characters; an action may be at most "
                               f"{MAX_ACTION_CHARS}. {schema}")


def check_text_field(name: str, value: str) -> None:
    """ActionParseError when a free-text field holds a lone surrogate (not valid Unicode)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ActionParseError(f"{name} holds a lone surrogate (an escape like \\ud800 that "
                               "is not valid Unicode text)") from None


def parse_action(text: str) -> Action:
    """Parse the model's reply into an `Action` (see the module doc for the schema).

    Raises:
      ActionParseError (and nothing else, for any input): no JSON object, wrong field types,
      unknown fields, or a bound of the module doc exceeded.
    """
    check_reply_text(text, SCHEMA_TEXT)
    _check_nesting(text)
    obj = _first_json_object(text)
    unknown = sorted(set(obj) - set(ACTION_KEYS))
    if unknown:
        raise ActionParseError(f"unknown field(s) {[k[:40] for k in unknown[:10]]} in the "
                               f"action; allowed: {list(ACTION_KEYS)}. {SCHEMA_TEXT}")
    notes = {}
    for name in ("analysis", "plan"):
        value = obj.get(name, "")
        if not isinstance(value, str):
            raise ActionParseError(f'"{name}" must be a string, got {type(value).__name__}')
        check_text_field(f'"{name}"', value)
        notes[name] = value
    done = obj.get("task_complete", False)
    if not isinstance(done, bool):
        raise ActionParseError(f'"task_complete" must be true or false, got {_show(done)}')
    raw = obj.get("commands", [])
    if not isinstance(raw, list):
        raise ActionParseError(f'"commands" must be a list, got {type(raw).__name__}')
    check_command_count(len(raw))
    return Action(notes["analysis"], tuple(_command(i, c) for i, c in enumerate(raw)), done,
                  plan=notes["plan"])


def cap_text(text: str, max_chars: int) -> str:
    """Keep the head and the tail of `text` (at most `max_chars` characters plus a marker
    line saying how many characters were dropped)."""
    if max_chars <= 0:
        raise ValueError(f"max_chars must be > 0, got {max_chars}")
    if len(text) <= max_chars:
        return text
    head = max_chars - max_chars // 2
    tail = max_chars // 2
    dropped = len(text) - head - tail
    return (text[:head] + f"\n...[{dropped} characters truncated]...\n"
            + (text[-tail:] if tail else ""))


def format_observation(results: Sequence[tuple[Command, Any]], *, max_chars: int,
                       note: str = "") -> str:
    """Render command results as the observation text, capped head+tail.

    Per `ExecResult`: `$ <command>`, then stdout and stderr, then `[exit code N]` or
    `[timed out after T s]`; per terminal `SessionOutput`: the terminal's new output as it
    appeared (the typed command's echo and the prompt included), then
    `[still running after T s ...]` when it had not finished; for a `RejectedCommand`,
    `ERROR: command rejected: <reason>`. `note` (e.g. a parse error) comes first.
    """
    parts = [note] if note else []
    for cmd, r in results:
        if isinstance(r, RejectedCommand):
            shown = _printable(cmd.keystrokes, 200)
            parts.append(f"$ {shown}\nERROR: command rejected: {_printable(r.reason, 2000)}")
            continue
        if isinstance(r, SessionOutput):
            parts.append(session_block(cmd, r))
            continue
        block = [f"$ {cmd.keystrokes}"]
        if r.stdout:
            block.append(r.stdout.rstrip("\n"))
        if r.stderr:
            block.append(r.stderr.rstrip("\n"))
        block.append(f"[timed out after {cmd.timeout:g} s]" if r.timed_out
                     else f"[exit code {r.exit_code}]")
        parts.append("\n".join(block))
    if not parts:
        parts.append("(no commands were run)")
    return cap_text("\n".join(parts), max_chars)


def session_block(cmd: Command, out: SessionOutput) -> str:
    """One command's part of a terminal observation (see `format_observation`)."""
    text = out.text
    if not out.alive:
        text += ("\n[the terminal's shell exited; a new shell was started in the task's "
                 "directory: variables and jobs are gone]")
    elif not out.done:
        text += (f"\n[still running after {cmd.timeout:g} s; it keeps running: wait with "
                 "another command, or press C-c]")
    return text


def _printable(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, with NULs and lone surrogates made visible (a
    rejected command is echoed back; it may hold either)."""
    cut = text if len(text) <= limit else text[:limit] + f"...[{len(text) - limit} more]"
    cut = cut.replace("\0", "\\0")
    return cut.encode("utf-8", "backslashreplace").decode("utf-8")
