"""Topology spread constraints that must hold (`whenUnsatisfiable: DoNotSchedule`), judged as
kube-scheduler's PodTopologySpread filter judges them. Pure.

A Deployment of inference replicas spreads them over zones or nodes (`maxSkew: 1`): a node whose domain
would then hold more than `maxSkew` more of the pods the constraint names than the emptiest domain is
ruled out. Pods are counted in the pod's own namespace (the selector with the pod's values of its
`matchLabelKeys` added), on the nodes that count: those with every topology key of the pod's constraints,
which match its node selector and required node affinity (`nodeAffinityPolicy: Honor`, the default) and,
with `nodeTaintsPolicy: Honor`, whose taints it tolerates. Fewer domains than `minDomains` count the
emptiest as 0. Pods being deleted are not counted. `ScheduleAnyway` constraints only rank nodes for
kube-scheduler and are not read.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpufrac import contract
from gpufrac.scheduler.affinity import field_at, list_at, mapping_at
from gpufrac.scheduler.pod_affinity import (
    PodFacts,
    Selector,
    check_size,
    identity,
    selector,
    topology_key,
    with_label_keys,
)

SKEWED = "node(s) didn't match pod topology spread constraints"
MISSING_LABEL = "node(s) didn't match pod topology spread constraints (missing required label)"
_WHERE = "spec.topologySpreadConstraints"
_INT32_MAX = 2**31 - 1  # maxSkew and minDomains are int32 in the API


@dataclass(frozen=True, slots=True)
class Spread:
    max_skew: int
    topology_key: str
    selector: Selector | None  # None: names no pod
    min_domains: int = 1
    honor_affinity: bool = True  # nodeAffinityPolicy
    honor_taints: bool = False  # nodeTaintsPolicy


def constraints_of(pod: Mapping[str, Any]) -> tuple[Spread, ...]:
    """The pod's constraints that must hold; `ContractError` for one the API server would not have taken
    (or more than `pod_affinity.check_size` allows: every placed pod is matched against them)."""
    items = list_at(field_at(pod, "spec", "topologySpreadConstraints") or [], _WHERE)
    if not items:
        return ()
    check_size(items, _WHERE)
    labels = identity(pod).labels
    found = (_constraint(item, f"{_WHERE}[{i}]", labels) for i, item in enumerate(items))
    return tuple(spread for spread in found if spread is not None)


def allowed(
    pod: PodFacts,
    spreads: tuple[Spread, ...],
    rows: np.ndarray,
    nodes: np.ndarray,
    column: Callable[[str], np.ndarray],
    counts: Callable[[int, Spread], bool] | None,
    placed: Iterable[tuple[PodFacts, int]],
) -> tuple[np.ndarray, Counter[str]]:
    """Per row of `rows`, whether the pod may go there by `spreads`, and the rows it may not counted by
    reason. `nodes`: every node of the cluster, of which `counts(row, spread)` says which count for a
    constraint (its policies; None: all of them); `column(key)`: every row's value of a node label as a
    code (-1: none); `placed`: the pods placed (facts, row), not being deleted, that the constraints may
    name."""
    keys = sorted({spread.topology_key for spread in spreads})
    labelled = nodes[np.all([column(key)[nodes] >= 0 for key in keys], axis=0)]
    placed = [(other, row) for other, row in placed if other.namespace == pod.namespace]
    skewed = np.zeros(len(rows), bool)
    for spread in spreads:
        codes = column(spread.topology_key)
        counted = labelled if counts is None else labelled[[counts(int(row), spread) for row in labelled]]
        inside = np.zeros(codes.shape[0], bool)
        inside[counted] = True
        # Pods it names per domain (code); never empty, as rows without the label read index 0 (masked).
        matched = np.zeros(int(codes.max(initial=0)) + 1, np.int64)
        # As kube-scheduler counts: an empty selector names no pod (though the pod itself counts).
        if spread.selector is not None and spread.selector.requirements:
            for other, row in placed:
                if inside[row] and spread.selector.matches(other.labels):
                    matched[codes[row]] += 1
        domains = np.unique(codes[counted])
        least = 0 if len(domains) < max(spread.min_domains, 1) else int(matched[domains].min())
        itself = int(spread.selector is not None and spread.selector.matches(pod.labels))
        here = codes[rows]
        skewed |= (here >= 0) & (matched[np.maximum(here, 0)] + itself - least > spread.max_skew)
    missing = ~np.all([column(key)[rows] >= 0 for key in keys], axis=0)
    skewed &= ~missing
    refused = Counter(
        {
            reason: int(mask.sum())
            for reason, mask in ((MISSING_LABEL, missing), (SKEWED, skewed))
            if mask.any()
        }
    )
    return ~(missing | skewed), refused


def _constraint(item: object, where: str, labels: Mapping[str, str]) -> Spread | None:
    """One constraint; None for one that need not hold (ScheduleAnyway)."""
    fields = mapping_at(item, where)
    when = fields.get("whenUnsatisfiable", "DoNotSchedule")
    if when not in ("DoNotSchedule", "ScheduleAnyway"):
        raise contract.ContractError(
            f"{where}.whenUnsatisfiable", repr(when), "DoNotSchedule or ScheduleAnyway"
        )
    key = topology_key(fields, where)
    skew, least = _count(fields, "maxSkew", where, None), _count(fields, "minDomains", where, 1)
    policies = {}
    for name, default in (("nodeAffinityPolicy", "Honor"), ("nodeTaintsPolicy", "Ignore")):
        policies[name] = fields.get(name) or default
        if policies[name] not in ("Honor", "Ignore"):
            raise contract.ContractError(f"{where}.{name}", repr(policies[name]), "Honor or Ignore")
    if when == "ScheduleAnyway":
        return None
    raw = fields.get("labelSelector")
    pods = (
        None
        if raw is None
        else with_label_keys(selector(raw, f"{where}.labelSelector"), fields, where, labels)
    )
    return Spread(
        skew,
        key,
        pods,
        least,
        honor_affinity=policies["nodeAffinityPolicy"] == "Honor",
        honor_taints=policies["nodeTaintsPolicy"] == "Honor",
    )


def _count(fields: Mapping[str, Any], name: str, where: str, default: int | None) -> int:
    value = fields.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= _INT32_MAX:
        raise contract.ContractError(f"{where}.{name}", repr(value), "must be a whole number of at least 1")
    return value
