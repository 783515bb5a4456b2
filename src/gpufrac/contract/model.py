"""Typed values the contract produces: what a pod asks for, and where the scheduler put it.

All frozen, so the engine and the simulator can hash, share and compare them freely; the parser is the only
place that builds requests from untrusted text and checks the rules, so these classes trust their fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction
from typing import TypeAlias

# All of a GPU's SMs, in percent: the largest compute cap, what a share without one may use, and what the caps
# on one GPU may add up to where compute is guaranteed.
FULL_COMPUTE = 100


class ComputeMode(StrEnum):
    """How a share's kernels meet other shares' on the same GPU; a GPU runs one mode at a time."""

    TIME_SLICING = "time-slicing"
    SM_SHARING = "sm-sharing"


@dataclass(frozen=True)
class Mebibytes:
    """An absolute amount of GPU memory, the same on any GPU."""

    value: int


@dataclass(frozen=True)
class Portion:
    """A portion of one GPU's memory, 0 < value <= 1, resolved to MiB only once the GPU is known."""

    value: Fraction


MemoryAmount: TypeAlias = Mebibytes | Portion


@dataclass(frozen=True)
class ShareRequest:
    """One container's fractional share: `request` is guaranteed, up to `limit` is best effort.

    Request and limit are always of the same kind (both MiB or both portions); the share takes that much on
    each of `num_devices` distinct GPUs of one node. `compute_percent`, set only on an sm-sharing share, caps
    the percentage of each GPU's SMs it may use (None: no cap).
    """

    container: str
    request: MemoryAmount
    limit: MemoryAmount
    mode: ComputeMode = ComputeMode.TIME_SLICING
    num_devices: int = 1
    compute_percent: int | None = None


@dataclass(frozen=True)
class WholeGpuRequest:
    """A container that asks for `count` whole GPUs with the `nvidia.com/gpu` resource."""

    container: str
    count: int


@dataclass(frozen=True)
class PodGpuRequest:
    """Everything one pod asks for, in the order of its containers; empty when it asks for no GPU."""

    shares: tuple[ShareRequest, ...] = ()
    whole: tuple[WholeGpuRequest, ...] = ()


@dataclass(frozen=True)
class SharePlacement:
    """A share resolved onto GPUs: the MiB it holds on each of `devices` (GPU UUIDs, or indices), and its
    compute cap as asked (`ShareRequest.compute_percent`)."""

    container: str
    devices: tuple[str, ...]
    request_mib: int
    limit_mib: int
    mode: ComputeMode
    compute_percent: int | None = None


@dataclass(frozen=True)
class WholeGpuPlacement:
    """The GPUs a whole-GPU container holds exclusively."""

    container: str
    devices: tuple[str, ...]


@dataclass(frozen=True)
class PodPlacement:
    """Where the scheduler put every GPU container of one pod; what bind writes and a restart reads back."""

    shares: tuple[SharePlacement, ...] = ()
    whole: tuple[WholeGpuPlacement, ...] = ()
