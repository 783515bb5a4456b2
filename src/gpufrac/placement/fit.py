"""Which nodes can take a pod, and why the others cannot: the filter plugins, run as one pass.

A node is counted under the first filter that rejects it, the way kube-scheduler reports "0/N nodes are
available". The result also carries, per feasible node, which GPUs can take the pod's share and which are
empty, so that scorers and GPU pickers need not recompute them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

import numpy as np

from gpufrac.cluster.model import PodDemand, milli_up
from gpufrac.cluster.state import ClusterState
from gpufrac.placement.cache import NodeMemo, shape_key
from gpufrac.placement.filters import FILTERS, Candidates, gpus_wanted


class _Cut:
    """A `Fit` array, cut out of the filters' results for the feasible nodes on first use and kept."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, fit: Fit, owner: type) -> np.ndarray:
        value: np.ndarray = fit._judged[self.name][fit._at]
        fit.__dict__[self.name] = value
        return value


class Fit:
    """Where a pod fits. Arrays are indexed by position in `rows`, the feasible node rows.

    Each array is cut out of the filters' results on first use, since most policies read only some of
    them; so a `Fit` is valid only until the state or the filters' memo changes, within one decision.
    """

    share_ok = _Cut()  # (len(rows), width) GPUs that can take the pod's (single) share
    empty = _Cut()  # (len(rows), width) healthy GPUs with no tenant, for whole-GPU use
    request_mib = _Cut()  # (len(rows), width) the share's request resolved on each GPU
    limit_mib = _Cut()
    gpu_mem = _Cut()

    def __init__(self, pod: PodDemand, rows: np.ndarray, judged: Mapping[str, np.ndarray], at: np.ndarray):
        self.pod, self.rows = pod, rows
        self._judged, self._at = judged, at  # the feasible nodes are `judged[name][at]`

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


PASSED = len(FILTERS)  # the verdict of a node no filter rejects; otherwise the index of the first that does
_JUDGED = ("share_ok", "empty", "request_mib", "limit_mib")  # what a verdict carries besides its code


def fit_memo() -> NodeMemo:
    """A memo for `find_fit`: per pod shape, each node's verdict and GPU masks."""
    dtypes = {
        "verdict": np.int64,
        "share_ok": bool,
        "empty": bool,
        "request_mib": np.int64,
        "limit_mib": np.int64,
    }
    return NodeMemo("verdict", *_JUDGED, dtypes=dtypes, per_gpu=_JUDGED)


def find_fit(
    state: ClusterState, pod: PodDemand, *, rows: np.ndarray | None = None, memo: NodeMemo | None = None
) -> tuple[Fit, Counter[str]]:
    """Feasible nodes for `pod` among `rows` (default: all active nodes), and rejections by reason.

    Every filter in `filters.FILTERS` runs in order over all candidate nodes at once; a node is counted
    under the first filter that rejects it. With a `memo` (from `fit_memo`, kept across one state's
    decisions) only the nodes that changed since the last pod of the same shape are filtered again, since
    a verdict depends on nothing but the node and the pod's shape.
    """
    rows = np.flatnonzero(state.active) if rows is None else rows
    if memo is None:
        verdict, judged = _judge(Candidates(state, pod, rows))
        keep = np.flatnonzero(verdict == PASSED)
        at = keep
    else:
        entry, stale = memo.lookup(state, shape_key(pod), rows)
        if stale.size:
            fresh = rows[stale]
            entry["verdict"][fresh], judged = _judge(Candidates(state, pod, fresh))
            for name in _JUDGED:
                entry[name][fresh] = judged[name]
            memo.stamp(state, entry, fresh)
        verdict = entry["verdict"][rows]
        keep = np.flatnonzero(verdict == PASSED)
        at = rows[keep]
        judged = {"gpu_mem": state.gpu_mem} | entry
    rejected: Counter[str] = Counter()
    for index, count in enumerate(np.bincount(verdict, minlength=PASSED + 1)[:PASSED]):
        if count:
            rejected[FILTERS[index].reason(pod)] += int(count)
    return Fit(pod, rows[keep], judged, at), rejected


def _judge(candidates: Candidates) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Per candidate node, the index of the first filter that rejects it (`PASSED` if none), and the
    GPU masks and resolved requests a `Fit` carries."""
    pod = candidates.pod
    verdict = np.full(len(candidates.rows), PASSED, np.int64)
    for index, node_filter in enumerate(FILTERS):
        if node_filter.applies(pod):
            verdict[(verdict == PASSED) & ~node_filter.passes(candidates)] = index
    return verdict, {name: getattr(candidates, name) for name in (*_JUDGED, "gpu_mem")}
