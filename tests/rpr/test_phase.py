"""RPR phase loop end to end on built-in tasks with a tiny model: metrics and checkpoints,
bit-identical actor during critic warm-up, resume from an interrupted run equal to an
uninterrupted one, the C2 workdir files (trajectories, credit arrays, summary, TensorBoard)."""

import json
import os

import numpy as np
import pytest

from configs.rpr_phase import get_config
from terminal_rsi.agent.trajectory import read_shard
from terminal_rsi.rpr import run_phase
from terminal_rsi.rpr.artifacts import CREDIT_KEYS, ScalarWriter, prune_after, read_scalars
from tests.rpr.helpers import to_numpy, trees_equal, typed, untimed

# module-scoped fixtures are expensive: keep this module on one xdist worker
pytestmark = pytest.mark.xdist_group("rpr_phase")


def _config():
    c = get_config()
    c.num_steps = 3
    c.model.d_model, c.model.d_ff, c.model.max_seq_len = 16, 32, 512
    # a short system prompt keeps rows at 128 tokens (the default prompt alone is ~500)
    c.harness.system_prompt = "Reply with one JSON action."
    c.rollout.cache_multiple = 128
    c.model.head_dim = 8
    c.tasks.families = ("create_file", "count_lines")
    c.harness.max_output_tokens = 8
    c.rollout.batch_size = 2
    # Deterministic configuration: one episode in flight, so the sampler's key sequence and
    # the order of the kept episodes do not depend on thread timing.
    c.rollout.concurrency = 1
    # the online curriculum's statistics and cursors are part of the resumed state
    c.rollout.curriculum = "reward_variance"
    c.ppo.critic_warmup_steps = 2
    c.eval.every, c.eval.num_tasks = 3, 2
    c.checkpoint.every = 1
    typed(c)
    return c



@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("rpr"))
    config = _config()
    first = {}

    def on_step(step, actor, critic, row):
        first[step] = (to_numpy(actor.params), to_numpy(critic.params), row)

    from terminal_rsi.models.loading import model_config
    from terminal_rsi.rpr.phase import initial_states

    init_actor = to_numpy(initial_states(config, model_config(config))[0].params)
    a = run_phase(typed(config), workdir, stop_after=2, on_step=on_step)
    # Leftovers of a step past the last checkpoint (written before a crash): a metrics line,
    # step files and a TensorBoard scalar; all must be discarded / hidden on resume.
    with open(os.path.join(workdir, "metrics.jsonl"), "a") as f:
        f.write(json.dumps({"step": 3, "stale": True}) + "\n")
    for name in ("step_00003.jsonl", "step_00003.credit.npz", "eval_00003.jsonl",
                 "step_00004.jsonl"):
        with open(os.path.join(workdir, "trajectories", name), "w") as f:
            f.write("stale\n")
    stale_tb = ScalarWriter(os.path.join(workdir, "tensorboard"))
    stale_tb.write(3, {"reward_binary": 123.0})
    stale_tb.close()
    stale_files = [n for n in os.listdir(os.path.join(workdir, "trajectories"))]
    resumed = {}
    second = {}
    b = run_phase(typed(config), workdir, on_resume=lambda rs: resumed.update(
        step=rs.step, actor=to_numpy(rs.actor.params), critic=to_numpy(rs.critic.params),
        data_position=rs.data_position),
        on_step=lambda s, ac, cr, row: second.update({s: (to_numpy(ac.params), row)}))
    straight_dir = str(tmp_path_factory.mktemp("rpr_straight"))
    straight = run_phase(typed(config), straight_dir)
    return dict(workdir=workdir, a=a, b=b, first=first, second=second, resumed=resumed,
                init_actor=init_actor, straight=straight, straight_dir=straight_dir,
                stale_files=stale_files)


def test_phase_writes_metrics_checkpoints_and_exports(runs):
    w = runs["workdir"]
    with open(os.path.join(w, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    assert [r["step"] for r in rows] == [1, 2, 3] and "stale" not in rows[2]
    assert [r["critic_only"] for r in rows] == [True, True, False]
    for r in rows:
        assert r["episodes"] == 2 and r["turns"] >= 1
        for k in ("reward_binary", "reward_dense", "critic/explained_variance",
                  "critic/value_clip_frac", "logprob_gap_mean_abs", "policy_lag_mean",
                  "value_ev_pre_update"):
            assert k in r, k
        # π_old recomputed by the training-side actor matches the sampler's logprobs
        assert r["logprob_gap_max_abs"] < 1e-2
    assert "actor/clip_frac_low" in rows[2] and "actor/clip_frac_low" not in rows[0]
    assert 0.0 <= rows[2]["eval/success"] <= 1.0 and rows[2]["eval/episodes"] == 2
    assert rows[2]["policy_version"] == 1 and rows[1]["policy_version"] == 0
    assert sorted(os.listdir(os.path.join(w, "checkpoints"))) == ["1", "2", "3"]
    assert sorted(os.listdir(os.path.join(w, "export"))) == ["actor", "critic"]


def test_actor_frozen_during_critic_warmup(runs):
    first, init = runs["first"], runs["init_actor"]
    assert trees_equal(first[1][0], init) and trees_equal(first[2][0], init)  # bit-identical
    assert not trees_equal(first[1][1], first[2][1])  # the critic did move
    actor_after_joint = runs["second"][3][0]
    assert not trees_equal(actor_after_joint, init)  # joint PPO step moves the actor


def test_resume_continues_from_the_interrupted_step(runs):
    a, b, res = runs["a"], runs["b"], runs["resumed"]
    assert a.step == 2 and a.resumed_from is None
    assert b.resumed_from == 2 and res["step"] == 2 and b.step == 3
    assert sorted(runs["second"]) == [3]  # only step 3 ran after the resume
    assert len(b.metrics) == 3 and b.metrics[:2] == a.metrics
    actor2, critic2, row2 = runs["first"][2]
    assert trees_equal(res["actor"], actor2) and trees_equal(res["critic"], critic2)
    assert res["data_position"] == row2["data_position"] == 4
    assert runs["second"][3][1]["data_position"] == 6


def test_warmup_critic_mode_one_pass_actor_frozen(tmp_path, runs):
    from terminal_rsi.models.loading import model_config
    from terminal_rsi.rpr.phase import initial_states

    config = _config()
    config.mode = "warmup_critic"
    init_actor, init_critic = (to_numpy(s.params)
                               for s in initial_states(config, model_config(config)))
    res = run_phase(typed(config), str(tmp_path))
    # 2 training tasks (2 families x 1), batch 2: one pass is one rollout step
    assert res.step == 1 and [m["critic_only"] for m in res.metrics] == [True]
    # one pass: every training task once, although _config sets the reward_variance curriculum
    shard = read_shard(os.path.join(tmp_path, "trajectories", "step_00001.jsonl"))
    from terminal_rsi.rpr.steps import config_tasks

    train_ids = sorted(t.id for t in config_tasks(config, "train", config.tasks.n_per_family))
    assert sorted(t.task_id for t in shard) == train_ids
    assert trees_equal(to_numpy(res.actor.params), init_actor)
    assert not trees_equal(to_numpy(res.critic.params), init_critic)
    # C2: both roles are exported; the actor is the (unchanged) input actor
    assert sorted(os.listdir(tmp_path / "export")) == ["actor", "critic"]


def test_mask_malformed_keeps_cut_off_replies_out_of_the_policy_loss(tmp_path):
    """ppo.mask_malformed: with an 8-token output budget every reply is cut off, so the joint
    step has no policy-loss token: the actor (no weight decay) stays bit-identical while the
    critic trains, and the metrics report every generated token as malformed. Also
    ppo.critic_epochs: 3 critic passes of 2 minibatches per step, 1 actor pass; and
    ppo.normalize_advantages whitens over every trained token, the malformed ones included
    (the stored advantages against a NumPy whitening of returns - values)."""
    from terminal_rsi.models.loading import model_config
    from terminal_rsi.rpr.phase import initial_states

    config = _config()
    config.ppo.mask_malformed = True
    config.ppo.normalize_advantages = True
    config.ppo.critic_epochs = 3
    config.actor_opt.weight_decay = 0.0
    config.eval.every, config.checkpoint.every = 0, 3
    init_actor, init_critic = (to_numpy(s.params)
                               for s in initial_states(config, model_config(config)))
    res = run_phase(typed(config), str(tmp_path))
    assert [m["critic_only"] for m in res.metrics] == [True, True, False]
    assert all(m["malformed_token_frac"] == 1.0 for m in res.metrics)
    assert [m["critic_updates"] for m in res.metrics] == [6, 6, 6]
    assert [m["actor_updates"] for m in res.metrics] == [0, 0, 2]
    assert res.metrics[-1]["actor/tokens"] == 0.0
    assert trees_equal(to_numpy(res.actor.params), init_actor)
    assert not trees_equal(to_numpy(res.critic.params), init_critic)
    for m in res.metrics:
        assert m["adv_mean_wellformed"] is None and np.isfinite(m["adv_mean_trained"])
    for step in (1, 3):
        c = np.load(tmp_path / "trajectories" / f"step_{step:05d}.credit.npz")
        g = c["gen_mask"]
        raw = (c["returns"] - c["values"])[g]  # TB-GAE: returns = advantages + values
        want = (raw - raw.mean()) / (raw.std() + 1e-4)
        np.testing.assert_allclose(c["advantages"][g], want, rtol=1e-3, atol=1e-3)
        assert not c["advantages"][~g].any()


def test_resume_equals_uninterrupted_run(runs):
    """Kill after step 2 + resume == 3 uninterrupted steps: metrics (timings excluded) and
    final actor/critic parameters bit-identical (same compiled programs, same restored key,
    data position and states; rollouts deterministic at concurrency 1)."""
    b, straight = runs["b"], runs["straight"]
    assert straight.resumed_from is None and straight.step == b.step == 3
    assert untimed(b.metrics) == untimed(straight.metrics)
    assert trees_equal(to_numpy(b.actor.params), to_numpy(straight.actor.params))
    assert trees_equal(to_numpy(b.critic.params), to_numpy(straight.critic.params))
    assert trees_equal(to_numpy(b.actor.opt_state), to_numpy(straight.actor.opt_state))
    for name in ("step_00003.jsonl", "eval_00003.jsonl"):
        got = [t.to_dict() for t in read_shard(os.path.join(runs["workdir"], "trajectories",
                                                            name))]
        want = [t.to_dict() for t in read_shard(os.path.join(runs["straight_dir"],
                                                             "trajectories", name))]
        for x in got + want:  # wall-clock timings and the random episode id differ
            x["meta"].pop("finish_s"), x.pop("timings"), x.pop("episode_id")
        assert got == want


def test_phase_workdir_files_c2(runs):
    w = runs["workdir"]
    tdir = os.path.join(w, "trajectories")
    assert sorted(os.listdir(tdir)) == [
        "eval_00003.jsonl", "step_00001.credit.npz", "step_00001.jsonl",
        "step_00002.credit.npz", "step_00002.jsonl", "step_00003.credit.npz",
        "step_00003.jsonl"]  # step_00004.jsonl (stale, past the checkpoint) was removed
    assert "step_00004.jsonl" in runs["stale_files"]
    assert sorted(os.listdir(w)) == ["checkpoints", "export", "metrics.jsonl", "summary.json",
                                     "tensorboard", "trajectories"]
    for k in (1, 2, 3):
        trajs = read_shard(os.path.join(tdir, f"step_{k:05d}.jsonl"))
        assert len(trajs) == 2 and all(t.meta["rpr_step"] == k for t in trajs)
        with np.load(os.path.join(tdir, f"step_{k:05d}.credit.npz")) as z:
            c = {key: z[key] for key in z.files}
        assert set(c) == set(CREDIT_KEYS)
        assert all(c[key].dtype == dt for key, dt in CREDIT_KEYS.items())
        r, length = c["tokens"].shape
        assert c["row_episode"].shape == c["row_segment"].shape == (r,)
        assert all(c[key].shape == (r, length) for key in CREDIT_KEYS if key[:4] != "row_")
        real = np.flatnonzero(c["row_episode"] >= 0)
        assert sorted(set(c["row_episode"][real])) == [0, 1]
        for i in real:  # each row is the tokens of its trajectory's segment
            t = trajs[c["row_episode"][i]]
            toks = t.segment_tokens(int(c["row_segment"][i]))[0]
            assert c["tokens"][i, :len(toks)].tolist() == toks
            assert (c["tokens"][i, len(toks):] == 0).all()
            done = np.flatnonzero(c["dones"][i])
            assert len(done) == 1 and np.isclose(c["rewards"][i, done[0]], t.reward)
        gen = c["gen_mask"] & (c["tokens"] != 0)
        np.testing.assert_allclose(c["returns"][gen], c["advantages"][gen] + c["values"][gen],
                                   rtol=1e-5, atol=1e-5)
        assert (c["advantages"][~c["gen_mask"]] == 0).all()
    ev = read_shard(os.path.join(tdir, "eval_00003.jsonl"))
    assert len(ev) == 2 and all(t.meta["rpr_eval"] for t in ev)
    with open(os.path.join(w, "summary.json")) as f:
        summary = json.load(f)
    rows = runs["b"].metrics
    assert summary["completed"] and summary["step"] == 3 and summary["resumed_from"] == 2
    assert summary["final/reward_dense"] == rows[-1]["reward_dense"]
    assert summary["last_eval/success"] == rows[-1]["eval/success"]
    assert np.isclose(summary["mean/reward_binary"], np.mean([r["reward_binary"] for r in rows]))


def test_tensorboard_holds_the_metrics(runs):
    scalars = read_scalars(os.path.join(runs["workdir"], "tensorboard"))
    rows = runs["b"].metrics
    for key in ("reward_binary", "reward_dense", "critic/loss", "turns", "step_s"):
        got = scalars[key]
        want = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
        assert [s for s, _ in got] == [s for s, _ in want], key  # stale step-3 value purged
        np.testing.assert_allclose([v for _, v in got], [v for _, v in want], rtol=1e-6)
    assert [s for s, _ in scalars["actor/clip_frac_low"]] == [3]


def test_prune_after_removes_only_later_steps(tmp_path):
    names = ["step_00001.jsonl", "step_00001.credit.npz", "eval_00002.jsonl",
             "step_00003.jsonl", "step_00003.credit.npz", "eval_00003.jsonl", "notes.txt",
             "step_100000.jsonl"]
    for n in names:
        (tmp_path / n).write_text("x")
    removed = prune_after(str(tmp_path), 2)
    assert sorted(removed) == ["eval_00003.jsonl", "step_00003.credit.npz", "step_00003.jsonl",
                               "step_100000.jsonl"]
    assert sorted(os.listdir(tmp_path)) == ["eval_00002.jsonl", "notes.txt",
                                            "step_00001.credit.npz", "step_00001.jsonl"]


def test_scalar_writer_without_tensorboardx_warns_once(tmp_path, monkeypatch, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "tensorboardX", None)  # import fails
    monkeypatch.setattr(ScalarWriter, "_warned", False)
    for _ in range(2):
        w = ScalarWriter(str(tmp_path / "tb"))
        w.write(1, {"reward_binary": 1.0})
        w.close()
        assert not w.enabled
    assert capsys.readouterr().err.count("tensorboardX is not installed") == 1
    assert not (tmp_path / "tb").exists()


def test_phase_from_a_gguf_model(tmp_path):
    """model.gguf without init weights: the phase samples with the GGUF's tokenizer and chat
    template, starts its actor from the GGUF's weights and its critic from
    critic_params_from_actor of them (ValueModel of the same shape); the actor stays
    bit-identical through the critic-only step and moves in the joint one."""
    pytest.importorskip("gguf")
    from terminal_rsi.models import weights
    from terminal_rsi.models.loading import load_model
    from terminal_rsi.models.transformer import critic_params_from_actor
    from terminal_rsi.rpr.phase import initial_states
    from tests.models.reference import write_tiny_gguf

    path = str(tmp_path / "tiny.gguf")
    write_tiny_gguf(path, seed=2)
    config = _config()
    config.model.gguf = path
    config.num_steps, config.ppo.critic_warmup_steps = 2, 1
    config.eval.every, config.checkpoint.every = 0, 2
    typed(config)
    model = load_model(config)
    mcfg = model.config
    assert (mcfg.d_model, mcfg.max_seq_len) == (16, 512)  # GGUF shape, the config's length
    gguf_actor = to_numpy(weights.load_gguf_params(path, mcfg)[1])
    actor, critic = initial_states(config, mcfg)
    assert trees_equal(to_numpy(actor.params), gguf_actor)
    assert trees_equal(to_numpy(critic.params), to_numpy(critic_params_from_actor(gguf_actor)))
    first = {}
    res = run_phase(typed(config), str(tmp_path / "w"), on_step=lambda s, a, c, row: first.update(
        {s: to_numpy(a.params)}))
    assert [m["critic_only"] for m in res.metrics] == [True, False]
    assert trees_equal(first[1], gguf_actor) and not trees_equal(first[2], gguf_actor)
    assert all(m["logprob_gap_max_abs"] < 1e-2 for m in res.metrics)
    tok = model.tokenizer
    for step in (1, 2):
        for t in read_shard(os.path.join(tmp_path, "w", "trajectories",
                                         f"step_{step:05d}.jsonl")):
            prompt = tok.decode(t.turns[0].prompt_ids)
            assert prompt.startswith("<|im_start|>system\nReply with one JSON action."
                                     "<|im_end|>\n<|im_start|>user\n")
            assert prompt.endswith("<|im_start|>assistant\n")
            assert all(0 <= i < tok.vocab_size for i in t.turns[0].sampled_ids)


def test_actor_warmup_steps_reach_the_actor_optimizer():
    """actor_opt.warmup_steps ramps the actor rate linearly from 0 over the phase's first
    actor updates; 0 keeps the constant rate."""
    from terminal_rsi.training.train_state import OptimizerConfig, lr_schedule

    c = get_config()
    c.actor_opt.warmup_steps = 4
    typed(c)
    lr = c.actor_opt.learning_rate
    sched = lr_schedule(OptimizerConfig.from_config(c.actor_opt))
    np.testing.assert_allclose([float(sched(k)) for k in (0, 1, 2, 4, 9)],
                               [0.0, 0.25 * lr, 0.5 * lr, lr, lr], rtol=1e-6)
    c.actor_opt.warmup_steps = 0
    assert lr_schedule(OptimizerConfig.from_config(c.actor_opt)) == lr
    c.actor_opt.warmup_steps = -1
    with pytest.raises(Exception, match="warmup_steps"):
        typed(c)


def test_phase_with_lora_adapters_trains_only_them_and_resumes(tmp_path):
    """model.lora_rank on a GGUF model: actor and critic start from the GGUF's weights with
    fresh adapters (the same function), PPO moves the adapters and the critic's head and
    leaves every pretrained weight bit-identical, the export keeps the adapters, and a run
    stopped after its first step resumes to the uninterrupted run's weights."""
    pytest.importorskip("gguf")
    from terminal_rsi.models import lora, trainable, weights
    from terminal_rsi.models.loading import model_config
    from terminal_rsi.rpr.phase import initial_states
    from terminal_rsi.runtime.exports import import_weights
    from tests.models.reference import write_tiny_gguf

    path = str(tmp_path / "tiny.gguf")
    write_tiny_gguf(path, seed=2)
    config = _config()
    config.model.gguf, config.model.lora_rank, config.model.lora_targets = path, 4, ("q", "v")
    config.num_steps, config.ppo.critic_warmup_steps = 2, 0
    config.eval.every, config.checkpoint.every = 0, 1
    config.actor_opt.learning_rate = config.critic_opt.learning_rate = 1e-2
    mcfg = model_config(config)
    actor, critic = initial_states(config, mcfg)
    gguf = to_numpy(weights.load_gguf_params(path, mcfg.without_lora())[1])
    start_actor, start_critic = to_numpy(actor.params), to_numpy(critic.params)
    assert trainable.has_adapters(start_actor) and trainable.has_adapters(start_critic)
    assert trees_equal(trainable.split_trainable(start_actor)[1], trainable.split_trainable(
        lora.add_adapters(gguf, mcfg, 0))[1])
    res = run_phase(typed(config), str(tmp_path / "w"))
    end_actor = import_weights(str(tmp_path / "w" / "export"), "actor", start_actor)
    end_critic = import_weights(str(tmp_path / "w" / "export"), "critic", start_critic)
    for start, end in ((start_actor, end_actor), (start_critic, end_critic)):
        moving, frozen = trainable.split_trainable(start)
        moved, kept = trainable.split_trainable(to_numpy(end))
        assert trees_equal(frozen, kept)  # the pretrained weights, bit for bit
        assert not trees_equal(moving, moved)
    assert len(res.metrics) == 2
    run_phase(typed(config), str(tmp_path / "r"), stop_after=1)
    run_phase(typed(config), str(tmp_path / "r"))
    again = import_weights(str(tmp_path / "r" / "export"), "actor", start_actor)
    assert trees_equal(to_numpy(again), to_numpy(end_actor))
