"""Eviction plans (`placement.preemption`) worked out by hand: the lowest priorities first, then the fewest
pods, exactly what the pending pod needs on one node (a GPU's mode included); and a property: any plan,
carried out, is accepted by the state and lets the pod in."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufrac.cluster.invariants import violations
from gpufrac.cluster.model import GpuSpec, NodeSpec, Placement
from gpufrac.cluster.state import ClusterState
from gpufrac.placement.engine import decide
from gpufrac.placement.preemption import Looks, plan_eviction, plan_gang_eviction

from ..cluster.builders import SM, TS, node, share_pod, whole_pod
from .builders import policy
from .test_defrag import place_on, snapshot

BINPACK = policy("binpack")


def cluster(*pods: tuple[str, int, str, Any]) -> ClusterState:
    """Two one-GPU nodes; each pod (name, milli, node, mode) placed on its node."""
    state = ClusterState([node("n0", 1), node("n1", 1)])
    for name, milli, on, mode in pods:
        place_on(state, share_pod(name, milli, mode=mode), on)
    return state


SCENARIOS = {
    # name: (pods, victims with priorities, pending pod, max victims, expected (node, victims) or None)
    "the one pod in the way goes": (
        [("low", 600, "n0", TS), ("keep", 600, "n1", TS)],
        {"low": 1},
        share_pod("p", 500),
        3,
        ("n0", ["low"]),
    ),
    "the lower priority goes, wherever it is": (
        [("mid", 600, "n0", TS), ("low", 600, "n1", TS)],
        {"mid": 5, "low": 1},
        share_pod("p", 500),
        3,
        ("n1", ["low"]),
    ),
    "lowest priorities first, even if more of them": (
        [("a", 300, "n0", TS), ("b", 300, "n0", TS), ("mid", 600, "n1", TS)],
        {"a": 1, "b": 1, "mid": 2},
        whole_pod("w"),
        3,
        ("n0", ["a", "b"]),
    ),
    "a higher priority only when the lower ones are not enough": (
        [("a", 300, "n0", TS), ("mid", 600, "n0", TS), ("keep", 900, "n1", TS)],
        {"a": 1, "mid": 2},
        whole_pod("w"),
        3,
        ("n0", ["a", "mid"]),
    ),
    "no more than max_victims": (
        [("a", 300, "n0", TS), ("b", 300, "n0", TS), ("keep", 600, "n1", TS)],
        {"a": 1, "b": 1},
        whole_pod("w"),
        1,
        None,
    ),
    "only the pods offered": (
        [("a", 600, "n0", TS), ("b", 600, "n1", TS)],
        {},
        share_pod("p", 500),
        3,
        None,
    ),
    "a GPU in another mode is emptied, not just made room on": (
        [("sm", 200, "n0", SM), ("keep", 900, "n1", TS)],
        {"sm": 1},
        share_pod("p", 500),
        3,
        ("n0", ["sm"]),
    ),
    "nothing evicted when it would not help": (
        [("a", 600, "n0", TS), ("b", 600, "n1", TS)],
        {"a": 1, "b": 1},
        whole_pod("w", 2),
        3,
        None,
    ),
}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_eviction_plans_as_worked_out_by_hand(scenario: str) -> None:
    pods, victims, pending, most, expected = SCENARIOS[scenario]
    state = cluster(*pods)
    before = snapshot(state)
    plan = plan_eviction(state, pending, BINPACK, victims=victims, max_victims=most)
    assert snapshot(state) == before
    if expected is None:
        assert plan is None
        return
    assert plan is not None and (plan.placement.node, sorted(plan.victims)) == expected


@settings(max_examples=60, deadline=None)
@given(
    shares=st.lists(st.tuples(st.sampled_from([100, 250, 300, 500, 700]), st.integers(0, 3)), max_size=10),
    pending=st.sampled_from([300, 500, 800, 0]),
    most=st.integers(1, 3),
)
def test_any_plan_carried_out_is_valid(shares: list[tuple[int, int]], pending: int, most: int) -> None:
    state = ClusterState([node("n0", 2), node("n1", 1)])
    victims = {}
    for i, (milli, priority) in enumerate(shares):
        outcome = decide(state, share_pod(f"s{i}", milli), BINPACK)
        if isinstance(outcome, Placement):
            state.apply(outcome)
            if priority:  # priority 0: not offered
                victims[f"s{i}"] = priority
    pod = share_pod("p", pending) if pending else whole_pod("p")
    before = snapshot(state)
    plan = plan_eviction(state, pod, BINPACK, victims=victims, max_victims=most)
    assert snapshot(state) == before
    if plan is None:
        return
    assert 1 <= len(plan.victims) <= most and set(plan.victims) <= set(victims)
    for name in plan.victims:
        state.release(name)
    state.apply(plan.placement)
    assert violations(state) == []


# A gang, planned for at once.


def gang_cluster() -> ClusterState:
    """Three one-GPU nodes: n0 and n1 full (pods a and b), n2 free."""
    state = ClusterState([node("n0", 1), node("n1", 1), node("n2", 1)])
    place_on(state, share_pod("a", 600), "n0")
    place_on(state, share_pod("b", 600), "n1")
    return state


def gang(size: int) -> list[tuple[Any, None, None]]:
    return [(whole_pod(f"w{i}"), None, None) for i in range(size)]


def test_a_gang_is_planned_for_whole_or_not_at_all() -> None:
    state = gang_cluster()
    before = snapshot(state)
    # Two members: the first (which fits nowhere) needs one pod gone, the lowest; the other takes the free
    # GPU as things are.
    plan = plan_gang_eviction(state, gang(2), BINPACK, victims={"a": 1, "b": 5}, max_victims=3)
    assert plan is not None and plan.victims == ("a",)
    assert {name: placement.node for name, placement in plan.placements.items()} == {"w0": "n0", "w1": "n2"}
    # Three members need both gone.
    plan = plan_gang_eviction(state, gang(3), BINPACK, victims={"a": 1, "b": 5}, max_victims=3)
    assert plan is not None and sorted(plan.victims) == ["a", "b"]
    assert sorted(p.node for p in plan.placements.values()) == ["n0", "n1", "n2"]
    # Where the gang cannot run whole, nobody is evicted for it: b may not go, or only one pod may.
    assert plan_gang_eviction(state, gang(3), BINPACK, victims={"a": 1}, max_victims=3) is None
    assert plan_gang_eviction(state, gang(3), BINPACK, victims={"a": 1, "b": 5}, max_victims=1) is None
    assert plan_gang_eviction(state, gang(4), BINPACK, victims={"a": 1, "b": 5}, max_victims=3) is None
    assert snapshot(state) == before  # every trial put back


def test_a_victim_on_a_gpu_gone_unhealthy_is_weighed_and_put_back() -> None:
    """Pod a holds all of n0's CPU on GPU 0, which then went unhealthy: the trials release it and put it back,
    where `apply` would refuse it (no new share on an unhealthy GPU) and lose it from the state."""
    state = ClusterState([node("n0", 2, cpu=4_000)])
    place_on(state, share_pod("a", 250, cpu=4_000), "n0")
    state.set_gpu_health("n0", 0, healthy=False)
    before = snapshot(state)
    pod = share_pod("p", 500, cpu=1_000)
    plan = plan_eviction(state, pod, BINPACK, victims={"a": 0}, max_victims=1)
    assert plan is not None and plan.victims == ("a",) and plan.placement.assignments[0].gpus == (1,)
    assert snapshot(state) == before
    gang_plan = plan_gang_eviction(state, [(pod, None, None)], BINPACK, victims={"a": 0}, max_victims=1)
    assert gang_plan is not None and gang_plan.victims == ("a",)
    assert snapshot(state) == before


def test_a_whole_gpu_pod_on_gpus_of_different_sizes_frees_each_of_them_whole() -> None:
    """GPUs of one node often differ by a few MiB of allocatable memory. A whole-GPU assignment's request is
    its smallest GPU's memory, but evicting it frees the bigger GPU whole too."""
    gpus = (GpuSpec(0, "g0", "T4", 16_000), GpuSpec(1, "g1", "T4", 16_002))
    state = ClusterState([NodeSpec("n0", 64_000, 64_000, gpus)])
    place_on(state, whole_pod("a", 2), "n0")
    plan = plan_eviction(state, whole_pod("w", 2), BINPACK, victims={"a": 0}, max_victims=1)
    assert plan is not None and plan.victims == ("a",) and plan.placement.assignments[0].gpus == (0, 1)


def test_a_node_at_its_pod_limit_frees_a_slot() -> None:
    """Small shares fill a node's 110 pods before its GPUs: a pod that outranks one of them takes its slot."""
    state = ClusterState([NodeSpec("n0", 64_000, 64_000, node("n0", 2).gpus, max_pods=2)])
    for name in ("a", "b"):
        place_on(state, share_pod(name, 100), "n0")
    plan = plan_eviction(state, share_pod("p", 100), BINPACK, victims={"a": 0, "b": 0}, max_victims=1)
    assert plan is not None and len(plan.victims) == 1 and plan.placement.node == "n0"


def test_a_pod_short_of_another_resource_evicts_the_pod_holding_it() -> None:
    """n0's one FPGA is held by a low-priority CPU-only pod: a pod that needs it preempts that pod, and not
    the one holding the CPU it does not lack."""
    spec = NodeSpec("n0", 64_000, 64_000, node("n0", 1).gpus, scalars=(("example.com/fpga", 1),))
    state = ClusterState([spec])
    state.apply(Placement("fpga", "n0", 1_000, scalars=(("example.com/fpga", 1),)))
    state.apply(Placement("busy", "n0", 40_000))
    wanting = replace(share_pod("p", 100), scalars=(("example.com/fpga", 1),))
    plan = plan_eviction(state, wanting, BINPACK, victims={"busy": 0, "fpga": 0}, max_victims=1)
    assert plan is not None and plan.victims == ("fpga",)


def test_among_victims_otherwise_alike_the_plan_loses_the_least_work() -> None:
    """An eviction throws away what the victim ran: of two pods of one priority, the one that ran less goes,
    whether they are on different nodes or on different GPUs of one node."""
    state = cluster(("old", 600, "n0", TS), ("new", 600, "n1", TS))
    for lost, gone in (({"old": 9e6, "new": 60.0}, "new"), ({"old": 60.0, "new": 9e6}, "old")):
        plan = plan_eviction(
            state, whole_pod("w"), BINPACK, victims={"old": 1, "new": 1}, max_victims=1, lost=lost
        )
        assert plan is not None and plan.victims == (gone,)
    one_node = ClusterState([node("n0", 2)])
    place_on(one_node, share_pod("old", 600), "n0")
    place_on(one_node, share_pod("new", 600), "n0")
    lost = {"old": 9e6, "new": 60.0}
    plan = plan_eviction(
        one_node, whole_pod("w"), BINPACK, victims={"old": 1, "new": 1}, max_victims=1, lost=lost
    )
    assert plan is not None and plan.victims == ("new",)
    # Priority still comes first: the lower one goes however long it ran.
    plan = plan_eviction(
        one_node, whole_pod("w"), BINPACK, victims={"old": 0, "new": 1}, max_victims=1, lost=lost
    )
    assert plan is not None and plan.victims == ("old",)


def test_the_rules_of_the_pods_placed_take_the_fewest_more_victims_on_the_node_and_few_looks() -> None:
    """`allows` stands for the scheduler's inter-pod rules: every node rules the pod out while a pod named
    `shy-*` is on it. The plan takes the shy pod of one node (not its bystander, nor pods elsewhere), and,
    where no node can be opened by its own pods, gives up after a bounded number of one-node looks."""
    nodes = 200
    state = ClusterState([node(f"n{i:03}", 1) for i in range(nodes)])
    for i in range(nodes):
        place_on(state, share_pod(f"by-{i:03}", 100, cpu=0), f"n{i:03}")
        place_on(state, share_pod(f"shy-{i:03}", 100, cpu=0), f"n{i:03}")
    looks: list[int] = []

    def allows(rows: Any, gone: Any) -> Any:
        looks.append(len(rows))
        return np.array([f"shy-{row:03}" in gone for row in rows.tolist()])

    victims = {name: 1 for name in state.placements}
    pending, rows = share_pod("p", 500), np.arange(nodes)
    planned = plan_eviction(state, pending, BINPACK, victims=victims, max_victims=3, rows=rows, allows=allows)
    assert planned is not None and len(planned.victims) == 1 and planned.victims[0].startswith("shy-")
    assert planned.placement.node == f"n{planned.victims[0][4:]}"

    def never(rows: Any, gone: Any) -> Any:
        looks.append(len(rows))
        return np.zeros(len(rows), bool)

    looks.clear()
    assert (
        plan_eviction(state, pending, BINPACK, victims=victims, max_victims=3, rows=rows, allows=never)
        is None
    )
    assert sum(1 for size in looks if size == 1) <= Looks().left

    looks.clear()  # a gang's members share the plan's looks, however many they are
    gang = [(share_pod(f"p{i}", 500), rows, allows) for i in range(10)]
    plan_gang_eviction(state, gang, BINPACK, victims=victims, max_victims=30)
    assert sum(1 for size in looks if size == 1) < 2 * Looks().left  # the looks, and a few trials' checks
