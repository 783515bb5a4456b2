"""GPU pickers shared by several policies: which GPUs on the chosen node the pod gets.

Whole GPUs always go to the lowest-index empty GPUs (as the paper's simulator does); pickers differ only
in where a share lands.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from gpufrac.cluster.state import ClusterState
from gpufrac.placement.filters import gpus_wanted
from gpufrac.placement.fit import Fit


def lowest_empty(fit: Fit, at: int) -> tuple[int, ...]:
    return tuple(int(g) for g in fit.usable(at).nonzero()[0][: fit.pod.whole_gpus])


def ranked(fit: Fit, at: int, order_key: Callable[[], np.ndarray]) -> tuple[int, ...]:
    """Whole GPUs, or the share's devices taken by ascending `order_key()` (stable: lower index first),
    made only for a share: whole GPUs do not need it."""
    if not fit.pod.shares:
        return lowest_empty(fit, at)
    candidates = fit.usable(at).nonzero()[0]
    wanted = gpus_wanted(fit.pod)
    if len(candidates) > wanted:  # else it takes them all, whatever their order
        candidates = candidates[order_key()[candidates].argsort(kind="stable")][:wanted]
    return tuple(sorted(int(g) for g in candidates))


@dataclass(frozen=True, slots=True)
class BestFitGpu:
    """The share goes where it leaves the least unrequested memory: fills partly used GPUs first."""

    def pick(self, state: ClusterState, fit: Fit, at: int) -> tuple[int, ...]:
        return ranked(fit, at, lambda: state.gpu_free[fit.rows[at]] - fit.on(at).request_mib)


@dataclass(frozen=True, slots=True)
class WorstFitGpu:
    """The share goes where the most memory is left: spreads tenants, fewer noisy neighbours."""

    def pick(self, state: ClusterState, fit: Fit, at: int) -> tuple[int, ...]:
        return ranked(fit, at, lambda: -state.gpu_free[fit.rows[at]])


@dataclass(frozen=True, slots=True)
class RandomGpu:
    rng: np.random.Generator

    def pick(self, state: ClusterState, fit: Fit, at: int) -> tuple[int, ...]:
        pool = fit.usable(at).nonzero()[0]
        wanted = gpus_wanted(fit.pod)
        if wanted == 1:  # the one draw `choice(pool, 1, replace=False)` makes, without its set-up
            return (int(pool[self.rng.integers(len(pool))]),)
        chosen = self.rng.choice(pool, size=wanted, replace=False)
        return tuple(sorted(int(g) for g in chosen))
