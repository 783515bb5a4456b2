"""Small builders for cluster tests: nodes, pods and placements in one line each, and state snapshots."""

from __future__ import annotations

from collections.abc import Iterable
from fractions import Fraction

import numpy as np

from gpufrac.cluster.model import Assignment, GpuSpec, NodeSpec, Placement, PodDemand
from gpufrac.cluster.state import ClusterState
from gpufrac.contract.model import ComputeMode, Portion, ShareRequest, WholeGpuRequest

TS = ComputeMode.TIME_SLICING
SM = ComputeMode.SM_SHARING
GPU_MIB = 16_000


def node(
    name: str,
    gpus: int = 2,
    *,
    memory: int = GPU_MIB,
    cpu: int = 64_000,
    mem: int = 262_144,
    model: str = "T4",
    unhealthy: Iterable[int] = (),
    guaranteed: bool = False,
) -> NodeSpec:
    sick = set(unhealthy)
    specs = tuple(GpuSpec(i, f"{name}-gpu{i}", model, memory, healthy=i not in sick) for i in range(gpus))
    return NodeSpec(name, cpu_milli=cpu, memory_mib=mem, gpus=specs, compute_guarantee=guaranteed)


def portion(milli: int) -> Portion:
    return Portion(Fraction(milli, 1000))


def share_pod(
    name: str,
    milli: int,
    *,
    cpu: int = 0,
    mem: int = 0,
    mode: ComputeMode = TS,
    devices: int = 1,
    limit: int | None = None,
    models: Iterable[str] | None = None,
    cap: int | None = None,
) -> PodDemand:
    """A pod with one share of `milli` thousandths of a GPU (limit likewise, default = request)."""
    share = ShareRequest("main", portion(milli), portion(limit or milli), mode, devices, cap)
    allowed = frozenset(models) if models is not None else None
    return PodDemand(name, cpu_milli=cpu, memory_mib=mem, shares=(share,), models=allowed)


def whole_pod(name: str, gpus: int = 1, *, cpu: int = 0, models: Iterable[str] | None = None) -> PodDemand:
    allowed = frozenset(models) if models is not None else None
    return PodDemand(name, cpu_milli=cpu, whole=(WholeGpuRequest("main", gpus),), models=allowed)


def share_at(
    pod: str,
    on: str,
    gpus: tuple[int, ...],
    request: int,
    *,
    limit: int | None = None,
    mode: ComputeMode = TS,
    cpu: int = 0,
    mem: int = 0,
    cap: int | None = None,
) -> Placement:
    """A hand-written placement of one share (MiB) on `gpus` of node `on`."""
    assignment = Assignment("main", gpus, request, request if limit is None else limit, mode, cap)
    return Placement(pod, on, cpu_milli=cpu, memory_mib=mem, assignments=(assignment,))


def whole_at(pod: str, on: str, gpus: tuple[int, ...], *, memory: int = GPU_MIB) -> Placement:
    return Placement(pod, on, assignments=(Assignment("main", gpus, memory, memory, None),))


def snapshot(state: ClusterState, *, with_version: bool = False) -> dict[str, object]:
    """Every array and bookkeeping field of `state`, copied, for before/after comparisons."""
    names = [*ClusterState._ROW_ARRAYS, *ClusterState._GPU_ARRAYS]
    if not with_version:
        names.remove("version")
    copied: dict[str, object] = {name: getattr(state, name).copy() for name in names}
    copied["placements"] = dict(state.placements)
    copied["pods_on"] = [set(pods) for pods in state.pods_on]
    return copied


def assert_same(before: dict[str, object], after: dict[str, object]) -> None:
    assert before.keys() == after.keys()
    for key, value in before.items():
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(value, after[key], err_msg=key)
        else:
            assert value == after[key], key
