"""The whole-GPU reserve (`placement.reserve`): which shares it turns away, on clusters small enough to count
by hand, and that the rest of the engine (moves) honours it too."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from gpufrac.cluster.model import Placement, PodDemand
from gpufrac.cluster.state import ClusterState
from gpufrac.contract.model import ShareRequest
from gpufrac.placement.defrag import plan_room
from gpufrac.placement.engine import decide
from gpufrac.placement.framework import POLICIES, Policy
from gpufrac.placement.reserve import KEPT_WHOLE, WholeGpuReserve

from ..cluster.builders import node, portion, share_pod, whole_pod
from .builders import DETERMINISTIC, feasible_nodes, place, policy, refused


def reserving(name: str, percent: float) -> Policy:
    return dataclasses.replace(policy(name), reserve=WholeGpuReserve(percent))


def four_gpus() -> ClusterState:
    return ClusterState([node("a", 2), node("b", 2)])


@pytest.mark.parametrize("name", DETERMINISTIC)
def test_a_large_share_that_would_leave_too_few_empty_gpus_waits(name: str) -> None:
    state = four_gpus()
    chosen = reserving(name, 50)  # 2 of the 4 GPUs kept empty
    place(state, share_pod("first", 810), chosen)  # 3 empty left
    place(state, share_pod("second", 810), chosen)  # 2 empty left: as many as kept
    third = share_pod("third", 810)
    outcome = refused(state, third, chosen)
    assert outcome.reasons[KEPT_WHOLE] == len(feasible_nodes(state, third)) > 0  # it fit on those
    assert sum(outcome.reasons.values()) == 2
    assert "empty GPUs kept for whole-GPU pods" in outcome.message
    place(state, whole_pod("whole-0"), chosen)  # what the GPUs were kept for
    place(state, whole_pod("whole-1"), chosen)


@pytest.mark.parametrize(
    ("pod", "why"),
    [
        (share_pod("small", 690), "a share under 700 milli leaves a hole other shares fill"),
        (whole_pod("whole"), "whole-GPU pods are what the reserve keeps GPUs for"),
        (PodDemand("cpu", cpu_milli=1000), "a pod without a GPU opens none"),
    ],
)
def test_pods_that_strand_no_gpu_pass_whatever_is_left(pod: PodDemand, why: str) -> None:
    state = four_gpus()
    chosen = reserving("bestfit", 100)  # every GPU kept
    assert isinstance(place(state, pod, chosen), Placement), why


@pytest.mark.parametrize("memory", [16_000, 16_384, 81_559])
def test_seventy_percent_of_any_gpu_is_large(memory: int) -> None:
    # 0.7 of 16,384 MiB resolves to 11,468 MiB, a hair under 700 milli unless rounded back up.
    state = ClusterState([node("a", 2, memory=memory)])
    refused(state, share_pod("seventy", 700), reserving("bestfit", 100))
    place(state, share_pod("sixty-nine", 690), reserving("bestfit", 100))


def test_a_large_share_on_a_gpu_already_open_passes() -> None:
    state = four_gpus()
    place(state, share_pod("small", 100), policy("bestfit"))
    chosen = reserving("bestfit", 100)
    placed = place(state, share_pod("large", 810), chosen)  # best fit: onto the open GPU, opening none
    assert placed.assignments[0].gpus == place_of(state, "small")


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_a_large_share_the_reserve_keeps_off_an_empty_gpu_goes_to_a_used_one(name: str) -> None:
    # a's one GPU holds 200 milli; b and c are empty. 4 of the 5 GPUs kept: only a may take the share, which
    # a policy that spreads would have put on an empty GPU.
    state = ClusterState([node("a", 1), node("b", 2), node("c", 2)])
    place(state, share_pod("small", 200), policy("bestfit"))
    chosen = dataclasses.replace(policy(name), reserve=WholeGpuReserve(80))
    assert place(state, share_pod("large", 750), chosen).node == "a"
    outcome = refused(state, share_pod("next", 750), chosen)  # a is full: only empty GPUs are left
    assert outcome.reasons[KEPT_WHOLE] == 2


def place_of(state: ClusterState, pod: str) -> tuple[int, ...]:
    return state.placements[pod].assignments[0].gpus


def test_without_a_reserve_and_at_zero_every_share_that_fits_is_placed() -> None:
    for chosen in (policy("bestfit"), reserving("bestfit", 0)):
        state = four_gpus()
        for i in range(4):
            place(state, share_pod(f"s{i}", 810), chosen)


def test_the_reserve_counts_healthy_open_gpus_of_the_nodes_in_the_cluster() -> None:
    # 4 GPUs, 25% kept: one. A sick GPU is not empty room, so the second share already leaves too few.
    state = ClusterState([node("a", 2, unhealthy=[1]), node("b", 2)])
    chosen = reserving("bestfit", 25)
    place(state, share_pod("first", 810), chosen)  # empty: b0, b1 -> one left after the next
    place(state, share_pod("second", 810), chosen)  # leaves one: as many as kept
    refused(state, share_pod("third", 810), chosen)
    state.remove_node("b")  # now 2 GPUs, 1 kept (rounded up); a0 and a1 are not empty
    refused(state, share_pod("fourth", 810), chosen)


def test_a_share_across_devices_counts_every_gpu_it_opens() -> None:
    state = four_gpus()
    chosen = reserving("bestfit", 50)
    refused(state, share_pod("wide", 810, devices=3), chosen)  # would leave 1 of 4 empty, 2 kept
    place(state, share_pod("pair", 810, devices=2), chosen)  # leaves 2


@pytest.mark.parametrize(
    "split",
    [
        ((".", 710),),
        (("large", 650), ("small", 100)),  # together 750 of the GPU they open
        (("large", 710), ("tiny", 10)),  # a second container does not carry a large share past it
    ],
)
def test_a_pod_of_several_shares_is_held_to_the_reserve_as_one(split: tuple[tuple[str, int], ...]) -> None:
    state = four_gpus()
    chosen = reserving("bestfit", 100)  # every GPU kept: no large share may open one
    shares = tuple(ShareRequest(name, portion(milli), portion(milli)) for name, milli in split)
    refused(state, PodDemand("p", shares=shares), chosen)
    place(state, PodDemand("fine", shares=(ShareRequest("a", portion(400), portion(400)),)), chosen)


def test_moves_to_make_room_honour_the_reserve() -> None:
    # A whole-GPU pod needs a's CPU; a large movable share is in its way, and moving it opens an empty GPU.
    state = ClusterState([node("a", 2), node("b", 2, cpu=1000)])
    mover = share_pod("movable", 810)
    for pod in (mover, share_pod("fixed", 810)):
        outcome = decide(state, pod, policy("bestfit"), rows=np.array([state.index["a"]]))
        assert isinstance(outcome, Placement)
        state.apply(outcome)
    whole = whole_pod("whole", cpu=2000)
    movable = {mover.name: mover}
    assert plan_room(state, whole, reserving("bestfit", 25), movable=movable, max_moves=1) is not None
    # Kept: 2 of the 4 GPUs. With the pod on the share's GPU, b's 2 are empty; the share would leave 1.
    assert plan_room(state, whole, reserving("bestfit", 50), movable=movable, max_moves=1) is None
