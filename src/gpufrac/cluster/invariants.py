"""The placement invariants (docs/architecture.md), recomputed from the placements alone.

This deliberately ignores `ClusterState`'s running totals: tests compare the two, so a bookkeeping bug in
`apply` or `release` cannot hide behind itself.
"""

from __future__ import annotations

from collections import defaultdict

from gpufrac.cluster.model import FULL_COMPUTE, Placement
from gpufrac.cluster.state import ClusterState
from gpufrac.contract.model import ComputeMode


def violations(state: ClusterState) -> list[str]:
    """Every broken invariant, as a sentence; empty when the cluster is sound."""
    problems: list[str] = []
    requested: dict[tuple[str, int], int] = defaultdict(int)
    modes: dict[tuple[str, int], set[object]] = defaultdict(set)
    compute: dict[tuple[str, int], int] = defaultdict(int)
    tenants: dict[tuple[str, int], int] = defaultdict(int)
    domains: dict[tuple[str, int], set[str]] = defaultdict(set)  # fault domains of sm-sharing shares
    whole: set[tuple[str, int]] = set()
    cpu: dict[str, int] = defaultdict(int)
    memory: dict[str, int] = defaultdict(int)
    scalars: dict[tuple[str, str], int] = defaultdict(int)
    for placement in state.placements.values():
        cpu[placement.node] += placement.cpu_milli
        memory[placement.node] += placement.memory_mib
        for name, amount in placement.scalars:
            scalars[placement.node, name] += amount
        problems += _share_problems(
            state, placement, requested=requested, modes=modes, compute=compute, tenants=tenants
        )
        for assignment in placement.assignments:
            if assignment.mode is None:
                whole.update((placement.node, gpu) for gpu in assignment.gpus)
            if assignment.mode is ComputeMode.SM_SHARING:
                for gpu in assignment.gpus:
                    domains[placement.node, gpu].add(placement.fault_domain)
    for node, used in cpu.items():
        row = state.index[node]
        if used > state.cpu_cap[row] or memory[node] > state.mem_cap[row]:
            problems.append(f"{node}: pods request more CPU or memory than the node has")
        if 0 <= state.pods_cap[row] < len(state.pods_on[row]):
            problems.append(
                f"{node}: {len(state.pods_on[row])} pods where the kubelet runs {state.pods_cap[row]}"
            )
    for (node, name), total in scalars.items():
        offered = state.scalar_cap.get(name)
        if offered is None or total > offered[state.index[node]]:
            problems.append(f"{node}: pods request more {name} than the node has")
    for (node, gpu), total in requested.items():
        capacity = int(state.gpu_mem[state.index[node], gpu])
        if total > capacity:
            problems.append(f"{node} GPU {gpu}: {total} MiB requested of {capacity} MiB")
        if len(modes[node, gpu]) > 1:
            problems.append(f"{node} GPU {gpu}: mixes compute modes {sorted(map(str, modes[node, gpu]))}")
    problems += [
        f"{node} GPU {gpu}: compute caps add up to {total}% on a node that guarantees compute"
        for (node, gpu), total in compute.items()
        if state.compute_guarantee[state.index[node]] and total > FULL_COMPUTE
    ]
    problems += [f"{node} GPU {gpu}: a whole GPU is shared" for node, gpu in whole if tenants[node, gpu] > 1]
    problems += [
        f"{node} GPU {gpu}: sm-sharing across fault domains {sorted(groups)}"
        for (node, gpu), groups in domains.items()
        if len(groups) > 1
    ]
    return problems


def _share_problems(
    state: ClusterState,
    placement: Placement,
    *,
    requested: dict[tuple[str, int], int],
    modes: dict[tuple[str, int], set[object]],
    compute: dict[tuple[str, int], int],
    tenants: dict[tuple[str, int], int],
) -> list[str]:
    problems = []
    row = state.index[placement.node]
    for assignment in placement.assignments:
        if len(set(assignment.gpus)) != len(assignment.gpus):
            problems.append(f"{placement.pod}: a multi-device share repeats a GPU")
        for gpu in assignment.gpus:
            memory = int(state.gpu_mem[row, gpu])
            key = (placement.node, gpu)
            tenants[key] += 1
            requested[key] += memory if assignment.mode is None else assignment.request_mib
            compute[key] += assignment.compute_claim
            if assignment.mode is not None:
                modes[key].add(assignment.mode)
                if assignment.limit_mib > memory:
                    problems.append(f"{placement.pod}: limit {assignment.limit_mib} MiB above GPU {gpu}")
    return problems
