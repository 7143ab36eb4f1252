"""Discovery under complementary harnesses and C(τ) (paper §2.1: (x, τ, H) with V_x(τ) = 1).

    variants = [DiscoveryVariant("hints", h_hints, actor), DiscoveryVariant("hot", h_hot,
                actor, samples=8), DiscoveryVariant("external", h0, reference_policy)]
    found, episodes, stats = discover(engine, tasks, variants)   # strictly verified triples
    messages = clean_trajectory(found[0].trajectory, tokenizer)   # C(τ)
    commands = executed_commands(found[0].trajectory, tokenizer)  # for the digest planner

A variant is a harness (`HarnessConfig`: hints, sampling temperature, budgets) with a policy
(the retained actor, or an external policy given as any `Policy`, e.g. the reference-
solution policy) and a number of samples per task. Only episodes with strict success S = 1
(the complete protected verifier, not a declaration) are kept.

C(τ) removes harness-control messages: the system prompt and hints, summary requests and
summaries, the harness's parse-error notes and the replies they answer (a reply that holds
no action is not a decision the planner should see); what remains is the alternation of the
agent's actions and the command outputs.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

from terminal_rsi.agent.actions import ActionParseError
from terminal_rsi.agent.formats import get_format
from terminal_rsi.agent.harness import safe_decode
from terminal_rsi.rsr.runbook import ExecutedCommand
from terminal_rsi.sandbox.terminal import is_key_name

PARSE_NOTE = "ERROR: could not parse your reply as an action"
_EXIT_RE = re.compile(r"\[exit code (-?\d+)\]\s*$")
_TIMEOUT_RE = re.compile(r"\[timed out after [0-9.]+ s\]\s*$")


@dataclasses.dataclass
class DiscoveryVariant:
    """One complementary harness: `harness` run by `policy` `samples` times per task."""

    name: str
    harness: Any
    policy: Any
    samples: int = 1
    external: bool = False


@dataclasses.dataclass
class Discovered:
    """A strictly verified triple (x, τ, H)."""

    task: Any
    trajectory: Any
    harness: str


def discover(engine, tasks: Sequence, variants: Sequence[DiscoveryVariant],
             ) -> tuple[list[Discovered], list, dict[str, dict[str, float]]]:
    """Run every variant over `tasks` through `engine` (an `agent.RolloutEngine`; variant
    `name` samples from the streams "discovery/<name>") and keep the S = 1 episodes.

    Returns (verified triples, all episodes (each with meta["discovery_harness"]), stats per
    variant: episodes (launched), successes, success_rate, tasks_solved, errors (episodes
    that raised, counted as failures)).
    """
    found: list[Discovered] = []
    episodes: list = []
    stats: dict[str, dict[str, float]] = {}
    for v in variants:
        if v.samples < 1:
            raise ValueError(f"discovery variant {v.name!r}: samples must be >= 1")
        launch = [t for t in tasks for _ in range(v.samples)]
        done = engine.run(v.policy, launch, harness=v.harness, streams=f"discovery/{v.name}",
                          desc=f"discovery {v.name}")
        trajs = done.trajectories
        solved = set()
        for traj in trajs:
            task = launch[traj.meta["launch_index"]]
            traj.meta["discovery_harness"] = v.name
            traj.meta["external_policy"] = bool(v.external)
            episodes.append(traj)
            if traj.S == 1:
                found.append(Discovered(task, traj, v.name))
                solved.add(task.id)
        n = len(launch)
        ok = sum(int(t.S == 1) for t in trajs)
        stats[v.name] = {"episodes": n, "successes": ok, "success_rate": ok / max(n, 1),
                         "tasks_solved": len(solved), "external": bool(v.external),
                         "errors": len(done.errors)}
    return found, episodes, stats


def _observation_text(tokenizer, ids) -> str:
    return safe_decode(tokenizer, ids).strip()


def clean_trajectory(traj, tokenizer) -> list[dict[str, str]]:
    """C(τ): [{"role": "assistant" | "observation", "content": ...}] (see the module doc)."""
    out: list[dict[str, str]] = []
    for turn in traj.turns:
        if turn.parse_error:
            continue
        out.append({"role": "assistant", "content": safe_decode(tokenizer, turn.sampled_ids)})
        if turn.observation_ids:
            obs = _observation_text(tokenizer, turn.observation_ids)
            obs = "\n".join(ln for ln in obs.splitlines() if not ln.startswith(PARSE_NOTE))
            out.append({"role": "observation", "content": obs})
    return out


def clean_text(messages: Sequence[dict[str, str]]) -> str:
    """C(τ) as plain text for a planner prompt."""
    return "\n".join(f"[{m['role']}]\n{m['content']}" for m in messages)


def executed_commands(traj, tokenizer) -> list[ExecutedCommand]:
    """The commands the agent ran, in order, with exit codes and outputs read back from the
    observation that followed (None where unknown: the final turn has no observation, and a
    capped observation may have lost a command's block). A terminal-session episode's come
    from what was typed and read (`session_commands`)."""
    if traj.meta.get("terminal") == "session":
        return session_commands(traj)
    out: list[ExecutedCommand] = []
    fmt = get_format(traj.meta.get("action_format", "json"))
    for ti, turn in enumerate(traj.turns):
        if turn.parse_error:
            continue
        try:
            action = fmt.parse(safe_decode(tokenizer, turn.sampled_ids))
        except ActionParseError:
            continue
        obs = _observation_text(tokenizer, turn.observation_ids) if turn.observation_ids \
            else None
        pos = 0
        marks = []
        for c in action.commands:
            j = -1 if obs is None else obs.find(f"$ {c.keystrokes}", pos)
            marks.append(j)
            if j >= 0:
                pos = j + 2 + len(c.keystrokes)
        for i, c in enumerate(action.commands):
            code, output, timed_out = None, None, False
            if obs is not None and marks[i] >= 0:
                end = next((m for m in marks[i + 1:] if m >= 0), len(obs))
                block = obs[marks[i] + 2 + len(c.keystrokes):end].strip("\n")
                m = _EXIT_RE.search(block)
                if m:
                    code = int(m.group(1))
                    output = block[:m.start()].rstrip("\n")
                elif _TIMEOUT_RE.search(block):
                    timed_out = True
                    output = _TIMEOUT_RE.sub("", block).rstrip("\n")
            out.append(ExecutedCommand(c.keystrokes, code, output, ti, timed_out))
    return out


def session_commands(traj) -> list[ExecutedCommand]:
    """The commands typed into an episode's terminal (`Turn.io`): each as a command (its
    Enter dropped; a key press such as C-c is not a command), the status its prompt reported
    when it finished (None: still running, `timed_out`), and its output (the terminal's
    text without the echo of what was typed and the prompt after it)."""
    out: list[ExecutedCommand] = []
    for ti, turn in enumerate(traj.turns):
        for rec in turn.io:
            typed = rec.get("typed", "")
            if "rejected" in rec or is_key_name(typed) or not typed.strip():
                continue
            done = bool(rec.get("done"))
            lines = rec.get("read", "").split("\n")
            body = lines[typed.count("\n"):-1] if done else lines[typed.count("\n"):]
            out.append(ExecutedCommand(typed.rstrip("\n"), rec.get("exit_code") if done
                                       else None, "\n".join(body), ti, not done))
    return out
