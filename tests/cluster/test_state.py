"""`ClusterState`: apply and release keep the books, and every refusal leaves the state untouched."""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufrac.cluster.invariants import violations
from gpufrac.cluster.model import Assignment, NodeSpec, Placement, Unschedulable, milli_of, resolve_mib
from gpufrac.cluster.state import MODE_CODE, MODE_NONE, ClusterState, PlacementRefused
from gpufrac.contract.model import ComputeMode, Mebibytes, Portion
from gpufrac.placement.engine import decide
from gpufrac.placement.framework import POLICIES

from ..placement.builders import place, policy
from .builders import GPU_MIB, SM, TS, assert_same, node, share_at, share_pod, snapshot, whole_at, whole_pod


@pytest.fixture
def state() -> ClusterState:
    return ClusterState([node("a", 2, cpu=8_000, mem=16_384), node("b", 4)])


def test_apply_then_release_restores_every_array(state: ClusterState) -> None:
    before = snapshot(state)
    placements = [
        share_at("s1", "a", (0,), 4_000, limit=9_000, cpu=1_000, mem=512),
        share_at("s2", "a", (0,), 6_000, cpu=2_000),
        share_at("s3", "b", (1, 2), 3_000, mode=SM),
        whole_at("w1", "a", (1,)),
        Placement("cpu-only", "b", cpu_milli=3_000, memory_mib=1_024),
    ]
    for placement in placements:
        state.apply(placement)
    assert violations(state) == []
    assert state.gpu_free[0, 0] == GPU_MIB - 10_000
    assert state.gpu_tenants[0, 0] == 2
    assert state.gpu_whole[0, 1] and state.gpu_free[0, 1] == 0
    assert state.gpu_mode[1, 1] == state.gpu_mode[1, 2] == MODE_CODE[SM]
    assert state.cpu_free[0] == 5_000 and state.mem_free[0] == 16_384 - 512
    for placement in reversed(placements[::2] + placements[1::2]):
        assert state.release(placement.pod) == placement
    assert_same(before, snapshot(state))


def test_every_mutation_bumps_the_node_version(state: ClusterState) -> None:
    versions = state.version.copy()
    state.apply(share_at("p", "a", (0,), 1_000))
    state.release("p")
    state.set_gpu_health("a", 1, healthy=False)
    assert state.version[0] == versions[0] + 3
    assert state.version[1] == versions[1]


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_engine_placements_round_trip_for_every_policy(state: ClusterState, name: str) -> None:
    before = snapshot(state)
    chosen = policy(name)
    pods = [whole_pod("w", 2), share_pod("m", 400, mode=SM)] + [
        share_pod(f"s{i}", 300, cpu=500) for i in range(6)
    ]
    for pod in pods:
        place(state, pod, chosen)
    assert violations(state) == []
    for pod in pods:
        state.release(pod.name)
    assert_same(before, snapshot(state))


def _setup_used(state: ClusterState) -> None:
    state.apply(share_at("ts", "a", (0,), 10_000, cpu=1_000))
    state.apply(share_at("sm", "b", (0,), 2_000, mode=SM))
    state.apply(whole_at("whole", "b", (1,)))


def two_containers(*containers: tuple[str, int, int, ComputeMode | None]) -> Placement:
    """A pod on node b whose containers each take `MiB` on one GPU, in the given mode (None: whole)."""
    assignments = tuple(Assignment(name, (gpu,), mib, mib, mode) for name, gpu, mib, mode in containers)
    return Placement("p", "b", cpu_milli=1_000, assignments=assignments)


REFUSALS = [
    pytest.param(share_at("ts", "a", (1,), 1_000), "already placed", id="double-placement"),
    pytest.param(share_at("p", "a", (1,), 1_000, cpu=7_001), "not enough CPU or memory", id="cpu"),
    pytest.param(share_at("p", "a", (1,), 1_000, mem=16_385), "not enough CPU or memory", id="memory"),
    pytest.param(share_at("p", "a", (0,), 6_001), "6000 MiB unrequested", id="oversubscribed-gpu-memory"),
    pytest.param(share_at("p", "a", (0,), 1_000, mode=SM), "time-slicing mode", id="sm-on-time-sliced"),
    pytest.param(share_at("p", "b", (0,), 1_000, mode=TS), "sm-sharing mode", id="time-sliced-on-sm"),
    pytest.param(whole_at("p", "a", (0,)), "must be empty", id="whole-on-used-gpu"),
    pytest.param(
        replace(share_at("p", "b", (0,), 1_000, mode=SM), fault_domain="other"),
        "another fault domain",
        id="sm-sharing-across-fault-domains",
    ),
    pytest.param(share_at("p", "b", (1,), 1_000), "held whole", id="share-on-whole-gpu"),
    pytest.param(whole_at("p", "b", (1,)), "held whole", id="whole-on-whole-gpu"),
    pytest.param(share_at("p", "a", (1,), 1_000, limit=GPU_MIB + 1), "limit", id="limit-above-gpu-memory"),
    pytest.param(share_at("p", "a", (1,), 2_000, limit=1_000), "request", id="request-above-limit"),
    pytest.param(share_at("p", "a", (1,), 0), "1 <= request", id="zero-request"),
    pytest.param(share_at("p", "a", (7,), 1_000), "no GPU 7", id="no-such-gpu"),
    pytest.param(share_at("p", "a", (1, 1), 1_000), "distinct GPUs", id="repeated-gpu"),
    pytest.param(share_at("p", "a", (), 1_000), "at least one", id="no-gpu"),
    pytest.param(share_at("p", "nowhere", (0,), 1_000), "not in the cluster", id="unknown-node"),
    pytest.param(
        two_containers(("one", 2, 9_000, TS), ("two", 2, 8_000, TS)),
        "GPU 2 has 16000 MiB unrequested",
        id="two-containers-oversubscribe-one-gpu",
    ),
    pytest.param(
        two_containers(("one", 2, 1_000, TS), ("two", 2, 1_000, SM)),
        "GPU 2 is in time-slicing mode",
        id="two-containers-mix-modes",
    ),
    pytest.param(
        two_containers(("one", 3, 1_000, TS), ("two", 3, GPU_MIB, None)),
        "must be empty",
        id="share-then-whole",
    ),
    pytest.param(
        two_containers(("one", 3, GPU_MIB, None), ("two", 3, 1_000, TS)), "held whole", id="whole-then-share"
    ),
    pytest.param(
        two_containers(("ok", 2, 1_000, TS), ("bad", 0, 1_000, TS)),
        "container bad",
        id="valid-container-then-invalid-one",
    ),
]


@pytest.mark.parametrize(("placement", "reason"), REFUSALS)
def test_refusals_name_the_rule_and_change_nothing(
    state: ClusterState, placement: Placement, reason: str
) -> None:
    _setup_used(state)
    before = snapshot(state, with_version=True)
    with pytest.raises(PlacementRefused, match=reason):
        state.apply(placement)
    assert_same(before, snapshot(state, with_version=True))
    assert violations(state) == []


def test_unhealthy_gpu_takes_no_new_share_but_keeps_the_old_one(state: ClusterState) -> None:
    state.apply(share_at("old", "a", (0,), 4_000))
    state.set_gpu_health("a", 0, healthy=False)
    assert "old" in state.placements
    before = snapshot(state, with_version=True)
    for placement in (share_at("new", "a", (0,), 1_000), whole_at("new", "a", (0,))):
        with pytest.raises(PlacementRefused, match="GPU 0 is unhealthy"):
            state.apply(placement)
    assert_same(before, snapshot(state, with_version=True))
    with pytest.raises(PlacementRefused, match="no GPU 2"):
        state.set_gpu_health("a", 2, healthy=False)
    state.set_gpu_health("a", 0, healthy=True)
    state.apply(share_at("new", "a", (0,), 1_000))


def test_a_released_pod_is_restored_to_its_unhealthy_gpu_and_only_health_is_overlooked(
    state: ClusterState,
) -> None:
    """Trials release pods and put them back (`placement.defrag`, `placement.preemption`): a pod on a GPU
    that went unhealthy under it must come back, not be refused on the way back and lost."""
    old = share_at("old", "a", (0,), 4_000)
    state.apply(old)
    state.set_gpu_health("a", 0, healthy=False)
    before = snapshot(state)
    state.restore(state.release("old"))
    assert_same(before, snapshot(state))
    state.release("old")
    with pytest.raises(PlacementRefused, match="is unhealthy"):
        state.apply(old)
    state.set_gpu_health("a", 0, healthy=True)
    state.apply(share_at("big", "a", (0,), GPU_MIB - 1_000))
    state.set_gpu_health("a", 0, healthy=False)
    with pytest.raises(PlacementRefused, match="unrequested"):
        state.restore(old)  # every other invariant still holds it back


def test_mode_is_set_by_the_first_share_and_clears_when_the_gpu_empties(state: ClusterState) -> None:
    state.apply(share_at("x", "b", (0,), 1_000, mode=SM))
    state.apply(share_at("y", "b", (0,), 1_000, mode=SM))
    state.release("x")
    assert state.gpu_mode[1, 0] == MODE_CODE[SM]
    with pytest.raises(PlacementRefused, match="sm-sharing mode"):
        state.apply(share_at("z", "b", (0,), 1_000, mode=TS))
    state.release("y")
    assert state.gpu_mode[1, 0] == MODE_NONE
    state.apply(share_at("z", "b", (0,), 1_000, mode=TS))
    assert state.gpu_mode[1, 0] == MODE_CODE[TS]


def test_whole_gpu_release_frees_it_for_shares(state: ClusterState) -> None:
    state.apply(whole_at("w", "a", (0, 1)))
    assert state.gpu_free[0, :2].tolist() == [0, 0]
    state.release("w")
    assert state.gpu_free[0, :2].tolist() == [GPU_MIB, GPU_MIB]
    assert not state.gpu_whole[0].any()
    state.apply(share_at("s", "a", (0, 1), GPU_MIB))


def test_remove_node_releases_its_pods_and_nothing_lands_there_again(state: ClusterState) -> None:
    on_a = [share_at("s", "a", (0,), 4_000, cpu=1_000), whole_at("w", "a", (1,))]
    for placement in on_a:
        state.apply(placement)
    state.apply(share_at("elsewhere", "b", (0,), 4_000))
    released = state.remove_node("a")
    assert sorted(released, key=lambda p: p.pod) == sorted(on_a, key=lambda p: p.pod)
    assert set(state.placements) == {"elsewhere"}
    assert not state.active[0] and state.pods_on[0] == set()
    assert state.cpu_free[0] == 8_000 and state.gpu_free[0, :2].tolist() == [GPU_MIB, GPU_MIB]
    with pytest.raises(PlacementRefused, match="not in the cluster"):
        state.apply(share_at("again", "a", (0,), 1_000))
    for _ in range(4):
        assert place(state, share_pod("p", 100), policy("bestfit")).node == "b"
        state.release("p")
    state.add_node(node("a", 1))  # the same name comes back as a fresh node
    assert state.active[0] and state.gpu_count[0] == 1


def test_only_a_node_without_pods_can_be_redefined(state: ClusterState) -> None:
    state.apply(share_at("s", "a", (0,), 1_000))
    with pytest.raises(PlacementRefused, match="holds pods"):
        state.add_node(node("a", 4))
    state.release("s")
    state.add_node(node("a", 3, memory=24_000, model="A10"))
    assert state.node_spec("a") == node("a", 3, memory=24_000, model="A10")


def test_gpu_indices_must_be_dense(state: ClusterState) -> None:
    spec = node("c", 2)
    with pytest.raises(PlacementRefused, match="GPU indices"):
        state.add_node(NodeSpec("c", 1_000, 1_000, spec.gpus[1:]))


def test_a_wider_node_grows_the_arrays_and_keeps_what_was_there() -> None:
    state = ClusterState([node("a", 1)])
    state.apply(share_at("s", "a", (0,), 5_000))
    for i in range(5):
        state.add_node(node(f"n{i}", 8, memory=32_000))
    assert state.width == 8
    assert state.gpu_free[0, 0] == GPU_MIB - 5_000 and state.gpu_mem[0, 1:].tolist() == [0] * 7
    assert state.tie_rank[:6].tolist() == list(range(6))
    assert [state.node_spec(name) for name in state.names] == [node("a", 1)] + [
        node(f"n{i}", 8, memory=32_000) for i in range(5)
    ]
    assert violations(state) == []


def test_violations_recompute_from_placements_alone(state: ClusterState) -> None:
    # Bypass `apply` to plant broken placements; `violations` must see each of them.
    broken = [
        share_at("big", "a", (0,), 12_000, limit=GPU_MIB + 5, mode=SM, cpu=9_000),
        share_at("other", "a", (0,), 6_000),
        whole_at("whole", "b", (2,)),
        share_at("beside", "b", (2,), 1_000),
        Placement("twice", "b", assignments=(Assignment("main", (1, 1), 100, 100, TS),)),
    ]
    for placement in broken:
        state.placements[placement.pod] = placement
    problems = "\n".join(violations(state))
    assert "a: pods request more CPU or memory" in problems
    assert "a GPU 0: 18000 MiB requested of 16000 MiB" in problems
    assert "a GPU 0: mixes compute modes" in problems
    assert f"big: limit {GPU_MIB + 5} MiB above GPU 0" in problems
    assert "b GPU 2: a whole GPU is shared" in problems
    assert "twice: a multi-device share repeats a GPU" in problems


def test_amounts_resolve_to_mib_and_thousandths() -> None:
    assert resolve_mib(Mebibytes(5_000), 16_000) == 5_000
    assert resolve_mib(Portion(Fraction(1, 3)), 16_000) == 5_333
    assert resolve_mib(Portion(Fraction(1, 3)), 16_384) == 5_461
    assert milli_of(Mebibytes(5_000), 16_000) == 313  # rounded up
    assert milli_of(Portion(Fraction(1, 3)), 16_000) == 334


@given(
    st.fractions(min_value=0, max_value=1).filter(lambda p: p > 0),
    st.integers(min_value=1, max_value=200_000),
)
def test_a_portion_resolves_to_its_floor_and_never_exceeds_the_gpu(portion: Fraction, memory: int) -> None:
    resolved = resolve_mib(Portion(portion), memory)
    assert 0 <= resolved <= memory
    assert resolved <= portion * memory < resolved + 1
    assert 0 < milli_of(Portion(portion), memory) <= 1000


def test_unschedulable_message_counts_nodes_by_reason() -> None:
    reasons = {"GPU mode is sm-sharing": 2, "not enough GPU memory": 3}
    assert (
        Unschedulable("p", reasons).message
        == "0/5 nodes are available: 3 not enough GPU memory, 2 GPU mode is sm-sharing"
    )
    assert Unschedulable("p", {}).message == "no nodes in the cluster"


def test_an_empty_cluster_fits_nothing() -> None:
    outcome = decide(ClusterState(), share_pod("p", 500), policy("fgd"))
    assert isinstance(outcome, Unschedulable) and outcome.reasons == {}


def test_free_milli_is_zero_for_missing_gpus(state: ClusterState) -> None:
    state.apply(share_at("s", "a", (0,), 4_000))
    assert state.free_milli()[0].tolist() == [750, 1000, 0, 0]
    assert np.array_equal(state.gpu_mem[0] > 0, [True, True, False, False])


def test_a_gpus_fault_domain_is_its_sm_sharing_shares_and_goes_with_the_last(state: ClusterState) -> None:
    first = replace(share_at("s1", "b", (0,), 1_000, mode=SM), fault_domain="team-a")
    second = replace(share_at("s2", "b", (0,), 1_000, mode=SM), fault_domain="team-a")
    state.apply(first)
    state.apply(second)
    code = state.domains["team-a"]
    assert state.gpu_domain[1, 0] == code and violations(state) == []
    state.release("s1")
    assert state.gpu_domain[1, 0] == code
    state.release("s2")
    assert state.gpu_domain[1, 0] == 0
    state.apply(replace(share_at("s3", "b", (0,), 1_000, mode=SM), fault_domain="team-b"))
    assert state.gpu_domain[1, 0] == state.domains["team-b"]
