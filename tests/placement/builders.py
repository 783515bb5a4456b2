"""Small builders for placement tests: target workloads and policies in one line each, deciding a pod, and
an oracle for where it fits."""

from __future__ import annotations

import numpy as np

from gpufrac.cluster.model import Placement, PodDemand, Unschedulable, resolve_mib
from gpufrac.cluster.state import MODE_CODE, MODE_NONE, ClusterState
from gpufrac.placement.engine import decide
from gpufrac.placement.framework import POLICIES, Policy, PolicyContext
from gpufrac.placement.workload import Shape, Workload

DETERMINISTIC = sorted(name for name, kind in POLICIES.items() if kind.deterministic)


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
