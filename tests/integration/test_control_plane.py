"""The control plane fixtures do what the other integration tests rely on: fake GPU nodes a scheduler
would accept, and identities whose rights are those of the real deployment."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, Awaitable
from typing import TypeVar

import lightkube
import pytest
from lightkube.models.core_v1 import Container, PodSpec
from lightkube.models.meta_v1 import ObjectMeta, OwnerReference
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import ConfigMap, Node, Pod, Secret
from lightkube.types import PatchType

from gpufrac.contract import node_inventory
from gpufrac.scheduler import binder

from . import controlplane, fakenodes

T = TypeVar("T")


def _pod(name: str, namespace: str | None = None) -> Pod:
    return Pod(
        metadata=ObjectMeta(name=name, namespace=namespace),
        spec=PodSpec(schedulerName="gpufrac", containers=[Container(name="main", image="busybox")]),
    )


async def _forbidden(call: Awaitable[object]) -> None:
    with pytest.raises(lightkube.ApiError) as caught:
        await call
    assert caught.value.status.code == 403, caught.value.status.message


async def _items(listing: AsyncIterable[T]) -> list[T]:
    return [item async for item in listing]


async def test_fake_gpu_nodes_are_ready_and_untainted(
    admin_client: lightkube.AsyncClient, gpu_nodes: fakenodes.GpuNodes
) -> None:
    await gpu_nodes.create(gpus=4, gpu_memory_mib=40960, product="NVIDIA-A100-SXM4-40GB")
    await gpu_nodes.create(gpus=1)

    for name, gpus in zip(gpu_nodes.names, ["4", "1"], strict=True):
        node = await admin_client.get(Node, name)
        assert node.spec is not None and not node.spec.taints
        assert node.status is not None and node.status.conditions is not None
        conditions = [(c.type, c.status) for c in node.status.conditions]
        assert conditions == [("Ready", "True"), (node_inventory.READY_CONDITION, "True")]
        assert node.status.allocatable is not None and node.status.allocatable["nvidia.com/gpu"] == gpus
        assert node.metadata is not None and node.metadata.labels is not None
        assert node.metadata.labels[node_inventory.GPU_COUNT_LABEL] == gpus
    first = await admin_client.get(Node, gpu_nodes.names[0])
    assert first.metadata is not None and first.metadata.labels is not None
    assert first.metadata.labels[node_inventory.GPU_MEMORY_LABEL] == "40960"
    assert first.metadata.labels[node_inventory.GPU_PRODUCT_LABEL] == "NVIDIA-A100-SXM4-40GB"


async def test_tenant_creates_pods_in_its_namespace_only(
    tenant_client: lightkube.AsyncClient, namespace: str, gpu_nodes: fakenodes.GpuNodes
) -> None:
    node = await gpu_nodes.create()
    assert node.metadata is not None and node.metadata.name is not None

    created = await tenant_client.create(_pod("mine"))
    assert created.metadata is not None and created.metadata.namespace == namespace
    await _forbidden(controlplane.bind_pod(tenant_client, "mine", node.metadata.name, namespace=namespace))
    await _forbidden(tenant_client.patch(Node, node.metadata.name, {"metadata": {"labels": {"mine": "yes"}}}))
    await _forbidden(tenant_client.create(_pod("elsewhere", "default")))


async def test_scheduler_binds_and_annotates_pods(
    admin_client: lightkube.AsyncClient,
    scheduler_client: lightkube.AsyncClient,
    namespace: str,
    gpu_nodes: fakenodes.GpuNodes,
) -> None:
    node = await gpu_nodes.create()
    assert node.metadata is not None and node.metadata.name is not None
    await admin_client.create(_pod("p", namespace))

    # The contract travels with the Binding, as the scheduler writes it (scheduler/binder.py).
    await binder.post_binding(
        scheduler_client,
        name="p",
        namespace=namespace,
        node=node.metadata.name,
        annotations={"gpu-fraction": "0.5"},
    )

    pods = [pod async for pod in scheduler_client.list(Pod, namespace=namespace)]
    assert [(p.spec.nodeName if p.spec else None) for p in pods] == [node.metadata.name]
    assert pods[0].metadata is not None and pods[0].metadata.annotations == {"gpu-fraction": "0.5"}


async def test_scheduler_rights_are_least_privilege(
    admin_client: lightkube.AsyncClient, scheduler_client: lightkube.AsyncClient, namespace: str
) -> None:
    await admin_client.create(_pod("p", namespace))
    condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "no GPU"}
    status = {"status": {"conditions": [condition]}}
    await scheduler_client.patch(Pod.Status, "p", status, namespace=namespace, patch_type=PatchType.MERGE)
    await scheduler_client.create(ConfigMap(metadata=ObjectMeta(name="env", namespace=namespace)))
    lease_meta = ObjectMeta(name="gpufrac-scheduler", namespace=controlplane.SCHEDULER_NAMESPACE)
    lease = await scheduler_client.create(Lease(metadata=lease_meta))
    await scheduler_client.replace(lease)

    await _forbidden(scheduler_client.create(_pod("q", namespace)))
    # No pod writes but its Binding, its status and a delete: "patch" could change any pod's image.
    await _forbidden(
        scheduler_client.patch(Pod, "p", {"metadata": {"labels": {"a": "b"}}}, namespace=namespace)
    )
    await _forbidden(_items(scheduler_client.list(Secret, namespace=namespace)))
    await _forbidden(_items(scheduler_client.list(ConfigMap, namespace=namespace)))
    await _forbidden(scheduler_client.create(Lease(metadata=ObjectMeta(name="x", namespace=namespace))))


async def test_kubeconfig_files_carry_each_identity(control_plane: controlplane.ControlPlane) -> None:
    async with lightkube.AsyncClient(control_plane.config("scheduler"), trust_env=False) as client:
        await _items(client.list(Node))
    async with lightkube.AsyncClient(control_plane.config("tenant"), trust_env=False) as client:
        await _forbidden(_items(client.list(Node)))
    assert control_plane.url.startswith("https://127.0.0.1:")
    assert "BEGIN CERTIFICATE" in control_plane.ca_file.read_text()


async def test_owned_objects_are_collected_with_their_owner(
    admin_client: lightkube.AsyncClient, namespace: str
) -> None:
    pod = await admin_client.create(_pod("owner", namespace))
    assert pod.metadata is not None and pod.metadata.uid is not None
    owner = OwnerReference(apiVersion="v1", kind="Pod", name="owner", uid=pod.metadata.uid)
    await admin_client.create(
        ConfigMap(metadata=ObjectMeta(name="owned", namespace=namespace, ownerReferences=[owner]))
    )
    await admin_client.delete(Pod, "owner", namespace=namespace, grace_period=0)

    for _ in range(100):
        left = await _items(admin_client.list(ConfigMap, namespace=namespace))
        if not [c for c in left if c.metadata and c.metadata.name == "owned"]:
            return
        await asyncio.sleep(0.1)
    pytest.fail("the garbage collector did not delete a ConfigMap whose owner pod was deleted")
