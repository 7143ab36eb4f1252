"""The reviewer q(x, b) and the leak screen q_leak(τ̃) (paper §2.1 Eq. 2).

    reviewer = Reviewer(target_harness)
    verdict = reviewer.review(task.instruction, plan_text)      # Review(accepted, reasons)
    reasons = leak_screen(public_view(traj), runbook, tokenizer, privileged)   # [] = clean

The reviewer sees only the public task and the runbook (plus, for the artifact check, the
strings the protected side marks as privileged). A binary gate; every rejection records
its reason codes (`Review.reasons`) and human-readable details:

- `schema`: the text is not a valid runbook (`Runbook.parse` / validation failed).
- `artifact`: the runbook refers to verifier tests or hidden paths (`ARTIFACT_PATTERNS`:
  /tests, $TEST_DIR, test_*.py, pytest, verifier, CTRF, reward files, /logs/verifier, the
  reference solution) or contains a privileged string (an expected output or check text of
  the protected verifier, a verifier file's content line).
- `compatibility`: a command needs a program the target harness's sandbox does not have
  (`available_programs`: shell builtins plus what `shutil.which` finds, or a configured
  set), a step asks for a tool the JSON-action shell harness does not offer
  (`FOREIGN_TOOL_PATTERNS`: browser, web search, asking the user, file-editor or other tool
  calls), or the runbook has more command steps than the harness's turn and output budget
  can carry (`max_commands`).
- `model`: an optional model-based reviewer `model_review(instruction, runbook_text) ->
  (ok, reason)` said no.

The leak screen runs on the public view P(τ̃) of a fresh execution: the public prefix and
the generated decisions and observations must reveal neither the runbook's private text
(the execution instruction, the runbook header, non-command step prose) nor privileged
content (the same privileged strings, verifier paths). Commands the agent ran are not
private: carrying them out is the point of the runbook.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
from collections.abc import Callable, Iterable, Sequence

from terminal_rsi.agent.harness import safe_decode
from terminal_rsi.rsr.guidance import EXEC_INSTRUCTION
from terminal_rsi.rsr.runbook import COMMAND_PREFIX, HEADER, Runbook, RunbookError, programs
from terminal_rsi.tasks.builtin import EmptySnapshot, no_run

REASONS = ("schema", "artifact", "compatibility", "model")

ARTIFACT_PATTERNS = (
    r"(^|[\s'\"=:(])/tests?\b", r"\$\{?TEST_DIR\b", r"\btest_\w+\.py\b", r"\bpytest\b",
    r"\bverif(y|ier|ication)\b", r"\bctrf\b", r"\breward\.(txt|json)\b", r"/logs/verifier",
    r"\bsolution\.sh\b", r"\bexpected[_ ]output\b", r"\bTRSI_LOGS_DIR\b",
)
FOREIGN_TOOL_PATTERNS = (
    r"\b(open|use) (a |the )?(web )?browser\b", r"\bweb[- ]search\b", r"\bsearch the web\b",
    r"\bask the user\b", r"\b(call|use|invoke) the \w+ tool\b", r"\bstr_replace_editor\b",
    r"\bfunction[- ]call\b", r"\bupload\b",
)
SHELL_BUILTINS = frozenset((
    "cd", "echo", "printf", "test", "[", "[[", "true", "false", ":", "export", "set", "unset",
    "read", "for", "while", "until", "if", "case", "do", "done", "then", "fi", "else", "elif",
    "esac", "function", "return", "exit", "source", ".", "eval", "local", "shift", "pwd",
    "type", "command", "trap", "wait", "let", "declare", "alias", "umask", "ulimit", "{", "}",
))
MIN_PRIVILEGED_CHARS = 6
MIN_PROSE_CHARS = 12


@dataclasses.dataclass
class Review:
    accepted: bool
    reasons: list[str]
    details: list[str]
    runbook: Runbook | None = None


def detect_programs(names: Iterable[str]) -> set[str]:
    """The subset of `names` available here (shell builtins or found by shutil.which)."""
    return {n for n in names if n in SHELL_BUILTINS or shutil.which(n) is not None}


class Reviewer:
    """The binary gate q(x, b) (see the module doc).

    available_programs: programs the target harness's sandbox has (None: detected on this
      machine, right for the local backends). max_commands: most command steps a runbook
      may have (None: the harness's max_turns × 8). model_review: optional model hook.
    """

    def __init__(self, harness=None, *, available_programs: Iterable[str] | None = None,
                 max_commands: int | None = None,
                 model_review: Callable[[str, str], tuple[bool, str]] | None = None):
        self.available = None if available_programs is None else set(available_programs)
        turns = getattr(harness, "max_turns", 8)
        self.max_commands = max_commands if max_commands is not None else turns * 8
        self.model_review = model_review
        self._artifact = [re.compile(p, re.IGNORECASE) for p in ARTIFACT_PATTERNS]
        self._foreign = [re.compile(p, re.IGNORECASE) for p in FOREIGN_TOOL_PATTERNS]

    def _missing(self, progs: Sequence[str]) -> list[str]:
        names = {p for p in progs if not p.startswith(("$", "./", "/"))}
        have = self.available if self.available is not None else detect_programs(names)
        return sorted(n for n in names if n not in have and n not in SHELL_BUILTINS)

    def review(self, instruction: str, runbook: Runbook | str,
               privileged: Sequence[str] = ()) -> Review:
        """Gate one runbook (text or Runbook) for the public task `instruction`."""
        reasons: list[str] = []
        details: list[str] = []
        if isinstance(runbook, Runbook):
            rb = runbook
        else:
            try:
                rb = Runbook.parse(runbook)
            except RunbookError as e:
                return Review(False, ["schema"], [f"schema: {e}"], None)
        text = rb.to_text()
        for pat in self._artifact:
            m = pat.search(text)
            if m:
                reasons.append("artifact")
                details.append(f"artifact: refers to {m.group(0).strip()!r}")
                break
        if "artifact" not in reasons:
            hit = next((p for p in privileged if len(p) >= MIN_PRIVILEGED_CHARS
                        and p in text and p not in instruction), None)
            if hit is not None:
                reasons.append("artifact")
                details.append(f"artifact: contains privileged verifier content {hit[:60]!r}")
        try:
            cmds = rb.commands()
        except RunbookError as e:
            return Review(False, ["schema"], [f"schema: {e}"], None)
        missing = self._missing([p for c in cmds for p in programs(c)])
        foreign = next((m.group(0) for pat in self._foreign for s in rb.steps
                        for m in [pat.search(s)] if m), None)
        if missing or foreign or len(cmds) > self.max_commands:
            reasons.append("compatibility")
            if missing:
                details.append(f"compatibility: programs not available under the target "
                               f"harness: {missing}")
            if foreign:
                details.append(f"compatibility: asks for a tool the harness lacks: {foreign!r}")
            if len(cmds) > self.max_commands:
                details.append(f"compatibility: {len(cmds)} commands > {self.max_commands}")
        if not reasons and self.model_review is not None:
            ok, why = self.model_review(instruction, text)
            if not ok:
                reasons.append("model")
                details.append(f"model: {why}")
        return Review(not reasons, reasons, details, rb)


def privileged_strings(task, report: dict | None = None) -> tuple[str, ...]:
    """Strings of the protected side: verifier file names and content lines, verifier
    command, check names and messages from a verification report (expected outputs)."""
    out: list[str] = []
    v = task.verifier
    for name, content in dict(v.files).items():
        out.append(str(name))
        text = content.decode("utf-8", "replace") if isinstance(content, bytes) else str(content)
        out += [ln.strip() for ln in text.splitlines() if len(ln.strip()) >= 16]
    if v.command:
        out.append(v.command)
    if v.kind == "builtin" and v.check is not None:  # the check names carry expected values
        try:
            out += [str(c.name) for c in v.check(EmptySnapshot(), no_run)]
        except Exception:  # noqa: BLE001 - a check that needs a real workspace: no names
            pass
    for t in (report or {}).get("tests", []) or []:
        for key in ("name", "message"):
            if t.get(key):
                out.append(str(t[key]))
    return tuple(dict.fromkeys(s for s in out if len(s) >= MIN_PRIVILEGED_CHARS))


def private_pieces(runbook: Runbook, exec_instruction: str = EXEC_INSTRUCTION) -> list[str]:
    """The runbook's private text: the execution instruction, the header line and the
    prose of non-command steps (commands excluded: executing them is the point)."""
    pieces = [exec_instruction] if exec_instruction else []
    pieces.append(f"{HEADER} {runbook.goal}".strip() if runbook.goal else HEADER)
    pieces += [s for s in runbook.steps if not s.startswith(COMMAND_PREFIX.strip())
               and len(s) >= MIN_PROSE_CHARS]
    return pieces


def leak_screen(public_traj, runbook: Runbook, tokenizer, privileged: Sequence[str] = (),
                exec_instruction: str = EXEC_INSTRUCTION) -> list[str]:
    """q_leak: [] if the public view reveals nothing private, else the reasons found."""
    reasons = []
    prefix_parts, gen_parts = [], []
    for t in public_traj.turns:
        prefix_parts.append(safe_decode(tokenizer, t.prompt_ids))
        gen_parts.append(safe_decode(tokenizer, t.sampled_ids))
        gen_parts.append(safe_decode(tokenizer, t.observation_ids))
    prefix, generated = "\n".join(prefix_parts), "\n".join(gen_parts)
    public_text = prefix + "\n" + generated
    instruction_part = prefix  # public instruction and system prompt: allowed to repeat
    for piece in private_pieces(runbook, exec_instruction):
        # a long private piece counts as revealed if any 40-char window of it shows up
        windows = [piece] if len(piece) <= 40 else [piece[i:i + 40] for i in
                                                    range(0, len(piece) - 39, 20)]
        if any(w in public_text for w in windows):
            reasons.append(f"runbook text revealed: {piece[:60]!r}")
    if re.search(r"\brunbook\b", generated, re.IGNORECASE):
        reasons.append("the generated text mentions the runbook")
    for p in privileged:
        if len(p) >= MIN_PRIVILEGED_CHARS and p in generated and p not in instruction_part:
            reasons.append(f"privileged content revealed: {p[:60]!r}")
    return reasons
