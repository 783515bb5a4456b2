"""What every strategy's packer answers, whether it is gpufrac's engine or MIG's slot packer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from gpufrac.cluster.model import PodDemand, Unschedulable


@dataclass(frozen=True, slots=True)
class PodUse:
    """One container's GPUs as a strategy allocated them: `allocated_mib` on each of `gpus`."""

    pod: str
    container: str
    node: str
    gpus: tuple[int, ...]
    allocated_mib: int
    sm_sharing: bool  # one MPS server per GPU: its pods share a fault domain


class Packer(Protocol):
    """A cluster under one strategy. `place` takes the pod as the trace asks for it; the packer allocates
    what its strategy allocates for that."""

    def place(self, pod: PodDemand) -> str | Unschedulable:
        """Place the pod and return its node's name, or say why it fits nowhere (changing nothing)."""
        ...

    def release(self, pod: str) -> None: ...

    def uses(self) -> list[PodUse]: ...

    def busy_gpus(self) -> int:
        """GPUs holding at least one pod."""
        ...
