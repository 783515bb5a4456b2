"""A pod's persistent volumes against a real kube-apiserver, under the chart's RBAC: a claim bound to a
volume of one node keeps the pod there; a claim of delayed binding is named the chosen node, and the pod is
bound once a provisioner (played by the test) has made its volume there."""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import lightkube
from lightkube.resources.core_v1 import PersistentVolume, PersistentVolumeClaim, Pod
from lightkube.resources.storage_v1 import StorageClass

from gpufrac.scheduler.volumes import SELECTED_NODE_ANNOTATION, WAIT_FOR_FIRST_CONSUMER

from . import fakenodes
from .scheduling import gpu_pod, running_scheduler, wait_bound


def mounting(name: str, namespace: str, claim: str) -> Pod:
    body = gpu_pod(name, namespace, annotations={"gpu-fraction": "0.5"}).to_dict()
    body["spec"]["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]
    return Pod.from_dict(body)


def local_volume(name: str, storage_class: str, node: str) -> PersistentVolume:
    """A volume on `node` only, as a provisioner of local disks makes one."""
    on_node = {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}
    spec = {
        "capacity": {"storage": "1Gi"},
        "accessModes": ["ReadWriteOnce"],
        "storageClassName": storage_class,
        "local": {"path": "/mnt/disk"},
        "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [on_node]}]}},
    }
    return PersistentVolume.from_dict({"metadata": {"name": name}, "spec": spec})


async def provisioner(
    client: lightkube.AsyncClient, namespace: str, claim: str, volume: str, storage_class: str
) -> None:
    """Make the claim's volume on the node the scheduler names on it, and bind the claim to it."""
    while True:
        found = await client.get(PersistentVolumeClaim, claim, namespace=namespace)
        node = (found.metadata.annotations or {}).get(SELECTED_NODE_ANNOTATION)  # type: ignore[union-attr]
        if node:
            await client.create(local_volume(volume, storage_class, node))
            await client.patch(
                PersistentVolumeClaim, claim, {"spec": {"volumeName": volume}}, namespace=namespace
            )
            return
        await asyncio.sleep(0.2)


def claim(name: str, namespace: str, *, storage_class: str, volume: str = "") -> PersistentVolumeClaim:
    spec = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "1Gi"}},
        "storageClassName": storage_class,
        **({"volumeName": volume} if volume else {}),
    }
    return PersistentVolumeClaim.from_dict({"metadata": {"name": name, "namespace": namespace}, "spec": spec})


async def test_volumes_decide_the_node_and_a_delayed_claim_is_named_it(
    admin_client: lightkube.AsyncClient,
    scheduler_client: lightkube.AsyncClient,
    namespace: str,
    gpu_nodes: fakenodes.GpuNodes,
) -> None:
    nodes = [(await gpu_nodes.create(gpus=1)).metadata.name for _ in range(3)]  # type: ignore[union-attr]
    suffix = uuid.uuid4().hex[:6]
    delayed, static, local = f"delayed-{suffix}", f"static-{suffix}", f"local-{suffix}"
    await admin_client.create(
        StorageClass.from_dict(
            {
                "metadata": {"name": delayed},
                "provisioner": "example.com/test",
                "volumeBindingMode": WAIT_FOR_FIRST_CONSUMER,
            }
        )
    )
    await admin_client.create(local_volume(local, static, nodes[2]))
    made = f"made-{suffix}"
    try:
        await admin_client.create(claim("pinned", namespace, storage_class=static, volume=local))
        await admin_client.create(claim("scratch", namespace, storage_class=delayed))
        await admin_client.create(mounting("pinned", namespace, "pinned"))
        await admin_client.create(mounting("scratch", namespace, "scratch"))
        async with running_scheduler(scheduler_client, policy="binpack"):
            listed = await wait_bound(admin_client, namespace, 1)
            assert [pod["metadata"]["name"] for pod in listed if pod["spec"].get("nodeName")] == ["pinned"]
            await provisioner(admin_client, namespace, "scratch", made, delayed)
            listed = await wait_bound(admin_client, namespace, 2)
        placed = {pod["metadata"]["name"]: pod["spec"]["nodeName"] for pod in listed}
        assert placed["pinned"] == nodes[2]
        scratch = await admin_client.get(PersistentVolumeClaim, "scratch", namespace=namespace)
        notes = scratch.metadata.annotations or {}  # type: ignore[union-attr]
        assert notes.get(SELECTED_NODE_ANNOTATION) == placed["scratch"]
    finally:
        for volume in (local, made):
            with contextlib.suppress(lightkube.ApiError):
                await admin_client.delete(PersistentVolume, volume)
        await admin_client.delete(StorageClass, delayed)
