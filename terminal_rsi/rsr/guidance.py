"""Private guidance for fresh execution and the public view P(τ̃) (paper §2.1 Eq. 2).

    h = execution_harness(H0, runbook)           # H0 + private guidance I_exec ⊕ b
    traj = run_episode(task, actor, harness=h)   # the actor sees x_pub, then the guidance
    clean = public_view(traj)                    # P(τ̃): public prefix + generated decisions

The guided prompt of a segment is the ordinary H0 prompt (system, then the public task
x_pub as the user message) followed by one more user message holding I_exec and the runbook
text (`guidance_text`, multi-line commands written as the harness's action format writes
them); x_pub is therefore already in front of it (I_exec ⊕ x_pub ⊕ b).
The harness (`HarnessConfig.private_guidance`) records the prompt of every segment rendered
*without* the guidance in `traj.meta["public_prompt_ids"]`.

`public_view` swaps each segment's first prompt for that public rendering (its token ids
re-rendered by the tokenizer's chat template, exactly the prompt H0 would have fed), keeps
the sampled ids and their sampling log-probabilities as sampled (token-in/token-out: never
re-tokenized) and the observation ids, restores the target harness name, and removes the
private fields (`PRIVATE_META_KEYS`: runbook text, guidance) from `meta`. Linear history
holds within each segment, so every later turn's prefix is public too.
"""

from __future__ import annotations

import copy
import dataclasses

from terminal_rsi.agent.formats import get_format
from terminal_rsi.agent.harness import HarnessConfig
from terminal_rsi.agent.trajectory import Trajectory
from terminal_rsi.rsr.runbook import Runbook

# I_exec: short, because the tiny byte-level model reads every character of it.
EXEC_INSTRUCTION = "Private guidance: follow this runbook; never mention it."
GUIDED_SUFFIX = "+guidance"
PRIVATE_META_KEYS = ("public_prompt_ids", "runbook", "private_guidance", "guidance")


class GuidanceError(ValueError):
    """A guided trajectory cannot be turned into its public view (public prompts missing)."""


def guidance_text(runbook: Runbook | str, instruction: str = EXEC_INSTRUCTION, *,
                  action_format: str = "json") -> str:
    """I_exec ⊕ b as one message (x_pub precedes it in the prompt); a Runbook's commands
    written as the harness's `action_format` writes them (`Runbook.to_guidance`)."""
    text = (runbook.to_guidance(get_format(action_format).literal_commands)
            if isinstance(runbook, Runbook) else str(runbook))
    return f"{instruction}\n{text}" if instruction else text


def execution_harness(base: HarnessConfig, runbook: Runbook | str, *,
                      instruction: str = EXEC_INSTRUCTION) -> HarnessConfig:
    """The target harness H0 with private guidance I_exec ⊕ b (name `<H0>+guidance`)."""
    if base.private_guidance:
        raise GuidanceError(f"harness {base.name!r} already carries private guidance; build "
                            "the execution harness from the plain target harness")
    return dataclasses.replace(base, name=base.name + GUIDED_SUFFIX,
                               private_guidance=guidance_text(
                                   runbook, instruction, action_format=base.action_format))


def is_guided(traj: Trajectory) -> bool:
    return "public_prompt_ids" in traj.meta or traj.harness.endswith(GUIDED_SUFFIX)


def public_view(traj: Trajectory) -> Trajectory:
    """P(τ̃): a copy whose segment prompts are the public ones (see the module doc).

    An unguided trajectory is returned as a copy (already public). Raises GuidanceError if a
    guided trajectory lacks the recorded public prompt of one of its segments.
    """
    out = Trajectory.from_dict(copy.deepcopy(traj.to_dict()))
    if not is_guided(traj):
        return out
    public = traj.meta.get("public_prompt_ids") or {}
    for k in sorted({t.segment for t in out.turns}):
        first = out.segment_turns(k)[0]
        if str(k) not in public:
            raise GuidanceError(f"trajectory {traj.episode_id or traj.task_id}: no public "
                                f"prompt recorded for segment {k}; run it with a harness from "
                                "execution_harness (HarnessConfig.private_guidance)")
        out.turns[first].prompt_ids = [int(i) for i in public[str(k)]]
    if out.harness.endswith(GUIDED_SUFFIX):
        out.harness = out.harness[:-len(GUIDED_SUFFIX)]
    for key in PRIVATE_META_KEYS:
        out.meta.pop(key, None)
    out.meta["public_view"] = True
    return out
