"""Model selection between stages (terminal_rsi.pipeline.validation): the validation split is
disjoint from training and held-out seeds, the selection rule, and the hand-on of a stage's
inputs when its actor does not beat them."""

import os

import numpy as np
import pytest

from terminal_rsi.pipeline.graph import STAGES
from terminal_rsi.pipeline.handoff import restore_export
from terminal_rsi.pipeline.ledger import DECISIONS, LedgerError, validate_ledger
from terminal_rsi.pipeline.validation import (
    best_candidate,
    bypassed_record,
    decide,
    has_validation_split,
    replace_exports,
)
from terminal_rsi.runtime.exports import (
    candidate_exports,
    candidate_steps,
    export_candidate,
    prune_candidates,
)
from terminal_rsi.tasks import get_suite
from terminal_rsi.tasks.builtin import heldout_seed, instance, validation_seed
from terminal_rsi.tasks.registry import PROCEDURAL_SUITES, procedural_split, variant_seeds


def _ids(tasks):
    return {(t.family, t.seed) for t in tasks}


@pytest.mark.parametrize("suite", sorted(PROCEDURAL_SUITES))
def test_validation_split_is_disjoint_from_training_and_held_out_seeds(suite):
    val = list(get_suite(suite, "validation", n_per_family=3))
    train = list(get_suite(suite, "train", n_per_family=40))
    test = list(get_suite(suite, "test", n_per_family=8))
    assert val and not _ids(val) & _ids(train) and not _ids(val) & _ids(test)
    assert {t.family for t in val} == {t.family for t in train}  # the training families
    assert all(validation_seed(t.family, t.seed) and not heldout_seed(t.family, t.seed)
               for t in val)
    # the same instances every time (fixed before any evaluation)
    assert [t.id for t in get_suite(suite, "validation", n_per_family=3)] == [t.id for t in val]


def test_validation_seeds_are_about_a_tenth_of_the_non_held_out_seeds():
    seeds = [s for s in range(4000) if not heldout_seed("sort_uniq", s)]
    frac = sum(validation_seed("sort_uniq", s) for s in seeds) / len(seeds)
    assert 0.07 < frac < 0.13
    assert not any(validation_seed("sort_uniq", s) for s in range(4000)
                   if heldout_seed("sort_uniq", s))


@pytest.mark.parametrize("split", ["train", "validation"])
def test_training_and_validation_cover_every_variant_of_a_family(split):
    # find_tree asks for one of three extensions; the first seeds of either split draw .log
    # twice and no .md, so both splits take their seeds round-robin over the variants
    _, keep = procedural_split("builtin", split)
    tasks = list(get_suite("builtin", split, n_per_family=3))
    got = {f: [instance(f, t.seed).variant for t in tasks if t.family == f]
           for f in ("find_tree", "config_edit")}
    assert sorted(got["find_tree"]) == [".csv", ".log", ".md"]
    assert sorted(got["config_edit"]) == ["2 keys", "3 keys", "4 keys"]
    assert all(keep(t.family, t.seed) for t in tasks)
    first = [s for s in range(200) if keep("find_tree", s)][:3]
    assert sorted(instance("find_tree", s).variant for s in first) != [".csv", ".log", ".md"]
    # a family with one form keeps its first seeds of the split
    assert variant_seeds("sort_uniq", 3, keep) == [s for s in range(200)
                                                   if keep("sort_uniq", s)][:3]
    # round-robin: each variant's seeds in order, the variants in order of first appearance
    six = variant_seeds("find_tree", 6, keep)
    kinds = [instance("find_tree", s).variant for s in six]
    assert kinds[:3] == kinds[3:] and len(set(kinds[:3])) == 3
    for v in set(kinds):
        mine = [s for s, k in zip(six, kinds, strict=True) if k == v]
        assert mine == sorted(mine)
    assert all(keep("find_tree", s) for s in six)
    assert len(set(six)) == 6


def test_the_held_out_instances_stay_the_first_seeds_of_their_split():
    # the test split is not spread over variants: the held-out instances every measured
    # chain was scored on stay fixed
    _, keep = procedural_split("builtin", "test")
    got = [t.seed for t in get_suite("builtin", "test", n_per_family=2, families=("find_tree",))]
    assert got == [s for s in range(200) if keep("find_tree", s)][:2]


def test_only_procedural_suites_have_a_validation_split(tmp_path):
    assert has_validation_split("builtin") and has_validation_split("terminal")
    assert not has_validation_split(str(tmp_path))


def test_the_base_is_scored_and_chosen():
    rec = decide("base", 0.4, None, None, 0.0, 3)
    assert rec["decision"] == "base" and rec["chosen"] == "base" and rec["chosen_score"] == 0.4


def test_a_stage_is_kept_only_if_it_beats_its_input():
    base = decide("base", 0.4, None, None, 0.0, 3)
    up = decide("rsr1", 0.5, "base", base, 0.0, 3)
    assert up["decision"] == "kept" and up["chosen"] == "rsr1" and up["input_score"] == 0.4
    for score in (0.4, 0.3):  # a tie is not a gain: the input goes on
        rec = decide("rsr1", score, "base", base, 0.0, 3)
        assert rec["decision"] == "input" and rec["chosen"] == "base"
        assert rec["chosen_score"] == 0.4 and "handed on unchanged" in rec["reason"]
        assert f"{score:.3f}" in rec["reason"] and "0.400" in rec["reason"]
    assert decide("rsr1", 0.45, "base", base, 0.1, 3)["decision"] == "input"  # min_gain
    assert decide("rsr1", 0.55, "base", base, 0.1, 3)["decision"] == "kept"


def test_a_chain_of_rejections_hands_on_the_last_chosen_actor():
    base = decide("base", 0.4, None, None, 0.0, 3)
    rsr1 = decide("rsr1", 0.3, "base", base, 0.0, 3)
    rpr1 = decide("rpr1_fdr", 0.4, "rsr1", rsr1, 0.0, 3)  # compared with base's 0.4, not 0.3
    assert rpr1["decision"] == "input" and rpr1["chosen"] == "base"
    rsr2 = decide("rsr2", 0.45, "rpr1_fdr", rpr1, 0.0, 3)
    assert rsr2["decision"] == "kept" and rsr2["input_score"] == 0.4


def test_an_input_without_a_score_keeps_the_stage():
    rec = decide("rsr1", 0.1, "base", {}, 0.0, 3)
    assert rec["decision"] == "kept" and "no validation score" in rec["reason"]


def test_a_bypassed_stage_carries_its_inputs_choice():
    rsr1 = {**decide("rsr1", 0.3, "base", decide("base", 0.4, None, None, 0.0, 3), 0.0, 3),
            "k": 3, "num_tasks": 30}
    rec = bypassed_record("rsr1", rsr1)
    assert rec["decision"] == "bypassed" and rec["chosen"] == "base"
    assert rec["score"] == rec["input_score"] == 0.4 and rec["k"] == 3


def _export(root, stage, roles, tag):
    for role in roles:
        d = os.path.join(root, stage, "export", role)
        os.makedirs(d)
        with open(os.path.join(d, "w"), "w") as f:
            f.write(f"{stage}-{role}-{tag}")


def _read(path):
    with open(os.path.join(path, "w")) as f:
        return f.read()


def test_replace_exports_exports_every_input_role_and_keeps_the_trained_ones(tmp_path):
    root = str(tmp_path)
    spec = STAGES["rpr1_fdr"]  # actor from rsr1, critic from warmup_critic
    _export(root, "rsr1", ("actor", "critic"), "in")
    _export(root, "warmup_critic", ("critic",), "in")
    _export(root, "rpr1_fdr", ("actor", "critic"), "trained")
    inputs = {role: os.path.join(root, dep, "export") for role, dep in spec.inputs.items()}
    out = os.path.join(root, "rpr1_fdr", "export")
    rejected = replace_exports(spec, os.path.join(root, "rpr1_fdr"), out, inputs)
    assert _read(os.path.join(out, "actor")) == "rsr1-actor-in"
    assert _read(os.path.join(out, "critic")) == "warmup_critic-critic-in"
    assert _read(os.path.join(rejected, "actor")) == "rpr1_fdr-actor-trained"
    assert _read(os.path.join(rejected, "critic")) == "rpr1_fdr-critic-trained"
    assert sorted(os.listdir(os.path.join(root, "rpr1_fdr"))) == ["export", "rejected"]
    # again (a decision cut short and rerun): the inputs stay exported, the trained ones kept
    replace_exports(spec, os.path.join(root, "rpr1_fdr"), out, inputs)
    assert _read(os.path.join(out, "actor")) == "rsr1-actor-in"
    assert _read(os.path.join(rejected, "actor")) == "rpr1_fdr-actor-trained"
    assert sorted(os.listdir(os.path.join(root, "rpr1_fdr"))) == ["export", "rejected"]


def test_the_ledger_checks_the_decision():
    led = {"format": "terminal_rsi.ledger/1", "run": "/r", "updated": "t",
           "stages": [{"name": "rsr1", "experiment": "rsr", "status": "done", "dir": "rsr1",
                       "validation": {"decision": "kept"}, "eval_wall_s": 3.0}]}
    validate_ledger(led)
    assert set(DECISIONS) == {"base", "kept", "input", "bypassed"}
    led["stages"][0]["validation"]["decision"] = "maybe"
    with pytest.raises(LedgerError, match="validation decision"):
        validate_ledger(led)


def test_the_best_candidate_wins_and_a_tie_goes_to_the_earliest():
    assert best_candidate([0.4, 0.6, 0.5]) == 1
    assert best_candidate([0.5, 0.6, 0.6]) == 1  # fewest updates from the input
    assert best_candidate([0.3]) == 0
    with pytest.raises(ValueError, match="no candidate"):
        best_candidate([])


def test_the_reason_names_the_chosen_candidate():
    base = decide("base", 0.4, None, None, 0.0, 3)
    rec = decide("rpr1_fdr", 0.5, "base", base, 0.0, 3, candidate="step 8")
    assert rec["decision"] == "kept" and "step 8 actor" in rec["reason"]
    assert "step 8" not in decide("rsr1", 0.5, "base", base, 0.0, 3)["reason"]


@pytest.mark.parametrize("first,last,count,want", [
    (0, 12, 3, (4, 8)), (4, 12, 3, (7, 9)), (0, 12, 1, ()), (4, 5, 3, ()), (0, 2, 3, (1,)),
    (0, 0, 3, ()), (0, 4, 8, (1, 2, 3))])
def test_candidate_steps_are_evenly_spaced_between_input_and_final(first, last, count, want):
    assert candidate_steps(first, last, count) == want


def test_candidates_are_written_whole_listed_by_step_and_pruned(tmp_path):
    d = str(tmp_path)
    p = {"w": np.arange(3.0, dtype=np.float32)}
    for step in (8, 4):
        export_candidate(d, step, {"actor": p, "critic": p})
    os.makedirs(os.path.join(d, "candidates", ".step_9.tmp"))  # a save cut short
    got = candidate_exports(d)
    assert [s for s, _ in got] == [4, 8]
    assert sorted(os.listdir(got[0][1])) == ["actor", "critic"]
    assert restore_export(got[1][1], "actor")["w"].tolist() == [0.0, 1.0, 2.0]
    prune_candidates(d, 4)  # a phase resumed at step 4 writes step 8 again
    assert sorted(os.listdir(os.path.join(d, "candidates"))) == ["step_4"]
    prune_candidates(d)
    assert candidate_exports(d) == []
