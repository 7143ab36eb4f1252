"""Planners: I_plan ⊕ x_pub ⊕ C(τ) → runbooks b_ℓ, K per success (paper §2.1 Eq. 2).

    plans = DigestPlanner().plan(task, traj, tokenizer)          # deterministic, 1 runbook
    plans = PolicyPlanner(policy, k=4).plan(task, traj, tokenizer)  # K sampled runbooks

Every plan is a `Plan(runbook, text, error)`: `runbook` is None when the text did not parse
(`error` holds the RunbookError message; the reviewer records it as a schema rejection).

- `DigestPlanner`: the verified command sequence (`discovery.executed_commands`) becomes a
  runbook with `digest_runbook` (failed and redundant steps dropped). It is deterministic,
  so it yields one runbook per success; fresh execution repeats it M times. It is the
  planner for models that cannot plan, such as the tiny default.
- `PolicyPlanner`: K samples from a language model (any `Policy`: the actor or a configured
  model) prompted with `PLAN_INSTRUCTION`, the public task and C(τ), parsed with
  `Runbook.parse`.

`plan_successes` plans a list of successes; with several processes each samples the plans of
its share of them and every process gets all of them back (`multihost.gather`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from terminal_rsi.agent.engine import stream_namespace
from terminal_rsi.agent.harness import GenerationRequest, SamplingSettings, safe_decode
from terminal_rsi.rsr.discovery import clean_text, clean_trajectory, executed_commands
from terminal_rsi.rsr.runbook import (
    COMMAND_PREFIX,
    COMPLETE_STEP,
    HEADER,
    Runbook,
    RunbookError,
    digest_runbook,
)
from terminal_rsi.runtime import multihost

PLAN_STREAMS = stream_namespace("plan")  # the random streams of the policy planner's samples
PLAN_INSTRUCTION = (
    "You turn a verified solution of a terminal task into a runbook that another agent can "
    "follow. Use only what the task statement and the transcript show; never mention tests, "
    "verifiers or expected outputs. Reply with the runbook only, in this format:\n"
    f"{HEADER} <goal in one line>\n1. {COMMAND_PREFIX}<shell command>\n2. ...\n"
    f"n. {COMPLETE_STEP}")


@dataclasses.dataclass
class Plan:
    runbook: Runbook | None
    text: str
    error: str | None = None
    planner: str = ""


def plan_messages(instruction: str, cleaned: list[dict[str, str]],
                  plan_instruction: str = PLAN_INSTRUCTION) -> list[dict[str, str]]:
    """p_plan = I_plan ⊕ x_pub ⊕ C(τ) as chat messages."""
    return [{"role": "system", "content": plan_instruction},
            {"role": "user", "content": f"Task:\n{instruction}\n\nVerified transcript:\n"
                                        f"{clean_text(cleaned)}"}]


def parse_plan(text: str, planner: str) -> Plan:
    """A generated runbook text as a Plan (runbook None and the parse error when it does not
    parse)."""
    try:
        return Plan(Runbook.parse(text), text, None, planner)
    except RunbookError as e:
        return Plan(None, text, str(e), planner)


class DigestPlanner:
    name = "digest"

    def plan(self, task, traj, tokenizer, index: int = 0) -> list[Plan]:
        try:
            rb = digest_runbook(task.instruction, executed_commands(traj, tokenizer))
        except RunbookError as e:
            return [Plan(None, "", str(e), self.name)]
        return [Plan(rb, rb.to_text(), None, self.name)]


class PolicyPlanner:
    """K runbooks sampled from `policy` (temperature `sampling`), `max_tokens` each."""

    name = "policy"

    def __init__(self, policy, k: int = 4, *, max_tokens: int = 512,
                 sampling: SamplingSettings = SamplingSettings(temperature=1.0),
                 plan_instruction: str = PLAN_INSTRUCTION):
        if k < 1:
            raise ValueError(f"PolicyPlanner needs k >= 1, got {k}")
        self.policy, self.k, self.max_tokens = policy, int(k), int(max_tokens)
        self.sampling, self.plan_instruction = sampling, plan_instruction

    def plan(self, task, traj, tokenizer, index: int = 0) -> list[Plan]:
        """The K plans of success number `index`: plan j samples from the random stream
        ("plan", index, j) of the policy's seed, so a success's plans replay whichever
        process plans it and whatever else is planned."""
        msgs = plan_messages(task.instruction, clean_trajectory(traj, tokenizer),
                             self.plan_instruction)
        prompt = [int(i) for i in tokenizer.render(msgs, add_generation_prompt=True)]
        reqs = [GenerationRequest(list(prompt), self.max_tokens, self.sampling, task, 0,
                                  "plan", stream=(PLAN_STREAMS, int(index), j))
                for j in range(self.k)]
        return [parse_plan(safe_decode(tokenizer, o.token_ids), self.name)
                for o in self.policy.generate(reqs)]


def plan_successes(planner, successes, tokenizer) -> list[list[Plan]]:
    """`planner`'s plans of each success (objects with `.task` and `.trajectory`), in order.
    With several processes (every one must call this together) a sampling planner is split:
    each process generates the plans of its share of the successes
    (`multihost.process_share`) and the texts are gathered, so every process reviews,
    executes and trains on the same runbooks. The digest planner is deterministic and cheap;
    every process runs it whole."""
    if planner.name == DigestPlanner.name or not multihost.is_multiprocess():
        return [planner.plan(s.task, s.trajectory, tokenizer, i)
                for i, s in enumerate(successes)]
    start, stop = multihost.process_share(len(successes))
    mine = multihost.run_share(lambda: [
        [p.text for p in planner.plan(s.task, s.trajectory, tokenizer, start + i)]
        for i, s in enumerate(successes[start:stop])])
    return [[parse_plan(text, planner.name) for text in texts]
            for texts in multihost.gather(mine)]


def make_planner(kind: str, *, policy: Any = None, k: int = 4, max_tokens: int = 512,
                 temperature: float = 1.0):
    if kind == "digest":
        return DigestPlanner()
    if kind == "policy":
        if policy is None:
            raise ValueError("the policy planner needs a policy (the actor or a model)")
        return PolicyPlanner(policy, k, max_tokens=max_tokens,
                             sampling=SamplingSettings(temperature=temperature))
    raise ValueError(f"unknown planner {kind!r}; use 'digest' or 'policy'")
