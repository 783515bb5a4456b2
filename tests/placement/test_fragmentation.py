"""The fragmentation measure of fgd.md, case by case, and the target workload it is measured against."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufrac.cluster.model import PodDemand, milli_of
from gpufrac.cluster.state import ClusterState
from gpufrac.contract.model import Mebibytes, ShareRequest
from gpufrac.placement.fragmentation import (
    cluster_fragmentation,
    fragmentation_after_share,
    growth_after_share,
    node_fragmentation,
    usable_free_milli,
)
from gpufrac.placement.workload import Shape, Workload

from ..cluster.builders import node, share_at, share_pod, whole_at, whole_pod
from .builders import workload

CPU_ONLY = Shape(cpu_milli=1_000, gpus=0, milli=0)
HALF = Shape(cpu_milli=0, gpus=1, milli=500)
WHOLE = Shape(cpu_milli=0, gpus=1, milli=1000)
TWO_WHOLE = Shape(cpu_milli=0, gpus=2, milli=1000)


def fragmentation(free: list[int], shape: Shape, *, cpu: int = 64_000, model_ok: bool = True) -> float:
    """F_n(m) of one node with GPUs `free` (milli) against a workload of the single shape m."""
    return float(
        node_fragmentation(np.array([free]), np.array([cpu]), np.array([[model_ok]]), workload((shape, 1.0)))[
            0
        ]
    )


@pytest.mark.parametrize(
    ("free", "shape", "kwargs", "expected"),
    [
        # a shape that asks for no GPU: every unallocated GPU share
        ([300, 1000, 0], CPU_ONLY, {}, 1300),
        # shapes that cannot run on the node at all: every unallocated GPU share
        ([300, 1000], Shape(8_000, 1, 200), {"cpu": 4_000}, 1300),
        ([300, 500], Shape(0, 1, 800), {}, 800),
        ([300, 1000], Shape(0, 1, 200), {"model_ok": False}, 1300),
        ([1000, 400, 200], TWO_WHOLE, {}, 1600),
        # shapes that fit: only GPUs with less free than the per-GPU demand count
        ([300, 600, 1000, 0], HALF, {}, 300),
        ([500, 499, 1000], HALF, {}, 499),
        ([300, 1000], Shape(8_000, 1, 200), {"cpu": 8_000}, 0),
        # whole-GPU shapes: every partly used GPU counts
        ([300, 600, 1000], WHOLE, {}, 900),
        ([1000, 1000, 400], TWO_WHOLE, {}, 400),
        ([0, 0], WHOLE, {}, 0),
    ],
)
def test_node_fragmentation_per_shape(
    free: list[int], shape: Shape, kwargs: dict[str, int | bool], expected: float
) -> None:
    assert fragmentation(free, shape, **kwargs) == expected  # type: ignore[arg-type]


def test_node_fragmentation_is_the_weighted_sum_over_shapes() -> None:
    free = np.array([[300, 600, 1000]])
    target = workload((HALF, 0.25), (CPU_ONLY, 0.5), (WHOLE, 0.25))
    result = node_fragmentation(free, np.array([64_000]), np.ones((1, 3), bool), target)
    assert result.tolist() == [0.25 * 300 + 0.5 * 1900 + 0.25 * 900]


def test_node_fragmentation_broadcasts_over_leading_dimensions_to_the_last_bit() -> None:
    """Exactly, not approximately: scores are truncated to whole numbers, so a node measured alone and in a
    batch (as the memos of FGD measure it, depending on what changed) must not differ even in rounding."""
    rng = np.random.default_rng(3)
    free = rng.integers(0, 1001, size=(3, 5, 4))
    cpu = rng.choice([2_000, 64_000], size=(3, 5))
    shapes = [HALF, Shape(4_000, 2, 300), TWO_WHOLE, *(Shape(0, 1, milli) for milli in range(50, 1000, 37))]
    weights = rng.random(len(shapes))
    target = workload(*zip(shapes, weights / weights.sum(), strict=True))
    model_ok = rng.random((3, 5, len(shapes))) < 0.8
    batched = node_fragmentation(free, cpu, model_ok, target)
    assert batched.shape == (3, 5)
    for i in range(3):
        for j in range(5):
            one = node_fragmentation(free[i, j][None], cpu[i, j][None], model_ok[i, j][None], target)
            assert batched[i, j] == one[0]


def test_cluster_fragmentation_counts_only_what_a_new_task_could_use() -> None:
    state = ClusterState(
        [
            node("a", 2),
            node("b", 3, unhealthy=(1,)),
            node("gone", 2),
            node("cpu-only", 0),
            node("a100", 1, model="A100"),
        ]
    )
    state.apply(share_at("s", "a", (0,), 4_800))
    state.apply(whole_at("w", "b", (2,)))
    state.apply(share_at("t", "a100", (0,), 3_200))
    state.remove_node("gone")
    assert usable_free_milli(state)[state.index["b"]].tolist() == [1000, 0, 0]
    shape = Shape(cpu_milli=0, gpus=1, milli=800)
    # a: 700 on GPU 0 is too little for 0.8; b: the unhealthy and whole GPUs have nothing to give
    assert cluster_fragmentation(state, workload((shape, 1.0))).tolist() == [700, 0, 0, 0]
    only_a100 = Shape(cpu_milli=0, gpus=1, milli=800, models=frozenset({"A100"}))
    # on nodes that are not A100 the shape cannot run at all, so all their free share counts; the A100
    # has exactly 0.8 free, which the shape can use
    assert cluster_fragmentation(state, workload((only_a100, 1.0))).tolist() == [1700, 1000, 0, 0]


def test_model_ok_is_per_known_model_and_shape() -> None:
    target = workload((Shape(0, 1, 500, frozenset({"A100"})), 0.5), (HALF, 0.5))
    assert target.model_ok(["", "T4", "A100"]).tolist() == [[False, True], [False, True], [True, True]]
    assert Workload((), np.zeros(0)).model_ok(["T4"]).shape == (1, 0)


# ---- the target workload -----------------------------------------------------------------------------------


def pods(*counts: tuple[PodDemand, int]) -> list[PodDemand]:
    return [pod for pod, count in counts for _ in range(count)]


def test_shapes_are_taken_until_they_cover_95_percent_including_the_crossing_one() -> None:
    cpu, half, whole, two = (
        PodDemand("c", cpu_milli=1_000),
        share_pod("h", 500),
        whole_pod("w"),
        whole_pod("t", 2),
    )
    chosen = Workload.from_pods(pods((cpu, 60), (half, 30), (whole, 6), (two, 4)))
    assert chosen.shapes == (CPU_ONLY, HALF, WHOLE)  # 90% after two shapes: the third crosses 95%
    assert chosen.weights.tolist() == pytest.approx([60 / 96, 30 / 96, 6 / 96])
    assert Workload.from_pods(pods((cpu, 50), (half, 30), (whole, 14), (two, 6))).shapes == (
        CPU_ONLY,
        HALF,
        WHOLE,
        TWO_WHOLE,
    )
    assert Workload.from_pods(pods((cpu, 80), (half, 15), (whole, 5))).shapes == (
        CPU_ONLY,
        HALF,
    )  # exactly 95%


def test_equally_common_shapes_go_larger_first() -> None:
    chosen = Workload.from_pods(
        pods(
            (share_pod("a", 300, cpu=1_000), 2),
            (share_pod("b", 700, cpu=1_000), 2),
            (share_pod("c", 100, cpu=2_000), 2),
            (share_pod("d", 900), 3),
        ),
        coverage=1.0,
    )
    assert chosen.shapes == (
        Shape(0, 1, 900),
        Shape(2_000, 1, 100),
        Shape(1_000, 1, 700),
        Shape(1_000, 1, 300),
    )
    assert chosen.cpu.tolist() == [0, 2_000, 1_000, 1_000]
    assert chosen.milli.tolist() == [900, 100, 700, 300]
    assert chosen.gpus.tolist() == [1, 1, 1, 1]


def test_shapes_from_mib_requests_models_and_devices() -> None:
    def mib(amount: int) -> PodDemand:
        return PodDemand("m", shares=(ShareRequest("main", Mebibytes(amount), Mebibytes(amount)),))

    chosen = Workload.from_pods(
        [mib(8_192), mib(40_000), whole_pod("w", 2, models=["A100"]), share_pod("s", 250, devices=3)],
        coverage=1.0,
    )
    assert set(chosen.shapes) == {
        Shape(0, 1, 500),  # 8192 MiB of the 16384 MiB reference GPU
        Shape(0, 1, 1000),  # more than a reference GPU is capped at a whole one
        Shape(0, 2, 1000, frozenset({"A100"})),
        Shape(0, 3, 250),
    }
    assert Workload.from_pods([mib(8_192)], reference_gpu_mib=32_768).shapes == (Shape(0, 1, 250),)


def test_no_pods_no_shapes() -> None:
    empty = Workload.from_pods([])
    assert empty.shapes == () and empty.weights.shape == (0,)


@given(
    st.lists(st.tuples(st.sampled_from([0, 1_000, 4_000]), st.sampled_from([0, 100, 500, 1000])), min_size=1)
)
def test_weights_sum_to_one_and_cover_the_requested_share(specs: list[tuple[int, int]]) -> None:
    demands = [
        PodDemand("c", cpu_milli=cpu) if milli == 0 else share_pod("s", milli, cpu=cpu)
        for cpu, milli in specs
    ]
    chosen = Workload.from_pods(demands)
    counts = [sum(_shape(pod) == shape for pod in demands) for shape in chosen.shapes]
    assert chosen.weights.sum() == pytest.approx(1.0)
    assert chosen.weights.tolist() == pytest.approx([count / sum(counts) for count in counts])
    assert counts == sorted(counts, reverse=True) and min(counts) > 0
    assert sum(counts) >= 0.95 * len(demands)  # enough shapes to cover 95% of the pods
    assert sum(counts) - counts[-1] < 0.95 * len(demands)  # and not one more


def _shape(pod: PodDemand) -> Shape:
    if not pod.shares:
        return Shape(pod.cpu_milli, 0, 0)
    return Shape(pod.cpu_milli, 1, milli_of(pod.shares[0].request, 16_384))


@given(
    free=st.lists(st.lists(st.integers(0, 1000), min_size=4, max_size=4), min_size=1, max_size=6),
    need=st.integers(1, 1000),
    cpu=st.integers(0, 16_000),
    model_ok=st.booleans(),
)
def test_fragmentation_after_share_is_that_of_each_hypothetical_node(
    free: list[list[int]], need: int, cpu: int, model_ok: bool
) -> None:
    """FGD's shortcut gives, bit for bit, the measure of every node with the share placed on each GPU."""
    target = workload((CPU_ONLY, 0.2), (HALF, 0.3), (WHOLE, 0.4), (TWO_WHOLE, 0.1))
    nodes = np.array(free)
    needs = np.full(len(nodes), need)
    cpu_free = np.full(len(nodes), cpu)
    allowed = np.full((len(nodes), len(target.shapes)), model_ok)
    hypothetical = np.repeat(nodes[:, None, :], nodes.shape[1], axis=1)
    diagonal = np.arange(nodes.shape[1])
    hypothetical[:, diagonal, diagonal] -= needs[:, None]
    expected = node_fragmentation(hypothetical, cpu_free[:, None], allowed[:, None, :], target)
    assert np.array_equal(fragmentation_after_share(nodes, cpu_free, allowed, needs, target), expected)


@given(
    free=st.lists(st.lists(st.integers(0, 1000), min_size=4, max_size=4), min_size=1, max_size=6),
    need=st.integers(1, 1000),
    cpu=st.integers(0, 16_000),
    pod_cpu=st.integers(0, 16_000),
    model_ok=st.booleans(),
)
def test_growth_after_share_is_the_hypothetical_nodes_measure_less_the_nodes_own(
    free: list[list[int]], need: int, cpu: int, pod_cpu: int, model_ok: bool
) -> None:
    """FGD's Δ for a share, bit for bit: the node as it is is measured from the sums the shortcut starts
    from, and must equal `node_fragmentation` of the node, however many nodes are measured with it."""
    target = workload((CPU_ONLY, 0.2), (HALF, 0.3), (WHOLE, 0.4), (TWO_WHOLE, 0.1))
    nodes = np.array(free)
    needs = np.full(len(nodes), need)
    cpu_free = np.full(len(nodes), cpu)
    allowed = np.full((len(nodes), len(target.shapes)), model_ok)
    after = fragmentation_after_share(nodes, cpu_free - pod_cpu, allowed, needs, target)
    before = np.array(
        [
            node_fragmentation(n[None], c[None], a[None], target)[0]
            for n, c, a in zip(nodes, cpu_free, allowed, strict=True)
        ]
    )
    growth = growth_after_share(nodes, cpu_free, cpu_free - pod_cpu, allowed, needs, target)
    assert np.array_equal(growth, after - before[:, None])


def test_a_workload_keeps_at_most_max_shapes_the_most_common_first() -> None:
    pods = [PodDemand(f"p{i}", cpu_milli=1_000 + i) for i in range(300)] + [
        PodDemand(f"common{i}", cpu_milli=500) for i in range(5)
    ]
    capped = Workload.from_pods(pods, max_shapes=10, coverage=1.0)
    assert len(capped.shapes) == 10
    assert capped.shapes[0].cpu_milli == 500 and capped.weights[0] == pytest.approx(5 / 14)  # of those kept
    assert len(Workload.from_pods(pods, coverage=1.0).shapes) == 301
