"""`clustering`: put pods of a kind together (GpuClustering): shares with shares, 2-GPU pods with 2-GPU pods.

Keeping kinds apart stops small shares from nibbling at the nodes that whole-GPU pods need.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gpufrac.cluster.model import Placement, PodDemand
from gpufrac.cluster.state import ClusterState
from gpufrac.placement.cache import NodeMemo
from gpufrac.placement.fit import Fit
from gpufrac.placement.framework import POLICIES, PerNode, Policy, PolicyKind
from gpufrac.placement.pickers import BestFitGpu
from gpufrac.placement.policies.common import GPU_SCALE, free_gpu_milli


def pod_tag(pod: PodDemand) -> str | None:
    if pod.whole_gpus:
        return f"{pod.whole_gpus}-gpu"
    return "share-gpu" if pod.shares else None


def placement_tag(placement: Placement) -> str | None:
    whole = sum(len(a.gpus) for a in placement.assignments if a.mode is None)
    if whole:
        return f"{whole}-gpu"
    return "share-gpu" if placement.assignments else None


@dataclass
class ClusteringScore:
    memo: NodeMemo = field(default_factory=lambda: NodeMemo("same", "gpu_pods"))

    def score(self, state: ClusterState, fit: Fit) -> np.ndarray:
        tag = pod_tag(fit.pod)
        if tag is None:
            return np.zeros(len(fit.rows), np.int64)
        entry = self.memo.refreshed(state, tag, fit.rows, lambda stale: _tallies(state, fit.rows[stale], tag))
        same, gpu_pods = entry["same"][fit.rows], entry["gpu_pods"][fit.rows]
        # Nested `where`s, not `np.select`, whose own overhead was most of a decision's scoring.
        band = np.where(same > 0, np.where(same == gpu_pods, 75, 50), np.where(gpu_pods == 0, 25, 0))
        return 25 * (GPU_SCALE - free_gpu_milli(state, fit)) // GPU_SCALE + band


def _tallies(state: ClusterState, rows: np.ndarray, tag: str) -> tuple[np.ndarray, np.ndarray]:
    """Per node at `rows`, its pods tagged `tag` and its pods with GPUs (the memo's "same", "gpu_pods")."""
    tags = [[placement_tag(state.placements[pod]) for pod in state.pods_on[row]] for row in rows]
    same = np.array([each.count(tag) for each in tags])
    gpu_pods = np.array([len(each) - each.count(None) for each in tags])
    return same, gpu_pods


POLICIES.register(PolicyKind("clustering", lambda context: Policy(PerNode(ClusteringScore()), BestFitGpu())))
