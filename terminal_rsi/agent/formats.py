"""Action formats: how a reply encodes an `Action`, chosen by `harness.action_format`.

    fmt = get_format("xml")
    action = fmt.parse(reply_text, terminal="session")   # ActionParseError naming the fault
    text = fmt.render(action, terminal="session")        # a demonstration in the format
    prompt = fmt.system_prompt(terminal="exec")          # the harness's default instructions

Three formats, each with its system prompt, parser and renderer; the parsed `Action`
(commands with timeouts, task_complete) is the same whatever the format, and so is
everything downstream (execution, observations, rewards, packing):

* ``json`` (default): the Terminus JSON object (`terminal_rsi.agent.actions`).
* ``xml``: Terminus XML (Terminal-Bench's Terminus 2, ``terminus-xml-plain``)::

      <response>
      <analysis>what I see</analysis>
      <plan>what I will do</plan>
      <commands>
      <keystrokes duration="5">ls -la
      </keystrokes>
      </commands>
      <task_complete>false</task_complete>
      </response>

  The text of each ``<keystrokes>`` element is used verbatim (no XML entities are decoded:
  ``&amp;`` stays ``&amp;``); ``duration`` (seconds, optional, default
  `DEFAULT_COMMAND_TIMEOUT_S`) is the command's timeout. ``analysis``, ``plan`` and
  ``task_complete`` are optional; ``task_complete`` holds ``true`` or ``false``. Text
  around the ``<response>`` element is ignored; anything else inside ``<commands>`` is an
  error.
* ``bash``: at most one fenced block (```` ```bash ````, ```` ```sh ````, ```` ```shell ````
  or a bare ```` ``` ````) and, to declare the task complete, the line `COMPLETE_LINE`
  alone on a line outside the block; prose around them is the analysis. With the exec
  terminal the block runs as one ``bash -c`` script (``cd`` and variables carry over
  within the block, not to the next reply); with the session terminal its lines are typed
  into the terminal, and a line that is exactly a tmux key name (``C-c``) is pressed. The
  block's commands get `DEFAULT_COMMAND_TIMEOUT_S` (the harness clips it).

Every format parses within the bounds of `terminal_rsi.agent.actions` (reply length, command
count, keystroke size and text, timeouts) and raises only `ActionParseError`, whose message
(it becomes the agent's observation) says what was wrong and ends with the format's schema.
"""

from __future__ import annotations

import abc
import json
import math
import re

from terminal_rsi.agent.actions import (
    DEFAULT_COMMAND_TIMEOUT_S,
    SCHEMA_TEXT,
    SESSION_SCHEMA_TEXT,
    Action,
    ActionParseError,
    Command,
    check_command_count,
    check_reply_text,
    check_text_field,
    checked_command,
    parse_action,
)
from terminal_rsi.config.sections import ACTION_FORMATS, TERMINALS
from terminal_rsi.sandbox.terminal import is_key_name

SYSTEM_PREAMBLE = {
    "exec": "You are an autonomous agent working in a Linux shell. Solve the task by running "
            "commands. ",
    "session": "You are an autonomous agent working in a Linux terminal. Solve the task by "
               "typing commands. ",
}


class ActionFormat(abc.ABC):
    """One way of writing an action in a reply (see the module doc)."""

    name: str
    # a reply writes a multi-line command as its own lines (bash block, XML keystrokes), not
    # as a quoted string: runbook guidance shows such commands the same way
    # (terminal_rsi.rsr.runbook.Runbook.to_guidance)
    literal_commands: bool = True

    @abc.abstractmethod
    def schema(self, terminal: str) -> str:
        """The format's instructions for `terminal` ("exec" or "session")."""

    @abc.abstractmethod
    def short_prompt(self, terminal: str) -> str:
        """A one-line system prompt with a minimal example (small models' default)."""

    @abc.abstractmethod
    def parse(self, text: str, terminal: str = "exec") -> Action:
        """The reply's action; ActionParseError (and nothing else) when it holds none."""

    @abc.abstractmethod
    def render(self, action: Action, terminal: str = "exec", compact: bool = False) -> str:
        """`action` written in the format (demonstrations, reference policies); `compact`
        leaves out the free text and default fields. `parse(render(a))` types or runs what
        `a` does and agrees on task_complete (bash writes a reply's commands as one block:
        one script with the exec terminal)."""

    def system_prompt(self, terminal: str) -> str:
        """The harness's default system prompt in this format."""
        _check_terminal(terminal)
        return SYSTEM_PREAMBLE[terminal] + self.schema(terminal)


def _check_terminal(terminal: str) -> None:
    if terminal not in TERMINALS:
        raise ValueError(f"terminal must be one of {TERMINALS}, got {terminal!r}")


def _fail(message: str, schema: str) -> ActionParseError:
    return ActionParseError(f"{message}. {schema}")


def _command(where: str, timeout_where: str, keystrokes: str, timeout: object,
             schema: str) -> Command:
    """`checked_command`, its error ending with the format's `schema`."""
    try:
        return checked_command(where, timeout_where, keystrokes, timeout)
    except ActionParseError as e:
        raise _fail(str(e), schema) from None


def _finite_or_text(text: str) -> float | str:
    """`text` as a finite float, else `text` itself (`checked_command` then names it)."""
    try:
        value = float(text)
    except ValueError:
        return text
    return value if math.isfinite(value) else text


def _seconds(value: float) -> str:
    return f"{value:g}"


# ----------------------------------------------------------------------------- json


class JSONFormat(ActionFormat):
    """The Terminus JSON object (`terminal_rsi.agent.actions.parse_action`)."""

    name = "json"
    literal_commands = False  # a JSON string: "a\nb"

    def schema(self, terminal: str) -> str:
        _check_terminal(terminal)
        return SESSION_SCHEMA_TEXT if terminal == "session" else SCHEMA_TEXT

    def short_prompt(self, terminal: str) -> str:
        _check_terminal(terminal)
        if terminal == "session":
            return ('Solve the task in a Linux terminal. Reply with one JSON action: '
                    '{"commands":["<keys>\\n"],"task_complete":true}')
        return ('Solve the task in a Linux shell. Reply with one JSON action: '
                '{"commands":["<shell command>"],"task_complete":true}')

    def parse(self, text: str, terminal: str = "exec") -> Action:
        return parse_action(text)

    def render(self, action: Action, terminal: str = "exec", compact: bool = False) -> str:
        if not compact:
            return action.to_json()
        return json.dumps({"commands": [c.keystrokes for c in action.commands],
                           "task_complete": action.task_complete}, separators=(",", ":"))


# ----------------------------------------------------------------------------- xml

XML_SCHEMA = (
    "Reply with one XML response: <response><analysis>what you see</analysis><plan>what you "
    "will do</plan><commands><keystrokes duration=\"<seconds>\">{keys}</keystrokes>"
    "</commands><task_complete>true or false</task_complete></response>. The text inside "
    "each <keystrokes> element is used verbatim: do not XML-encode it. {how} duration is the "
    "longest to wait for it. Set task_complete to true when the task is done; the commands "
    "of that reply still run first."
)
XML_HOW = {
    "exec": "Each command runs with `bash -c` in the task's working directory (a fresh shell "
            "per command).",
    "session": "Keystrokes are typed into one interactive bash terminal that lasts the whole "
               "task: end a command with a newline to run it; a key name alone (C-c, C-d) "
               "presses that key; a command still running after its duration keeps running.",
}
_XML_RESPONSE = re.compile(r"<response>(.*?)</response>", re.DOTALL)
_XML_FIELD = {name: re.compile(rf"<{name}>(.*?)</{name}>", re.DOTALL)
              for name in ("analysis", "plan", "commands", "task_complete")}
_XML_KEYSTROKES = re.compile(
    r"<keystrokes(?P<attrs>(?:\s+[A-Za-z_][\w-]*\s*=\s*\"[^\"]*\")*)\s*>(?P<keys>.*?)"
    r"</keystrokes>", re.DOTALL)
_XML_ATTR = re.compile(r"([A-Za-z_][\w-]*)\s*=\s*\"([^\"]*)\"")


class XMLFormat(ActionFormat):
    """Terminus XML (module doc)."""

    name = "xml"

    def schema(self, terminal: str) -> str:
        _check_terminal(terminal)
        keys = "ls -la\\n" if terminal == "session" else "ls -la"
        return XML_SCHEMA.replace("{keys}", keys).replace("{how}", XML_HOW[terminal])

    def short_prompt(self, terminal: str) -> str:
        _check_terminal(terminal)
        keys = "<keys>\n" if terminal == "session" else "<shell command>"
        where = "terminal" if terminal == "session" else "shell"
        return (f"Solve the task in a Linux {where}. Reply with one XML action: <response>"
                f"<commands><keystrokes>{keys}</keystrokes></commands><task_complete>true"
                "</task_complete></response>")

    def parse(self, text: str, terminal: str = "exec") -> Action:
        schema = self.schema(terminal)
        check_reply_text(text, schema)
        m = _XML_RESPONSE.search(text)
        if m is None:
            what = ("a <response> element is not closed with </response>"
                    if "<response>" in text else "the reply contains no <response> element")
            raise _fail(what, schema)
        body = m.group(1)
        fields = {}
        for name, pattern in _XML_FIELD.items():
            found = pattern.findall(body)
            if len(found) > 1:
                raise _fail(f"<{name}> appears {len(found)} times in the response; write it "
                            "once", schema)
            if not found and f"<{name}>" in body:
                raise _fail(f"<{name}> is not closed with </{name}>", schema)
            fields[name] = found[0] if found else None
        for name in ("analysis", "plan"):
            check_text_field(f"<{name}>", fields[name] or "")
        done = (fields["task_complete"] or "false").strip().lower()
        if done not in ("true", "false"):
            raise _fail(f"<task_complete> must hold true or false, got "
                        f"{fields['task_complete'][:40]!r}", schema)
        commands = self._commands(fields["commands"] or "", schema)
        return Action((fields["analysis"] or "").strip(), commands, done == "true",
                      plan=(fields["plan"] or "").strip())

    @staticmethod
    def _commands(body: str, schema: str) -> tuple[Command, ...]:
        out, pos = [], 0
        matches = list(_XML_KEYSTROKES.finditer(body))
        check_command_count(len(matches))
        for i, m in enumerate(matches):
            stray = body[pos:m.start()].strip()
            if stray:
                raise _fail(f"<commands> holds text outside a <keystrokes> element: "
                            f"{stray[:60]!r}", schema)
            pos = m.end()
            attrs = dict(_XML_ATTR.findall(m.group("attrs")))
            unknown = sorted(set(attrs) - {"duration"})
            if unknown:
                raise _fail(f"<keystrokes> #{i + 1} has unknown attribute(s) {unknown[:5]}; "
                            "only duration is allowed", schema)
            raw = attrs.get("duration")
            timeout = DEFAULT_COMMAND_TIMEOUT_S if raw is None else _finite_or_text(raw)
            out.append(_command(f"<keystrokes> #{i + 1}", f"<keystrokes> #{i + 1} duration",
                                m.group("keys"), timeout, schema))
        stray = body[pos:].strip()
        if stray:
            what = ("a <keystrokes> element is not closed with </keystrokes>"
                    if "<keystrokes" in stray else
                    f"<commands> holds text outside a <keystrokes> element: {stray[:60]!r}")
            raise _fail(what, schema)
        return tuple(out)

    def render(self, action: Action, terminal: str = "exec", compact: bool = False) -> str:
        lines = ["<response>"]
        if not compact:
            lines.append(f"<analysis>{action.analysis}</analysis>")
            if action.plan:
                lines.append(f"<plan>{action.plan}</plan>")
        lines.append("<commands>")
        for c in action.commands:
            attr = "" if compact else f' duration="{_seconds(c.timeout)}"'
            lines.append(f"<keystrokes{attr}>{c.keystrokes}</keystrokes>")
        lines.append("</commands>")
        lines.append(f"<task_complete>{str(action.task_complete).lower()}</task_complete>")
        lines.append("</response>")
        return "\n".join(lines)


# ----------------------------------------------------------------------------- bash

COMPLETE_LINE = "TASK COMPLETE"
BASH_SCHEMA = (
    "Reply with your reasoning, then exactly one fenced code block of bash commands:\n"
    "```bash\n<commands>\n```\n{how} When the task is done, write the line {done} alone on a "
    "line outside the block (the block of that reply, if any, still runs first)."
)
BASH_HOW = {
    "exec": "The block runs as one bash script in the task's working directory (a fresh "
            "shell per reply).",
    "session": "Its lines are typed into one interactive bash terminal that lasts the whole "
               "task; a line that is only a key name (C-c, C-d) presses that key.",
}
_FENCE = re.compile(r"^[ \t]*```[ \t]*([\w+-]*)[ \t]*$", re.MULTILINE)
BASH_LANGUAGES = ("", "bash", "sh", "shell")


class BashFormat(ActionFormat):
    """One fenced bash block per reply and a completion line (module doc)."""

    name = "bash"

    def schema(self, terminal: str) -> str:
        _check_terminal(terminal)
        return BASH_SCHEMA.replace("{how}", BASH_HOW[terminal]).replace("{done}", COMPLETE_LINE)

    def short_prompt(self, terminal: str) -> str:
        _check_terminal(terminal)
        where = "terminal" if terminal == "session" else "shell"
        return (f"Solve the task in a Linux {where}. Reply with one ```bash block of commands; "
                f"add the line {COMPLETE_LINE} when done.")

    def parse(self, text: str, terminal: str = "exec") -> Action:
        schema = self.schema(terminal)
        check_reply_text(text, schema)
        fences = list(_FENCE.finditer(text))
        if len(fences) % 2:
            raise _fail("a ``` code block is not closed (its closing ``` line is missing)",
                        schema)
        if len(fences) > 2:
            raise _fail(f"the reply holds {len(fences) // 2} code blocks; write exactly one "
                        "per reply", schema)
        block, outside = None, text
        if fences:
            open_, close = fences
            lang = open_.group(1).lower()
            if lang not in BASH_LANGUAGES:
                raise _fail(f"the code block is marked {lang[:20]!r}; mark it bash", schema)
            if close.group(1):
                raise _fail("a ``` line that closes the block must hold nothing else", schema)
            block = text[open_.end():close.start()].strip("\n")
            outside = text[:open_.start()] + text[close.end():]
        lines = outside.splitlines()
        rest = [ln for ln in lines if ln.strip() != COMPLETE_LINE]
        done = len(rest) < len(lines)
        if block is None and not done:
            raise _fail(f"the reply holds no ```bash block and no {COMPLETE_LINE} line", schema)
        analysis = "\n".join(rest).strip()
        check_text_field("the text around the block", analysis)
        commands = (() if block is None or not block.strip()
                    else self._commands(block, terminal, schema))
        return Action(analysis, commands, done)

    @staticmethod
    def _commands(block: str, terminal: str, schema: str) -> tuple[Command, ...]:
        if terminal != "session":
            return (_command("the bash block", "the timeout", block, DEFAULT_COMMAND_TIMEOUT_S,
                             schema),)
        out, typed = [], []

        def flush():
            if typed:
                out.append("".join(ln + "\n" for ln in typed))
                typed.clear()

        for ln in block.split("\n"):
            if is_key_name(ln.strip()):
                flush()
                out.append(ln.strip())
            else:
                typed.append(ln)
        flush()
        check_command_count(len(out))
        return tuple(_command(f"line group {i + 1} of the bash block", "the timeout", k,
                              DEFAULT_COMMAND_TIMEOUT_S, schema) for i, k in enumerate(out))

    def render(self, action: Action, terminal: str = "exec", compact: bool = False) -> str:
        parts = []
        if action.analysis and not compact:
            parts.append(action.analysis)
        if action.commands:
            lines = "\n".join(c.keystrokes.removesuffix("\n") for c in action.commands)
            parts.append(f"```bash\n{lines}\n```")
        if action.task_complete:
            parts.append(COMPLETE_LINE)
        return "\n".join(parts)


FORMATS: dict[str, ActionFormat] = {f.name: f for f in (JSONFormat(), XMLFormat(), BashFormat())}
# the tiny scale's one-line prompt (JSON, exec); `HarnessConfig.system_text` gives its version
# in the harness's format and terminal
SHORT_SYSTEM_PROMPT = FORMATS["json"].short_prompt("exec")


def get_format(name: str) -> ActionFormat:
    """The action format called `name` (one of `ACTION_FORMATS`)."""
    fmt = FORMATS.get(name)
    if fmt is None:
        raise ValueError(f"unknown action format {name!r}; choose one of {ACTION_FORMATS}")
    return fmt


__all__ = ["ACTION_FORMATS", "COMPLETE_LINE", "FORMATS", "SHORT_SYSTEM_PROMPT", "ActionFormat",
           "BashFormat", "JSONFormat", "XMLFormat", "get_format"]
