"""Which running pods a pending pod may evict: its queue's lower priorities (preemption) and, when its queue
is below its quota, pods of queues over their fair share (reclaim); never pods of another scheduler, at or
above the protected priority, younger than the minimum runtime, or already going."""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest

from gpufrac.cluster.model import Assignment, Placement
from gpufrac.contract import queues
from gpufrac.contract.queues import Entitlement, QueueSpec, Resource
from gpufrac.scheduler import mover, objects
from gpufrac.scheduler.cache import SchedulerCache
from gpufrac.scheduler.loop import Scheduler
from gpufrac.scheduler.tenants import Tenants, tenant_of

from ..kubeapi.apiobjects import GPU_MIB, bound, inventory, key, node, pod
from ..kubeapi.fakeapi import FakeApi, FakeClock
from .schedulers import scheduler, share_notes
from .test_scheduler_binds import gpu_node

NOW = "2024-05-01T12:00:00Z"


def running(
    name: str, *, priority: int = 0, queue: str = "", started: str = NOW, **settings: Any
) -> dict[str, Any]:
    body = bound(
        pod(name, priority=priority, **settings), "n1", share_notes("main", "GPU-n1-0", f"{GPU_MIB // 8}Mi")
    )
    body["status"]["startTime"] = started
    if queue:
        body["metadata"]["labels"] = {queues.QUEUE_LABEL: queue}
    return body


def victims_of(made: Scheduler, pending: dict[str, Any]) -> tuple[set[str], set[str]]:
    preemptible, reclaimable = made.evictions.victims(pending, objects.pod_demand(pending))
    return set(preemptible), set(reclaimable)


def test_only_lower_priorities_old_enough_and_unprotected_may_be_preempted() -> None:
    pods = [
        running("lower", priority=5),
        running("equal", priority=10),
        running("protected", priority=100),
        running("young", priority=5, started="2099-01-01T00:00:00Z"),
        running("foreign", priority=5, scheduler="default-scheduler"),
        running("other-queue", priority=5, queue="team-b"),
    ]
    made = scheduler(FakeApi(), FakeClock(), min_runtime=60, node_selector={})
    made.on_nodes_listed([gpu_node("n1", gpus=1)])
    made.on_pods_listed(pods)
    pending = pod("urgent", priority=10, whole=1)
    # Without queues a queue label, the tenant's to write, does not take a pod out of reach.
    assert victims_of(made, pending) == ({key("lower"), key("other-queue")}, set())


def test_the_queue_of_a_pod_with_unreadable_labels_is_default() -> None:
    for labels in (["gpufrac.io/queue"], "team-a", 7, None):
        assert tenant_of({"metadata": {"labels": labels}}) == "default"
    assert tenant_of({"metadata": "garbage"}) == "default"


def test_reclaim_takes_only_what_a_queue_holds_beyond_its_fair_share() -> None:
    tenants = Tenants(report=lambda _: None)
    gpus = {Resource.GPUS: Entitlement(1)}
    tenants.specs = {"a": QueueSpec("a", None, gpus), "b": QueueSpec("b", None, gpus)}
    one_gpu = Placement("p", "n1", 100, 0, (Assignment("main", (0,), GPU_MIB, GPU_MIB, None),))
    tenants.usage = {"b": {Resource.GPUS: 2.0, Resource.CPU: 200.0}}
    tenants.shares = {"a": {Resource.GPUS: 1.0}, "b": {Resource.GPUS: 1.0, Resource.CPU: 200.0}}
    tenants.contested = {Resource.GPUS, Resource.CPU}
    asking = pod("w", whole=1)
    contested = tenants.reclaiming("a", objects.pod_demand(asking))
    assert contested == {Resource.GPUS}  # a has no CPU quota: CPU is not what it reclaims
    assert tenants.surplus_covers("b", [one_gpu], contested)  # b keeps its one GPU of share
    tenants.usage["b"][Resource.GPUS] = 1.0
    assert not tenants.surplus_covers("b", [one_gpu], contested)  # it would fall below it
    tenants.usage["a"] = {Resource.GPUS: 1.0}
    assert tenants.reclaiming("a", objects.pod_demand(asking)) == set()  # a is at its quota already


def test_a_pending_pod_is_weighed_in_the_fair_shares_before_it_reclaims_by_them() -> None:
    """Shares are recomputed at most every second; a pod that came since would be measured against shares
    that leave it out, by which no queue is over its share, and would wait for the next change to retry."""
    clock = FakeClock()
    tenants = Tenants(report=lambda _: None, clock=clock)
    cache = SchedulerCache()
    tenants.rank(cache, {})
    newcomer = pod("new", whole=1)
    assert not tenants.weighed(objects.pod_uid(newcomer))
    tenants.rank(cache, {objects.pod_uid(newcomer): newcomer})
    assert not tenants.weighed(objects.pod_uid(newcomer))  # within the second: not recomputed
    tenants.outdated()
    tenants.rank(cache, {objects.pod_uid(newcomer): newcomer})
    assert tenants.weighed(objects.pod_uid(newcomer))


def test_a_pending_pod_that_will_not_be_placed_as_it_is_takes_no_fair_share() -> None:
    """A pod refused for constraints gpufrac cannot read (a spread the API server would refuse) waits for
    ever: its ask must not make GPUs look contested, nor lower other queues' fair shares."""
    tenants = Tenants(report=lambda _: None)
    cache = SchedulerCache()
    cache.add_node(node("n1", agent=inventory("n1", 2)))
    apart = pod("apart", whole=4)
    apart["spec"]["topologySpreadConstraints"] = [{"maxSkew": 0, "topologyKey": "kubernetes.io/hostname"}]
    tenants.rank(cache, {objects.pod_uid(apart): apart})
    assert tenants.contested == set()
    apart = copy.deepcopy(apart)  # its next version, as the watch delivers it: another object
    del apart["spec"]["topologySpreadConstraints"]
    tenants.outdated()
    tenants.rank(cache, {objects.pod_uid(apart): apart})
    assert Resource.GPUS in tenants.contested  # 4 GPUs asked of 2


@pytest.fixture
def plans(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """The eviction plans made from now on (the arguments of each)."""
    made: list[tuple[Any, ...]] = []
    real = mover.plan_gang_eviction

    def counted(*args: Any, **kwargs: Any) -> Any:
        made.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(mover, "plan_gang_eviction", counted)
    return made


def replicas_that_fit_nowhere(count: int) -> tuple[Scheduler, FakeApi, list[dict[str, Any]]]:
    """Queue a runs a preemptible 1-GPU pod on each of 20 one-GPU nodes; `count` alike pods of a higher
    priority ask for two GPUs, which no eviction can give them."""
    client, clock = FakeApi(), FakeClock()
    nodes = [node(f"n{i}", agent=inventory(f"n{i}", 1)) for i in range(20)]
    pods = [bound(pod(f"r{i}", whole=1, priority=1), f"n{i}", {}) for i in range(20)]
    pods += [pod(f"p{i}", whole=2, priority=10) for i in range(count)]
    for body in pods:
        body["metadata"]["labels"] = {queues.QUEUE_LABEL: "a"}
        client.put(body)
    made = scheduler(client, clock, queues=True, min_runtime=0)
    made.clock = clock
    made.on_queues_listed([{"kind": queues.KIND, "metadata": {"name": "a"}, "spec": {}}])
    made.on_nodes_listed(nodes)
    made.on_pods_listed(pods)
    return made, client, pods


async def test_alike_pods_no_eviction_can_help_pay_for_one_plan_until_the_cluster_changes(
    plans: list[tuple[Any, ...]],
) -> None:
    """A Deployment's replicas that fit nowhere each planned over every victim at every try: a tenant's
    thousand of them beside its queue's thousands of pods held the loop for a minute a round."""
    made, client, pods = replicas_that_fit_nowhere(10)
    await made.schedule_pending()
    assert len(plans) == 1
    made.on_pod_event("DELETED", pods[0])  # room may be made now: planned for again, once
    made.clock.advance(60)  # type: ignore[attr-defined]
    await made.schedule_pending()
    assert len(plans) == 2
    assert client.made("create", "Eviction") == []


async def test_a_pod_whose_kept_room_is_gone_is_held_to_its_queues_limit_where_it_goes_instead() -> None:
    """Its room was judged within queue a's limit where its victim ran (a small GPU); gone by the time it is
    decided (another scheduler's pod took the node's CPU), the pod was placed anywhere unjudged: a 0.9
    portion took 115,200 MiB of a 128,000 MiB GPU under a 16,000 MiB limit."""
    client, clock = FakeApi(), FakeClock()
    small = [node(f"s{i}", gpus=1, agent=inventory(f"s{i}", 1)) for i in range(3)]
    big = node("big", gpus=1, memory=128_000, agent=inventory("big", 1, memory=128_000))
    low = bound(pod("low", priority=1), "s0", share_notes("main", "GPU-s0-0", f"{GPU_MIB}Mi"))
    others = [
        bound(pod(f"b{i}"), f"s{i}", share_notes("main", f"GPU-s{i}-0", f"{GPU_MIB}Mi")) for i in (1, 2)
    ]
    filler = bound(pod("filler"), "big", share_notes("main", "GPU-big-0", "120000Mi"))
    wanted = pod("hi", priority=10, annotations={"gpu-fraction": "0.9"})
    for body, queue in [(low, "a"), (wanted, "a"), *((o, "b") for o in (*others, filler))]:
        body["metadata"]["labels"] = {queues.QUEUE_LABEL: queue}
        body.setdefault("status", {})["startTime"] = "2024-05-01T10:00:00Z"
        client.put(body)
    made = scheduler(client, clock, queues=True, min_runtime=0)
    made.clock = clock
    limited = {"resources": {"gpuMemory": {"limit": f"{GPU_MIB}Mi"}}}
    made.on_queues_listed(
        [{"kind": queues.KIND, "metadata": {"name": q}, "spec": s} for q, s in (("a", limited), ("b", {}))]
    )
    made.on_nodes_listed([*small, big])
    made.on_pods_listed([low, wanted, *others, filler])
    await made.schedule_pending()
    assert [call.name for call in client.made("create", "Eviction")] == ["low"]
    made.on_pod_event("DELETED", low)
    assert key("hi") in made.cache.kept_rooms
    hog = pod("hog", scheduler="default-scheduler", cpu="16", node_name="s0", phase="Running")
    made.on_pod_event("ADDED", hog)
    made.on_pod_event("DELETED", filler)
    clock.advance(60)
    await made.schedule_pending()
    await made.wait_for_binds()
    assert client.stored("Pod", "hi")["spec"].get("nodeName") is None  # type: ignore[index]


async def test_a_round_spends_at_most_a_second_of_cpu_planning_evictions(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, plans: list[tuple[Any, ...]]
) -> None:
    """Pods that fit nowhere, each of its own spec (its own CPU request), are not one ask: a tenant's
    thousands of them each paid a plan over every victim, every round. Here a plan costs 0.4 s: a round
    makes three, the next round three more."""
    made, _, _ = replicas_that_fit_nowhere(0)
    for i in range(10):
        distinct = pod(f"p{i}", whole=2, priority=10, cpu=f"{100 + i}m")
        distinct["metadata"]["labels"] = {queues.QUEUE_LABEL: "a"}
        made.on_pod_event("ADDED", distinct)
    monkeypatch.setattr(made.evictions, "_cpu_clock", lambda: 0.4 * len(plans))
    with caplog.at_level(logging.INFO, logger="gpufrac.scheduler"):
        await made.schedule_pending()
    assert len(plans) == 3
    spent = [r.message for r in caplog.records if "eviction planning spent" in r.message]
    assert spent == ["eviction planning spent its 1s of this round: the pods left wait for the next"]
    made.clock.advance(60)  # type: ignore[attr-defined]
    made.queue.cluster_changed()
    await made.schedule_pending()
    assert len(plans) == 6
