"""Action formats (terminal_rsi.agent.formats): Terminus JSON, Terminus XML and a fenced bash
block; each parses what it renders, names what is wrong in a reply, raises nothing but
ActionParseError, and drives a real episode to success."""

import json
import random

import pytest

from terminal_rsi.agent import HarnessConfig, ReferencePolicy, ScriptedPolicy, TerminalReason
from terminal_rsi.agent.actions import (
    DEFAULT_COMMAND_TIMEOUT_S,
    MAX_ACTION_CHARS,
    MAX_COMMANDS,
    Action,
    ActionParseError,
    Command,
)
from terminal_rsi.agent.formats import COMPLETE_LINE, FORMATS, SHORT_SYSTEM_PROMPT, get_format
from terminal_rsi.agent.harness import (
    DEFAULT_SYSTEM_PROMPT,
    reference_action,
    reference_step,
    run_episode,
    safe_decode,
)
from terminal_rsi.config.sections import ACTION_FORMATS, TERMINALS
from terminal_rsi.models.tokenizer import ByteTokenizer
from terminal_rsi.rsr.discovery import executed_commands
from terminal_rsi.tasks import get_suite

TOK = ByteTokenizer()
XML, BASH = get_format("xml"), get_format("bash")


def _typed(action: Action) -> str:
    """What an action types / runs, as one text (bash joins a reply's commands)."""
    return "".join(c.keystrokes.removesuffix("\n") + "\n" for c in action.commands)


def _tasks():
    return (list(get_suite("builtin", "all", n_per_family=2))
            + list(get_suite("terminal", "all", n_per_family=2)))


def test_the_registry_matches_the_config_choices():
    assert tuple(FORMATS) == ACTION_FORMATS
    with pytest.raises(ValueError, match="unknown action format 'yaml'"):
        get_format("yaml")
    with pytest.raises(ValueError, match="action_format = 'yaml' is not allowed; expected str, "
                       "one of 'json', 'xml', 'bash'"):
        HarnessConfig(action_format="yaml")


@pytest.mark.parametrize("name", ACTION_FORMATS)
@pytest.mark.parametrize("terminal", TERMINALS)
@pytest.mark.parametrize("compact", [False, True])
def test_parse_gives_back_what_render_wrote(name, terminal, compact):
    fmt = get_format(name)
    for task in _tasks():
        for turn in range(len(task.solution) + 1):
            step = reference_step(task, turn, terminal)
            got = fmt.parse(fmt.render(step, terminal, compact), terminal)
            assert got.task_complete == step.task_complete
            assert _typed(got) == _typed(step), (name, task.id, turn)
            if name != "bash":  # bash runs a block as one script, or types it as one text
                assert [c.keystrokes for c in got.commands] == [
                    c.keystrokes for c in step.commands]
            if not compact and name != "bash":
                assert [c.timeout for c in got.commands] == [c.timeout for c in step.commands]
                assert got.analysis == step.analysis


def test_json_is_the_default_and_its_demonstrations_are_unchanged():
    task = next(iter(get_suite("builtin", "train", families=["create_file"], n_per_family=1)))
    cmd = task.solution[0][0]
    assert reference_action(task, 0, compact=True) == json.dumps(
        {"commands": [cmd], "task_complete": True}, separators=(",", ":"))
    assert json.loads(reference_action(task, 0)) == {
        "analysis": "reference step 1 of 1", "task_complete": True,
        "commands": [{"keystrokes": cmd, "timeout": 120.0}]}
    assert HarnessConfig().system_text == DEFAULT_SYSTEM_PROMPT
    # Terminus JSON's plan field and duration alias are accepted
    a = get_format("json").parse('{"analysis": "a", "plan": "p", "commands": '
                                 '[{"keystrokes": "ls\\n", "duration": 0.5}]}')
    assert (a.plan, a.commands) == ("p", (Command("ls\n", 0.5),))


def test_each_format_has_its_own_default_system_prompt():
    for name in ACTION_FORMATS:
        for terminal in TERMINALS:
            text = HarnessConfig(action_format=name, terminal=terminal).system_text
            assert text == get_format(name).system_prompt(terminal)
    assert "<response>" in HarnessConfig(action_format="xml").system_text
    assert COMPLETE_LINE in HarnessConfig(action_format="bash").system_text
    assert "C-c" in HarnessConfig(action_format="bash", terminal="session").system_text
    own = HarnessConfig(action_format="xml", system_prompt="mine")
    assert own.system_text == "mine"


# ----------------------------------------------------------------------------- xml


def test_xml_keystrokes_are_verbatim_with_their_durations():
    reply = ('Sure.\n<response>\n<analysis>look</analysis>\n<plan>list, then grep</plan>\n'
             '<commands>\n<keystrokes duration="0.5">ls -la && echo "<b>&amp;"\n</keystrokes>\n'
             '<keystrokes>C-c</keystrokes>\n</commands>\n'
             '<task_complete> TRUE </task_complete>\n</response>\ntrailing')
    a = XML.parse(reply, "session")
    assert a == Action("look", (Command('ls -la && echo "<b>&amp;"\n', 0.5),
                                Command("C-c", DEFAULT_COMMAND_TIMEOUT_S)), True,
                       plan="list, then grep")
    empty = XML.parse("<response><analysis>thinking</analysis></response>")
    assert empty == Action("thinking", (), False)


@pytest.mark.parametrize(("reply", "fragment"), [
    ("I will run ls", "no <response> element"),
    ("<response><commands></commands>", "not closed with </response>"),
    ("<response><commands>ls</commands></response>", "text outside a <keystrokes>"),
    ("<response><commands><keystrokes>ls</commands></response>", "not closed with </keys"),
    ('<response><commands><keystrokes wait="1">ls</keystrokes></commands></response>',
     "unknown attribute(s) ['wait']"),
    ('<response><commands><keystrokes duration="-1">ls</keystrokes></commands></response>',
     "#1 duration must be a positive"),
    ('<response><commands><keystrokes duration="soon">ls</keystrokes></commands></response>',
     "got 'soon'"),
    ('<response><commands><keystrokes duration="nan">ls</keystrokes></commands></response>',
     "got 'nan'"),
    ("<response><task_complete>yes</task_complete></response>", "must hold true or false"),
    ("<response><plan>a</plan><plan>b</plan></response>", "<plan> appears 2 times"),
    ("<response><analysis>a</response>", "<analysis> is not closed"),
    ("<response><commands><keystrokes>a\0b</keystrokes></commands></response>", "NUL"),
])
def test_xml_errors_name_what_is_wrong(reply, fragment):
    with pytest.raises(ActionParseError, match="<response>") as e:
        XML.parse(reply)
    assert fragment in str(e.value)


def test_xml_bounds():
    many = "".join("<keystrokes>ls</keystrokes>" for _ in range(MAX_COMMANDS + 1))
    with pytest.raises(ActionParseError, match=f"at most {MAX_COMMANDS}"):
        XML.parse(f"<response><commands>{many}</commands></response>")
    with pytest.raises(ActionParseError, match="characters; an action may be at most"):
        XML.parse("<response>" + "x" * MAX_ACTION_CHARS + "</response>")
    with pytest.raises(ActionParseError, match="must be text"):
        XML.parse(None)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- bash


def test_bash_block_runs_as_one_script_or_is_typed_line_by_line():
    reply = ("First I list, then count.\n```bash\ncd tree\nls | wc -l > ../n.txt\n```\n"
             f"{COMPLETE_LINE}\n")
    a = BASH.parse(reply, "exec")
    assert a == Action("First I list, then count.",
                       (Command("cd tree\nls | wc -l > ../n.txt", DEFAULT_COMMAND_TIMEOUT_S),),
                       True)
    s = BASH.parse("```sh\nsleep 100\nC-c\necho done\n```", "session")
    assert [c.keystrokes for c in s.commands] == ["sleep 100\n", "C-c", "echo done\n"]
    assert not s.task_complete
    assert BASH.parse(f"All done.\n{COMPLETE_LINE}") == Action("All done.", (), True)
    # the completion line inside the block is a command, not a declaration
    inside = BASH.parse(f"```\necho hi\n{COMPLETE_LINE}\n```")
    assert not inside.task_complete and len(inside.commands) == 1


@pytest.mark.parametrize(("reply", "fragment"), [
    ("I would run ls.", "no ```bash block and no TASK COMPLETE line"),
    ("```bash\nls\n", "is not closed"),
    ("```bash\nls\n```\n```bash\npwd\n```", "holds 2 code blocks"),
    ("```python\nprint(1)\n```", "marked 'python'"),
    ("```bash\nls\n```bash", "closes the block must hold nothing else"),
    ("```bash\nls\0\n```", "NUL"),
])
def test_bash_errors_name_what_is_wrong(reply, fragment):
    with pytest.raises(ActionParseError, match="exactly one fenced code block") as e:
        BASH.parse(reply)
    assert fragment in str(e.value)


def test_bash_session_bounds():
    block = "\n".join(["C-c"] * (MAX_COMMANDS + 1))
    with pytest.raises(ActionParseError, match=f"at most {MAX_COMMANDS}"):
        BASH.parse(f"```bash\n{block}\n```", "session")


@pytest.mark.parametrize("name", ACTION_FORMATS)
def test_random_garbage_only_ever_raises_action_parse_errors(name):
    fmt = get_format(name)
    rng = random.Random(1)
    pieces = ["<response>", "</response>", "<commands>", "</commands>", "<keystrokes",
              ' duration="', "</keystrokes>", ">", "```", "```bash\n", "\n", COMPLETE_LINE,
              "<task_complete>", "true", "{", '"commands"', ":", "[", "]", "}", "\0", "\ud800",
              "x", "&amp;", "C-c"]
    for _ in range(2000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        for terminal in TERMINALS:
            try:
                a = fmt.parse(text, terminal)
            except ActionParseError:
                continue
            assert isinstance(a, Action)


# ----------------------------------------------------------------------------- episodes


@pytest.mark.parametrize("name", ["xml", "bash"])
@pytest.mark.parametrize("family", ["create_file", "hint_lookup"])
def test_reference_episodes_succeed_in_every_format(name, family):
    task = next(iter(get_suite("builtin", "train", families=[family], n_per_family=1)))
    h = HarnessConfig(max_turns=4, action_format=name)
    traj = run_episode(task, ReferencePolicy(TOK, action_format=name), harness=h)
    assert traj.terminal_reason == TerminalReason.DECLARED_COMPLETE, traj.error
    assert traj.S == 1 and traj.meta["action_format"] == name
    prompt = safe_decode(TOK, traj.turns[0].prompt_ids)
    assert get_format(name).system_prompt("exec") in prompt
    # RSR reads back what ran, in the trajectory's format (bash: one script per reply)
    ran = [c.command for c in executed_commands(traj, TOK)]
    want = ([c for turn in task.solution for c in turn] if name == "xml"
            else ["\n".join(turn) for turn in task.solution])
    assert ran == want
    codes = [c.exit_code for c in executed_commands(traj, TOK)]
    assert all(c == 0 for c in codes[:-len(task.solution[-1])] if c is not None)


def test_a_session_episode_in_bash_presses_keys_and_keeps_state():
    task = next(iter(get_suite("terminal", "all", families=["interrupt_and_redo"],
                               n_per_family=1)))
    h = HarnessConfig(max_turns=4, action_format="bash", terminal="session")
    traj = run_episode(task, ReferencePolicy(TOK, terminal="session", action_format="bash"),
                       harness=h)
    assert traj.terminal_reason == TerminalReason.DECLARED_COMPLETE, traj.error
    assert traj.S == 1, traj.report
    assert "C-c" in [r["typed"] for t in traj.turns for r in t.io]


def test_a_reply_in_the_wrong_format_is_shown_the_format_it_needs():
    task = next(iter(get_suite("builtin", "train", families=["create_file"], n_per_family=1)))
    json_reply = reference_action(task, 0)
    h = HarnessConfig(max_turns=2, action_format="xml")
    traj = run_episode(task, ScriptedPolicy(TOK, lambda r: json_reply), harness=h)
    assert traj.S == 0 and traj.turns[0].parse_error
    assert "no <response> element" in traj.turns[0].parse_error
    shown = safe_decode(TOK, traj.turns[0].observation_ids)
    assert "<keystrokes" in shown  # the schema comes with the error


@pytest.mark.parametrize("name", ACTION_FORMATS)
@pytest.mark.parametrize("terminal", ["exec", "session"])
def test_the_json_prompts_become_the_harness_formats_own(name, terminal):
    fmt = get_format(name)
    short = HarnessConfig(system_prompt=SHORT_SYSTEM_PROMPT, action_format=name,
                          terminal=terminal)
    assert short.system_text == fmt.short_prompt(terminal)
    long = HarnessConfig(system_prompt=DEFAULT_SYSTEM_PROMPT, action_format=name,
                         terminal=terminal)
    assert long.system_text == fmt.system_prompt(terminal)
    own = HarnessConfig(system_prompt="Use ls.", action_format=name, terminal=terminal)
    assert own.system_text == "Use ls."
