"""What the pods already placed rule out for a pod, judged over the rows the eligibility pass left: host
ports they bind, inter-pod (anti-)affinity (`pod_affinity`), topology spread (`spread`). Each judge returns,
per row, whether the pod may go there (nothing ruled out: no judgement, every row stays) and the rows ruled
out counted by reason. Placed pods in `absent` are not counted: the pod itself (a bound pod asked where it
could be moved to), and the victims a preemption weighs gone. Apart from the cache, which only keeps the
state they read.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Set
from typing import TYPE_CHECKING, Any

import numpy as np

from gpufrac import contract
from gpufrac.scheduler import objects, pod_affinity, spread

if TYPE_CHECKING:
    from gpufrac.scheduler.cache import SchedulerCache

Obj = Mapping[str, Any]
Judge = Callable[["SchedulerCache", Obj, Set[str], np.ndarray], tuple[np.ndarray, Counter[str]]]


def ports_free(
    cache: SchedulerCache, pod: Obj, absent: Set[str], rows: np.ndarray
) -> tuple[np.ndarray, Counter[str]]:
    """Kubernetes' NodePorts: no two pods on a node bind one host port (binds in flight count)."""
    wanted = objects.host_ports(pod)
    if not wanted:
        return np.zeros(0, bool), Counter()
    free = [
        not any(
            objects.ports_clash(wanted, objects.host_ports(other))
            for uid in cache.state.pods_on[row]
            if uid not in absent and (other := cache.placed_pod(uid)) is not None
        )
        for row in rows.tolist()
    ]
    taken = len(free) - sum(free)
    return np.array(free, bool), Counter(
        {"node(s) didn't have free ports for the requested pod ports": taken} if taken else {}
    )


def pod_terms_kept(
    cache: SchedulerCache, pod: Obj, absent: Set[str], rows: np.ndarray
) -> tuple[np.ndarray, Counter[str]]:
    """InterPodAffinity: the pod's own terms, and the anti-affinity of the pods placed."""
    facts = pod_affinity.bound_facts(pod)
    repelling = {
        term: (row for uid in holders if uid not in absent and (row := cache.row_of(uid)) is not None)
        for term, holders in cache.pods.repelling.items()
    }
    if not (facts.has_terms or repelling):
        return np.zeros(0, bool), Counter()
    names: set[str] = set()
    for term in (*facts.affinity, *facts.anti_affinity):
        namespaces = pod_affinity.namespaces_named(term, cache.namespace_labels)
        names.update(cache.pods.named(namespaces, term.selector))
    return pod_affinity.allowed(
        facts,
        rows,
        columns(cache),
        named=located(cache, absent, names),
        repelling=repelling,
        namespace_labels=cache.namespace_labels,
    )


def spread_kept(
    cache: SchedulerCache, pod: Obj, absent: Set[str], rows: np.ndarray
) -> tuple[np.ndarray, Counter[str]]:
    """PodTopologySpread: the pod's constraints that must hold."""
    try:
        spreads = spread.constraints_of(pod)
    except contract.ContractError:  # refused before it gets here (`constraints.refusal`)
        spreads = ()
    if not spreads:
        return np.zeros(0, bool), Counter()
    selected, tolerated = cache.eligibility.node_rules(pod, cache.state)

    def counts(row: int, constraint: spread.Spread) -> bool:
        return (not constraint.honor_affinity or selected(row) is None) and (
            not constraint.honor_taints or tolerated(row)
        )

    # Most pods name no nodes and honour no taints: then every node with the keys counts.
    ruled = cache.eligibility.has_node_rules(pod) or any(c.honor_taints for c in spreads)

    facts = pod_affinity.identity(pod)
    names: set[str] = set()
    for constraint in spreads:
        names.update(cache.pods.named([facts.namespace], constraint.selector))
    going = {
        uid for uid in names if (other := cache.placed_pod(uid)) is not None and objects.terminating(other)
    }
    return spread.allowed(
        facts,
        spreads,
        rows,
        np.flatnonzero(cache.state.active),
        columns(cache),
        counts if ruled else None,
        located(cache, absent, names - going),
    )


def columns(cache: SchedulerCache) -> Callable[[str], np.ndarray]:
    """Each node label's column of value codes (`Eligibility.column`), over every row of the state."""
    size = cache.state.active.shape[0]
    return lambda key: cache.eligibility.column(key, size)


def located(
    cache: SchedulerCache, absent: Set[str], uids: Iterable[str]
) -> list[tuple[pod_affinity.PodFacts, int]]:
    """The placed pods among `uids` but those `absent`, with their rows."""
    return [
        (cache.pods.facts[uid], row)
        for uid in uids
        if uid not in absent and (row := cache.row_of(uid)) is not None and uid in cache.pods.facts
    ]


JUDGES: tuple[Judge, ...] = (ports_free, pod_terms_kept, spread_kept)


def allowed(
    cache: SchedulerCache, pod: Obj, rows: np.ndarray, absent: Set[str]
) -> tuple[np.ndarray, Counter[str]]:
    """Per row, whether no judge rules the pod out there, and the rows ruled out counted by the first judge
    that did; each judge sees only the rows the ones before it left."""
    keep = np.ones(len(rows), bool)
    refused: Counter[str] = Counter()
    for judge in JUDGES:
        left = np.flatnonzero(keep)
        if not left.size:
            break
        kept, why = judge(cache, pod, absent, rows[left])
        if why:
            keep[left[~kept]] = False
            refused += why
    return keep, refused
