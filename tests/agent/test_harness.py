"""Episodes through the full harness: reference solutions reach S = 1, malformed actions,
budgets (max turns, context overflow, agent timeout), summarization segments, failures."""

import numpy as np
import pytest

from terminal_rsi.agent import (
    HarnessConfig,
    ReferencePolicy,
    SamplingSettings,
    ScriptedPolicy,
    TerminalReason,
    pack_trajectories,
)
from terminal_rsi.agent.harness import reference_action, run_episode
from terminal_rsi.config.sections import Harness, NucleusHarness
from terminal_rsi.evaluation.config import EvalHarness
from terminal_rsi.experiments.rollouts import RolloutsHarness
from terminal_rsi.models.bpe import tiny_bpe
from terminal_rsi.models.sampling import Buckets
from terminal_rsi.models.tokenizer import ByteTokenizer
from terminal_rsi.rewards import EpisodeScorer
from terminal_rsi.rsr.config import TargetHarness
from terminal_rsi.sandbox import BadRequest, InfrastructureError, SandboxLost
from terminal_rsi.settings import SettingError, shared_section, specs
from terminal_rsi.tasks import get_suite, open_task_sandbox

TOK = ByteTokenizer()
BUCKETS = Buckets(prefill_chunk=64, cache_multiple=64, batch_multiple=1, power_of_two=False)


def _task(family, seed=0):
    split = "train"
    return next(iter(get_suite("builtin", split, families=[family], n_per_family=1,
                               start_seed=seed)))


@pytest.mark.parametrize("family,tokenizer", [
    ("create_file", "byte"), ("hint_lookup", "byte"), ("fix_script", "byte"),
    ("hint_lookup", "bpe")])  # the tiny model's BPE vocabulary (model.tokenizer = "bpe")
def test_reference_policy_reaches_success(family, tokenizer):
    task = _task(family)
    if tokenizer == "bpe":
        pytest.importorskip("tokenizers")
    tok = tiny_bpe() if tokenizer == "bpe" else TOK
    traj = run_episode(task, ReferencePolicy(tok), harness=HarnessConfig(max_turns=6))
    assert traj.terminal_reason == TerminalReason.DECLARED_COMPLETE, traj.error
    assert traj.S == 1 and traj.P == traj.N > 0
    # the harness records the report and does not score; the stage's scorer does
    assert (traj.reward, traj.reward_fn) == (0.0, "")
    assert EpisodeScorer("fdr")(traj) > 0 and traj.reward_fn == "fdr"
    assert len(traj.turns) == len(task.solution) == traj.declared_complete_turn + 1
    assert traj.report["valid"] and traj.report["strict_success"]
    # token-in/token-out: every turn's sampled ids decode to the action it took
    for i, t in enumerate(traj.turns):
        assert tok.decode(t.sampled_ids, skip_special=True) == reference_action(task, i)
        assert t.sampled_ids[-1] in tok.stop_ids and t.parse_error is None
    assert traj.turns[-1].observation_ids == []
    for i in range(len(traj.turns) - 1):  # observations are rendered observation messages
        obs = traj.turns[i].observation_ids
        assert obs[0] == tok.role_id("observation") and obs[-1] == tok.special_ids[
            "<|assistant|>"]
    batch = pack_trajectories([traj], buckets=BUCKETS)
    assert batch.dones.sum() == 1 and np.isclose(batch.rewards.sum(), traj.reward)


def test_malformed_action_is_an_observation_and_the_episode_goes_on():
    task = _task("create_file")

    def script(r):
        return "I will not answer in JSON" if r.turn == 0 else reference_action(task, r.turn - 1)

    traj = run_episode(task, ScriptedPolicy(TOK, script), harness=HarnessConfig(max_turns=4))
    assert traj.turns[0].parse_error and "no JSON object" in traj.turns[0].parse_error
    obs = TOK.decode(traj.turns[0].observation_ids, skip_special=True)
    assert "could not parse your reply" in obs
    assert traj.terminal_reason == TerminalReason.DECLARED_COMPLETE and traj.S == 1
    assert traj.declared_complete_turn == 1


@pytest.mark.parametrize("limit", [1, 2])
def test_max_parse_errors_ends_the_episode_and_it_is_verified(limit):
    task = _task("create_file")
    # turns alternate: unparseable, a parseable no-op, unparseable, ... (errors need not be
    # consecutive to count)
    pol = ScriptedPolicy(TOK, lambda r: "not JSON" if r.turn % 2 == 0
                         else '{"commands": [{"keystrokes": "true"}]}')
    traj = run_episode(task, pol, harness=HarnessConfig(max_turns=6, max_parse_errors=limit))
    assert traj.terminal_reason == TerminalReason.PARSE_ERRORS
    assert len(traj.turns) == 2 * limit - 1
    assert [bool(t.parse_error) for t in traj.turns].count(True) == limit
    assert traj.turns[-1].observation_ids == []  # no error observation after the last turn
    assert traj.S == 0 and traj.report is not None
    batch = pack_trajectories([traj], buckets=BUCKETS)
    assert batch.dones.sum() == 1  # keep_reward, like max_turns


def test_without_max_parse_errors_the_turn_budget_ends_the_episode():
    pol = ScriptedPolicy(TOK, lambda r: "not JSON")
    traj = run_episode(_task("create_file"), pol, harness=HarnessConfig(max_turns=3))
    assert traj.terminal_reason == TerminalReason.MAX_TURNS and len(traj.turns) == 3
    with pytest.raises(ValueError, match="max_parse_errors"):
        HarnessConfig(max_parse_errors=0)


def test_harness_from_config_section():
    """A stage's typed harness section reaches the runtime harness whole: every setting of
    the section class it shares with HarnessConfig (by inheritance, never by matching
    names); the stage's own fields stay behind unless the stage passes them on."""
    section = EvalHarness(max_turns=3, max_output_tokens=64, max_input_tokens=512,
                          summarize_threshold=None, temperature=0.6, top_p=0.9,
                          max_observation_chars=300, max_parse_errors=1)
    h = HarnessConfig.from_config(section, name="eval")
    assert (h.name, h.max_turns, h.max_output_tokens, h.max_input_tokens) == ("eval", 3, 64, 512)
    assert h.summarize_threshold is None and h.agent_timeout_s is None
    assert h.max_observation_chars == 300 and h.max_parse_errors == 1
    assert h.sampling == SamplingSettings(temperature=0.6, top_p=0.9, top_k=0)
    assert h.system_prompt is None and h.system_text == HarnessConfig().system_text
    h2 = HarnessConfig.from_config(section.replace(system_prompt="Be brief."), max_turns=1)
    assert h2.system_prompt == "Be brief." and h2.max_turns == 1
    # a stage's own setting (rsr's action_style) is the stage's; top_p is not in its section
    target = HarnessConfig.from_config(TargetHarness(action_style="full", temperature=0.5))
    assert target.temperature == 0.5 and target.top_p == 1.0
    assert not hasattr(target, "action_style")
    # a plain mapping passes every key: one HarnessConfig lacks is an error, never dropped
    assert HarnessConfig.from_config({"max_turns": 2}).max_observation_chars == 8000
    with pytest.raises(SettingError, match="no setting 'action_style'"):
        HarnessConfig.from_config({"max_turns": 2, "action_style": "compact"})
    with pytest.raises(SettingError, match="HarnessConfig.max_turns = 0"):
        HarnessConfig.from_config(TargetHarness(), max_turns=0)


def test_every_harness_setting_has_one_class_and_one_default():
    """The runtime harness is the config's harness section plus runtime-only fields: it
    redeclares none of the section's settings (so their defaults, bounds and docs are the
    section's), and every setting a stage's harness section shares with it flows."""
    shared = specs(NucleusHarness)
    assert not set(vars(HarnessConfig)["__annotations__"]) & set(shared)  # none redeclared
    assert all(specs(HarnessConfig)[k] == v for k, v in shared.items())
    assert {k: getattr(HarnessConfig(), k) for k in shared} == dict(NucleusHarness())
    # the paper's harness is the default a library user gets
    h = HarnessConfig()
    assert (h.max_turns, h.max_output_tokens, h.max_input_tokens, h.summarize_threshold) == \
        (32, 8192, 96000, 32000)
    for cls in (Harness, TargetHarness, EvalHarness, RolloutsHarness):
        base = shared_section(HarnessConfig, cls)
        changed = _changed_values(base)
        h = HarnessConfig.from_config(cls(**changed))
        assert {k: getattr(h, k) for k in changed} == changed, cls.__name__


def _changed_values(cls) -> dict:
    """A value other than the default for every setting of `cls`."""
    other = {int: 7, float: 0.5, str: "changed"}
    return {name: [c for c in spec.choices if c != getattr(cls(), name)][0] if spec.choices
            else other[spec.type] for name, spec in specs(cls).items()}


def test_max_turns_is_verified_and_rewarded():
    task = _task("create_file")
    pol = ScriptedPolicy(TOK, lambda r: '{"commands": [{"keystrokes": "true"}]}')
    traj = run_episode(task, pol, harness=HarnessConfig(max_turns=3))
    assert traj.terminal_reason == TerminalReason.MAX_TURNS and len(traj.turns) == 3
    assert traj.S == 0 and traj.report is not None and traj.declared_complete_turn is None
    batch = pack_trajectories([traj], buckets=BUCKETS)
    assert batch.dones.sum() == 1  # keep_reward: terminal even though S = 0


def test_context_overflow_by_input_budget():
    task = _task("hint_lookup")
    probe = run_episode(task, ReferencePolicy(TOK), harness=HarnessConfig(max_turns=1),
                        verify=False)
    budget = len(probe.turns[0].prompt_ids) + 40  # room for turn 0 only
    traj = run_episode(task, ReferencePolicy(TOK), harness=HarnessConfig(
        max_turns=6, max_input_tokens=budget, summarize_threshold=None))
    assert traj.terminal_reason == TerminalReason.CONTEXT_OVERFLOW and len(traj.turns) == 1
    batch = pack_trajectories([traj], buckets=BUCKETS)
    assert batch.truncated[0] and not batch.dones.any() and not batch.rewards.any()


def test_output_budget_truncates_turn():
    task = _task("create_file")
    traj = run_episode(task, ReferencePolicy(TOK), harness=HarnessConfig(
        max_turns=2, max_output_tokens=10))
    assert all(len(t.sampled_ids) == 10 and t.stop_reason == "length" for t in traj.turns)
    assert traj.turns[0].parse_error is not None
    assert traj.turns[0].observation_ids[0] == TOK.end_id  # the cut reply is closed
    assert traj.terminal_reason == TerminalReason.MAX_TURNS


def test_summarization_starts_a_linked_segment():
    task = _task("fix_script")  # 3 turns
    probe = run_episode(task, ReferencePolicy(TOK), harness=HarnessConfig(max_turns=1),
                        verify=False)
    seen = []

    def summarizer(history):
        seen.append(history)
        return "SUMMARY"

    h = HarnessConfig(max_turns=6, summarize_threshold=len(probe.turns[0].prompt_ids) + 1,
                      summarizer=summarizer)
    traj = run_episode(task, ReferencePolicy(TOK), harness=h)
    assert traj.terminal_reason == TerminalReason.DECLARED_COMPLETE and traj.S == 1
    assert [t.segment for t in traj.turns] == [0, 1, 2]
    assert [(s.index, s.start_turn, s.previous) for s in traj.segments] == [
        (0, 0, None), (1, 1, 0), (2, 2, 1)]
    assert traj.segments[1].summary.startswith("SUMMARY") and len(seen) == 2
    assert "SUMMARY" in TOK.decode(traj.turns[1].prompt_ids)  # rendered afresh
    batch = pack_trajectories([traj], buckets=BUCKETS)
    assert batch.num_rows == 3 and list(batch.next_row[:3]) == [1, 2, -1]
    assert list(batch.truncated[:3]) == [True, True, False] and batch.dones[2].any()


def test_policy_summarizer():
    task = _task("hint_lookup")
    h = HarnessConfig(max_turns=4, summarize_threshold=50)
    pol = ReferencePolicy(TOK)
    traj = run_episode(task, pol, harness=h)
    assert traj.S == 1 and len(traj.segments) == 2
    assert traj.segments[1].summary.startswith("Summary: following")
    assert pol.calls == 3  # two actions and one summary


def test_agent_timeout():
    task = _task("create_file")
    pol = ScriptedPolicy(TOK, lambda r: '{"commands": [{"keystrokes": "sleep 5", '
                                        '"timeout": 10}]}')
    traj = run_episode(task, pol, harness=HarnessConfig(max_turns=5, agent_timeout_s=0.5))
    assert traj.terminal_reason == TerminalReason.AGENT_TIMEOUT and len(traj.turns) == 1
    assert "[timed out" in TOK.decode(traj.turns[0].observation_ids)
    assert traj.report is not None  # verified as is


def test_harness_clock_replaces_the_tasks():
    # a task timed at 0.3 s, a policy that needs 0.2 s per call: the task's clock ends the
    # episode; the harness's longer clock (a slow model on tasks timed for a fast one) does not
    import dataclasses
    import time

    task = dataclasses.replace(_task("create_file"), agent_timeout_s=0.3)

    def slow(r):
        time.sleep(0.2)
        return '{"commands": [{"keystrokes": "true"}]}'

    short = run_episode(task, ScriptedPolicy(TOK, slow), harness=HarnessConfig(max_turns=3))
    assert short.terminal_reason == TerminalReason.AGENT_TIMEOUT and len(short.turns) < 3
    long = run_episode(task, ScriptedPolicy(TOK, slow),
                       harness=HarnessConfig(max_turns=3, agent_timeout_s=30.0))
    assert long.terminal_reason == TerminalReason.MAX_TURNS and len(long.turns) == 3


def test_infrastructure_and_verifier_errors_are_dropped():
    task = _task("create_file")

    def broken(_task):
        raise OSError("no sandbox host")

    a = run_episode(task, ReferencePolicy(TOK), broken)
    assert a.terminal_reason == TerminalReason.INFRASTRUCTURE_ERROR and "no sandbox" in a.error

    class LosesArtifacts:  # a real sandbox whose artifact download fails after the episode
        def __init__(self, sb):
            self.sb = sb

        def exec(self, *a, **k):
            return self.sb.exec(*a, **k)

        def get_tar(self, *a, **k):
            raise SandboxLost("sandbox host went away")

        def close(self):
            self.sb.close()

    b = run_episode(task, ReferencePolicy(TOK),
                    lambda t: LosesArtifacts(open_task_sandbox(t, "local")))
    assert b.terminal_reason == TerminalReason.VERIFIER_ERROR and b.report is None
    batch = pack_trajectories([a, b], buckets=BUCKETS)
    assert batch.num_rows == 0 and batch.dropped == [0, 1]


def test_safe_decode_handles_ids_past_the_tokenizer_vocabulary():
    from terminal_rsi.agent.harness import safe_decode

    ids = TOK.encode("ab") + [TOK.vocab_size + 5] + TOK.encode("c") + [TOK.end_id]
    assert safe_decode(TOK, ids) == "ab\ufffdc"


def test_real_trajectory_roundtrips_through_a_shard(tmp_path):
    from terminal_rsi.agent import read_shard, write_shard

    traj = run_episode(_task("hint_lookup"), ReferencePolicy(TOK),
                       harness=HarnessConfig(max_turns=4, summarize_threshold=50))
    write_shard(tmp_path / "s.jsonl", [traj])
    (back,) = read_shard(tmp_path / "s.jsonl")
    assert back.to_dict() == traj.to_dict() and back.report["passed"] == traj.P
    assert back.terminal_reason == TerminalReason.DECLARED_COMPLETE
    for i in range(len(back.turns)):
        assert back.prompt_at(i) == traj.prompt_at(i)


class _Rejecting:
    """A sandbox double: commands holding "REJECT" raise `error` at exec (as a sandbox does
    for a command that is too long or holds a NUL); the rest run in the real sandbox."""

    def __init__(self, sb, error):
        self.sb, self.error, self.execs = sb, error, []

    def exec(self, command, **kw):
        self.execs.append(command)
        if "REJECT" in command:
            raise self.error
        return self.sb.exec(command, **kw)

    def __getattr__(self, name):
        return getattr(self.sb, name)

    def close(self):
        self.sb.close()


def test_a_command_the_sandbox_rejects_is_an_observation_and_the_episode_goes_on():
    task = _task("create_file")
    first = '{"commands": [{"keystrokes": "echo REJECT x"}, {"keystrokes": "echo after"}]}'
    pol = ScriptedPolicy(TOK, lambda r: first if r.turn == 0
                         else reference_action(task, r.turn - 1))
    made = []

    def factory(t):
        made.append(_Rejecting(open_task_sandbox(t, "local"), BadRequest(
            "command is 200000 bytes; the limit is 131072")))
        return made[0]

    traj = run_episode(task, pol, factory, harness=HarnessConfig(max_turns=4))
    assert traj.terminal_reason == TerminalReason.DECLARED_COMPLETE and traj.S == 1, traj.error
    obs = TOK.decode(traj.turns[0].observation_ids, skip_special=True)
    assert "ERROR: command rejected: command is 200000 bytes" in obs
    assert "$ echo after\nafter\n[exit code 0]" in obs  # the next command still ran
    assert traj.meta["rejected_commands"] == 1 and made[0].execs[:2] == [
        "echo REJECT x", "echo after"]


def test_other_sandbox_errors_at_exec_still_end_the_episode():
    task = _task("create_file")
    pol = ScriptedPolicy(TOK, lambda r: '{"commands": [{"keystrokes": "echo REJECT"}]}')
    traj = run_episode(task, pol, lambda t: _Rejecting(
        open_task_sandbox(t, "local"), InfrastructureError("engine gone")),
        harness=HarnessConfig(max_turns=3))
    assert traj.terminal_reason == TerminalReason.INFRASTRUCTURE_ERROR
    assert "InfrastructureError: engine gone" in traj.error and len(traj.turns) == 1


@pytest.mark.parametrize("keystrokes", ["echo \\u0000", "echo \\ud800"])
def test_nul_and_lone_surrogate_keystrokes_are_parse_errors_not_exec_failures(keystrokes):
    task = _task("create_file")
    bad = '{"commands": [{"keystrokes": "' + keystrokes + '"}]}'
    pol = ScriptedPolicy(TOK, lambda r: bad if r.turn == 0 else reference_action(task, 0))
    traj = run_episode(task, pol, harness=HarnessConfig(max_turns=3))
    assert traj.turns[0].parse_error and "keystrokes holds" in traj.turns[0].parse_error
    assert traj.terminal_reason == TerminalReason.DECLARED_COMPLETE and traj.S == 1
