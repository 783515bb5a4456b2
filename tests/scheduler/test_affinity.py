"""Required node affinity, matched as kube-scheduler matches it, and the constraints gpufrac refuses."""

from __future__ import annotations

from typing import Any

import pytest

from gpufrac import contract
from gpufrac.scheduler import affinity, constraints

from ..kubeapi.apiobjects import node, pod
from .test_eligibility import MANAGED, eligibility, names

A100 = {"nvidia.com/gpu.product": "A100", "gpus": "8", "pool": "train"}


def with_affinity(*terms: dict[str, Any], **more: Any) -> dict[str, Any]:
    made = pod("p")
    required = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}
    made["spec"]["affinity"] = {"nodeAffinity": required, **more}
    return made


def label(key: str, operator: str, *values: str) -> dict[str, Any]:
    requirement: dict[str, Any] = {"key": key, "operator": operator}
    if values:
        requirement["values"] = list(values)
    return {"matchExpressions": [requirement]}


@pytest.mark.parametrize(
    ("term", "matches"),
    [
        (label("nvidia.com/gpu.product", "In", "H100", "A100"), True),
        (label("nvidia.com/gpu.product", "In", "H100"), False),
        (label("nvidia.com/gpu.product", "NotIn", "T4"), True),
        (label("missing", "NotIn", "x"), True),  # an absent label is in no set
        (label("pool", "Exists"), True),
        (label("missing", "Exists"), False),
        (label("missing", "DoesNotExist"), True),
        (label("pool", "DoesNotExist"), False),
        (label("gpus", "Gt", "4"), True),
        (label("gpus", "Gt", "8"), False),
        (label("gpus", "Lt", "10"), True),
        (label("pool", "Gt", "1"), False),  # not a number: no match
        (label("missing", "Lt", "1"), False),
        (label("gpus", "Lt", "9223372036854775807"), True),  # int64's largest, as Kubernetes reads it
        (label("gpus", "Gt", "-9223372036854775808"), True),
        ({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}, True),
        ({"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n1"]}]}, False),
        (
            {
                "matchExpressions": [
                    *label("pool", "Exists")["matchExpressions"],
                    *label("gpus", "Lt", "2")["matchExpressions"],
                ]
            },
            False,
        ),  # requirements are ANDed
        ({}, False),  # a term without requirements matches no node
    ],
)
def test_a_term_matches_as_kube_scheduler_matches_it(term: dict[str, Any], matches: bool) -> None:
    terms = affinity.node_terms(with_affinity(term))
    assert affinity.matches(terms, A100, "n1") is matches


def test_terms_are_ored_and_a_pod_without_affinity_matches_every_node() -> None:
    terms = affinity.node_terms(with_affinity(label("pool", "In", "infer"), label("gpus", "Gt", "4")))
    assert affinity.matches(terms, A100, "n1")
    assert not affinity.matches(terms, {"pool": "train"}, "n1")
    assert affinity.node_terms(pod("p")) is None and affinity.matches(None, {}, "n1")


@pytest.mark.parametrize(
    ("term", "complaint"),
    [
        (label("pool", "Like", "t*"), "must be one of In, NotIn, Exists, DoesNotExist, Gt, Lt"),
        (label("pool", "In"), "In needs values"),
        (label("pool", "Exists", "x"), "Exists takes no values"),
        (label("gpus", "Gt", "4", "5"), "Gt needs one whole number"),
        (label("gpus", "Gt", "four"), "Gt needs one whole number"),
        (label("gpus", "Gt", "9223372036854775808"), "Gt needs one whole number"),  # past int64
        ({"matchExpressions": [{"key": "", "operator": "Exists"}]}, "must name a label"),
        ({"matchExpressions": [{"key": "k", "operator": "In", "values": [1]}]}, "must be a list of strings"),
        ({"matchFields": [{"key": "metadata.uid", "operator": "In", "values": ["u"]}]}, "metadata.name"),
        ({"matchFields": [{"key": "metadata.name", "operator": "Exists"}]}, "must be one of In, NotIn"),
        ({"matchExpressions": "pool"}, "must be a list"),
    ],
)
def test_a_term_the_api_server_would_refuse_is_refused(term: dict[str, Any], complaint: str) -> None:
    with pytest.raises(contract.ContractError, match=complaint):
        affinity.node_terms(with_affinity(term))
    why = constraints.refusal(with_affinity(term))
    assert why is not None and why.startswith("unreadable placement constraints: spec.affinity.nodeAffinity")


def test_no_terms_at_all_is_refused() -> None:
    assert constraints.refusal(with_affinity()) is not None


def test_constraints_on_other_pods_are_judged_and_refused_only_when_unreadable() -> None:
    term = {"labelSelector": {"matchLabels": {"app": "infer"}}, "topologyKey": "kubernetes.io/hostname"}
    for kind in ("podAffinity", "podAntiAffinity"):  # judged (`pod_affinity`), not refused
        required = with_affinity(
            label("pool", "Exists"), **{kind: {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
        )
        assert constraints.refusal(required) is None
        unreadable = with_affinity(
            label("pool", "Exists"),
            **{kind: {"requiredDuringSchedulingIgnoredDuringExecution": [{"labelSelector": {}}]}},
        )
        why = constraints.refusal(unreadable)
        assert why is not None and "must name a node label" in why
    spread = pod("p")
    spread["spec"]["topologySpreadConstraints"] = [{"maxSkew": 1, "topologyKey": "zone"}]  # DoNotSchedule
    assert constraints.refusal(spread) is None  # judged (`spread`)
    spread["spec"]["topologySpreadConstraints"][0]["whenUnsatisfiable"] = "ScheduleAnyway"
    assert constraints.refusal(spread) is None
    spread["spec"]["topologySpreadConstraints"] = ["zone"]
    assert constraints.refusal(spread) == (
        "unreadable placement constraints: spec.topologySpreadConstraints[0]=\"'zone'\": must be an object"
    )


def test_eligible_nodes_are_those_the_affinity_matches() -> None:
    nodes = [
        node("a100", labels=MANAGED | {"nvidia.com/gpu.product": "A100"}),
        node("t4", labels=MANAGED | {"nvidia.com/gpu.product": "T4"}),
        node("bare", labels=MANAGED),
    ]
    chooser, state = eligibility(nodes, MANAGED)
    wanting = with_affinity(label("nvidia.com/gpu.product", "In", "A100", "H100"))
    rows, excluded = chooser.rows_for(wanting, state)
    assert names(state, rows) == ["a100"]
    assert excluded == {"node(s) didn't match the pod's node affinity": 2}
    rows, _ = chooser.rows_for(
        with_affinity({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["t4"]}]}), state
    )
    assert names(state, rows) == ["t4"]


def test_an_affinity_too_large_to_match_every_node_against_is_refused() -> None:
    many = [label(f"k{i}", "Exists") for i in range(affinity.MAX_REQUIREMENTS + 1)]
    why = constraints.refusal(with_affinity(*many))
    assert why is not None and f"at most {affinity.MAX_REQUIREMENTS} terms and requirements" in why
    values = [str(i) for i in range(affinity.MAX_VALUES + 1)]
    why = constraints.refusal(with_affinity(label("k", "In", *values)))
    assert why is not None and f"{affinity.MAX_VALUES} values" in why
    assert constraints.refusal(with_affinity(*many[: affinity.MAX_REQUIREMENTS // 2])) is None
