"""The scheduler's view of the cluster, fed node and pod events by hand: no API server, no binds."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gpufrac.cluster.model import Placement
from gpufrac.contract import keys, node_inventory
from gpufrac.placement.engine import decide
from gpufrac.placement.framework import POLICIES
from gpufrac.scheduler import loop, objects
from gpufrac.scheduler.loop import Scheduler

from ..kubeapi.apiobjects import GPU_MIB, bound, container, inventory, key, node, pod, with_status
from .schedulers import gpu_flags, gpu_free, pod_nodes, scheduler, share_notes

N1_GPUS = inventory("n1", 2)


def n1(**changes: Any) -> dict[str, Any]:
    settings: dict[str, Any] = {"agent": N1_GPUS, "cpu": "16", "mem": "64Gi"} | changes
    return node("n1", **settings)


def sm_pod(name: str = "mps") -> dict[str, Any]:
    """8000 MiB of GPU 0, sm-sharing, and 1 CPU."""
    notes = share_notes("main", "GPU-n1-0", "8000Mi", limit="12000Mi", mode="sm-sharing")
    return bound(pod(name, cpu="1"), "n1", notes)


def whole_pod(name: str = "whole") -> dict[str, Any]:
    """GPU 1, whole."""
    return bound(pod(name, whole=1, cpu="2"), "n1", {keys.container_key("main", keys.DEVICES): "GPU-n1-1"})


def fits(made: Scheduler, fraction: str, *, mode: str = "time-slicing") -> bool:
    notes = {"gpu-fraction": fraction}
    if mode != "time-slicing":
        notes[keys.container_key("main", keys.COMPUTE_MODE)] = mode
    probe = pod("probe", annotations=notes)  # in the bound pods' namespace, so the same fault domain
    outcome = decide(
        made.cache.state, objects.pod_demand(probe, fault_domain=made.fault_domain(probe)), made.policy
    )
    return isinstance(outcome, Placement)


def listed(made: Scheduler, nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> None:
    made.on_nodes_listed(nodes)
    made.on_pods_listed(pods)


def test_rebuilds_the_state_from_bound_pods_annotations() -> None:
    made = scheduler()
    assert not made.ready
    listed(made, [n1()], [sm_pod(), whole_pod()])
    assert made.ready
    assert gpu_free(made, "n1") == [GPU_MIB - 8000, 0]
    assert gpu_flags(made, "n1", "gpu_whole") == [False, True]
    assert made.cache.state.cpu_free[made.cache.state.index["n1"]] == 16_000 - 1000 - 2000
    assert pod_nodes(made) == {key("mps"): "n1", key("whole"): "n1"}
    assert made.pending == {} and len(made.queue) == 0
    # No double booking: what is left is 8000 MiB of an sm-sharing GPU.
    assert not fits(made, "0.75", mode="sm-sharing")
    assert not fits(made, "0.25")  # GPU 0 is sm-sharing, GPU 1 is held whole
    assert fits(made, "0.5", mode="sm-sharing")


def test_a_relist_does_not_count_a_pod_twice_and_releases_pods_gone_meanwhile() -> None:
    made = scheduler()
    listed(made, [n1()], [sm_pod(), whole_pod()])
    made.on_pods_listed([sm_pod(), whole_pod()])
    made.on_nodes_listed([n1()])
    assert gpu_free(made, "n1") == [GPU_MIB - 8000, 0]
    made.on_pods_listed([whole_pod()])
    assert gpu_free(made, "n1") == [GPU_MIB, 0]
    assert set(made.cache.state.placements) == {key("whole")}


def test_foreign_pods_hold_cpu_and_memory_but_no_gpu() -> None:
    made = scheduler()
    foreign = pod(
        "foreign",
        scheduler=None,
        node_name="n1",
        containers=[container("a", cpu="3", mem="2Gi", whole=1)],
        phase="Running",
    )
    listed(made, [n1()], [foreign])
    row = made.cache.state.index["n1"]
    assert (made.cache.state.cpu_free[row], made.cache.state.mem_free[row]) == (13_000, 62 * 1024)
    assert gpu_free(made, "n1") == [GPU_MIB, GPU_MIB]
    assert made.cache.state.placements[key("foreign")].assignments == ()
    made.on_pod_event("DELETED", foreign)
    assert (made.cache.state.cpu_free[row], made.cache.state.mem_free[row]) == (16_000, 64 * 1024)


def test_a_pod_bound_to_a_node_not_yet_seen_is_counted_when_the_node_arrives() -> None:
    made = scheduler()
    made.on_pods_listed([sm_pod()])
    made.on_nodes_listed([])
    assert made.cache.state.placements == {}
    made.on_node_event("ADDED", n1())
    assert gpu_free(made, "n1") == [GPU_MIB - 8000, GPU_MIB]
    assert pod_nodes(made) == {key("mps"): "n1"}
    assert made.cache.unplaced == {}


def test_a_pod_gone_before_its_node_arrives_is_never_counted() -> None:
    made = scheduler()
    made.on_pod_event("ADDED", sm_pod())
    made.on_pod_event("DELETED", sm_pod())
    made.on_pod_event("ADDED", whole_pod())
    made.on_pods_listed([])  # deleted while the watch was down: only the relist tells
    made.on_node_event("ADDED", n1())
    assert gpu_free(made, "n1") == [GPU_MIB, GPU_MIB]
    assert made.cache.state.placements == {} and pod_nodes(made) == {}


def test_deleting_a_bound_pod_releases_it() -> None:
    made = scheduler()
    listed(made, [n1()], [sm_pod(), whole_pod()])
    made.on_pod_event("DELETED", sm_pod())
    assert gpu_free(made, "n1") == [GPU_MIB, 0]
    assert key("mps") not in pod_nodes(made) and key("mps") not in made.cache.state.placements
    made.on_pod_event("DELETED", sm_pod())  # a repeat changes nothing
    assert gpu_free(made, "n1") == [GPU_MIB, 0]


def test_a_finished_pod_releases_its_gpus_and_a_terminating_one_only_once_gone() -> None:
    """A pod being deleted runs out its grace period on its GPU, holding the memory a new share would be
    promised: it counts, as the kubelet counts it, until the watch says it is gone."""
    made = scheduler()
    listed(made, [n1()], [sm_pod(), whole_pod()])
    made.on_pod_event("MODIFIED", with_status(sm_pod(), phase="Succeeded"))
    terminating = whole_pod()
    terminating["metadata"]["deletionTimestamp"] = "2024-05-01T13:00:00Z"
    made.on_pod_event("MODIFIED", terminating)
    assert gpu_free(made, "n1") == [GPU_MIB, 0]
    made.on_pods_listed([terminating])  # a relist too
    assert gpu_free(made, "n1") == [GPU_MIB, 0]
    made.on_pod_event("DELETED", terminating)
    assert gpu_free(made, "n1") == [GPU_MIB, GPU_MIB]
    assert made.cache.state.placements == {}
    assert fits(made, "0.9")


def test_a_gpu_health_change_keeps_its_placements() -> None:
    made = scheduler()
    listed(made, [n1()], [sm_pod(), whole_pod()])
    before = dict(made.cache.state.placements)
    made.on_node_event("MODIFIED", n1(agent=inventory("n1", 2, unhealthy=[0])))
    assert gpu_flags(made, "n1", "gpu_healthy") == [False, True]
    assert made.cache.state.placements == before
    assert gpu_free(made, "n1") == [GPU_MIB - 8000, 0]
    assert not fits(made, "0.1", mode="sm-sharing")  # the only GPU with room is unhealthy
    made.on_node_event("MODIFIED", n1())
    assert gpu_flags(made, "n1", "gpu_healthy") == [True, True]
    assert fits(made, "0.1", mode="sm-sharing")


def test_a_node_resized_keeps_its_placements() -> None:
    made = scheduler()
    listed(made, [n1()], [sm_pod(), whole_pod()])
    made.on_node_event("MODIFIED", n1(cpu="32"))
    row = made.cache.state.index["n1"]
    assert made.cache.state.cpu_free[row] == 32_000 - 3000
    assert gpu_free(made, "n1") == [GPU_MIB - 8000, 0]
    assert set(made.cache.state.placements) == {key("mps"), key("whole")}


def test_a_removed_node_releases_its_pods() -> None:
    made = scheduler()
    listed(made, [n1(), node("n2")], [sm_pod(), whole_pod()])
    made.on_node_event("DELETED", n1())
    assert not made.cache.state.active[made.cache.state.index["n1"]]
    assert made.cache.state.placements == {} and pod_nodes(made) == {}
    assert "n1" not in made.cache.nodes


def test_a_node_missing_from_a_relist_is_removed() -> None:
    made = scheduler()
    listed(made, [n1(), node("n2")], [sm_pod()])
    made.on_nodes_listed([node("n2")])
    assert not made.cache.state.active[made.cache.state.index["n1"]]
    assert made.cache.state.placements == {}


def test_agent_gpus_that_the_state_cannot_hold_fall_back_to_the_labels() -> None:
    """Indices that are not 0..n-1 once made the state refuse the node, and the handler raise."""
    gapped = '[{"index": 3, "uuid": "GPU-x", "model": "A100", "memory_mib": 40960, "healthy": true}]'
    made = scheduler()
    made.on_node_event("ADDED", node("n1", gpus=2, annotations={node_inventory.GPUS_ANNOTATION: gapped}))
    assert [gpu.uuid for gpu in made.cache.state.node_spec("n1").gpus] == ["0", "1"]


def test_a_bound_pod_naming_gpus_the_node_lacks_is_skipped() -> None:
    made = scheduler()
    stray = bound(pod("stray"), "n1", share_notes("main", "GPU-elsewhere-0", "1Gi"))
    listed(made, [n1()], [stray, sm_pod()])
    assert set(made.cache.state.placements) == {key("mps")}


def test_pending_pods_of_another_scheduler_are_ignored() -> None:
    made = scheduler()
    listed(made, [n1()], [pod("theirs", scheduler="default-scheduler"), pod("default", scheduler=None)])
    made.on_pod_event("ADDED", pod("other", scheduler="volcano"))
    assert made.pending == {} and len(made.queue) == 0


def test_a_pending_pod_is_queued_once_and_only_a_spec_change_requeues_it() -> None:
    made = scheduler()
    listed(made, [n1()], [pod("p", annotations={"gpu-fraction": "0.5"})])
    assert set(made.pending) == {key("p")}
    assert made.queue.pop() == key("p")
    made.queue.park(key("p"), priority=0, created=0.0)  # as an attempt that found no room does
    status_only = with_status(
        pod("p", annotations={"gpu-fraction": "0.5"}), conditions=[{"type": "PodScheduled"}]
    )
    made.on_pod_event("MODIFIED", status_only)
    assert made.pending[key("p")] is status_only  # the latest version is kept...
    assert made.queue.pop() is None  # ...but the pod still waits
    made.on_pods_listed([status_only])
    assert made.queue.pop() is None
    made.on_pod_event("MODIFIED", pod("p", annotations={"gpu-fraction": "0.25"}))
    assert made.queue.pop() == key("p")


def test_pending_pods_are_tried_by_priority_then_age() -> None:
    made = scheduler()
    pods = [
        pod("late", created="2024-05-01T12:00:05Z"),
        pod("early", created="2024-05-01T12:00:00Z"),
        pod("important", priority=1000, created="2024-05-01T12:00:09Z"),
    ]
    listed(made, [n1()], pods)
    assert [made.queue.pop() for _ in pods] == [key("important"), key("early"), key("late")]


def test_a_pending_pod_that_gets_bound_elsewhere_is_forgotten_and_counted() -> None:
    made = scheduler()
    pending = pod("p", whole=1)
    listed(made, [n1()], [pending])
    made.on_pod_event(
        "MODIFIED", bound(pending, "n1", {keys.container_key("main", keys.DEVICES): "GPU-n1-0"})
    )
    assert made.pending == {} and key("p") not in made.queue
    assert gpu_free(made, "n1") == [0, GPU_MIB]


def test_a_pending_pod_deleted_leaves_the_queue() -> None:
    made = scheduler()
    listed(made, [n1()], [pod("p"), pod("q")])
    made.on_pod_event("DELETED", pod("p"))
    made.on_pods_listed([])
    assert made.pending == {} and len(made.queue) == 0


def test_a_node_that_comes_back_counts_its_pods_again_and_heartbeats_change_nothing() -> None:
    made = scheduler()
    listed(made, [n1()], [sm_pod(), whole_pod()])
    version = made.cache.state.version.copy()
    made.on_node_event("MODIFIED", n1())  # the same node again, as after a kubelet heartbeat
    assert (made.cache.state.version == version).all()
    made.on_node_event("DELETED", n1())
    assert made.cache.state.placements == {}
    made.on_node_event("ADDED", n1())
    assert set(made.cache.state.placements) == {key("mps"), key("whole")}
    assert gpu_free(made, "n1") == [GPU_MIB - 8000, 0]


def test_fgd_measures_fragmentation_against_the_shapes_of_the_clusters_own_pods() -> None:
    made = scheduler(policy="fgd")
    listed(made, [n1()], [sm_pod(), whole_pod()])
    made.refresh_workload()
    shapes = made.policy.scorer.workload.shapes  # type: ignore[attr-defined]
    # 8000 MiB of a 16000 MiB GPU (the cluster's own GPU size) is half a GPU; the whole GPU is 1000.
    assert {(shape.cpu_milli, shape.gpus, shape.milli) for shape in shapes} == {
        (1000, 1, 500),
        (2000, 1, 1000),
    }
    before = made.policy
    made.refresh_workload()  # within the refresh period: kept
    assert made.policy is before
    made.refresh_workload(every=0)
    assert made.policy is not before


def test_the_workload_gathered_from_the_clusters_pods_keeps_a_bounded_number_of_shapes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A tenant's pods of many distinct sizes must not make FGD's arrays (nodes x GPUs x shapes) grow with
    them: the most common shapes are kept, up to the cap."""
    monkeypatch.setattr(loop, "MAX_WORKLOAD_SHAPES", 1)
    made = scheduler(policy="fgd-stranding")
    listed(made, [n1()], [sm_pod(), whole_pod()])
    made.refresh_workload()
    assert len(made.policy.scorer.workload.shapes) == 1  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", list(POLICIES))
def test_a_scheduling_pass_gathers_a_workload_only_for_a_policy_that_declares_it_needs_one(name: str) -> None:
    made = scheduler(policy=name)
    listed(made, [n1()], [sm_pod()])
    before = made.policy
    asyncio.run(made.schedule_pending())
    assert (made.policy is not before) is POLICIES[name].needs_workload


def test_a_pending_pod_a_relist_shows_bound_elsewhere_leaves_the_queue_and_the_round_goes_on() -> None:
    """Bound by another replica while this one's watch was broken."""
    made = scheduler()
    listed(made, [n1()], [pod("p", annotations={"gpu-fraction": "0.5"}), pod("q")])
    by_other = bound(
        pod("p", annotations={"gpu-fraction": "0.5"}), "n1", share_notes("main", "GPU-n1-0", "8000Mi")
    )
    made.on_pods_listed([by_other, pod("q")])
    assert key("p") not in made.pending and key("p") not in made.queue
    assert pod_nodes(made)[key("p")] == "n1"


def test_misbound_pods_are_forgotten_once_they_are_gone() -> None:
    made = scheduler()  # a standby, say: only a leader deletes them
    misbound = bound(
        pod("p"), "n1", {**share_notes("main", "GPU-n1-0", "8000Mi"), keys.BOUND_UID_ANNOTATION: "uid-old"}
    )
    listed(made, [n1()], [misbound, bound(pod("q"), "n1", {keys.BOUND_UID_ANNOTATION: "uid-old-q"})])
    assert set(made.misbound) == {key("p"), key("q")}
    made.on_pod_event("DELETED", misbound)
    made.on_pods_listed([])
    assert made.misbound == {}
