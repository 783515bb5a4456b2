"""Helpers for scheduler tests: GPU pods as a tenant would write them (after the webhook), running the
scheduler in-process, waiting for binds, and recomputing the allocation from the API objects alone."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import lightkube
from lightkube.resources.core_v1 import Node, Pod

from gpufrac import contract
from gpufrac.contract import keys
from gpufrac.scheduler import objects
from gpufrac.scheduler.config import SchedulerConfig
from gpufrac.scheduler.loop import Scheduler

from . import controlplane


def gpu_pod(
    name: str,
    namespace: str,
    *,
    annotations: dict[str, str] | None = None,
    whole_gpus: int = 0,
    cpu: str = "100m",
    scheduler: str = "gpufrac",
    env_configmap: bool = True,
) -> Pod:
    """A pod as the webhook admits it: with the env ConfigMap annotation it would have generated."""
    notes = dict(annotations or {})
    if env_configmap:
        notes[keys.ENV_CONFIGMAP_ANNOTATION] = f"{keys.ENV_CONFIGMAP_PREFIX}{uuid.uuid4().hex[:10]}"
    limits = {"nvidia.com/gpu": str(whole_gpus)} if whole_gpus else {}
    return Pod.from_dict(  # type: ignore[no-any-return]
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "annotations": notes},
            "spec": {
                "schedulerName": scheduler,
                "automountServiceAccountToken": False,
                "containers": [
                    {
                        "name": "main",
                        "image": "busybox",
                        "resources": {"requests": {"cpu": cpu, **limits}, "limits": limits},
                    }
                ],
            },
        }
    )


@contextlib.asynccontextmanager
async def running_scheduler(client: lightkube.AsyncClient, **settings: Any) -> AsyncIterator[Scheduler]:
    scheduler = Scheduler(client, SchedulerConfig(**settings))
    task = asyncio.create_task(scheduler.run())
    try:
        yield scheduler
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await scheduler.wait_for_binds()


async def wait_bound(
    client: lightkube.AsyncClient, namespace: str, count: int, *, timeout: float = 60.0
) -> list[dict[str, Any]]:
    """The namespace's pods once `count` of them are bound; fails with what is missing after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        pods = [pod.to_dict() async for pod in client.list(Pod, namespace=namespace)]
        bound = [pod for pod in pods if pod["spec"].get("nodeName")]
        if len(bound) >= count:
            return pods
        if time.monotonic() > deadline:
            raise AssertionError(f"{len(bound)} of {count} pods bound after {timeout:.0f}s")
        await asyncio.sleep(0.2)


async def allocation_problems(client: lightkube.AsyncClient) -> list[str]:
    """Every GPU's requested memory and modes, recomputed from the API objects alone: the nodes' GPUs (as
    the scheduler reads them) and the bound pods' annotations, in every namespace."""
    memory: dict[tuple[str, str], int] = {}
    nodes: set[str] = set()
    async for node in client.list(Node):
        spec = objects.node_spec(node.to_dict())
        nodes.add(spec.name)
        memory |= {(spec.name, gpu.uuid): gpu.memory_mib for gpu in spec.gpus}
    requested: dict[tuple[str, str], int] = defaultdict(int)
    modes: dict[tuple[str, str], set[str]] = defaultdict(set)
    holders: dict[tuple[str, str], list[str]] = defaultdict(list)
    async for item in client.list(Pod, namespace=lightkube.ALL_NS):
        pod = item.to_dict()
        node = pod["spec"].get("nodeName")
        # Pods of a node already deleted (a test's nodes go before its namespace) hold nothing any more.
        placed = contract.parse_placement(pod) if node in nodes and not objects.is_done(pod) else None
        if placed is None:
            continue
        for share in placed.shares:
            for device in share.devices:
                requested[node, device] += share.request_mib
                modes[node, device].add(share.mode.value)
                holders[node, device].append("share")
        for whole in placed.whole:
            for device in whole.devices:
                requested[node, device] += memory.get((node, device), 0)
                holders[node, device].append("whole")
    problems = [
        f"{node} GPU {device}: no such GPU" for node, device in requested if (node, device) not in memory
    ]
    problems += [
        f"{node} GPU {device}: {mib} MiB requested of {memory[node, device]}"
        for (node, device), mib in requested.items()
        if (node, device) in memory and mib > memory[node, device]
    ]
    problems += [
        f"{node} GPU {device}: modes {sorted(m)}" for (node, device), m in modes.items() if len(m) > 1
    ]
    problems += [
        f"{node} GPU {device}: held whole but shared"
        for (node, device), kinds in holders.items()
        if "whole" in kinds and len(kinds) > 1
    ]
    return problems


def top(plane: controlplane.ControlPlane, *args: str) -> tuple[str, str]:
    """`gpufrac top` as admin, in a subprocess: its JSON and its table."""
    command = [
        sys.executable,
        "-m",
        "gpufrac.cli",
        "top",
        *args,
        "--kubeconfig",
        str(plane.kubeconfig("admin")),
    ]
    shown = subprocess.run([*command, "--format", "json"], capture_output=True, text=True, check=True)
    table = subprocess.run(command, capture_output=True, text=True, check=True)
    return shown.stdout, table.stdout


async def eventually(check: Callable[[], Awaitable[bool]], what: str, *, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        await asyncio.sleep(0.1)


async def why_unschedulable(client: lightkube.AsyncClient, name: str, namespace: str) -> str:
    """The first message of the pod's PodScheduled=False condition, once the scheduler wrote one."""
    return await scheduling_message(client, name, namespace, "")


async def scheduling_message(client: lightkube.AsyncClient, name: str, namespace: str, words: str) -> str:
    """The message of the pod's PodScheduled=False condition, once it holds `words`."""
    found: list[str] = []

    async def said() -> bool:
        pod = (await client.get(Pod, name, namespace=namespace)).to_dict()
        for condition in pod["status"].get("conditions") or []:
            message = str(condition.get("message", ""))
            if condition["type"] == "PodScheduled" and condition["status"] == "False" and words in message:
                found.append(message)
        return bool(found)

    await eventually(said, f"{namespace}/{name} reported unschedulable{f' with {words!r}' if words else ''}")
    return found[0]
