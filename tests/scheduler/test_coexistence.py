"""Beside a device plugin: shares only on GPUs gpufrac reserved from it, never on GPUs it gave to anyone
else, whole GPUs left to the kubelet to pick, reservations made and released with the shares, and the
gpufrac.io/Ready gate."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from gpufrac.contract import keys, node_inventory, queues
from gpufrac.contract.node_inventory import DevicePluginMode
from gpufrac.scheduler import reservations
from gpufrac.scheduler.cache import SchedulerCache
from gpufrac.scheduler.devices import Hold
from gpufrac.scheduler.keeper import ReservationKeeper
from gpufrac.scheduler.loop import Scheduler

from ..kubeapi.apiobjects import GPU_MIB, bound, container, inventory, key, node, pod
from ..kubeapi.fakeapi import FakeApi, FakeClock, api_error
from .schedulers import gpu_free, pod_nodes, scheduler, share_notes

NAMESPACE = "gpufrac-system"
ENV_BASE = "gpufrac-env-abc"


def dp_node(
    name: str = "n1", *, gpus: int = 2, holders: dict[int, str] | None = None, **settings: Any
) -> dict[str, Any]:
    """A node whose agent says NVIDIA's device plugin runs there, with the holders it published."""
    published = tuple(
        replace(gpu, holder=(holders or {}).get(gpu.index, "")) for gpu in inventory(name, gpus)
    )
    labels = {node_inventory.DEVICE_PLUGIN_LABEL: DevicePluginMode.COEXIST.value}
    return node(name, agent=published, labels=labels, **settings)


def share_pod(name: str, fraction: str = "0.5", **settings: Any) -> dict[str, Any]:
    notes = {"gpu-fraction": fraction, keys.ENV_CONFIGMAP_ANNOTATION: f"{ENV_BASE}-{name}"}
    return pod(name, annotations=notes, **settings)


def setup(
    nodes: list[dict[str, Any]], pods: list[dict[str, Any]], **settings: Any
) -> tuple[Scheduler, FakeApi, FakeClock]:
    client, clock = FakeApi(), FakeClock()
    for item in pods:
        client.put(item)
    made = scheduler(client, clock, reservation_idle_seconds=5.0, **settings)
    made.clock = clock
    made.on_nodes_listed(nodes)
    made.on_pods_listed(pods)
    return made, client, clock


def reservation_pods(client: FakeApi) -> list[dict[str, Any]]:
    return [body for (kind, ns, _), body in client.objects.items() if kind == "Pod" and ns == NAMESPACE]


def holder(reservation: dict[str, Any]) -> str:
    return f"{NAMESPACE}/{reservation['metadata']['name']}"


async def settle(made: Scheduler, clock: FakeClock | None = None) -> None:
    """A scheduling round, after any backoff (`clock` moves past it)."""
    if clock is not None:
        clock.advance(31)
    await made.schedule_pending()
    await made.wait_for_binds()


async def test_a_share_waits_for_a_reservation_then_lands_on_the_gpu_the_kubelet_gave_it() -> None:
    made, client, clock = setup([dp_node()], [share_pod("p")])
    await settle(made)
    assert key("p") not in pod_nodes(made)
    [reservation] = reservation_pods(client)
    assert reservation["spec"]["nodeName"] == "n1"
    assert reservation["spec"]["containers"][0]["resources"]["limits"][keys.GPU_RESOURCE] == "1"
    assert reservations.is_reservation(reservation, NAMESPACE)
    # Until the agent publishes which GPU the kubelet gave the reservation, a GPU counts as pending, and the
    # pod is not tried again (no second reservation).
    assert made.cache.devices["n1"].holds == (Hold.PENDING, Hold.FREE)
    made.queue.cluster_changed()
    await settle(made, clock)
    assert len(reservation_pods(client)) == 1 and client.stored("Pod", "p")["spec"].get("nodeName") is None
    # The kubelet gave it GPU 1 (not the one counted as claimed): the share goes there.
    made.on_node_event("MODIFIED", dp_node(holders={1: holder(reservation)}))
    await settle(made, clock)
    stored = client.stored("Pod", "p")
    assert stored["spec"]["nodeName"] == "n1"
    assert stored["metadata"]["annotations"][keys.container_key("main", keys.DEVICES)] == "GPU-n1-1"


async def test_the_whole_gpu_reserve_counts_the_gpus_the_device_plugin_has_free() -> None:
    """A share is decided seeing only the GPUs gpufrac reserved; the reserve must still count the free ones,
    or it refuses the share, and the scheduler reserves GPU after GPU from the plugin for it."""
    made, client, clock = setup([dp_node(gpus=4)], [share_pod("p", "0.75")], whole_gpu_reserve=25)
    await settle(made)
    [reservation] = reservation_pods(client)
    made.on_node_event("MODIFIED", dp_node(gpus=4, holders={1: holder(reservation)}))
    await settle(made, clock)
    assert len(reservation_pods(client)) == 1  # 3 GPUs stay empty beside the share: 1 is kept
    assert client.stored("Pod", "p")["spec"]["nodeName"] == "n1"


async def test_no_reservation_is_made_where_the_share_would_then_find_no_pod_slot() -> None:
    """A reservation is a pod: on a node with one pod slot left, it would take the slot its share needs, the
    share could never bind, and the idle reservation would go and come back for ever."""
    tight = dp_node()
    tight["status"]["allocatable"]["pods"] = "2"
    other = bound(pod("other", scheduler="default-scheduler"), "n1", {})
    made, client, clock = setup([tight], [other, share_pod("p")])
    for _ in range(3):
        await settle(made, clock)
    assert reservation_pods(client) == [] and key("p") not in pod_nodes(made)
    tight["status"]["allocatable"]["pods"] = "3"
    made.on_node_event("MODIFIED", tight)
    await settle(made, clock)
    assert len(reservation_pods(client)) == 1


async def test_shares_that_fit_together_wait_for_one_reservation() -> None:
    made, client, clock = setup([dp_node()], [share_pod("p"), share_pod("q")])
    await settle(made)
    [reservation] = reservation_pods(client)
    assert made.keeper.awaiting[key("q")] == made.keeper.awaiting[key("p")]
    made.on_node_event("MODIFIED", dp_node(holders={1: holder(reservation)}))
    await settle(made, clock)
    for name in ("p", "q"):
        annotations = client.stored("Pod", name)["metadata"]["annotations"]
        assert annotations[keys.container_key("main", keys.DEVICES)] == "GPU-n1-1"


async def test_a_gpu_the_device_plugin_gave_to_another_pod_is_never_shared() -> None:
    made, client, _ = setup([dp_node(gpus=1, holders={0: "ml/trainer"})], [share_pod("p")])
    await settle(made)
    assert reservation_pods(client) == [] and client.stored("Pod", "p")["spec"].get("nodeName") is None
    assert made.cache.devices["n1"].holds == (Hold.HELD,)
    condition = [c for c in client.calls if c.kind == "PodStatus"][-1].body["status"]["conditions"][0]
    assert "0/1 nodes are available" in condition["message"]


async def test_a_device_plugin_pod_not_yet_published_takes_a_free_gpu_from_the_count() -> None:
    other = pod("trainer", scheduler="default-scheduler", whole=1, node_name="n1", phase="Running")
    made, client, _ = setup([dp_node(gpus=1)], [other, share_pod("p")])
    assert made.cache.devices["n1"].holds == (Hold.CLAIMED,)
    await settle(made)
    assert reservation_pods(client) == []  # no free GPU to reserve: the kubelet would refuse it anyway


async def test_a_whole_gpu_pod_gets_its_gpu_from_the_kubelet_and_counts_as_a_claim() -> None:
    notes = {keys.ENV_CONFIGMAP_ANNOTATION: ENV_BASE}
    made, client, _ = setup([dp_node(gpus=1)], [pod("w", whole=1, annotations=notes), pod("x", whole=1)])
    await settle(made)
    stored = client.stored("Pod", "w")
    assert stored["spec"]["nodeName"] == "n1"
    assert keys.container_key("main", keys.DEVICES) not in stored["metadata"]["annotations"]
    configmap = client.stored("ConfigMap", f"{ENV_BASE}-main")
    assert configmap is not None and not configmap.get("data")  # the device plugin's env stands
    assert made.cache.devices["n1"].holds == (Hold.CLAIMED,)
    assert client.stored("Pod", "x")["spec"].get("nodeName") is None  # the only GPU is taken


async def test_reservations_go_when_their_last_share_leaves_and_not_before() -> None:
    made, client, clock = setup([dp_node()], [share_pod("p")])
    await settle(made)
    [reservation] = reservation_pods(client)
    made.on_pod_event("ADDED", reservation)
    made.on_node_event("MODIFIED", dp_node(holders={0: holder(reservation)}))
    await settle(made, clock)
    assert gpu_free(made, "n1") == [GPU_MIB // 2, GPU_MIB]
    clock.advance(60)
    await settle(made)
    assert reservation_pods(client) == [reservation]  # its GPU holds a share
    made.on_pod_event("DELETED", client.stored("Pod", "p"))
    clock.advance(1)
    await settle(made)  # the keeper sees it idle from now
    clock.advance(4)
    await settle(made)
    assert reservation_pods(client) == [reservation]  # idle for less than reservation_idle_seconds
    clock.advance(2)
    await settle(made)
    assert reservation_pods(client) == []


async def test_a_restarted_scheduler_keeps_reservations_with_shares_and_makes_no_new_one() -> None:
    reservation = reservations.manifest("n1", namespace=NAMESPACE, image="pause")
    reservation["metadata"]["uid"] = "uid-reservation"
    reservation["status"] = {"phase": "Running"}
    share = bound(share_pod("p"), "n1", share_notes("main", "GPU-n1-1", f"{GPU_MIB // 2}Mi"))
    made, client, clock = setup([dp_node(holders={1: holder(reservation)})], [reservation, share])
    client.put(reservation)
    for _ in range(3):
        clock.advance(60)
        await settle(made)
    assert [c for c in client.calls if c.verb in ("create", "delete")] == []
    assert made.cache.devices["n1"].holds == (Hold.FREE, Hold.RESERVED)


async def test_shares_on_a_gpu_whose_reservation_was_deleted_are_held_again() -> None:
    share = bound(share_pod("p"), "n1", share_notes("main", "GPU-n1-1", f"{GPU_MIB // 2}Mi"))
    made, client, _ = setup([dp_node(gpus=3, holders={0: "ml/trainer"})], [share])
    await settle(made)
    # Every free GPU is reserved at once, since the kubelet picks which GPU each reservation gets.
    assert len(reservation_pods(client)) == 2
    await settle(made)
    assert len(reservation_pods(client)) == 2  # not again while those are unpublished


async def test_shares_held_again_take_no_more_reservations_than_the_node_has_pod_slots() -> None:
    share = bound(share_pod("p"), "n1", share_notes("main", "GPU-n1-1", f"{GPU_MIB // 2}Mi"))
    tight = dp_node(gpus=3, holders={0: "ml/trainer"})
    tight["status"]["allocatable"]["pods"] = "2"  # the share, and one more
    made, client, _ = setup([tight], [share])
    await settle(made)
    assert len(reservation_pods(client)) == 1


async def test_a_reservation_the_api_refuses_is_asked_again_after_a_backoff_not_every_round() -> None:
    share = bound(share_pod("p"), "n1", share_notes("main", "GPU-n1-1", f"{GPU_MIB // 2}Mi"))
    made, client, clock = setup([dp_node(gpus=8, holders={0: "ml/trainer"})], [share])
    client.fail["create Pod"] = api_error(403, "Forbidden", "namespace gpufrac-system is being terminated")
    for _ in range(20):  # ten seconds of rounds, tending twice a second
        clock.advance(0.5)
        await made.schedule_pending()
    assert len(client.made("create", "Pod")) == 4  # one per try, at 0, 1, 3 and 7 seconds
    client.fail.clear()
    clock.advance(8)
    await made.schedule_pending()
    assert len(reservation_pods(client)) == 7  # every free GPU, at once, as soon as it is allowed


async def test_shares_on_a_gpu_the_device_plugin_gave_away_are_deleted() -> None:
    share = bound(share_pod("p"), "n1", share_notes("main", "GPU-n1-1", f"{GPU_MIB // 2}Mi"))
    made, client, _ = setup([dp_node(holders={1: "ml/trainer"})], [share])
    client.put(share)
    await settle(made)
    assert client.stored("Pod", "p") is None
    [event] = [c for c in client.calls if c.kind == "Event"]
    assert event.body.reason == "GPUReservationLost"


async def test_gpu_pods_wait_for_the_agents_ready_condition() -> None:
    made, client, clock = setup([node("n1", agent=inventory("n1", 1), gpu_ready=False)], [share_pod("p")])
    await settle(made)
    condition = [c for c in client.calls if c.kind == "PodStatus"][-1].body["status"]["conditions"][0]
    assert "gpufrac agent not ready (Test)" in condition["message"]
    made.on_node_event("MODIFIED", node("n1", agent=inventory("n1", 1), gpu_ready=True))
    await settle(made, clock)
    assert client.stored("Pod", "p")["spec"]["nodeName"] == "n1"


async def test_a_device_plugin_node_without_the_agents_gpus_shares_nothing() -> None:
    """Its GPUs are known from GPU Feature Discovery's labels only, so none has a reservation."""
    labels = {node_inventory.DEVICE_PLUGIN_LABEL: DevicePluginMode.COEXIST.value}
    made, client, _ = setup([node("n1", gpus=2, labels=labels)], [share_pod("p")])
    await settle(made)
    assert client.stored("Pod", "p")["spec"].get("nodeName") is None
    assert reservation_pods(client) == []  # nor can it reserve: no GPU it could name is known


def with_heartbeat(made: dict[str, Any], stamp: str) -> dict[str, Any]:
    for condition in made["status"]["conditions"]:
        if condition["type"] == node_inventory.READY_CONDITION:
            condition["lastHeartbeatTime"] = stamp
    return made


async def test_a_node_whose_agent_went_silent_takes_no_gpu_pod_until_it_beats_again() -> None:
    """An agent that dies without a clean stop cannot clear its condition: a heartbeat older than the timeout
    (300 s by default) counts as not ready, and the next heartbeat brings the node back at once."""
    old = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 3600))
    made, client, clock = setup([with_heartbeat(node("n1", agent=inventory("n1", 1)), old)], [share_pod("p")])
    await settle(made)
    condition = [c for c in client.calls if c.kind == "PodStatus"][-1].body["status"]["conditions"][0]
    assert "gpufrac agent silent for over 300s" in condition["message"]
    fresh = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    assert made.cache.add_node(with_heartbeat(node("n1", agent=inventory("n1", 1)), fresh))  # a change
    made.queue.cluster_changed()
    await settle(made, clock)
    assert client.stored("Pod", "p")["spec"]["nodeName"] == "n1"


async def test_a_reservation_never_published_is_deleted_and_its_pod_decides_again() -> None:
    made, client, clock = setup([dp_node()], [share_pod("p")])
    await settle(made)
    [stuck] = reservation_pods(client)
    clock.advance(60)
    await settle(made)  # the keeper sees it unpublished from now
    clock.advance(100)
    await settle(made)
    assert reservation_pods(client) == [stuck]  # the agent may yet publish it
    clock.advance(21)
    await settle(made)
    made.on_pod_event("DELETED", stuck)
    assert stuck not in reservation_pods(client)
    await settle(made, clock)
    [again] = reservation_pods(client)  # the pod no longer waits for a reservation that is gone
    assert again["metadata"]["name"] != stuck["metadata"]["name"]


def test_a_deletion_that_did_not_go_through_is_asked_again() -> None:
    keeper, cache = ReservationKeeper(), SchedulerCache()
    failed = reservations.manifest("n1", namespace=NAMESPACE, image="pause")
    failed["metadata"]["uid"] = "uid-failed"
    keeper.finished(failed)
    assert keeper.tend(cache, 0.0).delete == [failed]
    assert keeper.tend(cache, 1.0).delete == []  # under way: not asked twice
    keeper.retry("uid-failed", now=1.5)
    assert keeper.tend(cache, 2.0).delete == []  # refused: asked again after a second, not every round
    assert keeper.tend(cache, 2.6).delete == [failed]
    keeper.retry("uid-failed", now=2.7)
    assert keeper.tend(cache, 4.0).delete == []  # refused again: two seconds
    assert keeper.tend(cache, 4.8).delete == [failed]


async def test_a_pod_with_a_share_and_whole_gpus_is_kept_off_device_plugin_nodes() -> None:
    notes = {keys.container_key("a", keys.MEMORY_REQUEST): "4Gi", keys.ENV_CONFIGMAP_ANNOTATION: ENV_BASE}
    mixed = pod("m", annotations=notes, containers=[container("a"), container("b", whole=1)])
    made, client, _ = setup([dp_node(gpus=4)], [mixed])
    await settle(made)
    assert client.stored("Pod", "m")["spec"].get("nodeName") is None and reservation_pods(client) == []
    condition = [c for c in client.calls if c.kind == "PodStatus"][-1].body["status"]["conditions"][0]
    assert "1 node(s) where a device plugin runs (a share and whole GPUs in one pod)" in condition["message"]


async def test_whole_gpus_the_kubelet_picks_count_against_their_queue() -> None:
    """Placed without GPU indices (the device plugin chooses), they counted no GPU, so a queue's limit,
    quota and fair share never saw them: three 1-GPU pods of a queue limited to 1 GPU all bound."""
    client, clock = FakeApi(), FakeClock()
    pods = [pod(name, whole=1) for name in ("w1", "w2", "w3")]
    for item in pods:
        item["metadata"]["labels"] = {queues.QUEUE_LABEL: "a"}
        client.put(item)
    made = scheduler(client, clock, queues=True)
    made.clock = clock
    limited = {"resources": {"gpus": {"quota": 1, "limit": 1}}}
    made.on_queues_listed([{"kind": queues.KIND, "metadata": {"name": "a"}, "spec": limited}])
    made.on_nodes_listed([dp_node(gpus=4)])
    made.on_pods_listed(pods)
    for _ in range(3):
        await settle(made, clock)
    assert len([name for name in ("w1", "w2", "w3") if key(name) in pod_nodes(made)]) == 1
    made.tenants.outdated()
    made.tenants.rank(made.cache, made.pending)
    assert made.tenants.usage["a"][queues.Resource.GPUS] == 1


async def test_no_share_lands_on_a_gpu_whose_reservation_is_being_deleted() -> None:
    """In the round the keeper deletes an idle reservation, a share that came meanwhile was bound to its
    GPU, which the device plugin then had back to give to anyone."""
    made, client, clock = setup([dp_node(gpus=1)], [share_pod("p")])
    await settle(made)
    [reservation] = reservation_pods(client)
    made.on_pod_event("ADDED", reservation)
    made.on_node_event("MODIFIED", dp_node(gpus=1, holders={0: holder(reservation)}))
    await settle(made, clock)
    made.on_pod_event("DELETED", client.stored("Pod", "p") or {})  # the last share leaves
    clock.advance(1)
    await settle(made)  # the reservation is idle from now
    clock.advance(6)  # past reservation_idle_seconds (5)
    late = share_pod("q")
    client.put(late)
    made.on_pod_event("ADDED", late)
    await settle(made)
    assert reservation_pods(client) == [] and key("q") not in pod_nodes(made)
    terminating = dict(
        reservation, metadata=reservation["metadata"] | {"deletionTimestamp": "2024-05-01T13:00:00Z"}
    )
    cache = SchedulerCache()
    cache.add_node(dp_node(gpus=1, holders={0: holder(reservation)}))
    cache.add_pod(terminating)  # deleted by anyone: its GPU takes no share either
    assert cache.devices["n1"].holds == (Hold.RELEASING,)


async def test_a_whole_gpu_the_kubelet_picked_is_freed_by_its_pods_preemption() -> None:
    """Counted as used (the claim), such a GPU was counted as freed by nothing: a queue held at its limit
    by a pod on a device-plugin node could never preempt it for a pod of higher priority elsewhere."""
    client, clock = FakeApi(), FakeClock()
    low = bound(pod("low", whole=1, priority=1), "n1", {})
    high = pod("high", whole=1, priority=10)
    for item in (low, high):
        item["metadata"]["labels"] = {queues.QUEUE_LABEL: "a"}
        client.put(item)
    made = scheduler(client, clock, queues=True, min_runtime=0)
    made.clock = clock
    limited = {"resources": {"gpus": {"limit": 1}}}
    made.on_queues_listed([{"kind": queues.KIND, "metadata": {"name": "a"}, "spec": limited}])
    made.on_nodes_listed([dp_node(gpus=1), node("n2", agent=inventory("n2", 1))])
    made.on_pods_listed([low, high])
    await settle(made, clock)
    assert [call.name for call in client.made("create", "Eviction")] == ["low"]


def nominated(name: str, gpus: int, node: str = "n1") -> dict[str, Any]:
    """A pod kube-scheduler preempted for and nominated `node` for, asking the kubelet for `gpus`."""
    made = pod(name, scheduler="default-scheduler", whole=gpus, priority=1000)
    made["status"]["nominatedNodeName"] = node
    return made


async def test_gpus_freed_for_a_nominated_pod_are_left_to_it() -> None:
    """kube-scheduler evicted pods on n1 for `urgent`'s two GPUs: a whole-GPU pod of gpufrac's bound there
    would get one of them from the kubelet, and kube-scheduler would preempt again."""
    nodes = [dp_node("n1"), dp_node("n2", gpus=1)]
    made, _, _ = setup(nodes, [nominated("urgent", 2), pod("w", whole=1)])
    await settle(made)
    assert pod_nodes(made)[key("w")] == "n2"


async def test_a_nominated_pod_leaves_the_free_gpus_it_does_not_ask_for() -> None:
    made, _, _ = setup([dp_node("n1")], [nominated("urgent", 1), pod("w", whole=1)])
    await settle(made)
    assert pod_nodes(made)[key("w")] == "n1"


async def test_no_reservation_takes_a_gpu_freed_for_a_nominated_pod() -> None:
    made, client, clock = setup([dp_node("n1", gpus=1)], [nominated("urgent", 1), share_pod("p")])
    for _ in range(2):
        await settle(made, clock)
    assert reservation_pods(client) == [] and key("p") not in pod_nodes(made)
    made.on_pod_event("MODIFIED", pod("urgent", scheduler="default-scheduler", whole=1, priority=1000))
    await settle(made, clock)
    assert len(reservation_pods(client)) == 1  # nominated no more: the GPU is anyone's


async def test_shares_on_a_reserved_gpu_are_not_kept_off_for_a_nominated_pods_gpus() -> None:
    """Its GPUs not free yet (the victims still going), `urgent` keeps GPU pods off n1; a share on the GPU
    gpufrac already reserved takes nothing the kubelet would give it."""
    reservation = reservations.manifest("n1", namespace=NAMESPACE, image="pause")
    reservation["metadata"]["uid"] = "uid-reservation"
    reservation["status"] = {"phase": "Running"}
    node = dp_node(holders={0: holder(reservation), 1: "ml/victim"})
    made, client, _ = setup([node], [reservation, nominated("urgent", 1), share_pod("p"), pod("w", whole=1)])
    client.put(reservation)
    await settle(made)
    assert pod_nodes(made)[key("p")] == "n1" and key("w") not in pod_nodes(made)
