"""`rpr.update.ppo_update`, one PPO update of a rollout step: the critic-only warm-up leaves the
actor bit-identical, it takes epochs x minibatches steps per role, and it equals a hand-written
loop over the same minibatches."""

import jax
import numpy as np
import pytest

from terminal_rsi.rpr.update import minibatch_rows, ppo_update, take_rows, update_widths
from terminal_rsi.training.advantages import prepare_ppo_batch
from terminal_rsi.training.losses import PPOConfig
from terminal_rsi.training.ppo_step import make_actor_step, make_critic_step
from tests.rpr.helpers import states, toy_batch

pytestmark = pytest.mark.xdist_group("rpr_ppo_step")

# non-donating steps: the cached states of `states()` stay usable
ACTOR_STEP = make_actor_step(PPOConfig(), 1, donate=False)
CRITIC_STEP = make_critic_step(PPOConfig(), 1, donate=False)


@pytest.fixture(scope="module")
def setup():
    """Tiny states and a prepared batch of 4 rows of unequal real widths (rounded to 4, all
    under the padded 16) with seeded random advantages on the generated tokens."""
    actor, critic = states()
    raw = {k: np.pad(v, ((0, 0), (0, 4))) for k, v in toy_batch(b=4, length=12, seed=5).items()}
    batch = {k: np.asarray(v) for k, v in prepare_ppo_batch(actor, critic, raw).items()}
    rng = np.random.default_rng(2)
    batch["advantages"] = np.where(batch["gen_mask"], rng.normal(size=raw["gen_mask"].shape),
                                   0.0).astype(np.float32)
    widths = update_widths(batch["segment_ids"], 4, length_grouping=True)
    assert widths.max() < 16
    return actor, critic, batch, widths


def _update(setup, seed=0, **kw):
    actor, critic, batch, widths = setup
    kw = {"epochs": 1, "num_minibatches": 2, **kw}
    return ppo_update(actor, critic, batch, widths, np.random.default_rng(seed),
                      actor_step=ACTOR_STEP, critic_step=CRITIC_STEP, **kw)


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def _assert_bitwise(a, b):
    for x, y in zip(_leaves(a), _leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)


def test_critic_only_leaves_the_actor_bit_identical(setup):
    actor, critic = setup[:2]
    a, c, cms, ams = _update(setup, critic_epochs=2, update_actor=False)
    assert a is actor and ams == []
    _assert_bitwise(a.params, actor.params)
    assert len(cms) == 2 * 2 and int(c.step) == int(critic.step) + 4
    assert any(not np.array_equal(x, y) for x, y in zip(_leaves(c.params),
                                                        _leaves(critic.params), strict=True))


@pytest.mark.parametrize("epochs,critic_epochs,expect", [(2, None, (4, 4)), (2, 3, (6, 4)),
                                                          (1, 2, (4, 2))])
def test_steps_taken_are_epochs_times_minibatches(setup, epochs, critic_epochs, expect):
    actor, critic = setup[:2]
    a, c, cms, ams = _update(setup, epochs=epochs, critic_epochs=critic_epochs)
    assert (len(cms), len(ams)) == expect
    assert (int(c.step) - int(critic.step), int(a.step) - int(actor.step)) == expect
    assert {"loss", "grad_norm"} <= set(cms[0]) and {"loss", "clip_frac_low"} <= set(ams[0])


def test_equals_a_hand_written_loop_over_the_same_minibatches(setup):
    """The critic over its 3 passes and the actor over its 2 (the roles are independent, so
    one role after the other), each pass's minibatches drawn in the same order."""
    actor, critic, batch, widths = setup
    a, c, cms, ams = _update(setup, seed=7, epochs=2, critic_epochs=3)
    rng = np.random.default_rng(7)
    passes = [minibatch_rows(widths, 2, rng, True) for _ in range(3)]
    minibatches = [[take_rows(batch, rows, int(widths[rows].max())) for rows in p]
                   for p in passes]
    c_ref, a_ref, cms_ref, ams_ref = critic, actor, [], []
    for mb in [mb for p in minibatches for mb in p]:
        c_ref, m = CRITIC_STEP(c_ref, mb)
        cms_ref.append(jax.device_get(m))
    for mb in [mb for p in minibatches[:2] for mb in p]:
        a_ref, m = ACTOR_STEP(a_ref, mb)
        ams_ref.append(jax.device_get(m))
    _assert_bitwise(c.params, c_ref.params)
    _assert_bitwise(a.params, a_ref.params)
    _assert_bitwise(a.opt_state, a_ref.opt_state)
    _assert_bitwise(cms, cms_ref)
    _assert_bitwise(ams, ams_ref)


def test_random_minibatches_at_the_full_width(setup):
    """length_grouping False: every minibatch keeps the packed width (16)."""
    actor, critic, batch, _ = setup
    widths = update_widths(batch["segment_ids"], 4, length_grouping=False)
    np.testing.assert_array_equal(widths, [16] * 4)
    seen = []

    def critic_step(state, mb):
        seen.append(mb["tokens"].shape)
        return CRITIC_STEP(state, mb)

    ppo_update(actor, critic, batch, widths, np.random.default_rng(0), actor_step=ACTOR_STEP,
               critic_step=critic_step, epochs=1, num_minibatches=2, length_grouping=False)
    assert seen == [(2, 16), (2, 16)]
