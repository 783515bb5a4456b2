"""Which nodes can take a pod, and why the others cannot: the filter plugins, run as one pass.

A node is counted under the first filter that rejects it, the way kube-scheduler reports "0/N nodes are
available". The result also offers, per feasible node, which GPUs can take the pod's share and which are
empty, so that scorers and GPU pickers need not recompute them.
"""

from __future__ import annotations

import functools
from collections import Counter
from functools import cached_property

import numpy as np

from gpufrac.cluster.model import PodDemand, milli_up
from gpufrac.cluster.state import ClusterState, take_rows
from gpufrac.placement.cache import MEMO_BYTES, Hashed, NodeMemo, shape_key
from gpufrac.placement.filters import FILTERS, Candidates, Filter, gpus_wanted, is_simple, resolve

PASSED = len(FILTERS)  # the verdict of a node no filter rejects; otherwise the index of the first that does


class Fit:
    """Where a pod fits. Arrays are indexed by position in `rows`, the feasible node rows.

    The filters' per-GPU arrays (`filters.Candidates`) are computed only for the nodes a policy asks about
    with `on(positions)` (the chosen one, the nodes whose scores it must refresh), since a decision is
    dominated by such fixed costs. A `Fit` is valid only until the state changes, within one decision.
    """

    def __init__(
        self,
        state: ClusterState,
        pod: PodDemand,
        rows: np.ndarray,
        judging: _Judging,
        shape: Hashed,
        usable: np.ndarray | None = None,
    ) -> None:
        self.state, self.pod, self.rows = state, pod, rows
        self.shape = shape  # the pod's shape, as the memos' key
        self._judging = judging  # how `rejected` judges the nodes `rows` were found among
        self._usable = usable  # `usable` by node row, where the filters' memo keeps it
        self._nodes: dict[int, Candidates] = {}

    def usable(self, positions: np.ndarray | slice | int) -> np.ndarray:
        """`Candidates.usable` of the feasible nodes at `positions` (as `on` takes them): the GPUs the pod
        could take there. Read from the filters' memo where it was used: the filters found them already."""
        if self._usable is not None:
            return take_rows(self._usable, self.rows[positions])
        return self.on(positions).usable

    def on(self, positions: np.ndarray | slice | int) -> Candidates:
        """The filters' per-GPU arrays for the feasible nodes at `positions` (an index array or a slice), or
        for the one at position `positions` (an int: arrays without the node axis, kept, since the picker
        and the placement both read the chosen node's)."""
        if not isinstance(positions, int):
            return Candidates(self.state, self.pod, self.rows[positions])
        known = self._nodes.get(positions)
        if known is None:
            known = self._nodes[positions] = Candidates(self.state, self.pod, self.rows[positions])
        return known

    def narrowed(self, allowed: np.ndarray, shape: Hashed) -> Fit:
        """The same pod's fit on the GPUs `allowed` (by node row and GPU column) only: the nodes left with too
        few usable GPUs drop out. `shape` keys the memos apart from the pod's own, since what a policy scores
        depends on the GPUs usable."""
        usable = np.zeros(allowed.shape, bool)
        usable[self.rows] = self.usable(slice(None)) & allowed[self.rows]
        enough = usable[self.rows].sum(axis=1) >= gpus_wanted(self.pod)
        return Fit(self.state, self.pod, self.rows[enough], self._judging, shape, usable)

    def subset(self, positions: np.ndarray) -> Fit:
        """The same pod's fit among the feasible nodes at `positions` only."""
        return Fit(self.state, self.pod, self.rows[positions], self._judging, self.shape, self._usable)

    @cached_property
    def rejected(self) -> Counter[str]:
        """The nodes that could not take the pod, counted by the first filter that rejected each: judged
        filter by filter only here, since deciding needs no more than whether each node passes them all.
        With a verdict memo (`verdict_memo`), only the nodes that changed since the shape's last pod that fit
        nowhere are judged again: the scheduler retries such pods."""
        rows, shape, memo = self._judging
        if memo is None:
            verdicts = _judge(Candidates(self.state, self.pod, rows), shape)
        else:
            entry = memo.refreshed(
                self.state,
                shape,
                rows,
                lambda stale: (_judge(Candidates(self.state, self.pod, rows[stale]), shape),),
            )
            verdicts = entry["verdict"][rows]
        rejected: Counter[str] = Counter()
        for index, count in enumerate(np.bincount(verdicts, minlength=PASSED + 1)[:PASSED]):
            if count:
                rejected[FILTERS[index].reason(self.pod)] += int(count)
        return rejected

    def per_gpu_milli(self, positions: np.ndarray | slice = slice(None)) -> np.ndarray:
        """Per feasible node (at `positions`), the pod's per-GPU demand in thousandths of that node's GPUs
        (the paper's unit): 1000 for whole GPUs, 0 for CPU-only pods."""
        rows = self.rows[positions]
        if not self.pod.shares:
            return np.full(len(rows), 1000 if self.pod.whole_gpus else 0, np.int64)
        memory = self.state.gpu_mem[:, 0][rows]  # a column's view, then the rows: faster than [rows, 0]
        return milli_up(resolve(self.pod.shares[0].request, memory), np.maximum(memory, 1))

    def gpu_total_milli(self) -> np.ndarray:
        """Per feasible node, the pod's whole GPU demand in thousandths."""
        return self.per_gpu_milli() * gpus_wanted(self.pod)


# For `Fit.rejected`: the candidate rows, the pod's own shape (a narrowed fit's key is another), and the
# verdict memo if the caller keeps one.
_Judging = tuple[np.ndarray, Hashed, NodeMemo | None]


def verdict_memo() -> NodeMemo:
    """A memo for `Fit.rejected`: per pod shape, each node's first failing filter (an index into `FILTERS`,
    one byte). Only shapes that fit nowhere fill it, so a quarter of a memo's bound keeps what a tenant's
    stream of unschedulable shapes may add to the scheduler's memory small beside the filters' own memo."""
    return NodeMemo("verdict", dtypes={"verdict": np.int8}, most_bytes=MEMO_BYTES // 4)


def fit_memo() -> NodeMemo:
    """A memo for `find_fit`: per pod shape, whether each node passes every filter, and the GPUs the pod
    could take there."""
    return NodeMemo("passes", "usable", dtypes={"passes": bool, "usable": bool}, per_gpu=("usable",))


def find_fit(
    state: ClusterState,
    pod: PodDemand,
    *,
    rows: np.ndarray | None = None,
    memo: NodeMemo | None = None,
    shape: Hashed | None = None,
    verdicts: NodeMemo | None = None,
) -> Fit:
    """Feasible nodes for `pod` among `rows` (default: all active nodes), and rejections by reason.

    The filters in `filters.FILTERS` run over all candidate nodes at once (`_passes`); a node is counted
    under the first filter that rejects it (`Fit.rejected`). With a `memo` (from `fit_memo`, kept across
    one state's decisions) only the nodes that changed since the last pod of the same shape are filtered
    again, since whether a node passes depends on nothing but the node and the pod's shape.

    `shape` is `Hashed(shape_key(pod))`, made here unless the caller keeps one per kind of pod: making it
    costs more than a decision's memo lookups, and the memos find a key they hold faster when it is the
    same object (the simulator replays thousands of pods of a few hundred kinds). `verdicts`: a
    `verdict_memo` kept across decisions, for `Fit.rejected`.
    """
    rows = state.active_rows() if rows is None else rows
    shape = shape or Hashed(shape_key(pod))
    judging = (rows, shape, verdicts)
    if memo is None:
        return Fit(state, pod, rows[_passes(Candidates(state, pod, rows), shape)], judging, shape)
    entry = memo.refreshed(state, shape, rows, lambda stale: _fit_fields(state, pod, rows[stale], shape))
    if rows.size == entry["passes"].size:  # every node, in order (as `lookup` takes it): no gathers
        return Fit(state, pod, entry["passes"].nonzero()[0], judging, shape, entry["usable"])
    return Fit(state, pod, rows[entry["passes"][rows]], judging, shape, entry["usable"])


def _fit_fields(
    state: ClusterState, pod: PodDemand, rows: np.ndarray, shape: Hashed
) -> tuple[np.ndarray, ...]:
    """`fit_memo`'s fields for the nodes at `rows`: whether they pass, and, for a pod that takes GPUs, the
    GPUs it could take."""
    candidates = Candidates(state, pod, rows)
    passes = _passes(candidates, shape)
    return (passes, candidates.usable) if pod.wants_gpu else (passes,)


def _passes(candidates: Candidates, shape: Hashed) -> np.ndarray:
    """Per candidate node, whether every filter passes it.

    For a simple pod the filters that count GPUs (`Filter.on_gpus`) are one check, that the node has as many
    usable GPUs as the pod takes, and the others are and-ed in place: a decision judges only the few nodes
    that changed, so numpy's per-call costs are most of it, and this takes about half the calls of
    `_judge`, which says which filter rejected each node, wanted only once a pod fits nowhere."""
    pod = candidates.pod
    if not is_simple(pod):
        return _judge(candidates, shape) == PASSED
    first, second, *others = _on_nodes(shape)  # "cpu", "memory" and "pods" apply to every pod
    passes = first.passes(candidates) & second.passes(candidates)
    for node_filter in others:
        passes &= node_filter.passes(candidates)
    wanted = gpus_wanted(pod)
    if wanted == 1:  # most pods: `any` costs less than counting
        passes &= np.logical_or.reduce(candidates.usable, axis=1)
    elif wanted:
        passes &= candidates.usable.sum(axis=1) >= wanted
    return passes


def _judge(candidates: Candidates, shape: Hashed) -> np.ndarray:
    """Per candidate node, the index of the first filter that rejects it (`PASSED` if none).

    The filters' verdicts are stacked (filter, node) above a row that fails every node, so that each node's
    first failing row is its verdict's position in `_applying`'s order: a fixed handful of numpy calls."""
    order, filters = _applying(shape)
    passes = [node_filter.passes(candidates) for node_filter in filters]
    return order[np.array([*passes, np.zeros(len(candidates.rows), bool)]).argmin(axis=0)]


@functools.lru_cache(maxsize=4096)
def _on_nodes(shape: Hashed) -> tuple[Filter, ...]:
    """The filters that apply to pods of `shape` and do not count GPUs, in order (`_passes`)."""
    return tuple(node_filter for node_filter in _applying(shape)[1] if not node_filter.on_gpus)


@functools.lru_cache(maxsize=4096)
def _applying(shape: Hashed) -> tuple[np.ndarray, tuple[Filter, ...]]:
    """The filters that apply to pods of `shape`, in order, and their indices in `FILTERS` followed by
    `PASSED` (the verdict of a node none of them rejects): which apply depends on the pod alone, and every
    decision with nodes to judge asks."""
    pod = shape.value
    assert isinstance(pod, PodDemand)
    applying = [index for index, node_filter in enumerate(FILTERS) if node_filter.applies(pod)]
    order = np.array([*applying, PASSED], np.int64)
    order.flags.writeable = False  # shared by every decision for the shape
    return order, tuple(FILTERS[index] for index in applying)
