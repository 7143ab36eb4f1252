"""Runbook text round trip and validation, the digest planner, private guidance and P(τ̃)."""

import json

import pytest

from terminal_rsi.agent import HarnessConfig, ReferencePolicy, run_episode
from terminal_rsi.agent.formats import get_format
from terminal_rsi.models.tokenizer import ByteTokenizer
from terminal_rsi.rsr.guidance import (
    GuidanceError,
    execution_harness,
    guidance_text,
    public_view,
)
from terminal_rsi.rsr.runbook import (
    ExecutedCommand,
    Runbook,
    RunbookError,
    digest_plan,
    digest_runbook,
    is_read_only,
    programs,
)
from terminal_rsi.tasks.builtin import make_task

TOK = ByteTokenizer()


def test_round_trip_and_tolerant_parse():
    rb = Runbook(("run: sort -u words.txt > sorted.txt", Runbook.command_step("a\nb"),
                  "declare the task complete"), goal="sort")
    text = rb.to_text()
    assert text.splitlines()[0] == "Runbook: sort"
    assert Runbook.parse(text) == rb
    assert Runbook.parse("Sure, here it is.\n" + text + "\n\nHope this helps.") == rb
    assert rb.commands() == ["sort -u words.txt > sorted.txt", "a\nb"]


@pytest.mark.parametrize("text, msg", [
    ("1. ls", "no 'Runbook:'"),
    ("Runbook: x\nnothing numbered", "no numbered step"),
    ("Runbook: x\n1. ls\n3. pwd", "1..n"),
    ("Runbook: x\n1. run: ", "without a command"),
])
def test_parse_errors(text, msg):
    with pytest.raises(RunbookError, match=msg):
        Runbook.parse(text)


def test_validation():
    with pytest.raises(RunbookError, match="at least one"):
        Runbook(())
    with pytest.raises(RunbookError, match="one line"):
        Runbook(("a\nb",))
    with pytest.raises(RunbookError, match="at most"):
        Runbook(tuple(f"step {i}" for i in range(40)))


def test_programs_and_read_only():
    assert programs("FOO=1 sort a | uniq -c && cat x; sudo ls") == ["sort", "uniq", "cat", "ls"]
    assert is_read_only("cat a.txt | sort") and is_read_only("ls 2>/dev/null")
    assert not is_read_only("sort a > b") and not is_read_only("sed -i s/a/b/ f")
    assert not is_read_only("rm -f a")


def test_digest_drops_failed_and_redundant_steps():
    cmds = [
        ExecutedCommand("ls", 0, "notes.txt"),                       # output unused later
        ExecutedCommand("cat hint.txt", 0, "the key is in lemon.dat"),  # used: lemon.dat
        ExecutedCommand("cat missing.txt", 1, "No such file"),       # failed
        ExecutedCommand("cp vault/lemon.dat key.txt", 0, ""),
        ExecutedCommand("cp vault/lemon.dat key.txt", 0, ""),        # idempotent repeat
        ExecutedCommand("sleep 100", None, "", timed_out=True),      # timed out
        ExecutedCommand("echo x >> log.txt", 0, ""),
        ExecutedCommand("echo x >> log.txt", 0, ""),                 # append: not redundant
    ]
    kept, dropped = digest_plan("Copy the key file to key.txt.", cmds)
    assert [c.command for c in kept] == ["cat hint.txt", "cp vault/lemon.dat key.txt",
                                         "echo x >> log.txt", "echo x >> log.txt"]
    assert dropped == {"failed": 2, "duplicate": 1, "unused_inspection": 1}
    rb = digest_runbook("Copy the key file to key.txt.", cmds)
    assert rb.steps[-1] == "declare the task complete"
    assert rb.commands() == [c.command for c in kept]
    with pytest.raises(RunbookError, match="no successful"):
        digest_runbook("x", [("false", 1)])


def _guided(task, turns=4):
    rb = digest_runbook(task.instruction, [c for t in task.solution for c in t])
    h = execution_harness(HarnessConfig(max_turns=turns), rb)
    return rb, h, run_episode(task, ReferencePolicy(TOK), harness=h)


def test_guidance_in_prompt_and_public_view_removes_it():
    task = make_task("hint_lookup", 1)
    rb, h, traj = _guided(task)
    assert traj.S == 1 and h.name == "json-linear+guidance"
    guided = TOK.decode(traj.turns[0].prompt_ids)
    assert rb.to_text() in guided and guidance_text(rb) in guided
    pub = public_view(traj)
    plain = run_episode(task, ReferencePolicy(TOK), harness=HarnessConfig(max_turns=4))
    # the public prefix is exactly the H0 prompt; generated ids and logprobs as sampled
    assert pub.turns[0].prompt_ids == plain.turns[0].prompt_ids
    assert "Runbook" not in TOK.decode(pub.turns[0].prompt_ids)
    for a, b in zip(pub.turns, traj.turns, strict=True):
        assert a.sampled_ids == b.sampled_ids and a.logprobs == b.logprobs
        assert a.observation_ids == b.observation_ids
    assert pub.harness == "json-linear" and "public_prompt_ids" not in pub.meta
    assert pub.S == 1 and pub.prompt_at(1)[:len(pub.turns[0].prompt_ids)] == \
        pub.turns[0].prompt_ids
    with pytest.raises(GuidanceError, match="already carries"):
        execution_harness(h, rb)


@pytest.mark.parametrize("fmt", ["json", "xml", "bash"])
def test_guidance_writes_multiline_commands_as_the_format_does(fmt):
    """JSON replies quote a multi-line command, bash blocks and XML keystrokes hold its lines:
    the runbook in the guidance shows it the same way (a model handed the JSON string in the
    bash format copied the escape `\\n` into its script)."""
    cmd = "grep -c ERROR app.log > errors.txt\nwc -l < app.log > total.txt"
    rb = digest_runbook("count", [cmd, "ls out"])
    g = execution_harness(HarnessConfig(action_format=fmt), rb).private_guidance
    assert g == guidance_text(rb, action_format=fmt)
    if fmt == "json":
        assert f"1. run: {json.dumps(cmd)}\n2. run: ls out" in g and "```" not in g
        assert Runbook.parse(g) == rb
        return
    block = f"```\n{cmd}\n```"
    assert f"1. run:\n{block}\n2. run: ls out\n3. declare the task complete" in g
    assert "\\n" not in g
    if fmt == "bash":  # the block, copied into a reply, runs the command as recorded
        assert get_format("bash").parse(block).commands[0].keystrokes == cmd
    one_line = digest_runbook("count", ["ls out"])
    assert one_line.to_guidance(literal_commands=True) == one_line.to_text()


def test_public_view_needs_recorded_prompts():
    task = make_task("create_file", 0)
    _, _, traj = _guided(task)
    traj.meta.pop("public_prompt_ids")
    with pytest.raises(GuidanceError, match="no public prompt"):
        public_view(traj)
    plain = run_episode(task, ReferencePolicy(TOK), harness=HarnessConfig(max_turns=2))
    assert public_view(plain).turns[0].prompt_ids == plain.turns[0].prompt_ids
