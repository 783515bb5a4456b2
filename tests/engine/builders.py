"""Small builders for engine tests: nodes, pods, placements and policies in one line each."""

from __future__ import annotations

from collections.abc import Iterable
from fractions import Fraction

import numpy as np

from gpufrac.cluster.model import (
    Assignment,
    GpuSpec,
    NodeSpec,
    Placement,
    PodDemand,
    Unschedulable,
    resolve_mib,
)
from gpufrac.cluster.state import MODE_CODE, MODE_NONE, ClusterState
from gpufrac.contract.model import ComputeMode, Portion, ShareRequest, WholeGpuRequest
from gpufrac.placement.engine import decide
from gpufrac.placement.framework import POLICIES, Policy, PolicyContext
from gpufrac.placement.workload import Shape, Workload

TS = ComputeMode.TIME_SLICING
SM = ComputeMode.SM_SHARING
GPU_MIB = 16_000
DETERMINISTIC = sorted(name for name, kind in POLICIES.items() if kind.deterministic)


def node(
    name: str,
    gpus: int = 2,
    *,
    memory: int = GPU_MIB,
    cpu: int = 64_000,
    mem: int = 262_144,
    model: str = "T4",
    unhealthy: Iterable[int] = (),
) -> NodeSpec:
    sick = set(unhealthy)
    specs = tuple(GpuSpec(i, f"{name}-gpu{i}", model, memory, healthy=i not in sick) for i in range(gpus))
    return NodeSpec(name, cpu_milli=cpu, memory_mib=mem, gpus=specs)


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
) -> PodDemand:
    """A pod with one share of `milli` thousandths of a GPU (limit likewise, default = request)."""
    share = ShareRequest("main", portion(milli), portion(limit or milli), mode=mode, num_devices=devices)
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
) -> Placement:
    """A hand-written placement of one share (MiB) on `gpus` of node `on`."""
    assignment = Assignment("main", gpus, request, request if limit is None else limit, mode)
    return Placement(pod, on, cpu_milli=cpu, memory_mib=mem, assignments=(assignment,))


def whole_at(pod: str, on: str, gpus: tuple[int, ...], *, memory: int = GPU_MIB) -> Placement:
    return Placement(pod, on, assignments=(Assignment("main", gpus, memory, memory, None),))


def workload(*shapes: tuple[Shape, float]) -> Workload:
    return Workload(tuple(shape for shape, _ in shapes), np.array([weight for _, weight in shapes], float))


DEFAULT_WORKLOAD = workload((Shape(cpu_milli=0, gpus=1, milli=500), 1.0))


def policy(name: str, *, seed: int = 0, target: Workload = DEFAULT_WORKLOAD) -> Policy:
    return POLICIES[name](PolicyContext(rng=np.random.default_rng(seed), workload=target))


def place(state: ClusterState, pod: PodDemand, chosen: Policy) -> Placement:
    """Decide and apply; the pod must fit."""
    outcome = decide(state, pod, chosen)
    assert isinstance(outcome, Placement), outcome
    state.apply(outcome)
    return outcome


def refused(state: ClusterState, pod: PodDemand, chosen: Policy) -> Unschedulable:
    outcome = decide(state, pod, chosen)
    assert isinstance(outcome, Unschedulable), outcome
    return outcome


def feasible_nodes(state: ClusterState, pod: PodDemand) -> set[str]:
    """An oracle for pods with at most one share or only whole GPUs, GPU by GPU in plain Python."""
    found = set()
    for row, name in enumerate(state.names):
        if (
            not state.active[row]
            or state.cpu_free[row] < pod.cpu_milli
            or state.mem_free[row] < pod.memory_mib
        ):
            continue
        if not pod.wants_gpu:
            found.add(name)
            continue
        if pod.models is not None and state.models[state.model_id[row]] not in pod.models:
            continue
        usable = 0
        for gpu in range(int(state.gpu_count[row])):
            memory = int(state.gpu_mem[row, gpu])
            healthy, tenants = bool(state.gpu_healthy[row, gpu]), int(state.gpu_tenants[row, gpu])
            if pod.whole_gpus:
                usable += healthy and tenants == 0
                continue
            share = pod.shares[0]
            request, limit = resolve_mib(share.request, memory), resolve_mib(share.limit, memory)
            mode = int(state.gpu_mode[row, gpu])
            usable += (
                healthy
                and not state.gpu_whole[row, gpu]
                and 1 <= request <= int(state.gpu_free[row, gpu])
                and limit <= memory
                and mode in (MODE_NONE, MODE_CODE[share.mode])
            )
        if usable >= (pod.whole_gpus or pod.shares[0].num_devices):
            found.add(name)
    return found


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
