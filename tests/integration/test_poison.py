"""Poison objects on a real kube-apiserver: what the API server lets through (a 5,000-digit annotation, an
absurd allocatable, a GPU inventory that is not JSON, a bound pod naming a GPU its node lacks) is reported
and skipped, and every good pod is still bound, by a running scheduler and by one that starts (lists) with
the poison already there. And a DELETED event whose handler fails is not lost: the cache converges."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import lightkube
from lightkube.resources.core_v1 import Event, Node, Pod
from lightkube.types import PatchType

from gpufrac.contract import keys, node_inventory
from gpufrac.scheduler.config import SchedulerConfig
from gpufrac.scheduler.loop import Scheduler
from gpufrac.testing.fake_nodes import create_gpu_node

from . import fakenodes
from .scheduling import gpu_pod, running_scheduler, wait_bound

HUGE = "9" * 5000


async def events_about(client: lightkube.AsyncClient, namespace: str, name: str) -> list[Event]:
    return [e async for e in client.list(Event, namespace=namespace) if e.involvedObject.name == name]


async def wait_for_event(
    client: lightkube.AsyncClient, namespace: str, name: str, reason: str, *, timeout: float = 30.0
) -> Event:
    deadline = time.monotonic() + timeout
    while True:
        found = [e for e in await events_about(client, namespace, name) if e.reason == reason]
        if found:
            return found[0]
        if time.monotonic() > deadline:
            raise AssertionError(f"no {reason} Event about {namespace}/{name} after {timeout:.0f}s")
        await asyncio.sleep(0.2)


@contextlib.asynccontextmanager
async def poison_nodes(admin: lightkube.AsyncClient, prefix: str) -> AsyncIterator[dict[str, str]]:
    """Nodes the scheduler cannot read, deleted before the test's allocation check (which reads nodes the
    way the scheduler does, and would stop at them)."""
    names = {"absurd": f"{prefix}-absurd", "garbled": f"{prefix}-garbled", "held": f"{prefix}-held"}
    await create_gpu_node(admin, names["absurd"], gpus=8, cpu="1e18")  # 10**21 milli-CPUs: unreadable
    await create_gpu_node(admin, names["garbled"], gpus=8)
    garbage = f'[{{"index": 0, "uuid": "GPU-x", "model": "A100", "memory_mib": {HUGE}, "healthy": true}}]'
    notes = {"metadata": {"annotations": {node_inventory.GPUS_ANNOTATION: garbage}}}
    await admin.patch(Node, names["garbled"], notes, patch_type=PatchType.MERGE)
    await create_gpu_node(admin, names["held"], gpus=2)
    try:
        yield names
    finally:
        for name in names.values():
            await admin.delete(Node, name)


def held_pod(namespace: str, node: str) -> Pod:
    """Bound (by someone) to `node` with a GPU the node does not have: it cannot be accounted."""
    pod = gpu_pod("stray", namespace, annotations={"gpu-fraction": "0.5"}, scheduler="default-scheduler")
    pod.spec.nodeName = node  # type: ignore[union-attr]
    notes = pod.metadata.annotations  # type: ignore[union-attr]
    notes[keys.container_key("main", keys.DEVICES)] = "GPU-not-on-this-node"
    notes[keys.container_key("main", keys.MEMORY_REQUEST)] = "8Gi"
    return pod


POISON_PODS: dict[str, dict[str, Any]] = {
    "digits": {"annotations": {"gpu-fraction": "0." + HUGE}},
    "devices": {"annotations": {"gpu-fraction": "0.5", keys.NUM_DEVICES: HUGE}},
    "garbage": {"annotations": {"gpu-fraction": "half"}},
    "cpus": {"annotations": {"gpu-fraction": "0.5"}, "cpu": "1e18"},
}


async def test_poison_is_reported_and_skipped_and_every_good_pod_is_bound_before_and_after_a_relist(
    admin_client: lightkube.AsyncClient,
    scheduler_client: lightkube.AsyncClient,
    namespace: str,
    gpu_nodes: fakenodes.GpuNodes,
) -> None:
    good_node = (await gpu_nodes.create(gpus=2, gpu_memory_mib=16384)).metadata.name  # type: ignore[union-attr]
    async with poison_nodes(admin_client, f"poison-{uuid.uuid4().hex[:6]}") as bad:
        await admin_client.create(held_pod(namespace, bad["held"]))
        for name, settings in POISON_PODS.items():
            await admin_client.create(gpu_pod(name, namespace, **settings))
        for i in range(3):
            await admin_client.create(gpu_pod(f"good-{i}", namespace, annotations={"gpu-fraction": "0.5"}))
        async with running_scheduler(scheduler_client) as scheduler:
            listed = await wait_bound(admin_client, namespace, 1 + 3)  # the stray pod and the good ones
            assert scheduler.ready
            for name in POISON_PODS:
                event = await wait_for_event(admin_client, namespace, name, "FailedScheduling")
                assert "invalid GPU request" in (event.message or "") and len(event.message or "") <= 1024
            await wait_for_event(admin_client, namespace, "stray", "NotAccounted")
            await wait_for_event(admin_client, "default", bad["absurd"], "InvalidObject")
            await wait_for_event(admin_client, "default", bad["garbled"], "InvalidObject")
            assert set(scheduler.cache.misfits) == {bad["held"]}
            counted = scheduler.metrics.registry.get_sample_value(
                "gpufrac_scheduler_invalid_objects_total", {"kind": "Node", "reason": "InvalidObject"}
            )
            assert counted == 2  # once each, though their heartbeats and relists show them again
        # A scheduler that starts now lists the poison with everything else, and is ready all the same.
        await admin_client.create(gpu_pod("good-late", namespace, annotations={"gpu-fraction": "0.5"}))
        async with running_scheduler(scheduler_client) as restarted:
            listed = await wait_bound(admin_client, namespace, 1 + 4)
            assert restarted.ready
        by_name = {pod["metadata"]["name"]: pod for pod in listed}
        for name in [*(f"good-{i}" for i in range(3)), "good-late"]:
            assert by_name[name]["spec"]["nodeName"] in (good_node, bad["garbled"]), name
        assert all(not by_name[name]["spec"].get("nodeName") for name in POISON_PODS)
        await admin_client.delete(Pod, "stray", namespace=namespace, grace_period=0)


async def test_a_deleted_event_whose_handler_fails_is_not_lost(
    admin_client: lightkube.AsyncClient,
    scheduler_client: lightkube.AsyncClient,
    namespace: str,
    gpu_nodes: fakenodes.GpuNodes,
) -> None:
    await gpu_nodes.create(gpus=1, gpu_memory_mib=16384)
    await admin_client.create(gpu_pod("holder", namespace, annotations={"gpu-fraction": "0.75"}))
    scheduler = Scheduler(scheduler_client, SchedulerConfig())
    handle = scheduler.on_pod_event
    failed: list[str] = []

    def fails_on_the_holders_deletion(event: str, pod: dict[str, Any]) -> None:
        """Every event that says the holder is going (deletionTimestamp set, then DELETED) fails."""
        going = event == "DELETED" or pod["metadata"].get("deletionTimestamp")
        if going and pod["metadata"]["name"] == "holder":
            failed.append(event)
            raise RuntimeError("a bug in the handler")
        handle(event, pod)

    scheduler.on_pod_event = fails_on_the_holders_deletion  # type: ignore[method-assign]
    task = asyncio.create_task(scheduler.run())
    try:
        await wait_bound(admin_client, namespace, 1)
        await admin_client.create(gpu_pod("waiter", namespace, annotations={"gpu-fraction": "0.5"}))
        await admin_client.delete(Pod, "holder", namespace=namespace, grace_period=0)
        # Only a cache that learnt of the deletion anyway (the relist after the failure) frees the room.
        pods = await wait_bound(admin_client, namespace, 1, timeout=30)
        assert [p["metadata"]["name"] for p in pods if p["spec"].get("nodeName")] == ["waiter"]
        assert failed  # the handler did fail on it (the relist may come before the DELETED event)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await scheduler.wait_for_binds()
