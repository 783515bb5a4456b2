"""Guaranteed compute: on a node labelled for it, the compute caps of the sm-sharing shares on one GPU add
up to 100% at most (an uncapped share counts 100); elsewhere caps stack freely, as before."""

from __future__ import annotations

import pytest

from gpufrac.cluster.invariants import violations
from gpufrac.cluster.model import Assignment, PodDemand
from gpufrac.cluster.state import ClusterState, PlacementRefused
from gpufrac.contract.model import ShareRequest
from gpufrac.placement.filters import COMPUTE_CAPS_FULL
from gpufrac.placement.framework import POLICIES

from ..cluster.builders import SM, TS, assert_same, node, portion, share_at, share_pod, snapshot
from .builders import place, policy, refused

ALL_POLICIES = sorted(POLICIES)


def guaranteed(gpus: int = 1) -> ClusterState:
    return ClusterState([node("g", gpus, guaranteed=True)])


def test_the_state_refuses_caps_past_100_on_a_guaranteed_gpu_and_changes_nothing() -> None:
    state = guaranteed()
    state.apply(share_at("a", "g", (0,), 1_000, mode=SM, cap=60))
    before = snapshot(state, with_version=True)
    with pytest.raises(PlacementRefused, match="compute caps on GPU 0 would add up to 101%"):
        state.apply(share_at("b", "g", (0,), 1_000, mode=SM, cap=41))
    assert_same(before, snapshot(state, with_version=True))
    state.apply(share_at("c", "g", (0,), 1_000, mode=SM, cap=40))
    assert state.gpu_compute[0, 0] == 100
    assert violations(state) == []


def test_an_uncapped_sm_sharing_share_claims_the_whole_gpu_there() -> None:
    state = guaranteed()
    state.apply(share_at("a", "g", (0,), 1_000, mode=SM))
    assert state.gpu_compute[0, 0] == 100
    with pytest.raises(PlacementRefused, match="would add up to 101%"):
        state.apply(share_at("b", "g", (0,), 1_000, mode=SM, cap=1))


def test_without_the_guarantee_caps_stack_past_100() -> None:
    state = ClusterState([node("n", 1)])
    for name in "abc":
        state.apply(share_at(name, "n", (0,), 1_000, mode=SM, cap=50))
    assert state.gpu_compute[0, 0] == 150
    assert violations(state) == []


def test_time_slicing_shares_claim_no_compute_and_stack_as_before() -> None:
    state = guaranteed()
    for name in "abc":
        state.apply(share_at(name, "g", (0,), 1_000, mode=TS))
    assert state.gpu_compute[0, 0] == 0


def test_release_frees_the_claim_on_every_gpu_of_the_share() -> None:
    state = guaranteed(2)
    state.apply(share_at("a", "g", (0, 1), 1_000, mode=SM, cap=70))
    state.apply(share_at("b", "g", (1,), 1_000, mode=SM, cap=30))
    state.release("a")
    assert state.gpu_compute[0, :2].tolist() == [0, 30]
    state.apply(share_at("c", "g", (0, 1), 1_000, mode=SM, cap=70))
    assert state.gpu_compute[0, :2].tolist() == [70, 100]


def test_violations_recompute_the_caps_from_the_placements() -> None:
    state = guaranteed()
    for name, cap in (("a", 80), ("b", 30)):  # planted past `apply`, which would refuse the second
        state.placements[name] = share_at(name, "g", (0,), 1_000, mode=SM, cap=cap)
    assert violations(state) == ["g GPU 0: compute caps add up to 110% on a node that guarantees compute"]


def test_the_node_spec_keeps_the_guarantee() -> None:
    assert guaranteed().node_spec("g").compute_guarantee
    assert not ClusterState([node("n")]).node_spec("n").compute_guarantee


@pytest.mark.parametrize("name", ALL_POLICIES)
def test_the_engine_puts_a_share_where_its_cap_fits_and_says_why_when_none_does(name: str) -> None:
    state = ClusterState([node("g", 2, guaranteed=True), node("n", 1)])
    state.apply(share_at("a", "g", (0,), 1_000, mode=SM, cap=70))
    state.apply(share_at("b", "g", (1,), 1_000, mode=SM, cap=50))
    state.apply(share_at("c", "n", (0,), 1_000, mode=SM, cap=100))
    placed = place(state, share_pod("p", 100, mode=SM, cap=50, models=["T4"]), policy(name))
    assert (placed.node, placed.assignments[0].gpus) in {("g", (1,)), ("n", (0,))}
    assert placed.assignments[0].compute_percent == 50
    state.release(placed.pod)
    state.remove_node("n")
    assert refused(state, share_pod("q", 100, mode=SM, cap=51), policy(name)).reasons == {
        COMPUTE_CAPS_FULL: 1
    }
    assert refused(state, share_pod("r", 100, mode=SM), policy(name)).reasons == {COMPUTE_CAPS_FULL: 1}


def test_the_unguaranteed_node_takes_the_share_the_guaranteed_one_refuses() -> None:
    state = ClusterState([node("g", 1, guaranteed=True), node("n", 1)])
    state.apply(share_at("a", "g", (0,), 1_000, mode=SM, cap=90))
    state.apply(share_at("b", "n", (0,), 1_000, mode=SM, cap=90))
    assert place(state, share_pod("p", 100, mode=SM, cap=20), policy("bestfit")).node == "n"


def test_the_exact_search_keeps_caps_within_100_across_a_pod_s_shares() -> None:
    state = guaranteed(2)
    shares = tuple(ShareRequest(c, portion(100), portion(100), SM, 1, 60) for c in ("x", "y"))
    placed = place(state, PodDemand("p", shares=shares), policy("bestfit"))
    assert {a.gpus for a in placed.assignments} == {(0,), (1,)}
    assert all(a.compute_percent == 60 for a in placed.assignments)
    assert refused(guaranteed(1), PodDemand("q", shares=shares), policy("bestfit")).reasons == {
        "no combination of GPUs fits every container": 1
    }


def test_an_assignment_claims_its_cap_only_when_sm_sharing() -> None:
    assignment = Assignment("main", (0,), 1, 1, SM, 30)
    assert assignment.compute_claim == 30
    assert Assignment("main", (0,), 1, 1, TS).compute_claim == 0
    assert Assignment("main", (0,), 1, 1, None).compute_claim == 0
    assert Assignment("main", (0,), 1, 1, SM).compute_claim == 100
