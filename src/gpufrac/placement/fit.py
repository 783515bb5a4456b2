"""Which nodes can take a pod, and why the others cannot: the filter plugins, run as one pass.

A node is counted under the first filter that rejects it, the way kube-scheduler reports "0/N nodes are
available". The result also carries, per feasible node, which GPUs can take the pod's share and which are
empty, so that scorers and GPU pickers need not recompute them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from gpufrac.cluster.model import PodDemand, milli_up
from gpufrac.cluster.state import ClusterState
from gpufrac.placement.filters import FILTERS, Candidates, gpus_wanted


@dataclass(frozen=True, slots=True)
class Fit:
    """Where a pod fits. Arrays are indexed by position in `rows`, the feasible node rows."""

    pod: PodDemand
    rows: np.ndarray
    share_ok: np.ndarray  # (len(rows), width) GPUs that can take the pod's (single) share
    empty: np.ndarray  # (len(rows), width) healthy GPUs with no tenant, for whole-GPU use
    request_mib: np.ndarray  # (len(rows), width) the share's request resolved on each GPU
    limit_mib: np.ndarray

    gpu_mem: np.ndarray

    def per_gpu_milli(self) -> np.ndarray:
        """Per feasible node, the pod's per-GPU demand in thousandths of that node's GPUs (the paper's
        unit): 1000 for whole GPUs, 0 for CPU-only pods."""
        if not self.pod.shares:
            return np.full(len(self.rows), 1000 if self.pod.whole_gpus else 0, np.int64)
        memory = np.maximum(self.gpu_mem[:, 0], 1)
        return milli_up(self.request_mib[:, 0], memory)

    def gpu_total_milli(self) -> np.ndarray:
        """Per feasible node, the pod's whole GPU demand in thousandths."""
        return self.per_gpu_milli() * gpus_wanted(self.pod)


def find_fit(
    state: ClusterState, pod: PodDemand, *, rows: np.ndarray | None = None
) -> tuple[Fit, Counter[str]]:
    """Feasible nodes for `pod` among `rows` (default: all active nodes), and rejections by reason.

    Every filter in `filters.FILTERS` runs in order over all candidate nodes at once; a node is counted
    under the first filter that rejects it.
    """
    candidates = Candidates(state, pod, np.flatnonzero(state.active) if rows is None else rows)
    rejected: Counter[str] = Counter()
    alive = np.ones(len(candidates.rows), bool)
    for node_filter in FILTERS:
        if not node_filter.applies(pod):
            continue
        newly = alive & ~node_filter.passes(candidates)
        if newly.any():
            rejected[node_filter.reason(pod)] += int(newly.sum())
            alive &= ~newly
    keep = np.flatnonzero(alive)
    fit = Fit(
        pod=pod,
        rows=candidates.rows[keep],
        share_ok=candidates.share_ok[keep],
        empty=candidates.empty[keep],
        request_mib=candidates.request_mib[keep],
        limit_mib=candidates.limit_mib[keep],
        gpu_mem=candidates.gpu_mem[keep],
    )
    return fit, rejected
