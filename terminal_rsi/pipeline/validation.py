"""Model selection between stages on validation data (issue 28): no stage may quietly make the
agent worse.

Every stage that trains an actor is scored, after it finishes and before its held-out
evaluation, on the `validation` split: instances of the training families whose seeds are
disjoint from the training seeds and from the held-out test seeds (`tasks.builtin.
validation_seed`), fixed before any evaluation. The score is strict-success Mean@k
(`validation.k` runs of `validation.n_per_family` instances per family, the evaluation
harness and temperature, the run's seed: every stage is scored on the same episodes' random
streams). The stage keeps its actor only if that score beats the score of the actor it was
handed by more than `validation.min_gain`; otherwise its input is handed on unchanged (every
role: actor and critic), the trained export is kept at `<stage>/rejected/`, and the ledger
says so:

    ledger stage "validation": {"metric": "mean_at_k", "k", "num_tasks", "score",
        "input", "input_score", "decision": one of ledger.DECISIONS (base, kept, input,
        bypassed),
        "chosen": <stage whose trained actor is exported>, "chosen_score", "reason",
        "per_family": {family: success}, "wall_s", "trajectories"}

An RSR or RPR stage offers more than its final actor: with `validation.candidates` = C
it exports C - 1 earlier actors, evenly spaced over the steps that train the actor
(`candidates.count`, `exports.candidate_steps`), at `<stage>/candidates/step_<n>/`. Each
is scored on the same validation episodes as the final export (trajectories under
`<stage>/validation/step_<n>/`); the best (a tie goes to the earliest) is the stage's actor,
and the rule above compares it with the input. When an earlier candidate wins, it replaces
the export (actor and, for RPR, the critic trained with it) and the final export is kept at
`<stage>/rejected/`. The record adds

        "candidates": [{"candidate": "step 4", "step": 4, "score"}, ...,
                       {"candidate": "final", "step": None, "score"}],
        "chosen_candidate": the candidate exported (None: the input is handed on)

This is model selection on validation data; the held-out suites are never looked at. The
base stage is scored too (its score is what RSR-1 must beat). A critic warm-up trains no
actor and is not scored; a bypassed stage carries its input's record.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence

import ml_collections

from terminal_rsi.pipeline.graph import StageSpec
from terminal_rsi.pipeline.handoff import copy_inputs, export_roles
from terminal_rsi.pipeline.resolve import set_path
from terminal_rsi.tasks.registry import PROCEDURAL_SUITES

SUITE = "validation"


def has_validation_split(suite: str) -> bool:
    """Only the procedural suites have validation seeds (a task directory is one split)."""
    return suite in PROCEDURAL_SUITES


def validation_config(eval_base: ml_collections.ConfigDict, validation, actor_export: str,
                      reward_fn: str) -> ml_collections.ConfigDict:
    """The evaluation config that scores `actor_export` on the validation split: the run's
    evaluation settings with the validation suite, size and k (its own strata: the run's
    frozen strata hold only the held-out tasks)."""
    cfg = ml_collections.ConfigDict(eval_base.to_dict())
    for path, value in {"tasks.suites": (SUITE,), "tasks.n_per_family": validation.n_per_family,
                        "eval.k": validation.k, "eval.strata_path": None,
                        "eval.reward_fn": reward_fn, "init.actor_weights": actor_export,
                        "init.critic_weights": None}.items():
        set_path(cfg, path, value)
    return cfg


def best_candidate(scores: Sequence[float]) -> int:
    """The index of the highest score; a tie goes to the earliest candidate (the fewest
    updates away from the validated input)."""
    if not scores:
        raise ValueError("no candidate to choose from")
    return max(range(len(scores)), key=lambda i: (scores[i], -i))


def decide(name: str, score: float, source: str | None, source_record: Mapping | None,
           min_gain: float, k: int, candidate: str | None = None) -> dict:
    """The selection rule (module doc) for stage `name` whose actor scored `score`, handed
    the actor of stage `source` (None: the base) whose record is `source_record`;
    `candidate` names which of the stage's actors that is (e.g. "step 8") when it
    offered several."""
    metric = f"validation Mean@{k}"
    if candidate:
        metric = f"{metric} of its {candidate} actor"
    if source is None:
        return {"decision": "base", "chosen": name, "chosen_score": score, "input": None,
                "input_score": None, "reason": f"the base: {metric} {score:.3f}"}
    prev = (source_record or {}).get("chosen_score")
    if prev is None:
        return {"decision": "kept", "chosen": name, "chosen_score": score, "input": source,
                "input_score": None,
                "reason": f"its input {source} has no validation score; kept"}
    chosen_before = source_record.get("chosen", source)
    if score > prev + min_gain:
        return {"decision": "kept", "chosen": name, "chosen_score": score, "input": source,
                "input_score": prev,
                "reason": f"{metric} {score:.3f} beats its input {source} ({prev:.3f})"
                          + (f" by more than {min_gain}" if min_gain else "")}
    return {"decision": "input", "chosen": chosen_before, "chosen_score": prev,
            "input": source, "input_score": prev,
            "reason": f"{metric} {score:.3f} does not beat its input {source} ({prev:.3f}"
                      + (f" + {min_gain}" if min_gain else "")
                      + f"); {_actor_of(source, chosen_before)} handed on unchanged"}


def _actor_of(source: str, trained_by: str) -> str:
    return (f"{source}'s actor" if trained_by == source
            else f"{source}'s actor (trained by {trained_by})")


def bypassed_record(source: str, source_record: Mapping | None) -> dict:
    """A bypassed stage exports its input: the input's score and choice."""
    rec = dict(source_record or {})
    return {**{k: rec.get(k) for k in ("chosen", "chosen_score", "k", "num_tasks")},
            "decision": "bypassed", "input": source, "input_score": rec.get("chosen_score"),
            "score": rec.get("chosen_score"),
            "reason": f"bypassed: exports its input {source}"}


def rejected_dir(stage_dir: str) -> str:
    """Where a stage keeps the exports that model selection did not hand on."""
    return os.path.join(stage_dir, "rejected")


def replace_exports(spec: StageSpec, stage_dir: str, export_dir: str,
                    sources: Mapping[str, str]) -> str:
    """Replace the stage's exports by copies of `sources` (role -> a directory holding
    `<role>/`: the inputs' exports, or one of the stage's candidates), keeping the stage's
    final ones at `<stage_dir>/rejected/<role>`; returns that directory. Each role is
    swapped by renames after its copy is complete, so an interruption leaves either export
    whole, and a rerun of a decision cut short keeps the final export it already moved (a
    stage that runs again starts without `rejected/`, `Pipeline.run_stage`)."""
    rejected = rejected_dir(stage_dir)
    os.makedirs(rejected, exist_ok=True)
    staging = os.path.join(stage_dir, "rejected.incoming")
    if os.path.isdir(staging):
        shutil.rmtree(staging)
    copy_inputs(spec, staging, sources)
    for role in export_roles(spec.kind):
        src, keep = os.path.join(export_dir, role), os.path.join(rejected, role)
        if os.path.isdir(keep):  # a decision cut short already kept the final export
            if os.path.isdir(src):
                shutil.rmtree(src)
        elif os.path.isdir(src):
            os.replace(src, keep)
        os.replace(os.path.join(staging, role), src)
    shutil.rmtree(staging)
    return rejected
