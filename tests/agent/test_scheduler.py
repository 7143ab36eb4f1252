"""Rollout scheduler: cross-episode batching, oversampling, stragglers, async mode, and
episodes with the tiny model through the sampler."""

import numpy as np
import pytest
from flax import nnx

from terminal_rsi.agent import (
    HarnessConfig,
    ReferencePolicy,
    SamplerPolicy,
    ScriptedPolicy,
    TerminalReason,
    pack_trajectories,
)
from terminal_rsi.agent.harness import reference_action
from terminal_rsi.agent.scheduler import (
    BatchingPolicy,
    RolloutScheduler,
    SchedulerConfig,
)
from terminal_rsi.models.config import ModelConfig
from terminal_rsi.models.logprobs import chunked_token_logprobs, logprob_gap
from terminal_rsi.models.sampling import Buckets, Sampler
from terminal_rsi.models.tokenizer import ByteTokenizer
from terminal_rsi.models.transformer import DecoderLM
from terminal_rsi.rewards import EpisodeScorer, FamilyDivisors, VerificationReport, fdr
from terminal_rsi.tasks import get_suite

TOK = ByteTokenizer()


def _tasks(n, family="create_file"):
    return list(get_suite("builtin", "train", families=[family], n_per_family=n))


def test_num_launch_matches_paper_ratio():
    s = RolloutScheduler(ReferencePolicy(TOK))
    assert s.num_launch(256) == 288 and s.num_launch(8) == 9
    assert RolloutScheduler(None, config=SchedulerConfig(oversample=0)).num_launch(5) == 5


def test_collect_reference_batch_all_succeed_and_batches_generation():
    pol = ReferencePolicy(TOK)
    sched = RolloutScheduler(pol, HarnessConfig(max_turns=4), config=SchedulerConfig(
        concurrency=4, oversample=0.0, max_batch_wait_s=2.0))
    res = sched.collect(_tasks(4), batch_size=4)
    assert len(res.trajectories) == 4 and res.stats["success_rate"] == 1.0
    assert all(t.terminal_reason == TerminalReason.DECLARED_COMPLETE for t in res.trajectories)
    assert res.stats["policy_calls"] < 4  # four episodes' first turns shared a policy call
    assert res.stats["generated_tokens"] == sum(t.num_generated for t in res.trajectories)
    batch = pack_trajectories(res.trajectories)
    assert batch.num_rows == 4 and batch.dones.sum() == 4


def test_the_stage_scorer_scores_every_episode_before_the_stats():
    """The harness records the verifier's report; the scheduler applies the stage's reward
    (FDR with its frozen divisors) to each finished episode, so stats see the scores."""
    wrong = ScriptedPolicy(TOK, lambda r: '{"commands": [{"keystrokes": "true"}], '
                                          '"task_complete": true}')
    divisors = FamilyDivisors(divisors={"create_file": 2.0})
    for policy in (ReferencePolicy(TOK), wrong):
        unscored = RolloutScheduler(policy, HarnessConfig(max_turns=2),
                                    config=SchedulerConfig(concurrency=2, oversample=0.0))
        scored = RolloutScheduler(policy, HarnessConfig(max_turns=2),
                                  config=SchedulerConfig(concurrency=2, oversample=0.0),
                                  scorer=EpisodeScorer("fdr", divisors))
        plain, res = unscored.collect(_tasks(2), 2), scored.collect(_tasks(2), 2)
        assert all((t.reward, t.reward_fn) == (0.0, "") for t in plain.trajectories)
        for t in res.trajectories:
            report = VerificationReport.from_dict(t.report)
            want = fdr(report, "create_file", divisors)  # the scalar Eq. 6 directly
            assert t.reward_fn == "fdr" and t.reward == pytest.approx(want)
        assert res.stats["mean_reward_kept"] == pytest.approx(
            np.mean([t.reward for t in res.trajectories]))


def _slow_task_script(slow_id):
    def script(r):
        if r.task.id == slow_id:
            return '{"commands": [{"keystrokes": "sleep 2"}]}'
        return reference_action(r.task, r.turn)
    return script


@pytest.mark.parametrize("keep", [False, True])
def test_oversampling_keeps_first_b_and_handles_stragglers(keep):
    tasks = _tasks(4)
    pol = ScriptedPolicy(TOK, _slow_task_script(tasks[0].id))
    # cancelled stragglers stop at their next turn boundary: give the slow one a second turn
    sched = RolloutScheduler(pol, HarnessConfig(max_turns=1 if keep else 2),
                             config=SchedulerConfig(concurrency=4, oversample=1 / 3,
                                                    keep_stragglers=keep, max_batch_wait_s=0.01))
    res = sched.collect(tasks, batch_size=3)
    assert res.stats["launched"] == 4
    assert sorted(t.task_id for t in res.trajectories) == sorted(t.id for t in tasks[1:])
    if keep:
        assert [t.task_id for t in res.stragglers] == [tasks[0].id]
        assert res.stragglers[0].terminal_reason == TerminalReason.MAX_TURNS
        assert res.stats["finish_s_mean_stragglers"] > res.stats["finish_s_max_kept"]
    else:
        assert res.stragglers == [] and res.stats["cancelled"] == 1


def test_dropped_episodes_do_not_fill_the_batch():
    tasks = _tasks(3)

    def factory(task):
        if task.id == tasks[0].id:
            raise OSError("host down")
        from terminal_rsi.tasks import open_task_sandbox
        return open_task_sandbox(task, "local")

    sched = RolloutScheduler(ReferencePolicy(TOK), HarnessConfig(max_turns=2), factory,
                             SchedulerConfig(concurrency=3, oversample=0.5))
    res = sched.collect(tasks, batch_size=2)
    assert len(res.trajectories) == 2 and [t.task_id for t in res.dropped] == [tasks[0].id]
    assert res.dropped[0].terminal_reason == TerminalReason.INFRASTRUCTURE_ERROR


def test_batching_policy_propagates_errors():
    class Broken:
        tokenizer = TOK

        def generate(self, requests):
            raise RuntimeError("device lost")

    bp = BatchingPolicy(Broken(), 0.0)
    try:
        with pytest.raises(RuntimeError, match="device lost"):
            bp.generate([])
    finally:
        bp.close()


def test_tiny_model_episodes_are_well_formed():
    cfg = ModelConfig(vocab_size=TOK.vocab_size, d_model=32, n_layers=1, n_heads=2,
                      n_kv_heads=1, head_dim=16, d_ff=64, max_seq_len=2048)
    graphdef, state = nnx.split(DecoderLM(cfg, rngs=nnx.Rngs(0)))
    sampler = Sampler(graphdef, cfg, decode_block=8, buckets=Buckets(
        prefill_chunk=256, cache_multiple=1024, batch_multiple=4, power_of_two=False))
    pol = SamplerPolicy(sampler, nnx.to_pure_dict(state), TOK, seed=0, version=7)
    h = HarnessConfig(max_turns=2, max_output_tokens=8, temperature=1.0)
    sched = RolloutScheduler(pol, h, config=SchedulerConfig(
        concurrency=3, oversample=0, max_batch_wait_s=2.0))
    res = sched.collect(_tasks(3), batch_size=3)
    assert len(res.trajectories) == 3, res.errors
    for t in res.trajectories:
        assert t.policy_version == 7 and t.terminal_reason in (
            TerminalReason.MAX_TURNS, TerminalReason.DECLARED_COMPLETE)
        assert t.report is not None and t.S == 0
        for i, turn in enumerate(t.turns):
            assert 0 < len(turn.sampled_ids) <= 8 and turn.policy_version == 7
            assert all(0 <= x < TOK.vocab_size for x in turn.sampled_ids)
            lp = np.asarray(turn.logprobs)
            assert np.all(np.isfinite(lp)) and np.all(lp <= 0)
            assert t.prompt_at(i)[-1] == TOK.special_ids["<|assistant|>"]
    assert res.stats["mean_generation_batch"] > 1
    batch = pack_trajectories(res.trajectories, buckets=sampler.buckets)
    assert batch.tokens.shape[1] % 1024 == 0
    # token-in/token-out end to end: the packed rollout logprobs equal the training-side
    # recomputation on the packed arrays (positions and masks line up)
    train_lp = chunked_token_logprobs(nnx.to_pure_dict(state), graphdef, batch.tokens,
                                      batch.positions, batch.segment_ids)
    gap = logprob_gap(batch.logprobs, np.asarray(train_lp), batch.gen_mask)
    assert gap["logprob_gap_max_abs"] < 2e-3, gap
    np.testing.assert_allclose(
        batch.logprobs[batch.gen_mask],
        np.concatenate([np.concatenate([t.logprobs for t in tr.turns])
                        for tr in res.trajectories]).astype(np.float32))


def test_rollouts_over_a_sandbox_pool():
    from terminal_rsi.agent.harness import pool_sandbox_factory
    from terminal_rsi.sandbox.pool import SandboxPool

    with SandboxPool(["local"], max_concurrent=2) as pool:
        sched = RolloutScheduler(ReferencePolicy(TOK), HarnessConfig(max_turns=4),
                                 pool_sandbox_factory(pool, timeout=60),
                                 SchedulerConfig(concurrency=3, oversample=0))
        res = sched.collect(_tasks(2, "env_repair") + _tasks(1), batch_size=3)
        assert res.stats["success_rate"] == 1.0 and len(res.trajectories) == 3, res.errors
        assert pool.stats() == {"local": 0}  # every episode's sandbox went back


def _tiny_sampler_policy(seed):
    cfg = ModelConfig(vocab_size=TOK.vocab_size, d_model=32, n_layers=1, n_heads=2,
                      n_kv_heads=1, head_dim=16, d_ff=64, max_seq_len=2048)
    graphdef, state = nnx.split(DecoderLM(cfg, rngs=nnx.Rngs(0)))
    sampler = Sampler(graphdef, cfg, decode_block=8, buckets=Buckets(
        prefill_chunk=256, cache_multiple=1024, batch_multiple=4, power_of_two=False))
    return SamplerPolicy(sampler, nnx.to_pure_dict(state), TOK, seed=seed)


def test_episode_streams_replay_the_same_episodes_whatever_runs_beside_them():
    """Evaluation's common random numbers: episode i samples from stream i, so the same
    actor gives the same episodes at any concurrency and batch composition."""
    h = HarnessConfig(max_turns=2, max_output_tokens=8, temperature=1.0)
    tasks = _tasks(2) + _tasks(2, "count_lines")

    def sampled(seed, concurrency, streams=True):
        sched = RolloutScheduler(_tiny_sampler_policy(seed), h, config=SchedulerConfig(
            concurrency=concurrency, oversample=0, keep_stragglers=True,
            max_batch_wait_s=0.5, episode_streams=streams))
        res = sched.collect(tasks, batch_size=len(tasks))
        got = {t.meta["launch_index"]: [tuple(x.sampled_ids) for x in t.turns]
               for t in res.trajectories + res.stragglers}
        assert len(got) == len(tasks), res.errors
        return [got[i] for i in range(len(tasks))]

    one_by_one, batched = sampled(3, 1), sampled(3, 4)
    assert one_by_one == batched
    assert len({ep[0] for ep in batched}) > 1  # streams differ between episodes
    assert sampled(4, 4) != batched  # and with the policy's seed
    # without streams a batch shares one key per call: one at a time differs from batched
    assert sampled(3, 1, streams=False) != sampled(3, 4, streams=False)


def test_a_share_with_first_index_replays_its_part_of_the_whole_launch():
    """One process's share of a launch list (`first_index`, as evaluation splits it across
    processes) samples the same episodes, under the same launch indices, as the whole list
    run at once; without it the share would start over at stream 0."""
    h = HarnessConfig(max_turns=2, max_output_tokens=8, temperature=1.0)
    tasks = _tasks(2) + _tasks(2, "count_lines")

    def sampled(launch, first_index=0):
        sched = RolloutScheduler(_tiny_sampler_policy(3), h, config=SchedulerConfig(
            concurrency=2, oversample=0, keep_stragglers=True, episode_streams=True))
        res = sched.collect(launch, batch_size=len(launch), first_index=first_index)
        assert not res.errors
        return {t.meta["launch_index"]: [tuple(x.sampled_ids) for x in t.turns]
                for t in res.trajectories + res.stragglers}

    whole = sampled(tasks)
    assert sampled(tasks[2:], first_index=2) == {i: whole[i] for i in (2, 3)}
    assert sorted(sampled(tasks[2:])) == [0, 1]
    assert sampled(tasks[2:]) != {i - 2: whole[i] for i in (2, 3)}
