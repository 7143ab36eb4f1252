"""JSON action parsing and observation formatting."""

import random
import time

import pytest

from terminal_rsi.agent.actions import (
    MAX_ACTION_CHARS,
    MAX_COMMAND_TIMEOUT_S,
    MAX_COMMANDS,
    MAX_JSON_DEPTH,
    MAX_KEYSTROKES_BYTES,
    Action,
    ActionParseError,
    Command,
    RejectedCommand,
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


def _cmds(n):
    return '{"commands": [' + ",".join(['"a"'] * n) + "]}"


HOSTILE = [


    ('{"a":' * 50_000 + "1" + "}" * 50_000, f"deeper than {MAX_JSON_DEPTH} levels"),
    ('{"commands": ' + "[" * 50_000 + "]" * 50_000 + "}", "deeper than"),
    ('{"commands": [' * 50_000, "deeper than"),  # unterminated as well
    ('He said "hi. ' + '{"a":' * 50_000 + "1" + "}" * 50_000, "deeper than"),  # odd quote
    ('{"commands": [[[[[[[[[[[[[[[[[["ls"]]]]]]]]]]]]]]]]]]}', "deeper than"),
    (_cmds(200_000), f"holds 200000 commands; an action may hold at most {MAX_COMMANDS}"),
    ('{"commands": [{"keystrokes": "echo a\\u0000b"}]}', "keystrokes holds a NUL"),
    ('{"commands": ["echo \\u0000"]}', "keystrokes holds a NUL"),
    ('{"commands": [{"cmd": "echo \\ud800"}]}', "cmd holds a lone surrogate"),
    ('{"commands": [{"keystrokes": "echo \\udfff x"}]}', "lone surrogate"),
    ('{"analysis": "\\ud800", "commands": []}', "lone surrogate"),
    ('{"commands": [{"keystrokes": "' + "x" * (MAX_KEYSTROKES_BYTES + 1) + '"}]}',
     f"the limit is {MAX_KEYSTROKES_BYTES}"),
    ('{"commands": [{"keystrokes": "ls", "timeout": Infinity}]}', "finite"),
    ('{"commands": [{"keystrokes": "ls", "timeout": 1e400}]}', "finite"),
    ('{"commands": [{"keystrokes": "ls", "timeout": NaN}]}', "finite"),
    ('{"commands": [{"keystrokes": "ls", "duration": -Infinity}]}', "finite"),
    ('{"commands": [{"keystrokes": "ls", "timeout": -0.0}]}', "positive"),
    ('{"commands": [{"keystrokes": "ls", "timeout": 1' + "0" * 5000 + "}]}", "no valid JSON"),
    ("x" * (MAX_ACTION_CHARS + 1), "characters; an action may be at most"),
    ("{" * 1_000_000, "deeper than"),
    ('"\\' * 400_000, "no JSON object"),
]


@pytest.mark.parametrize("text, fragment", HOSTILE, ids=[f"{i}-{f[:24]}" for i, (_, f) in
                                                         enumerate(HOSTILE)])
def test_hostile_replies_raise_only_action_parse_errors_fast(text, fragment):
    t0 = time.monotonic()
    with pytest.raises(ActionParseError, match=fragment.replace("(", r"\(")):
        parse_action(text)
    assert time.monotonic() - t0 < 2


def test_bounds_keep_valid_actions():
    assert len(parse_action(_cmds(MAX_COMMANDS)).commands) == MAX_COMMANDS
    long = "x" * MAX_KEYSTROKES_BYTES
    assert parse_action('{"commands": ["' + long + '"]}').commands[0].keystrokes == long
    nested = '{"analysis": "a {b} [c]", "commands": [{"keystrokes": "awk \'{print $1}\' f"}]}'
    assert parse_action(nested).commands == (Command("awk '{print $1}' f"),)
    assert parse_action('{"commands": ["echo \\ud83d\\ude00"]}').commands[0].keystrokes \
        == "echo \U0001F600"  # a surrogate pair is valid text
    big = parse_action('{"commands": [{"keystrokes": "ls", "timeout": 1' + "0" * 40 + "}]}")
    assert big.commands[0].timeout == MAX_COMMAND_TIMEOUT_S  # clipped, not refused
    with pytest.raises(ActionParseError, match="must be text"):
        parse_action(None)


def test_random_garbage_only_ever_raises_action_parse_errors():
    rng = random.Random(0)
    alphabet = '{}[]":,\\ 0123456789.eE-+tfnaulsrIyNkcmd\x00\ud800'
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 80)))
        if rng.random() < 0.5:
            text = '{"commands": [' + text
        try:
            parse_action(text)
        except ActionParseError:
            pass


def test_a_rejected_command_is_shown_with_its_reason():
    res = [(Command("x" * 500 + "\0", 5), RejectedCommand("command holds a NUL character")),
           (Command("echo hi", 5), ExecResult("hi\n", "", 0))]
    obs = format_observation(res, max_chars=10_000)
    assert "ERROR: command rejected: command holds a NUL character" in obs
    assert "...[301 more]" in obs and "\0" not in obs
    assert obs.endswith("$ echo hi\nhi\n[exit code 0]")
    obs.encode("utf-8")
