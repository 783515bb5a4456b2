"""Fake GPU nodes: Node objects that look, to a scheduler, like nodes with a kubelet and NVIDIA's device
plugin and GPU Feature Discovery on them. For clusters without kubelets: the integration tests and
`benchmarks/scheduler.py`.

There is no kubelet, so the caller does what a kubelet would: it reports capacity and a Ready condition
through ``/status``, with the one gpufrac's node agent would set (`gpufrac.io/Ready`), and then clears the
``node.kubernetes.io/not-ready`` taint that the apiserver puts on every new Node (a real node loses it once
the node lifecycle controller sees it Ready; a test cluster runs no such controller). No agent publishes a
device-plugin mode, so the scheduler hands out their GPUs itself.
"""

from __future__ import annotations

from datetime import UTC, datetime

import lightkube
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from gpufrac.contract import node_inventory


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
    """Create a Ready, untainted Node with ``gpus`` GPUs of ``gpu_memory_mib`` MiB; return it as stored.

    The GPUs show twice, as a scheduler of either kind expects: GPU Feature Discovery labels (count, MiB,
    product) and the device plugin's ``nvidia.com/gpu`` capacity and allocatable.
    """
    node_labels_ = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        node_inventory.GPU_COUNT_LABEL: str(gpus),
        node_inventory.GPU_MEMORY_LABEL: str(gpu_memory_mib),
        node_inventory.GPU_PRODUCT_LABEL: product,
        **(labels or {}),
    }
    await client.create(Node(metadata=ObjectMeta(name=name, labels=node_labels_)))
    resources = {"cpu": cpu, "memory": memory, "pods": str(pods), "nvidia.com/gpu": str(gpus)}
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    ready = {
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "message": "fake node (no kubelet)",
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }
    # No heartbeat: no agent refreshes it, and a condition without one never goes stale.
    agent = {**ready, "type": node_inventory.READY_CONDITION, "reason": "FakeNode"}
    del agent["lastHeartbeatTime"]
    status = {"capacity": resources, "allocatable": resources, "conditions": [ready, agent]}
    await client.patch(Node.Status, name, {"status": status}, patch_type=PatchType.MERGE)
    return await client.patch(Node, name, {"spec": {"taints": None}}, patch_type=PatchType.MERGE)
