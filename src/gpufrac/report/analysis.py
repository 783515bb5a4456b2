"""`gpufrac report`'s figures, from the API objects and the agents' samples. Pure, so that every figure can
be checked against hand-made pods.

What is in use is read from the contract the scheduler wrote on each bound pod (`contract.parse_placement`),
never from what a pod asks for: that is what holds GPUs now. The baseline, GPUs without sharing, is the
planner's whole-GPU rule (`PodDemand.without_sharing`) applied to the same pods. Memory used comes only
from samples; a share no source reported on is "not measured", never zero.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gpufrac import contract
from gpufrac.cluster.model import PodDemand
from gpufrac.contract import keys, node_inventory
from gpufrac.kubeapi.fields import as_mapping

MIB = 1024 * 1024
NOT_MEASURED = "not measured"
DONE_PHASES = ("Succeeded", "Failed")


@dataclass(frozen=True, slots=True)
class ShareSample:
    """One agent's reading of one share on one GPU (`gpufrac_share_memory_used_bytes`)."""

    pod: str  # namespace/name
    container: str
    uuid: str
    index: str  # the GPU's index on its node: what `gpus.devices` holds on nodes without the agent's list
    used_bytes: float


@dataclass(frozen=True, slots=True)
class Source:
    """Where usage was read: an agent's /metrics or Prometheus; `problem` is "" when it answered."""

    url: str
    problem: str = ""


@dataclass(frozen=True, slots=True)
class Usage:
    samples: tuple[ShareSample, ...] = ()
    breaches: Mapping[str, float] = field(default_factory=dict)  # watchdog finding reason -> count
    actions: Mapping[str, float] = field(default_factory=dict)  # kill / evict / report -> count
    sources: tuple[Source, ...] = ()

    @property
    def counters_read(self) -> bool:
        """Whether any source answered, so that zero findings mean none happened, not none were read."""
        return any(not source.problem for source in self.sources)

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.samples + other.samples,
            dict(Counter(self.breaches) + Counter(other.breaches)),
            dict(Counter(self.actions) + Counter(other.actions)),
            self.sources + other.sources,
        )


@dataclass(frozen=True, slots=True)
class Tenant:
    pod: str
    container: str
    kind: str  # the share's compute mode, or "whole"
    request_mib: int | None  # None for a whole GPU: it holds all of it


@dataclass(frozen=True, slots=True)
class Gpu:
    node: str
    gpu: str  # the device as `gpus.devices` names it
    tenants: tuple[Tenant, ...]


@dataclass(frozen=True, slots=True)
class Share:
    """One share on one GPU: what it was granted, and what it used when the agents were read."""

    pod: str
    container: str
    node: str
    gpu: str
    mode: str
    request_mib: int
    limit_mib: int
    used_mib: float | None

    @property
    def status(self) -> str:
        """breach: over its limit; burst: over its guarantee, within its limit; within; or not measured."""
        if self.used_mib is None:
            return NOT_MEASURED
        if self.used_mib > self.limit_mib:
            return "breach"
        return "burst" if self.used_mib > self.request_mib else "within"


@dataclass(frozen=True, slots=True)
class Figures:
    nodes: int
    cluster_gpus: int  # GPUs the nodes publish (the agent's list, else GPU Feature Discovery's count)
    gpu_pods: int  # bound, running GPU pods read
    in_use: int  # GPUs holding at least one share or whole-GPU container
    without_sharing: int  # GPUs the same pods would hold with whole GPUs only
    unidentified_whole: int  # whole GPUs the kubelet's device plugin gave: counted, but not in `gpus`
    gpus: tuple[Gpu, ...]
    shares: tuple[Share, ...]
    skipped: tuple[tuple[str, str], ...]  # (pod, why it was not counted)
    usage: Usage

    @property
    def saved(self) -> int:
        return self.without_sharing - self.in_use

    def tenants_histogram(self) -> dict[int, int]:
        """Tenants per GPU -> GPUs with that many, over the GPUs whose tenants are known."""
        return dict(sorted(Counter(len(gpu.tenants) for gpu in self.gpus).items()))

    def statuses(self) -> dict[str, int]:
        return dict(Counter(share.status for share in self.shares))


@dataclass(frozen=True, slots=True)
class _Bound:
    pod: str
    node: str
    request: contract.PodGpuRequest
    placement: contract.PodPlacement | None


def figures(
    nodes: Sequence[Mapping[str, object]], pods: Iterable[Mapping[str, object]], usage: Usage
) -> Figures:
    bound, skipped = _bound_gpu_pods(pods)
    gpus = _gpus(bound)
    unidentified = sum(item.count for pod in bound if pod.placement is None for item in pod.request.whole)
    return Figures(
        nodes=len(nodes),
        cluster_gpus=sum(map(node_gpus, nodes)),
        gpu_pods=len(bound),
        in_use=len(gpus) + unidentified,
        without_sharing=sum(without_sharing(pod.request) for pod in bound),
        unidentified_whole=unidentified,
        gpus=gpus,
        shares=_shares(bound, usage.samples),
        skipped=tuple(skipped),
        usage=usage,
    )


def without_sharing(request: contract.PodGpuRequest) -> int:
    """Whole GPUs the pod would hold in a cluster without sharing."""
    return PodDemand("", whole=request.whole, shares=request.shares).without_sharing().whole_gpus


def node_gpus(node: Mapping[str, object]) -> int:
    """The GPUs a Node publishes: its agent's list when readable, else GPU Feature Discovery's count."""
    metadata = node.get("metadata")
    metadata = metadata if isinstance(metadata, Mapping) else {}
    annotations = metadata.get("annotations")
    listed = annotations.get(node_inventory.GPUS_ANNOTATION) if isinstance(annotations, Mapping) else None
    if isinstance(listed, str):
        try:
            return len(node_inventory.load_gpus(listed))
        except ValueError:
            pass
    labels = metadata.get("labels")
    count = labels.get(node_inventory.GPU_COUNT_LABEL, "") if isinstance(labels, Mapping) else ""
    return int(count) if isinstance(count, str) and count.isascii() and count.isdigit() else 0


def _bound_gpu_pods(pods: Iterable[Mapping[str, object]]) -> tuple[list[_Bound], list[tuple[str, str]]]:
    """The pods that hold GPUs now: bound, not finished, asking for GPUs, and not a reservation pod (its
    GPU is counted through the shares on it). A pod whose contract cannot be read is set aside with why."""
    bound, skipped = [], []
    for pod in pods:
        metadata = as_mapping(pod.get("metadata"))
        spec, status = as_mapping(pod.get("spec")), as_mapping(pod.get("status"))
        node = spec.get("nodeName")
        if not node or status.get("phase") in DONE_PHASES:
            continue
        if as_mapping(metadata.get("labels")).get(keys.RESERVATION_LABEL) == "true":
            continue
        name = f"{metadata.get('namespace')}/{metadata.get('name')}"
        try:
            request = contract.parse_pod(pod)
            placement = contract.parse_placement(pod)
        except contract.ContractError as error:
            skipped.append((name, str(error)))
            continue
        if not (request.shares or request.whole):
            continue
        if contract.granted_to_another(pod):
            skipped.append((name, "its contract was granted to another pod (gpufrac.io/bound-uid)"))
        elif placement is None and request.shares:
            skipped.append((name, "a share bound without gpufrac's gpus.devices: not placed by gpufrac"))
        else:
            bound.append(_Bound(name, str(node), request, placement))
    return bound, skipped


def _gpus(bound: Sequence[_Bound]) -> tuple[Gpu, ...]:
    tenants: dict[tuple[str, str], list[Tenant]] = {}
    for pod in bound:
        if pod.placement is None:
            continue
        for share in pod.placement.shares:
            for device in share.devices:
                tenant = Tenant(pod.pod, share.container, share.mode.value, share.request_mib)
                tenants.setdefault((pod.node, device), []).append(tenant)
        for whole in pod.placement.whole:
            for device in whole.devices:
                tenants.setdefault((pod.node, device), []).append(
                    Tenant(pod.pod, whole.container, "whole", None)
                )
    return tuple(
        Gpu(node, device, tuple(sorted(held, key=lambda t: (t.pod, t.container))))
        for (node, device), held in sorted(tenants.items())
    )


def _shares(bound: Sequence[_Bound], samples: Sequence[ShareSample]) -> tuple[Share, ...]:
    """One row per share and GPU. A sample names its GPU by UUID and index; `gpus.devices` holds UUIDs,
    or indices on a node without the agent's list, so either may match."""
    used: dict[tuple[str, str, str], float] = {}
    for sample in samples:
        for device in (sample.uuid, sample.index):
            used[sample.pod, sample.container, device] = sample.used_bytes / MIB
    return tuple(
        Share(
            pod.pod,
            share.container,
            pod.node,
            device,
            share.mode.value,
            share.request_mib,
            share.limit_mib,
            used.get((pod.pod, share.container, device)),
        )
        for pod in sorted(bound, key=lambda p: p.pod)
        if pod.placement is not None
        for share in pod.placement.shares
        for device in share.devices
    )
