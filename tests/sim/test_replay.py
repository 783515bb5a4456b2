"""The arrival sweep: the order pods arrive in, the allocation curve, and replays whose outcome is obvious."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufrac.cluster.invariants import violations
from gpufrac.cluster.model import GpuSpec, NodeSpec, Placement, PodDemand
from gpufrac.cluster.state import ClusterState
from gpufrac.errors import UserError
from gpufrac.placement.cache import Hashed, shape_key
from gpufrac.placement.engine import decide
from gpufrac.placement.framework import POLICIES, PolicyContext
from gpufrac.placement.workload import Shape, Workload
from gpufrac.sim import replay, trace


def gpu_node(name: str, gpus: int, *, cpu: int = 64_000) -> NodeSpec:
    return NodeSpec(name, cpu, 262_144, tuple(GpuSpec(i, f"{name}-{i}", "T4", 16_000) for i in range(gpus)))


def pod(name: str, num_gpu: int = 1, gpu_milli: int = 500, *, cpu: int = 1_000) -> trace.TracePod:
    return trace.TracePod(name, cpu, 1_024, num_gpu, gpu_milli if num_gpu else 0, None)


def tiny(*pods: trace.TracePod, gpus: tuple[int, ...] = (2, 2)) -> trace.Trace:
    return trace.Trace("tiny", tuple(gpu_node(f"n{i}", count) for i, count in enumerate(gpus)), pods)


def order_of(workload: trace.Trace, seed: int = 0, inflation: float = 1.3) -> list[trace.TracePod]:
    return replay.arrival_order(workload, np.random.default_rng(seed), inflation=inflation)


# ---- arrival order -----------------------------------------------------------------------------------------


def test_every_original_pod_arrives_once_then_samples_until_the_target() -> None:
    originals = tiny(pod("a"), pod("b"), pod("c"))  # 1.5 GPUs requested of 4
    order = order_of(originals)
    # 1.3 x 4 GPUs = 5200 milli; half-GPU pods stop at 5000, since one more would pass the target
    assert len(order) == 10
    assert sorted(p.name for p in order[:3]) == ["a", "b", "c"]
    assert all("-tuned-" in p.name for p in order[3:])
    assert [p.name.split("-tuned-")[1] for p in order[3:]] == [str(i) for i in range(3, 10)]
    assert len({p.name for p in order}) == 10


@given(st.integers(0, 2**32 - 1), st.floats(0.1, 3.0))
def test_the_stop_rule_compares_each_sampled_pods_per_gpu_share(seed: int, inflation: float) -> None:
    mixed = tiny(pod("share", 1, 300), pod("whole", 1, 1000), pod("two", 2, 1000), pod("cpu", 0), gpus=(4, 4))
    order = order_of(mixed, seed, inflation)
    assert sorted(p.name for p in order[:4]) == ["cpu", "share", "two", "whole"]
    target = inflation * mixed.gpus * 1000
    total = sum(p.gpu_demand_milli for p in order[:4])
    for sampled in order[4:]:
        assert total + sampled.gpu_milli <= target
        total += sampled.gpu_demand_milli
    # Stopping means the next draw would have passed the target: at most a 1000-milli step short of it.
    assert total + 1000 > target


def test_the_order_is_seeded_and_independent_of_the_file_order() -> None:
    pods = [pod(f"p{i}", 1, 100 * (i % 9 + 1)) for i in range(30)]
    forward, backward = tiny(*pods), tiny(*reversed(pods))
    assert order_of(forward, 5) == order_of(backward, 5)
    assert order_of(forward, 5) != order_of(forward, 6)


def test_no_sampling_without_gpu_pods_or_below_the_original_demand() -> None:
    cpu_only = tiny(pod("a", 0), pod("b", 0))
    assert sorted(p.name for p in order_of(cpu_only)) == ["a", "b"]
    busy = tiny(*(pod(f"p{i}", 1, 1000) for i in range(6)))  # 6 GPUs asked of 4
    assert len(order_of(busy, inflation=1.3)) == 6


def test_a_trace_of_tiny_requests_never_draws_past_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """One pod of 1 milli-GPU asks 5,200 draws to reach 1.3 x 4 GPUs (on openb's cluster, 8 million): the
    order stops at the bound with a one-line error instead of drawing them all."""
    monkeypatch.setattr(replay, "MAX_ARRIVALS", 100)
    with pytest.raises(UserError, match=r"at --inflation 1\.3: more than 100 pods would arrive") as raised:
        order_of(tiny(pod("one-milli", 1, 1)))
    assert "--pods" in str(raised.value) and "\n" not in str(raised.value)
    assert len(order_of(tiny(pod("tenth", 1, 100)))) == 52  # 5,200 milli in draws of 100: under the bound


def test_expected_arrivals_is_about_what_the_order_yields() -> None:
    mixed = tiny(pod("share", 1, 300), pod("whole", 1, 1000), pod("cpu", 0), gpus=(8, 8))
    expected = replay.expected_arrivals(mixed, inflation=1.3)
    counts = [len(order_of(mixed, seed)) for seed in range(30)]
    assert sum(counts) / len(counts) == pytest.approx(expected, rel=0.1)
    assert replay.expected_arrivals(tiny(pod("a", 0), pod("b", 0)), inflation=1.3) == 2  # nothing drawn
    busy = tiny(*(pod(f"p{i}", 1, 1000) for i in range(6)))  # 6 GPUs asked of 4: nothing drawn
    assert replay.expected_arrivals(busy, inflation=1.3) == 6


def test_a_run_expecting_more_than_the_bound_is_refused_before_any_draw() -> None:
    openb_sized = trace.Trace("one", tuple(gpu_node(f"n{i}", 64) for i in range(100)), (pod("p1", 1, 1),))
    with pytest.raises(UserError, match=r"one at --inflation 1\.3: about 8,320,000 pods would arrive"):
        replay.check_arrivals(openb_sized, inflation=1.3)
    # The paper's traces are far below it, even at the largest inflation the command allows.
    replay.check_arrivals(trace.load(), inflation=10)
    assert replay.expected_arrivals(trace.load(), inflation=10) < replay.MAX_ARRIVALS / 10


# ---- allocation curve --------------------------------------------------------------------------------------


def test_allocation_curve_averages_the_pods_of_each_percent() -> None:
    arrived = np.array([100, 196, 204, 300])
    used = np.array([100, 150, 200, 200])
    # 19.6% and 20.4% both round to 20: their allocations 15% and 20% average to 17.5
    assert replay.allocation_curve(arrived, used, 1000) == {10: 10.0, 20: 17.5, 30: 20.0}


@given(
    st.lists(st.tuples(st.integers(0, 3000), st.integers(0, 100)), min_size=1, max_size=60),
    st.integers(1, 20_000),
)
def test_allocation_curve_is_monotone_and_below_the_diagonal(
    steps: list[tuple[int, int]], capacity: int
) -> None:
    arrived_steps = np.array([step for step, _ in steps])
    used_steps = arrived_steps * np.array([percent for _, percent in steps]) // 100  # a pod is placed or not
    arrived, used = np.cumsum(arrived_steps), np.cumsum(used_steps)
    curve = replay.allocation_curve(arrived, used, capacity)
    buckets = np.round(100 * arrived / capacity).astype(int)
    assert list(curve) == sorted(set(buckets.tolist()))
    values = list(curve.values())
    assert values == sorted(values)
    allocation = 100 * used / capacity
    for x, value in curve.items():
        members = allocation[buckets == x]
        assert members.min() - 0.01 <= value <= members.max() + 0.01
        assert value <= x + 0.51


# ---- replays -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_pods_that_all_fit_are_all_placed(policy: str) -> None:
    halves = tiny(*(pod(f"p{i}") for i in range(4)), gpus=(1, 1))
    result = replay.replay(halves, policy=policy, seed=1, inflation=1.0)
    assert result.allocation == {25: 25.0, 50: 50.0, 75: 75.0, 100: 100.0}
    assert (result.pods, result.failed_pods, result.policy, result.seed) == (4, 0, policy, 1)
    # against 0.5-GPU tasks, 0.5 free is no fragmentation, and a full cluster has none to fragment
    assert result.fragmentation == {25: 0.0, 50: 0.0, 75: 0.0, 100: 0.0}


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_a_pod_that_cannot_fit_is_dropped(policy: str) -> None:
    crowded = tiny(pod("a", 1, 600), pod("b", 1, 600), gpus=(1,))
    result = replay.replay(crowded, policy=policy, seed=3, inflation=1.2)
    assert result.allocation == {60: 60.0, 120: 60.0}
    assert result.failed_pods == 1
    assert result.failures == {60: {}, 120: {"not enough GPU memory": 1}}
    # 0.4 left on the only GPU cannot take a 0.6 task: all of it is fragmentation, 40% of the cluster
    assert result.fragmentation == {60: 40.0, 120: 40.0}


def test_a_shape_that_fit_nowhere_is_dropped_again_without_a_decision(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Nothing leaves a replay without moves: the rest of its pods are dropped as it was."""
    decided: list[str] = []

    def counted(state: ClusterState, demand: PodDemand, *args: Any, **kwargs: Any) -> object:
        decided.append(demand.name)
        return decide(state, demand, *args, **kwargs)

    monkeypatch.setattr(replay, "decide", counted)
    crowded = tiny(*(pod(f"p{i}", 1, 600) for i in range(4)), pod("small", 1, 300), gpus=(1,))
    result = replay.replay(crowded, policy="bestfit", seed=3, inflation=6.0)
    assert result.failed_pods == result.pods - 2  # one 0.6 and one 0.3 share fit the GPU
    assert sum(result.failures[max(result.failures)].values()) == result.failed_pods
    # Per shape, the pod placed and the first refused: the others are dropped unasked.
    per_shape = Counter(name[0] for name in decided)
    assert per_shape["p"] == 2 and per_shape["s"] <= 2 and result.pods > 6
    decided.clear()
    moving = replay.replay(crowded, policy="bestfit", seed=3, inflation=6.0, move_budget=50)
    assert len(decided) == moving.pods  # moves free room: every pod is decided


def test_cpu_only_pods_take_cpu_but_no_arrival() -> None:
    cpu_bound = trace.Trace(
        "cpu", (gpu_node("n", 1, cpu=2_000),), (pod("big-cpu", 0, cpu=4_000), pod("g", 1, 1000, cpu=1_000))
    )
    result = replay.replay(cpu_bound, policy="bestfit", seed=0, inflation=1.0)
    assert result.failed_pods == 1 and result.allocation[100] == 100.0
    assert sum(result.failures[100].values()) == 1 and "not enough CPU" in result.failures[100]


def test_the_same_seed_replays_the_same_run() -> None:
    pods = [pod(f"p{i}", 1 + (i % 7 == 0), 1000 if i % 7 == 0 else 100 * (i % 9 + 1)) for i in range(40)]
    mixed = tiny(*pods, gpus=(4, 4, 2, 8, 1))
    calls: list[tuple[int, int]] = []
    for policy in ("fgd", "random", "clustering"):
        first = replay.replay(
            mixed, policy=policy, seed=9, on_pod=lambda done, total: calls.append((done, total))
        )
        again = replay.replay(mixed, policy=policy, seed=9)
        assert outcome(first) == outcome(again)
        other = replay.replay(mixed, policy=policy, seed=10)
        assert other.pods != first.pods or other.allocation != first.allocation
    assert calls[:2] == [(1, first.pods), (2, first.pods)] and calls[first.pods - 1] == (
        first.pods,
        first.pods,
    )


def outcome(result: replay.RunResult) -> tuple[object, ...]:
    """Everything a run decides, leaving out how long it took."""
    return (result.allocation, result.fragmentation, result.failures, result.failed_pods, result.pods)


def test_main_reason_is_the_one_that_rejected_most_nodes() -> None:
    assert replay.main_reason({"not enough CPU": 2, "not enough GPU memory": 3}) == "not enough GPU memory"
    assert replay.main_reason({"b": 2, "a": 2}) == "a"
    assert replay.main_reason({}) == "no nodes"


def test_the_target_workload_is_the_traces_own_pods() -> None:
    workload = replay.target_workload(tiny(pod("a"), pod("b"), pod("c", 0)))
    assert workload.shapes == (Shape(1_000, 1, 500), Shape(1_000, 0, 0))
    assert workload.weights.tolist() == pytest.approx([2 / 3, 1 / 3])


def test_fgd_reproduces_the_published_allocation_on_the_openb_trace() -> None:
    """The one full replay: fgd, seed 42, bundled trace. Published 95.14 for this seed (Weng et al.)."""
    result = replay.replay(trace.load(), policy="fgd", seed=42)
    assert 94.7 <= result.allocation[100] <= 95.8
    assert result.allocation[70] == pytest.approx(70, abs=0.6)  # below ~80% arrival everything fits


# ---- moves (defragmentation) -------------------------------------------------------------------------------


def halves_then_a_whole_gpu() -> tuple[trace.Trace, int]:
    """Two one-GPU nodes, two half-GPU shares and a whole-GPU pod; and a seed whose order brings the whole
    GPU last, when `spread` has put the halves on different GPUs."""
    workload = tiny(pod("a"), pod("b"), pod("w", gpu_milli=1_000), gpus=(1, 1))
    seed = next(s for s in range(100) if order_of(workload, s, inflation=1.0)[-1].name == "w")
    return workload, seed


def test_a_move_budget_lets_a_pod_in_that_fits_only_once_a_share_moves() -> None:
    workload, seed = halves_then_a_whole_gpu()
    kept = replay.replay(workload, policy="spread", seed=seed, inflation=1.0)
    moved = replay.replay(workload, policy="spread", seed=seed, inflation=1.0, move_budget=100)
    assert (kept.failed_pods, moved.failed_pods) == (1, 0)
    last = moved.moves[max(moved.moves)]
    assert (last.arrivals, last.moves, last.moved_gpus) == (3, 1, 0.5)
    assert moved.label == "spread +moves 100" and kept.label == "spread"


@pytest.mark.parametrize("budget", [10, 40])
def test_moves_stay_within_the_budget_at_every_point(budget: float) -> None:
    """A budget under one move per arrival in three: the one move is not allowed before enough arrivals."""
    workload, seed = halves_then_a_whole_gpu()
    run = replay.replay(workload, policy="spread", seed=seed, inflation=1.0, move_budget=budget)
    for tally in run.moves.values():
        assert tally.moves <= budget * tally.arrivals / 100
    assert run.failed_pods == (0 if budget * 3 / 100 >= 1 else 1)


def test_a_moved_share_that_fits_nowhere_makes_room_of_its_own() -> None:
    """n0's GPU opens once its 0.6 share moves, and no GPU has 0.6 free until n1's 0.2 share moves into n2's
    0.2 hole. Opening n1 instead would put its 0.4 share on n0, whose CPU the 0.6 share holds."""
    state = ClusterState((gpu_node("n0", 1, cpu=8_000), gpu_node("n1", 1), gpu_node("n2", 1)))
    chosen = POLICIES["binpack"](PolicyContext(rng=np.random.default_rng(0), workload=Workload.from_pods([])))
    mover = replay._Mover(state, chosen, 100, Workload.from_pods([]))
    for name, milli, cpu, on in [
        ("a", 600, 7_000, "n0"),
        ("x", 400, 2_000, "n1"),
        ("s", 200, 1_000, "n1"),
        ("y", 800, 1_000, "n2"),
    ]:
        demand = pod(name, 1, milli, cpu=cpu).demand()
        outcome = decide(state, demand, chosen, rows=np.array([state.index[on]]))
        assert isinstance(outcome, Placement)
        state.apply(outcome)
        mover.placed(demand, arrivals=1)
    room = mover.make_room(pod("w", 1, 1_000).demand(), arrivals=100)
    assert room is not None and room.node == "n0"
    assert (mover.moves, mover.moved_gpus) == (2, pytest.approx(0.8))
    assert {name: state.placements[name].node for name in "asxy"} == {
        "a": "n1",
        "s": "n2",
        "x": "n1",
        "y": "n2",
    }
    state.apply(room)
    assert violations(state) == []


@pytest.mark.parametrize(
    ("budget", "arrivals", "moved"), [(100, replay.TIDY_EVERY, 1), (100, 1, 0), (15, 20, 0)]
)
def test_the_mover_tidies_every_so_many_arrivals_and_keeps_moves_for_a_pod_that_fails(
    budget: float, arrivals: int, moved: int
) -> None:
    """A lone 0.3 share joins a 0.6 one, freeing its GPU; not between looks, nor when the budget has only
    the moves a failing pod may need (15 per 100 arrivals allow 3 by arrival 20)."""
    state = ClusterState((gpu_node("n0", 1), gpu_node("n1", 1)))
    chosen = POLICIES["binpack"](PolicyContext(rng=np.random.default_rng(0), workload=Workload.from_pods([])))
    whole = Workload.from_pods([pod("w", 1, 1_000).demand()])
    mover = replay._Mover(state, chosen, budget, whole)
    for name, milli, on in [("a", 300, "n0"), ("b", 600, "n1")]:
        demand = pod(name, 1, milli).demand()
        outcome = decide(state, demand, chosen, rows=np.array([state.index[on]]))
        assert isinstance(outcome, Placement)
        state.apply(outcome)
        mover.placed(demand, arrivals=arrivals if name == "b" else 1)
    assert mover.moves == moved and state.placements["a"].node == ("n1" if moved else "n0")
    assert mover.moved_gpus == pytest.approx(0.3 * moved)


def test_pods_of_one_shape_share_one_shape_key_and_only_they_do() -> None:
    """The replay hands `decide` one shape key object per shape: each must be the pod's own shape, so that
    no two shapes share the memos' entries."""
    pods = replay.arrival_order(trace.load(), np.random.default_rng(0), inflation=1.3)
    demands = [pod.demand() for pod in pods]
    keys = replay._shape_keys(pods)
    assert all(key == Hashed(shape_key(demand)) for key, demand in zip(keys, demands, strict=True))
    assert len({id(key) for key in keys}) == len({shape_key(demand) for demand in demands})
