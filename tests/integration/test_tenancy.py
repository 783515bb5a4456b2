"""Teams end to end against a real kube-apiserver: two teams, each with a quota of two GPUs and a queue
closed to the other's namespace. Team b borrows the GPUs team a leaves idle; team a's gang of two then takes
its quota back by reclaim, with evictions through the Eviction API, and the scheduler is restarted while the
reclaim is under way. The second scheduler, starting from the API alone, finishes it: the gang runs whole,
team b keeps its quota, and nothing is evicted twice."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import Any

import lightkube
import pytest
from lightkube.resources.core_v1 import Pod

from gpufrac.contract import queues
from gpufrac.contract.queues import Resource
from gpufrac.kubeapi.custom import QUEUE_RESOURCE
from gpufrac.scheduler.mover import RECLAIM

from . import fakenodes
from .conftest import install_crd
from .scheduling import eventually, running_scheduler, scheduling_message, wait_bound
from .test_defrag import reasons
from .test_gangs import member, pod_group
from .test_preemption import whole
from .test_queues import team_pod

SETTINGS: dict[str, Any] = {"queues": True, "gangs": True, "min_runtime": 0}


@pytest.fixture
def team_b(other_namespace: str) -> str:
    """Team b's namespace; team a's is the test's own."""
    return other_namespace


@pytest.fixture
async def closed_queues(
    admin_client: lightkube.AsyncClient, namespace: str, team_b: str
) -> AsyncIterator[None]:
    """Queues team-a and team-b, two GPUs of quota each, each open to its own team's namespace only."""
    await install_crd(admin_client, "queues.gpufrac.io")
    for name, owner in (("team-a", namespace), ("team-b", team_b)):
        body = {
            "metadata": {"name": name},
            "spec": {"namespaces": [owner], "resources": {"gpus": {"quota": 2}}},
        }
        await admin_client.create(QUEUE_RESOURCE.from_dict(body))
    yield
    for name in ("team-a", "team-b"):
        await admin_client.delete(QUEUE_RESOURCE, name)


async def pods_of(client: lightkube.AsyncClient, namespace: str) -> dict[str, dict[str, Any]]:
    return {item.metadata.name: item.to_dict() async for item in client.list(Pod, namespace=namespace)}  # type: ignore[union-attr]


def leaving(pods: dict[str, dict[str, Any]], names: Iterable[str]) -> set[str]:
    """Which of `names` are evicted: being deleted, or gone (the fake nodes' stand-in kubelet ends it)."""
    return {name for name in names if name not in pods or pods[name]["metadata"].get("deletionTimestamp")}


async def test_two_teams_borrow_reclaim_and_run_a_gang_across_a_scheduler_restart(
    closed_queues: None,
    team_b: str,
    admin_client: lightkube.AsyncClient,
    scheduler_client: lightkube.AsyncClient,
    namespace: str,
    gpu_nodes: fakenodes.GpuNodes,
) -> None:
    for _ in range(4):
        await gpu_nodes.create(gpus=1)
    await pod_group(admin_client, namespace, "train", minMember=2, queue="team-a")
    b_pods = [f"b{i}" for i in range(4)]
    async with running_scheduler(scheduler_client, **SETTINGS) as first:
        # Borrowing: team a is idle, so team b runs on all four GPUs, twice its quota.
        for name in b_pods:
            await admin_client.create(team_pod(name, team_b, queues.QUEUE_LABEL, "team-b"))
        await wait_bound(admin_client, team_b, 4)
        # A pod of team b's namespace cannot pass itself off as team a's to reclaim as it.
        await admin_client.create(team_pod("impostor", team_b, queues.QUEUE_LABEL, "team-a"))
        said = await scheduling_message(admin_client, "impostor", team_b, "may not use queue team-a")
        assert said.startswith(f"namespace {team_b} may not use queue team-a")
        # Team a's gang: its queue is below its quota, team b above its fair share.
        for name in ("a0", "a1"):
            await admin_client.create(member(name, namespace, "train"))

        async def reclaiming() -> bool:
            return bool(leaving(await pods_of(admin_client, team_b), b_pods))

        await eventually(reclaiming, "team b's first pod evicted")
        assert first.metrics.evictions.labels("reclaim", "evicted")._value.get() >= 1
    # The scheduler restarts in the middle of the reclaim: what it had planned and held is gone with it.
    async with running_scheduler(scheduler_client, **SETTINGS) as second:
        listed = await wait_bound(admin_client, namespace, 2)
        bound = {
            pod["metadata"]["name"]: pod["spec"]["nodeName"] for pod in listed if pod["spec"].get("nodeName")
        }
        assert sorted(bound) == ["a0", "a1"] and len(set(bound.values())) == 2

        async def settled() -> bool:
            """Team a's gang counted, and team b's evicted pods gone (they hold their GPUs until then)."""
            second.tenants.outdated()  # counted afresh, not as of up to a second ago
            second.tenants.rank(second.cache, second.pending)
            gone = not {
                p["metadata"].get("deletionTimestamp") for p in (await pods_of(admin_client, team_b)).values()
            } - {None}
            return gone and second.tenants.usage.get("team-a", {}).get(Resource.GPUS) == 2

        await eventually(settled, "team a's use counted")
        usage = second.tenants.usage
        assert usage["team-b"][Resource.GPUS] == 2  # its quota, no less: reclaim took only the surplus
    b_after = await pods_of(admin_client, team_b)
    evicted = leaving(b_after, b_pods)
    assert len(evicted) == 2, f"evicted {sorted(evicted)}"  # what team a needed, not one more
    for name in sorted(evicted):
        told = await reasons(admin_client, team_b, name, RECLAIM.reason)
        assert len(told) == 1 and told[0].startswith(RECLAIM.done), told
    assert not b_after["impostor"]["spec"].get("nodeName")
    kept = {b_after[name]["spec"]["nodeName"] for name in set(b_pods) - evicted}
    assert not kept & set(bound.values())  # the gang got the GPUs of the pods evicted for it


async def test_nothing_is_evicted_for_a_gang_that_could_not_run_whole(
    priority_classes: None,
    admin_client: lightkube.AsyncClient,
    scheduler_client: lightkube.AsyncClient,
    namespace: str,
    team_b: str,
    gpu_nodes: fakenodes.GpuNodes,
) -> None:
    """Team a's gang of three may reclaim from team b, which borrowed two of the four GPUs; team c holds the
    other two with pods of a protected priority, within its quota (such pods run only there), so they are
    never evicted: evicting b's two would not let the gang run, so neither is evicted until one protected
    pod ends; then the gang's room is made at once and it runs whole."""
    await install_crd(admin_client, "queues.gpufrac.io")
    made = []
    for name, quota in (("team-a", 3), ("team-b", 0), ("team-c", 2)):
        body = {"metadata": {"name": name}, "spec": {"resources": {"gpus": {"quota": quota}}}}
        made.append(await admin_client.create(QUEUE_RESOURCE.from_dict(body)))
    try:
        for _ in range(4):
            await gpu_nodes.create(gpus=1)
        await pod_group(admin_client, namespace, "train", minMember=3, queue="team-a")
        async with running_scheduler(scheduler_client, **SETTINGS) as scheduler:
            for name in ("c0", "c1"):
                body = whole(name, team_b, "gpufrac-test-critical").to_dict()
                body["metadata"]["labels"] = {queues.QUEUE_LABEL: "team-c"}
                await admin_client.create(Pod.from_dict(body))
            for name in ("b2", "b3"):
                await admin_client.create(team_pod(name, team_b, queues.QUEUE_LABEL, "team-b"))
            await wait_bound(admin_client, team_b, 4)
            for name in ("a0", "a1", "a2"):
                await admin_client.create(member(name, namespace, "train"))
            for name in ("a0", "a1", "a2"):
                await scheduling_message(admin_client, name, namespace, "free")
            assert not leaving(await pods_of(admin_client, team_b), ("b2", "b3"))
            assert scheduler.metrics.evictions.labels("reclaim", "evicted")._value.get() == 0
            await admin_client.delete(Pod, "c0", namespace=team_b, grace_period=0)
            await wait_bound(admin_client, namespace, 3)
            assert scheduler.metrics.evictions.labels("reclaim", "evicted")._value.get() == 2
        assert leaving(await pods_of(admin_client, team_b), ("b2", "b3")) == {"b2", "b3"}
    finally:
        for name in ("team-a", "team-b", "team-c"):
            await admin_client.delete(QUEUE_RESOURCE, name)
