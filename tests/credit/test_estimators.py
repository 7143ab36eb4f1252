"""The advantage estimators by name (`credit.ESTIMATORS`): each runs its recursion with its
named parameters (against the float64 double sum, with and without jit), and the config's
choices and the object it builds come from the table."""

import chex
import jax.numpy as jnp
import numpy as np
import pytest

from terminal_rsi.credit import ESTIMATORS, REWARD_TO_GO, TokenGAE, TurnBoundaryGAE
from terminal_rsi.credit.reference import tb_gae_double_sum
from terminal_rsi.rpr.config import Advantage
from terminal_rsi.settings import SettingError, specs
from tests.credit.helpers import random_interaction


class EstimatorTest(chex.TestCase):
    def _arrays(self):
        r, v, t, g, d = random_interaction(np.random.default_rng(5), 3, 24)
        return r, v, t, g, d, [jnp.asarray(x, jnp.float32) for x in (r, v)] + [
            jnp.asarray(t), jnp.asarray(g), jnp.asarray(d)]

    @chex.variants(with_jit=True, without_jit=True)
    def test_turn_boundary_gae_matches_double_sum(self):
        r, v, t, g, d, (rj, vj, tj, gj, dj) = self._arrays()
        est = TurnBoundaryGAE(gamma_turn=0.9, lambda_turn=0.8)
        adv, ret, _ = self.variant(
            lambda *a: est.estimate(a[0], a[1], a[3], a[4], turn_ids=a[2]))(rj, vj, tj, gj, dj)
        ref_adv, ref_ret = tb_gae_double_sum(r, v, t, g, d, 0.9, 0.8)
        np.testing.assert_allclose(adv, ref_adv, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(ret, ref_ret, rtol=1e-5, atol=1e-5)

    @chex.variants(with_jit=True, without_jit=True)
    def test_token_gae_matches_unit_clock_double_sum(self):
        r, v, t, g, d, (rj, vj, _, gj, dj) = self._arrays()
        est = TokenGAE(gamma=0.95, lam=0.7)
        adv, ret, _ = self.variant(
            lambda *a: est.estimate(*a, turn_ids=None))(rj, vj, gj, dj)
        ref_adv, ref_ret = tb_gae_double_sum(r, v, None, g, d, 0.95, 0.7, unit_clock=True)
        np.testing.assert_allclose(adv, ref_adv, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(ret, ref_ret, rtol=1e-5, atol=1e-5)


def test_table_and_config_choices():
    assert tuple(ESTIMATORS) == ("tb_gae", "gae")
    assert ESTIMATORS["tb_gae"] is TurnBoundaryGAE and ESTIMATORS["gae"] is TokenGAE
    assert tuple(specs(Advantage)["estimator"].choices) == tuple(ESTIMATORS)
    with pytest.raises(SettingError, match="estimator"):
        Advantage(estimator="ppo")


def test_config_builds_the_named_estimator():
    a = Advantage(estimator="tb_gae", gamma_turn=0.9, lambda_turn=0.8, gamma=0.5, lam=0.4)
    assert a.build() == TurnBoundaryGAE(gamma_turn=0.9, lambda_turn=0.8)
    a = Advantage(estimator="gae", gamma_turn=0.9, lambda_turn=0.8, gamma=0.5, lam=0.4)
    assert a.build() == TokenGAE(gamma=0.5, lam=0.4)
    assert Advantage().build() == TurnBoundaryGAE() == REWARD_TO_GO  # γ_turn = λ_turn = 1


def test_parameters_are_checked():
    with pytest.raises(ValueError, match="gamma_turn = 1.5"):
        TurnBoundaryGAE(gamma_turn=1.5)
    with pytest.raises(ValueError, match="lam = -0.1"):
        TokenGAE(lam=-0.1)
    z = jnp.zeros((1, 4))
    with pytest.raises(ValueError, match="turn_ids"):
        TurnBoundaryGAE().estimate(z, z, z > 0, z > 0, turn_ids=None)
