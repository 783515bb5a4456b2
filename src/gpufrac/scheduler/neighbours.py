"""What the pods already placed rule out for a pod, judged over the rows the eligibility pass left: host
ports they bind, inter-pod (anti-)affinity (`pod_affinity`), topology spread (`spread`). Each judge returns,
per row, whether the pod may go there (empty: no judgement, every row stays) and the rows ruled out counted
by reason. Apart from the cache, which only keeps the state they read.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from gpufrac import contract
from gpufrac.scheduler import objects, pod_affinity, spread

if TYPE_CHECKING:
    from gpufrac.scheduler.cache import SchedulerCache

Obj = Mapping[str, Any]
Judge = Callable[["SchedulerCache", Obj, str, np.ndarray], tuple[list[bool], Counter[str]]]


def ports_free(
    cache: SchedulerCache, pod: Obj, itself: str, rows: np.ndarray
) -> tuple[list[bool], Counter[str]]:
    """Kubernetes' NodePorts: no two pods on a node bind one host port (binds in flight count)."""
    wanted = objects.host_ports(pod)
    if not wanted:
        return [], Counter()
    free = [
        not any(
            objects.ports_clash(wanted, objects.host_ports(other))
            for uid in cache.state.pods_on[row]
            if uid != itself and (other := cache.placed_pod(uid)) is not None
        )
        for row in rows.tolist()
    ]
    taken = len(free) - sum(free)
    return free, Counter(
        {"node(s) didn't have free ports for the requested pod ports": taken} if taken else {}
    )


def pod_terms_kept(
    cache: SchedulerCache, pod: Obj, itself: str, rows: np.ndarray
) -> tuple[list[bool], Counter[str]]:
    """InterPodAffinity: the pod's own terms, and the anti-affinity of the pods placed."""
    facts = pod_affinity.bound_facts(pod)
    repelling = [
        (other, row)
        for uid, other in cache.repelling.items()
        if uid != itself and (row := cache.row_of(uid)) is not None
    ]
    if not (facts.has_terms or repelling):
        return [], Counter()
    return pod_affinity.allowed(
        facts,
        rows.tolist(),
        cache.eligibility.labels,
        named=placed(cache, itself, pod_affinity.namespaces_named(facts, cache.namespace_labels)),
        repelling=repelling,
        namespace_labels=cache.namespace_labels,
    )


def spread_kept(
    cache: SchedulerCache, pod: Obj, itself: str, rows: np.ndarray
) -> tuple[list[bool], Counter[str]]:
    """PodTopologySpread: the pod's constraints that must hold."""
    try:
        spreads = spread.constraints_of(pod)
    except contract.ContractError:  # refused before it gets here (`constraints.refusal`)
        spreads = ()
    if not spreads:
        return [], Counter()
    selected, tolerated = cache.eligibility.node_rules(pod, cache.state)

    def counts(row: int, constraint: spread.Spread) -> bool:
        return (not constraint.honor_affinity or selected(row) is None) and (
            not constraint.honor_taints or tolerated(row)
        )

    return spread.allowed(
        pod_affinity.identity(pod),
        spreads,
        rows.tolist(),
        np.flatnonzero(cache.state.active).tolist(),
        cache.eligibility.labels,
        counts,
        placed(cache, itself, [pod_affinity.identity(pod).namespace], deleting=False),
    )


def placed(
    cache: SchedulerCache, itself: str, namespaces: Iterable[str], *, deleting: bool = True
) -> list[tuple[pod_affinity.PodFacts, int]]:
    """The pods placed in `namespaces` but `itself` (and, unless `deleting`, those being deleted) as what
    other pods' terms match them by, with their rows."""
    return [
        (pod_affinity.identity(other), row)
        for namespace in namespaces
        for uid in cache.in_namespace.get(namespace, ())
        if uid != itself
        and (other := cache.placed_pod(uid)) is not None
        and (deleting or not objects.terminating(other))
        and (row := cache.row_of(uid)) is not None
    ]


JUDGES: tuple[Judge, ...] = (ports_free, pod_terms_kept, spread_kept)
