"""Gangs against a real kube-apiserver: the chart's PodGroup CRD; a group of three whole-GPU pods on two GPUs
binds none (two are held, their room reserved), and all three together once a third GPU comes; a group still
short after its timeout gives the room back, and another pod takes it."""

from __future__ import annotations

import asyncio
from typing import Any

import lightkube
from lightkube.resources.core_v1 import Pod

from gpufrac.contract import podgroups
from gpufrac.kubeapi.custom import POD_GROUP_RESOURCE

from . import fakenodes
from .conftest import install_crd
from .scheduling import gpu_pod, running_scheduler, scheduling_message, wait_bound


async def pod_group(client: lightkube.AsyncClient, namespace: str, name: str, **spec: Any) -> None:
    await install_crd(client, "podgroups.gpufrac.io")
    body = {"metadata": {"name": name, "namespace": namespace}, "spec": spec}
    await client.create(POD_GROUP_RESOURCE.from_dict(body), namespace=namespace)


def member(name: str, namespace: str, group: str) -> Pod:
    body: dict[str, Any] = gpu_pod(name, namespace, whole_gpus=1).to_dict()
    body["metadata"]["labels"] = {podgroups.POD_GROUP_LABEL: group}
    return Pod.from_dict(body)


async def bound_names(client: lightkube.AsyncClient, namespace: str) -> list[str]:
    listed = [item.to_dict() async for item in client.list(Pod, namespace=namespace)]
    return sorted(pod["metadata"]["name"] for pod in listed if pod["spec"].get("nodeName"))


async def test_a_gang_binds_only_when_all_it_needs_can_run(
    admin_client: lightkube.AsyncClient,
    scheduler_client: lightkube.AsyncClient,
    namespace: str,
    gpu_nodes: fakenodes.GpuNodes,
) -> None:
    await pod_group(admin_client, namespace, "train", minMember=3)
    for _ in range(2):
        await gpu_nodes.create(gpus=1)
    async with running_scheduler(scheduler_client, gangs=True):
        for name in ("w0", "w1", "w2"):
            await admin_client.create(member(name, namespace, "train"))
        await scheduling_message(admin_client, "w1", namespace, "2 of 3 members can run now")
        await asyncio.sleep(1)
        assert await bound_names(admin_client, namespace) == []  # two fit, none is bound
        await gpu_nodes.create(gpus=1)
        await wait_bound(admin_client, namespace, 3)
    assert await bound_names(admin_client, namespace) == ["w0", "w1", "w2"]


async def test_a_gang_short_past_its_timeout_gives_its_room_back(
    admin_client: lightkube.AsyncClient,
    scheduler_client: lightkube.AsyncClient,
    namespace: str,
    gpu_nodes: fakenodes.GpuNodes,
) -> None:
    await pod_group(admin_client, namespace, "train", minMember=3, scheduleTimeoutSeconds=2)
    await gpu_nodes.create(gpus=2)
    async with running_scheduler(scheduler_client, gangs=True):
        for name in ("w0", "w1", "w2"):
            await admin_client.create(member(name, namespace, "train"))
        await scheduling_message(admin_client, "w0", namespace, "could not run together within 2s")
        await admin_client.create(gpu_pod("solo", namespace, whole_gpus=1))
        await wait_bound(admin_client, namespace, 1)
    assert "solo" in await bound_names(admin_client, namespace)


async def test_a_pod_of_a_group_nobody_made_waits_and_says_why(
    admin_client: lightkube.AsyncClient,
    scheduler_client: lightkube.AsyncClient,
    namespace: str,
    gpu_nodes: fakenodes.GpuNodes,
) -> None:
    await install_crd(admin_client, "podgroups.gpufrac.io")
    await gpu_nodes.create(gpus=1)
    async with running_scheduler(scheduler_client, gangs=True):
        await admin_client.create(member("w0", namespace, "nowhere"))
        await scheduling_message(
            admin_client, "w0", namespace, f"pod group {namespace}/nowhere does not exist"
        )
    assert await bound_names(admin_client, namespace) == []


async def test_a_restart_while_members_are_held_binds_none_of_them_alone(
    admin_client: lightkube.AsyncClient,
    scheduler_client: lightkube.AsyncClient,
    namespace: str,
    gpu_nodes: fakenodes.GpuNodes,
) -> None:
    """Held room lives in the scheduler's memory only: a scheduler that restarts starts with the members
    pending, holds them again, and still binds them only together."""
    await pod_group(admin_client, namespace, "train", minMember=2)
    await gpu_nodes.create(gpus=1)
    async with running_scheduler(scheduler_client, gangs=True):
        for name in ("w0", "w1"):
            await admin_client.create(member(name, namespace, "train"))
        await scheduling_message(admin_client, "w0", namespace, "1 of 2 members can run now")
    async with running_scheduler(scheduler_client, gangs=True):
        await asyncio.sleep(2)
        assert await bound_names(admin_client, namespace) == []
        await gpu_nodes.create(gpus=1)
        await wait_bound(admin_client, namespace, 2)
    assert await bound_names(admin_client, namespace) == ["w0", "w1"]
