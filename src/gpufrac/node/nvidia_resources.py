"""How NVIDIA's device plugin names what it hands out, so that a grant under any of its names counts as a
grant of its GPU.

By default it advertises one `nvidia.com/gpu` per GPU, named by UUID. Set to share GPUs it names each
replica `<uuid>::<n>`: under `nvidia.com/gpu`, or under `nvidia.com/gpu.shared` with `renameByDefault`
(time-slicing or MPS). MIG's mixed strategy advertises `nvidia.com/mig-<profile>`, one device per MIG
instance named by its own `MIG-<uuid>`, whose parent GPU only NVML's MIG calls could tell and the agent
does not make: such a grant stands for every GPU (`ANY_GPU`), so that its processes are never taken for
contract-less and killed. Every name but whole `nvidia.com/gpu` hands out parts of GPUs, so a node where
one is advertised is not Ready for gpufrac (`inventory.plugin_shares`), and no share is placed there.
"""

from __future__ import annotations

from gpufrac.contract.node_inventory import GPU_RESOURCE

SHARED_RESOURCE = "nvidia.com/gpu.shared"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
ANY_GPU = "*"  # a device of some GPU of the node, which one unknown (a MIG instance)


def names_gpus(resource: str) -> bool:
    """`resource` is one of NVIDIA's names for GPUs or parts of them."""
    return resource in (GPU_RESOURCE, SHARED_RESOURCE) or resource.startswith(MIG_RESOURCE_PREFIX)


def names_parts(resource: str) -> bool:
    """`resource` hands out parts of GPUs (replicas or MIG instances), never whole ones."""
    return resource != GPU_RESOURCE and names_gpus(resource)


def is_part(device_id: str) -> bool:
    """`device_id` names part of a GPU: a replica `<uuid>::<n>`, or a MIG instance (MIG's single strategy
    hands those out as `nvidia.com/gpu`)."""
    return "::" in device_id or device_id.startswith("MIG-")


def gpu_of(resource: str, device_id: str) -> str:
    """The GPU (UUID or index) a device of `resource` is, or is part of; `ANY_GPU` for a MIG instance."""
    if resource.startswith(MIG_RESOURCE_PREFIX) or device_id.startswith("MIG-"):
        return ANY_GPU
    return device_id.partition("::")[0]
