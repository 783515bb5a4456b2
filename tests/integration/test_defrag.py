"""Defragmentation against a real kube-apiserver: a whole-GPU pod that fits nowhere gets in once a movable
share is evicted (the Eviction API, with Events on both sides), and nothing is evicted that may not be: a
pod without the tenant's consent, one no controller would recreate, one younger than the minimum runtime,
or one a PodDisruptionBudget protects.

Two one-GPU nodes: n0 holds share A (0.3), n1 share B (0.6, pinned there); a whole-GPU pod W fits only once
A moves into n1's free 0.4.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import lightkube
import pytest
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.apps_v1 import ReplicaSet
from lightkube.resources.core_v1 import Event, Pod, PodStatus
from lightkube.types import PatchType

from gpufrac import contract
from gpufrac.contract import keys
from gpufrac.scheduler.mover import MOVE

from . import fakenodes
from .scheduling import eventually, gpu_pod, running_scheduler, wait_bound, why_unschedulable

# kube-apiserver v1.20 serves PodDisruptionBudgets as policy/v1beta1 only.
PodDisruptionBudget = create_namespaced_resource(
    "policy", "v1beta1", "PodDisruptionBudget", "poddisruptionbudgets"
)
# No env ConfigMaps: a ReplicaSet's pods share their template's annotations, where the webhook would have
# named one per pod.
SCHEDULER = {"policy": "binpack", "env_delivery": contract.EnvDelivery.ANNOTATIONS_ONLY}


def share(name: str, namespace: str, fraction: str, *, movable: bool = True, on: str = "") -> dict[str, Any]:
    body = gpu_pod(name, namespace, annotations={"gpu-fraction": fraction}, env_configmap=False).to_dict()
    body["metadata"]["labels"] = {"app": name}
    if movable:
        body["metadata"]["annotations"][keys.MOVABLE_ANNOTATION] = "true"
    if on:
        body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": on}
    return body  # type: ignore[no-any-return]


def replica_set(pod: dict[str, Any]) -> ReplicaSet:
    """One replica of `pod`: the controller that recreates it once it is evicted."""
    name, labels = pod["metadata"]["name"], pod["metadata"]["labels"]
    template = {"metadata": {k: v for k, v in pod["metadata"].items() if k != "name"}, "spec": pod["spec"]}
    body = {
        "metadata": {"name": name},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": template},
    }
    return ReplicaSet.from_dict(body)  # type: ignore[no-any-return]


async def pods_of(client: lightkube.AsyncClient, namespace: str, app: str) -> list[dict[str, Any]]:
    selector = {"app": app}
    return [item.to_dict() async for item in client.list(Pod, namespace=namespace, labels=selector)]


async def pod(client: lightkube.AsyncClient, namespace: str, name: str) -> dict[str, Any]:
    return (await client.get(Pod, name, namespace=namespace)).to_dict()  # type: ignore[no-any-return]


async def going(client: lightkube.AsyncClient, namespace: str, name: str) -> bool:
    """Evicted: being deleted, or gone (the fake nodes' stand-in kubelet ends a deletion)."""
    try:
        return bool((await pod(client, namespace, name))["metadata"].get("deletionTimestamp"))
    except lightkube.ApiError as error:
        if error.status.code == 404:
            return True
        raise


async def reasons(
    client: lightkube.AsyncClient, namespace: str, name: str, reason: str = MOVE.reason
) -> list[str]:
    """The messages of the Events with `reason` about the pod `name`."""
    found = []
    async for event in client.list(Event, namespace=namespace):
        involved = event.involvedObject
        if involved.name == name and event.reason == reason:
            found.append(event.message or "")
    return found


async def two_nodes_with_a_and_b(
    admin: lightkube.AsyncClient,
    namespace: str,
    gpu_nodes: fakenodes.GpuNodes,
    *,
    controlled: bool,
    movable: bool,
) -> tuple[str, str, str]:
    """n0 with A on it (a ReplicaSet's pod, or a bare pod), then n1 with B: binpack would have put B beside A
    had both nodes been there. The nodes, and A's pod name."""
    n0 = (await gpu_nodes.create(gpus=1)).metadata.name  # type: ignore[union-attr]
    a = share("a", namespace, "0.3", movable=movable)
    await admin.create(replica_set(a) if controlled else Pod.from_dict(a), namespace=namespace)
    await wait_bound(admin, namespace, 1)
    n1 = (await gpu_nodes.create(gpus=1)).metadata.name  # type: ignore[union-attr]
    await admin.create(Pod.from_dict(share("b", namespace, "0.6", movable=False, on=n1)))
    await wait_bound(admin, namespace, 2)
    [placed] = await pods_of(admin, namespace, "a")
    assert placed["spec"]["nodeName"] == n0
    name = placed["metadata"]["name"]
    # Running and Ready, as its kubelet would report it: a Pending pod is evicted whatever its budget says.
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    running = {"phase": "Running", "startTime": now, "conditions": [{"type": "Ready", "status": "True"}]}
    await admin.patch(PodStatus, name, {"status": running}, namespace=namespace, patch_type=PatchType.MERGE)
    return n0, n1, name


async def test_a_whole_gpu_gets_in_once_a_movable_share_moves(
    admin_client: lightkube.AsyncClient,
    scheduler_client: lightkube.AsyncClient,
    namespace: str,
    gpu_nodes: fakenodes.GpuNodes,
) -> None:
    """A is evicted, W takes its GPU, and A's ReplicaSet recreates it; the new A lands beside B."""
    async with running_scheduler(scheduler_client, min_runtime=0, **SCHEDULER) as scheduler:
        n0, n1, a = await two_nodes_with_a_and_b(
            admin_client, namespace, gpu_nodes, controlled=True, movable=True
        )
        await admin_client.create(gpu_pod("w", namespace, whole_gpus=1, env_configmap=False))

        async def w_bound() -> bool:
            return bool((await pod(admin_client, namespace, "w"))["spec"].get("nodeName"))

        await eventually(w_bound, "w bound")
        assert (await pod(admin_client, namespace, "w"))["spec"]["nodeName"] == n0
        # A was evicted, and both sides were told.
        assert await going(admin_client, namespace, a)
        assert await reasons(admin_client, namespace, a) == [
            f"moved to make room for pod {namespace}/w on {n0}"
        ]
        assert await reasons(admin_client, namespace, "w") == [
            f"evicting 1 pod(s) to make room on {n0} (move)"
        ]
        assert scheduler.metrics.evictions.labels("move", "evicted")._value.get() == 1

        async def recreated_beside_b() -> bool:
            live = [
                p
                for p in await pods_of(admin_client, namespace, "a")
                if not p["metadata"].get("deletionTimestamp")
            ]
            return len(live) == 1 and live[0]["spec"].get("nodeName") == n1

        await eventually(recreated_beside_b, "A recreated by its ReplicaSet and placed beside B")


@pytest.mark.parametrize("case", ["not-opted-in", "no-controller", "too-young", "disruption-budget"])
async def test_nothing_is_evicted_that_may_not_be(
    case: str,
    admin_client: lightkube.AsyncClient,
    scheduler_client: lightkube.AsyncClient,
    namespace: str,
    gpu_nodes: fakenodes.GpuNodes,
) -> None:
    if case == "disruption-budget":
        budget = {
            "metadata": {"name": "keep-a"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "a"}}},
        }
        await admin_client.create(PodDisruptionBudget.from_dict(budget), namespace=namespace)
    runtime = 3600 if case == "too-young" else 0
    async with running_scheduler(scheduler_client, min_runtime=runtime, **SCHEDULER) as scheduler:
        _, _, a = await two_nodes_with_a_and_b(
            admin_client,
            namespace,
            gpu_nodes,
            controlled=case != "no-controller",
            movable=case != "not-opted-in",
        )
        await admin_client.create(gpu_pod("w", namespace, whole_gpus=1, env_configmap=False))

        await why_unschedulable(admin_client, "w", namespace)
        await asyncio.sleep(1)  # a decision that would evict has had its time
        assert not await going(admin_client, namespace, a)
        assert not (await pod(admin_client, namespace, "w"))["spec"].get("nodeName")
        assert await reasons(admin_client, namespace, a) == []
        refused = scheduler.metrics.evictions.labels("move", "refused")._value.get()
        if case == "disruption-budget":
            assert refused >= 1
            told = await reasons(admin_client, namespace, "w")
            assert told and all(
                "cannot move pod" in message and "a PodDisruptionBudget forbids it" in message
                for message in told
            )
        else:
            assert refused == 0
