"""The bind against a real kube-apiserver v1.20.2: what its Binding does (annotations copied, UID ignored),
replies lost after and before a write, ConfigMap conflicts, and a pod replaced under its name mid-bind."""

from __future__ import annotations

from typing import Any

import lightkube
import pytest
from lightkube.resources.core_v1 import ConfigMap, Event, Pod

from gpufrac import contract
from gpufrac.contract import keys
from gpufrac.kubeapi.client import build, delete_exactly
from gpufrac.scheduler import binder, objects
from gpufrac.scheduler.loop import Scheduler

from ..kubeapi.fakeapi import LossyClient, api_error
from . import fakenodes
from .scheduling import eventually, gpu_pod, running_scheduler, wait_bound

TENANT_KEYS = {
    keys.container_key("main", keys.MEMORY_REQUEST): "4Gi",
    keys.container_key("main", keys.MEMORY_LIMIT): "6Gi",
    keys.container_key("main", keys.COMPUTE_MODE): "sm-sharing",
}


async def read(client: lightkube.AsyncClient, name: str, namespace: str) -> dict[str, Any] | None:
    try:
        return (await client.get(Pod, name, namespace=namespace)).to_dict()  # type: ignore[no-any-return]
    except lightkube.ApiError as error:
        if error.status.code == 404:
            return None
        raise


def attempts(scheduler: Scheduler, result: str) -> float:
    sample = scheduler.metrics.registry.get_sample_value(
        "gpufrac_scheduler_attempts_total", {"result": result}
    )
    return sample or 0.0


def env_configmap(pod: dict[str, Any]) -> str:
    return keys.env_configmap_name(pod["metadata"]["annotations"][keys.ENV_CONFIGMAP_ANNOTATION], "main")


@pytest.fixture
async def lossy(scheduler_client: lightkube.AsyncClient, gpu_nodes: fakenodes.GpuNodes) -> LossyClient:
    """The scheduler's client behind `Mishaps`, with one GPU node of 16 GiB to bind to."""
    await gpu_nodes.create(gpus=1, gpu_memory_mib=16384)
    return LossyClient(scheduler_client)


# ---- what kube-apiserver v1.20.2 does with a Binding ------------------------------------------------------


async def test_the_apiserver_copies_a_bindings_annotations_and_ignores_its_uid(
    admin_client: lightkube.AsyncClient, scheduler_client: lightkube.AsyncClient, namespace: str
) -> None:
    """The two facts the bind is built on: a Binding's annotations land on the pod in the write that binds
    it (so the contract needs no patch before), and its UID is not checked (so it needs another guard)."""
    await admin_client.create(gpu_pod("p", namespace))
    notes = {"example.com/a": "1", keys.BOUND_UID_ANNOTATION: "x"}
    await binder.post_binding(scheduler_client, name="p", namespace=namespace, node="n1", annotations=notes)
    bound = await read(admin_client, "p", namespace)
    assert bound is not None and bound["spec"]["nodeName"] == "n1"
    assert notes.items() <= bound["metadata"]["annotations"].items()

    first = (await admin_client.create(gpu_pod("q", namespace))).metadata.uid  # type: ignore[union-attr]
    await admin_client.delete(Pod, "q", namespace=namespace, grace_period=0)
    second = (await admin_client.create(gpu_pod("q", namespace))).metadata.uid  # type: ignore[union-attr]
    assert first != second
    await binder.post_binding(scheduler_client, name="q", namespace=namespace, node="n1", uid=first)
    successor = await read(admin_client, "q", namespace)
    assert successor is not None and successor["spec"]["nodeName"] == "n1", "v1.20.2 ignores the UID"
    # A delete with a UID precondition, as the scheduler sends one, leaves a successor alone.
    with pytest.raises(lightkube.ApiError) as refused:
        await delete_exactly(scheduler_client, Pod, "q", namespace=namespace, uid=str(first))
    assert refused.value.status.code == 409
    assert await read(admin_client, "q", namespace) is not None


# ---- lost replies -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("lost", ["reply", "request"])
async def test_a_binding_with_no_answer_is_resolved_by_reading_the_pod_back(
    admin_client: lightkube.AsyncClient,
    namespace: str,
    lossy: LossyClient,
    lost: str,
) -> None:
    client = lossy
    client.lose.append(("create Binding", lost))
    created = await admin_client.create(gpu_pod("p", namespace, annotations={"gpu-fraction": "0.5"}))
    async with running_scheduler(client) as scheduler:  # type: ignore[arg-type]
        (pod,) = await wait_bound(admin_client, namespace, 1)
        await eventually(lambda: _true(not scheduler.cache.assumed), "the bind settled")
        assert attempts(scheduler, "scheduled") == 1 and attempts(scheduler, "error") == 0
        assert list(scheduler.cache.state.placements) == [created.metadata.uid]  # type: ignore[union-attr]
    # Applied and lost: read back as bound, never sent again. Never arrived: read back unbound, sent again.
    assert client.sent["create Binding"] == (1 if lost == "reply" else 2)
    assert objects.bound_for(pod) == pod["metadata"]["uid"]
    configmap = await admin_client.get(ConfigMap, env_configmap(pod), namespace=namespace)
    placed = contract.parse_placement(pod)
    assert placed is not None and configmap.data[keys.ENV_VISIBLE_DEVICES] == placed.shares[0].devices[0]  # type: ignore[index]


async def _true(value: bool) -> bool:
    return value


async def test_an_env_configmap_whose_create_reply_was_lost_is_reused(
    admin_client: lightkube.AsyncClient,
    namespace: str,
    lossy: LossyClient,
) -> None:
    client = lossy
    client.lose.append(("create ConfigMap", "reply"))
    await admin_client.create(gpu_pod("p", namespace, annotations={"gpu-fraction": "0.5"}))
    async with running_scheduler(client) as scheduler:  # type: ignore[arg-type]
        (pod,) = await wait_bound(admin_client, namespace, 1)
        assert attempts(scheduler, "error") == 0
    assert client.sent["create ConfigMap"] == 2 and client.sent["get ConfigMap"] == 1
    configmap = await admin_client.get(ConfigMap, env_configmap(pod), namespace=namespace)
    assert configmap.metadata.ownerReferences[0].uid == pod["metadata"]["uid"]  # type: ignore[union-attr,index]


# ---- ConfigMap conflicts ----------------------------------------------------------------------------------


def configmap_of(pod: Pod, *, owner: Pod, devices: str) -> ConfigMap:
    """`pod`'s env ConfigMap, owned by `owner` (by name and UID: the garbage collector takes one whose
    owner reference does not match a live object)."""
    annotations = pod.metadata.annotations  # type: ignore[union-attr]
    name = keys.env_configmap_name(annotations[keys.ENV_CONFIGMAP_ANNOTATION], "main")  # type: ignore[index]
    return build(
        ConfigMap,
        {
            "metadata": {
                "name": name,
                "namespace": pod.metadata.namespace,  # type: ignore[union-attr]
                "labels": {keys.ENV_CONFIGMAP_LABEL: "true"},
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "name": owner.metadata.name,
                        "uid": owner.metadata.uid,
                    }  # type: ignore[union-attr]
                ],
            },
            "data": {keys.ENV_VISIBLE_DEVICES: devices},
            "immutable": True,
        },
    )


async def test_an_env_configmap_left_by_an_earlier_bind_that_never_landed_is_replaced(
    admin_client: lightkube.AsyncClient,
    scheduler_client: lightkube.AsyncClient,
    namespace: str,
    gpu_nodes: fakenodes.GpuNodes,
) -> None:
    await gpu_nodes.create(gpus=1, gpu_memory_mib=16384)
    created = await admin_client.create(gpu_pod("p", namespace, annotations={"gpu-fraction": "0.5"}))
    stale = await admin_client.create(configmap_of(created, owner=created, devices="GPU-elsewhere"))
    async with running_scheduler(scheduler_client):
        (pod,) = await wait_bound(admin_client, namespace, 1)
    configmap = await admin_client.get(ConfigMap, env_configmap(pod), namespace=namespace)
    assert configmap.metadata.uid != stale.metadata.uid  # type: ignore[union-attr]
    placed = contract.parse_placement(pod)
    assert placed is not None and configmap.data[keys.ENV_VISIBLE_DEVICES] == placed.shares[0].devices[0]  # type: ignore[index]


async def test_an_env_configmap_of_another_owner_is_left_alone_and_the_pod_keeps_its_keys(
    admin_client: lightkube.AsyncClient,
    scheduler_client: lightkube.AsyncClient,
    namespace: str,
    gpu_nodes: fakenodes.GpuNodes,
) -> None:
    await gpu_nodes.create(gpus=1, gpu_memory_mib=16384)
    created = await admin_client.create(gpu_pod("p", namespace, annotations=TENANT_KEYS))
    other = await admin_client.create(gpu_pod("other", namespace, scheduler="someone-else"))
    squatter = await admin_client.create(configmap_of(created, owner=other, devices="all"))
    async with running_scheduler(scheduler_client) as scheduler:
        await eventually(lambda: _true(attempts(scheduler, "error") >= 1), "a failed bind")
    pod = await read(admin_client, "p", namespace)
    assert pod is not None and not pod["spec"].get("nodeName")
    assert pod["metadata"]["annotations"] == created.metadata.annotations  # type: ignore[union-attr]
    left = await admin_client.get(ConfigMap, squatter.metadata.name, namespace=namespace)  # type: ignore[union-attr,arg-type]
    assert left.metadata.uid == squatter.metadata.uid and left.data == squatter.data  # type: ignore[union-attr]


async def test_a_refused_binding_leaves_the_tenants_keys_and_the_retry_binds_the_gpu(
    admin_client: lightkube.AsyncClient,
    namespace: str,
    lossy: LossyClient,
) -> None:
    client = lossy
    created = await admin_client.create(gpu_pod("p", namespace, annotations=TENANT_KEYS))
    seen: list[dict[str, Any]] = []

    async def refuse() -> None:  # what the API server holds when the Binding is refused
        seen.append(await read(admin_client, "p", namespace) or {})
        raise api_error(403, "Forbidden", "refused for the test")

    client.before["create Binding"] = refuse
    async with running_scheduler(client):  # type: ignore[arg-type]
        (pod,) = await wait_bound(admin_client, namespace, 1)
    assert seen[0]["metadata"]["annotations"] == created.metadata.annotations  # type: ignore[union-attr]
    annotations = pod["metadata"]["annotations"]
    assert annotations[keys.container_key("main", keys.MEMORY_REQUEST)] == "4096Mi"
    assert annotations[keys.container_key("main", keys.MEMORY_LIMIT)] == "6144Mi"
    assert annotations[keys.container_key("main", keys.COMPUTE_MODE)] == "sm-sharing"
    assert annotations[keys.container_key("main", keys.DEVICES)]
    assert client.sent["create Binding"] == 2


# ---- a pod deleted and recreated under its name while its bind runs ---------------------------------------


async def replace_pod(admin: lightkube.AsyncClient, namespace: str, successor: Pod) -> str:
    await admin.delete(Pod, "p", namespace=namespace, grace_period=0)
    return str((await admin.create(successor)).metadata.uid)  # type: ignore[union-attr]


async def test_a_pod_replaced_before_its_binding_leaves_the_successor_to_be_scheduled_as_itself(
    admin_client: lightkube.AsyncClient,
    namespace: str,
    lossy: LossyClient,
) -> None:
    client = lossy
    first = await admin_client.create(gpu_pod("p", namespace, annotations={"gpu-fraction": "0.75"}))
    uids: list[str] = []
    async with running_scheduler(client) as scheduler:  # type: ignore[arg-type]

        async def replaced_and_seen() -> None:  # while the bind makes its ConfigMap, as the watch sees it
            successor = gpu_pod("p", namespace, annotations={"gpu-fraction": "0.75"})
            uids.append(await replace_pod(admin_client, namespace, successor))
            gone = str(first.metadata.uid)  # type: ignore[union-attr]
            await eventually(lambda: _true(gone in scheduler.cache.gone_assumed), "the watch saw it deleted")

        client.before["create ConfigMap"] = replaced_and_seen
        (pod,) = await wait_bound(admin_client, namespace, 1)
        await eventually(
            lambda: _true(list(scheduler.cache.state.placements) == uids), "only the successor held"
        )
    assert pod["metadata"]["uid"] == uids[0] and objects.bound_for(pod) == uids[0]
    assert client.sent["create Binding"] == 1  # none for the deleted pod
    configmap = await admin_client.get(ConfigMap, env_configmap(pod), namespace=namespace)
    assert configmap.metadata.ownerReferences[0].uid == uids[0]  # type: ignore[union-attr,index]


async def test_a_successor_bound_by_its_predecessors_binding_is_deleted(
    admin_client: lightkube.AsyncClient,
    namespace: str,
    lossy: LossyClient,
) -> None:
    """The Binding goes out before the watch reports the deletion; v1.20.2 binds the successor with the
    predecessor's contract. The scheduler deletes it (it never asked gpufrac: another scheduler name)."""
    client = lossy
    first = await admin_client.create(gpu_pod("p", namespace, annotations={"gpu-fraction": "0.5"}))
    uids: list[str] = []

    async def replaced() -> None:
        other = gpu_pod("p", namespace, scheduler="someone-else", env_configmap=False)
        uids.append(await replace_pod(admin_client, namespace, other))

    client.before["create Binding"] = replaced
    async with running_scheduler(client) as scheduler:  # type: ignore[arg-type]

        async def deleted() -> bool:
            pod = await read(admin_client, "p", namespace)
            return pod is None or bool(pod["metadata"].get("deletionTimestamp"))

        await eventually(deleted, "the misbound successor deleted")
        await eventually(lambda: _true(not scheduler.cache.state.placements), "nothing held")
    events = [e async for e in admin_client.list(Event, namespace=namespace)]
    (event,) = [e for e in events if e.reason == "BoundToAnotherPod"]
    assert event.involvedObject.uid == uids[0]
    assert str(first.metadata.uid) in (event.message or "")  # type: ignore[union-attr]
