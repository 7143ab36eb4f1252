"""Episodes through a terminal session (harness.terminal = "session"): Terminus semantics,
state across turns, C-c, a shell that exits, what the trajectory records, where the
verifier runs."""

import json

import pytest

from terminal_rsi.agent import HarnessConfig, ReferencePolicy, ScriptedPolicy, TerminalReason
from terminal_rsi.agent.harness import (
    SESSION_SYSTEM_PROMPT,
    reference_action,
    run_episode,
    safe_decode,
    session_keystrokes,
)
from terminal_rsi.models.tokenizer import ByteTokenizer
from terminal_rsi.rsr.discovery import executed_commands
from terminal_rsi.tasks import get_suite
from terminal_rsi.tasks.builtin import make_task

TOK = ByteTokenizer()
SESSION = HarnessConfig(max_turns=6, terminal="session")


def _task(family, seed=0):
    return next(iter(get_suite("builtin", "all", families=[family], n_per_family=1,
                               start_seed=seed)))


def _action(*keys, timeout=5.0, done=False):
    return json.dumps({"analysis": "", "commands": [{"keystrokes": k, "timeout": timeout}
                                                    for k in keys], "task_complete": done})


@pytest.mark.parametrize("family", ["create_file", "hint_lookup", "fix_script", "env_repair"])
def test_reference_policy_reaches_success_in_a_session(family):
    task = _task(family)
    traj = run_episode(task, ReferencePolicy(TOK, terminal="session"), harness=SESSION)
    assert traj.terminal_reason == TerminalReason.DECLARED_COMPLETE, traj.error
    assert traj.S == 1 and traj.P == traj.N > 0
    for i, t in enumerate(traj.turns):  # token-in/token-out is unchanged
        assert safe_decode(TOK, t.sampled_ids) == reference_action(task, i, "session")
        typed = [r["typed"] for r in t.io]
        assert typed == [session_keystrokes(c) for c in task.solution[i]]
        assert all(r["done"] for r in t.io)
        for r in t.io:  # what was read is the terminal's echo of what was typed, and more
            assert r["typed"].rstrip("\n") in r["read"]


def test_state_persists_across_turns_and_c_c_interrupts():
    task = _task("create_file")
    name = task.solution[0][0].split("> ")[-1]
    text = task.solution[0][0].split("'")[1]
    script = {
        0: _action("mkdir -p build && cd build && export TRSI_TXT='" + text + "'\n"),
        1: _action("sleep 100\n", timeout=0.5),
        2: _action("C-c", "cd .. && echo \"$TRSI_TXT\" > " + name + "\n", "pwd\n", done=True),
    }
    traj = run_episode(task, ScriptedPolicy(TOK, lambda r: script[r.turn]), harness=SESSION)
    assert traj.terminal_reason == TerminalReason.DECLARED_COMPLETE, traj.error
    obs = [TOK.decode(t.observation_ids, skip_special=True) for t in traj.turns[:-1]]
    assert "still running after 0.5 s" in obs[1] and "C-c" in obs[1]
    assert [r["done"] for r in traj.turns[1].io] == [False]
    last = traj.turns[2].io
    assert last[0]["typed"] == "C-c" and "^C" in last[0]["read"] and last[0]["exit_code"] == 130
    assert last[2]["read"].splitlines()[1].endswith("/workspace")
    # the file was written from the variable exported two turns before
    assert traj.report is not None and traj.P == traj.N == 1


def test_exiting_the_shell_starts_a_new_one_and_the_episode_goes_on():
    task = _task("create_file")
    script = {0: _action("export TRSI_A=1; exit\n"),
              1: _action("echo ${TRSI_A:-gone}\n", done=True)}
    traj = run_episode(task, ScriptedPolicy(TOK, lambda r: script[r.turn]), harness=SESSION)
    assert traj.terminal_reason == TerminalReason.DECLARED_COMPLETE, traj.error
    obs0 = TOK.decode(traj.turns[0].observation_ids, skip_special=True)
    assert "shell exited; a new shell was started" in obs0
    assert "gone" in traj.turns[1].io[0]["read"]


def test_session_prompt_verify_mode_and_validation():
    task = _task("create_file")
    assert SESSION.system_text == SESSION_SYSTEM_PROMPT
    assert HarnessConfig().system_text != SESSION_SYSTEM_PROMPT
    assert HarnessConfig(terminal="session", system_prompt="mine").system_text == "mine"
    # a session episode is verified where its task says (its processes stopped first)
    assert SESSION.verifier_mode(task) == task.verifier.mode == "separate"
    assert HarnessConfig().verifier_mode(task) == "separate"
    assert HarnessConfig(terminal="session", verify_mode="shared").verifier_mode(task) \
        == "shared"
    # a terminal task's checks look at what the agent left: never a fresh sandbox
    term_task = make_task("interrupt_and_redo", 0)
    assert HarnessConfig(terminal="session", verify_mode="separate").verifier_mode(
        term_task) == "shared"
    with pytest.raises(ValueError, match="terminal"):
        HarnessConfig(terminal="tty")
    with pytest.raises(ValueError, match="verify_mode"):
        HarnessConfig(verify_mode="fresh")
    # a session turn's prompt tells the model how to type
    traj = run_episode(task, ReferencePolicy(TOK, terminal="session"), harness=SESSION)
    assert "C-c" in TOK.decode(traj.turns[0].prompt_ids, skip_special=True)


def test_exec_mode_records_io_too():
    task = _task("create_file")
    traj = run_episode(task, ReferencePolicy(TOK), harness=HarnessConfig(max_turns=4))
    assert traj.S == 1
    rec = traj.turns[0].io[0]
    assert rec["typed"] == task.solution[0][0] and rec["exit_code"] == 0 and rec["done"]


def test_rsr_reads_a_session_episodes_commands_from_what_was_typed_and_read():
    task = _task("fix_script")
    exec_traj = run_episode(task, ReferencePolicy(TOK), harness=HarnessConfig(max_turns=6))
    sess_traj = run_episode(task, ReferencePolicy(TOK, terminal="session"), harness=SESSION)
    assert sess_traj.meta["terminal"] == "session" and exec_traj.meta["terminal"] == "exec"
    from_exec = executed_commands(exec_traj, TOK)
    from_session = executed_commands(sess_traj, TOK)
    assert [c.command for c in from_session] == [c.command for c in from_exec]
    for e, s in zip(from_exec, from_session, strict=True):
        if e.exit_code is not None:  # exec mode reads codes from the next observation only
            assert (s.exit_code, s.output) == (e.exit_code, e.output)
    assert from_session[-1].exit_code == 0 and from_session[-1].output == "all ok"
    # a key press is not a command; one still running has no status
    sess_traj.turns[0].io.append({"typed": "C-c", "read": "^C", "done": True, "exit_code": 130})
    sess_traj.turns[0].io.append({"typed": "sleep 9\n", "read": "sleep 9", "done": False,
                                  "exit_code": 0})
    cmds = executed_commands(sess_traj, TOK)
    assert "C-c" not in [c.command for c in cmds]
    slow = next(c for c in cmds if c.command == "sleep 9")
    assert slow.timed_out and slow.exit_code is None and slow.output == ""
