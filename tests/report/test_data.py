"""Data extraction for the report: credit rows aligned to the sampled tokens, observation
and prompt spans skipped, per-family rewards, inputs validated with the file named."""

import json
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

from terminal_rsi.agent import read_shard, write_shard
from terminal_rsi.report import CreditMismatch, ReportInputError, build_report
from terminal_rsi.report import data as D
from terminal_rsi.report.build import _pick_train_shards

from .fixture_run import HOSTILE, TOK, expected_spans

# module/session-scoped fixtures are expensive: keep these tests on one xdist worker
pytestmark = pytest.mark.xdist_group("report")

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _page(index: pathlib.Path) -> dict:
    text = (index.parent / "data.js").read_text()
    assert text.startswith("window.TRSI_REPORT=") and text.endswith(";\n")
    return json.loads(text[len("window.TRSI_REPORT="):-2])


def _episode(index: pathlib.Path, eid: int) -> dict:
    text = (index.parent / "episodes" / f"{eid:06d}.js").read_text()
    prefix = f"TRSI_EPISODE({eid},"
    assert text.startswith(prefix) and text.endswith(");\n")
    return json.loads(text[len(prefix):-3])


def test_credit_spans_put_advantages_on_the_sampled_tokens(real_run):
    trajs, credit = real_run["trajs"], real_run["credit"]
    rows = [r for r in range(credit["tokens"].shape[0]) if credit["row_episode"][r] >= 0]
    assert len(rows) == len(trajs) + 1  # the summarized episode has two rows
    for r in rows:
        traj = trajs[credit["row_episode"][r]]
        view = D.credit_spans(traj, r, credit, TOK)
        want = expected_spans(traj, credit, r)
        gen = [s for s in view["spans"] if s["k"] == "gen"]
        assert [(s["turn"], s["start"], len(s["adv"])) for s in gen] == \
            [(w["turn"], w["start"], w["n"]) for w in want]
        for s, w in zip(gen, want, strict=True):
            np.testing.assert_allclose(s["adv"], w["adv"], atol=1e-6)
            np.testing.assert_allclose(s["val"], w["val"], atol=1e-6)
            assert s["ids"] == traj.turns[s["turn"]].sampled_ids
            assert "".join(s["tok"]).replace("\u21b5\n", "\n") == \
                TOK.decode(s["ids"])  # ASCII actions: one display string per byte
            assert any(a != 0 for a in s["adv"])  # real TB-GAE output, not padding
        # observation and prompt positions are skipped: a length, no numbers
        skips = [s for s in view["spans"] if s["k"] == "skip"]
        obs = {s["turn"]: s["n"] for s in skips if s["what"] == "observation"}
        assert obs == {w["turn"]: w["obs"] for w in want if w["obs"]}
        assert all("adv" not in s and "val" not in s for s in skips)
        first = traj.segment_turns(view["segment"])[0]
        assert skips[0] == {**skips[0], "what": "prompt", "turn": first,
                            "n": len(traj.turns[first].prompt_ids), "start": 0}
        assert sum(s["n"] if s["k"] == "skip" else len(s["adv"]) for s in view["spans"]) == \
            view["length"] == int((credit["tokens"][r] != 0).sum() or view["length"])
        # the done flag and the reward sit on the episode's last generated token only
        done = [d for s in gen for d in s["done"]]
        if credit["dones"][r].any():
            assert done[-1] and sum(done) == 1
            assert gen[-1]["rew"][-1] == pytest.approx(traj.reward, abs=1e-6)


def test_summarized_episode_has_a_row_per_segment_in_order(real_run):
    trajs, credit = real_run["trajs"], real_run["credit"]
    by_episode, warnings = D.episode_credit(trajs, credit, TOK)
    assert warnings == [] and sorted(by_episode) == list(range(len(trajs)))
    multi = [e for e, rows in by_episode.items() if len(rows) > 1]
    assert multi == [len(trajs) - 1]
    assert [v["segment"] for v in by_episode[multi[0]]] == [0, 1]


def test_misindexed_and_corrupt_rows(real_run):
    trajs, credit = real_run["trajs"], real_run["credit"]
    bad = {k: v.copy() for k, v in credit.items()}
    bad["row_episode"][[0, 1]] = bad["row_episode"][[1, 0]]  # a producer's indexing slip
    bad["tokens"][2, 5] += 1  # a row whose tokens match no episode
    with pytest.raises(CreditMismatch, match="tokens differ"):
        D.credit_spans(trajs[bad["row_episode"][2]], 2, bad, TOK)
    by_episode, warnings = D.episode_credit(trajs, bad, TOK, "x.credit.npz")
    assert sorted(by_episode) == [e for e in range(len(trajs)) if e != 2]
    assert len(warnings) == 3 and "row 2" in warnings[2] and "skipped" in warnings[2]
    good, _ = D.episode_credit(trajs, credit, TOK)
    assert by_episode[0] == good[0] and by_episode[1] == good[1]
    bad["gen_mask"][3, 0] = True
    with pytest.raises(CreditMismatch, match="gen_mask"):
        D.credit_spans(trajs[3], 3, bad, TOK)


def test_family_rows_use_eq6_eq7_with_the_stage_divisors(real_run):
    from terminal_rsi.rewards import FamilyDivisors

    trajs = real_run["trajs"]
    divisors = FamilyDivisors({"fix_script": 8.0})
    eps = [(t, D.episode_rewards(t, divisors)) for t in trajs]
    rows = {r["family"]: r for r in D.family_rows("s", eps)}
    fix = [t for t in trajs if t.family == "fix_script"]
    assert rows["fix_script"]["n"] == len(fix) == 2
    assert rows["fix_script"]["fdr"] == pytest.approx(np.mean([t.P / 8.0 for t in fix]),
                                                      rel=1e-6)
    assert rows["fix_script"]["spr"] == pytest.approx(
        np.mean([t.S + t.P / (t.P + 8.0) for t in fix]), rel=1e-6)
    assert rows["fix_script"]["success"] == pytest.approx(np.mean([t.S for t in fix]))
    assert rows["fix_script"]["mean_p_over_n"] == pytest.approx(
        np.mean([t.P / t.N for t in fix]), rel=1e-6)
    hint = [t for t in trajs if t.family == "hint_lookup"]  # unlisted: fallback 82
    assert rows["hint_lookup"]["fdr"] == pytest.approx(np.mean([t.P / 82.0 for t in hint]),
                                                       rel=1e-6)


def test_divisors_from_the_stage_config(tmp_path):
    from terminal_rsi.rewards import FamilyDivisors

    FamilyDivisors({"fix_script": 8.0}).save(tmp_path / "div.json")
    table, desc = D.divisors_for({"rewards": {"divisors_path": "div.json"}}, [tmp_path])
    assert table.get("fix_script") == 8.0 and "div.json" in desc
    table, desc = D.divisors_for({"rewards": {"divisors_path": "nope.json"}}, [tmp_path])
    assert table.get("fix_script") == 82.0 and "not found" in desc
    assert D.divisors_for(None)[0] == FamilyDivisors()


def test_token_texts():
    ids = TOK.encode("a\n\t") + [0xC3, TOK.end_id, 999]
    assert D.token_texts(TOK, ids) == ["a", "\u21b5\n", "\u21e5", "\\xc3", "<|end|>",
                                       "\u27e8999\u27e9"]
    assert D.token_texts(None, [5, 6]) == ["\u27e85\u27e9", "\u27e86\u27e9"]
    assert D.decode(None, [5, 6]) == "5 6"
    tok, desc = D.load_tokenizer("qwen3_27b_class", {})
    assert tok is None and "ids" in desc
    # the tiny preset decodes with the tokenizer its stage ran with
    tok, desc = D.load_tokenizer("tiny", {"model": {"tokenizer": "bpe"}})
    assert desc.startswith("BPETokenizer") and tok.decode(tok.encode("grep -c ERROR")) == (
        "grep -c ERROR") and len(tok.encode("grep -c ERROR")) < len("grep -c ERROR")
    assert D.load_tokenizer("tiny", {"model": {"tokenizer": "byte"}})[1] == "ByteTokenizer"


def test_report_contents(real_run, built_report):
    page = _page(built_report)
    trajs = real_run["trajs"]
    # base_sft: 2 discovery episodes; rpr1_fdr: 6 step + 2 eval + 2 validation episodes
    assert [e["stage"] for e in page["episodes"]] == ["base_sft"] * 2 + ["rpr1_fdr"] * 10
    assert [e["shard"] for e in page["episodes"]][-2:] == ["validation"] * 2
    assert [s["status"] for s in page["stages"]] == ["done", "done", "failed", "pending"]
    # stage configs name model.preset; the pipeline's run config names the preset itself
    assert {s["tokenizer"] for s in page["stages"]} == {"ByteTokenizer"}
    assert page["stages"][2]["traceback"].startswith("Traceback")
    assert {p["name"] for p in page["plots"]} == {"critic_ev", "progression", "training_curves"}
    for p in page["plots"]:
        assert (built_report.parent / p["file"]).read_bytes()[:4] == b"\x89PNG"
    assert any("absent.png" in w for w in page["warnings"])
    fam = {(f["stage"], f["source"], f["family"]) for f in page["families"]}
    assert ("rpr1_fdr", "ledger eval: heldout_instances", "hint_lookup") in fam
    assert ("base_sft", "episodes (computed)", "create_file") in fam
    assert ("rpr1_fdr", "validation", "hint_lookup") in fam
    step = [e for e in page["episodes"] if e["shard"] == "step_00001"]
    assert [e["credit"] for e in step] == [True] * len(trajs)
    assert not any(e["credit"] for e in page["episodes"] if e["shard"] != "step_00001")
    det = _episode(built_report, step[-1]["id"])
    assert [r["segment"] for r in det["credit"]] == [0, 1]
    assert len(det["turns"]) == len(trajs[-1].turns)
    assert det["instruction"] and "Task:" not in det["instruction"]
    hygiene = [c for c in det["checks"] if c["hygiene"]]
    assert [c["name"] for c in hygiene] == ["hygiene::inputs_unchanged",
                                             "hygiene::no_stray_files"]
    assert _episode(built_report, 0)["checks"] is None  # older shard: counts only
    # run text travels as JSON data (inserted with textContent by report.js), never markup
    observations = [t["observation"] for e in page["episodes"]
                    for t in _episode(built_report, e["id"])["turns"]]
    assert sum(HOSTILE in o for o in observations) == 2  # fix_script wrong: step, validation
    html = built_report.read_text()
    assert "onerror" not in html and "http://" not in html and "https://" not in html
    js = (built_report.parent / "report.js").read_text()
    assert "innerHTML" not in js and "http" not in js  # no markup sinks, no network


def test_bad_inputs_name_the_file(real_run, tmp_path):
    with pytest.raises(ReportInputError, match="run dir not found: .*nowhere"):
        build_report(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ReportInputError, match="neither a run dir"):
        build_report(tmp_path / "empty")
    run = tmp_path / "run"
    shutil.copytree(real_run["run"], run, ignore=shutil.ignore_patterns("report"))
    ledger = run / "ledger.json"
    good = ledger.read_text()
    ledger.write_text(good[:-20])
    with pytest.raises(ReportInputError, match=r"ledger .*ledger\.json is not valid JSON"):
        build_report(run)
    ledger.write_text(json.dumps({"stages": {"a": 1}}))
    with pytest.raises(ReportInputError, match="'stages' must be a list"):
        build_report(run)
    ledger.write_text(good)
    shard = run / "rpr1_fdr" / "trajectories" / "step_00001.jsonl"
    lines = shard.read_text().splitlines(keepends=True)
    shard.write_text(lines[0] + "{not json\n")
    with pytest.raises(ReportInputError, match=r"step_00001\.jsonl:2"):
        build_report(run)
    shard.write_text("".join(lines))
    npz = shard.with_name("step_00001.credit.npz")
    arrays = dict(np.load(npz))
    np.savez(npz, **{k: v for k, v in arrays.items() if k != "advantages"})
    with pytest.raises(ReportInputError, match=r"step_00001\.credit\.npz lacks .*advantages"):
        build_report(run)
    np.savez(npz, **{**arrays, "row_episode": arrays["row_episode"] + 50})
    with pytest.raises(ReportInputError, match="row_episode holds"):
        build_report(run)
    np.savez(npz, **arrays)
    # a ledger plot key is only a label: it cannot place a file outside the report
    led = json.loads(good)
    led["plots"] = {"../../escape": "plots/critic_ev.png"}
    ledger.write_text(json.dumps(led))
    page = _page(build_report(run))
    assert [p["file"] for p in page["plots"]][-1] == "plots/______escape.png"
    assert not (tmp_path / "escape.png").exists() and not (run / "escape.png").exists()
    shutil.rmtree(run / "report")
    ledger.write_text(good)
    (run / "base_sft" / "metrics.jsonl").write_text('{"loss": 1}\n')
    with pytest.raises(ReportInputError, match=r"base_sft/metrics\.jsonl:1: .*'step'"):
        build_report(run)
    # a failed build leaves no partial report; a foreign output dir is refused
    assert not (run / "report").exists()
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "keep.txt").write_text("mine")
    with pytest.raises(ReportInputError, match="not a report folder"):
        build_report(real_run["run"], tmp_path / "foreign")


def test_single_stage_dir_and_rebuild(real_run, tmp_path):
    stage = tmp_path / "rpr1_fdr"
    shutil.copytree(real_run["run"] / "rpr1_fdr", stage)
    index = build_report(stage, options=None)
    page = _page(index)
    assert page["single_stage"] and [s["name"] for s in page["stages"]] == ["rpr1_fdr"]
    assert page["stages"][0]["experiment"] == "rpr_phase"
    assert page["stages"][0]["train"] == {"episodes": 6, "per_family/fix_script": 0.5}
    assert len(page["episodes"]) == 10  # trajectories/, eval/ and validation/ shards
    assert {p["name"] for p in page["plots"]} == {"training_curves"}  # one stage: no progression
    (index.parent / "stale.js").write_text("old")
    trajs = read_shard(stage / "eval" / "heldout_instances.jsonl")
    write_shard(stage / "eval" / "heldout_instances.jsonl", trajs[:1])
    index = build_report(stage)
    assert len(_page(index)["episodes"]) == 9 and not (index.parent / "stale.js").exists()


def test_numbered_shard_series_are_thinned(real_run, tmp_path):
    stage = tmp_path / "stage"
    shutil.copytree(real_run["run"] / "rpr1_fdr", stage)
    tdir = stage / "trajectories"
    one = real_run["trajs"][:1]
    for k in range(2, 6):
        write_shard(tdir / f"step_{k:05d}.jsonl", one)
    for k in (2, 4, 6):
        write_shard(tdir / f"eval_{k:05d}.jsonl", one)
    write_shard(tdir / "q_clean.jsonl", one)
    from terminal_rsi.report import ReportOptions

    page = _page(build_report(stage, options=ReportOptions(max_train_shards=2,
                                                           max_episodes_per_shard=1)))
    assert page["stages"][0]["shards"] == [
        "trajectories/q_clean.jsonl", "trajectories/step_00001.jsonl",
        "trajectories/step_00005.jsonl", "trajectories/eval_00002.jsonl",
        "trajectories/eval_00006.jsonl", "eval/heldout_instances.jsonl",
        "validation/validation.jsonl"]
    assert len(page["episodes"]) == 7
    assert any("showing the first 1 of" in w for w in page["warnings"])


def test_pick_train_shards():
    paths = [f"s{i}" for i in range(10)]
    assert _pick_train_shards(paths, 3) == ["s0", "s4", "s9"] or \
        _pick_train_shards(paths, 3) == ["s0", "s5", "s9"]
    assert _pick_train_shards(paths, 0) == paths and _pick_train_shards(paths, 1) == ["s9"]


def test_experiment_entry_point(real_run, tmp_path):
    out = tmp_path / "out"
    cmd = [sys.executable, "experiments/run.py", "--config=configs/report.py",
           f"--config.run={real_run['run']}", f"--config.output={out}",
           "--config.max_episodes_per_shard=1", f"--workdir={tmp_path / 'wd'}"]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert len(_page(out / "index.html")["episodes"]) == 4  # one per shard
    res = subprocess.run(cmd[:3] + [f"--config.run={tmp_path / 'missing'}"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode != 0 and "run dir not found" in res.stderr and "missing" in res.stderr
