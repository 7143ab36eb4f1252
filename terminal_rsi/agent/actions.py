"""Structured JSON actions and observation formatting (paper §3.1, Appendix A).

Action schema (one JSON object per assistant turn)::

    {
      "analysis": "what I see and what I will do",          # string, optional
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
message into the turn's observation (the turn counts, the episode goes on).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

DEFAULT_COMMAND_TIMEOUT_S = 30.0
COMMAND_KEYS = ("keystrokes", "cmd", "command")
ACTION_KEYS = ("analysis", "commands", "task_complete")

SCHEMA_TEXT = (
    'Reply with exactly one JSON object: {"analysis": "<your reasoning>", "commands": '
    '[{"keystrokes": "<shell command>", "timeout": <seconds>}], "task_complete": <true|false>}. '
    "Each command runs with `bash -c` in the task's working directory (a fresh shell per "
    "command). Set task_complete to true when the task is done; the commands of that turn "
    "still run first."
)


class ActionParseError(ValueError):
    """The model's output holds no valid action; the message says what is wrong and the
    expected schema (it becomes the turn's observation)."""


@dataclasses.dataclass(frozen=True)
class Command:
    keystrokes: str
    timeout: float = DEFAULT_COMMAND_TIMEOUT_S


@dataclasses.dataclass(frozen=True)
class Action:
    analysis: str = ""
    commands: tuple[Command, ...] = ()
    task_complete: bool = False

    def to_json(self) -> str:
        return json.dumps({
            "analysis": self.analysis,
            "commands": [{"keystrokes": c.keystrokes, "timeout": c.timeout}
                         for c in self.commands],
            "task_complete": self.task_complete,
        })


def _first_json_object(text: str) -> Any:
    """The first decodable JSON object that looks like an action (has an action field);
    failing that, the first decodable object (its fields are then reported as unknown)."""
    dec = json.JSONDecoder()
    start = text.find("{")
    first_err = None
    fallback = None
    while start >= 0:
        try:
            obj, _ = dec.raw_decode(text, start)
            if isinstance(obj, dict):
                if set(obj) & set(ACTION_KEYS) or not obj:
                    return obj
                fallback = obj if fallback is None else fallback
        except json.JSONDecodeError as e:
            first_err = e if first_err is None else first_err
        start = text.find("{", start + 1)
    if first_err is not None:
        raise ActionParseError(f"no valid JSON action in the reply ({first_err.msg} at "
                               f"position {first_err.pos}). {SCHEMA_TEXT}")
    if fallback is not None:
        return fallback
    raise ActionParseError(f"the reply contains no JSON object. {SCHEMA_TEXT}")


def parse_action(text: str) -> Action:
    """Parse the model's reply into an `Action` (see the module doc for the schema).

    Raises:
      ActionParseError: no JSON object, wrong field types, or unknown fields.
    """
    obj = _first_json_object(text)
    unknown = sorted(set(obj) - set(ACTION_KEYS))
    if unknown:
        raise ActionParseError(f"unknown field(s) {unknown} in the action; allowed: "
                               f"{list(ACTION_KEYS)}. {SCHEMA_TEXT}")
    analysis = obj.get("analysis", "")
    if not isinstance(analysis, str):
        raise ActionParseError(f'"analysis" must be a string, got {type(analysis).__name__}')
    done = obj.get("task_complete", False)
    if not isinstance(done, bool):
        raise ActionParseError(f'"task_complete" must be true or false, got {done!r}')
    raw = obj.get("commands", [])
    if not isinstance(raw, list):
        raise ActionParseError(f'"commands" must be a list, got {type(raw).__name__}')
    commands = []
    for i, c in enumerate(raw):
        if isinstance(c, str):
            commands.append(Command(c))
            continue
        if not isinstance(c, dict):
            raise ActionParseError(f"commands[{i}] must be an object with \"keystrokes\" and "
                                   f"\"timeout\", got {type(c).__name__}")
        keys = [k for k in COMMAND_KEYS if k in c]
        if len(keys) != 1 or not isinstance(c[keys[0]], str):
            raise ActionParseError(f'commands[{i}] needs exactly one string "keystrokes" '
                                   f"field, got fields {sorted(c)}")
        t = c.get("timeout", c.get("duration", DEFAULT_COMMAND_TIMEOUT_S))
        if isinstance(t, bool) or not isinstance(t, int | float) or not t > 0:
            raise ActionParseError(f'commands[{i}].timeout must be a positive number of '
                                   f"seconds, got {t!r}")
        commands.append(Command(c[keys[0]], float(t)))
    return Action(analysis, tuple(commands), done)


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
    """Render command results (`ExecResult`s) as the observation text, capped head+tail.

    Per command: `$ <command>`, then stdout and stderr, then `[exit code N]` or
    `[timed out after T s]`. `note` (e.g. a parse error) comes first.
    """
    parts = [note] if note else []
    for cmd, r in results:
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
