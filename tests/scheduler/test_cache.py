"""The scheduler cache's lifecycle, one pod at a time: assume, finish or forget, add, update, remove.

Every case ends with what the engine would see (`gpu_free`) and which pods the cache holds, keyed by UID.
"""

from __future__ import annotations

import copy
import gc
from typing import Any

import pytest

from gpufrac.cluster.model import Assignment, Placement
from gpufrac.contract import ComputeMode
from gpufrac.contract.node_inventory import GpuInfo
from gpufrac.scheduler import objects
from gpufrac.scheduler.cache import SchedulerCache

from ..kubeapi.apiobjects import GPU_MIB, bound, inventory, key, node, pod, with_status
from .schedulers import gpu_free, share_notes

HALF = GPU_MIB // 2


def n1() -> dict[str, Any]:
    return node("n1", agent=inventory("n1", 2))


def half_share(name: str, *, uid: str | None = None) -> dict[str, Any]:
    """`name` bound to n1 with half of GPU 0; `uid` makes it a different pod under the same name."""
    made = bound(pod(name), "n1", share_notes("main", "GPU-n1-0", f"{HALF}Mi"))
    if uid is not None:
        made["metadata"]["uid"] = uid
    return made


def assumed_placement(name: str) -> Placement:
    return Placement(
        key(name), "n1", 100, 0, (Assignment("main", (1,), HALF, HALF, ComputeMode.TIME_SLICING),)
    )


def cache_with_n1() -> SchedulerCache:
    cache = SchedulerCache()
    cache.sync_nodes([n1()])
    return cache


def test_an_assumed_placement_holds_its_memory_until_forgotten() -> None:
    cache = cache_with_n1()
    cache.assume(pod("p"), assumed_placement("p"))
    assert gpu_free(cache, "n1") == [GPU_MIB, HALF]
    assert cache.assumed == {key("p"): assumed_placement("p")} and cache.names == {key("p"): "team/p"}
    assert cache.forget(pod("p")) is True
    assert gpu_free(cache, "n1") == [GPU_MIB, GPU_MIB]
    assert cache.assumed == {} and cache.names == {} and cache.state.placements == {}


def test_a_finished_binding_stays_and_its_watch_event_does_not_count_it_twice() -> None:
    cache = cache_with_n1()
    cache.assume(pod("p"), assumed_placement("p"))
    cache.add_pod(bound(pod("p"), "n1", share_notes("main", "GPU-n1-1", f"{HALF}Mi")))  # arrives mid-bind
    assert cache.finish_binding(pod("p")) is True
    cache.update_pod(bound(pod("p"), "n1", share_notes("main", "GPU-n1-1", f"{HALF}Mi")))
    assert gpu_free(cache, "n1") == [GPU_MIB, HALF]
    assert set(cache.state.placements) == {key("p")} and cache.assumed == {}


def test_a_pod_deleted_while_its_bind_runs_is_held_until_the_bind_settles() -> None:
    for settle in ("finish_binding", "forget"):
        cache = cache_with_n1()
        cache.assume(pod("p"), assumed_placement("p"))
        assert cache.remove_pod(key("p")) is False  # the Binding may yet go through
        assert gpu_free(cache, "n1") == [GPU_MIB, HALF] and cache.gone_assumed == {key("p")}
        assert getattr(cache, settle)(pod("p")) is False, settle
        assert gpu_free(cache, "n1") == [GPU_MIB, GPU_MIB] and cache.gone_assumed == set()
        assert cache.state.placements == {} and cache.bound == {} and cache.names == {}


def test_adding_a_bound_pod_again_is_idempotent() -> None:
    cache = cache_with_n1()
    for _ in range(3):
        cache.add_pod(half_share("p"))
        cache.update_pod(half_share("p"))
    assert gpu_free(cache, "n1") == [HALF, GPU_MIB]
    assert set(cache.bound) == {key("p")}


def test_a_pod_recreated_under_the_same_name_is_another_pod() -> None:
    cache = cache_with_n1()
    cache.add_pod(half_share("p"))
    successor = half_share("p", uid="uid-p-2")
    cache.add_pod(successor)  # the first one's DELETED event has not arrived yet: both hold memory
    assert gpu_free(cache, "n1") == [0, GPU_MIB]
    assert set(cache.state.placements) == {key("p"), "uid-p-2"}
    assert cache.remove_pod(key("p")) is True
    assert gpu_free(cache, "n1") == [HALF, GPU_MIB] and set(cache.bound) == {"uid-p-2"}
    assert cache.names == {"uid-p-2": "team/p"}


def test_a_relist_drops_pods_that_are_gone_or_finished_and_keeps_a_same_named_successor() -> None:
    cache = cache_with_n1()
    cache.sync_pods([half_share("old"), half_share("done")])
    assert gpu_free(cache, "n1") == [0, GPU_MIB]
    pending_successor = pod("old")
    pending_successor["metadata"]["uid"] = "uid-old-2"  # deleted and recreated while the watch was down
    cache.sync_pods([pending_successor, with_status(half_share("done"), phase="Succeeded")])
    assert gpu_free(cache, "n1") == [GPU_MIB, GPU_MIB]
    assert cache.state.placements == {} and cache.bound == {} and cache.names == {}


def test_a_relist_pauses_the_cycle_collector_only_while_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The collector waits while a list is taken in, runs again after (a failure too), and stays off for a
    caller that had turned it off."""
    cache = cache_with_n1()
    seen: list[bool] = []
    account = cache._account_bound
    monkeypatch.setattr(cache, "_account_bound", lambda *a: (seen.append(gc.isenabled()), account(*a)))
    assert gc.isenabled()
    cache.sync_pods([half_share("p")])
    assert seen == [False] and gc.isenabled()
    monkeypatch.setattr(cache, "add_node", lambda node: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        cache.sync_nodes([n1()])
    assert gc.isenabled()
    gc.disable()
    try:
        cache.sync_pods([half_share("p")])
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_pods_on_an_unseen_node_wait_for_it_and_count_again_when_it_returns() -> None:
    cache = SchedulerCache()
    cache.add_pod(half_share("p"))
    assert set(cache.unplaced["n1"]) == {key("p")} and cache.state.placements == {}
    assert cache.add_node(n1()) is True
    assert gpu_free(cache, "n1") == [HALF, GPU_MIB] and cache.unplaced == {}
    cache.remove_node("n1")
    assert set(cache.unplaced["n1"]) == {key("p")} and cache.state.placements == {}
    cache.add_node(n1())
    assert gpu_free(cache, "n1") == [HALF, GPU_MIB] and set(cache.bound) == {key("p")}


def test_a_node_heartbeat_is_no_change() -> None:
    cache = cache_with_n1()
    heartbeat = copy.deepcopy(n1())
    heartbeat["metadata"]["resourceVersion"] = "2"
    assert cache.add_node(heartbeat) is False
    assert cache.add_node(node("n1", agent=inventory("n1", 2, unhealthy=[1]))) is True


def test_a_node_whose_pod_limit_alone_changes_takes_the_new_limit() -> None:
    cache = cache_with_n1()
    cache.add_pod(bound(pod("p"), "n1", share_notes("main", "GPU-n1-0", f"{HALF}Mi")))
    row = cache.state.index["n1"]
    changed = n1()
    changed["status"]["allocatable"]["pods"] = "2"
    assert cache.add_node(changed) is True
    assert (cache.state.pods_cap[row], cache.state.pods_free[row]) == (2, 1)
    changed["status"]["allocatable"]["pods"] = "250"
    cache.add_node(changed)
    assert (cache.state.pods_cap[row], cache.state.pods_free[row]) == (250, 249)
    assert gpu_free(cache, "n1") == [HALF, GPU_MIB]


def test_a_bound_pod_on_a_gpu_gone_unhealthy_still_counts_there() -> None:
    """A share keeps running on a GPU that went unhealthy under it; read again (a relist, a restart), it must
    still count there, not leave its node held as unaccountable while its memory looks free."""
    cache = SchedulerCache()
    cache.add_node(node("n1", agent=inventory("n1", 2, unhealthy=[1])))
    cache.add_pod(bound_to_gpu_1("p"))
    assert set(cache.bound) == {key("p")} and cache.misfits == {}
    assert gpu_free(cache, "n1") == [GPU_MIB, HALF]


def bound_to_gpu_1(name: str) -> dict[str, Any]:
    """`name` as the watch reports it once the bind of `assumed_placement(name)` went through."""
    return bound(pod(name), "n1", share_notes("main", "GPU-n1-1", f"{HALF}Mi"))


@pytest.mark.parametrize("gone", ["deleted", "unreadable", "missing from a relist"])
def test_a_bind_in_flight_keeps_its_memory_when_its_node_goes_and_comes_back(gone: str) -> None:
    cache = cache_with_n1()
    cache.assume(pod("p"), assumed_placement("p"))
    if gone == "deleted":
        cache.remove_node("n1")
    elif gone == "unreadable":
        unreadable = n1()
        unreadable["status"]["allocatable"]["cpu"] = "9" * 5000
        cache.add_node(unreadable)
    else:
        cache.sync_nodes([])
    cache.add_node(n1())
    assert gpu_free(cache, "n1") == [GPU_MIB, HALF]  # the bind may yet go through: still reserved
    cache.add_pod(bound_to_gpu_1("p"))  # its bound event, while the bind runs
    assert cache.finish_binding(pod("p"))
    assert gpu_free(cache, "n1") == [GPU_MIB, HALF] and set(cache.state.placements) == {key("p")}


def test_a_bind_that_finishes_while_its_node_is_gone_is_counted_when_the_node_returns() -> None:
    cache = cache_with_n1()
    cache.assume(pod("p"), assumed_placement("p"))
    cache.remove_node("n1")
    cache.add_pod(bound_to_gpu_1("p"))
    assert cache.finish_binding(pod("p"))
    cache.add_node(n1())
    assert gpu_free(cache, "n1") == [GPU_MIB, HALF] and cache.misfits == {}


def test_the_bound_object_seen_during_a_bind_is_the_one_kept() -> None:
    """Kept, a later change of the node reads the pod's annotations; the pending version has none, and
    would hold the node for good."""
    cache = cache_with_n1()
    cache.assume(pod("p"), assumed_placement("p"))
    cache.add_pod(bound_to_gpu_1("p"))
    cache.finish_binding(pod("p"))
    assert objects.node_name(cache.bound[key("p")]) == "n1"
    replaced = (GpuInfo(0, "GPU-new-0", "NVIDIA A100", GPU_MIB, True), *inventory("n1", 2)[1:])
    cache.add_node(node("n1", agent=replaced))  # GPU 0 swapped; p is on GPU 1
    assert cache.misfits == {} and gpu_free(cache, "n1") == [GPU_MIB, HALF]
    assert len(cache.eligible_rows(pod("q"))[0]) == 1


def test_a_node_newly_guaranteed_is_held_while_the_caps_on_a_gpu_add_past_100() -> None:
    cache = cache_with_n1()
    notes = share_notes("main", "GPU-n1-0", "1Gi", mode="sm-sharing")
    for name, cap in (("a", "60"), ("b", "50")):
        cache.add_pod(bound(pod(name), "n1", {**notes, "gpufrac.io/container.main.compute-percentage": cap}))
    assert cache.misfits == {}
    guaranteed = n1()
    guaranteed["metadata"]["labels"]["gpufrac.io/compute-guarantee"] = "true"
    cache.add_node(guaranteed)
    assert cache.snapshot().compute_guarantee[cache.state.index["n1"]]
    assert len(cache.misfits["n1"]) == 1 and len(cache.eligible_rows(pod("q"))[0]) == 0
    cache.remove_pod(next(iter(cache.misfits["n1"])))
    assert cache.misfits == {} and len(cache.eligible_rows(pod("q"))[0]) == 1


def test_a_misfit_is_counted_once_room_frees_on_its_node() -> None:
    """Another scheduler's pod bound beside ours while the node had room for one of the two: it is a misfit
    (its node held) until the kubelet rejects one. Once ours fails, the other fits and the node takes pods
    again, without waiting for a relist."""
    cache = SchedulerCache()
    cache.sync_nodes([node("n1", agent=inventory("n1", 1), cpu="16")])
    ours = bound(pod("ours", cpu="10"), "n1", share_notes("main", "GPU-n1-0", f"{HALF}Mi"))
    cache.add_pod(ours)
    cache.add_pod(bound(pod("web", cpu="10", scheduler="default-scheduler"), "n1", {}))
    assert set(cache.misfits["n1"]) == {key("web")} and len(cache.eligible_rows(pod("next"))[0]) == 0
    cache.update_pod(with_status(ours, phase="Failed"))
    cache.remove_pod(key("ours"))
    assert cache.misfits == {} and set(cache.state.placements) == {key("web")}
    assert len(cache.eligible_rows(pod("next"))[0]) == 1


def test_a_misfit_read_again_as_room_frees_is_reported_once() -> None:
    """Refusals quote live numbers (memory left), so each release on its node told of it anew."""
    told: list[str] = []
    cache = SchedulerCache(report=lambda problem: told.append(problem.message))
    cache.sync_nodes([node("n1", agent=inventory("n1", 1), cpu="16")])
    cache.add_pod(bound(pod("ours", cpu="10"), "n1", share_notes("main", "GPU-n1-0", f"{HALF}Mi")))
    cache.add_pod(bound(pod("small", cpu="1"), "n1", share_notes("main", "GPU-n1-0", "1000Mi")))
    cache.add_pod(bound(pod("web", cpu="10", scheduler="default-scheduler"), "n1", {}))
    cache.remove_pod(key("small"))  # room frees, not enough for web
    assert set(cache.misfits["n1"]) == {key("web")} and len(told) == 1


def test_a_reservation_gone_before_its_deletion_is_asked_leaves_nothing_behind() -> None:
    cache = SchedulerCache()
    cache.release_reservation("a-failed-reservation")  # the keeper deletes one that already left the cache
    cache.remove_pod("a-failed-reservation")  # its DELETED event
    assert cache.releasing == set()
