"""Agent harness, episodes, trajectories, packing and rollouts (paper §3.1, §2.3, App. A).

    from terminal_rsi.agent import HarnessConfig, ReferencePolicy, run_episode, pack_trajectories
    traj = run_episode(task, policy, harness=HarnessConfig(max_turns=8))
    batch = pack_trajectories([traj])          # [B, L] arrays for TB-GAE / PPO

Modules: `actions` (JSON action schema, parsing, observation capping), `trajectory`
(Trajectory records, terminal reasons and their training policy, JSON Lines shards),
`packing` (the one packing function), `harness` (HarnessConfig, policies, run_episode),
`scheduler` (concurrent rollouts with cross-episode generation batching, oversampling),
`engine` (the one rollout engine every stage collects through, built from the config).
"""

from terminal_rsi.agent.actions import (
    Action,
    ActionParseError,
    Command,
    cap_text,
    format_observation,
    parse_action,
)
from terminal_rsi.agent.engine import Episodes, RolloutEngine, harness_from_config
from terminal_rsi.agent.harness import (
    EpisodeCancelled,
    GenerationOutput,
    GenerationRequest,
    HarnessConfig,
    Policy,
    ReferencePolicy,
    SamplerPolicy,
    SamplingSettings,
    ScriptedPolicy,
    StreamedPolicy,
    pool_sandbox_factory,
    reference_action,
    run_episode,
    session_keystrokes,
)
from terminal_rsi.agent.packing import (
    PackedBatch,
    PackingError,
    malformed_mask,
    pack_trajectories,
)
from terminal_rsi.agent.scheduler import (
    BatchingPolicy,
    RolloutResult,
    RolloutScheduler,
    SchedulerConfig,
)
from terminal_rsi.agent.trajectory import (
    TRAINING_POLICY,
    Segment,
    TerminalReason,
    TrainingPolicy,
    Trajectory,
    TrajectoryFormatError,
    Turn,
    gather_trajectories,
    read_shard,
    write_shard,
)

__all__ = [
    "TRAINING_POLICY", "Action", "BatchingPolicy", "Episodes", "RolloutEngine",
    "harness_from_config", "RolloutResult",
    "RolloutScheduler", "SchedulerConfig", "pool_sandbox_factory",
    "reference_action", "session_keystrokes", "ActionParseError", "Command", "EpisodeCancelled",
    "GenerationOutput", "GenerationRequest", "HarnessConfig", "PackedBatch", "PackingError",
    "Policy", "ReferencePolicy", "SamplerPolicy", "SamplingSettings", "ScriptedPolicy",
    "StreamedPolicy", "Segment", "TerminalReason", "TrainingPolicy", "Trajectory",
    "TrajectoryFormatError", "Turn",
    "cap_text", "format_observation", "gather_trajectories", "malformed_mask",
    "pack_trajectories", "parse_action", "read_shard", "run_episode", "write_shard",
]
