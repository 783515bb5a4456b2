"""Topology spread constraints that must hold (`scheduler.spread`), as kube-scheduler's PodTopologySpread
filter judges them: replicas spread over zones within the skew, pods of other namespaces and pods being
deleted not counted, nodes outside the pod's node affinity not counted as domains, minDomains, and nodes
without the topology label ruled out."""

from __future__ import annotations

from typing import Any

import pytest

from gpufrac import contract
from gpufrac.scheduler import affinity, constraints, spread

from ..kubeapi.apiobjects import key
from .test_pod_affinity import HOST, ZONE, decided, labelled, running
from .test_scheduler_binds import share_pod


def spreading(name: str, key_: str = ZONE, **extra: Any) -> dict[str, Any]:
    body = labelled(share_pod(name), app="infer")
    rule = {"maxSkew": 1, "topologyKey": key_, "labelSelector": {"matchLabels": {"app": "infer"}}, **extra}
    body["spec"]["topologySpreadConstraints"] = [rule]
    return body


async def test_replicas_spread_over_zones_within_the_skew() -> None:
    """Zone a has two nodes, zone b one: four replicas go a, b, a, b, whatever the policy would prefer."""
    placed, _ = await decided([spreading(f"r{i}") for i in range(4)])
    zones = sorted({"a1": "a", "a2": "a", "b1": "b"}[placed[key(f"r{i}")]] for i in range(4))
    assert zones == ["a", "a", "b", "b"]
    two_in_a = [running(f"old{i}", node, app="infer") for i, node in enumerate(("a1", "a2"))]
    placed, _ = await decided([*two_in_a, spreading("next")])
    assert placed[key("next")] == "b1"


async def test_pods_of_other_namespaces_and_pods_being_deleted_are_not_counted() -> None:
    elsewhere = running("elsewhere", "b1", namespace="other", app="infer")
    going = running("going", "b1", app="infer")
    going["metadata"]["deletionTimestamp"] = "2024-05-01T13:00:00Z"
    in_a = running("in-a", "a1", app="infer")
    placed, _ = await decided([elsewhere, going, in_a, spreading("next")])
    assert placed[key("next")] == "b1"  # b counts 0 of the pod's own namespace, a counts 1


async def test_nodes_outside_the_pods_node_affinity_are_no_domain_unless_the_policy_ignores_it() -> None:
    """The pod may only run in zone a: with the default policy zone b is no domain, so a's 2 pods are within
    the skew of themselves; counting b (nodeAffinityPolicy: Ignore), a is 2 ahead of b's 0."""
    two_in_a = [running(f"old{i}", node, app="infer") for i, node in enumerate(("a1", "a2"))]

    def kept_to_a(**extra: Any) -> dict[str, Any]:
        body = spreading("next", **extra)
        body["spec"]["nodeSelector"] = {ZONE: "a"}
        return body

    placed, _ = await decided([*two_in_a, kept_to_a()])
    assert placed[key("next")] in ("a1", "a2")
    placed, messages = await decided([*two_in_a, kept_to_a(nodeAffinityPolicy="Ignore")])
    assert key("next") not in placed
    assert any("2 node(s) didn't match pod topology spread constraints" in message for message in messages)


async def test_fewer_domains_than_min_domains_count_the_emptiest_as_none() -> None:
    """By host: 3 nodes, each running one replica; minDomains 4 makes the least 0, so every node is at
    skew 2."""
    one_each = [running(f"old{i}", node, app="infer") for i, node in enumerate(("a1", "a2", "b1"))]
    placed, _ = await decided([*one_each, spreading("next", HOST)])
    assert key("next") in placed
    placed, _ = await decided([*one_each, spreading("next", HOST, minDomains=4)])
    assert key("next") not in placed


async def test_a_node_without_the_topology_label_is_ruled_out() -> None:
    placed, messages = await decided([spreading("p", "example.com/rack")])
    assert placed == {}
    assert any(
        "3 node(s) didn't match pod topology spread constraints (missing required label)" in m
        for m in messages
    )


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        ({"maxSkew": 0}, "maxSkew"),
        ({"maxSkew": True}, "maxSkew"),
        ({"whenUnsatisfiable": "Sometimes"}, "DoNotSchedule or ScheduleAnyway"),
        ({"nodeTaintsPolicy": "Maybe"}, "Honor or Ignore"),
        ({"topologyKey": ""}, "must name a node label"),
        ({"labelSelector": {"matchLabels": {str(i): "x" for i in range(300)}}}, "at most 256"),
    ],
)
def test_constraints_the_api_server_would_refuse_are_refused(change: dict[str, Any], complaint: str) -> None:
    body = share_pod("p")
    body["spec"]["topologySpreadConstraints"] = [{"maxSkew": 1, "topologyKey": ZONE, **change}]
    with pytest.raises(contract.ContractError, match=complaint):
        spread.constraints_of(body)
    why = constraints.refusal(body)
    assert why is not None and why.startswith("unreadable placement constraints")


async def test_an_empty_selector_counts_no_pod_but_the_pod_itself() -> None:
    """As kube-scheduler counts: with `labelSelector: {}` every domain holds 0, so a1, running a pod, is
    within a skew of 1 for the pod (which counts itself)."""
    pinned = spreading("p", HOST, labelSelector={}, nodeAffinityPolicy="Ignore")
    pinned["spec"]["nodeSelector"] = {HOST: "a1"}
    placed, _ = await decided([running("there", "a1", app="infer"), pinned])
    assert placed[key("p")] == "a1"


async def test_each_nodes_selector_and_affinity_are_read_once_a_decision_however_many_spreads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A tenant's pod of many spreads and a long node affinity cost every spread times every node times
    every requirement; each node's answer is now kept for the decision."""
    asked: list[str] = []
    matches = affinity.matches

    def counted(terms: Any, labels: Any, name: str) -> bool:
        asked.append(name)
        return matches(terms, labels, name)

    monkeypatch.setattr(affinity, "matches", counted)
    body = spreading("next")
    rule = body["spec"]["topologySpreadConstraints"][0]
    body["spec"]["topologySpreadConstraints"] = [dict(rule, topologyKey=key_) for key_ in (ZONE, HOST) * 4]
    body["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": ZONE, "operator": "Exists"}]}]
            }
        }
    }
    placed, _ = await decided([body])
    assert key("next") in placed
    assert max(asked.count(node) for node in set(asked)) <= 2  # the eligibility pass, then the spreads


@pytest.mark.parametrize("field", ["tolerations", "nodeSelector"])
def test_a_pod_of_more_tolerations_or_selector_labels_than_any_needs_is_refused(field: str) -> None:
    body = share_pod("p")
    many = [{"operator": "Exists", "key": f"k{i}"} for i in range(constraints.MAX_TOLERATIONS + 1)]
    body["spec"][field] = many if field == "tolerations" else {f"k{i}": "v" for i in range(300)}
    why = constraints.refusal(body)
    assert why is not None and f"spec.{field} has" in why
