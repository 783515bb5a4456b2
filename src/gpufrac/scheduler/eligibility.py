"""Which nodes a pod may be considered for at all, before the engine looks at resources.

Kubernetes-level filters the engine knows nothing about: node readiness and cordons, the scheduler's own
`--node-selector` (the nodes gpufrac manages), the pod's `nodeSelector` and required node affinity
(`affinity`), and NoSchedule/NoExecute taints the pod does not tolerate. Each rejected node is counted
under its reason, for the pod's failure message.
"""

from __future__ import annotations

import functools
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from gpufrac import contract
from gpufrac.cluster.state import ClusterState
from gpufrac.contract import node_inventory
from gpufrac.scheduler import affinity, objects


def tolerates(tolerations: list[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    for toleration in tolerations:
        if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
            continue
        operator = toleration.get("operator") or "Equal"
        if not toleration.get("key"):
            if operator == "Exists":
                return True
            continue
        if toleration["key"] != taint.get("key"):
            continue
        if operator == "Exists" or toleration.get("value", "") == taint.get("value", ""):
            return True
    return False


class Eligibility:
    def __init__(
        self,
        node_selector: Mapping[str, str],
        *,
        require_ready: bool = True,
        heartbeat_timeout: float = node_inventory.HEARTBEAT_TIMEOUT_SECONDS,
    ) -> None:
        self._selector = dict(node_selector)
        self._require_ready = require_ready
        self._heartbeat_timeout = heartbeat_timeout  # 0: a Ready condition never goes stale
        self._heartbeat = np.zeros(0)  # by row: the agent's last heartbeat, NaN for none
        self._usable = np.zeros(0, bool)  # ready and managed, by state row
        self._gpu_not_ready: dict[int, str] = {}  # rows whose agent has not said it is ready, with why
        self._gpu_unready = np.zeros(0, bool)  # the same, by state row
        self._tainted = np.zeros(0, bool)
        self._labels: dict[int, Mapping[str, str]] = {}
        self._taints: dict[int, list[Mapping[str, Any]]] = {}
        self._why_not: dict[int, str] = {}
        self._held: dict[int, str] = {}  # rows the cache holds back, with why (`hold`)
        # Per label key that a topology key named: every row's value as a code (-1: no such label), so that
        # pod affinity and spreads judge every node in a few array operations. Topology keys are the
        # tenants' to choose, but a column is kept only for a key some node carries: node labels are the
        # operator's, so the columns are bounded by them, and a key no node has reads `_nowhere`.
        self._columns: dict[str, tuple[np.ndarray, dict[str, int]]] = {}
        self._label_keys: Counter[str] = Counter()  # label key -> nodes carrying it
        self._nowhere = np.full(0, -1, np.int32)

    def update(self, row: int, node: Mapping[str, Any]) -> None:
        if row >= self._usable.shape[0]:
            extra = np.zeros(row + 1 - self._usable.shape[0] + 64, bool)
            self._usable = np.concatenate([self._usable, extra])
            self._tainted = np.concatenate([self._tainted, extra])
            self._gpu_unready = np.concatenate([self._gpu_unready, extra])
            self._heartbeat = np.concatenate([self._heartbeat, np.full(extra.shape, np.nan)])
        labels = objects.node_labels_of(node)
        self._label_keys.subtract(self._labels.get(row, {}).keys())
        self._label_keys.update(labels.keys())
        self._labels[row] = labels
        for key, (codes, known) in self._columns.items():
            if row < codes.shape[0]:
                value = labels.get(key)
                codes[row] = -1 if value is None else known.setdefault(value, len(known))
        self._taints[row] = objects.node_taints(node)
        if any(labels.get(key) != value for key, value in self._selector.items()):
            self._why_not[row] = "not managed by gpufrac (node selector)"
        elif not objects.node_ready(node):
            self._why_not[row] = "node not ready or cordoned"
        else:
            self._why_not.pop(row, None)
        self._usable[row] = row not in self._why_not and row not in self._held
        self._tainted[row] = bool(self._taints[row])
        not_ready = objects.gpu_ready(node) if self._require_ready else None
        if not_ready is None:
            self._gpu_not_ready.pop(row, None)
        else:
            self._gpu_not_ready[row] = not_ready
        self._gpu_unready[row] = not_ready is not None
        self.heartbeat(row, node)

    def heartbeat(self, row: int, node: Mapping[str, Any]) -> bool:
        """Note when `node`'s agent last refreshed its condition: a Node update that changes nothing else
        (the agent's heartbeat, the kubelet's) still keeps the node alive here. True when this brings back
        a node whose agent had gone silent: pods parked for want of it may fit now."""
        if row >= self._heartbeat.shape[0]:
            return False
        silent = self._silent(self._heartbeat[row : row + 1], time.time())[0]
        beat = objects.gpu_heartbeat(node)
        self._heartbeat[row] = np.nan if beat is None else beat
        return bool(silent and not self._silent(self._heartbeat[row : row + 1], time.time())[0])

    def _silent(self, beats: np.ndarray, now: float) -> np.ndarray:
        """Whether each heartbeat is older than the timeout (never, without a timeout or a heartbeat)."""
        if not (self._require_ready and self._heartbeat_timeout):
            return np.zeros(beats.shape, bool)
        return (now - beats) > self._heartbeat_timeout  # NaN compares False

    def node_rules(
        self, pod: Mapping[str, Any], state: ClusterState
    ) -> tuple[Callable[[int], str | None], Callable[[int], bool]]:
        """Per row: why the node does not match the pod's node selector or required node affinity (None when
        it does), and whether the pod tolerates the node's taints that keep pods off."""
        spec = pod.get("spec") or {}
        wanted = spec.get("nodeSelector") or {}
        tolerations = spec.get("tolerations") or []
        try:
            terms = affinity.node_terms(pod)
        except contract.ContractError:  # refused before it gets here (`constraints.refusal`): no node matches
            terms = ()

        # Each asked once a row: a pod's topology spreads ask of every node for every constraint.
        @functools.cache
        def selected(row: int) -> str | None:
            labels = self._labels.get(row, {})
            if any(labels.get(key) != value for key, value in wanted.items()):
                return "node(s) didn't match the pod's node selector"
            if not affinity.matches(terms, labels, state.names[row]):
                return "node(s) didn't match the pod's node affinity"
            return None

        @functools.cache
        def tolerated(row: int) -> bool:
            return all(tolerates(tolerations, taint) for taint in self._taints.get(row, ()))

        return selected, tolerated

    @staticmethod
    def has_node_rules(pod: Mapping[str, Any]) -> bool:
        """Whether the pod has a node selector or a required node affinity at all."""
        spec = pod.get("spec") or {}
        required = affinity.field_at(spec, "affinity", "nodeAffinity", affinity.REQUIRED)
        return bool(spec.get("nodeSelector")) or required is not None

    def column(self, key: str, size: int) -> np.ndarray:
        """Each row's value of label `key` as a code (-1: the node has no such label), for rows below `size`
        at least: rows with one value share one code."""
        if self._label_keys[key] <= 0:  # no node has it: nothing to build, nor keep
            if self._nowhere.shape[0] < size:
                self._nowhere = np.full(size, -1, np.int32)
            return self._nowhere
        found = self._columns.get(key)
        if found is None or found[0].shape[0] < size:
            known: dict[str, int] = {}
            codes = np.full(max(size, max(self._labels, default=-1) + 1), -1, np.int32)
            for row, labels in self._labels.items():
                value = labels.get(key)
                if value is not None and row < codes.shape[0]:
                    codes[row] = known.setdefault(value, len(known))
            found = self._columns[key] = (codes, known)
        return found[0]

    def hold(self, row: int, reason: str | None) -> None:
        """Keep every pod off `row` for `reason` (the cache cannot account a pod there), or stop doing so."""
        if reason is None:
            self._held.pop(row, None)
        else:
            self._held[row] = reason
        if row < self._usable.shape[0]:
            self._usable[row] = row not in self._why_not and row not in self._held

    def rows_for(
        self,
        pod: Mapping[str, Any],
        state: ClusterState,
        *,
        gpus: bool = True,
        now: float | None = None,
        volumes: Sequence[tuple[affinity.Term, ...]] = (),
    ) -> tuple[np.ndarray, Counter[str]]:
        """Active nodes the pod may land on, and the others counted by reason. A pod that asks for GPUs
        (`gpus`) lands only where the node agent said the node is ready for them, and has said so within
        the heartbeat timeout before `now` (seconds since the epoch; default: the clock). `volumes`: what
        the pod's persistent volumes ask of the node (`volumes.Volumes.constraints`)."""
        active = np.flatnonzero(state.active)
        known = min(self._usable.shape[0], state.active.shape[0])
        active = active[active < known]
        usable = self._usable[active]
        excluded: Counter[str] = Counter()
        for row in active[~usable]:
            excluded[self._why_not.get(int(row)) or self._held[int(row)]] += 1
        rows = active[usable]
        if gpus and self._gpu_not_ready:
            waiting = self._gpu_unready[rows]
            for row in rows[waiting]:
                excluded[self._gpu_not_ready[int(row)]] += 1
            rows = rows[~waiting]
        if gpus:
            silent = self._silent(self._heartbeat[rows], time.time() if now is None else now)
            if silent.any():
                excluded[f"gpufrac agent silent for over {self._heartbeat_timeout:g}s"] += int(silent.sum())
                rows = rows[~silent]
        selected, tolerated = self.node_rules(pod, state)
        has_rules = self.has_node_rules(pod)
        # Most nodes carry no taint and most pods no node selector or affinity: only the others are looked at
        # one by one.
        check = np.ones(len(rows), bool) if has_rules or volumes else self._tainted[rows]
        keep = ~check
        for position in np.flatnonzero(check):
            row = int(rows[position])
            labels = self._labels.get(row, {})
            if (why := selected(row)) is not None:
                excluded[why] += 1
            elif not all(affinity.matches(volume, labels, state.names[row]) for volume in volumes):
                excluded["node(s) had volume node affinity conflict"] += 1
            elif not tolerated(row):
                excluded["node(s) had a taint the pod does not tolerate"] += 1
            else:
                keep[position] = True
        return rows[keep], excluded
