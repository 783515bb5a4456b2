"""Fake GPU nodes: Node objects that look, to a scheduler, like nodes with a kubelet and NVIDIA's device
plugin and GPU Feature Discovery on them.

There is no kubelet, so the test does what a kubelet would: it reports capacity and a Ready condition
through ``/status``, and then clears the ``node.kubernetes.io/not-ready`` taint that the apiserver puts on
every new Node (a real node loses it once the node lifecycle controller sees it Ready; the test cluster
runs no such controller).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import lightkube
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

GPU_COUNT_LABEL = "nvidia.com/gpu.count"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"  # MiB per GPU, as GPU Feature Discovery writes it
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"


async def create_gpu_node(
    client: lightkube.AsyncClient,
    name: str,
    *,
    gpus: int = 8,
    gpu_memory_mib: int = 81920,
    product: str = "NVIDIA-A100-SXM4-80GB",
    cpu: str = "64",
    memory: str = "512Gi",
    pods: int = 110,
    labels: dict[str, str] | None = None,
) -> Node:
    """Create a Ready, untainted Node with ``gpus`` GPUs of ``gpu_memory_mib`` MiB; return it as stored."""
    node_labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        GPU_COUNT_LABEL: str(gpus),
        GPU_MEMORY_LABEL: str(gpu_memory_mib),
        GPU_PRODUCT_LABEL: product,
        **(labels or {}),
    }
    await client.create(Node(metadata=ObjectMeta(name=name, labels=node_labels)))
    resources = {"cpu": cpu, "memory": memory, "pods": str(pods), "nvidia.com/gpu": str(gpus)}
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    ready = {
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "message": "fake node for gpufrac tests",
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }
    status = {"capacity": resources, "allocatable": resources, "conditions": [ready]}
    await client.patch(Node.Status, name, {"status": status}, patch_type=PatchType.MERGE)
    return await client.patch(Node, name, {"spec": {"taints": None}}, patch_type=PatchType.MERGE)


class GpuNodes:
    """Creates fake GPU nodes for one test and deletes them afterwards: nodes are cluster-scoped, so
    they would otherwise outlive the test's namespace and show up in the next test."""

    def __init__(self, client: lightkube.AsyncClient, *, prefix: str) -> None:
        self._client = client
        self._prefix = prefix
        self.names: list[str] = []

    async def create(self, name: str | None = None, **kwargs: Any) -> Node:
        """Like :func:`create_gpu_node`; ``name`` defaults to ``<prefix>-<n>``."""
        name = name or f"{self._prefix}-{len(self.names)}"
        self.names.append(name)
        return await create_gpu_node(self._client, name, **kwargs)

    async def delete_all(self) -> None:
        for name in self.names:
            try:
                await self._client.delete(Node, name)
            except lightkube.ApiError as e:
                if e.status.code != 404:
                    raise
        self.names.clear()
