"""What a queue holds and asks for, in the queues' units, and who may reclaim from whom. Pure.

The rules behind reclaim across queues, written once for every caller that keeps its own books (the
simulator's tenant replay keeps them in plain dictionaries): a queue may reclaim only the resources it has a
quota of and that are contested (the queues ask more of them than the cluster has), and only while its use
with the pending pod stays within that quota; a running pod is offered as a victim only when its queue,
without it, still holds at least its fair share of those resources. So reclaim takes back what a queue
lent, never what another queue is owed.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpufrac.cluster.model import Placement, PodDemand, resolve_mib
from gpufrac.cluster.state import ClusterState
from gpufrac.contract.queues import GPU_RESOURCES, QueueSpec, Resource
from gpufrac.placement.fairshare import starvation

Amounts = dict[Resource, float]
_EPSILON = 1e-9


def held(placement: Placement, state: ClusterState) -> Amounts:
    """What a placement on `state`'s nodes counts against its queue: whole GPUs, shares' GPU memory, CPU and
    memory. A share also counts, under `gpus`, as the part of its GPU its memory is (on each of its GPUs),
    as a fraction counts against a queue's GPU quota in KAI Scheduler: `gpus` then measures the GPUs taken
    either way, and what shares take is not still offered, in fair shares, to whole-GPU pods."""
    amounts = {
        Resource.GPU_MEMORY: 0.0,
        Resource.GPUS: 0.0,
        Resource.CPU: float(placement.cpu_milli),
        Resource.MEMORY: float(placement.memory_mib),
    }
    row = state.index.get(placement.node)
    for assignment in placement.assignments:
        if assignment.mode is None:
            amounts[Resource.GPUS] += len(assignment.gpus)
            continue
        memory = assignment.request_mib * len(assignment.gpus)
        amounts[Resource.GPU_MEMORY] += memory
        size = int(state.gpu_mem[row, assignment.gpus[0]]) if row is not None else 0
        amounts[Resource.GPUS] += memory / size if size > 0 else 0.0
    return amounts


def asked(demand: PodDemand, reference_gpu_mib: int) -> Amounts:
    """What a pending pod asks for, its shares resolved on a GPU of `reference_gpu_mib` (a portion means
    nothing until a GPU is chosen; callers pass the cluster's median GPU memory), and counted under `gpus`
    as that part of it (`held`)."""
    gpu_memory = sum(
        resolve_mib(share.request, reference_gpu_mib) * share.num_devices for share in demand.shares
    )
    share_gpus = gpu_memory / reference_gpu_mib if reference_gpu_mib > 0 else 0.0
    return {
        Resource.GPU_MEMORY: float(gpu_memory),
        Resource.GPUS: float(demand.whole_gpus) + share_gpus,
        Resource.CPU: float(demand.cpu_milli),
        Resource.MEMORY: float(demand.memory_mib),
    }


def capacity(state: ClusterState) -> Amounts:
    """What the active nodes offer, in the queues' units: what fair shares divide."""
    active = state.active
    return {
        Resource.GPU_MEMORY: float(state.gpu_mem[active].sum()),
        Resource.GPUS: float(state.gpu_count[active].sum()),
        Resource.CPU: float(state.cpu_cap[active].sum()),
        Resource.MEMORY: float(state.mem_cap[active].sum()),
    }


def add(total: dict[Resource, float], amounts: Mapping[Resource, float], sign: float = 1.0) -> None:
    """`total += sign × amounts`, resource by resource."""
    for resource, amount in amounts.items():
        total[resource] = total.get(resource, 0.0) + sign * amount


def past_quota(
    spec: QueueSpec, usage: Mapping[Resource, float], wanted: Mapping[Resource, float]
) -> Resource | None:
    """The first resource a pod asks for (`wanted`) that its queue has a quota of and whose quota the queue's
    use with the pod would pass; None when it stays within every such quota. Within up to rounding: shares
    count as float parts of their GPUs, and parts that make the quota exactly (0.2 + 0.4 + 0.3 + 0.1 of one
    GPU) can add up to a hair over it."""
    for resource, amount in wanted.items():
        quota = spec.entitlement(resource).quota
        if amount > 0 and quota > 0 and usage.get(resource, 0.0) + amount > quota + _EPSILON:
            return resource
    return None


def contested(
    capacity: Mapping[Resource, float], demand: Mapping[str, Mapping[Resource, float]]
) -> set[Resource]:
    """The resources the queues together ask more of (`demand`: what each holds and waits for) than the
    cluster has. Only those are reclaimed: where every queue's demand fits (CPU on a GPU cluster, often),
    each queue's fair share is its whole demand, so no eviction would leave a victim its share of it, and a
    quota of it would block every reclaim; and a pod that waits though its resources are not contested waits
    for packing, which evicting another queue's pods is not the answer to."""
    totals: Amounts = {}
    for amounts in demand.values():
        add(totals, amounts)
    return {resource for resource, total in totals.items() if total > capacity.get(resource, 0.0) + _EPSILON}


def reclaiming(
    spec: QueueSpec,
    usage: Mapping[Resource, float],
    wanted: Mapping[Resource, float],
    scarce: set[Resource],
) -> set[Resource]:
    """The resources a pod asks for (`wanted`) that its queue has a quota of and that are `scarce`
    (`contested`), when the queue's use with the pod stays within every quota it asks for (`past_quota`):
    those it may reclaim from queues over their fair share. Empty otherwise."""
    if past_quota(spec, usage, wanted) is not None:
        return set()
    return {
        resource
        for resource, amount in wanted.items()
        if amount > 0 and spec.entitlement(resource).quota > 0 and resource in scarce
    }


def unguaranteed(
    spec: QueueSpec, protected: Mapping[Resource, float], wanted: Mapping[Resource, float]
) -> Resource | None:
    """For a pod no eviction may take back (non-preemptible): the resource that it and the queue's other
    such pods (holding `protected`) would hold beyond what the queue is guaranteed, or None. Borrowed, such
    pods could never be reclaimed, and the queue that lent would never get its quota back; so, as KAI
    Scheduler runs non-preemptible workloads, they run only within their queue's quota: every quota the pod
    asks for must hold for them (`past_quota`), and a pod asking for GPUs needs its queue to have a quota of
    GPUs (`gpus` or `gpuMemory`) at all. The queue's preemptible pods do not count: beside them, the queue
    may pass its quota, and then they are what other queues reclaim."""
    gpu = [resource for resource in GPU_RESOURCES if wanted.get(resource, 0.0) > 0]
    if gpu and not any(spec.entitlement(resource).quota > 0 for resource in gpu):
        return gpu[0]
    return past_quota(spec, protected, wanted)


def surplus_covers(
    usage: Mapping[Resource, float],
    share: Mapping[Resource, float],
    amounts: Mapping[Resource, float],
    resources: set[Resource],
) -> bool:
    """Whether a queue using `usage`, without a pod holding `amounts`, still uses at least its fair share
    (`share`) of each of `resources`: reclaim takes only what a queue holds beyond its share."""
    return all(
        usage.get(resource, 0.0) - amounts.get(resource, 0.0) >= share.get(resource, 0.0) - _EPSILON
        for resource in resources
    )


def over_share(usage: Mapping[Resource, float], share: Mapping[Resource, float]) -> bool:
    """Whether a queue uses more than its fair share of some resource: only such a queue lends to others."""
    return starvation(usage, share) > 1.0 + _EPSILON
