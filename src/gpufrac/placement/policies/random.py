"""`random`: any node that fits, and any GPU on it that fits: the baseline every policy must beat."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpufrac.cluster.state import ClusterState
from gpufrac.placement.fit import Fit
from gpufrac.placement.framework import POLICIES, Policy, PolicyKind
from gpufrac.placement.pickers import RandomGpu


@dataclass(frozen=True, slots=True)
class RandomScore:
    rng: np.random.Generator

    def score(self, state: ClusterState, fit: Fit) -> np.ndarray:
        scores = np.zeros(len(fit.rows), np.int64)
        if len(scores) > 1:
            scores[self.rng.integers(len(scores))] = 100
        return scores


POLICIES.register(
    PolicyKind(
        "random",
        lambda context: Policy(RandomScore(context.rng), RandomGpu(context.rng)),
        deterministic=False,
    )
)
