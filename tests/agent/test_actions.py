"""JSON action parsing and observation formatting."""

import pytest

from terminal_rsi.agent.actions import (
    Action,
    ActionParseError,
    Command,
    cap_text,
    format_observation,
    parse_action,
)
from terminal_rsi.sandbox import ExecResult


def test_parse_full_action_with_prose_and_fence():
    text = ('Let me look.\n```json\n{"analysis": "list", "commands": [{"keystrokes": "ls -la", '
            '"timeout": 5}, {"cmd": "pwd"}], "task_complete": false}\n```')
    a = parse_action(text)
    assert a == Action("list", (Command("ls -la", 5.0), Command("pwd", 30.0)), False)


def test_roundtrip_to_json():
    a = Action("x", (Command("echo hi", 2.5),), True)
    assert parse_action(a.to_json()) == a


def test_defaults_and_string_commands():
    assert parse_action('{"task_complete": true}') == Action("", (), True)
    assert parse_action('{"commands": ["ls"]}').commands == (Command("ls"),)


def test_skips_braces_that_are_not_json():
    a = parse_action('I think {this} is wrong. {"commands": [{"keystrokes": "ls"}]}')
    assert a.commands == (Command("ls"),)


@pytest.mark.parametrize("text, fragment", [
    ("no json here", "no JSON object"),
    ('{"commands": [1', "no valid JSON"),
    ('{"commands": [{"keystrokes": "ls"}, {"keystrokes": "pwd"', "no valid JSON"),
    ('{"commands": "ls"}', '"commands" must be a list'),
    ('{"task_complete": "yes"}', "task_complete"),
    ('{"commands": [{"keystrokes": "ls", "timeout": -1}]}', "positive"),
    ('{"commands": [{"keystrokes": "ls", "timeout": true}]}', "positive"),
    ('{"commands": [{"timeout": 3}]}', "keystrokes"),
    ('{"commands": [{"keystrokes": "a", "cmd": "b"}]}', "exactly one"),
    ('{"action": "ls"}', "unknown field"),
    ('{"analysis": 3}', "analysis"),
])
def test_malformed_actions_raise_typed_errors(text, fragment):
    with pytest.raises(ActionParseError, match=fragment):
        parse_action(text)


def test_cap_text_keeps_head_and_tail():
    text = "".join(chr(ord("a") + i % 26) for i in range(1000))
    out = cap_text(text, 100)
    assert out.startswith(text[:50]) and out.endswith(text[-50:])
    assert "[900 characters truncated]" in out
    assert cap_text("short", 100) == "short"
    with pytest.raises(ValueError):
        cap_text("x", 0)


def test_format_observation():
    res = [(Command("echo hi", 5), ExecResult("hi\n", "", 0)),
           (Command("sleep 9", 1), ExecResult("", "", -9, timed_out=True)),
           (Command("false", 5), ExecResult("", "oops\n", 1))]
    obs = format_observation(res, max_chars=10_000, note="NOTE")
    assert obs == ("NOTE\n$ echo hi\nhi\n[exit code 0]\n$ sleep 9\n[timed out after 1 s]\n"
                   "$ false\noops\n[exit code 1]")
    assert format_observation([], max_chars=100) == "(no commands were run)"
    big = [(Command("cat f", 5), ExecResult("x" * 5000 + "END", "", 0))]
    capped = format_observation(big, max_chars=200)
    assert capped.startswith("$ cat f") and capped.endswith("END\n[exit code 0]")
    assert len(capped) < 260
