"""Plain data for the placement engine: what a node offers, what a pod asks for, where a pod was put.

These are the engine's own types, independent of Kubernetes objects and trace files: the scheduler and the
simulator each translate their input into them, so the engine is tested once for both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, TypeVar

from gpufrac.contract import portion_mib
from gpufrac.contract.model import (
    FULL_COMPUTE,
    ComputeMode,
    Mebibytes,
    MemoryAmount,
    Portion,
    ShareRequest,
    WholeGpuRequest,
)

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True, slots=True)
class GpuSpec:
    index: int
    uuid: str
    model: str
    memory_mib: int
    healthy: bool = True


Scalars = tuple[tuple[str, int], ...]
"""Resources other than CPU, memory and GPUs that nodes offer and pods ask for (kube-scheduler's scalar
resources): ephemeral-storage and hugepages-* in MiB, extended resources (`rdma/hca`, MIG devices) counted.
(name, amount) pairs sorted by name, none of 0, so that equal asks are equal values."""


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """A node as the engine sees it: capacity left for pods, and its GPUs.

    A node's GPUs are one model, as on every real node; `model` is that model ("" for a CPU-only node).
    `compute_guarantee`: the operator guarantees compute on the node's pool, so the compute claims of the
    sm-sharing shares on each GPU (`compute_claim`) may add up to 100 at most. `max_pods`: the most pods the
    kubelet runs there (its allocatable `pods`, 110 by default), None for no bound (a trace's nodes).
    `scalars`: its allocatable other resources.
    """

    name: str
    cpu_milli: int
    memory_mib: int
    gpus: tuple[GpuSpec, ...] = ()
    compute_guarantee: bool = False
    max_pods: int | None = None
    scalars: Scalars = ()

    @property
    def model(self) -> str:
        return self.gpus[0].model if self.gpus else ""


def resolve_mib(amount: MemoryAmount, gpu_memory_mib: int) -> int:
    """The MiB an amount means on a GPU, by the contract's `portion_mib` for a portion.

    Portions stay unresolved until a GPU is chosen, which is what lets one request fit GPUs of different
    sizes. Zero is possible here; the engine's filters treat a share that resolves to nothing as not fitting.
    """
    if isinstance(amount, Mebibytes):
        return amount.value
    return portion_mib(amount.value, gpu_memory_mib)


def compute_claim(mode: ComputeMode | None, percent: int | None) -> int:
    """The percentage of each of its GPUs' SMs a share claims where compute is guaranteed: its cap, or all of
    them without one (MPS lets an uncapped client take every SM). Only sm-sharing shares claim: time-slicing
    shares take turns at the whole GPU (and never share a GPU with sm-sharing ones), whole GPUs are
    exclusive, so neither has SMs to split."""
    if mode is not ComputeMode.SM_SHARING:
        return 0
    return FULL_COMPUTE if percent is None else percent


Count = TypeVar("Count", int, "np.ndarray")


def milli_up(part: Count, whole: Count) -> Count:
    """part / whole in thousandths, rounded up: the unit of the fragmentation measure, in which a demand never
    looks smaller than it is. Integer arithmetic, so the engine applies it to arrays of nodes too."""
    return -(-part * 1000 // whole)


def milli_of(amount: MemoryAmount, gpu_memory_mib: int) -> int:
    """The amount in thousandths of a GPU, rounded up (`milli_up`)."""
    if isinstance(amount, Portion):
        return milli_up(amount.value.numerator, amount.value.denominator)
    return milli_up(amount.value, gpu_memory_mib)


@dataclass(frozen=True, slots=True)
class PodDemand:
    """Everything one pod needs from one node.

    `whole` lists the containers that ask for exclusive GPUs (the `nvidia.com/gpu` resource) and how many;
    `models`, when set, lists the GPU models the pod accepts; `scalars`, the other resources it requests.
    """

    name: str
    cpu_milli: int = 0
    memory_mib: int = 0
    whole: tuple[WholeGpuRequest, ...] = ()
    shares: tuple[ShareRequest, ...] = ()
    models: frozenset[str] | None = None
    priority: int = 0
    scalars: Scalars = ()
    # sm-sharing merges the fault domains of the processes on a GPU (one MPS server), so its shares share a
    # GPU only with shares of the same group: the pod's namespace, or the group an admin's label names.
    fault_domain: str = ""
    # Exclusive GPUs the pod needs in all: they must be empty GPUs of one node. Counted once, since every
    # filter of every decision asks.
    whole_gpus: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "whole_gpus", sum(item.count for item in self.whole))

    @property
    def wants_gpu(self) -> bool:
        return self.whole_gpus > 0 or bool(self.shares)

    def without_sharing(self) -> PodDemand:
        """The pod as a cluster without GPU sharing must serve it: a share of any size on N devices takes N
        whole GPUs of its own. One rule for the planner's `whole-gpu` strategy and `gpufrac report`'s
        baseline, so the two never count the same pods differently."""
        if not self.shares:
            return self
        owned = tuple(WholeGpuRequest(share.container, share.num_devices) for share in self.shares)
        return replace(self, whole=self.whole + owned, shares=())


@dataclass(frozen=True, slots=True)
class Assignment:
    """GPUs given to one container: per GPU, `request_mib` guaranteed and `limit_mib` at most.

    `mode` is None for exclusive whole GPUs; `compute_percent` is an sm-sharing share's cap, if any.
    """

    container: str
    gpus: tuple[int, ...]
    request_mib: int
    limit_mib: int
    mode: ComputeMode | None
    compute_percent: int | None = None

    @property
    def compute_claim(self) -> int:
        return compute_claim(self.mode, self.compute_percent)


def whole_assignments(
    pod: PodDemand, gpus: Sequence[int], gpu_memory: Sequence[int]
) -> tuple[Assignment, ...]:
    """`gpus` (as many as `pod.whole_gpus`) handed to the pod's whole-GPU containers, in order, each its own.

    `gpu_memory[i]` is GPU i's memory: a whole GPU's request and limit are all of it.
    """
    assignments = []
    rest = list(gpus)
    for item in pod.whole:
        mine, rest = tuple(rest[: item.count]), rest[item.count :]
        size = min(int(gpu_memory[gpu]) for gpu in mine)
        assignments.append(Assignment(item.container, mine, size, size, None))
    return tuple(assignments)


@dataclass(frozen=True, slots=True)
class Placement:
    pod: str
    node: str
    cpu_milli: int = 0
    memory_mib: int = 0
    assignments: tuple[Assignment, ...] = field(default=())
    fault_domain: str = ""  # whose sm-sharing shares may share a GPU with these (`PodDemand.fault_domain`)
    scalars: Scalars = ()  # the pod's other resources (`PodDemand.scalars`), held on the node


@dataclass(frozen=True, slots=True)
class Unschedulable:
    """Why a pod fits nowhere: how many nodes were rejected for each reason."""

    pod: str
    reasons: dict[str, int]

    @property
    def message(self) -> str:
        """The kube-scheduler style summary, e.g. `0/5 nodes are available: 3 not enough GPU memory, ...`."""
        total = sum(self.reasons.values())
        parts = ", ".join(
            f"{count} {reason}"
            for reason, count in sorted(self.reasons.items(), key=lambda kv: (-kv[1], kv[0]))
        )
        return f"0/{total} nodes are available: {parts}" if parts else "no nodes in the cluster"
