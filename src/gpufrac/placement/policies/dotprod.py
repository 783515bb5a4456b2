"""`dotprod`: the smallest dot product of the node's free (CPU, GPU) vector with the pod's request wins.

Aligning a pod with the node whose free resources it matches least leaves complementary room elsewhere
(Weng et al.'s DotProd baseline, after Tetris).
"""

from __future__ import annotations

import numpy as np

from gpufrac.cluster.state import ClusterState
from gpufrac.placement.fit import Fit
from gpufrac.placement.framework import POLICIES, PerNode, Policy, PolicyKind
from gpufrac.placement.pickers import BestFitGpu
from gpufrac.placement.policies.common import CPU_SCALE, GPU_SCALE, free_gpu_milli, truncate


class DotProductScore:
    def score(self, state: ClusterState, fit: Fit) -> np.ndarray:
        cpu = (state.cpu_free[fit.rows] / CPU_SCALE) * (fit.pod.cpu_milli / CPU_SCALE)
        gpu = (free_gpu_milli(state, fit) / GPU_SCALE) * (fit.gpu_total_milli() / GPU_SCALE)
        return truncate(100 * (1 - (cpu + gpu) / 2))


POLICIES.register(PolicyKind("dotprod", lambda context: Policy(PerNode(DotProductScore()), BestFitGpu())))
