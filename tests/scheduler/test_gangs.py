"""The gang book: members held until the group's minMember can run, released together; dropped members;
groups held past their timeout (or whose PodGroup went) released for their room to be given back."""

from __future__ import annotations

from gpufrac.cluster.model import Placement
from gpufrac.scheduler.gangs import Gangs, members_of
from gpufrac.scheduler.tenants import Tenants


def gangs_with(min_member: int, timeout: float = 10.0) -> Gangs:
    made = Gangs(on_bad=lambda *_: None)
    spec = {"minMember": min_member, "scheduleTimeoutSeconds": timeout}
    made.index.listed([{"kind": "PodGroup", "metadata": {"name": "g", "namespace": "ns"}, "spec": spec}])
    return made


def held(uid: str) -> tuple[str, dict[str, object], Placement]:
    return uid, {"metadata": {"uid": uid}}, Placement(uid, "n1")


def test_members_are_held_until_enough_can_run_then_released_together() -> None:
    made = gangs_with(3)
    assert made.hold("ns/g", held("a"), bound=0, now=0) is None
    assert made.hold("ns/g", held("b"), bound=0, now=1) is None
    together = made.hold("ns/g", held("c"), bound=0, now=2)
    assert together is not None and [uid for uid, _, _ in together] == ["a", "b", "c"]
    assert made.gangs == {} and made.drop("a") is None


def test_bound_members_count_toward_the_group() -> None:
    made = gangs_with(3)
    together = made.hold("ns/g", held("c"), bound=2, now=0)
    assert together is not None and len(together) == 1


def test_a_dropped_member_is_no_longer_held() -> None:
    made = gangs_with(3)
    made.hold("ns/g", held("a"), bound=0, now=0)
    made.hold("ns/g", held("b"), bound=0, now=0)
    assert made.drop("a") == held("a")
    assert made.hold("ns/g", held("c"), bound=0, now=0) is None  # b and c: still short of 3


def test_a_group_past_its_timeout_or_gone_is_released() -> None:
    made = gangs_with(3, timeout=5)
    made.hold("ns/g", held("a"), bound=0, now=0)
    assert made.expired(4.9) == []
    ((spec, key, members),) = made.expired(5.0)
    assert spec is not None and key == "ns/g" and [m[0] for m in members] == ["a"]
    made.hold("ns/g", held("b"), bound=0, now=10)
    made.index.changed("DELETED", {"kind": "PodGroup", "metadata": {"name": "g", "namespace": "ns"}})
    ((spec, _, members),) = made.expired(10)
    assert spec is None and [m[0] for m in members] == ["b"]


def test_bound_members_are_counted_by_group() -> None:
    pods = {
        "1": {"metadata": {"namespace": "ns", "labels": {"gpufrac.io/pod-group": "g"}}},
        "2": {"metadata": {"namespace": "other", "labels": {"gpufrac.io/pod-group": "g"}}},
        "3": {"metadata": {"namespace": "ns"}},
    }
    assert members_of({"ns/g"}, pods.values()) == {"ns/g": 1}


def test_a_pod_groups_queue_is_its_members_queue() -> None:
    made = Gangs(on_bad=lambda *_: None)
    spec = {"minMember": 2, "queue": "team-a"}
    made.index.listed([{"kind": "PodGroup", "metadata": {"name": "g", "namespace": "ns"}, "spec": spec}])
    tenants = Tenants(report=lambda _: None, pod_groups=made.index)
    member = {
        "metadata": {"namespace": "ns", "labels": {"gpufrac.io/pod-group": "g", "gpufrac.io/queue": "b"}}
    }
    loner = {"metadata": {"namespace": "ns", "labels": {"gpufrac.io/queue": "b"}}}
    assert (tenants.tenant(member), tenants.tenant(loner)) == ("team-a", "b")
    assert Tenants(report=lambda _: None).tenant(member) == "b"  # without gangs, its own label


def test_a_queue_closed_to_the_pods_namespace_is_not_the_queue_it_counts_in() -> None:
    """A PodGroup's queue may change after its pods run (the webhook does not see PodGroups), and a pod may
    predate its queue's `namespaces`: such pods count in `default`, so that no namespace makes another
    team's queue look busy or offers its pods as that queue's; a pod still waiting is told why."""
    made = Gangs(on_bad=lambda *_: None)
    spec = {"minMember": 2, "queue": "team-a"}
    made.index.listed([{"kind": "PodGroup", "metadata": {"name": "g", "namespace": "web"}, "spec": spec}])
    tenants = Tenants(report=lambda _: None, pod_groups=made.index)
    tenants.on_listed([{"metadata": {"name": "team-a"}, "spec": {"namespaces": ["ml"]}}])
    member = {"metadata": {"namespace": "web", "labels": {"gpufrac.io/pod-group": "g"}}}
    labelled = {"metadata": {"namespace": "web", "labels": {"gpufrac.io/queue": "team-a"}}}
    owner = {"metadata": {"namespace": "ml", "labels": {"gpufrac.io/queue": "team-a"}}}
    assert [tenants.tenant(pod) for pod in (member, labelled, owner)] == ["default", "default", "team-a"]
    assert tenants.claimed(member) == "team-a"
    assert (tenants.refusal(member) or "").startswith("namespace web may not use queue team-a")
    assert tenants.refusal(owner) is None
    assert tenants.refusal({"metadata": {"namespace": "ml", "labels": {"gpufrac.io/queue": "nope"}}}) == (
        "queue nope does not exist: create the Queue, or label the pod with one that does"
    )
