"""The upper bound against brute force on clusters small enough to try every placement: never below the
best placement, and equal to it where the LP's constraints capture the whole problem."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufrac.cluster.model import GpuSpec, NodeSpec
from gpufrac.sim.bound import upper_bound
from gpufrac.sim.trace import TracePod


def node(name: str, cpu: int, gpus: int, model: str = "T4") -> NodeSpec:
    return NodeSpec(name, cpu, 64_000, tuple(GpuSpec(g, f"{name}-{g}", model, 16_000) for g in range(gpus)))


def pod(i: int, cpu: int, gpus: int, milli: int, models: frozenset[str] | None = None) -> TracePod:
    return TracePod(f"p{i}", cpu, 1_000, gpus, milli, models)


def best(nodes: list[NodeSpec], pods: list[TracePod]) -> int:
    """The most GPU-milli any placement allocates: every pod dropped or put on every GPU choice that fits
    the engine's rules (CPU, memory, model; whole GPUs only where nothing else is; shares within 1000)."""
    cpu = [n.cpu_milli for n in nodes]
    free = [[1000] * len(n.gpus) for n in nodes]

    def search(i: int) -> int:
        if i == len(pods):
            return 0
        p = pods[i]
        top = search(i + 1)
        for n, spec in enumerate(nodes):
            if p.cpu_milli > cpu[n] or (p.gpu_spec is not None and spec.model not in p.gpu_spec):
                continue
            whole = p.gpu_milli >= 1000
            choices = (
                itertools.combinations([g for g, f in enumerate(free[n]) if f == 1000], p.num_gpu)
                if whole
                else ((g,) for g, f in enumerate(free[n]) if f >= p.gpu_milli)
            )
            for gpus in choices:
                cpu[n] -= p.cpu_milli
                for g in gpus:
                    free[n][g] -= p.gpu_milli if not whole else 1000
                top = max(top, p.num_gpu * p.gpu_milli + search(i + 1))
                cpu[n] += p.cpu_milli
                for g in gpus:
                    free[n][g] += p.gpu_milli if not whole else 1000
        return top

    return search(0)


@pytest.mark.parametrize(
    ("nodes", "pods", "optimum"),
    [
        # Two shares over half a GPU cannot share it: the naive LP splits one and says 1000.
        ([node("a", 8_000, 1)], [pod(0, 1, 1, 600), pod(1, 1, 1, 600)], 600),
        # Three shares above a third: two per GPU at most.
        ([node("a", 8_000, 1)], [pod(i, 1, 1, 400) for i in range(3)], 800),
        # An 810 leaves 190: a second 810 cannot use it, the 160 can (the naive LP says 1000).
        ([node("a", 8_000, 1)], [pod(0, 1, 1, 810), pod(1, 1, 1, 810), pod(2, 1, 1, 160)], 970),
        # A whole GPU cannot take a share's leftover: one GPU, a 300 share and a whole-GPU pod.
        ([node("a", 8_000, 1)], [pod(0, 1, 1, 300), pod(1, 1, 1, 1000)], 1000),
        # Two-GPU pods on 3-GPU nodes: one per node, never two across a node boundary.
        ([node("a", 8_000, 3), node("b", 8_000, 3)], [pod(i, 1, 2, 1000) for i in range(3)], 4000),
        # CPU: a pod asking 6 of 8 cores per node leaves room for no second one.
        ([node("a", 8_000, 2), node("b", 8_000, 2)], [pod(i, 6_000, 1, 1000) for i in range(3)], 2000),
        # A pod tied to P100 on a T4-only cluster cannot go anywhere.
        ([node("a", 8_000, 2)], [pod(0, 1, 1, 1000, frozenset({"P100"})), pod(1, 1, 1, 500)], 500),
    ],
)
def test_tight_where_the_constraints_capture_the_problem(
    nodes: list[NodeSpec], pods: list[TracePod], optimum: int
) -> None:
    assert best(nodes, pods) == optimum
    assert upper_bound(nodes, pods).milli == pytest.approx(optimum, abs=0.01)


SHAPES = st.tuples(
    st.sampled_from([0, 1_000, 3_000, 5_000]),
    st.sampled_from([0, 1, 1, 1, 2]),
    st.sampled_from([160, 300, 470, 500, 650, 810, 1000]),
    st.sampled_from([None, frozenset({"T4"}), frozenset({"P100"})]),
)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([4_000, 8_000]), st.integers(1, 3), st.sampled_from(["T4", "P100"])),
        min_size=1,
        max_size=3,
    ),
    st.lists(SHAPES, min_size=1, max_size=6),
)
def test_never_below_the_best_placement(
    node_specs: list[tuple[int, int, str]],
    pod_specs: list[tuple[int, int, int, frozenset[str] | None]],
) -> None:
    nodes = [node(f"n{i}", cpu, gpus, model) for i, (cpu, gpus, model) in enumerate(node_specs)]
    pods = [
        pod(i, cpu, gpus, 1000 if gpus > 1 else milli if gpus else 0, models)
        for i, (cpu, gpus, milli, models) in enumerate(pod_specs)
    ]
    found = upper_bound(nodes, pods)
    assert best(nodes, pods) <= found.milli <= found.arrived_milli
