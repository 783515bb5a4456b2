"""`binpack`: the node whose GPU memory is most requested after placement wins; shares fill GPUs best-fit.

What an operator expects when GPUs are scarce: keep whole GPUs and whole nodes free for big jobs.
"""

from __future__ import annotations

import numpy as np

from gpufrac.cluster.state import ClusterState
from gpufrac.placement.filters import gpus_wanted
from gpufrac.placement.fit import Fit
from gpufrac.placement.framework import POLICIES, PerNode, Policy, PolicyKind
from gpufrac.placement.pickers import BestFitGpu


def requested_after(state: ClusterState, fit: Fit) -> np.ndarray:
    """Per feasible node, the share of its GPU memory requested once the pod is placed (0 to 1)."""
    memory = state.gpu_mem[fit.rows].sum(axis=1)
    usable = state.open_gpus(fit.rows)
    free = np.where(usable, state.gpu_free[fit.rows], 0).sum(axis=1)
    wanted = gpus_wanted(fit.pod)
    # A whole GPU counts at its size; `:1`, not `0`: a cluster of CPU-only nodes has no GPU column.
    request = (
        fit.on(slice(None)).request_mib[:, 0] if fit.pod.shares else state.gpu_mem[fit.rows, :1].sum(axis=1)
    )
    return np.where(memory > 0, (memory - free + wanted * request) / np.maximum(memory, 1), 0.0)


class MostRequested:
    def score(self, state: ClusterState, fit: Fit) -> np.ndarray:
        return np.trunc(100 * requested_after(state, fit)).astype(np.int64)


POLICIES.register(PolicyKind("binpack", lambda context: Policy(PerNode(MostRequested()), BestFitGpu())))
