"""The advantage estimators by name: `ESTIMATORS`, one class per estimator with its named
parameters (the table the `advantage.estimator` setting's choices come from).

    est = TurnBoundaryGAE(gamma_turn=0.95, lambda_turn=0.9)
    adv, ret, carry = est.estimate(rewards, values, gen_mask, dones, turn_ids=turn_ids)
    est = ESTIMATORS["gae"].from_section(config.advantage)   # TokenGAE(gamma=..., lam=...)

Each estimator is a frozen dataclass whose fields are its parameters and whose `estimate`
runs the recursion (`tb_gae` / `gae`) with them as named arguments; `from_section` reads the
same names from a config section (`rpr.config.Advantage`). `REWARD_TO_GO` is TB-GAE with
γ_turn = λ_turn = 1: its returns are the episode's undiscounted reward-to-go.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Protocol

import jax

from terminal_rsi.credit.turn_boundary_gae import Carry, gae, tb_gae

Array = jax.Array


class AdvantageEstimator(Protocol):
    """What `advantages.compute_advantages` calls: (advantages, returns, carry before position
    0) over [B, L] arrays, 0 outside `gen_mask`."""

    name: ClassVar[str]

    def estimate(self, rewards: Array, values: Array, gen_mask: Array, dones: Array, *,
                 turn_ids: Array | None, carry: Carry | None = None
                 ) -> tuple[Array, Array, Carry]: ...


@dataclasses.dataclass(frozen=True)
class _Discounts:
    """An estimator's parameters: discounts and trace decays, each in [0, 1]."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{type(self).__name__}.{f.name} = {value} must be in [0, 1]")


@dataclasses.dataclass(frozen=True)
class TurnBoundaryGAE(_Discounts):
    """TB-GAE (§2.3, Eq. 8-10): (Γ, Λ) = (1, 1) inside a turn, (γ_turn, λ_turn) across a
    turn boundary; observations are not recursion nodes (`credit.tb_gae`)."""

    name: ClassVar[str] = "tb_gae"
    gamma_turn: float = 1.0
    lambda_turn: float = 1.0

    @classmethod
    def from_section(cls, section) -> TurnBoundaryGAE:
        """The estimator of a config section with fields gamma_turn and lambda_turn."""
        return cls(gamma_turn=section.gamma_turn, lambda_turn=section.lambda_turn)

    def estimate(self, rewards: Array, values: Array, gen_mask: Array, dones: Array, *,
                 turn_ids: Array | None, carry: Carry | None = None
                 ) -> tuple[Array, Array, Carry]:
        """`tb_gae` with this estimator's (γ_turn, λ_turn); turn_ids [B, L] int required."""
        if turn_ids is None:
            raise ValueError("TB-GAE needs turn_ids [B, L] (the batch has none)")
        return tb_gae(rewards, values, turn_ids, gen_mask, dones, gamma_turn=self.gamma_turn,
                      lambda_turn=self.lambda_turn, carry=carry)


@dataclasses.dataclass(frozen=True)
class TokenGAE(_Discounts):
    """Per-token GAE with observation skipping (`credit.gae`): every generated token is its
    own turn (the documented first phase used γ = λ = 1)."""

    name: ClassVar[str] = "gae"
    gamma: float = 1.0
    lam: float = 1.0

    def estimate(self, rewards: Array, values: Array, gen_mask: Array, dones: Array, *,
                 turn_ids: Array | None = None, carry: Carry | None = None
                 ) -> tuple[Array, Array, Carry]:
        """`gae` with this estimator's (γ, λ); turn_ids are not read."""
        del turn_ids
        return gae(rewards, values, gen_mask, dones, gamma=self.gamma, lam=self.lam,
                   carry=carry)

    @classmethod
    def from_section(cls, section) -> TokenGAE:
        """The estimator of a config section with fields gamma and lam."""
        return cls(gamma=section.gamma, lam=section.lam)


# the table: setting value -> estimator class (in the order the config lists the choices)
ESTIMATORS: dict[str, type[TurnBoundaryGAE] | type[TokenGAE]] = {
    cls.name: cls for cls in (TurnBoundaryGAE, TokenGAE)}

# returns that are the episode's undiscounted reward-to-go (the critic's EV target in
# evaluation): TB-GAE with γ_turn = λ_turn = 1
REWARD_TO_GO = TurnBoundaryGAE(gamma_turn=1.0, lambda_turn=1.0)
