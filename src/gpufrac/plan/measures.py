"""What a placed workload costs under a strategy: density, waste, fault domains, neighbours.

Everything is computed from the packer's allocations (`PodUse`) against what each pod asked for, over the
GPUs bought (the cluster the search settled on, idle GPUs included). Definitions:
- allocated: GPU memory the strategy hands out (a whole GPU, a replica's 1/N, a MIG profile's slices, or
  exactly the request), in GPU-equivalents; the allocation ratio divides it by the GPUs bought.
- stranded: memory of busy GPUs that backs no pod's request, either handed out beyond the request (rounding
  up to a whole GPU or a profile) or left free beside other tenants. Memory of idle GPUs is not stranded,
  it is spare. GB are the simulator's nominal GB (`sim.trace.MIB_PER_GB`).
- fault domain: the pods one fault takes down together. All pods on an sm-sharing GPU share its MPS
  server, hence one domain (a pod spanning several such GPUs joins theirs); any other pod is alone.
- tenants per busy GPU: the mean number of pods on a GPU that holds any; for sm-sharing, the SM share a
  pod can expect when every tenant is busy is 1/n.
- oversubscribed: pods allocated less memory than they ask for, which only time-slicing replicas allow.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpufrac.cluster.model import PodDemand, resolve_mib
from gpufrac.plan.packer import PodUse
from gpufrac.sim.trace import MIB_PER_GB

Gpu = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Measures:
    gpus: int
    busy_gpus: int
    gpu_pods: int
    allocated_gpus: float
    requested_gpus: float
    allocation_ratio: float  # percent of the GPUs bought
    stranded_gb: float
    stranded_percent: float  # percent of the memory of the GPUs bought
    pods_per_gpu: float
    blast_radius_max: int
    blast_radius_mean: float
    tenants_per_busy_gpu: float
    sm_share: float | None  # None when no pod uses sm-sharing
    oversubscribed_pods: int


def requested_mib(pod: PodDemand, container: str, gpu_memory_mib: int) -> int:
    """What the pod's container asked for on a GPU of this size: its share's request, or all of it."""
    for share in pod.shares:
        if share.container == container:
            return resolve_mib(share.request, gpu_memory_mib)
    return gpu_memory_mib


def measure(uses: Sequence[PodUse], bought: Mapping[Gpu, int], pods: Mapping[str, PodDemand]) -> Measures:
    """`bought` maps every GPU bought to its memory in MiB; `pods` gives each pod as the trace asked."""
    tenants: Counter[Gpu] = Counter()
    backed: Counter[Gpu] = Counter()
    allocated = requested = 0.0
    oversubscribed: set[str] = set()
    sm_gpus_of: dict[str, list[Gpu]] = defaultdict(list)
    for use in uses:
        for index in use.gpus:
            gpu = (use.node, index)
            memory = bought[gpu]
            asked = requested_mib(pods[use.pod], use.container, memory)
            tenants[gpu] += 1
            backed[gpu] += min(asked, use.allocated_mib)
            allocated += use.allocated_mib / memory
            requested += asked / memory
            if asked > use.allocated_mib:
                oversubscribed.add(use.pod)
            if use.sm_sharing:
                sm_gpus_of[use.pod].append(gpu)
    gpu_pods = {use.pod for use in uses}
    stranded = sum(max(bought[gpu] - backed[gpu], 0) for gpu in tenants)
    domains = fault_domains(gpu_pods, sm_gpus_of)
    sm_shares = [1 / tenants[gpu] for gpus in sm_gpus_of.values() for gpu in gpus]
    total_gpus = len(bought)
    return Measures(
        gpus=total_gpus,
        busy_gpus=len(tenants),
        gpu_pods=len(gpu_pods),
        allocated_gpus=allocated,
        requested_gpus=requested,
        allocation_ratio=100 * allocated / total_gpus if total_gpus else 0.0,
        stranded_gb=stranded / MIB_PER_GB,
        stranded_percent=100 * stranded / max(sum(bought.values()), 1),
        pods_per_gpu=len(gpu_pods) / total_gpus if total_gpus else 0.0,
        blast_radius_max=max(domains, default=0),
        blast_radius_mean=statistics.fmean(domains) if domains else 0.0,
        tenants_per_busy_gpu=statistics.fmean(tenants.values()) if tenants else 0.0,
        sm_share=statistics.fmean(sm_shares) if sm_shares else None,
        oversubscribed_pods=len(oversubscribed),
    )


def fault_domains(pods: set[str], sm_gpus_of: Mapping[str, list[Gpu]]) -> list[int]:
    """The size, in pods, of every fault domain: GPUs linked by sm-sharing pods merge into one."""
    parent: dict[Gpu, Gpu] = {}

    def root(gpu: Gpu) -> Gpu:
        while parent.setdefault(gpu, gpu) != gpu:
            parent[gpu] = parent[parent[gpu]]
            gpu = parent[gpu]
        return gpu

    for gpus in sm_gpus_of.values():
        for gpu in gpus[1:]:
            parent[root(gpu)] = root(gpus[0])
    members = Counter(root(gpus[0]) for gpus in sm_gpus_of.values() if gpus)
    alone = len(pods) - sum(members.values())
    return [1] * alone + list(members.values())
