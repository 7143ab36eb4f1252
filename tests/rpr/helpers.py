"""Tiny actor/critic states and a toy packed PPO batch for the RPR tests."""

import functools

import jax
import numpy as np

from terminal_rsi.config import registry
from terminal_rsi.models.config import ModelConfig
from terminal_rsi.models.transformer import DecoderLM, ValueModel
from terminal_rsi.rewards import EpisodeScorer
from terminal_rsi.training.train_state import OptimizerConfig, create_train_state

TINY = ModelConfig(vocab_size=32, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1,
                   head_dim=16, d_ff=64, max_seq_len=64)


@functools.cache
def states(actor_lr=1e-2, critic_lr=1e-2, seed=0):
    """Cached (compiling the sharded init is slow on CPU): copy before donating."""
    actor = create_train_state(DecoderLM, TINY, OptimizerConfig(actor_lr, grad_clip=1.0),
                               seed=seed)
    critic = create_train_state(ValueModel, TINY, OptimizerConfig(critic_lr, grad_clip=100.0),
                                seed=seed + 1)
    return actor, critic


def toy_batch(b=4, length=12, seed=0):
    """Rows: prompt (3 tokens) then generated tokens of unequal lengths; row 1 packs two
    trajectories (segments 1 and 2); trailing padding has segment 0. Rewards and dones on
    the last generated token of each trajectory; two turns per trajectory."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, TINY.vocab_size, (b, length)).astype(np.int32)
    seg = np.zeros((b, length), np.int32)
    gen = np.zeros((b, length), bool)
    turn = np.zeros((b, length), np.int32)
    rewards = np.zeros((b, length), np.float32)
    dones = np.zeros((b, length), bool)
    pos = np.zeros((b, length), np.int32)

    def put(row, start, n_gen, sid):
        n = 3 + n_gen
        seg[row, start:start + n] = sid
        pos[row, start:start + n] = np.arange(n)
        gen[row, start + 3:start + n] = True
        turn[row, start + 3 + n_gen // 2:start + n] = 1
        last = start + n - 1
        rewards[row, last] = rng.normal()
        dones[row, last] = True

    for row in range(b):
        if row == 1:
            put(row, 0, 2, 1)
            put(row, 5, 4, 2)
        else:
            put(row, 0, min(length - 3, 2 + 3 * row), 1)
    return {"tokens": tokens, "positions": pos, "segment_ids": seg, "gen_mask": gen,
            "turn_ids": turn, "rewards": rewards, "dones": dones}


@functools.cache
def joint_step(num_microbatches=1):
    """One compiled non-donating RPR step per microbatch count, shared by the test modules."""
    from terminal_rsi.training.losses import PPOConfig
    from terminal_rsi.training.ppo_step import make_rpr_step

    return make_rpr_step(PPOConfig(), num_microbatches=num_microbatches, donate=False)


def warm_start_actor(config, export_dir, *, sft_steps, learning_rate=1e-2, wrong_per_right=1):
    """Partial competence for a random-init byte-level actor (test helper, not a base stage):
    masked-NLL SFT (`losses.sft_loss`, Eq. 3) on one reference reply per training task plus
    `wrong_per_right` replies that differ only in a command argument ('ERROR' -> 'WARN', which
    fails the count_lines verifier), rendered through the harness of `config`. The actor
    then solves a task with probability ~1/(1 + wrong_per_right) at temperature 1, minus its
    residual per-token error: a policy RL can improve. Exports to `export_dir` ("actor")."""
    from terminal_rsi.agent import HarnessConfig, pack_trajectories
    from terminal_rsi.agent.harness import (
        ReferencePolicy,
        ScriptedPolicy,
        reference_action,
        run_episode,
    )
    from terminal_rsi.models.loading import model_config
    from terminal_rsi.models.sampling import Buckets
    from terminal_rsi.models.tokenizer import ByteTokenizer
    from terminal_rsi.rpr.phase import initial_states
    from terminal_rsi.rpr.steps import config_tasks
    from terminal_rsi.runtime.exports import export_weights
    from terminal_rsi.tasks import open_task_sandbox
    from terminal_rsi.training.alignment import predictable_mask
    from terminal_rsi.training.forward import actor_logprobs
    from terminal_rsi.training.losses import Aggregation, sft_loss
    from terminal_rsi.training.train_state import make_update_step

    tok = ByteTokenizer()
    h = config.harness
    harness = HarnessConfig(max_turns=h.max_turns, max_output_tokens=h.max_output_tokens,
                            system_prompt=h.system_prompt)
    tasks = config_tasks(config, config.tasks.train_split, config.tasks.n_per_family)
    wrong = ScriptedPolicy(tok, lambda r: reference_action(r.task, r.turn).replace(
        "ERROR", "WARN"))

    def sandbox(task):
        return open_task_sandbox(task, config.tasks.backend)

    trajs = [run_episode(t, ReferencePolicy(tok), sandbox, harness) for t in tasks]
    trajs += [run_episode(t, wrong, sandbox, harness) for t in tasks
              for _ in range(wrong_per_right)]
    score = EpisodeScorer("fdr")  # the phase's default reward, default divisors
    for t in trajs:
        score(t)
    assert [t.S for t in trajs] == [1] * len(tasks) + [0] * (len(trajs) - len(tasks))
    packed = pack_trajectories(trajs, buckets=Buckets(cache_multiple=128))
    batch = {k: getattr(packed, k) for k in ("tokens", "positions", "segment_ids", "gen_mask")}

    def loss_fn(params, graphdef, b):
        lp, _ = actor_logprobs(params, graphdef, b)
        mask = b["gen_mask"] & predictable_mask(b["segment_ids"])
        parts = sft_loss(lp, mask, Aggregation.TOKEN_MEAN, segment_ids=b["segment_ids"])
        return parts.total / parts.denom, {}

    from terminal_rsi.models.transformer import DecoderLM
    from terminal_rsi.training.train_state import OptimizerConfig, create_train_state

    actor, _ = initial_states(config, model_config(config))
    state = create_train_state(DecoderLM, model_config(config),
                               OptimizerConfig(learning_rate, grad_clip=1.0),
                               actor.step.sharding.mesh, params=actor.params)
    step = make_update_step(loss_fn, state)
    losses = []
    for _ in range(sft_steps):
        state, m = step(state, batch)
        losses.append(float(m["loss"]))
    export_weights(export_dir, "actor", state.params, force=True)
    return losses


def typed(config):
    """The typed PhaseConfig of a ConfigDict (checked as `experiments/run.py` checks it), as
    `run_phase` takes it."""
    return registry.get_experiment("rpr_phase").check(config)



# The phase row's wall-clock entries: they differ between runs that train identically.
TIMING_KEYS = ("rollout_s", "rollout_wait_s", "step_s")


def untimed(rows):
    """Metric rows without their wall-clock entries (what two identical runs must share)."""
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in rows]


def to_numpy(tree):
    """A host copy of a pytree of arrays (safe to compare after the source is donated)."""
    return jax.tree.map(lambda x: np.array(x, copy=True), tree)


def trees_equal(a, b):
    """Whether two pytrees hold bit-identical leaves."""
    return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b),
                                                     strict=True))
