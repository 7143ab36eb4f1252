"""Episode records (token-in/token-out) and their JSON Lines shards.

A `Trajectory` is one episode: per turn, the tokens fed to the policy, the ids it sampled
with their sampling log-probabilities, and the observation tokens the harness appended;
per episode, the task, harness, policy version, verification report, S/P/N, reward,
terminal reason, timings and summarization segments.

Linear history within a segment: the full prompt of turn t is

    prompt(t) = prompt_ids(first turn of the segment) + Σ_{u<t in segment} (sampled_ids(u) +
                observation_ids(u))

so `Turn.prompt_ids` holds only the tokens that are new at that turn: the rendered prompt
for the first turn of a segment, [] for the others (`Trajectory.prompt_at(t)` rebuilds the
full prompt; the harness asserts it equals what it fed the policy). A summarization starts
a new segment (`Segment`), whose first turn's prompt is rendered afresh; segments are linked
(`previous`) and are never terminal.

Terminal reasons and their training policy (`TRAINING_POLICY`):

| reason              | policy           | why                                                     |
|---------------------|------------------|---------------------------------------------------------|
| declared_complete   | keep_reward      | the agent ended the episode; the verifier judged it     |
| max_turns           | keep_reward      | the turn budget is part of the protocol; verified state |
| agent_timeout       | keep_reward      | the wall-clock budget is part of the protocol likewise  |
| parse_errors        | keep_reward      | `harness.max_parse_errors` unparseable replies: the     |
|                     |                  | agent's failure, verified like max_turns                |
| context_overflow    | keep_bootstrap   | cut by the context limit, not the task: no done, no     |
|                     |                  | reward; the trainer bootstraps V at the cut             |
| infrastructure_error| drop             | the sandbox failed: no information about the policy     |
| verifier_error      | drop             | no verdict (not a 0): never rewarded                    |

Shards are JSON Lines (one trajectory per line), written atomically, readable with
`pandas.read_json(path, lines=True)` (one column per top-level field).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
from collections.abc import Iterable, Sequence
from typing import Any

from terminal_rsi.runtime import multihost
from terminal_rsi.runtime.atomic import atomic_write_text


class TerminalReason(enum.StrEnum):
    DECLARED_COMPLETE = "declared_complete"
    MAX_TURNS = "max_turns"
    CONTEXT_OVERFLOW = "context_overflow"
    AGENT_TIMEOUT = "agent_timeout"
    PARSE_ERRORS = "parse_errors"
    INFRASTRUCTURE_ERROR = "infrastructure_error"
    VERIFIER_ERROR = "verifier_error"


class TrainingPolicy(enum.StrEnum):
    KEEP_REWARD = "keep_reward"  # terminal: reward on the last generated token, done = 1
    KEEP_BOOTSTRAP = "keep_bootstrap"  # truncated: no reward, no done; bootstrap V at the cut
    DROP = "drop"  # excluded from training batches


TRAINING_POLICY: dict[TerminalReason, TrainingPolicy] = {
    TerminalReason.DECLARED_COMPLETE: TrainingPolicy.KEEP_REWARD,
    TerminalReason.MAX_TURNS: TrainingPolicy.KEEP_REWARD,
    TerminalReason.AGENT_TIMEOUT: TrainingPolicy.KEEP_REWARD,
    TerminalReason.PARSE_ERRORS: TrainingPolicy.KEEP_REWARD,
    TerminalReason.CONTEXT_OVERFLOW: TrainingPolicy.KEEP_BOOTSTRAP,
    TerminalReason.INFRASTRUCTURE_ERROR: TrainingPolicy.DROP,
    TerminalReason.VERIFIER_ERROR: TrainingPolicy.DROP,
}


class TrajectoryFormatError(ValueError):
    """A trajectory record (or a shard line) is malformed; the message names the field."""


@dataclasses.dataclass
class Turn:
    """One policy call of the episode.

    prompt_ids: tokens new at this turn (the rendered prompt for a segment's first turn,
      else []; see the module doc).
    sampled_ids: the ids the policy sampled, exactly as sampled.
    logprobs: sampling log-probability of each sampled id (same length).
    observation_ids: tokens the harness appended after the sampled ids (observation message
      and the next generation prompt); [] for the last turn of a segment.
    segment: index of the summarization segment this turn belongs to.
    stop_reason: the sampler's stop reason ("stop_token", "length", ...).
    parse_error: the action parse error message, if the reply held no valid action.
    io: per command run: {"typed": the keystrokes exactly as typed, "read": the output read
      back (capped like the observation), "done", "exit_code", "seconds"} ("rejected": the
      reason, for a command the sandbox refused).
    """

    prompt_ids: list[int]
    sampled_ids: list[int]
    logprobs: list[float]
    observation_ids: list[int] = dataclasses.field(default_factory=list)
    segment: int = 0
    stop_reason: str = ""
    parse_error: str | None = None
    policy_version: int = 0
    io: list[dict] = dataclasses.field(default_factory=list)

    def __post_init__(self):
        if len(self.sampled_ids) != len(self.logprobs):
            raise TrajectoryFormatError(
                f"turn has {len(self.sampled_ids)} sampled ids but {len(self.logprobs)} "
                "logprobs; each sampled id needs its sampling log-probability")


@dataclasses.dataclass
class Segment:
    """A stretch of linear history. Segment k > 0 starts after a summarization of segment
    k - 1 (`previous`); `summary` is the summary text it starts from."""

    index: int
    start_turn: int
    previous: int | None = None
    summary: str | None = None


@dataclasses.dataclass
class Trajectory:
    task_id: str
    family: str
    harness: str
    policy_version: int
    turns: list[Turn] = dataclasses.field(default_factory=list)
    segments: list[Segment] = dataclasses.field(default_factory=lambda: [Segment(0, 0)])
    terminal_reason: TerminalReason | None = None
    report: dict | None = None  # VerificationReport.to_dict()
    S: int = 0  # noqa: N815
    P: int = 0  # noqa: N815
    N: int = 0  # noqa: N815
    reward: float = 0.0
    reward_fn: str = ""
    declared_complete_turn: int | None = None
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    error: str | None = None
    episode_id: str = ""
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def training_policy(self) -> TrainingPolicy:
        if self.terminal_reason is None:
            raise TrajectoryFormatError(f"trajectory {self.episode_id or self.task_id} has no "
                                        "terminal reason (episode not finished)")
        return TRAINING_POLICY[self.terminal_reason]

    @property
    def num_generated(self) -> int:
        return sum(len(t.sampled_ids) for t in self.turns)

    def segment_turns(self, k: int) -> list[int]:
        return [i for i, t in enumerate(self.turns) if t.segment == k]

    def prompt_at(self, t: int) -> list[int]:
        """The full prompt fed to the policy at turn `t` (rebuilt from the linear history)."""
        seg = self.turns[t].segment
        ids: list[int] = []
        for i in self.segment_turns(seg):
            if i == t:
                return ids + list(self.turns[i].prompt_ids)
            ids += list(self.turns[i].prompt_ids) + list(self.turns[i].sampled_ids) \
                + list(self.turns[i].observation_ids)
        raise IndexError(t)

    def segment_tokens(self, k: int) -> tuple[list[int], list[int], list[int], list[float]]:
        """(tokens, is_generated, turn index, logprob) over segment k's linear history."""
        toks: list[int] = []
        gen: list[int] = []
        tid: list[int] = []
        lp: list[float] = []
        for i in self.segment_turns(k):
            t = self.turns[i]
            for part, g in ((t.prompt_ids, 0), (t.sampled_ids, 1), (t.observation_ids, 0)):
                toks += part
                gen += [g] * len(part)
                tid += [i] * len(part)
            lp += [0.0] * len(t.prompt_ids) + list(t.logprobs) + [0.0] * len(t.observation_ids)
        return toks, gen, tid, lp

    # -- serialization --------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["terminal_reason"] = self.terminal_reason.value if self.terminal_reason else None
        d["training_policy"] = self.training_policy.value if self.terminal_reason else None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        d = dict(d)
        d.pop("training_policy", None)
        try:
            d["turns"] = [Turn(**t) for t in d.get("turns", [])]
            d["segments"] = [Segment(**s) for s in d.get("segments", [])]
            if d.get("terminal_reason") is not None:
                d["terminal_reason"] = TerminalReason(d["terminal_reason"])
            names = {f.name for f in dataclasses.fields(cls)}
            unknown = set(d) - names
            if unknown:
                raise TrajectoryFormatError(f"unknown trajectory fields {sorted(unknown)}")
            return cls(**d)
        except (TypeError, ValueError) as e:
            if isinstance(e, TrajectoryFormatError):
                raise
            raise TrajectoryFormatError(f"malformed trajectory record: {e}") from e


def write_shard(path: str | os.PathLike, trajectories: Iterable[Trajectory]) -> int:
    """Write trajectories as one JSON Lines shard, atomically. Returns the number written."""
    lines = [json.dumps(t.to_dict(), sort_keys=True, allow_nan=False) for t in trajectories]
    atomic_write_text(path, "".join(line + "\n" for line in lines))
    return len(lines)


def read_shard(path: str | os.PathLike) -> list[Trajectory]:
    """Read a shard written by `write_shard` (TrajectoryFormatError names the bad line)."""
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                out.append(Trajectory.from_dict(json.loads(line)))
            except (json.JSONDecodeError, TrajectoryFormatError) as e:
                raise TrajectoryFormatError(f"{path}:{n}: {e}") from e
    return out


def gather_trajectories(trajectories: Iterable[Trajectory]) -> list[Trajectory]:
    """Every process's `trajectories`, concatenated in process order, on every process
    (`multihost.gather`; a list of the same trajectories on one process). Every process must
    call it at the same point: a run that splits its episodes by `multihost.process_share`
    gets them back in the order of one process's run."""
    if not multihost.is_multiprocess():
        return list(trajectories)
    return [Trajectory.from_dict(d)
            for d in multihost.gather([t.to_dict() for t in trajectories])]


def summarize(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """Success rate, mean turns, mean reward and terminal-reason counts of a batch."""
    n = max(len(trajs), 1)
    out: dict[str, float] = {
        "episodes": float(len(trajs)),
        "success_rate": sum(t.S for t in trajs) / n,
        "mean_turns": sum(len(t.turns) for t in trajs) / n,
        "mean_reward": sum(t.reward for t in trajs) / n,
    }
    for r in TerminalReason:
        out[f"reason/{r.value}"] = float(sum(t.terminal_reason == r for t in trajs))
    return out
