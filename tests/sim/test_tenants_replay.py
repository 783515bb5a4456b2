"""The tenant replay (`sim.tenants.replay`) on clusters of a node or two, every figure worked out by hand:
reclaim from a borrowing queue and the GPU-seconds it wastes, young pods spared, gangs all or nothing,
fair shares over time as `fair_shares` gives them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpufrac.cluster.model import GpuSpec, NodeSpec, PodDemand
from gpufrac.contract.model import WholeGpuRequest
from gpufrac.contract.queues import Resource
from gpufrac.placement.fairshare import fair_shares
from gpufrac.sim.tenants import config, replay
from gpufrac.sim.tenants.deal import Dealt, TenantPod

GPUS = replay.RESOURCES.index(Resource.GPUS)


def node(name: str = "n0", gpus: int = 2) -> NodeSpec:
    return NodeSpec(
        name, 64_000, 262_144, tuple(GpuSpec(i, f"{name}-{i}", "T4", 16_000) for i in range(gpus))
    )


def pod(
    name: str, queue: str, arrival: float, duration: float, gpus: int = 1, gang: str | None = None
) -> TenantPod:
    demand = PodDemand(name, cpu_milli=1000, memory_mib=1024, whole=(WholeGpuRequest("main", gpus),))
    return TenantPod(demand, queue, arrival, duration, gang)


def rules(queues: dict[str, int], **tables: dict[str, Any]) -> config.TenantsConfig:
    """Queues with a quota of whole GPUs each, in order, and the given tables."""
    entries = [{"name": name, "resources": {"gpus": {"quota": quota}}} for name, quota in queues.items()]
    return config.parse({"queues": entries, **tables}, Path("t.toml"))


def run(
    pods: list[TenantPod], settings: config.TenantsConfig, nodes: tuple[NodeSpec, ...] = ()
) -> replay.TenantRun:
    return replay.replay(Dealt(nodes or (node(),), tuple(pods)), settings, policy="binpack", seed=0)


# Team a has a quota of one GPU of two; team b has none, and borrows both GPUs while a is idle.
BORROWING = [pod("b1", "b", 0, 5000), pod("b2", "b", 0, 5000)]
EVICTION = {"minRuntimeSeconds": 600, "graceSeconds": 30}


def test_a_queue_under_its_quota_reclaims_from_one_over_its_fair_share() -> None:
    done = run([*BORROWING, pod("a1", "a", 1000, 100)], rules({"a": 1, "b": 0}, eviction=EVICTION))
    a, b = done.tallies["a"], done.tallies["b"]
    # a's pod finds no room at 1000 s; one of b's pods (run 1000 s) goes, terminates for 30 s, and a starts.
    assert a.reclaims == [30.0] and a.waits == [30.0]
    assert b.evicted == 1
    assert b.wasted_gpu_seconds == pytest.approx(1 * 1030)  # one GPU × the 1,030 s it had run, grace included
    # The evicted pod queues again when gone, starts when a leaves (1130 s) and runs all of its 5000 s again.
    assert sorted(b.waits) == [0.0, 0.0, 100.0]
    assert done.end == 1130 + 5000
    assert a.evicted == 0 and not b.reclaims


def test_a_pod_younger_than_the_min_runtime_is_never_evicted() -> None:
    settings = rules({"a": 1, "b": 0}, eviction={"minRuntimeSeconds": 10_000, "graceSeconds": 30})
    done = run([*BORROWING, pod("a1", "a", 1000, 100)], settings)
    assert done.tallies["b"].evicted == 0
    assert done.tallies["a"].waits == [4000.0]  # it waits for b's pods to leave at 5000 s


def test_a_young_victim_is_taken_as_soon_as_it_comes_of_age() -> None:
    done = run([*BORROWING, pod("a1", "a", 300, 100)], rules({"a": 1, "b": 0}, eviction=EVICTION))
    # Entitled at 300 s, b's pods are 600 s old at 600 s, gone at 630 s: a wakes then, not at b's departure.
    assert done.tallies["a"].reclaims == [330.0]
    assert done.tallies["b"].wasted_gpu_seconds == pytest.approx(630)


def test_no_reclaim_beyond_the_quota_nor_from_a_queue_at_its_fair_share() -> None:
    beyond = run([*BORROWING, pod("a1", "a", 1000, 100, gpus=2)], rules({"a": 1, "b": 0}, eviction=EVICTION))
    assert beyond.tallies["b"].evicted == 0  # two GPUs would take a past its quota of one
    # b's quota of two makes both of its GPUs its fair share: nothing to take.
    fair = run([*BORROWING, pod("a1", "a", 1000, 100)], rules({"a": 1, "b": 2}, eviction=EVICTION))
    assert fair.tallies["b"].evicted == 0
    # b is over its share of one, but its one pod holds two: without it b would fall below its share.
    whole = run(
        [pod("b1", "b", 0, 5000, gpus=2), pod("a1", "a", 1000, 100)],
        rules({"a": 1, "b": 0}, eviction=EVICTION),
    )
    assert whole.tallies["b"].evicted == 0


def gang_behind_a_blocker(timeout: float) -> replay.TenantRun:
    """Two GPUs; x holds one from 0 to 500 s; a gang of two one-GPU members arrives at 100 s."""
    members = [pod(f"g-m{i}", "a", 100, 50, gang="g") for i in range(2)]
    settings = rules({"a": 0, "b": 0}, gangs={"scheduleTimeoutSeconds": timeout})
    return run([pod("x", "b", 0, 500), *members], settings)


def gpus_held(done: replay.TenantRun, queue: str, time: float) -> float:
    return float(done.usage[np.searchsorted(done.times, time), done.queues.index(queue), GPUS])


def test_a_gang_runs_all_together_and_its_wait_is_recorded() -> None:
    done = gang_behind_a_blocker(timeout=1000)
    a = done.tallies["a"]
    # One member fits at 100 s and holds its GPU; the other fits only when x leaves at 500 s: both start then.
    assert a.gang_waits == [400.0] and a.waits == [400.0, 400.0] and a.gang_timeouts == 0
    assert gpus_held(done, "a", 100) == 1.0  # the held member counts against its queue while it waits
    assert done.end == 550


def test_a_gang_not_whole_in_time_gives_its_room_back_then_tries_again() -> None:
    done = gang_behind_a_blocker(timeout=200)
    a = done.tallies["a"]
    assert a.gang_timeouts == 1  # held at 100 s, given back at 300 s
    assert gpus_held(done, "a", 300) == 0.0
    assert a.gang_waits == [400.0]  # both start when x leaves


def test_two_gangs_that_each_hold_half_take_turns_rather_than_for_ever() -> None:
    # One GPU free until x leaves at 10,000 s; gangs g (of a) and h (of b) each need both GPUs.
    gangs = [
        pod(f"{name}-m{i}", queue, 100, 50, gang=name)
        for name, queue in (("g", "a"), ("h", "b"))
        for i in range(2)
    ]
    settings = rules({"a": 0, "b": 0}, gangs={"scheduleTimeoutSeconds": 300})
    done = run([pod("x", "b", 0, 10_000), *gangs], settings)
    # Each holds the free GPU once, gives it back and waits for room that is not a gang's: x leaving.
    assert (done.tallies["a"].gang_timeouts, done.tallies["b"].gang_timeouts) == (1, 1)
    assert sorted(done.tallies["a"].gang_waits + done.tallies["b"].gang_waits) == [9900.0, 9950.0]


def test_a_gang_too_big_for_the_empty_cluster_never_queues() -> None:
    members = [pod(f"g-m{i}", "a", 0, 50, gpus=2, gang="g") for i in range(2)]
    done = run([*members, pod("p", "a", 0, 10)], rules({"a": 0}))
    a = done.tallies["a"]
    assert (a.pods, a.never_fit, a.never_ran, a.waits) == (3, 2, 0, [0.0])


def test_fair_shares_over_time_are_those_of_the_demand_at_each_instant() -> None:
    # Four GPUs; a and b have a quota of one each and ask for four; the other two split 1:3 by weight.
    entries = [
        {"name": "a", "resources": {"gpus": {"quota": 1, "overQuotaWeight": 1}}},
        {"name": "b", "resources": {"gpus": {"quota": 1, "overQuotaWeight": 3}}},
    ]
    settings = config.parse({"queues": entries, "eviction": {"minRuntimeSeconds": 86_400}}, Path("t.toml"))
    pods = [pod(f"{queue}{i}", queue, 0, 1000) for queue in "ab" for i in range(4)]
    done = run(pods, settings, nodes=(node(gpus=4),))
    first = done.share[0, :, GPUS]
    assert first.tolist() == pytest.approx([1.5, 2.5])  # 1 + 2 × 1/4 and 1 + 2 × 3/4
    capacity = {resource: 0.0 for resource in Resource} | {Resource.GPUS: 4.0}
    demand = {queue: {Resource.GPUS: done.demand[0, at, GPUS]} for at, queue in enumerate(done.queues)}
    assert fair_shares(settings.queues, capacity, demand)["b"][Resource.GPUS] == pytest.approx(2.5)
    # Taken from the queue furthest below its share: a, b, b, a (a at 1/1.5 goes before b at 2/2.5).
    assert done.usage[0, :, GPUS].tolist() == [2.0, 2.0]
    # At 1000 s the first four leave and the rest run: shares follow the demand that is left.
    later = np.searchsorted(done.times, 1000)
    assert done.demand[later, :, GPUS].tolist() == [2.0, 2.0]
    assert done.share[later, :, GPUS].tolist() == pytest.approx([2.0, 2.0])
