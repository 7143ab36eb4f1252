"""RSR fresh execution, Q_clean, fine-tuning (Eq. 3) and the `rsr` / `base_sft` stages with a
tiny model on built-in tasks."""

import json
import os
from types import SimpleNamespace as NS

import jax
import numpy as np
import pytest

from terminal_rsi.agent import HarnessConfig, RolloutEngine, read_shard
from terminal_rsi.models.config import get_model_config
from terminal_rsi.models.loading import LoadedModel
from terminal_rsi.models.sampling import Buckets
from terminal_rsi.models.tokenizer import ByteTokenizer
from terminal_rsi.models.transformer import DecoderLM, critic_params_from_actor
from terminal_rsi.rsr import common as cm
from terminal_rsi.rsr.base_sft import runbook_for_task
from terminal_rsi.rsr.reviewer import privileged_strings
from terminal_rsi.rsr.sft import fixed_width, make_nll_fn, make_sft_step, mean_nll, train_sft
from terminal_rsi.rsr.stage import (
    StageSetup,
    acceptance_funnel,
    execute_runbooks,
    fresh_execute,
    funnel_line,
    run_rsr,
)
from terminal_rsi.runtime import sharding as shd
from terminal_rsi.runtime.exports import export_weights
from terminal_rsi.tasks.builtin import make_task
from terminal_rsi.training.losses import Aggregation
from terminal_rsi.training.train_state import OptimizerConfig, create_train_state
from tests.rsr.helpers import TINY_MODEL, follower_policy, tiny_stage_config

# module/session-scoped fixtures are expensive: keep these tests on one xdist worker
pytestmark = pytest.mark.xdist_group("rsr_stage")

TOK = ByteTokenizer()
SYSTEM = "Reply with one JSON action."
H0 = HarnessConfig(name="H0", system_prompt=SYSTEM, max_turns=1, max_output_tokens=128,
                   max_input_tokens=1024, summarize_threshold=None,
                   temperature=0.0)
MCFG = get_model_config("tiny", **{k: v for k, v in TINY_MODEL.items()
                                   if k not in ("preset", "vocab_size")})
BUCKETS = Buckets(cache_multiple=64, power_of_two=False)


ROLLOUT = NS(decode_block=32, prefill_chunk=128, cache_multiple=64)  # the sampler's shapes
ENGINE = RolloutEngine(H0, None, concurrency=4, scorer=cm.RSR_SCORER, rollout=ROLLOUT,
                       model=LoadedModel(TOK, MCFG, shd.abstract_model(DecoderLM, MCFG)[0]))


@pytest.fixture(scope="module")
def q_clean():
    tasks = [make_task("count_lines", s) for s in (0, 1, 2)]
    todo = [(t, runbook_for_task(t), privileged_strings(t)) for t in tasks]
    from terminal_rsi.rsr.guidance import EXEC_INSTRUCTION

    fresh, clean = fresh_execute(ENGINE, follower_policy(TOK), H0, todo, 2, TOK,
                                 EXEC_INSTRUCTION)
    return tasks, todo, fresh, clean


def test_q_clean_public_prefix_has_no_runbook_tokens(q_clean):
    tasks, todo, fresh, clean = q_clean
    assert len(fresh) == 6 and len(clean) == 6  # multiset: M = 2 repeats each kept
    assert sorted(t.task_id for t in clean) == sorted([t.id for t in tasks] * 2)
    for traj, (_, rb, _) in zip(clean, [x for x in todo for _ in range(2)], strict=True):
        guided = next(f for f in fresh if f.task_id == traj.task_id)
        assert rb.to_text() in TOK.decode(guided.turns[0].prompt_ids)
        prefix = traj.turns[0].prompt_ids
        text = TOK.decode(prefix)
        assert "Runbook" not in text and rb.to_text() not in text
        rb_ids = TOK.encode(rb.to_text())
        assert all(prefix[i:i + len(rb_ids)] != rb_ids for i in range(len(prefix)))
        assert traj.turns[0].sampled_ids == guided.turns[0].sampled_ids
        assert "runbook" not in traj.meta and traj.meta["public_view"]


@pytest.fixture(scope="module")
def trained(q_clean):
    """A tiny random actor fine-tuned with Eq. 3 on Q_clean (plus the guided executions, as
    base_sft does, so that it also carries out runbooks for the stage test below)."""
    _, _, fresh, clean = q_clean
    actor = create_train_state(DecoderLM, MCFG, OptimizerConfig(3e-3, weight_decay=0.0),
                               seed=0)
    before_params = jax.tree.map(np.array, actor.params)
    width = fixed_width(clean + fresh, 64)
    nll_fn = make_nll_fn(Aggregation.SEQUENCE_SUM)
    nll0 = mean_nll(actor, clean, nll_fn, batch_size=4, buckets=BUCKETS, width=width)
    step = make_sft_step(Aggregation.SEQUENCE_SUM, state=actor)
    actor, rows = train_sft(actor, clean + fresh, step, num_steps=60, batch_size=4,
                            rng=np.random.default_rng(0), buckets=BUCKETS, width=width)
    nll1 = mean_nll(actor, clean, nll_fn, batch_size=4, buckets=BUCKETS, width=width)
    return before_params, actor, nll0, nll1, rows


def _success(params_state, tasks):
    pol = ENGINE.policy(params_state.params, seed=0, graphdef=params_state.graphdef)
    done = ENGINE.run(pol, tasks)
    assert not done.errors and len(done.trajectories) == len(tasks)
    return float(np.mean([t.S for t in done.trajectories]))


def test_finetuning_lowers_nll_and_raises_success(q_clean, trained):
    tasks = q_clean[0]
    before_params, actor, nll0, nll1, rows = trained
    assert nll1 < 0.5 * nll0 and rows[-1]["step"] == 60
    before = actor.replace(params=before_params)
    assert _success(before, tasks) == 0.0
    assert _success(actor, tasks) >= 2 / 3


def test_rsr_stage_end_to_end(tmp_path, trained):
    """Actor: the fine-tuned one above (it writes the count_lines action), so guided fresh
    execution succeeds and Q_clean is non-empty; the critic comes from another export and
    must come out bit-identical."""
    _, actor, _, _, _ = trained
    src = str(tmp_path / "in")
    export_weights(src, "actor", actor.params)
    critic = critic_params_from_actor(actor.params)
    critic["value_head"]["w"] = critic["value_head"]["w"] + 0.5  # not the default init
    export_weights(src, "critic", jax.device_get(critic))
    cfg = tiny_stage_config(**{"init.actor_weights": src, "init.critic_weights": src,
                               "harness.system_prompt": SYSTEM, "harness.temperature": 0.0,
                               "eval.rewritten": False, "sft.rehearsal_samples": 1,
                               "sft.guided_rehearsal": True})
    wd = str(tmp_path / "rsr")
    res = run_rsr(cfg, wd)
    s = json.load(open(os.path.join(wd, "summary.json")))
    assert s["critic_bit_identical"] is True
    assert s["discovery"]["external"]["success_rate"] == 1.0
    assert s["runbooks_accepted"] >= 1 and s["fresh_executions"] == 2 * s["runbooks_accepted"]
    assert s["q_clean_size"] == len(read_shard(os.path.join(wd, "trajectories",
                                                            "q_clean.jsonl")))
    assert s["q_clean_size"] >= 1 and s["q_clean_per_family"] == {"count_lines":
                                                                  s["q_clean_size"]}
    assert s["nll_after"] <= s["nll_before"]
    assert s["guided_rehearsal_size"] == s["q_clean_size"]  # the accepted runs, as they ran
    funnel = s["acceptance_per_family"]["count_lines"]  # the stage's own counts, per family
    assert funnel["runbooks"] == s["runbooks"] and funnel["fresh"] == s["fresh_executions"]
    assert funnel["accepted"] == s["q_clean_size"]
    assert funnel["acceptance_rate"] == s["q_clean_size"] / s["fresh_executions"]
    rehearsal = read_shard(os.path.join(wd, "trajectories", "rehearsal.jsonl"))
    assert s["rehearsal_size"] == len(rehearsal) and all(t.S == 1 for t in rehearsal)
    assert s["rehearsal_per_family"] == ({"count_lines": len(rehearsal)} if rehearsal else {})
    for name in ("discovery", "fresh", "q_clean"):
        assert os.path.exists(os.path.join(wd, "trajectories", f"{name}.jsonl"))
    rows = [json.loads(x) for x in open(os.path.join(wd, "metrics.jsonl"))]
    assert [r["step"] for r in rows] == [1, 2]
    for role in ("actor", "critic"):
        assert os.path.isdir(os.path.join(wd, "export", role))
    assert np.array_equal(np.asarray(res.critic_params["value_head"]["w"]),
                          np.asarray(critic["value_head"]["w"]))


def test_an_rsr_stage_replays_for_a_seed(tmp_path, trained):
    """The same stage run twice (same seed, same input actor, sampling at temperature 1) keeps
    the same Q_clean, token for token, and exports the same actor bit for bit, even with four
    episodes in flight in one run and one at a time in the other (other generation batches,
    other finishing order): every episode and plan samples from its own random stream."""
    _, actor, _, _, _ = trained
    src = str(tmp_path / "in")
    export_weights(src, "actor", actor.params)
    cfg = tiny_stage_config(**{"init.actor_weights": src, "harness.system_prompt": SYSTEM,
                               "harness.temperature": 1.0, "eval.rewritten": False,
                               "execution.m": 4})
    runs = [run_rsr(cfg.replace(rollout=cfg.rollout.replace(concurrency=c)),
                    str(tmp_path / name)) for name, c in (("a", 4), ("b", 1))]

    def shard(name, run):
        return [[(t.sampled_ids, t.observation_ids) for t in traj.turns] + [traj.S]
                for traj in read_shard(os.path.join(tmp_path, run, "trajectories",
                                                    f"{name}.jsonl"))]

    assert runs[0].summary["q_clean_size"] >= 1  # the fine-tune ran: the actor moved
    for name in ("discovery", "fresh", "q_clean"):
        assert shard(name, "a") == shard(name, "b"), name
    assert runs[0].summary["q_clean_size"] == runs[1].summary["q_clean_size"]
    leaves = [jax.tree.leaves(jax.device_get(r.actor.params)) for r in runs]
    assert all(np.array_equal(x, y) for x, y in zip(*leaves, strict=True))
    assert not np.array_equal(np.asarray(runs[0].actor.params["backbone"]["embed"]),
                              np.asarray(actor.params["backbone"]["embed"]))


def test_rehearsal_set_keeps_the_verified_unguided_successes():
    """`rehearsal_set`: `samples` H0 runs per task, only S = 1 episodes kept, unguided (the
    prompt is the public H0 prompt), marked meta.rehearsal; samples = 0 runs nothing."""
    from terminal_rsi.agent import ScriptedPolicy
    from terminal_rsi.rsr.stage import rehearsal_set

    demo = cm.demo_policy(TOK)

    def script(r):  # the reference solution on count_lines, an empty action elsewhere
        if r.task.family == "count_lines":
            return demo.script(r)
        return json.dumps({"commands": [], "task_complete": True})

    policy = ScriptedPolicy(TOK, script)
    tasks = [make_task("count_lines", 0), make_task("create_file", 0), make_task("count_lines", 1)]
    out = rehearsal_set(ENGINE, policy, tasks, 2)
    assert sorted(t.task_id for t in out) == sorted([tasks[0].id, tasks[2].id] * 2)
    assert all(t.S == 1 and t.meta["rehearsal"] for t in out)
    assert all(SYSTEM in TOK.decode(t.turns[0].prompt_ids) for t in out)
    assert "Runbook" not in TOK.decode(out[0].turns[0].prompt_ids)
    calls = policy.calls
    assert rehearsal_set(ENGINE, policy, tasks, 0) == [] and policy.calls == calls


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    pytest.importorskip("gguf")
    from tests.models.reference import write_tiny_gguf

    path = str(tmp_path_factory.mktemp("gguf") / "tiny.gguf")
    write_tiny_gguf(path, seed=1)
    return path


def test_rsr_stage_on_a_gguf_model(tmp_path, tiny_gguf, monkeypatch):
    """model.gguf: the GGUF's tokenizer and chat template render every prompt of the stage
    (discovery, fresh execution, Q_clean), the actor starts from the GGUF's weights and the
    critic (no init.critic_weights) is critic_params_from_actor of them, passed through
    unchanged; the SFT rows supervise exactly the sampled reply tokens. The actor's sampler
    policy is replaced by a runbook follower (a random model would leave Q_clean empty)."""
    from terminal_rsi.models.loading import load_model
    from terminal_rsi.models.tokenizer import HFTokenizer
    from terminal_rsi.rsr.sft import sft_batch

    tokenizers = []

    def follower(setup, actor, seed):
        tokenizers.append(setup.tokenizer)
        return follower_policy(setup.tokenizer)

    monkeypatch.setattr(StageSetup, "policy", follower)
    cfg = tiny_stage_config(**{"model.gguf": tiny_gguf, "harness.system_prompt": SYSTEM,
                               "eval.rewritten": False, "execution.m": 1, "sft.steps": 3})
    model = load_model(cfg, params=True)
    tok = model.tokenizer
    assert isinstance(tok, HFTokenizer) and model.source == f"gguf:{tiny_gguf}"
    wd = str(tmp_path / "rsr")
    res = run_rsr(cfg, wd)
    s = res.summary
    assert tokenizers and all(t is tok for t in tokenizers)
    assert s["discovery"]["external"]["success_rate"] == 1.0
    assert s["q_clean_size"] == s["fresh_executions"] >= 1 and s["sft_steps"] == 3
    assert s["nll_after"] < s["nll_before"] and s["critic_bit_identical"]
    want_critic = jax.device_get(critic_params_from_actor(model.params))
    assert all(np.array_equal(a, b) for a, b in zip(
        jax.tree.leaves(want_critic), jax.tree.leaves(res.critic_params), strict=True))
    assert not np.array_equal(np.asarray(res.actor.params["backbone"]["embed"]),
                              np.asarray(model.params["backbone"]["embed"]))
    start, end = (tok.token_to_id(t) for t in ("<|im_start|>", "<|im_end|>"))
    for name in ("discovery", "fresh", "q_clean"):
        for traj in read_shard(os.path.join(wd, "trajectories", f"{name}.jsonl")):
            prompt = tok.decode(traj.turns[0].prompt_ids)
            assert prompt.startswith(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n")
            assert prompt.endswith("<|im_start|>assistant\n") and start in traj.turns[0].prompt_ids
            reply = traj.turns[0].sampled_ids
            action = json.loads(tok.decode(reply[:-1]))  # the reply, then the stop token
            assert reply[-1] == end and (action["commands"] or traj.S == 0)
            assert ("Runbook" in prompt) == (name == "fresh")
    q_clean = read_shard(os.path.join(wd, "trajectories", "q_clean.jsonl"))
    batch = sft_batch(q_clean)
    for row, traj in enumerate(q_clean):  # Eq. 3's mask: the sampled ids and nothing else
        toks = batch["tokens"][row][batch["gen_mask"][row]]
        assert list(toks) == [i for t in traj.turns for i in t.sampled_ids]


def test_the_acceptance_funnel_counts_each_familys_losses():
    """Per family: tasks, discovery, runbooks (reviewer rejections by reason), fresh
    executions (verified, leaking, no public view) and Q_clean; counted by hand here."""
    a1, a2, b1 = (NS(id=i, family=f) for i, f in (("a/1", "a"), ("a/2", "a"), ("b/1", "b")))
    found = [NS(task=a1), NS(task=a1), NS(task=b1)]
    rejections = [{"task": "a/1", "reasons": ["schema"]},
                  {"task": "b/1", "reasons": ["artifact", "model"]}]
    to_run = [(a1, None, None), (a2, None, None)]

    def fresh(fam, s, accepted=False, leaks=(), turns=(1,)):
        return NS(family=fam, S=s, turns=list(turns), meta={"accepted": accepted,
                                                            "leaks": list(leaks)})

    trajs = [fresh("a", 1, True), fresh("a", 1, leaks=["x"]), fresh("a", 0),
             fresh("a", 1, turns=())]
    got = acceptance_funnel([a1, a2, b1], found, rejections, to_run, trajs)
    assert got == {
        "a": {"tasks": 2, "discovered": 2, "runbooks": 3, "reviewer_accepted": 2,
              "fresh": 4, "fresh_verified": 3, "leaking": 1, "no_public_view": 1,
              "accepted": 1, "rejected": {"schema": 1}, "acceptance_rate": 0.25},
        "b": {"tasks": 1, "discovered": 1, "runbooks": 1, "reviewer_accepted": 0,
              "fresh": 0, "fresh_verified": 0, "leaking": 0, "no_public_view": 0,
              "accepted": 0, "rejected": {"artifact": 1, "model": 1},
              "acceptance_rate": None}}
    line = funnel_line(got)
    assert line.startswith("a 1/4") and "b 0/0 (most lost: rejected artifact)" in line


@pytest.mark.parametrize("temperature", [None, 0.25])
def test_fresh_execution_samples_at_its_own_temperature(tmp_path, temperature):
    """`execution.temperature` (None: the target harness's) is the temperature of every
    fresh-execution request, and the verified runs still form Q_clean."""
    seen = []
    follower = follower_policy(TOK)

    class Recording:
        tokenizer = TOK

        def generate(self, requests):
            seen.extend(r.sampling.temperature for r in requests)
            return follower.generate(requests)

    h0 = H0.replace(temperature=0.6)
    tasks = [make_task("count_lines", s) for s in (0, 1)]
    st = NS(config=NS(execution=NS(temperature=temperature, m=2, instruction=None)), h0=h0,
            tokenizer=TOK, engine=RolloutEngine(h0, None, concurrency=2), tasks=tasks,
            write=lambda name, trajs: None)
    todo = [(t, runbook_for_task(t), privileged_strings(t)) for t in tasks]
    fresh, clean = execute_runbooks(st, Recording(), todo)
    assert len(fresh) == 4 and len(clean) == 4
    assert seen and set(seen) == {0.6 if temperature is None else temperature}
