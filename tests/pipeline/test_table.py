"""The seed table tool (terminal_rsi.pipeline.table) on synthetic ledgers: three seeds, one
missing a stage, one written before model selection (no validation, no eval_wall_s). Every
number in the output is checked against values computed here with `statistics`."""

import json
import statistics

from terminal_rsi.pipeline import table as T

K = 3
# seed -> stage -> (heldout_instances mean, pass@3, heldout_families mean, pass@3)
SCORES = {
    "s0": {"base": (0.40, 0.60, 0.10, 0.20), "rsr1": (0.50, 0.65, 0.15, 0.30),
           "rpr1": (0.45, 0.70, 0.20, 0.30)},
    "s1": {"base": (0.50, 0.55, 0.05, 0.10), "rpr1": (0.55, 0.75, 0.25, 0.40)},  # no rsr1
    "s2": {"base": (0.35, 0.50, 0.10, 0.20), "rsr1": (0.30, 0.50, 0.10, 0.10),
           "rpr1": (0.30, 0.45, 0.05, 0.10)},
}
WALL = {"s0": (10.0, 5.0, 2.0), "s1": (11.0, 4.0, 3.0), "s2": (12.0, None, None)}
DECISIONS = {"s0": {"base": "base", "rsr1": "kept", "rpr1": "input"},
             "s1": {"base": "base", "rpr1": "kept"}}


def _suite(mean, pass_k):
    return {"k": K, "num_tasks": 20, "mean_at_k": mean, "pass_at_k": {"1": mean / 2,
                                                                      str(K): pass_k},
            "process_reward": mean + 0.1, "explained_variance": mean - 0.5}


def _stage(seed, name):
    hi, hp, fi, fp = SCORES[seed][name]
    train, ev, val = WALL[seed]
    s = {"name": name, "experiment": name, "status": "done", "dir": name, "wall_s": train,
         "eval": {"heldout_instances": _suite(hi, hp), "heldout_families": _suite(fi, fp)}}
    if ev is not None:
        s["eval_wall_s"] = ev
    if seed in DECISIONS:
        s["validation"] = {"decision": DECISIONS[seed][name], "wall_s": val, "score": 0.5}
    return s


def _ledger(seed):
    return {"format": "terminal_rsi.ledger/1", "run": f"/runs/{seed}",
            "stages": [_stage(seed, n) for n in SCORES[seed]]}


LEDGERS = {seed: _ledger(seed) for seed in SCORES}


def _pct(x):
    return f"{100 * x:.1f}"


def _spread(xs):
    if len(xs) == 1:
        return _pct(xs[0])
    return (f"{_pct(statistics.mean(xs))} ± {_pct(statistics.stdev(xs))} "
            f"({_pct(min(xs))}–{_pct(max(xs))})")


def _rows(text):
    """{first cell: cells} of the markdown rows of `text` (header and rule skipped)."""
    out = {}
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith("| stage "):
            cells = [c.strip() for c in line.strip("|").split("|")]
            out[cells[0]] = cells[1:]
    return out


def _column(stage, i):
    return [SCORES[s][stage][i] for s in SCORES if stage in SCORES[s]]


def test_stage_table_numbers():
    text = T.stage_table(LEDGERS)
    rows = _rows(text)
    assert list(rows) == ["base", "rsr1", "rpr1"]  # graph order, s1's gap kept in place
    assert "Mean@3" in text and "pass@3" in text
    for stage, cells in rows.items():
        n = sum(stage in SCORES[s] for s in SCORES)
        assert cells[0] == f"{n}/3"
        assert cells[1:5] == [_spread(_column(stage, i)) for i in range(4)]
        assert cells[5] == _spread([x + 0.1 for x in _column(stage, 0)])
        evs = [x - 0.5 for x in _column(stage, 0)]  # explained variance: not a percent
        assert cells[6] == (f"{statistics.mean(evs):.2f} ± {statistics.stdev(evs):.2f} "
                            f"({min(evs):.2f}–{max(evs):.2f})")
        walls = [sum(w for w in WALL[s] if w is not None) for s in SCORES
                 if stage in SCORES[s]]
        assert cells[7] == f"{statistics.mean(walls):.0f} ({min(walls):.0f}–{max(walls):.0f})"
    assert rows["base"][8] == "base 2/3, no record 1/3"
    assert rows["rsr1"][8] == "kept 1/2, no record 1/2"
    assert rows["rpr1"][8] == "kept 1/3, input 1/3, no record 1/3"


def test_one_run_and_a_list_of_ledgers():
    rows = _rows(T.stage_table([LEDGERS["s2"]]))  # what the pipeline prints after a run
    assert rows["rsr1"] == ["1/1", _pct(0.30), _pct(0.50), _pct(0.10), _pct(0.10),
                            _pct(0.40), "-0.20", "12", "-"]


def test_seed_table_and_gain_line():
    text = T.seed_table(LEDGERS)
    lines = text.splitlines()
    assert lines[0] == "heldout_instances Mean@3 (%) per run"
    assert lines[1] == ("| stage | s0 | s1 | s2 | mean ± sd (min–max) | validation (s0 s1 s2) |")
    rows = _rows(text)
    for stage, cells in rows.items():
        want = [_pct(SCORES[s][stage][0]) if stage in SCORES[s] else "-" for s in SCORES]
        assert cells[:3] == want
        assert cells[3] == _spread(_column(stage, 0))
    assert rows["base"][4] == "B B ·" and rows["rsr1"][4] == "K · ·"
    assert rows["rpr1"][4] == "I K ·"
    gains = {s: 100 * (SCORES[s]["rpr1"][0] - SCORES[s]["base"][0]) for s in SCORES}
    held = sum(g >= 0 for g in gains.values())
    assert lines[-1] == (
        "gain base→rpr1 (heldout_instances Mean@3, points): "
        + ", ".join(f"{s} {g:+.1f}" for s, g in gains.items())
        + f"; mean {statistics.mean(gains.values()):+.1f} ± "
        f"{statistics.stdev(gains.values()):.1f}; {held}/3 chains ended at or above their base")
    assert held == 2


def test_gain_line_names_a_chain_that_ends_elsewhere():
    short = {**LEDGERS, "s3": {"run": "/runs/s3", "stages": [_stage("s0", "base"),
                                                             _stage("s0", "rsr1")]}}
    line = T.gain_line(short)
    gains = [5.0, 5.0, -5.0, 10.0]  # s0..s2 base→rpr1, s3 base→rsr1
    assert "s2 -5.0, s3 +10.0 (base→rsr1);" in line
    assert (f"mean {statistics.mean(gains):+.1f} ± {statistics.stdev(gains):.1f}; "
            "3/4 chains ended at or above their base") in line
    assert T.gain_line({"a": {"stages": [_stage("s0", "base")]}}).endswith(
        "no run has two evaluated stages")


def test_stage_names_merge_graph_order():
    a = {"stages": [{"name": n} for n in ("base", "rsr1", "rpr1")]}
    b = {"stages": [{"name": n} for n in ("base", "warmup", "rpr1", "rsr2")]}
    assert T.stage_names([a, b]) == ["base", "warmup", "rsr1", "rpr1", "rsr2"]


def test_main_labels_runs_by_directory(tmp_path, capsys):
    dirs = []
    for seed, led in LEDGERS.items():
        d = tmp_path / f"chain_{seed}"
        d.mkdir()
        (d / "ledger.json").write_text(json.dumps(led))
        dirs.append(str(d) + "/")
    T.main(dirs)
    out = capsys.readouterr().out
    assert "| stage | chain_s0 | chain_s1 | chain_s2 |" in out
    assert out.index("| stage | runs |") < out.index("per run")
    assert T.run_labels(["/a/run", "/b/run", "/c/x"]) == ["/a/run", "/b/run", "x"]
