"""Which training tasks an RPR rollout step launches (`rollout.curriculum`).

- `cyclic` (default, the paper's plain pass over the pool): tasks in order from the phase's
  data position, wrapping around.
- `reward_variance`: an online curriculum over task families. A family whose episodes all get
  the same reward gives PPO no signal (every advantage is the critic's error); a family with
  mixed outcomes does. Each family f keeps running statistics of the phase's own rewards
  (count n_f, mean, sum of squared deviations M2_f, Welford) and is drawn with probability

      w_f ∝ v_f + floor · mean_g(v_g),   v_f = (k0 · v0 + M2_f) / (k0 + n_f)

  where v0 = 1/4 (the largest variance of a reward in [0, 1]) with pseudo-count k0 = 1, so an
  unseen family starts at the top and a family is only down-weighted once its own episodes
  agree; `floor` keeps every family in the draw (solved families keep being practised, so
  PPO and the KL anchor still see them). Within a family, tasks are taken in turn.

The state is a plain dict of numbers (`to_dict` / `from_dict`), stored in every phase
checkpoint so a resumed phase continues the same curriculum; the draw uses a NumPy generator
seeded by the caller (the phase derives it from its PRNG key), so a phase stays
deterministic at `rollout.concurrency = 1`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

CURRICULA = ("cyclic", "reward_variance")
PRIOR_VARIANCE = 0.25
PRIOR_COUNT = 1.0


@dataclasses.dataclass
class FamilyStats:
    n: float = 0.0
    mean: float = 0.0
    m2: float = 0.0

    def add(self, x: float) -> None:
        self.n += 1.0
        d = x - self.mean
        self.mean += d / self.n
        self.m2 += d * (x - self.mean)

    def variance(self) -> float:
        """Posterior-style variance: the prior v0 with weight k0 plus the observed M2."""
        return (PRIOR_COUNT * PRIOR_VARIANCE + self.m2) / (PRIOR_COUNT + self.n)


class Curriculum:
    """Launch lists for rollout steps over `tasks` (each with `.family`); see the module doc."""

    def __init__(self, tasks: Sequence, kind: str = "cyclic", floor: float = 0.1):
        if kind not in CURRICULA:
            raise ValueError(f"rollout.curriculum = {kind!r}; choose one of {', '.join(CURRICULA)}")
        if not floor >= 0:
            raise ValueError(f"rollout.curriculum_floor = {floor} must be >= 0")
        self.tasks = list(tasks)
        self.kind = kind
        self.floor = float(floor)
        self.families = sorted({t.family for t in self.tasks})
        self.by_family = {f: [t for t in self.tasks if t.family == f] for f in self.families}
        self.stats = {f: FamilyStats() for f in self.families}
        self.cursor = {f: 0 for f in self.families}

    def probabilities(self) -> np.ndarray:
        """[F] draw probabilities of `self.families` (reward_variance)."""
        v = np.array([self.stats[f].variance() for f in self.families], np.float64)
        w = v + self.floor * float(v.mean())
        return w / w.sum()

    def launch(self, n: int, data_position: int, rng: np.random.Generator) -> list:
        """The `n` tasks of one rollout step (`data_position`: tasks launched so far)."""
        if self.kind == "cyclic":
            return [self.tasks[(data_position + i) % len(self.tasks)] for i in range(n)]
        fams = rng.choice(len(self.families), size=n, p=self.probabilities())
        out = []
        for i in fams:
            f = self.families[int(i)]
            pool = self.by_family[f]
            out.append(pool[self.cursor[f] % len(pool)])
            self.cursor[f] += 1
        return out

    def update(self, trajectories: Sequence) -> None:
        """Add the rewards of a step's trainable episodes to their families' statistics."""
        for t in trajectories:
            if t.family in self.stats and t.reward is not None:
                self.stats[t.family].add(float(t.reward))

    def to_dict(self) -> dict:
        return {"kind": self.kind, "floor": self.floor,
                "stats": {f: dataclasses.asdict(s) for f, s in self.stats.items()},
                "cursor": dict(self.cursor)}

    def load(self, state: dict | None) -> None:
        """Restore `to_dict` output (a checkpoint of the same phase); None leaves it fresh."""
        if not state:
            return
        for f, s in state.get("stats", {}).items():
            if f in self.stats:
                self.stats[f] = FamilyStats(**s)
        for f, c in state.get("cursor", {}).items():
            if f in self.cursor:
                self.cursor[f] = int(c)

    def summary(self) -> dict:
        """Metrics: per-family draw probability, episodes seen and mean reward."""
        if self.kind == "cyclic":
            return {}
        p = self.probabilities()
        out = {}
        for f, pf in zip(self.families, p, strict=True):
            out[f"curriculum/p/{f}"] = float(pf)
            out[f"curriculum/n/{f}"] = float(self.stats[f].n)
        return out
