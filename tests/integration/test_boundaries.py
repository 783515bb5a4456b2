"""The boundaries issue 16 adds, against a real kube-apiserver with the scheduler as its service account:
guaranteed compute on a node pool, and sm-sharing tenants kept to their own GPUs."""

from __future__ import annotations

import lightkube
from lightkube.resources.core_v1 import ConfigMap

from gpufrac.contract import keys

from . import fakenodes
from .scheduling import gpu_pod, running_scheduler, wait_bound, why_unschedulable

SM = {keys.container_key("main", keys.COMPUTE_MODE): "sm-sharing", "gpu-fraction": "0.25"}


def capped(percent: int) -> dict[str, str]:
    return {**SM, keys.container_key("main", keys.COMPUTE_PERCENTAGE): str(percent)}


async def test_guaranteed_compute_keeps_caps_on_a_gpu_within_100_percent(
    admin_client: lightkube.AsyncClient,
    scheduler_client: lightkube.AsyncClient,
    namespace: str,
    gpu_nodes: fakenodes.GpuNodes,
) -> None:
    await gpu_nodes.create(gpus=1, gpu_memory_mib=16384, labels={"gpufrac.io/compute-guarantee": "true"})
    await admin_client.create(gpu_pod("sixty", namespace, annotations=capped(60)))
    async with running_scheduler(scheduler_client):
        [bound] = [p for p in await wait_bound(admin_client, namespace, 1) if p["spec"].get("nodeName")]
        await admin_client.create(gpu_pod("fifty", namespace, annotations=capped(50)))
        await admin_client.create(gpu_pod("forty", namespace, annotations=capped(40)))
        message = await why_unschedulable(admin_client, "fifty", namespace)
        listed = await wait_bound(admin_client, namespace, 2)
    assert "GPU compute caps would pass 100%" in message
    assert {p["metadata"]["name"] for p in listed if p["spec"].get("nodeName")} == {"sixty", "forty"}
    notes = bound["metadata"]["annotations"]
    assert notes[keys.container_key("main", keys.COMPUTE_PERCENTAGE)] == "60"
    base = notes[keys.ENV_CONFIGMAP_ANNOTATION]
    env = await admin_client.get(ConfigMap, keys.env_configmap_name(base, "main"), namespace=namespace)
    assert env.data is not None and env.data[keys.ENV_MPS_THREAD_PERCENTAGE] == "60"


async def test_sm_sharing_tenants_never_share_a_gpu(
    admin_client: lightkube.AsyncClient,
    scheduler_client: lightkube.AsyncClient,
    namespace: str,
    other_namespace: str,
    gpu_nodes: fakenodes.GpuNodes,
) -> None:
    other = other_namespace
    await gpu_nodes.create(gpus=1, gpu_memory_mib=16384)
    await admin_client.create(gpu_pod("mine", namespace, annotations=SM))
    async with running_scheduler(scheduler_client):
        [bound] = [p for p in await wait_bound(admin_client, namespace, 1) if p["spec"].get("nodeName")]
        await admin_client.create(gpu_pod("theirs", other, annotations=SM))
        message = await why_unschedulable(admin_client, "theirs", other)
        await admin_client.create(gpu_pod("mine-too", namespace, annotations=SM))
        await wait_bound(admin_client, namespace, 2)
    assert "sm-sharing GPUs hold another fault domain's shares" in message
    assert bound["metadata"]["annotations"][keys.FAULT_DOMAIN_ANNOTATION] == namespace
