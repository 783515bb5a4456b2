"""Pods with several share containers, or whole GPUs beside a share: the greedy per-node search."""

from __future__ import annotations

import pytest

from gpufrac.cluster.invariants import violations
from gpufrac.cluster.model import Assignment, PodDemand, Unschedulable
from gpufrac.cluster.state import ClusterState
from gpufrac.contract.model import ComputeMode, ShareRequest, WholeGpuRequest
from gpufrac.placement.engine import decide
from gpufrac.placement.framework import POLICIES

from ..cluster.builders import SM, TS, node, portion, share_at
from .builders import place, policy, refused

NO_COMBINATION = "no combination of GPUs fits every container"


def pod(*shares: tuple[str, int, ComputeMode, int], whole: int = 0, cpu: int = 0) -> PodDemand:
    """A pod with one share per (container, milli, mode, devices), and optionally whole GPUs."""
    return PodDemand(
        "p",
        cpu_milli=cpu,
        whole=(WholeGpuRequest("trainer", whole),) if whole else (),
        shares=tuple(
            ShareRequest(name, portion(milli), portion(milli), mode=mode, num_devices=devices)
            for name, milli, mode, devices in shares
        ),
    )


def test_two_containers_can_share_one_gpu() -> None:
    state = ClusterState([node("n", 1)])
    placement = place(state, pod(("a", 250, TS, 1), ("b", 250, TS, 1)), policy("bestfit"))
    assert placement.assignments == (
        Assignment("a", (0,), 4_000, 4_000, TS),
        Assignment("b", (0,), 4_000, 4_000, TS),
    )
    assert state.gpu_free[0, 0] == 8_000 and state.gpu_tenants[0, 0] == 2
    assert violations(state) == []


def test_two_modes_take_two_gpus_or_do_not_fit() -> None:
    two_modes = pod(("ts", 250, TS, 1), ("sm", 250, SM, 1))
    one_gpu = ClusterState([node("n", 1)])
    assert refused(one_gpu, two_modes, policy("bestfit")).reasons == {NO_COMBINATION: 1}
    two_gpus = ClusterState([node("n", 2)])
    placement = place(two_gpus, two_modes, policy("bestfit"))
    assert sorted(a.gpus for a in placement.assignments) == [(0,), (1,)]
    assert violations(two_gpus) == []


def test_the_larger_share_goes_first_onto_the_best_fitting_gpu() -> None:
    state = ClusterState([node("n", 2)])
    state.apply(share_at("x", "n", (0,), 8_000))  # GPU 0: 0.5 free
    state.apply(share_at("y", "n", (1,), 7_200))  # GPU 1: 0.55 free
    placement = place(state, pod(("small", 100, TS, 1), ("big", 500, TS, 1)), policy("bestfit"))
    assert placement.assignments == (
        Assignment("big", (0,), 8_000, 8_000, TS),
        Assignment("small", (1,), 1_600, 1_600, TS),
    )


def test_whole_gpus_take_the_highest_empty_gpus_and_shares_the_rest() -> None:
    state = ClusterState([node("n", 4)])
    state.apply(share_at("x", "n", (0,), 4_000))
    placement = place(state, pod(("infer", 500, TS, 1), whole=2), policy("bestfit"))
    assert placement.assignments == (
        Assignment("trainer", (2, 3), 16_000, 16_000, None),
        Assignment("infer", (0,), 8_000, 8_000, TS),
    )
    assert violations(state) == []


def test_whole_gpus_leave_nothing_for_the_share() -> None:
    state = ClusterState([node("n", 3, unhealthy=(2,))])
    outcome = refused(state, pod(("infer", 100, TS, 1), whole=2), policy("bestfit"))
    assert outcome.reasons == {NO_COMBINATION: 1}


def test_a_multi_device_share_beside_another_share() -> None:
    state = ClusterState([node("n", 2)])
    placement = place(state, pod(("wide", 500, TS, 2), ("narrow", 500, TS, 1)), policy("bestfit"))
    assert placement.assignments == (
        Assignment("wide", (0, 1), 8_000, 8_000, TS),
        Assignment("narrow", (0,), 8_000, 8_000, TS),
    )
    assert state.gpu_free[0, :2].tolist() == [0, 8_000]


def test_the_first_node_in_tie_order_that_fits_wins_and_the_others_are_counted() -> None:
    state = ClusterState([node("sm-only", 1), node("small-cpu", 2, cpu=1_000), node("b", 2), node("c", 2)])
    state.apply(share_at("sm", "sm-only", (0,), 1_000, mode=SM))
    state.tie_rank[:4] = [0, 1, 3, 2]
    two = pod(("a", 300, TS, 1), ("b", 300, SM, 1), cpu=2_000)
    assert place(state, two, policy("bestfit")).node == "c"
    state.release("p")
    state.remove_node("b")
    state.remove_node("c")
    outcome = refused(state, two, policy("bestfit"))
    assert outcome.reasons == {"not enough CPU": 1, NO_COMBINATION: 1}
    assert outcome.message == f"0/2 nodes are available: 1 {NO_COMBINATION}, 1 not enough CPU"


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_routes_these_pods_through_the_same_search(name: str) -> None:
    state = ClusterState([node("a", 2), node("b", 4)])
    state.apply(share_at("x", "a", (0,), 4_000))
    outcome = decide(state, pod(("one", 250, TS, 1), ("two", 500, SM, 2), whole=1), policy(name))
    assert not isinstance(outcome, Unschedulable)
    assert outcome.node == "b"
    assert outcome.assignments == (
        Assignment("trainer", (3,), 16_000, 16_000, None),
        Assignment("two", (0, 1), 8_000, 8_000, SM),
        Assignment("one", (2,), 4_000, 4_000, TS),
    )
