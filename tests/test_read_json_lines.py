"""runtime.atomic.read_json_lines: the one reader of metrics.jsonl files (rpr phase resume,
pipeline diagnostics, plots and stage stats)."""

import json

import pytest

from terminal_rsi.runtime.atomic import atomic_write_text, read_json_lines


def test_rows_in_order_blank_lines_skipped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": 1, "loss": 0.5}, {"step": 2, "turns": 3.0}]
    atomic_write_text(path, json.dumps(rows[0]) + "\n\n  \n" + json.dumps(rows[1]) + "\n")
    assert read_json_lines(path) == rows


def test_a_missing_file_has_no_rows(tmp_path):
    assert read_json_lines(tmp_path / "none.jsonl") == []


def test_a_malformed_line_raises(tmp_path):
    path = tmp_path / "metrics.jsonl"
    atomic_write_text(path, '{"step": 1}\n{"step": \n')
    with pytest.raises(ValueError):
        read_json_lines(path)
