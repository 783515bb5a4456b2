"""Queue objects read into `QueueSpec`s, with a one-line reason for every way one can be wrong, and the
checks on the tree they form."""

from __future__ import annotations

import math
from typing import Any

import pytest

from gpufrac.contract import ContractError
from gpufrac.contract.queues import (
    Entitlement,
    QueueSpec,
    Resource,
    check_tree,
    parse_queue,
    preempt_min_runtime,
    queue_of,
    reclaim_min_runtime,
    refusal,
)


def queue(name: str = "team-a", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "gpufrac.io/v1alpha1", "kind": "Queue", "metadata": {"name": name}, "spec": spec}


def test_a_queue_in_each_resource_unit() -> None:
    parsed = parse_queue(
        queue(
            parentQueue="org",
            resources={
                "gpuMemory": {"quota": "80Gi", "limit": "160Gi", "overQuotaWeight": 2},
                "gpus": {"quota": 2, "limit": -1},
                "cpu": {"quota": "500m"},
                "memory": {"quota": "1Gi", "overQuotaWeight": 0.5},
            },
        )
    )
    assert parsed == QueueSpec(
        "team-a",
        "org",
        {
            Resource.GPU_MEMORY: Entitlement(81920, 2.0, 163840),
            Resource.GPUS: Entitlement(2, 1.0, None),
            Resource.CPU: Entitlement(500, 1.0, None),
            Resource.MEMORY: Entitlement(1024, 0.5, None),
        },
    )
    assert parse_queue(queue()) == QueueSpec("team-a")
    assert parse_queue(queue(priority=150)).priority == 150
    assert parse_queue(queue()).priority == 100  # KAI's default


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90),
        ("10m", 600),
        ("1h30m", 5400),
        ("1.5h", 5400),
        ("0", 0),
        ("0s", 0),
        ("250ms", 0.25),
        ("-1s", math.inf),
        ("-1h", math.inf),
    ],
)
def test_min_runtimes_are_kubernetes_durations(text: str, seconds: float) -> None:
    parsed = parse_queue(queue(preemptMinRuntime=text, reclaimMinRuntime=text))
    assert parsed.preempt_min_runtime == parsed.reclaim_min_runtime == seconds
    assert parse_queue(queue()).preempt_min_runtime is None  # unset: the queue above, or the scheduler's


def test_min_runtimes_resolve_up_the_tree_as_kai_scheduler_does() -> None:
    """root.a.b.c.leaf1 reclaiming from root.a.b.d.leaf2 reads d's side of their common ancestor b; within a
    queue, the first preemptMinRuntime from the leaf up."""
    tree = {
        "a": parse_queue(queue("a")),
        "b": parse_queue(queue("b", parentQueue="a", preemptMinRuntime="10m", reclaimMinRuntime="10m")),
        "c": parse_queue(queue("c", parentQueue="b", reclaimMinRuntime="5m")),
        "d": parse_queue(queue("d", parentQueue="b")),
        "leaf1": parse_queue(queue("leaf1", parentQueue="c", preemptMinRuntime="-1s")),
        "leaf2": parse_queue(queue("leaf2", parentQueue="d")),
        "leaf3": parse_queue(queue("leaf3", parentQueue="c", reclaimMinRuntime="1m")),
        "other": parse_queue(queue("other")),
    }
    assert preempt_min_runtime(tree, "leaf1", 42) == math.inf
    assert preempt_min_runtime(tree, "leaf2", 42) == 600  # b's, the first set above it
    assert preempt_min_runtime(tree, "other", 42) == 42  # none set: the scheduler's
    assert reclaim_min_runtime(tree, "leaf1", "leaf2", 42) == 600  # d unset, then b's
    assert reclaim_min_runtime(tree, "leaf2", "leaf1", 42) == 300  # c's: the victim's side below b
    assert reclaim_min_runtime(tree, "leaf1", "leaf3", 42) == 60  # siblings: the victim's own
    # No common ancestor: the victim's top queue, a, which sets none; leaf3's and c's rule only inside b.
    assert reclaim_min_runtime(tree, "other", "leaf3", 42) == 42
    assert reclaim_min_runtime(tree, "leaf3", "other", 42) == 42
    assert reclaim_min_runtime(tree, "leaf1", "gone", 42) == 42  # a deleted queue's pods: the scheduler's


@pytest.mark.parametrize(
    ("obj", "says"),
    [
        ({"metadata": {}}, "metadata.name"),
        (queue(parentQueue="team-a"), "its own parent"),
        (queue(parentQueue=7), "spec.parentQueue"),
        (queue(resources={"nvidia.com/gpu": {"quota": 1}}), "unknown resource; known: gpuMemory, gpus"),
        (queue(resources={"gpus": {"quota": "1.5"}}), "counted whole"),
        (queue(resources={"gpus": {"quota": "-1"}}), "0 or more"),
        (queue(resources={"gpus": {"quota": "lots"}}), "spec.resources.gpus.quota"),
        (queue(resources={"gpus": {"quota": 4, "limit": 2}}), "below the quota"),
        (queue(resources={"gpus": {"overQuotaWeight": -1}}), "overQuotaWeight"),
        (queue(resources={"gpus": {"overQuotaWeight": "nan"}}), "overQuotaWeight"),
        (queue(resources={"gpus": {"quotas": 1}}), "unknown field"),
        (queue(resources=[]), "spec.resources"),
        (queue(resources={"gpus": True}), "must be a map"),
        (queue(resources={"gpuMemory": {"quota": "1e400"}}), "out of range"),
        (queue(resources={"gpus": {"overQuotaWeight": 1e308}}), "from 0 to 1000000"),
        (queue(priority="high"), "spec.priority"),
        (queue(priority=1.5), "must be a whole number"),
        (queue(priority=True), "spec.priority"),
        (queue(priority=2**40), "spec.priority"),
        (queue(preemptMinRuntime="10 minutes"), "spec.preemptMinRuntime=.*a duration such as 90s"),
        (queue(preemptMinRuntime=600), "spec.preemptMinRuntime"),
        (queue(reclaimMinRuntime="5m5"), "spec.reclaimMinRuntime"),
        (queue(reclaimMinRuntime=""), "spec.reclaimMinRuntime"),
        (queue(reclaimMinRuntime="99999h"), "over ten years"),
        (queue(namespaces="team-a"), "spec.namespaces"),
        (queue(namespaces=["Team-A"]), "must be a list of namespace names"),
        (queue(namespaces=[7]), "must be a list of namespace names"),
    ],
)
def test_a_bad_queue_is_refused_with_the_field_and_the_fix(obj: dict[str, Any], says: str) -> None:
    with pytest.raises(ContractError, match=says) as caught:
        parse_queue(obj)
    assert "\n" not in str(caught.value)


def spec(name: str, parent: str | None = None, quota: int = 0, limit: int | None = None) -> QueueSpec:
    return QueueSpec(name, parent, {Resource.GPUS: Entitlement(quota, 1.0, limit)})


@pytest.mark.parametrize(
    ("tree", "says"),
    [
        ([spec("a", "nowhere")], "no such Queue"),
        ([spec("a", "b"), spec("b", "a")], "a cycle"),
        ([spec("p", quota=4), spec("a", "p", 3), spec("b", "p", 2)], "promised more than its quota"),
        ([spec("p", quota=4, limit=4), spec("a", "p", 1, limit=8)], "may not hold more than its parent"),
    ],
)
def test_a_bad_tree_is_refused(tree: list[QueueSpec], says: str) -> None:
    with pytest.raises(ContractError, match=says):
        check_tree({q.name: q for q in tree})


def test_a_sound_tree_passes() -> None:
    check_tree(
        {q.name: q for q in [spec("p", quota=4, limit=8), spec("a", "p", 3), spec("b", "p", 1, limit=8)]}
    )


def test_the_queue_a_pod_joins() -> None:
    assert queue_of({"gpufrac.io/queue": "team-a", "kai.scheduler/queue": "team-b"}) == "team-a"
    assert queue_of({"kai.scheduler/queue": "team-b"}) == "team-b"
    assert (
        queue_of({}) == queue_of({"gpufrac.io/queue": ""}) == queue_of({"gpufrac.io/queue": 5}) == "default"
    )


def test_a_deep_tree_is_checked_in_one_walk() -> None:
    chain = {f"q{i}": spec(f"q{i}", f"q{i - 1}" if i else None) for i in range(5000)}
    check_tree(chain)
    chain["q0"] = spec("q0", "q4999")
    with pytest.raises(ContractError, match="a cycle"):
        check_tree(chain)


def test_a_queue_may_be_closed_to_all_but_some_namespaces_and_its_children_with_it() -> None:
    org = parse_queue(queue("org", namespaces=["ml", "ml-dev"]))
    assert org.namespaces == frozenset({"ml", "ml-dev"})
    tree = {
        "org": org,
        "team": parse_queue(queue("team", parentQueue="org")),  # lists none: its parent's hold
        "dev": parse_queue(queue("dev", parentQueue="org", namespaces=["ml-dev", "web"])),
        "open": parse_queue(queue("open")),
        "shut": parse_queue(queue("shut", namespaces=[])),
    }
    assert refusal(tree, "org", "ml") is None and refusal(tree, "team", "ml-dev") is None
    assert refusal(tree, "open", "anyone") is None
    assert refusal(tree, "team", "web") == (
        "namespace web may not use queue team: its parent queue org's spec.namespaces lists only ml, ml-dev; "
        "use a queue of this namespace, or have an admin add it there"
    )
    # A child cannot open what its parent closed, and an empty list closes a queue to every namespace.
    assert refusal(tree, "dev", "web") is not None and refusal(tree, "dev", "ml-dev") is None
    assert refusal(tree, "dev", "ml") == (
        "namespace ml may not use queue dev: its spec.namespaces lists only ml-dev, web; use a queue of "
        "this namespace, or have an admin add it there"
    )
    assert "queue shut: its spec.namespaces lists no namespace;" in (refusal(tree, "shut", "ml") or "")
    assert refusal(tree, "nobody-made-it", "ml") is None  # unknown queues are refused for that, elsewhere
