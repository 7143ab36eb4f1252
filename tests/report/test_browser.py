"""The report in a real browser: Debian's Chromium, headless, over the DevTools protocol.

Loads index.html from file:// (no server), checks there are no console errors, that the page
opens with the headline (per-stage success, the validation decision and its reason, critic
EV, then the progression plot) with notes and the stage record below, that the
filters change the listed episode count as the episodes dictate, that opening an episode
shows its turns, checks and heatmap (one coloured cell per generated token, turn marks,
collapsed observation spans), that hostile observation text is shown, not executed, and
saves a screenshot of the heatmap. Without Chromium: skipped, except under CI=true (fails).
Set TRSI_UPDATE_DOCS_IMG=1 to also refresh docs/img/report_heatmap.png.
"""

import json
import os
import pathlib
import shutil
import struct

import numpy as np
import pytest

from terminal_rsi.report import ReportOptions, build_report
from terminal_rsi.report.browser import Browser, find_chromium

from .fixture_run import HOSTILE, REJECTED, expected_spans

# module/session-scoped fixtures are expensive: keep these tests on one xdist worker
pytestmark = pytest.mark.xdist_group("report")

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def chromium():
    exe = find_chromium()
    if exe is None:
        msg = "Chromium not installed (bash .ci/setup_report.sh as root installs Debian's)"
        if os.environ.get("CI") == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    return exe


def _png_size(path) -> tuple[int, int]:
    data = pathlib.Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_report_in_chromium(chromium, real_run, built_report, tmp_path):
    trajs = real_run["trajs"]
    # the episodes the page lists, from the fixture itself: (stage, shard, traj)
    listed = [("base_sft", "discovery", t) for t in trajs[:2]] + \
        [("rpr1_fdr", "step_00001", t) for t in trajs] + \
        [("rpr1_fdr", "heldout_instances", t) for t in trajs[1:3]] + \
        [("rpr1_fdr", "validation", t) for t in trajs[3:5]]
    with Browser.launch(chromium) as browser:
        page = browser.new_page(1600, 1000)
        page.goto(built_report.as_uri())
        page.wait_for("document.body.dataset.ready === '1'")

        def count():
            return int(page.evaluate("document.getElementById('episode-count').dataset.count"))

        def rows():
            return page.evaluate("document.querySelectorAll('#episode-table tr.episode').length")

        def select(key, value):
            page.evaluate(f"(() => {{ const s = document.getElementById('filter-{key}');"
                          f" s.value = {json.dumps(value)};"
                          " s.dispatchEvent(new Event('change')); })()")

        assert count() == rows() == len(listed)
        _check_headline(page)
        assert page.evaluate("document.querySelectorAll('#stage-ledger > tbody > tr').length") == 4
        assert "<b>no trainable" in page.evaluate(  # the failed stage's error.txt, as text
            "document.querySelector('#stage-ledger details pre').textContent")
        assert page.evaluate("[...document.images].length") == 3
        assert page.wait_for("[...document.images].every(i => i.complete && i.naturalWidth > 0)")
        assert page.evaluate("document.querySelectorAll('#family-stats tbody tr').length") > 3
        _check_diagnostics(page)

        select("stage", "base_sft")
        assert count() == rows() == 2
        select("stage", "rpr1_fdr")
        assert count() == rows() == len(trajs) + 4
        select("outcome", "0")
        failures = [x for x in listed if x[0] == "rpr1_fdr" and x[2].S == 0]
        assert 0 < count() == rows() == len(failures) < len(trajs) + 4
        select("reason", "max_turns")
        assert count() == len([x for x in failures if x[2].terminal_reason == "max_turns"]) > 0
        select("reason", "")
        select("outcome", "")
        select("family", "fix_script")
        assert count() == len([x for x in listed if x[0] == "rpr1_fdr"
                               and x[2].family == "fix_script"])
        select("family", "")
        select("shard", "step_00001")
        assert count() == rows() == len(trajs)

        # open the failing fix_script episode of the step shard by clicking its row
        target = next(i for i, (_, shard, t) in enumerate(listed) if shard == "step_00001"
                      and t.family == "fix_script" and t.S == 0)
        traj = listed[target][2]
        page.evaluate(f"document.querySelector('tr.episode[data-episode=\"{target}\"]').click()")
        page.wait_for(f"document.getElementById('episode-detail').dataset.loaded === "
                      f"'{target}'")
        q = "document.querySelectorAll('#episode-detail {}').length".format
        assert page.evaluate(q(".turn")) == len(traj.turns)
        assert page.evaluate(q("#heatmap .tk")) == traj.num_generated
        assert page.evaluate(q("#heatmap .turn-mark")) == sum(
            1 for t in traj.turns if t.sampled_ids)
        assert page.evaluate(q("#heatmap .skip[data-what=observation]")) == sum(
            1 for t in traj.turns if t.observation_ids)
        assert page.evaluate(q("#heatmap .skip[data-what=prompt]")) == 1
        assert page.evaluate(q("#turn-credit tr.turn-credit")) == len(traj.turns)
        credit = real_run["credit"]
        (row,) = np.flatnonzero(credit["row_episode"] == trajs.index(traj))
        cells = page.evaluate("[...document.querySelectorAll('#turn-credit tr.turn-credit')]"
                              ".map(r => [...r.cells].map(c => c.textContent))")
        for cell, want in zip(cells, expected_spans(traj, credit, row), strict=True):
            assert int(cell[1]) == want["turn"] and int(cell[2]) == want["n"]
            assert float(cell[4]) == pytest.approx(want["adv"][0], abs=1e-4)
            assert float(cell[5]) == pytest.approx(want["val"][0], abs=1e-4)
        assert page.evaluate(q(".check")) == len(traj.meta["checks"])
        assert page.evaluate(q(".check[data-hygiene=\"1\"]")) == 2
        # hostile observation text: shown verbatim, never executed or parsed as markup
        obs = page.evaluate("[...document.querySelectorAll('#episode-detail pre.observation')]"
                            ".map(p => p.textContent).join('\\n')")
        assert HOSTILE in obs
        assert page.evaluate("window.__pwned === undefined")
        assert page.evaluate("document.querySelectorAll('img[src=x], #episode-detail script')"
                             ".length") == 0
        shot = tmp_path / "report_heatmap.png"
        page.screenshot(shot, selector="#credit")
        w, h = _png_size(shot)
        assert w > 400 and h > 100
        # an observation chip expands to its text on click
        page.evaluate("document.querySelector('#heatmap .skip[data-what=observation]').click()")
        assert page.evaluate(q("#heatmap .skip-text")) == 1
        # the heatmap colours by advantage, then by critic value
        first = "document.querySelector('#heatmap .tk').style.background"
        adv_colour = page.evaluate(first)
        page.evaluate("(() => { const s = document.getElementById('heatmap-mode');"
                      " s.value = 'val'; s.dispatchEvent(new Event('change')); })()")
        assert page.evaluate(first) != adv_colour
        assert page.evaluate(q("#heatmap .tk")) == traj.num_generated

        # an episode without credit arrays says so
        no_credit = next(i for i, (_, shard, _t) in enumerate(listed) if shard == "discovery")
        page.evaluate(f"trsiOpenEpisode({no_credit})")
        page.wait_for(f"document.getElementById('episode-detail').dataset.loaded === "
                      f"'{no_credit}'")
        assert page.evaluate(q("#no-credit")) == 1
        assert page.evaluate(q(".check[data-hygiene=\"1\"]")) == 2  # from the report's counts
        assert page.errors == [], page.errors
    if os.environ.get("TRSI_UPDATE_DOCS_IMG") == "1":
        (ROOT / "docs" / "img").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, ROOT / "docs" / "img" / "report_heatmap.png")


def _check_headline(page):
    """The first section is the headline: one row per stage with the decision and its reason,
    then the progression plot; the notes and the folded stage record come after."""
    assert page.evaluate("document.querySelector('section').id") == "headline"
    assert page.evaluate("[...document.querySelectorAll('section')].map(s => s.id)") == [
        "headline", "notes", "plots", "diagnostics", "families", "stages", "browser"]
    cells = page.evaluate("[...document.querySelectorAll('#headline-stages tbody tr')]"
                          ".map(r => [...r.cells].map(c => c.textContent))")
    assert [c[0] for c in cells] == ["base_sft", "rpr1_fdr", "rpr2_spr", "final_eval"]
    # stage, status, hi Mean@1, hi pass@1, hf Mean@1, validation, decision, EV, wall
    assert cells[1][:6] == ["rpr1_fdr", "done", "50.0", "50.0", "0.0", "25.0 vs 50.0 (base_sft)"]
    assert cells[1][6] == "input handed on" + REJECTED
    assert cells[1][7:] == ["0.42", "1265"]
    assert cells[0][5:] == ["50.0", "basethe base: validation Mean@1 0.500", "0.00", "642"]
    assert cells[2][5:] == ["–", "–", "–", "–"]  # no validation record, no eval, no wall
    assert page.evaluate("document.querySelector('#headline-stages td[data-decision=input]')"
                         ".closest('tr').dataset.stage") == "rpr1_fdr"
    assert page.evaluate("document.querySelector('#headline-plot img').alt") == "progression"
    assert page.evaluate("document.querySelectorAll('#plot-list img[alt=progression]').length") \
        == 0
    notes = page.evaluate("[...document.querySelectorAll('#note-list > li')]"
                          ".map(li => li.textContent)")
    assert len(notes) == 1 and "absent.png" in notes[0]
    assert page.evaluate("document.getElementById('stage-details').open") is False
    assert page.evaluate("document.querySelectorAll('#train-numbers tbody tr').length") == 4


def _check_diagnostics(page):
    """The training diagnostics table: a row per stage with diagnostics, a column each (the
    fixture's numbers as the page prints them), and per-family before → after."""
    head = page.evaluate("[...document.querySelectorAll('#diagnostics-stages thead th')]"
                         ".map(c => c.textContent)")
    assert head[0] == "stage" and "policy movement |Δ log π|" in head
    assert "clip frac (mean)" in head and "approx KL (last)" in head
    rows = page.evaluate("[...document.querySelectorAll('#diagnostics-stages tbody tr')]"
                         ".map(r => [...r.cells].map(c => c.textContent))")
    assert [r[0] for r in rows] == ["base_sft", "rpr1_fdr"]
    cell = dict(zip(head, rows[1], strict=True))
    assert (cell["turns / episode"], cell["joint steps"], cell["clip frac (last)"]) == (
        "2.500", "2", "0.125")
    assert (cell["approx KL (mean)"], cell["policy movement |Δ log π|"]) == ("2.00e-4", "0.063")
    assert (cell["critic EV, batch (last)"], cell["critic EV, eval"]) == ("0.300", "0.420")
    assert dict(zip(head, rows[0], strict=True))["clip frac (mean)"] == "–"
    fams = page.evaluate("[...document.querySelectorAll('#diagnostics-families tbody tr')]"
                         ".map(r => [...r.cells].map(c => c.textContent))")
    assert fams == [["base_sft", "heldout_instances", "hint_lookup", "–", "25.0", "–"],
                    ["rpr1_fdr", "heldout_instances", "fix_script", "100.0", "–", "–"],
                    ["rpr1_fdr", "heldout_instances", "hint_lookup", "25.0", "50.0",
                     "+25.0"]]


def test_old_ledger_and_folded_notes_in_chromium(chromium, real_run, tmp_path):
    """A ledger without validation or eval_wall_s, with every shard truncated: the headline
    shows dashes for the decision, the truncation notes fold into one line."""
    run = tmp_path / "run"
    shutil.copytree(real_run["run"], run, ignore=shutil.ignore_patterns("report"))
    ledger = json.loads((run / "ledger.json").read_text())
    for s in ledger["stages"]:
        s.pop("validation", None)
        s.pop("eval_wall_s", None)
    (run / "ledger.json").write_text(json.dumps(ledger))
    index = build_report(run, options=ReportOptions(max_episodes_per_shard=1))
    with Browser.launch(chromium) as browser:
        page = browser.new_page(1400, 900)
        page.goto(index.as_uri())
        page.wait_for("document.body.dataset.ready === '1'")
        decisions = page.evaluate("[...document.querySelectorAll('#headline-stages td"
                                  ".decision')].map(c => c.textContent)")
        assert decisions == ["–"] * 4
        notes = page.evaluate("[...document.querySelectorAll('#note-list > li')]"
                              ".map(li => li.querySelector('summary') ?"
                              " li.querySelector('summary').textContent : li.textContent)")
        assert notes[1] == ("4 trajectory shards truncated to their first episodes "
                            "(max_episodes_per_shard)")
        assert page.evaluate("document.querySelectorAll('#note-list details li').length") == 4
        assert page.errors == [], page.errors


def test_page_errors_are_caught(chromium, tmp_path):
    """The error collection the test above relies on sees missing scripts and exceptions."""
    (tmp_path / "p.html").write_text('<!doctype html><link rel="icon" href="data:,">'
                                     '<script src="missing.js"></script>'
                                     "<script>throw new Error('boom')</script>")
    with Browser.launch(chromium) as browser:
        page = browser.new_page()
        page.goto((tmp_path / "p.html").as_uri())
        page.wait_for("document.readyState === 'complete'")
        page.wait_for("true")
        text = " ".join(page.errors)
        assert "boom" in text and "missing.js" in text, page.errors


def test_find_chromium_honours_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("CHROMIUM", str(tmp_path / "no-such-browser"))
    assert find_chromium() is None
    fake = tmp_path / "chromium"
    fake.write_text("#!/bin/sh\n")
    monkeypatch.setenv("CHROMIUM", str(fake))
    assert find_chromium() == str(fake)
