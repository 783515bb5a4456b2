"""Defragmentation plans (`placement.defrag`) on clusters small enough to work out by hand, and a property:
any plan, carried out move by move, is accepted by the state and lets the pod in."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufrac.cluster.invariants import violations
from gpufrac.cluster.model import Placement, PodDemand
from gpufrac.cluster.state import ClusterState
from gpufrac.placement.defrag import Room, plan_room, tidy
from gpufrac.placement.engine import decide
from gpufrac.placement.workload import Shape

from ..cluster.builders import node, share_pod, whole_pod
from .builders import policy, workload

BINPACK = "binpack"


def cluster(*gpus_per_node: int, cpu: int = 64_000) -> ClusterState:
    return ClusterState(node(f"n{i}", gpus, cpu=cpu) for i, gpus in enumerate(gpus_per_node))


def place_on(state: ClusterState, demand: PodDemand, on: str) -> None:
    outcome = decide(state, demand, policy(BINPACK), rows=np.array([state.index[on]]))
    assert isinstance(outcome, Placement), outcome
    state.apply(outcome)


def placed(state: ClusterState, *pods: tuple[PodDemand, str]) -> dict[str, PodDemand]:
    """Place each pod on the named node; the movable pods, by name."""
    for demand, on in pods:
        place_on(state, demand, on)
    return {demand.name: demand for demand, _ in pods}


def snapshot(state: ClusterState) -> tuple[object, ...]:
    return (
        dict(state.placements),
        state.cpu_free.tolist(),
        state.gpu_free.tolist(),
        state.gpu_tenants.tolist(),
        state.gpu_mode.tolist(),
    )


def carry_out(state: ClusterState, room: Room) -> None:
    for move in room.moves:
        state.release(move.source.pod)
    for move in room.moves:
        state.apply(move.target)
    state.apply(room.placement)


def test_the_fewest_moves_win_and_the_state_is_left_as_found() -> None:
    """n0's GPU holds two 0.3 shares, n1's one 0.4 share: moving the 0.4 into n0's free 0.4 opens n1 in one
    move, where opening n0 would take two."""
    state = cluster(1, 1)
    movable = placed(
        state, (share_pod("a", 300), "n0"), (share_pod("b", 300), "n0"), (share_pod("c", 400), "n1")
    )
    before = snapshot(state)
    room = plan_room(state, whole_pod("w"), policy(BINPACK), movable=movable, max_moves=3)
    assert snapshot(state) == before
    assert room is not None and room.placement.node == "n1"
    assert [(m.source.pod, m.source.node, m.target.node) for m in room.moves] == [("c", "n1", "n0")]
    carry_out(state, room)
    assert violations(state) == []


def test_pods_that_did_not_opt_in_never_move() -> None:
    state = cluster(1, 1)
    movable = placed(
        state, (share_pod("a", 300), "n0"), (share_pod("b", 300), "n0"), (share_pod("c", 400), "n1")
    )
    del movable["c"]
    room = plan_room(state, whole_pod("w"), policy(BINPACK), movable=movable, max_moves=3)
    assert room is not None and room.placement.node == "n0"
    assert sorted(m.source.pod for m in room.moves) == ["a", "b"]
    assert {m.target.node for m in room.moves} == {"n1"}
    assert plan_room(state, whole_pod("w"), policy(BINPACK), movable=movable, max_moves=1) is None


def test_no_plan_when_the_moved_pods_have_nowhere_to_go() -> None:
    state = cluster(1, 1)
    movable = placed(state, (share_pod("a", 600), "n0"), (share_pod("b", 600), "n1"))
    assert plan_room(state, share_pod("p", 500), policy(BINPACK), movable=movable, max_moves=3) is None


def test_cpu_taken_by_a_movable_pod_is_freed_for_a_stranded_gpu() -> None:
    """n0's GPU is free but a CPU-only pod holds its CPU; n1 has CPU but its GPU is taken whole."""
    state = cluster(1, 1, cpu=8_000)
    place_on(state, whole_pod("keep"), "n1")
    movable = placed(state, (PodDemand("cpu", cpu_milli=6_000), "n0"))
    room = plan_room(state, whole_pod("w", cpu=4_000), policy(BINPACK), movable=movable, max_moves=1)
    assert room is not None and room.placement.node == "n0"
    assert [(m.source.pod, m.target.node) for m in room.moves] == [("cpu", "n1")]


def test_a_moved_pod_that_fits_nowhere_gets_room_by_moving_a_smaller_one() -> None:
    """Opening n0 means moving its 0.5 share, and no GPU has 0.5 free: n1 has it once n1's 0.2 share moves
    into n2's 0.2 hole. Opening n1 or n2 would mean moving a pod that did not opt in."""
    state = cluster(1, 1, 1)
    place_on(state, share_pod("big", 500), "n1")
    place_on(state, share_pod("keep", 800), "n2")
    movable = placed(state, (share_pod("a", 500), "n0"), (share_pod("small", 200), "n1"))
    before = snapshot(state)
    assert plan_room(state, whole_pod("w"), policy(BINPACK), movable=movable, max_moves=1) is None
    room = plan_room(state, whole_pod("w"), policy(BINPACK), movable=movable, max_moves=2)
    assert snapshot(state) == before
    assert room is not None and room.placement.node == "n0"
    assert [(m.source.pod, m.source.node, m.target.node) for m in room.moves] == [
        ("small", "n1", "n2"),
        ("a", "n0", "n1"),
    ]
    carry_out(state, room)
    assert violations(state) == []


def room_for_whole_gpu(
    state: ClusterState, movable: dict[str, PodDemand], where: Callable[[str], np.ndarray | None]
) -> Room | None:
    return plan_room(state, whole_pod("w"), policy(BINPACK), movable=movable, max_moves=3, where=where)


def test_a_moved_pod_goes_only_where_it_may() -> None:
    """c (0.4) could move into n0's free 0.4 and open n1, but it may run only on n1 (its node selector):
    the plan moves a and b off n0 instead, to n1; kept to no node at all, they have nowhere to go."""
    state = cluster(1, 1)
    movable = placed(
        state, (share_pod("a", 300), "n0"), (share_pod("b", 300), "n0"), (share_pod("c", 400), "n1")
    )
    n1 = np.array([state.index["n1"]])
    room = room_for_whole_gpu(state, movable, lambda name: n1 if name == "c" else None)
    assert room is not None and room.placement.node == "n0"
    assert sorted((m.source.pod, m.target.node) for m in room.moves) == [("a", "n1"), ("b", "n1")]
    assert room_for_whole_gpu(state, movable, lambda name: n1[:0]) is None


def test_a_hop_makes_room_for_a_moved_pod_only_where_it_may_go() -> None:
    """As the hop test above, but a may run only on n2, where no hop opens 0.5: no plan (a plan for it on n1
    would leave it pending once moved)."""
    state = cluster(1, 1, 1)
    place_on(state, share_pod("big", 500), "n1")
    place_on(state, share_pod("keep", 800), "n2")
    movable = placed(state, (share_pod("a", 500), "n0"), (share_pod("small", 200), "n1"))
    n2 = np.array([state.index["n2"]])
    assert room_for_whole_gpu(state, movable, lambda name: None) is not None
    assert room_for_whole_gpu(state, movable, lambda name: n2 if name == "a" else None) is None


def test_no_moves_allowed_no_plan() -> None:
    state = cluster(1, 1)
    movable = placed(state, (share_pod("a", 300), "n0"), (share_pod("c", 400), "n1"))
    assert plan_room(state, whole_pod("w"), policy(BINPACK), movable=movable, max_moves=0) is None


def test_without_copies_the_state_and_leaves_it_alone() -> None:
    state = cluster(2)
    placed(state, (share_pod("a", 300, cpu=1_000), "n0"))
    before = snapshot(state)
    copy = state.without(["a", "not-placed"])
    assert snapshot(state) == before
    assert copy.placements == {} and copy.cpu_free[0] == 64_000 and int(copy.gpu_tenants.sum()) == 0
    assert copy.serial != state.serial


def test_a_pod_on_a_gpu_gone_unhealthy_is_weighed_and_put_back() -> None:
    """Pod a holds all of n0's CPU on GPU 0, which then went unhealthy: a plan or a tidy that weighs moving it
    puts it back afterwards, where `apply` would refuse it (no new share on an unhealthy GPU) and lose it."""
    state = cluster(2, 1, cpu=4_000)
    movable = placed(state, (share_pod("a", 250, cpu=4_000), "n0"))
    state.set_gpu_health("n0", 0, healthy=False)
    before = snapshot(state)
    n0 = np.array([state.index["n0"]])
    pod = share_pod("p", 500, cpu=1_000)
    room = plan_room(state, pod, policy(BINPACK), movable=movable, max_moves=1, rows=n0)
    assert snapshot(state) == before
    assert room is not None and [(m.source.node, m.target.node) for m in room.moves] == [("n0", "n1")]
    assert tidy(state, policy(BINPACK), WHOLE_GPUS, movable=movable, max_moves=1) == ()
    assert snapshot(state) == before


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nodes=st.lists(st.integers(1, 3), min_size=1, max_size=4),
    shares=st.lists(st.sampled_from([100, 250, 300, 400, 500, 700]), max_size=12),
    pending=st.one_of(st.sampled_from([300, 500, 800]), st.just(0)),
    max_moves=st.integers(0, 3),
    policy_name=st.sampled_from(["binpack", "fgd", "spread"]),
)
def test_any_plan_carried_out_is_valid_and_lets_the_pod_in(
    nodes: list[int], shares: list[int], pending: int, max_moves: int, policy_name: str
) -> None:
    state = cluster(*nodes)
    chosen = policy(policy_name)
    movable: dict[str, PodDemand] = {}
    for i, milli in enumerate(shares):
        demand = share_pod(f"s{i}", milli)
        outcome = decide(state, demand, chosen)
        if isinstance(outcome, Placement):
            state.apply(outcome)
            if i % 3:  # every third pod did not opt in
                movable[demand.name] = demand
    pod = share_pod("p", pending) if pending else whole_pod("p")
    before = snapshot(state)
    room = plan_room(state, pod, chosen, movable=movable, max_moves=max_moves)
    assert snapshot(state) == before
    if room is None:
        return
    assert 1 <= len(room.moves) <= max_moves
    assert {m.source.pod for m in room.moves} <= set(movable)
    carry_out(state, room)
    assert violations(state) == []
    assert room.placement.pod in state.placements


@pytest.mark.parametrize("name", ["binpack", "fgd", "fgd-stranding"])
def test_no_pod_is_moved_for_nothing(name: str) -> None:
    """Where the pod fits as the cluster stands, there is no plan: moving would only cost."""
    state = cluster(2)
    movable = placed(state, (share_pod("a", 300), "n0"))
    assert plan_room(state, share_pod("p", 300), policy(name), movable=movable, max_moves=2) is None


WHOLE_GPUS = workload((Shape(cpu_milli=0, gpus=1, milli=1_000), 1.0))


def test_tidying_moves_a_lone_share_into_a_hole_and_frees_its_gpu() -> None:
    """For a workload of whole GPUs every partly free GPU is fragmentation: 0.7 + 0.4 before, 0.1 once the
    0.3 share joins the 0.6."""
    state = cluster(1, 1)
    movable = placed(state, (share_pod("a", 300), "n0"), (share_pod("b", 600), "n1"))
    before = snapshot(state)
    moves = tidy(state, policy(BINPACK), WHOLE_GPUS, movable=movable, max_moves=2)
    assert snapshot(state) == before
    assert [(m.source.pod, m.source.node, m.target.node) for m in moves] == [("a", "n0", "n1")]
    for move in moves:
        state.release(move.source.pod)
        state.apply(move.target)
    assert violations(state) == [] and int(state.gpu_tenants[state.index["n0"]].sum()) == 0
    assert tidy(state, policy(BINPACK), WHOLE_GPUS, movable=movable, max_moves=2) == ()


def test_tidying_moves_nothing_it_is_not_allowed_to_or_that_has_nowhere_better() -> None:
    state = cluster(1, 1)
    movable = placed(state, (share_pod("a", 300), "n0"), (share_pod("b", 600), "n1"))
    assert tidy(state, policy(BINPACK), WHOLE_GPUS, movable=movable, max_moves=0) == ()
    only_b = tidy(state, policy(BINPACK), WHOLE_GPUS, movable={"b": movable["b"]}, max_moves=2)
    assert [(m.source.pod, m.target.node) for m in only_b] == [("b", "n0")]
    crowded = cluster(1, 1)
    movable = placed(crowded, (share_pod("a", 700), "n0"), (share_pod("b", 700), "n1"))
    assert tidy(crowded, policy(BINPACK), WHOLE_GPUS, movable=movable, max_moves=2) == ()
