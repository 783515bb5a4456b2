"""Inter-pod affinity and topology spread, judged as arrays (`pod_affinity.allowed`, `spread.allowed`),
against a plain reading of kube-scheduler's rules node by node, over random clusters."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufrac.scheduler import pod_affinity, spread
from gpufrac.scheduler.pod_affinity import PodFacts

KEYS = ("host", "zone")
APPS = ("a", "b", "c")


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[dict[str, str]], list[tuple[PodFacts, int]]]:
    """Nodes (labels: a host, a zone, sometimes neither) and placed pods (an app, maybe an anti-affinity)."""
    nodes = []
    for row in range(draw(st.integers(1, 6))):
        labels = {"host": f"h{row}"} if draw(st.booleans()) or row == 0 else {}
        if draw(st.booleans()):
            labels["zone"] = draw(st.sampled_from(["z0", "z1"]))
        nodes.append(labels)
    placed = []
    for i in range(draw(st.integers(0, 8))):
        app = draw(st.sampled_from(APPS))
        body: dict[str, Any] = {"metadata": {"name": f"p{i}", "namespace": "team", "labels": {"app": app}}}
        if draw(st.booleans()):
            body["spec"] = {
                "affinity": terms("podAntiAffinity", draw(st.sampled_from(APPS)), draw(st.sampled_from(KEYS)))
            }
        placed.append((pod_affinity.bound_facts(body), draw(st.integers(0, len(nodes) - 1))))
    return nodes, placed


def terms(kind: str, app: str, key: str) -> dict[str, Any]:
    term = {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": key}
    return {kind: {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}


def columns(nodes: list[dict[str, str]]) -> Any:
    def column(key: str) -> np.ndarray:
        known: dict[str, int] = {}
        return np.array([known.setdefault(n[key], len(known)) if key in n else -1 for n in nodes], np.int64)

    return column


def reference_affinity(
    pod: PodFacts, nodes: list[dict[str, str]], placed: list[tuple[PodFacts, int]]
) -> list[str | None]:
    """kube-scheduler's InterPodAffinity Filter, one node at a time."""
    none: Mapping[str, Mapping[str, str]] = {}
    counts: Counter[tuple[str, str]] = Counter()
    for other, row in placed:
        if pod.affinity and all(t.names(other, none) for t in pod.affinity):
            for t in pod.affinity:
                if t.topology_key in nodes[row]:
                    counts[t.topology_key, nodes[row][t.topology_key]] += 1
    verdicts: list[str | None] = []
    for labels in nodes:
        reason = None
        exist = all(
            t.topology_key in labels and counts[t.topology_key, labels[t.topology_key]] > 0
            for t in pod.affinity
        )
        has_keys = all(t.topology_key in labels for t in pod.affinity)
        first = not counts and all(t.names(pod, none) for t in pod.affinity)
        if not (has_keys and (exist or first)):
            reason = pod_affinity.AFFINITY_FAILED
        elif any(
            t.topology_key in labels
            and nodes[row].get(t.topology_key) == labels[t.topology_key]
            and t.names(other, none)
            for t in pod.anti_affinity
            for other, row in placed
        ):
            reason = pod_affinity.ANTI_AFFINITY_FAILED
        elif any(
            t.topology_key in labels
            and nodes[row].get(t.topology_key) == labels[t.topology_key]
            and t.names(pod, none)
            for other, row in placed
            for t in other.anti_affinity
        ):
            reason = pod_affinity.EXISTING_ANTI_AFFINITY
        verdicts.append(reason)
    return verdicts


@settings(max_examples=300, deadline=None)
@given(
    clusters(),
    st.sampled_from(APPS),
    st.sampled_from(["podAffinity", "podAntiAffinity", None]),
    st.sampled_from(APPS),
    st.sampled_from(KEYS),
)
def test_pod_affinity_as_arrays_is_kube_schedulers_rule_node_by_node(
    cluster: Any, app: str, kind: str | None, named: str, key: str
) -> None:
    nodes, placed = cluster
    body: dict[str, Any] = {"metadata": {"name": "new", "namespace": "team", "labels": {"app": app}}}
    if kind:
        body["spec"] = {"affinity": terms(kind, named, key)}
    pod = pod_affinity.facts_of(body)
    repelling: dict[Any, list[int]] = {}
    for other, row in placed:
        for term in other.anti_affinity:
            repelling.setdefault(term, []).append(row)
    rows = np.arange(len(nodes))
    verdicts, refused = pod_affinity.allowed(
        pod, rows, columns(nodes), named=placed, repelling=repelling, namespace_labels={}
    )
    expected = reference_affinity(pod, nodes, placed)
    if not len(verdicts):  # nothing bears on the pod
        assert all(reason is None for reason in expected)
        return
    assert verdicts.tolist() == [reason is None for reason in expected]
    assert refused == Counter(reason for reason in expected if reason is not None)


@settings(max_examples=300, deadline=None)
@given(clusters(), st.sampled_from(APPS), st.sampled_from(KEYS), st.integers(1, 2), st.integers(1, 4))
def test_spread_as_arrays_is_kube_schedulers_rule_node_by_node(
    cluster: Any, app: str, key: str, skew: int, least_domains: int
) -> None:
    nodes, placed = cluster
    rule = {
        "maxSkew": skew,
        "topologyKey": key,
        "labelSelector": {"matchLabels": {"app": app}},
        "minDomains": least_domains,
    }
    body = {
        "metadata": {"name": "new", "namespace": "team", "labels": {"app": app}},
        "spec": {"topologySpreadConstraints": [rule]},
    }
    constraints = spread.constraints_of(body)
    rows = np.arange(len(nodes))
    verdicts, _ = spread.allowed(
        pod_affinity.identity(body), constraints, rows, rows, columns(nodes), None, placed
    )
    domains = {labels[key] for labels in nodes if key in labels}
    matched = Counter(
        nodes[row][key] for other, row in placed if key in nodes[row] and other.labels["app"] == app
    )
    least = 0 if len(domains) < least_domains else min((matched[d] for d in domains), default=0)
    expected = [key in labels and matched[labels[key]] + 1 - least <= skew for labels in nodes]
    assert verdicts.tolist() == expected
