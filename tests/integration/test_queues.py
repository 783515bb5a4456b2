"""Tenant queues against a real kube-apiserver: the chart's Queue CRD, two teams with a quota of one GPU
each on a two-GPU cluster, and pods taken from the queue furthest below its fair share (team b's pod, by
KAI's queue label, before team a's second), where plain priority-then-age order would give both GPUs to
team a, whose pods came first."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import lightkube
import pytest
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType

from gpufrac.contract import queues
from gpufrac.kubeapi.custom import QUEUE_RESOURCE

from . import controlplane, fakenodes
from .scheduling import eventually, gpu_pod, running_scheduler, top, wait_bound, why_unschedulable
from .webhook_fixtures import denied_by_webhook, serving


def team_pod(name: str, namespace: str, label: str, team: str) -> Pod:
    body: dict[str, Any] = gpu_pod(name, namespace, whole_gpus=1).to_dict()
    body["metadata"]["labels"] = {label: team}
    return Pod.from_dict(body)


@pytest.mark.parametrize("fair", [True, False], ids=["queues", "age-order"])
async def test_the_team_below_its_share_is_served_first(
    fair: bool,
    team_queues: list[str],
    admin_client: lightkube.AsyncClient,
    scheduler_client: lightkube.AsyncClient,
    namespace: str,
    gpu_nodes: fakenodes.GpuNodes,
) -> None:
    for _ in range(2):
        await gpu_nodes.create(gpus=1)
    for pod in (
        team_pod("a1", namespace, queues.QUEUE_LABEL, "team-a"),
        team_pod("a2", namespace, queues.QUEUE_LABEL, "team-a"),
        team_pod("b1", namespace, queues.KAI_QUEUE_LABEL, "team-b"),
    ):
        await admin_client.create(pod)
    async with running_scheduler(scheduler_client, queues=fair) as scheduler:
        listed = await wait_bound(admin_client, namespace, 2)
        await asyncio.sleep(1)  # the third pod has been tried: nothing more binds
        if fair:
            usage = scheduler.tenants.usage
            assert usage["team-a"][queues.Resource.GPUS] == usage["team-b"][queues.Resource.GPUS] == 1
            assert scheduler.tenants.shares["team-b"][queues.Resource.GPUS] == 1
    bound = sorted(pod["metadata"]["name"] for pod in listed if pod["spec"].get("nodeName"))
    assert bound == (["a1", "b1"] if fair else ["a1", "a2"])


@pytest.mark.parametrize("priority", [200, None], ids=["team-a-first", "even"])
async def test_a_higher_priority_queue_takes_what_the_quotas_leave_first(
    priority: int | None,
    team_queues: list[str],
    admin_client: lightkube.AsyncClient,
    scheduler_client: lightkube.AsyncClient,
    namespace: str,
    gpu_nodes: fakenodes.GpuNodes,
) -> None:
    """Three GPUs, a quota of one each: the third goes to team-a by its `spec.priority`, though team-b's pods
    came first; at even priorities the two split it and age decides."""
    if priority is not None:
        patch = {"spec": {"priority": priority}}
        await admin_client.patch(QUEUE_RESOURCE, "team-a", patch, patch_type=PatchType.MERGE)
    for _ in range(3):
        await gpu_nodes.create(gpus=1)
    for name in ("b1", "b2"):
        await admin_client.create(team_pod(name, namespace, queues.QUEUE_LABEL, "team-b"))
    await asyncio.sleep(1.1)  # creation times count whole seconds: team-b's pods are strictly older
    for name in ("a1", "a2"):
        await admin_client.create(team_pod(name, namespace, queues.QUEUE_LABEL, "team-a"))
    async with running_scheduler(scheduler_client, queues=True):
        listed = await wait_bound(admin_client, namespace, 3)
        await asyncio.sleep(1)  # the fourth pod has been tried: nothing more binds
    bound = sorted(pod["metadata"]["name"] for pod in listed if pod["spec"].get("nodeName"))
    assert bound == (["a1", "a2", "b1"] if priority else ["a1", "b1", "b2"])


async def test_the_crd_keeps_kais_queue_fields(
    team_queues: list[str], admin_client: lightkube.AsyncClient
) -> None:
    """A field the CRD's schema does not name is pruned by the API server without a word: each KAI field
    gpufrac reads must be in it, or a KAI queue's setting is silently dropped."""
    kai = {"priority": 50, "preemptMinRuntime": "30m", "reclaimMinRuntime": "-1s"}
    await admin_client.patch(QUEUE_RESOURCE, "team-b", {"spec": kai}, patch_type=PatchType.MERGE)
    stored = (await admin_client.get(QUEUE_RESOURCE, "team-b")).to_dict()
    assert {key: stored["spec"].get(key) for key in kai} == kai
    parsed = queues.parse_queue(stored)
    assert (parsed.priority, parsed.preempt_min_runtime, parsed.reclaim_min_runtime) == (50, 1800, math.inf)


async def test_top_shows_each_queues_use_and_fair_share(
    team_queues: list[str],
    admin_client: lightkube.AsyncClient,
    scheduler_client: lightkube.AsyncClient,
    namespace: str,
    gpu_nodes: fakenodes.GpuNodes,
    control_plane: controlplane.ControlPlane,
) -> None:
    await gpu_nodes.create(gpus=1)
    await admin_client.create(team_pod("a1", namespace, queues.QUEUE_LABEL, "team-a"))
    await admin_client.create(team_pod("b1", namespace, queues.QUEUE_LABEL, "team-b"))
    async with running_scheduler(scheduler_client, queues=True):
        await wait_bound(admin_client, namespace, 1)
    shown, table = top(control_plane, "--queues")
    rows = {row["queue"]: row["resources"]["gpus"] for row in json.loads(shown)}
    # One GPU, two teams each guaranteed one: the pod that runs uses it, the other waits at its share.
    assert sorted(row["used"] for row in rows.values() if row["quota"] == 1) == [0, 1]
    assert rows["team-a"]["fair_share"] + rows["team-b"]["fair_share"] == 1
    assert "default" in rows
    assert "team-a" in table and "team-b" in table


async def test_a_pod_in_a_queue_nobody_made_waits_and_says_why(
    team_queues: list[str],
    admin_client: lightkube.AsyncClient,
    scheduler_client: lightkube.AsyncClient,
    namespace: str,
    gpu_nodes: fakenodes.GpuNodes,
) -> None:
    """Measured against no share, such a pod would always go first: a tenant could jump every queue."""
    await gpu_nodes.create(gpus=1)
    await admin_client.create(team_pod("stray", namespace, queues.QUEUE_LABEL, "made-up"))
    async with running_scheduler(scheduler_client, queues=True):
        said = await why_unschedulable(admin_client, "stray", namespace)
    pod = (await admin_client.get(Pod, "stray", namespace=namespace)).to_dict()
    assert not pod["spec"].get("nodeName")
    assert said == "queue made-up does not exist: create the Queue, or label the pod with one that does"


async def test_a_queue_closed_to_the_pods_namespace_leaves_it_waiting_until_an_admin_opens_it(
    team_queues: list[str],
    admin_client: lightkube.AsyncClient,
    scheduler_client: lightkube.AsyncClient,
    namespace: str,
    gpu_nodes: fakenodes.GpuNodes,
) -> None:
    """Queue labels are the tenant's to write: a queue that lists its namespaces takes pods of those only,
    so no other team can preempt or reclaim as it."""
    await gpu_nodes.create(gpus=1)
    closed = {"metadata": {"name": "closed"}, "spec": {"namespaces": ["someone-else"]}}
    await admin_client.create(QUEUE_RESOURCE.from_dict(closed))
    try:
        await admin_client.create(team_pod("intruder", namespace, queues.QUEUE_LABEL, "closed"))
        async with running_scheduler(scheduler_client, queues=True):
            said = await why_unschedulable(admin_client, "intruder", namespace)
            assert said == (
                f"namespace {namespace} may not use queue closed: its spec.namespaces lists only "
                "someone-else; use a queue of this namespace, or have an admin add it there"
            )
            opened = {"spec": {"namespaces": ["someone-else", namespace]}}
            await admin_client.patch(QUEUE_RESOURCE, "closed", opened, patch_type=PatchType.MERGE)
            await wait_bound(admin_client, namespace, 1)
    finally:
        await admin_client.delete(QUEUE_RESOURCE, "closed")


async def test_the_webhook_refuses_a_bad_queue_the_api_server_sends(
    team_queues: list[str],
    admin_client: lightkube.AsyncClient,
    control_plane: controlplane.ControlPlane,
    tmp_path: Path,
) -> None:
    """The API server names a Queue review's resource with its group: the webhook once compared it without
    and let every Queue through. Queues are cluster-scoped, so the hook judges every Queue written while
    registered; dry runs, so nothing is made."""
    orphan = QUEUE_RESOURCE.from_dict({"metadata": {"name": "orphan"}, "spec": {"parentQueue": "nowhere"}})
    kubeconfig = str(control_plane.kubeconfig("admin"))
    said: list[str] = []

    async def refused() -> bool:  # the configuration takes a moment to be in force
        try:
            await admin_client.create(orphan, dry_run=True)
        except lightkube.ApiError as error:
            said.append(denied_by_webhook(error))
            return True
        return False

    with (
        control_plane.sync_client() as admin,
        serving(admin, tmp_path, "--queues", "--kubeconfig", kubeconfig, values=("scheduler.queues=true",)),
    ):
        await eventually(refused, "the webhook refuses a Queue whose parent does not exist")
    assert 'spec.parentQueue="nowhere"' in said[0] and "no such Queue" in said[0], said
