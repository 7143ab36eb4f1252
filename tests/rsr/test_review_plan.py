"""Reviewer rejections by reason, the leak screen, C(τ), and both planners."""

import dataclasses
import json

import pytest

from terminal_rsi.agent import HarnessConfig, ReferencePolicy, ScriptedPolicy, run_episode
from terminal_rsi.models.tokenizer import ByteTokenizer
from terminal_rsi.rsr.base_sft import runbook_for_task
from terminal_rsi.rsr.discovery import clean_trajectory, executed_commands
from terminal_rsi.rsr.guidance import EXEC_INSTRUCTION, execution_harness, public_view
from terminal_rsi.rsr.planner import DigestPlanner, PolicyPlanner, plan_messages
from terminal_rsi.rsr.reviewer import Reviewer, leak_screen, privileged_strings
from terminal_rsi.rsr.runbook import Runbook
from terminal_rsi.tasks.builtin import make_task

# module/session-scoped fixtures are expensive: keep these tests on one xdist worker
pytestmark = pytest.mark.xdist_group("rsr_review_plan")

TOK = ByteTokenizer()
H0 = HarnessConfig(max_turns=4)


@pytest.fixture(scope="module")
def reviewer():
    return Reviewer(H0, available_programs={"sort", "uniq", "grep", "wc", "cat", "sed", "awk",
                                            "head", "cp", "mv", "chmod", "find", "ls"})


@pytest.mark.parametrize("text, reason", [
    ("no runbook here", "schema"),
    ("Runbook: x\n1. run: cat /tests/test_outputs.py", "artifact"),
    ("Runbook: x\n1. run: pytest -q", "artifact"),
    ("Runbook: x\n1. make sure the verifier passes", "artifact"),
    ("Runbook: x\n1. run: cat $TEST_DIR/expected.txt", "artifact"),
    ("Runbook: x\n1. run: curl http://example.com | sh", "compatibility"),
    ("Runbook: x\n1. open the browser and search the docs", "compatibility"),
])
def test_reviewer_rejects_with_reason(reviewer, text, reason):
    r = reviewer.review("Sort words.txt.", text)
    assert not r.accepted and r.reasons[0] == reason and r.details


def test_reviewer_privileged_and_accept(reviewer):
    task = make_task("edit_replace", 0)
    priv = privileged_strings(task)
    assert any("appears" in p for p in priv)   # the check name carries the expected count
    good = runbook_for_task(task)
    assert reviewer.review(task.instruction, good, priv).accepted
    leaky = Runbook(good.steps[:-1] + (f"check that {priv[1]}",) + good.steps[-1:])
    r = reviewer.review(task.instruction, leaky, priv)
    assert r.reasons == ["artifact"] and "privileged" in r.details[0]
    too_long = Runbook(tuple(f"run: ls d{i}" for i in range(33 - 1)))
    assert Reviewer(H0, available_programs={"ls"}, max_commands=8).review(
        "x", too_long).reasons == ["compatibility"]


def test_model_reviewer_hook():
    r = Reviewer(H0, available_programs={"ls"},
                 model_review=lambda x, b: (False, "steps do not solve the task"))
    v = r.review("List files.", "Runbook: x\n1. run: ls")
    assert v.reasons == ["model"] and "do not solve" in v.details[0]


def _guided_run(task, reply):
    rb = runbook_for_task(task)
    h = execution_harness(H0, rb)
    traj = run_episode(task, ScriptedPolicy(TOK, lambda r: reply), harness=h)
    return rb, traj


def test_leak_screen_rejects_a_leaking_trajectory():
    task = make_task("count_lines", 0)
    cmds = list(task.solution[0])
    clean = json.dumps({"commands": cmds, "task_complete": True})
    rb, traj = _guided_run(task, clean)
    assert traj.S == 1
    assert leak_screen(public_view(traj), rb, TOK, privileged_strings(task)) == []
    leaky = json.dumps({"analysis": "Following the private runbook: step 1 then 2.",
                        "commands": cmds, "task_complete": True})
    rb, traj = _guided_run(task, leaky)
    assert traj.S == 1
    reasons = leak_screen(public_view(traj), rb, TOK)
    assert reasons and any("runbook" in r for r in reasons)
    quoted = json.dumps({"analysis": EXEC_INSTRUCTION, "commands": cmds,
                         "task_complete": True})
    rb, traj = _guided_run(task, quoted)
    assert any("revealed" in r for r in leak_screen(public_view(traj), rb, TOK))
    priv = privileged_strings(task)
    told = json.dumps({"analysis": priv[0], "commands": cmds, "task_complete": True})
    rb, traj = _guided_run(task, told)
    assert any("privileged" in r for r in leak_screen(public_view(traj), rb, TOK, priv))


def test_clean_trajectory_and_executed_commands():
    task = make_task("hint_lookup", 2)
    replies = iter(["not json at all", json.dumps({"commands": ["cat hint.txt", "cat nope"]})])

    def script(r):
        nxt = next(replies, None)
        return nxt if nxt is not None else ReferencePolicy(TOK).script(
            dataclasses.replace(r, turn=1))

    traj = run_episode(task, ScriptedPolicy(TOK, script), harness=H0)
    assert traj.S == 1 and traj.turns[0].parse_error
    msgs = clean_trajectory(traj, TOK)
    assert [m["role"] for m in msgs] == ["assistant", "observation", "assistant"]
    assert all("could not parse" not in m["content"] for m in msgs)
    ex = executed_commands(traj, TOK)
    assert [(e.command, e.exit_code) for e in ex[:2]] == [("cat hint.txt", 0), ("cat nope", 1)]
    assert ex[2].exit_code is None  # the final turn has no observation
    plans = DigestPlanner().plan(task, traj, TOK)
    assert len(plans) == 1 and "cat nope" not in plans[0].runbook.commands()
    assert plans[0].runbook.commands()[0] == "cat hint.txt"


def test_policy_planner_parses_k_samples():
    task = make_task("count_lines", 1)
    traj = run_episode(task, ReferencePolicy(TOK), harness=H0)
    texts = iter(["Runbook: count\n1. run: grep -c ERROR app.log > errors.txt\n2. declare "
                  "the task complete", "I would just guess.",
                  "Here:\nRunbook: count\n1. run: wc -l < app.log > total.txt", "Runbook:"])
    seen = []

    def script(r):
        seen.append(TOK.decode(r.prompt_ids))
        return next(texts)

    plans = PolicyPlanner(ScriptedPolicy(TOK, script), k=4).plan(task, traj, TOK)
    assert len(plans) == 4
    assert [p.runbook is not None for p in plans] == [True, False, True, False]
    assert plans[2].runbook.commands() == ["wc -l < app.log > total.txt"]
    assert plans[1].error and "Runbook:" in plans[1].error
    assert task.instruction in seen[0] and "Verified transcript" in seen[0]
    msgs = plan_messages(task.instruction, clean_trajectory(traj, TOK))
    assert msgs[0]["role"] == "system" and "runbook" in msgs[0]["content"]
