"""Runbooks: the planner's output b (paper §2.1 Eq. 2), a numbered list of steps.

    rb = Runbook(("run: sort -u words.txt > sorted.txt", "declare the task complete"),
                 goal="write the distinct words")
    text = rb.to_text()          # "Runbook: write the distinct words\n1. run: sort -u ...\n2. ..."
    assert Runbook.parse(text) == rb
    rb = digest_runbook(instruction, [ExecutedCommand("ls", 0, "a.txt"), "cat a.txt"])

Text format (what planners emit and the executing agent reads):

    Runbook: <goal, one line, optional>
    1. <step>
    2. <step>
    ...

A step is one line of free text; a *command step* is `run: <shell command>` (a command
containing a newline or leading/trailing blanks is written as a JSON string:
`run: "cat <<EOF\\n...\\nEOF"`). `Runbook.parse` skips text before the `Runbook:` line
(a language-model planner may talk first), requires steps numbered 1..n, and stops at the
first line after the steps that is not a step. Validation (`RunbookError`, a ValueError):
1..`MAX_STEPS` steps, each non-empty, one line, at most `MAX_STEP_CHARS` characters, and
command steps with a non-empty command.

`digest_runbook` is the deterministic planner's core: the verified command sequence of a
successful trajectory becomes a runbook, dropping failed steps (non-zero exit or timeout),
redundant repeats (an exact repeat of an earlier kept command that is read-only or
idempotent, i.e. has no `>>` append) and inspection commands whose output no later kept
command uses (a read-only command is kept only if a later command contains a word of its
output that neither the instruction nor an earlier command contains). Commands given as
plain strings have no recorded outcome and are taken as successful with unknown output
(kept unless repeated).
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
from collections.abc import Iterable, Sequence

MAX_STEPS = 32
MAX_STEP_CHARS = 600
HEADER = "Runbook:"
COMMAND_PREFIX = "run: "
COMPLETE_STEP = "declare the task complete"
FENCE = "```"  # around a multi-line command in `Runbook.to_guidance(literal_commands=True)`

# Programs that only read (with no redirection, -i, tee, -exec, -delete they change nothing).
READ_ONLY_PROGRAMS = frozenset((
    "ls", "cat", "pwd", "head", "tail", "wc", "grep", "egrep", "fgrep", "find", "echo",
    "printf", "stat", "file", "less", "more", "tree", "du", "df", "which", "type", "whoami",
    "id", "env", "printenv", "date", "diff", "cmp", "sort", "uniq", "awk", "sed", "cut",
    "tr", "nl", "od", "xxd", "hexdump", "md5sum", "sha256sum", "basename", "dirname",
    "realpath", "readlink", "test", "[", "true", ":", "jq", "column", "comm", "paste",
))
_MUTATING_MARKERS = re.compile(r"(^|[^<>&0-9])>|\btee\b|\s-i\b|-exec\b|-delete\b|\bxargs\b")
_STEP_RE = re.compile(r"^\s*(\d+)[.)]\s+(.*\S)\s*$")
_WORD_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{2,}")


class RunbookError(ValueError):
    """A runbook (or runbook text) is malformed; the message says which step and why."""


@dataclasses.dataclass(frozen=True)
class Runbook:
    """Steps as text (see the module doc). `goal`: optional one-line restatement."""

    steps: tuple[str, ...]
    goal: str = ""

    def __post_init__(self):
        object.__setattr__(self, "steps", tuple(self.steps))
        if not self.steps:
            raise RunbookError("a runbook needs at least one step")
        if len(self.steps) > MAX_STEPS:
            raise RunbookError(f"a runbook has at most {MAX_STEPS} steps, got "
                               f"{len(self.steps)}; merge or drop steps")
        if "\n" in self.goal or len(self.goal) > MAX_STEP_CHARS:
            raise RunbookError(f"the goal must be one line of at most {MAX_STEP_CHARS} "
                               "characters")
        for i, s in enumerate(self.steps, 1):
            if not isinstance(s, str) or not s.strip():
                raise RunbookError(f"step {i} is empty")
            if "\n" in s or s != s.strip():
                raise RunbookError(f"step {i} must be one line without surrounding blanks "
                                   f"(write multi-line commands as `run: \"<json string>\"`)")
            if len(s) > MAX_STEP_CHARS:
                raise RunbookError(f"step {i} has {len(s)} characters > {MAX_STEP_CHARS}")
            if s.startswith(COMMAND_PREFIX.strip()) and not _step_command(s, i).strip():
                raise RunbookError(f"step {i} is a command step without a command")

    # -- text -----------------------------------------------------------------------

    def to_text(self) -> str:
        return "\n".join([self._head()] + [f"{i}. {s}" for i, s in enumerate(self.steps, 1)])

    def _head(self) -> str:
        return f"{HEADER} {self.goal}".rstrip()

    def to_guidance(self, literal_commands: bool = False) -> str:
        """The runbook as the executing agent reads it. Without `literal_commands` this is
        `to_text` (a multi-line command as a JSON string: what a JSON action writes too).
        With it, a multi-line command is shown as its own lines in a fenced block under its
        step (`1. run:` then ```` ``` ````, the lines, ```` ``` ````): the form a bash block or
        an XML keystrokes element takes, so the agent copies lines, not escapes (a model
        handed `run: "a\\nb"` in the bash format wrote the two characters `\\n` into its
        script). Display only: `parse` reads `to_text`."""
        if not literal_commands:
            return self.to_text()
        lines = [self._head()]
        for i, step in enumerate(self.steps, 1):
            is_command = step.startswith(COMMAND_PREFIX.strip())
            if is_command and _not_one_clean_line(command := _step_command(step, i)):
                lines += [f"{i}. {COMMAND_PREFIX.strip()}", FENCE, command, FENCE]
            else:
                lines.append(f"{i}. {step}")
        return "\n".join(lines)

    @classmethod
    def parse(cls, text: str) -> Runbook:
        """Parse runbook text (see the module doc); RunbookError says what is wrong."""
        if not isinstance(text, str):
            raise RunbookError(f"runbook text must be a string, got {type(text).__name__}")
        lines = text.splitlines()
        start = next((i for i, ln in enumerate(lines) if ln.strip().startswith(HEADER)), None)
        if start is None:
            raise RunbookError(f"no '{HEADER}' line in the text; a runbook starts with "
                               f"'{HEADER} <goal>' followed by numbered steps '1. ...'")
        goal = lines[start].strip()[len(HEADER):].strip()
        steps: list[str] = []
        for ln in lines[start + 1:]:
            if not ln.strip():
                if steps:
                    break
                continue
            m = _STEP_RE.match(ln)
            if not m:
                break
            if int(m.group(1)) != len(steps) + 1:
                raise RunbookError(f"step numbers must run 1..n; found {m.group(1)} where "
                                   f"{len(steps) + 1} was expected")
            steps.append(m.group(2))
        if not steps:
            raise RunbookError(f"the '{HEADER}' line is followed by no numbered step")
        return cls(tuple(steps), goal)

    # -- commands -------------------------------------------------------------------

    def commands(self) -> list[str]:
        """The shell commands of the command steps, in order."""
        return [_step_command(s, i) for i, s in enumerate(self.steps, 1)
                if s.startswith(COMMAND_PREFIX.strip())]

    @staticmethod
    def command_step(command: str) -> str:
        """The step text for `command` (JSON-quoted if it has newlines or outer blanks)."""
        if _not_one_clean_line(command) or command.startswith('"'):
            return COMMAND_PREFIX + json.dumps(command)
        return COMMAND_PREFIX + command


def _not_one_clean_line(command: str) -> bool:
    """A command a one-line step cannot hold as it is: newlines or surrounding blanks."""
    return "\n" in command or command != command.strip()


def _step_command(step: str, index: int) -> str:
    body = step[len(COMMAND_PREFIX.strip()):].strip()
    if body.startswith('"'):
        try:
            cmd = json.loads(body)
        except json.JSONDecodeError as e:
            raise RunbookError(f"step {index}: the quoted command is not a JSON string: "
                               f"{e.msg}") from e
        if not isinstance(cmd, str):
            raise RunbookError(f"step {index}: the quoted command is not a string")
        return cmd
    return body


# ----------------------------------------------------------------------------- digest


@dataclasses.dataclass(frozen=True)
class ExecutedCommand:
    """One command as it ran: exit code (None: unknown), whether it timed out, its output
    (None: unknown) and the agent turn it ran in."""

    command: str
    exit_code: int | None = 0
    output: str | None = None
    turn: int = 0
    timed_out: bool = False

    @property
    def failed(self) -> bool:
        return self.timed_out or (self.exit_code is not None and self.exit_code != 0)


def programs(command: str) -> list[str]:
    """The program names a shell command invokes (first word of each pipeline/list element,
    skipping `VAR=value` assignments, `sudo`/`env`/`time` prefixes and subshell parens)."""
    out = []
    for part in re.split(r"\|\||&&|[|;&\n]|\$\(|`", command):
        try:
            words = shlex.split(part, comments=False)
        except ValueError:
            words = part.split()
        words = [w.lstrip("({").rstrip(")}") for w in words]
        words = [w for w in words if w]
        while words and (re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0])
                         or words[0] in ("sudo", "time", "nohup", "exec", "then", "do", "else",
                                         "if", "while", "until", "!")):
            words = words[1:]
        if words and not words[0].startswith(("<", ">", "2>", "1>")):
            out.append(words[0])
    return out


def is_read_only(command: str) -> bool:
    """True if every program is a reader and nothing is written (no `>`, tee, -i, ...)."""
    progs = programs(command)
    return bool(progs) and all(p in READ_ONLY_PROGRAMS for p in progs) \
        and not _MUTATING_MARKERS.search(command)


def _as_executed(c) -> ExecutedCommand:
    if isinstance(c, ExecutedCommand):
        return c
    if isinstance(c, str):
        return ExecutedCommand(c, None, None)
    if isinstance(c, Sequence) and 1 <= len(c) <= 3 and isinstance(c[0], str):
        return ExecutedCommand(c[0], *c[1:])
    raise RunbookError(f"a command must be a str, (command, exit_code[, output]) or an "
                       f"ExecutedCommand; got {c!r}")


def digest_plan(instruction: str, commands: Iterable) -> tuple[list[ExecutedCommand],
                                                                 dict[str, int]]:
    """The kept commands and the drop counts {"failed", "duplicate", "unused_inspection"}
    of `digest_runbook` (see the module doc)."""
    cmds = [_as_executed(c) for c in commands]
    dropped = {"failed": 0, "duplicate": 0, "unused_inspection": 0}
    kept: list[ExecutedCommand] = []
    for c in cmds:
        if not c.command.strip():
            dropped["duplicate"] += 1
        elif c.failed:
            dropped["failed"] += 1
        elif any(k.command == c.command for k in kept) and (
                is_read_only(c.command) or ">>" not in c.command):
            dropped["duplicate"] += 1
        else:
            kept.append(c)
    # inspection whose output no later kept command uses (backwards: a kept reader may feed
    # an earlier reader's words forward only through later commands, so later ones decide)
    final: list[ExecutedCommand] = []
    for i, c in enumerate(kept):
        if c.output is not None and is_read_only(c.command):
            known = set(_WORD_RE.findall(instruction))
            for e in kept[:i]:
                known.update(_WORD_RE.findall(e.command))
            fresh = set(_WORD_RE.findall(c.output)) - known
            later = " ".join(k.command for k in kept[i + 1:])
            later_words = set(_WORD_RE.findall(later))
            if not (fresh & later_words):
                dropped["unused_inspection"] += 1
                continue
        final.append(c)
    return final, dropped


def digest_runbook(instruction: str, commands: Iterable, *, goal: str | None = None,
                   complete_step: bool = True) -> Runbook:
    """Deterministic planner: executed commands → Runbook (see the module doc).

    Args:
      instruction: the public task instruction x_pub (words it already states are not
        "information" an inspection command contributes).
      commands: str, (command, exit_code[, output]) tuples or `ExecutedCommand`s, in order.
      goal: the runbook's goal line (default: none; x_pub is in front of it anyway).
      complete_step: end with the step "declare the task complete".

    Raises RunbookError if no command survives (nothing to plan).
    """
    kept, _ = digest_plan(instruction, commands)
    if not kept:
        raise RunbookError("no successful, non-redundant command to build a runbook from")
    steps = [Runbook.command_step(c.command) for c in kept]
    if complete_step:
        steps.append(COMPLETE_STEP)
    return Runbook(tuple(steps[:MAX_STEPS]), goal or "")
