"""`packing`: fill partly used GPUs first, then free GPUs on used nodes, then idle nodes (GpuPacking)."""

from __future__ import annotations

import numpy as np

from gpufrac.cluster.state import ClusterState, take_rows
from gpufrac.placement.filters import gpus_wanted
from gpufrac.placement.fit import Fit
from gpufrac.placement.fragmentation import usable_free_milli
from gpufrac.placement.framework import POLICIES, PerNode, Policy, PolicyKind
from gpufrac.placement.pickers import BestFitGpu


class PackingScore:
    """Three bands, each capped so they never overlap: [50, 100] when the pod only needs partly used GPUs
    (less free share on them scores higher), [33, 50] when it needs k empty GPUs on a used node (fewer is
    better), [0, 33] for an idle node (fewer GPUs is better)."""

    def score(self, state: ClusterState, fit: Fit) -> np.ndarray:
        if not fit.pod.wants_gpu:
            return np.zeros(len(fit.rows), np.int64)
        free = usable_free_milli(state, fit.rows)
        exists = take_rows(state.gpu_mem, fit.rows) > 0
        count = exists.sum(axis=1)
        fully_free = ((free == 1000) & exists).sum(axis=1)
        wanted = gpus_wanted(fit.pod)
        # The GPUs the pod would take: fitting ones (memory, health and compute mode, as the picker sees
        # them), least free first, lower index on ties.
        fits = fit.usable(slice(None))
        order = np.argsort(np.where(fits, free, 10_000), axis=1, kind="stable")[:, :wanted]
        taken = free[np.arange(len(order))[:, None], order]
        empties_used = (taken == 1000).sum(axis=1)
        free_percent = (taken * 100 // 1000).sum(axis=1)
        # Nested `where`s, not `np.select`, whose own overhead was most of a decision's scoring.
        partly_used = np.maximum(100 - free_percent // 10, 50)
        on_used_node = np.where(empties_used > 0, np.maximum(50 - empties_used, 33), partly_used)
        return np.where(fully_free == count, np.maximum(33 - fully_free, fully_free), on_used_node)


POLICIES.register(PolicyKind("packing", lambda context: Policy(PerNode(PackingScore()), BestFitGpu())))
