"""The validating webhook's rules for Queue objects: each read as the scheduler reads it, and checked against
the queues the server watches (a missing parent, a cycle, children promised more than their parent, a parent
deleted under its children)."""

from __future__ import annotations

from typing import Any

import pytest

from gpufrac import admission
from gpufrac.contract.queues import Entitlement, QueueSpec, Resource

from .reviews import POLICY, SCHEDULER, TENANT, pod, request

TEAM = QueueSpec("org", None, {Resource.GPUS: Entitlement(4, 1.0, 8)})


def queue(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "gpufrac.io/v1alpha1", "kind": "Queue", "metadata": {"name": name}, "spec": spec}


def decide(
    obj: dict[str, Any] | None, known: dict[str, QueueSpec], **fields: Any
) -> admission.exchange.Decision:
    fields = {
        "resource": "queues.gpufrac.io",  # as kube-apiserver names it: a review without the group never comes
        "namespace": "",
        "name": (obj or {}).get("metadata", {}).get("name", ""),
    } | fields
    return admission.validate(request(obj, **fields), POLICY, trusted_namespace=False, queues=known)


@pytest.mark.parametrize(
    ("obj", "says"),
    [
        (
            queue("a", resources={"gpu": {"quota": 1}}),
            "Queue a: spec.resources.gpu=\"{'quota': 1}\": unknown resource",
        ),
        (queue("a", parentQueue="nowhere"), 'Queue a: spec.parentQueue="nowhere": queue a: no such Queue'),
        (
            queue("a", parentQueue="org", resources={"gpus": {"quota": 5}}),
            "children are promised more than its quota (4)",
        ),
        (
            queue("a", parentQueue="org", resources={"gpus": {"limit": 9}}),
            "may not hold more than its parent org (8)",
        ),
        (queue("org", parentQueue="a"), "a cycle"),
    ],
)
def test_a_bad_queue_is_refused_with_the_reason(obj: dict[str, Any], says: str) -> None:
    known = {"org": TEAM, "a": QueueSpec("a", "org")}
    decision = decide(obj, known)
    assert not decision.allowed and decision.rule == "queue" and says in decision.message, decision.message


def test_a_sound_queue_is_allowed_and_updates_judge_the_new_version() -> None:
    known = {"org": TEAM}
    assert decide(queue("a", parentQueue="org", resources={"gpus": {"quota": 4}}), known).allowed
    smaller = queue("org", resources={"gpus": {"quota": 1}})
    assert (
        decide(
            smaller, known | {"a": QueueSpec("a", "org", {Resource.GPUS: Entitlement(2)})}, operation="UPDATE"
        ).allowed
        is False
    )


def test_a_parent_is_not_deleted_under_its_children() -> None:
    known = {"org": TEAM, "a": QueueSpec("a", "org"), "b": QueueSpec("b", "org")}
    refused = decide(None, known, operation="DELETE", name="org", old=queue("org"))
    assert not refused.allowed and "queue org is the parent of a, b" in refused.message
    assert decide(None, known, operation="DELETE", name="a", old=queue("a")).allowed


def test_without_a_watch_each_queue_is_still_read() -> None:
    assert not decide(queue("a", resources={"gpus": {"quota": "x"}}), {}).allowed
    assert decide(queue("a", resources={"gpus": {"quota": 1}}), {}).allowed


def test_a_pod_may_join_only_a_queue_open_to_its_namespace() -> None:
    """A queue label is the tenant's to write: with the webhook watching Queues, a pod labelled with a queue
    its namespace may not use is refused (the scheduler would leave it waiting, saying the same)."""
    known = {
        "team-a": QueueSpec("team-a", namespaces=frozenset({"ml"})),
        "team-a-dev": QueueSpec("team-a-dev", parent="team-a"),
        "open": QueueSpec("open"),
    }

    def pod_in(namespace: str, labels: dict[str, str], user: str = TENANT) -> admission.exchange.Decision:
        body = pod({})
        body["metadata"]["labels"] = labels
        return admission.validate(
            request(body, namespace=namespace, user=user), POLICY, trusted_namespace=True, queues=known
        )

    refused = pod_in("web", {"gpufrac.io/queue": "team-a-dev"})
    assert (refused.allowed, refused.rule) == (False, "queue-namespace")
    assert refused.message == (
        "namespace web may not use queue team-a-dev: its parent queue team-a's spec.namespaces lists only "
        "ml; use a queue of this namespace, or have an admin add it there"
    )
    assert not pod_in("web", {"kai.scheduler/queue": "team-a"}).allowed  # KAI's label is read the same
    assert pod_in("ml", {"gpufrac.io/queue": "team-a-dev"}).allowed
    assert pod_in("web", {"gpufrac.io/queue": "open"}).allowed
    assert pod_in("web", {}).allowed  # the default queue is open to all
    assert pod_in("web", {"gpufrac.io/queue": "team-a"}, user=SCHEDULER).allowed  # its reservations
    # A webhook that does not watch Queues cannot tell, and leaves it to the scheduler.
    body = pod({})
    body["metadata"]["labels"] = {"gpufrac.io/queue": "team-a"}
    assert admission.validate(request(body, namespace="web"), POLICY, trusted_namespace=True).allowed
