"""Scheduling rounds against a client that records every call: reserve, bind, fail, report, roll back."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from gpufrac import contract
from gpufrac.contract import keys
from gpufrac.scheduler import loop, objects
from gpufrac.scheduler.loop import RETELL_SECONDS, Scheduler

from ..kubeapi.apiobjects import GPU_MIB, bound, container, inventory, key, node, pod
from ..kubeapi.fakeapi import FakeApi, FakeClock, api_error, until
from .schedulers import gpu_free, pod_nodes, scheduler, share_notes

ENV_BASE = "gpufrac-env-abc"
MANAGED = {"gpufrac.io/managed": "true"}


def gpu_node(name: str = "n1", **settings: Any) -> dict[str, Any]:
    return node(name, agent=inventory(name, settings.pop("gpus", 2)), labels=MANAGED, **settings)


def share_pod(name: str, fraction: str = "0.5", **settings: Any) -> dict[str, Any]:
    notes = {"gpu-fraction": fraction, keys.ENV_CONFIGMAP_ANNOTATION: f"{ENV_BASE}-{name}"}
    return pod(name, annotations=notes, **settings)


def setup(
    nodes: list[dict[str, Any]], pods: list[dict[str, Any]], **settings: Any
) -> tuple[Scheduler, FakeApi, FakeClock]:
    """A scheduler that has listed `nodes` and `pods`, on a fake API server that holds the pods."""
    client, clock = FakeApi(), FakeClock()
    for item in pods:
        client.put(item)
    made = scheduler(client, clock, **settings)
    made.on_nodes_listed(nodes)
    made.on_pods_listed(pods)
    return made, client, clock


def attempts(made: Scheduler, result: str) -> float:
    value = made.metrics.registry.get_sample_value("gpufrac_scheduler_attempts_total", {"result": result})
    return value or 0.0


def steps(client: FakeApi) -> list[tuple[str, str]]:
    return [(call.verb, call.kind) for call in client.calls]


def bound_as_planned(made: Scheduler, pending: dict[str, Any]) -> dict[str, Any]:
    """`pending` as the Binding of its assumed placement leaves it: on its node, with the contract."""
    placement = made.cache.assumed[objects.pod_uid(pending)]
    plan = objects.bind_plan(
        pending,
        placement,
        made.cache.state.node_spec(placement.node),
        mps_pipe_directory=contract.DEFAULT_MPS_PIPE_DIRECTORY,
        env_delivery=contract.EnvDelivery.CONFIGMAP,
    )
    return bound(pending, placement.node, plan.annotations)


async def test_a_pod_is_reserved_at_once_then_bound() -> None:
    made, client, _ = setup([gpu_node()], [share_pod("p")])
    assert await made.schedule_pending() == 1
    assert key("p") in made.cache.assumed and key("p") in made.cache.state.placements
    assert made.pending == {} and gpu_free(made, "n1").count(GPU_MIB // 2) == 1
    await made.wait_for_binds()
    assert steps(client) == [("create", "ConfigMap"), ("create", "Binding")]
    configmap, binding = client.calls
    gpu = made.cache.state.placements[key("p")].assignments[0].gpus[0]
    assert configmap.name == f"{ENV_BASE}-p-main"
    assert configmap.body.immutable is True
    assert configmap.body.data[keys.ENV_VISIBLE_DEVICES] == f"GPU-n1-{gpu}"
    assert configmap.body.data[keys.ENV_MEMORY_REQUEST] == str(GPU_MIB // 2)
    assert [owner.uid for owner in configmap.body.metadata.ownerReferences] == ["uid-p"]
    # One Binding carries the node, the contract and the UID it is granted to: the pod is bound with its
    # contract in one write, or not at all.
    written = binding.body.metadata.annotations
    assert written[keys.container_key("main", keys.DEVICES)] == f"GPU-n1-{gpu}"
    assert written[keys.BOUND_UID_ANNOTATION] == "uid-p"
    assert binding.body.target["name"] == "n1" and binding.body.metadata.uid == "uid-p"
    stored = client.stored("Pod", "p")
    assert stored is not None and stored["spec"]["nodeName"] == "n1"
    assert written.items() <= stored["metadata"]["annotations"].items()
    assert made.cache.assumed == {} and pod_nodes(made) == {key("p"): "n1"}
    assert attempts(made, "scheduled") == 1
    # The watch then reports the pod bound: it is already counted, so nothing changes.
    before = gpu_free(made, "n1")
    made.on_pod_event("MODIFIED", bound(share_pod("p"), "n1", written))
    assert gpu_free(made, "n1") == before


async def test_annotations_only_delivery_creates_no_configmap() -> None:
    made, client, _ = setup([gpu_node()], [share_pod("p")], env_delivery="annotations-only")
    await made.schedule_pending()
    await made.wait_for_binds()
    assert steps(client) == [("create", "Binding")]


async def test_a_reservation_keeps_the_next_pod_of_the_round_off_its_memory() -> None:
    made, client, _ = setup([gpu_node(gpus=1)], [share_pod("first", "0.75"), share_pod("second", "0.75")])
    assert await made.schedule_pending() == 2
    await made.wait_for_binds()
    assert [call.name for call in client.made("create", "Binding")] == ["first"]
    assert [call.name for call in client.made("create", "Event")] == [None]  # generateName only
    assert set(made.pending) == {key("second")}


async def test_the_whole_gpu_reserve_keeps_a_large_share_off_the_last_empty_gpus() -> None:
    # 2 GPUs, half kept empty: one 0.75 share may open one, the next may not; a 0.5 share (under 70%) may.
    pods = [share_pod("first", "0.75"), share_pod("second", "0.75"), share_pod("small", "0.5")]
    made, client, _ = setup([gpu_node(gpus=2)], pods, whole_gpu_reserve=50)
    assert await made.schedule_pending() == 3
    await made.wait_for_binds()
    assert [call.name for call in client.made("create", "Binding")] == ["first", "small"]
    (event,) = [call.body for call in client.made("create", "Event")]
    assert event.involvedObject.name == "second"
    assert event.message == "0/1 nodes are available: 1 empty GPUs kept for whole-GPU pods"
    assert set(made.pending) == {key("second")}
    unreserved, client, _ = setup([gpu_node(gpus=2)], pods)  # without it, both large shares bind
    assert await unreserved.schedule_pending() == 3
    await unreserved.wait_for_binds()
    assert [call.name for call in client.made("create", "Binding")] == ["first", "second"]


async def test_a_refused_bind_releases_the_reservation_and_backs_off_with_nothing_to_undo() -> None:
    made, client, clock = setup([gpu_node()], [share_pod("p")])
    client.fail["create Binding"] = api_error(403, "Forbidden")
    await made.schedule_pending()
    await made.wait_for_binds()
    assert made.cache.state.placements == {} and pod_nodes(made) == {} and made.cache.assumed == {}
    assert gpu_free(made, "n1") == [GPU_MIB, GPU_MIB]
    assert set(made.pending) == {key("p")} and key("p") in made.queue
    assert attempts(made, "error") == 1
    # Nothing was written to the pod, so nothing is undone; the ConfigMap is the pod's, kept for the retry.
    assert steps(client) == [("create", "ConfigMap"), ("create", "Binding")]
    # Retried after the backoff, with no cluster change needed: the same placement reuses its ConfigMap.
    assert await made.schedule_pending() == 0
    clock.advance(1.0)
    client.fail.clear()
    assert await made.schedule_pending() == 1
    await made.wait_for_binds()
    assert pod_nodes(made) == {key("p"): "n1"} and made.pending == {}
    assert steps(client)[2:] == [("create", "ConfigMap"), ("get", "ConfigMap"), ("create", "Binding")]


async def test_an_unschedulable_pod_gets_a_condition_and_an_event_saying_why() -> None:
    full = [
        bound(pod(f"full-{gpu}"), "n1", share_notes("main", f"GPU-n1-{gpu}", "12000Mi")) for gpu in (0, 1)
    ]
    nodes = [gpu_node("n1"), gpu_node("cordoned", cordoned=True), node("unmanaged")]
    made, client, clock = setup(nodes, [*full, share_pod("p")], node_selector=MANAGED)
    assert await made.schedule_pending() == 1
    message = (
        "0/3 nodes are available: 1 node not ready or cordoned, 1 not enough GPU memory, "
        "1 not managed by gpufrac (node selector)"
    )
    assert steps(client) == [("patch", "PodStatus"), ("create", "Event")]
    condition = client.calls[0].body["status"]["conditions"][0]
    assert condition == {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": message,
    }
    event = client.calls[1].body
    assert (event.reason, event.type, event.message) == ("FailedScheduling", "Warning", message)
    assert (event.involvedObject.name, event.involvedObject.uid) == ("p", "uid-p")
    assert event.metadata.namespace == "team"
    assert attempts(made, "unschedulable") == 1
    # It waits for a change: time alone (within max_park) does not bring it back.
    clock.advance(30.0)
    assert await made.schedule_pending() == 0
    made.on_node_event("MODIFIED", gpu_node("cordoned"))
    assert await made.schedule_pending() == 1
    await made.wait_for_binds()
    assert pod_nodes(made)[key("p")] == "cordoned"


async def test_a_pod_that_breaks_the_contract_is_reported_and_parked() -> None:
    made, client, _ = setup([gpu_node()], [pod("bad", annotations={"gpu-fraction": "1.5"})])
    await made.schedule_pending()
    assert steps(client) == [("patch", "PodStatus"), ("create", "Event")]
    assert client.calls[1].body.message.startswith('invalid GPU request: gpu-fraction="1.5"')
    assert attempts(made, "invalid") == 1
    assert key("bad") in made.queue and made.queue.pop() is None


@pytest.mark.parametrize(
    "answer", [api_error(403, "Forbidden"), ValueError("JSON cut short")], ids=["refused", "unreadable"]
)
async def test_a_report_that_cannot_be_written_is_only_logged(answer: Exception) -> None:
    made, client, clock = setup([], [share_pod("p")])
    client.fail["patch PodStatus"] = answer
    assert await made.schedule_pending() == 1
    assert steps(client) == [("patch", "PodStatus")]
    assert key("p") in made.queue
    del client.fail["patch PodStatus"]  # told on the next try, though the reason is the same
    clock.advance(61.0)
    assert await made.schedule_pending() == 1
    assert steps(client)[1:] == [("patch", "PodStatus"), ("create", "Event")]


async def test_an_event_whose_answer_cannot_be_read_is_only_logged() -> None:
    made, client, _ = setup([], [share_pod("p")])
    client.fail["create Event"] = ValueError("JSON cut short")
    assert await made.schedule_pending() == 1
    assert steps(client) == [("patch", "PodStatus"), ("create", "Event")]
    assert key("p") in made.queue


async def test_a_pod_deleted_while_its_bind_runs_is_released_when_the_bind_ends() -> None:
    made, client, _ = setup([gpu_node()], [share_pod("p")])
    client.gate = asyncio.Event()
    await made.schedule_pending()
    await until(lambda: ("create", "ConfigMap") in steps(client))
    made.on_pod_event("DELETED", share_pod("p"))
    assert made.cache.gone_assumed == {key("p")}
    assert key("p") in made.cache.state.placements  # still held: the Binding may yet go through
    client.gate.set()
    await made.wait_for_binds()
    assert made.cache.state.placements == {} and pod_nodes(made) == {} and made.cache.gone_assumed == set()
    assert made.pending == {} and key("p") not in made.queue
    assert gpu_free(made, "n1") == [GPU_MIB, GPU_MIB]


async def test_a_pod_deleted_while_its_bind_fails_is_not_retried() -> None:
    made, client, _ = setup([gpu_node()], [share_pod("p")])
    client.gate = asyncio.Event()
    client.fail["create Binding"] = api_error(404, "NotFound")
    await made.schedule_pending()
    await until(lambda: ("create", "ConfigMap") in steps(client))
    made.on_pods_listed([])  # a relist is how a deletion missed by the watch shows
    client.gate.set()
    await made.wait_for_binds()
    assert made.cache.state.placements == {} and made.pending == {} and len(made.queue) == 0
    assert made.cache.gone_assumed == set()


PAIR = {"kind": "PodGroup", "metadata": {"name": "g", "namespace": "team"}, "spec": {"minMember": 2}}


def gang_member(name: str, fraction: str) -> dict[str, Any]:
    """A share pod of the pod group `PAIR`."""
    member = share_pod(name, fraction)
    member["metadata"]["annotations"]["pod-group-name"] = "g"
    return member


async def test_a_gang_member_gone_while_the_watch_was_broken_is_no_longer_held_for_its_gang() -> None:
    """Only a relist tells of it: the room it held is freed at once, and it no longer counts toward the
    group, which would otherwise bind its next member alone, short of minMember."""
    first, second = gang_member("a", "0.5"), gang_member("b", "0.5")
    big = gang_member("c", "0.75")  # the member that fits beside no other, so the group stays short
    made, client, _ = setup([gpu_node(gpus=1)], [first, big], gangs=True)
    made.on_pod_groups_listed([PAIR])
    await made.schedule_pending()
    assert made.gangs.held_uids() == {key("a")} and gpu_free(made, "n1") == [GPU_MIB - GPU_MIB // 2]
    made.on_pods_listed([big])
    assert made.gangs.gangs == {} and made.cache.assumed == {} and gpu_free(made, "n1") == [GPU_MIB]
    client.put(second)
    made.on_pod_event("ADDED", second)
    await made.schedule_pending()
    await made.wait_for_binds()
    assert made.gangs.held_uids() == {key("b")} and client.made("create", "Binding") == []


async def test_a_gang_member_whose_node_went_while_it_was_held_is_placed_again_not_bound_there() -> None:
    first, second = gang_member("a", "0.75"), gang_member("b", "0.75")  # one GPU takes one of them
    made, client, clock = setup([gpu_node("n1", gpus=1)], [first, second], gangs=True)
    made.on_pod_groups_listed([PAIR])
    await made.schedule_pending()
    assert made.gangs.held_uids() == {key("a")}
    made.on_node_event("DELETED", gpu_node("n1", gpus=1))
    made.on_node_event("ADDED", gpu_node("n2", gpus=2))
    clock.advance(2.0)  # b's backoff
    await made.schedule_pending()
    await made.wait_for_binds()
    assert [objects.node_name(client.stored("Pod", name) or {}) for name in "ab"] == ["n2", "n2"]


async def test_a_pod_whose_node_went_while_it_waited_for_a_bind_slot_is_not_bound_there() -> None:
    made, client, _ = setup(
        [gpu_node("n1", gpus=1), gpu_node("n2", gpus=1)],
        [share_pod("p", "0.75"), share_pod("q", "0.75")],
        max_concurrent_binds=1,
    )
    client.gate = asyncio.Event()
    round_ = asyncio.create_task(made.schedule_pending())
    await until(lambda: len(made.cache.assumed) == 2 and len(client.held) == 1)
    (waiting,) = {key("p"), key("q")} - {key(binding.metadata.name) for binding in client.held}
    node = made.cache.assumed[waiting].node
    made.on_node_event("DELETED", gpu_node(node, gpus=1))
    client.gate.set()
    await round_
    await made.wait_for_binds()
    assert all(objects.node_name(client.stored("Pod", name) or {}) != node for name in "pq")
    assert waiting in made.pending and waiting not in made.cache.assumed


async def test_the_bound_event_during_the_bind_does_not_count_the_pod_twice() -> None:
    made, client, _ = setup([gpu_node(gpus=1)], [share_pod("p", "0.25")])
    client.gate = asyncio.Event()
    await made.schedule_pending()
    await until(lambda: ("create", "ConfigMap") in steps(client))
    made.on_pod_event("MODIFIED", bound_as_planned(made, share_pod("p", "0.25")))
    client.gate.set()
    await made.wait_for_binds()
    assert gpu_free(made, "n1") == [GPU_MIB - GPU_MIB // 4]


async def test_a_bind_in_flight_whose_gpus_are_renumbered_counts_on_the_gpu_its_binding_names() -> None:
    """An agent restarted after a driver reload may list the same GPUs in another order. Counted again by
    index, the pod held one GPU in the cache while its Binding named the other, which the next 0.75 share
    was then given too."""
    made, client, _ = setup([gpu_node()], [share_pod("p", "0.75")])
    client.gate = asyncio.Event()
    await made.schedule_pending()
    await until(lambda: ("create", "ConfigMap") in steps(client))  # the Binding's contract is written
    given = bound_as_planned(made, share_pod("p", "0.75"))
    swapped = tuple(dataclasses.replace(gpu, index=1 - gpu.index) for gpu in inventory("n1", 2))
    made.on_node_event("MODIFIED", node("n1", agent=swapped[::-1], labels=MANAGED))
    client.gate.set()
    await made.wait_for_binds()
    made.on_pod_event("MODIFIED", given)
    uuid = given["metadata"]["annotations"][keys.container_key("main", keys.DEVICES)]
    on = made.cache.state.uuids[made.cache.state.index["n1"]].index(uuid)
    assert gpu_free(made, "n1")[on] == GPU_MIB // 4 and gpu_free(made, "n1")[1 - on] == GPU_MIB
    client.put(share_pod("q", "0.75"))
    made.on_pod_event("ADDED", share_pod("q", "0.75"))
    await made.schedule_pending()
    await made.wait_for_binds()
    assert gpu_free(made, "n1") == [GPU_MIB // 4, GPU_MIB // 4]


async def test_a_pod_the_watch_shows_bound_while_its_bind_fails_keeps_its_memory_and_is_not_retried() -> None:
    """Another bind (the old leader's) put the pod on the GPU this bind chose, and the watch said so as
    MODIFIED; this bind's own Binding is then refused. The pod holds that memory: freed and retried, the next
    pod would have been given it too."""
    made, client, _ = setup([gpu_node(gpus=1)], [share_pod("p", "0.5"), share_pod("q", "0.75")])
    client.gate = asyncio.Event()
    client.fail["create Binding"] = api_error(403, "Forbidden")
    made.queue.forget(key("q"))  # q waits for its turn, below
    await made.schedule_pending()
    await until(lambda: ("create", "ConfigMap") in steps(client))
    other = bound(share_pod("p", "0.5"), "n1", share_notes("main", "GPU-n1-0", f"{GPU_MIB // 2}Mi"))
    made.on_pod_event("MODIFIED", other)
    client.gate.set()
    await made.wait_for_binds()
    assert pod_nodes(made) == {key("p"): "n1"} and made.cache.bound[key("p")] == other
    assert key("p") not in made.pending and key("p") not in made.queue
    assert gpu_free(made, "n1") == [GPU_MIB - GPU_MIB // 2]
    made.queue.add(key("q"), priority=0, created=0.0)
    await made.schedule_pending()
    assert key("q") not in made.cache.assumed  # 0.75 of the GPU is not free


async def test_a_pod_the_watch_shows_bound_during_its_bind_is_counted_from_that_object() -> None:
    """The bound pod, not the pending one the bind started from: with its node gone from the cache while
    the bind ran, only the bound object says where its shares are, and the pending one held the node back
    (as a pod it cannot account) once it returned."""
    made, client, _ = setup([gpu_node(gpus=1)], [share_pod("p", "0.25")])
    client.gate = asyncio.Event()
    await made.schedule_pending()
    await until(lambda: ("create", "ConfigMap") in steps(client))
    written = bound_as_planned(made, share_pod("p", "0.25"))
    made.on_pod_event("MODIFIED", written)
    made.on_node_event("DELETED", gpu_node(gpus=1))
    client.gate.set()
    await made.wait_for_binds()
    assert made.cache.unplaced == {"n1": {key("p"): written}}
    made.on_node_event("ADDED", gpu_node(gpus=1))
    assert made.cache.misfits == {} and made.cache.bound[key("p")] == written
    assert gpu_free(made, "n1") == [GPU_MIB - GPU_MIB // 4]


async def test_a_standby_does_not_schedule_until_it_leads() -> None:
    made, client, _ = setup([gpu_node()], [share_pod("p")])
    made.is_leader = False
    assert await made.schedule_pending() == 0 and client.calls == []
    made.lead()
    assert made.metrics.registry.get_sample_value("gpufrac_scheduler_leader") == 1
    assert await made.schedule_pending() == 1
    await made.wait_for_binds()


async def test_the_pending_gauge_follows_the_round() -> None:
    made, _, _ = setup([gpu_node(gpus=1)], [share_pod("a", "0.75"), share_pod("b", "0.75")])
    await made.schedule_pending()
    await made.wait_for_binds()
    assert made.metrics.registry.get_sample_value("gpufrac_scheduler_pending_pods") == 1


async def test_a_restarted_scheduler_rebuilds_what_the_first_one_bound() -> None:
    two_containers = pod("pair", containers=[container("a", whole=1), container("b", whole=1)])
    pods = [share_pod("half"), share_pod("quarter", "0.25"), two_containers]
    made, client, _ = setup([gpu_node(gpus=4)], pods)
    await made.schedule_pending()
    await made.wait_for_binds()
    assert len(client.made("create", "Binding")) == 3
    written = {call.name: call.body.metadata.annotations for call in client.made("create", "Binding")}
    assert set(written["pair"]) == {keys.container_key(c, keys.DEVICES) for c in "ab"} | {
        keys.BOUND_UID_ANNOTATION
    }
    restarted, _, _ = setup(
        [gpu_node(gpus=4)], [bound(item, "n1", written[item["metadata"]["name"]]) for item in pods]
    )
    assert set(restarted.cache.state.placements) == set(made.cache.state.placements)
    for array in ("gpu_free", "gpu_mode", "gpu_whole", "gpu_tenants", "cpu_free"):
        assert (getattr(restarted.cache.state, array) == getattr(made.cache.state, array)).all(), array


# ---- a pod deleted and recreated under the same name while its bind runs ----------------------------------


def successor(name: str, uid: str, fraction: str = "0.5") -> dict[str, Any]:
    """A pod created under `name` after the first was deleted: another UID, its own env ConfigMap base."""
    made = share_pod(name, fraction)
    made["metadata"]["uid"] = uid
    made["metadata"]["annotations"][keys.ENV_CONFIGMAP_ANNOTATION] = f"{ENV_BASE}-{name}-2"
    return made


async def test_a_pod_replaced_before_its_binding_is_not_bound_and_its_successor_is_scheduled_as_itself() -> (
    None
):
    made, client, clock = setup([gpu_node(gpus=1)], [share_pod("p", "0.75")])
    new = successor("p", "uid-p-2", "0.75")

    async def replaced() -> None:  # the watch reports both while the bind makes its ConfigMap
        client.put(new)
        made.on_pod_event("DELETED", share_pod("p", "0.75"))
        made.on_pod_event("ADDED", new)
        # Tried at once, the successor does not fit: the first one's 0.75 is held until its bind settles.
        assert await made.schedule_pending() == 1 and "uid-p-2" in made.queue

    client.before["create ConfigMap"] = replaced
    await made.schedule_pending()
    await made.wait_for_binds()
    assert not client.made("create", "Binding")  # never sent for a pod the watch reported gone
    assert made.cache.state.placements == {} and made.cache.gone_assumed == set()
    assert set(made.pending) == {"uid-p-2"}
    # Released, the first one's 0.75 wakes the successor after its backoff (not the 60 s park of a pod
    # waiting for a change), and it binds with its own contract.
    clock.advance(1.0)
    assert await made.schedule_pending() == 1
    await made.wait_for_binds()
    stored = client.stored("Pod", "p")
    assert stored is not None and stored["spec"]["nodeName"] == "n1"
    assert objects.bound_for(stored) == "uid-p-2" and not objects.misbound(stored)
    assert pod_nodes(made) == {"uid-p-2": "n1"} and gpu_free(made, "n1") == [GPU_MIB - GPU_MIB * 3 // 4]


async def test_a_successor_bound_by_its_predecessors_binding_is_deleted_and_frees_what_it_held() -> None:
    made, client, _ = setup([gpu_node(gpus=1)], [share_pod("p")])
    new = successor("p", "uid-p-2")

    async def replace() -> None:  # deleted and recreated just before the Binding, faster than the watch
        client.put(new)

    client.before["create Binding"] = replace
    await made.schedule_pending()
    await made.wait_for_binds()
    misbound = client.stored("Pod", "p")
    assert misbound is not None and misbound["metadata"]["uid"] == "uid-p-2" and objects.misbound(misbound)
    # Then the watch catches up: the first pod is deleted, the successor is bound with the first's contract.
    made.on_pod_event("DELETED", share_pod("p"))
    made.on_pod_event("MODIFIED", misbound)
    assert pod_nodes(made) == {"uid-p-2": "n1"}  # held as the API says, until it is gone
    await made.schedule_pending()
    await made.wait_for_binds()
    assert client.stored("Pod", "p") is None
    assert client.made("delete", "Pod")[-1].body == {"uid": "uid-p-2"}
    assert [call.body.reason for call in client.made("create", "Event")] == ["BoundToAnotherPod"]
    made.on_pod_event("DELETED", misbound)
    assert made.cache.state.placements == {} and gpu_free(made, "n1") == [GPU_MIB]
    assert made.pending == {} and made.misbound == {}


async def test_a_standby_leaves_a_misbound_pod_to_the_leader_and_deletes_it_once_it_leads() -> None:
    misbound = bound(successor("p", "uid-p-2"), "n1", {keys.BOUND_UID_ANNOTATION: "uid-p"})
    made, client, _ = setup([gpu_node()], [misbound])
    made.is_leader = False
    await made.schedule_pending()
    assert client.made("delete", "Pod") == [] and set(made.misbound) == {"uid-p-2"}
    made.lead()
    await made.schedule_pending()
    await made.wait_for_binds()
    assert client.stored("Pod", "p") is None and made.misbound == {}


async def test_a_misbound_pod_whose_deletion_is_unanswered_is_tried_again_after_a_backoff() -> None:
    misbound = bound(successor("p", "uid-p-2"), "n1", {keys.BOUND_UID_ANNOTATION: "uid-p"})
    made, client, clock = setup([gpu_node()], [misbound])
    client.lose.append(("delete Pod", "request"))
    await made.schedule_pending()
    await made.wait_for_binds()
    assert set(made.misbound) == {"uid-p-2"}
    await made.schedule_pending()  # the next round, at once: the deletion waits out its backoff
    await made.wait_for_binds()
    assert len(client.made("delete", "Pod")) == 1
    clock.advance(1.0)
    await made.schedule_pending()
    await made.wait_for_binds()
    assert client.stored("Pod", "p") is None and made.misbound == {}


async def test_a_misbound_pods_deletion_refused_in_a_row_is_asked_ever_less_often() -> None:
    misbound = bound(successor("p", "uid-p-2"), "n1", {keys.BOUND_UID_ANNOTATION: "uid-p"})
    made, client, clock = setup([gpu_node()], [misbound])
    client.lose.extend([("delete Pod", "request")] * 100)
    for _ in range(100):  # 100 rounds a tenth of a second apart: 10 s
        await made.schedule_pending()
        await made.wait_for_binds()
        clock.advance(0.1)
    # Asked at 0 s, then after waits of 1, 2 and 4 s: at 1, 3 and 7 s.
    assert len(client.made("delete", "Pod")) == 4 and set(made.misbound) == {"uid-p-2"}


async def test_a_pod_bound_by_its_own_bind_is_never_taken_for_misbound() -> None:
    made, client, _ = setup([gpu_node()], [share_pod("p")])
    await made.schedule_pending()
    await made.wait_for_binds()
    stored = client.stored("Pod", "p")
    assert stored is not None
    made.on_pod_event("MODIFIED", stored)
    await made.schedule_pending()
    assert made.misbound == {} and client.made("delete", "Pod") == []


# ---- lost replies and other binds, through the loop -------------------------------------------------------


async def test_a_binding_whose_reply_is_lost_is_counted_as_scheduled_once() -> None:
    made, client, _ = setup([gpu_node()], [share_pod("p")])
    client.lose.append(("create Binding", "reply"))
    await made.schedule_pending()
    await made.wait_for_binds()
    assert attempts(made, "scheduled") == 1 and attempts(made, "error") == 0
    assert pod_nodes(made) == {key("p"): "n1"} and made.pending == {} and len(made.queue) == 0
    assert len(client.made("create", "Binding")) == 1


async def test_a_pod_another_bind_bound_is_accounted_where_the_api_says_and_not_retried() -> None:
    made, client, _ = setup([gpu_node()], [share_pod("p")])

    async def other_bind() -> None:  # another bind of this pod (e.g. the old leader's) lands first, on GPU 1
        stored = client.stored("Pod", "p")
        assert stored is not None
        stored["spec"]["nodeName"] = "n1"
        stored["metadata"]["annotations"].update(share_notes("main", "GPU-n1-1", f"{GPU_MIB // 2}Mi"))

    client.before["create Binding"] = other_bind
    await made.schedule_pending()
    await made.wait_for_binds()
    assert pod_nodes(made) == {key("p"): "n1"} and made.pending == {} and len(made.queue) == 0
    assert gpu_free(made, "n1") == [GPU_MIB, GPU_MIB - GPU_MIB // 2]


async def test_a_tenants_own_gpu_keys_survive_a_failed_bind_and_the_retry_binds_the_gpu() -> None:
    """Today's regression: a failed Binding's rollback erased the tenant's request, and the retry bound the
    pod with no GPU at all."""
    tenant = {
        keys.container_key("main", keys.MEMORY_REQUEST): "4Gi",
        keys.container_key("main", keys.COMPUTE_MODE): "sm-sharing",
        keys.ENV_CONFIGMAP_ANNOTATION: f"{ENV_BASE}-p",
    }
    made, client, clock = setup([gpu_node()], [pod("p", annotations=tenant)])
    client.fail["create Binding"] = api_error(422, "Invalid")
    await made.schedule_pending()
    await made.wait_for_binds()
    stored = client.stored("Pod", "p")
    assert stored is not None and stored["metadata"]["annotations"] == tenant
    client.fail.clear()
    clock.advance(1.0)
    made.on_pod_event("MODIFIED", stored)
    assert await made.schedule_pending() == 1
    await made.wait_for_binds()
    annotations = client.stored("Pod", "p")["metadata"]["annotations"]  # type: ignore[index]
    assert annotations[keys.container_key("main", keys.MEMORY_REQUEST)] == "4096Mi"
    assert annotations[keys.container_key("main", keys.COMPUTE_MODE)] == "sm-sharing"
    assert annotations[keys.container_key("main", keys.DEVICES)].startswith("GPU-n1-")
    assert gpu_free(made, "n1").count(GPU_MIB - 4096) == 1


async def test_a_pod_the_engine_fails_on_is_parked_and_reported_and_the_round_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made, client, _ = setup([gpu_node("n1")], [share_pod("odd", "0.25"), share_pod("p")])
    real = loop.decide

    def failing_on_odd(state: Any, demand: Any, *args: Any, **kwargs: Any) -> Any:
        if objects.name_of(made.pending.get(demand.name, {})) == "odd":  # demands are named by UID
            raise OverflowError("Python int too large to convert to C long")
        return real(state, demand, *args, **kwargs)

    monkeypatch.setattr(loop, "decide", failing_on_odd)
    assert await made.schedule_pending() == 2
    await made.wait_for_binds()
    assert set(pod_nodes(made)) == {key("p")}
    assert key("odd") in made.pending and attempts(made, "error") == 1
    event = client.made("create", "Event")[0].body
    assert (event.reason, event.involvedObject.name) == ("FailedScheduling", "odd")
    assert "placement engine failed" in event.message


# ---- placement constraints ---------------------------------------------------------------------------------


async def test_a_pod_binds_only_where_its_required_node_affinity_holds() -> None:
    nodes = [gpu_node("n1"), node("n2", agent=inventory("n2", 2), labels=MANAGED | {"pool": "infer"})]
    wanting = share_pod("p")
    required = {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["infer"]}]}]
    }
    wanting["spec"]["affinity"] = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}
    }
    made, _, _ = setup(nodes, [wanting], node_selector=MANAGED)
    await made.schedule_pending()
    await made.wait_for_binds()
    assert pod_nodes(made) == {key("p"): "n2"}


async def test_a_pod_with_scheduling_gates_waits_until_the_last_is_removed() -> None:
    gated = share_pod("p")
    gated["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}, {"name": "example.com/b"}]
    made, client, _ = setup([gpu_node("n1")], [gated])
    assert await made.schedule_pending() == 0
    assert pod_nodes(made) == {} and client.calls == []  # not tried: no Event, no condition
    gated["spec"]["schedulingGates"] = [{"name": "example.com/b"}]
    made.on_pod_event("MODIFIED", gated)
    assert await made.schedule_pending() == 0
    del gated["spec"]["schedulingGates"]
    made.on_pod_event("MODIFIED", gated)
    assert await made.schedule_pending() == 1
    await made.wait_for_binds()
    assert pod_nodes(made) == {key("p"): "n1"}


def with_host_port(body: dict[str, Any], port: int, ip: str = "") -> dict[str, Any]:
    entry: dict[str, Any] = {"containerPort": port, "hostPort": port}
    if ip:
        entry["hostIP"] = ip
    body["spec"]["containers"][0]["ports"] = [entry]
    return body


async def test_a_pod_goes_where_no_pod_binds_its_host_port() -> None:
    held = with_host_port(bound(pod("web", scheduler="default-scheduler"), "n1", {}), 8080)
    made, _, _ = setup([gpu_node("n1"), gpu_node("n2")], [held, with_host_port(share_pod("p"), 8080)])
    await made.schedule_pending()
    await made.wait_for_binds()
    assert pod_nodes(made)[key("p")] == "n2"


async def test_a_pod_whose_host_port_every_node_binds_waits_saying_so() -> None:
    held = with_host_port(bound(pod("web", scheduler="default-scheduler"), "n1", {}), 8080, "10.0.0.5")
    other_address = with_host_port(share_pod("q"), 8080, "10.0.0.6")
    made, client, _ = setup([gpu_node("n1")], [held, with_host_port(share_pod("p"), 8080), other_address])
    await made.schedule_pending()
    await made.wait_for_binds()
    assert key("p") not in pod_nodes(made) and pod_nodes(made)[key("q")] == "n1"
    messages = [call.body["status"]["conditions"][0]["message"] for call in client.made("patch", "PodStatus")]
    assert any("1 node(s) didn't have free ports for the requested pod ports" in m for m in messages)


def disk_node(name: str, disk: str) -> dict[str, Any]:
    made = gpu_node(name)
    made["status"]["allocatable"]["ephemeral-storage"] = disk
    return made


def asking_disk(body: dict[str, Any], disk: str) -> dict[str, Any]:
    body["spec"]["containers"][0]["resources"]["requests"]["ephemeral-storage"] = disk
    return body


async def test_a_pod_goes_where_its_ephemeral_storage_is_left_and_waits_saying_so_where_none_is() -> None:
    """n1 offers 100Gi of which a pod of the default scheduler holds 90Gi, n2 20Gi: a pod asking 15Gi goes
    to n2; one asking 30Gi fits nowhere, and says what ran out (the kubelet would refuse it anywhere)."""
    held = asking_disk(bound(pod("logs", scheduler="default-scheduler"), "n1", {}), "90Gi")
    small, big = asking_disk(share_pod("small"), "15Gi"), asking_disk(share_pod("big"), "30Gi")
    made, client, _ = setup([disk_node("n1", "100Gi"), disk_node("n2", "20Gi")], [held, small, big])
    await made.schedule_pending()
    await made.wait_for_binds()
    assert pod_nodes(made)[key("small")] == "n2" and key("big") not in pod_nodes(made)
    messages = [call.body["status"]["conditions"][0]["message"] for call in client.made("patch", "PodStatus")]
    assert any("2 not enough ephemeral-storage" in message for message in messages)


async def test_a_pod_that_waits_for_the_same_reason_is_told_again_only_now_and_then() -> None:
    """Two writes (its condition, an Event) per try would let a tenant's thousand pods that fit nowhere keep
    the scheduler writing and fill etcd with Events: the same reason is told again after `RETELL_SECONDS`,
    a new one at once."""
    made, client, clock = setup([gpu_node("n1", gpus=1)], [pod("big", whole=2)])
    started, tries, told_early = clock(), 0, 0
    while clock() - started < 2 * RETELL_SECONDS:
        tries += await made.schedule_pending()
        if clock() - started < RETELL_SECONDS:
            told_early = len(client.made("patch", "PodStatus"))
        clock.advance(30.0)
    assert tries > 3 and told_early == 1
    assert 2 <= len(client.made("patch", "PodStatus")) <= 3 and len(client.made("create", "Event")) >= 2
    before = len(client.made("patch", "PodStatus"))
    made.on_node_event("MODIFIED", gpu_node("n1", gpus=1, cordoned=True))
    assert await made.schedule_pending() == 1
    assert len(client.made("patch", "PodStatus")) == before + 1


async def test_an_env_configmap_base_that_is_no_object_name_is_refused() -> None:
    """The bind puts `<base>-<container>` in the path of its ConfigMap requests: `../` would reach another
    namespace's (the webhook denies such a pod; a scheduler run without it must not act on one)."""
    forged = share_pod("p")
    forged["metadata"]["annotations"][keys.ENV_CONFIGMAP_ANNOTATION] = "gpufrac-env-x/../../../kube-system/y"
    made, client, _ = setup([gpu_node()], [forged])
    assert await made.schedule_pending() == 1
    assert client.made("create", "Binding") == [] and client.made("create", "ConfigMap") == []
    assert "is not a valid object name" in client.made("create", "Event")[0].body.message


@pytest.mark.parametrize(("queues", "recorded"), [(True, "default"), (False, None)])
async def test_a_bind_records_the_queue_the_pod_counts_in_for_good(
    queues: bool, recorded: str | None
) -> None:
    made, client, _ = setup([gpu_node()], [share_pod("p")], queues=queues)
    await made.schedule_pending()
    await made.wait_for_binds()
    written = client.made("create", "Binding")[0].body.metadata.annotations
    assert written.get(keys.BOUND_QUEUE_ANNOTATION) == recorded


async def test_a_gang_whose_members_arrive_one_by_one_binds_as_the_last_comes() -> None:
    """Job controllers create pods one at a time: the members that waited for the others are tried again
    as the one they were short of arrives (it is no change of the cluster's room)."""
    first, second = gang_member("a", "0.5"), gang_member("b", "0.5")
    made, client, _ = setup([gpu_node(gpus=1)], [first], gangs=True)
    made.on_pod_groups_listed([PAIR])
    await made.schedule_pending()  # a: 1 of its 2 members exist
    client.put(second)
    made.on_pod_event("ADDED", second)
    await made.schedule_pending()
    await made.wait_for_binds()
    assert [objects.node_name(client.stored("Pod", name) or {}) for name in "ab"] == ["n1", "n1"]


async def test_a_member_that_arrives_while_a_round_runs_is_counted_in_it() -> None:
    first, second = gang_member("a", "0.5"), gang_member("b", "0.5")
    made, client, _ = setup([gpu_node(gpus=1)], [first], gangs=True)
    made.on_pod_groups_listed([PAIR])
    told = made._report_failure

    async def arriving(pod: dict[str, Any], why: str) -> None:  # the watch delivers b meanwhile
        await told(pod, why)
        if objects.name_of(pod) == "a":
            client.put(second)
            made.on_pod_event("ADDED", second)

    made._report_failure = arriving  # type: ignore[method-assign]
    await made.schedule_pending()
    await made.wait_for_binds()
    assert [objects.node_name(client.stored("Pod", name) or {}) for name in "ab"] == ["n1", "n1"]


async def test_held_members_bind_once_their_pod_group_asks_for_no_more() -> None:
    """A PodGroup's minMember lowered to the members that can run: they were held until its timeout."""
    three = PAIR | {"spec": {"minMember": 3}}
    members = [
        gang_member("a", "0.25"),
        gang_member("b", "0.25"),
        gang_member("c", "0.75"),
    ]  # c fits beside none
    made, client, _ = setup([gpu_node(gpus=1)], members, gangs=True)
    made.on_pod_groups_listed([three])
    await made.schedule_pending()
    assert len(made.gangs.held_uids()) == 2
    made.on_pod_group_event("MODIFIED", PAIR)  # minMember 2
    await made.schedule_pending()
    await made.wait_for_binds()
    assert [objects.node_name(client.stored("Pod", name) or {}) for name in "abc"] == ["n1", "n1", ""]


async def test_a_member_placed_while_the_others_are_being_bound_joins_them() -> None:
    """The group already runs: counted as bound only once their binds ended, the others left the extra
    member held until the group's timeout."""
    pair = [gang_member("a", "0.25"), gang_member("b", "0.25")]
    made, client, _ = setup([gpu_node(gpus=1)], pair, gangs=True)
    made.on_pod_groups_listed([PAIR])
    client.gate = asyncio.Event()
    await made.schedule_pending()
    await until(lambda: len(client.held) == 2)  # a and b: their Bindings wait at the gate
    client.put(gang_member("c", "0.25"))
    made.on_pod_event("ADDED", gang_member("c", "0.25"))
    await made.schedule_pending()
    client.gate.set()
    await made.wait_for_binds()
    assert [objects.node_name(client.stored("Pod", name) or {}) for name in "abc"] == ["n1"] * 3


@pytest.mark.parametrize("theirs", [1000, 0], ids=["higher", "equal"])
async def test_room_kube_scheduler_nominated_for_a_pod_of_no_lower_priority_is_left_to_it(
    theirs: int,
) -> None:
    """kube-scheduler preempted for `urgent` and nominated n1: it filters other pods as if `urgent` ran
    there. Taken by a pod of lower or equal priority, the room would make it preempt again, and again."""
    urgent = pod("urgent", scheduler="default-scheduler", cpu="900m", priority=theirs)
    urgent["status"]["nominatedNodeName"] = "n1"
    made, _, _ = setup(
        [gpu_node("n1", cpu="1"), gpu_node("n2", cpu="1")], [urgent, share_pod("p", cpu="500m", priority=0)]
    )
    await made.schedule_pending()
    await made.wait_for_binds()
    assert pod_nodes(made)[key("p")] == "n2"
    made.on_pod_event("MODIFIED", pod("urgent", scheduler="default-scheduler", cpu="900m", priority=theirs))
    assert made.cache.nominated == {}  # nominated no more: its room is anyone's


async def test_a_nominated_pod_that_does_not_fit_yet_keeps_lower_priorities_off_its_node() -> None:
    """Its victims still going, it fits nowhere yet; kube-scheduler counts it there all the same."""
    urgent = pod("urgent", scheduler="default-scheduler", cpu="2", priority=1000)
    urgent["status"]["nominatedNodeName"] = "n1"
    made, client, _ = setup([gpu_node("n1", cpu="1")], [urgent, share_pod("p", cpu="500m", priority=0)])
    await made.schedule_pending()
    await made.wait_for_binds()
    assert key("p") not in pod_nodes(made) and made.cache.state.placements.keys() == set()
    said = client.made("patch", "PodStatus")[-1].body["status"]["conditions"][0]["message"]
    assert "1 node(s) kept for a pod of no lower priority nominated there" in said, said
