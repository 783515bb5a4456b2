"""Which GPUs of a node the kubelet's device plugin has given away, and so which gpufrac may use. Pure.

On a node where a device plugin hands out `nvidia.com/gpu` (`DevicePluginMode.COEXIST` or `MANAGED`), the
kubelet decides which GPU each pod asking for `nvidia.com/gpu` gets, and gpufrac learns it only afterwards,
from the holders its agent publishes (`GpuInfo.holder`, read from the kubelet's PodResources API). So:

- a share goes only on a GPU a gpufrac *reservation pod* holds: the kubelet gave that GPU to gpufrac, and
  will give it to no one else while the reservation lives;
- a GPU the device plugin gave to any other pod is never shared;
- a pod bound to the node and asking for `nvidia.com/gpu` whose GPU is not published yet holds *some* free
  GPU; until the agent says which, the lowest-indexed free GPUs are counted as taken (`PENDING` for
  gpufrac's own reservations, which shares may wait for, `CLAIMED` for anyone else's), so that nothing
  gpufrac places can need more GPUs than the kubelet has left;
- a whole-GPU pod gpufrac places there gets its GPU from the kubelet, like anyone's: gpufrac picks only the
  node, on the count of free GPUs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from gpufrac.contract.node_inventory import GpuInfo


class Hold(StrEnum):
    """What holds one GPU of a device-plugin node."""

    FREE = "free"  # the device plugin gave it to nobody: a whole-GPU pod or a new reservation may have it
    RESERVED = "reserved"  # a live gpufrac reservation holds it: shares go here
    HELD = "held"  # the device plugin gave it to another pod: never shared
    PENDING = "pending"  # free as published, counted as what a gpufrac reservation not yet published got
    CLAIMED = "claimed"  # free as published, but counted as taken by a pod whose GPU is not published yet
    RELEASING = "releasing"  # published as held by a gpufrac reservation that is gone: free once republished


@dataclass(frozen=True)
class NodeDevices:
    """The holds of one node's GPUs, by index, and the reservation holding each reserved GPU."""

    holds: tuple[Hold, ...]
    reservations: Mapping[int, str]  # GPU index -> namespace/name of the reservation pod

    def count(self, hold: Hold) -> int:
        return sum(1 for held in self.holds if held is hold)


def node_devices(
    gpus: Sequence[GpuInfo],
    *,
    reservations: Mapping[str, int],
    claims: Mapping[str, int],
    ours: Callable[[str], bool],
) -> NodeDevices:
    """The holds of `gpus` (the agent's inventory, with holders).

    `reservations`: the live reservation pods bound to the node, as namespace/name, with the GPUs each asks
    for (one); `claims`: every live pod bound (or being bound) to the node that asks for `nvidia.com/gpu`,
    reservations included, as namespace/name -> GPUs it asks for; `ours`: whether a holder's name is one of
    gpufrac's reservation pods (its namespace and name prefix), live or not.
    """
    holds: list[Hold] = []
    reserved: dict[int, str] = {}
    published: dict[str, int] = {}
    for gpu in sorted(gpus, key=lambda gpu: gpu.index):
        holder = gpu.holder
        if holder:
            published[holder] = published.get(holder, 0) + 1
        if not holder:
            holds.append(Hold.FREE)
        elif holder in reservations:
            holds.append(Hold.RESERVED)
            reserved[gpu.index] = holder
        elif ours(holder):
            holds.append(Hold.RELEASING)
        else:
            holds.append(Hold.HELD)
    ours_unpublished = sum(
        max(0, count - published.get(key, 0)) for key, count in claims.items() if key in reservations
    )
    others_unpublished = sum(
        max(0, count - published.get(key, 0)) for key, count in claims.items() if key not in reservations
    )
    free = [position for position, hold in enumerate(holds) if hold is Hold.FREE]
    for position in free[:ours_unpublished]:
        holds[position] = Hold.PENDING
    for position in free[ours_unpublished : ours_unpublished + others_unpublished]:
        holds[position] = Hold.CLAIMED
    return NodeDevices(tuple(holds), reserved)
