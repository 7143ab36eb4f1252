"""Trajectory records, JSON Lines shards, and the packing function's arrays and invariants."""

import json

import numpy as np
import pytest

from terminal_rsi.agent import (
    TRAINING_POLICY,
    PackingError,
    Segment,
    TerminalReason,
    TrainingPolicy,
    Trajectory,
    TrajectoryFormatError,
    Turn,
    pack_trajectories,
    read_shard,
    write_shard,
)
from terminal_rsi.agent.packing import check_packed
from terminal_rsi.credit import tb_gae
from terminal_rsi.models.sampling import Buckets

BUCKETS = Buckets(prefill_chunk=8, cache_multiple=8, batch_multiple=4, power_of_two=False)


def _traj(reason=TerminalReason.DECLARED_COMPLETE, reward=0.5, summarized=False):
    turns = [Turn([1, 2, 3], [10, 11], [-0.1, -0.2], [4, 5], 0),
             Turn([], [12], [-0.3], [], 0)]
    segs = [Segment(0, 0)]
    if summarized:
        turns.append(Turn([1, 7], [13, 14, 15], [-0.4, -0.5, -0.6], [], 1))
        segs.append(Segment(1, 2, 0, "summary"))
    return Trajectory("t/0", "fam", "h", 3, turns, segs, reason, reward=reward, S=1, P=2, N=3)


def test_prompt_at_rebuilds_linear_history():
    t = _traj(summarized=True)
    assert t.prompt_at(0) == [1, 2, 3]
    assert t.prompt_at(1) == [1, 2, 3, 10, 11, 4, 5]
    assert t.prompt_at(2) == [1, 7]  # a new segment starts from its own prompt


def test_turn_requires_one_logprob_per_id():
    with pytest.raises(TrajectoryFormatError, match="logprobs"):
        Turn([1], [2, 3], [0.0])


def test_every_reason_has_a_training_policy():
    assert set(TRAINING_POLICY) == set(TerminalReason)
    assert TRAINING_POLICY[TerminalReason.VERIFIER_ERROR] == TrainingPolicy.DROP
    assert TRAINING_POLICY[TerminalReason.CONTEXT_OVERFLOW] == TrainingPolicy.KEEP_BOOTSTRAP


def test_shard_roundtrip_and_table_shape(tmp_path):
    trajs = [_traj(), _traj(TerminalReason.MAX_TURNS, 0.0, summarized=True)]
    path = tmp_path / "shard-0000.jsonl"
    assert write_shard(path, trajs) == 2
    back = read_shard(path)
    assert [t.to_dict() for t in back] == [t.to_dict() for t in trajs]
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    # one flat record per line, same top-level keys: what pandas.read_json(lines=True) needs
    assert len({tuple(sorted(r)) for r in rows}) == 1
    assert rows[1]["terminal_reason"] == "max_turns" and rows[1]["training_policy"] == \
        "keep_reward"
    assert not list(tmp_path.glob(".*tmp"))  # atomic write leaves no temp file


def test_shard_reads_with_pandas(tmp_path):
    pd = pytest.importorskip("pandas")
    path = tmp_path / "s.jsonl"
    write_shard(path, [_traj(), _traj(reward=1.0)])
    df = pd.read_json(path, lines=True)
    assert list(df["reward"]) == [0.5, 1.0] and "turns" in df.columns


def test_bad_shard_line_names_the_line(tmp_path):
    path = tmp_path / "s.jsonl"
    write_shard(path, [_traj()])
    path.write_text(path.read_text() + '{"task_id": "x", "bogus": 1}\n')
    with pytest.raises(TrajectoryFormatError, match=r"s.jsonl:2"):
        read_shard(path)


def _expected_row(traj, seg):
    """Independent reference: concatenate the segment's parts by hand."""
    toks, gen, lps = [], [], []
    for t in traj.turns:
        if t.segment != seg:
            continue
        toks += t.prompt_ids + t.sampled_ids + t.observation_ids
        gen += [0] * len(t.prompt_ids) + [1] * len(t.sampled_ids) + [0] * len(t.observation_ids)
        lps += [0.0] * len(t.prompt_ids) + t.logprobs + [0.0] * len(t.observation_ids)
    return toks, gen, lps


def test_pack_arrays_match_hand_built_rows():
    a = _traj(reward=0.75)
    b = _traj(TerminalReason.CONTEXT_OVERFLOW, reward=0.9, summarized=True)
    c = _traj(TerminalReason.VERIFIER_ERROR)
    batch = pack_trajectories([a, b, c], buckets=BUCKETS)
    assert batch.kept == [0, 1] and batch.dropped == [2]
    assert batch.num_rows == 3 and batch.tokens.shape == (4, 8)
    for row, (traj, seg) in enumerate([(a, 0), (b, 0), (b, 1)]):
        toks, gen, lps = _expected_row(traj, seg)
        m = len(toks)
        np.testing.assert_array_equal(batch.tokens[row, :m], toks)
        np.testing.assert_array_equal(batch.tokens[row, m:], 0)
        np.testing.assert_array_equal(batch.gen_mask[row, :m], gen)
        np.testing.assert_allclose(batch.logprobs[row, :m], lps)
        np.testing.assert_array_equal(batch.segment_ids[row], [1] * m + [0] * (8 - m))
        np.testing.assert_array_equal(batch.positions[row, :m], np.arange(m))
    # a: terminated; reward once on the last generated token (position 7: the id 12)
    assert batch.dones[0].sum() == 1 and batch.dones[0, 7] and batch.rewards[0, 7] == 0.75
    assert (batch.rewards[0] != 0).sum() == 1
    # b: context overflow = cut-off: no done, no reward; segments linked
    assert not batch.dones[1:3].any() and not batch.rewards[1:3].any()
    assert list(batch.next_row[:4]) == [-1, 2, -1, -1]
    assert list(batch.truncated[:4]) == [False, True, True, False]
    assert list(batch.row_episode) == [0, 1, 1, -1] and list(batch.row_segment) == [0, 0, 1, -1]
    assert list(batch.policy_version) == [3, 3, 3, -1]
    # turn ids: episode turn index on real tokens, -1 on padding
    assert list(batch.turn_ids[0]) == [0] * 7 + [1]
    assert list(batch.turn_ids[3]) == [-1] * 8


def test_packed_batch_feeds_tb_gae():
    batch = pack_trajectories([_traj(reward=1.0)], buckets=BUCKETS)
    adv, _, _ = tb_gae(batch.rewards, np.zeros(batch.rewards.shape, np.float32),
                      batch.turn_ids, batch.gen_mask, batch.dones, gamma_turn=1.0,
                      lambda_turn=1.0)
    # zero values, gamma = lambda = 1: every generated token's advantage is the reward
    np.testing.assert_allclose(np.asarray(adv)[batch.gen_mask], 1.0)


def test_invariant_violations_are_caught():
    a = _traj(reward=0.5)
    batch = pack_trajectories([a], buckets=BUCKETS)
    batch.rewards[0, 0] = 1.0  # on a prompt token
    with pytest.raises(ValueError, match="non-generated"):
        check_packed(batch, [a])
    batch = pack_trajectories([a], buckets=BUCKETS)
    batch.dones[0, 4] = True  # a second done on a generated token
    with pytest.raises(PackingError, match="2 done flags"):
        check_packed(batch, [a])
    with pytest.raises(PackingError, match="max_len"):
        pack_trajectories([a], buckets=BUCKETS, max_len=5)


def test_malformed_mask_marks_the_tokens_of_malformed_turns():
    """`malformed_mask` is True exactly on the generated tokens of turns that failed to parse
    or were cut off (checked against a per-token loop over the packed turn ids)."""
    from terminal_rsi.agent import malformed_mask

    bad_parse = _traj(summarized=True)
    bad_parse.turns[1].parse_error = "no valid JSON action"
    cut = _traj()
    cut.turns[0].stop_reason = "length"
    clean = _traj()
    empty = Trajectory("t/1", "fam", "h", 3, [], [Segment(0, 0)],
                       TerminalReason.INFRASTRUCTURE_ERROR)
    trajs = [bad_parse, empty, cut, clean]
    b = pack_trajectories(trajs, buckets=BUCKETS)
    got = malformed_mask(b, trajs)
    want = np.zeros_like(b.gen_mask)
    for i in range(b.num_rows):
        traj = trajs[b.kept[b.row_episode[i]]]
        for t in range(b.gen_mask.shape[1]):
            if b.gen_mask[i, t]:
                turn = traj.turns[b.turn_ids[i, t]]
                want[i, t] = turn.parse_error is not None or turn.stop_reason == "length"
    np.testing.assert_array_equal(got, want)
    assert got[:b.num_rows].any(1).tolist() == [True, False, True, False]  # bad_parse: 2 rows
    assert got.sum() == 1 + 2  # turn 1 of bad_parse (1 token), turn 0 of cut (2 tokens)
    assert not (got & ~b.gen_mask).any()
