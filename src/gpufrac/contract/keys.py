"""The names of the contract: pod annotation keys, NVIDIA per-container keys, gpufrac's own per-container
keys, and who may write which.

Most names are fixed by the two writers gpufrac must interoperate with (KAI Scheduler's pod annotations and
NVIDIA's per-container keys), so they live in one place and every other module refers to these constants.
What neither defines (a compute cap) is gpufrac's own, under `gpufrac.io/`, never invented under theirs.
"""

from __future__ import annotations

import functools
from enum import StrEnum

# KAI-compatible pod annotations: one share per pod, for one container.
GPU_FRACTION = "gpu-fraction"
GPU_FRACTION_LIMIT = "gpu-fraction.limit"
GPU_MEMORY = "gpu-memory"
GPU_MEMORY_LIMIT = "gpu-memory.limit"
NUM_DEVICES = "gpu-fraction-num-devices"
CONTAINER_NAME = "gpu-fraction-container-name"
POD_KEYS = frozenset(
    {GPU_FRACTION, GPU_FRACTION_LIMIT, GPU_MEMORY, GPU_MEMORY_LIMIT, NUM_DEVICES, CONTAINER_NAME}
)

# NVIDIA per-container keys: `nvidia.com/container.<c>.<suffix>`.
CONTAINER_PREFIX = "nvidia.com/container."
MEMORY_REQUEST = "gpu-memory.request"
MEMORY_LIMIT = "gpu-memory.limit"
COMPUTE_MODE = "gpu-compute.mode"
DEVICES = "gpus.devices"
CONTAINER_SUFFIXES = (MEMORY_REQUEST, MEMORY_LIMIT, COMPUTE_MODE, DEVICES)

# gpufrac's own per-container keys: `gpufrac.io/container.<c>.<suffix>`. Neither NVIDIA's family above nor
# KAI defines a compute cap (KAI's constants name only the memory request and limit, the devices and the
# compute mode), so the cap is gpufrac's: the percentage of the GPU's SMs an sm-sharing container may use.
GPUFRAC_CONTAINER_PREFIX = "gpufrac.io/container."
COMPUTE_PERCENTAGE = "compute-percentage"
GPUFRAC_CONTAINER_SUFFIXES = (COMPUTE_PERCENTAGE,)

# Each per-container family and the suffixes valid under it.
CONTAINER_FAMILIES = {
    CONTAINER_PREFIX: CONTAINER_SUFFIXES,
    GPUFRAC_CONTAINER_PREFIX: GPUFRAC_CONTAINER_SUFFIXES,
}
_FAMILY_PREFIXES = tuple(CONTAINER_FAMILIES)

# The extended resource through which a container asks for whole GPUs.
GPU_RESOURCE = "nvidia.com/gpu"

# The environment a GPU container gets, from NVIDIA's NRI plugin or from gpufrac's ConfigMap. A tenant who set
# them directly could claim GPUs, so the webhook denies every name in ENV_KEYS in a pod's own env.
ENV_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
ENV_MEMORY_REQUEST = "NVIDIA_GPU_MEMORY_REQUEST"
ENV_MEMORY_LIMIT = "NVIDIA_GPU_MEMORY_LIMIT"
ENV_MPS_PIPE_DIRECTORY = "CUDA_MPS_PIPE_DIRECTORY"
ENV_MPS_MEMORY_LIMIT = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
ENV_KEYS = frozenset(
    {ENV_VISIBLE_DEVICES, ENV_MEMORY_REQUEST, ENV_MEMORY_LIMIT, ENV_MPS_PIPE_DIRECTORY, ENV_MPS_MEMORY_LIMIT}
)
# The compute cap, as MPS reads it in a client's environment. Not in ENV_KEYS: it only narrows (MPS obeys it
# only below the control daemon's own setting), so a tenant may set it too.
ENV_MPS_THREAD_PERCENTAGE = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"


class EnvDelivery(StrEnum):
    """How the limits reach a container; one setting, shared by the scheduler and the webhook.

    - `configmap` (gpufrac delivery): the webhook adds an `envFrom` to an env ConfigMap per GPU container,
      and the scheduler creates it at bind, so any driver gets the limits;
    - `annotations-only`: NVIDIA's operator reads the annotations and injects the env (a CUDA 13.4 driver
      with NVIDIA's operator).
    """

    CONFIGMAP = "configmap"
    ANNOTATIONS_ONLY = "annotations-only"


# gpufrac delivery (`EnvDelivery.CONFIGMAP`): the webhook names a per-pod env ConfigMap (a random name under
# the prefix, since a pod created with generateName has no name yet at admission) and records it in the
# annotation; the scheduler creates it, labelled and immutable, owned by the pod, at bind. Only the
# scheduler may write ConfigMaps that carry the prefix or the label.
ENV_CONFIGMAP_ANNOTATION = "gpufrac.io/env-configmap"
ENV_CONFIGMAP_PREFIX = "gpufrac-env-"
ENV_CONFIGMAP_LABEL = "gpufrac.io/env"

# The UID of the pod a bind was meant for, written by the scheduler's Binding together with the contract.
# kube-apiserver v1.20 ignores a Binding's UID, so a Binding sent for a pod that was deleted and recreated
# under the same name meanwhile binds the successor; on a bound pod whose UID differs from this value the
# contract was granted to another pod, and the scheduler deletes it (scheduler/binder.py).
BOUND_UID_ANNOTATION = "gpufrac.io/bound-uid"

# The fault domain a bound pod's sm-sharing shares were placed in, written by the scheduler's Binding: the
# pod's namespace, or the group an admin's namespace label names (`gpufrac scheduler --fault-domain-label`).
# Read back from the pod, so a restart or a relabelled namespace never moves a bound share to another group.
FAULT_DOMAIN_ANNOTATION = "gpufrac.io/fault-domain"

# The queue a pod was placed in, written with its contract at bind: with queues, a running pod counts there
# for good, whatever its PodGroup or labels say later (a PodGroup's queue changed under running pods made
# their queue look idle, so it passed its quota and reclaimed other teams' pods).
BOUND_QUEUE_ANNOTATION = "gpufrac.io/bound-queue"

# The label ("true") of the pods that hold a shared GPU from a device plugin for the scheduler
# (scheduler/reservations.py): their GPU is the shares' GPU, so a count of GPUs in use skips them.
RESERVATION_LABEL = "gpufrac.io/reservation"

# A tenant's consent ("true") to have the pod moved (evicted through the Eviction API, to be recreated by its
# controller and placed again) when the scheduler needs its room for a pod that fits nowhere
# (defragmentation, scheduler/mover.py). Only pods a controller owns are moved: a bare pod would be lost.
MOVABLE_ANNOTATION = "gpufrac.io/movable"


def env_configmap_name(base: str, container: str) -> str:
    """The env ConfigMap of one GPU container: `<base>-<container>`, `base` being the annotation's value.

    One per container, because `envFrom` imports a whole ConfigMap and two GPU containers of one pod must
    not see each other's devices.
    """
    return f"{base}-{container}"


def container_key(container: str, suffix: str) -> str:
    """The per-container key for `suffix`: gpufrac's `gpufrac.io/container.<container>.<suffix>` for its own
    suffixes, NVIDIA's `nvidia.com/container.<container>.<suffix>` for every other."""
    prefix = GPUFRAC_CONTAINER_PREFIX if suffix in GPUFRAC_CONTAINER_SUFFIXES else CONTAINER_PREFIX
    return f"{prefix}{container}.{suffix}"


# The keys a relist reads are few ("nvidia.com/container.main.gpus.devices" on thousands of pods), and a
# key's family never changes: the readers below are memoized, within a bound a flood of keys cannot pass.
@functools.lru_cache(maxsize=4096)
def container_prefix(key: str) -> str | None:
    """The per-container family `key` is in (`nvidia.com/container.` or `gpufrac.io/container.`), if any."""
    if not key.startswith(_FAMILY_PREFIXES):  # most keys: one C call, no loop
        return None
    return next(prefix for prefix in CONTAINER_FAMILIES if key.startswith(prefix))


@functools.lru_cache(maxsize=4096)
def split_container_key(key: str) -> tuple[str, str] | None:
    """`(container, suffix)` for a key under either per-container family, None for any other key.

    Container names are DNS labels and never hold a dot, so the container ends at the first dot; the suffix
    is returned unchecked, for the caller to reject with the list of its family's (`CONTAINER_FAMILIES`).
    """
    prefix = container_prefix(key)
    if prefix is None:
        return None
    container, _, suffix = key[len(prefix) :].partition(".")
    return container, suffix


@functools.lru_cache(maxsize=4096)
def is_devices_key(key: str) -> bool:
    """True for `nvidia.com/container.<c>.gpus.devices`, the key that grants GPUs (and nothing spelled like
    it under another family)."""
    split = split_container_key(key)
    return split is not None and key == container_key(split[0], DEVICES)


def is_contract_key(key: str) -> bool:
    """True for every key that takes part in the contract, whoever writes it."""
    return key in POD_KEYS or container_prefix(key) is not None


def is_scheduler_owned(key: str) -> bool:
    """True for the keys a tenant may never write: `nvidia.com/container.<c>.gpus.devices`, the
    `gpufrac.io/bound-uid` marker that names the pod a Binding was meant for (a tenant who set it could only
    make the scheduler take their own pod for a misbound one, but nothing but a Binding writes it), the
    `gpufrac.io/fault-domain` a Binding records (a tenant who set it could join another's MPS server), and
    the `gpufrac.io/bound-queue` it records (a tenant who set it could count its pods in another queue).

    The devices key is what grants GPUs: the node side mounts the GPUs it names and sets
    `NVIDIA_VISIBLE_DEVICES` from it, so a tenant who could write it could take any GPU on the node. The
    webhook denies it on create and on update, and `gpufrac validate` warns when a manifest sets it.

    The resolved `gpu-memory.request` and `gpu-memory.limit` the scheduler writes at bind are deliberately
    *not* in this set, because they carry the same names as the NVIDIA keys a tenant may set to ask for
    memory; a predicate on the name alone cannot tell the two apart. They are protected instead by two rules:

    - a tenant who asks for container c's share with `gpu-fraction` or `gpu-memory` may not also set c's
      `gpu-memory.request`/`.limit` (`parse_pod` rejects the mix), so on such a pod those keys can only have
      come from the scheduler, which writes them together with `gpus.devices`;
    - once a pod carries any `gpus.devices` key it is bound, and the webhook denies every change to a key
      for which `is_contract_key` is true, so no limit can be raised after the scheduler counted it.
    """
    return key in (BOUND_UID_ANNOTATION, FAULT_DOMAIN_ANNOTATION, BOUND_QUEUE_ANNOTATION) or is_devices_key(
        key
    )
