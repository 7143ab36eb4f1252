"""Pieces shared by the `rsr` and `base_sft` stages: demonstration actions, the stages' reward,
actor creation and exports (their episodes run through `agent.RolloutEngine`).

The model (tokenizer, chat template, shape, initial weights) comes from
`terminal_rsi.models.loading` like every other stage's: the byte-level preset, or `model.gguf`
with its own tokenizer and chat template, which then renders every prompt of the stage
(discovery, planning, fresh execution, the SFT rows)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import numpy as np

from terminal_rsi.agent import (
    ScriptedPolicy,
    reference_action,
)
from terminal_rsi.models.loading import initial_actor_params
from terminal_rsi.models.transformer import DecoderLM
from terminal_rsi.rewards import EpisodeScorer
from terminal_rsi.runtime import multihost
from terminal_rsi.runtime.atomic import atomic_write_text
from terminal_rsi.training.train_state import (
    OptimizerConfig,
    create_train_state,
    init_opt_state,
    make_optimizer,
)


class StageError(RuntimeError):
    """An rsr / base_sft stage cannot run as configured (no tasks, no demonstrations...)."""


def demo_action(task, turn: int, style: str = "compact", terminal: str = "exec",
                action_format: str = "json") -> str:
    """The reference solution's turn `turn` as an action in `action_format` (the last turn
    declares completion): `reference_action`, compact (commands and task_complete only,
    e.g. {"commands":["..."],"task_complete":b}) or full (analysis, keystrokes, timeout).
    For a "session" `terminal` each command is typed to run (`session_keystrokes`: a
    trailing newline)."""
    return reference_action(task, turn, terminal, action_format, compact=style == "compact")


def demo_policy(tokenizer, style: str = "compact", terminal: str = "exec",
                action_format: str = "json"):
    """A `ScriptedPolicy` emitting each task's reference solution (`demo_action`); it is
    also the external discovery policy of the tiny default."""
    def script(r):
        if r.purpose == "summary":
            return "Summary: following the reference steps."
        return demo_action(r.task, r.turn, style, terminal, action_format)

    return ScriptedPolicy(tokenizer, script)


# RSR keeps verified successes: its episodes are scored by the verifier's verdict S alone
# (the scorer of the `rsr` and `base_sft` stages' rollout engines)
RSR_SCORER = EpisodeScorer("binary")


def optimizer_config(opt_section, total_steps: int = 0):
    """The OptimizerConfig of an `actor_opt` section; with `schedule = cosine` the lr decays
    over `total_steps` (the stage's SFT steps; 0 or 1 step: constant)."""
    cosine = opt_section.schedule == "cosine"
    decay = int(total_steps) if cosine and total_steps > max(1, opt_section.warmup_steps) else 0
    return OptimizerConfig.from_config(opt_section, decay_steps=decay)


def with_optimizer(state, opt):
    """`state` with a fresh optax chain `opt` (and its zero optimizer state), params kept."""
    tx = make_optimizer(opt)
    return state.replace(tx=tx, opt_state=init_opt_state(tx, state.params), step=state.step * 0)


def create_actor(config, mcfg, opt_section, seed: int, total_steps: int = 0):
    """A DecoderLM TrainState (init.actor_weights, else model.gguf's weights, else a random
    init from `seed`: `terminal_rsi.models.loading.initial_actor_params`); its optimizer
    follows `opt_section` over `total_steps` SFT steps (`optimizer_config`)."""
    opt = optimizer_config(opt_section, total_steps)
    return create_train_state(DecoderLM, mcfg, opt, seed=seed,
                              params=initial_actor_params(config, mcfg))


def success(episodes: Sequence, n: int) -> float:
    """Strict success over `n` attempts (an attempt without an episode, one that raised,
    counts as failed)."""
    return float(sum(t.S for t in episodes) / max(n, 1))


def success_by_family(trajs: Sequence) -> dict[str, dict[str, float]]:
    fams: dict[str, list[int]] = {}
    for t in trajs:
        fams.setdefault(t.family, []).append(int(t.S))
    return {f: {"n": len(v), "success": float(np.mean(v))} for f, v in sorted(fams.items())}


def write_jsonl(path: str, rows: Sequence[dict]) -> None:
    """`rows` as JSON Lines at `path`, atomically (process 0 alone writes)."""
    if multihost.is_writer():
        atomic_write_text(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))


def write_json(path: str, obj: dict) -> None:
    """`obj` as JSON at `path`, atomically (process 0 alone writes)."""
    if multihost.is_writer():
        atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def stage_dirs(workdir: str) -> tuple[str, str]:
    os.makedirs(os.path.join(workdir, "trajectories"), exist_ok=True)
    return os.path.join(workdir, "export"), os.path.join(workdir, "trajectories")
