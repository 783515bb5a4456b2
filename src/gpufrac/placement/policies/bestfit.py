"""`bestfit`: the node left with the least CPU and GPU after placement wins (Weng et al.'s BestFit)."""

from __future__ import annotations

import numpy as np

from gpufrac.cluster.state import ClusterState
from gpufrac.placement.fit import Fit
from gpufrac.placement.framework import POLICIES, PerNode, Policy, PolicyKind
from gpufrac.placement.pickers import BestFitGpu
from gpufrac.placement.policies.common import CPU_SCALE, GPU_SCALE, free_gpu_milli, truncate


def least_left(cpu_left: np.ndarray, gpu_left: np.ndarray) -> np.ndarray:
    """The score from what a node would have left (milli-CPU, milli-GPU): the less, the higher."""
    return truncate(100 * (1 - (0.5 * cpu_left / CPU_SCALE + 0.5 * gpu_left / GPU_SCALE)))


class BestFitScore:
    def score(self, state: ClusterState, fit: Fit) -> np.ndarray:
        cpu_left = state.cpu_free[fit.rows] - fit.pod.cpu_milli
        return least_left(cpu_left, free_gpu_milli(state, fit) - fit.gpu_total_milli())


POLICIES.register(PolicyKind("bestfit", lambda context: Policy(PerNode(BestFitScore()), BestFitGpu())))
