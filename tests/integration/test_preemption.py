"""Preemption and reclaim against a real kube-apiserver: a pod of higher priority evicts a lower one of its
queue, never one at or above the protected priority; a queue below its quota reclaims a GPU from a queue
that borrowed it; each eviction goes through the Eviction API with an Event on both sides."""

from __future__ import annotations

from typing import Any

import lightkube
import pytest
from lightkube.resources.core_v1 import Pod

from gpufrac.contract import queues
from gpufrac.scheduler.mover import PREEMPT, RECLAIM

from . import fakenodes
from .scheduling import eventually, gpu_pod, running_scheduler, wait_bound, why_unschedulable
from .test_defrag import going, pod, reasons
from .test_queues import team_pod


def whole(name: str, namespace: str, priority_class: str) -> Pod:
    body: dict[str, Any] = gpu_pod(name, namespace, whole_gpus=1).to_dict()
    body["spec"]["priorityClassName"] = priority_class
    return Pod.from_dict(body)


@pytest.mark.parametrize("victim_class", ["gpufrac-test-low", "gpufrac-test-critical"])
async def test_a_higher_priority_preempts_a_lower_one_never_a_protected_one(
    victim_class: str,
    priority_classes: None,
    admin_client: lightkube.AsyncClient,
    scheduler_client: lightkube.AsyncClient,
    namespace: str,
    gpu_nodes: fakenodes.GpuNodes,
) -> None:
    node = (await gpu_nodes.create(gpus=1)).metadata.name  # type: ignore[union-attr]
    async with running_scheduler(scheduler_client, min_runtime=0) as scheduler:
        await admin_client.create(whole("running", namespace, victim_class))
        await wait_bound(admin_client, namespace, 1)
        await admin_client.create(whole("urgent", namespace, "gpufrac-test-high"))
        if victim_class == "gpufrac-test-critical":
            await why_unschedulable(admin_client, "urgent", namespace)
            assert not await going(admin_client, namespace, "running")
            assert scheduler.metrics.evictions.labels("preempt", "evicted")._value.get() == 0
            return

        async def bound() -> bool:
            return bool((await pod(admin_client, namespace, "urgent"))["spec"].get("nodeName"))

        await eventually(bound, "urgent bound")
    assert await going(admin_client, namespace, "running")
    assert (await pod(admin_client, namespace, "urgent"))["spec"]["nodeName"] == node
    assert await reasons(admin_client, namespace, "running", PREEMPT.reason) == [
        f"{PREEMPT.done} for pod {namespace}/urgent on {node}"
    ]
    assert await reasons(admin_client, namespace, "urgent", PREEMPT.reason) == [
        f"evicting 1 pod(s) to make room on {node} (preempt)"
    ]


async def test_a_queue_below_its_quota_reclaims_what_another_borrowed(
    team_queues: list[str],
    admin_client: lightkube.AsyncClient,
    scheduler_client: lightkube.AsyncClient,
    namespace: str,
    gpu_nodes: fakenodes.GpuNodes,
) -> None:
    """Team b borrowed both GPUs while team a was idle; team a's pod takes one back."""
    for _ in range(2):
        await gpu_nodes.create(gpus=1)
    async with running_scheduler(scheduler_client, queues=True, min_runtime=0) as scheduler:
        for name in ("b1", "b2"):
            await admin_client.create(team_pod(name, namespace, queues.QUEUE_LABEL, "team-b"))
        await wait_bound(admin_client, namespace, 2)
        await admin_client.create(team_pod("a1", namespace, queues.QUEUE_LABEL, "team-a"))

        async def bound() -> bool:
            return bool((await pod(admin_client, namespace, "a1"))["spec"].get("nodeName"))

        await eventually(bound, "a1 bound")
        assert scheduler.metrics.evictions.labels("reclaim", "evicted")._value.get() == 1
    gone = [name for name in ("b1", "b2") if await going(admin_client, namespace, name)]
    assert len(gone) == 1
    told = await reasons(admin_client, namespace, gone[0], RECLAIM.reason)
    assert len(told) == 1 and told[0].startswith(RECLAIM.done)
