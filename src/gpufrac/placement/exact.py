"""Pods with several share containers, or whole GPUs beside a share: a greedy search per node.

Such pods are rare (no trace has them), and no paper policy defines a score for them, so they take the
first node in tie order where a greedy assignment succeeds: whole GPUs from the highest-index empty GPUs,
then each share, largest first, on the best-fitting GPUs that keep one compute mode per GPU (and, on a
node that guarantees compute, compute claims within 100%).
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from gpufrac.cluster.model import (
    FULL_COMPUTE,
    Assignment,
    Placement,
    Unschedulable,
    compute_claim,
    resolve_mib,
    whole_assignments,
)
from gpufrac.cluster.state import DOMAIN_NONE, MODE_CODE, MODE_NONE, ClusterState
from gpufrac.contract.model import ComputeMode
from gpufrac.placement.fit import Fit


def decide(state: ClusterState, fit: Fit) -> Placement | Unschedulable:
    pod = fit.pod
    rejected = Counter(fit.rejected)
    for row in fit.rows[np.argsort(state.tie_rank[fit.rows], kind="stable")]:
        assignments = assign(state, int(row), fit)
        if assignments is not None:
            return Placement(
                pod.name, state.names[row], pod.cpu_milli, pod.memory_mib, assignments, pod.fault_domain
            )
        rejected["no combination of GPUs fits every container"] += 1
    return Unschedulable(pod.name, dict(rejected))


def assign(state: ClusterState, row: int, fit: Fit) -> tuple[Assignment, ...] | None:
    pod = fit.pod
    count = int(state.gpu_count[row])
    memory = state.gpu_mem[row, :count]
    free = state.gpu_free[row, :count].copy()
    modes = state.gpu_mode[row, :count].copy()
    # sm-sharing GPUs of another fault domain take none of this pod's sm-sharing shares.
    foreign = ~np.isin(state.gpu_domain[row, :count], (DOMAIN_NONE, state.domains.get(pod.fault_domain, -1)))
    compute = state.gpu_compute[row, :count].copy()
    guaranteed = bool(state.compute_guarantee[row])
    open_gpus = state.open_gpus(row)[:count]
    empty = np.flatnonzero(open_gpus & (state.gpu_tenants[row, :count] == 0))
    assignments: list[Assignment] = []
    if pod.whole_gpus:
        if len(empty) < pod.whole_gpus:
            return None
        whole = tuple(sorted(int(g) for g in empty[-pod.whole_gpus :]))
        open_gpus[list(whole)] = False
        assignments += whole_assignments(pod, whole, memory.tolist())
    for share in sorted(pod.shares, key=lambda s: -resolve_mib(s.request, int(memory.max(initial=0)))):
        code = MODE_CODE[share.mode]
        claim = compute_claim(share.mode, share.compute_percent)
        request = np.array([resolve_mib(share.request, int(m)) for m in memory], np.int64)
        limit = np.array([resolve_mib(share.limit, int(m)) for m in memory], np.int64)
        ok = (
            open_gpus
            & (request >= 1)
            & (free >= request)
            & (memory >= limit)
            & np.isin(modes, (MODE_NONE, code))
            & ~(foreign & (share.mode is ComputeMode.SM_SHARING))
            & (not guaranteed or compute + claim <= FULL_COMPUTE)
        )
        candidates = np.flatnonzero(ok)
        chosen = candidates[np.argsort(free[candidates] - request[candidates], kind="stable")][
            : share.num_devices
        ]
        if len(chosen) < share.num_devices:
            return None
        gpus = tuple(sorted(int(g) for g in chosen))
        free[chosen] -= request[chosen]
        modes[chosen] = code
        compute[chosen] += claim
        assignments.append(
            Assignment(
                share.container,
                gpus,
                int(request[chosen].min()),
                int(limit[chosen].min()),
                share.mode,
                share.compute_percent,
            )
        )
    return tuple(assignments)
