"""The node's GPU inventory as the scheduler reads it (format in `contract.node_inventory`), how strongly
limits hold, who hands out `nvidia.com/gpu`, and whether the node is ready for gpufrac.

Pure: the agent hands in the NVML snapshot, the kubelet's device grants and the Node as read, and gets back
the patches to send, or None when the Node already says it all, so a steady node costs no writes.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from gpufrac.contract import memory_resource, node_inventory
from gpufrac.contract.node_inventory import DevicePluginMode, Enforcement, GpuInfo
from gpufrac.contract.quantity import MIB, format_mib, parse_quantity
from gpufrac.kubeapi.fields import as_list, as_mapping
from gpufrac.node import nvidia_resources
from gpufrac.node.nvml import GpuSample, Snapshot
from gpufrac.node.watchdog import Mode

# What a CUDA context takes before its process allocates anything: the context's own allocations (its
# code modules, stack and printf/malloc heaps), a few hundred MiB on current GPUs, outside any share. A
# share's memory is of what is left, so a tenant granted its portion can allocate all of it.
DEFAULT_CUDA_CONTEXT_MIB = 512

# `--device-plugin`: a mode, or `auto` (see `resolve_mode`).
AUTO = "auto"

ContainerKey = tuple[str, str, str]  # namespace, pod, container

log = logging.getLogger(__name__)


def published_gpus(annotations: Mapping[str, str]) -> tuple[GpuInfo, ...]:
    """The GPUs the Node lists now; none if the annotation is absent or unreadable (it is rewritten)."""
    text = annotations.get(node_inventory.GPUS_ANNOTATION)
    if not text:
        return ()
    try:
        return node_inventory.load_gpus(text)
    except ValueError as error:
        log.warning("ignoring the Node's %s: %s", node_inventory.GPUS_ANNOTATION, error)
        return ()


def gpus(
    snapshot: Snapshot,
    previous: Sequence[GpuInfo],
    *,
    holders: Mapping[int, str] | None = None,
    context_mib: int = DEFAULT_CUDA_CONTEXT_MIB,
) -> tuple[GpuInfo, ...]:
    """The GPUs to publish. With NVML down, the ones published before, all unhealthy: the scheduler must
    stop placing on them, but the pods already there still count. A GPU whose UUID, model or memory NVML
    could not read keeps what was published for its index. `holders` (GPU index -> `namespace/pod`, from
    the kubelet) replaces every GPU's holder; None (the kubelet unreadable, or no device plugin) keeps the
    holders published before."""
    known = {gpu.index: gpu for gpu in previous}
    if snapshot.error:
        found = [replace(gpu, healthy=False) for gpu in previous]
    else:
        found = [_gpu(sample, known.get(sample.index), context_mib) for sample in snapshot.gpus]
    if holders is not None:
        found = [replace(gpu, holder=holders.get(gpu.index, "")) for gpu in found]
    return tuple(found)


def _gpu(sample: GpuSample, before: GpuInfo | None, context_mib: int) -> GpuInfo:
    if sample.memory_mib:
        allocatable: int | None = allocatable_mib(sample.memory_mib, sample.reserved_mib, context_mib)
    else:
        allocatable = before.allocatable_mib if before else None
    return GpuInfo(
        index=sample.index,
        uuid=sample.uuid or (before.uuid if before else f"unknown-{sample.index}"),
        model=sample.model or (before.model if before else "unknown"),
        memory_mib=sample.memory_mib or (before.memory_mib if before else 0),
        healthy=sample.healthy,
        allocatable_mib=allocatable,
        holder=before.holder if before else "",
    )


def allocatable_mib(total_mib: int, reserved_mib: int | None, context_mib: int) -> int:
    """What processes can allocate on a GPU: its total, less what the driver reserves (unknown counts as
    none) and one CUDA context's allowance; at least 1, so the annotation stays readable."""
    return max(1, total_mib - (reserved_mib or 0) - context_mib)


class Granted(Protocol):
    """A container's devices as the kubelet's PodResources API lists them."""

    @property
    def namespace(self) -> str: ...
    @property
    def pod(self) -> str: ...
    @property
    def container(self) -> str: ...
    @property
    def resource(self) -> str: ...
    @property
    def device_ids(self) -> tuple[str, ...]: ...


def gpu_grants(listing: Iterable[Granted]) -> dict[ContainerKey, tuple[str, ...]]:
    """(namespace, pod, container) -> the GPUs the kubelet gave that container under any of NVIDIA's names
    (`nvidia_resources`), each once: a replica `<uuid>::<n>` is its GPU, a MIG instance `ANY_GPU`. A grant
    left out would make its pods' processes findings, killed as contract-less, and its GPU held by nobody."""
    found: dict[ContainerKey, dict[str, None]] = {}
    for entry in listing:
        if nvidia_resources.names_gpus(entry.resource) and entry.device_ids:
            key = (entry.namespace, entry.pod, entry.container)
            gpus = (nvidia_resources.gpu_of(entry.resource, device) for device in entry.device_ids)
            found.setdefault(key, {}).update(dict.fromkeys(gpus))
    return {key: tuple(devices) for key, devices in found.items()}


def ungranted(
    pods: Iterable[Mapping[str, Any]],
    grants: Mapping[ContainerKey, Sequence[str]],
    allocatable: Mapping[str, Any] | None,
) -> list[str]:
    """The running containers (`namespace/pod/container`) that ask for GPUs under one of NVIDIA's names and
    that the kubelet's PodResources answer lists no device for. The kubelet allocates devices before a
    container starts, so a running one missing means an answer from a kubelet that restarted and has not yet
    synced its pods: its GPUs would look held by nobody (a share could be placed on them) and its processes
    would look contract-less (kill mode would kill them), so such an answer is not used.

    Only resources in the Node's `allocatable` count (all of them where the Node was not read): the kubelet
    runs a container asking for an extended resource it does not know and grants it nothing, so any tenant
    naming the node itself could otherwise keep every answer unused, and the watchdog blind, at will."""
    known = None if allocatable is None else set(allocatable)
    missing: list[str] = []
    for pod in pods:
        metadata, spec, status = (as_mapping(pod.get(part)) for part in ("metadata", "spec", "status"))
        namespace, name = str(metadata.get("namespace") or ""), str(metadata.get("name") or "")
        running = {
            entry.get("name")
            for entry in map(as_mapping, as_list(status.get("containerStatuses")))
            if as_mapping(entry.get("state")).get("running") is not None
        }
        for container in map(as_mapping, as_list(spec.get("containers"))):
            limits = as_mapping(as_mapping(container.get("resources")).get("limits"))
            asks = any(
                nvidia_resources.names_gpus(str(resource))
                and amount not in (0, "0")
                and (known is None or resource in known)
                for resource, amount in limits.items()
            )
            container_name = container.get("name")
            if (
                isinstance(container_name, str)
                and container_name in running
                and asks
                and (namespace, name, container_name) not in grants
            ):
                missing.append(f"{namespace}/{name}/{container_name}")
    return missing


def holders(grants: Mapping[ContainerKey, Sequence[str]], snapshot: Snapshot) -> dict[int, str]:
    """GPU index -> the `namespace/pod` the device plugin gave it to ("" for none). Device IDs are GPU
    UUIDs as NVIDIA's plugin names them, or indices; a MIG instance (`ANY_GPU`) holds no GPU it can name."""
    names = {gpu.uuid: gpu.index for gpu in snapshot.gpus if gpu.uuid}
    names.update({str(gpu.index): gpu.index for gpu in snapshot.gpus})
    found = {gpu.index: "" for gpu in snapshot.gpus}
    for (namespace, pod, _), devices in sorted(grants.items()):
        for device in devices:
            index = names.get(device)
            if index is not None and not found[index]:
                found[index] = f"{namespace}/{pod}"
    return found


def resolve_mode(setting: str, labels: Mapping[str, str]) -> DevicePluginMode:
    """`--device-plugin`: a mode as given, or for `auto`, `managed` where NVIDIA's GPU operator was told
    not to run its device plugin on the node, else `coexist`."""
    if setting != AUTO:
        return DevicePluginMode(setting)
    if labels.get(node_inventory.OPERATOR_DEVICE_PLUGIN_LABEL) == "false":
        return DevicePluginMode.MANAGED
    return DevicePluginMode.COEXIST


def watchdog_mode(default: Mode, labels: Mapping[str, str]) -> Mode:
    """The node's watchdog mode: its `gpufrac.io/watchdog` label where that names a mode, so that acting is
    opted into per node pool by labelling its nodes; else the agent's own `--mode`."""
    try:
        return Mode(labels.get(node_inventory.WATCHDOG_MODE_LABEL, default.value))
    except ValueError:
        return default


def kubelet_gpus(allocatable: Mapping[str, str] | None) -> int:
    """The devices of NVIDIA's GPU resources (`nvidia_resources`) in the Node's status.allocatable: what
    device plugins advertise."""
    return sum(
        int(text) if text.isascii() and text.isdigit() else 0
        for resource, text in (allocatable or {}).items()
        if nvidia_resources.names_gpus(resource)
    )


def plugin_shares(advertised: Sequence[str], allocatable: Mapping[str, str] | None, gpu_count: int) -> bool:
    """Whether the device plugin hands out parts of GPUs: replicas `<uuid>::<n>` or MIG instances among the
    devices it advertises, any of NVIDIA's names for parts of GPUs in the Node's allocatable
    (`nvidia.com/gpu.shared`, `nvidia.com/mig-<profile>`), or more devices than the node has GPUs. A
    reservation then takes one part, and the others of its GPU still go to other pods, so no share there is
    safe."""
    parts = any(
        nvidia_resources.names_parts(resource) and kubelet_gpus({resource: text})
        for resource, text in (allocatable or {}).items()
    )
    return parts or any(map(nvidia_resources.is_part, advertised)) or kubelet_gpus(allocatable) > gpu_count


def plugin_conflict(labels: Mapping[str, str], kubelet_count: int, advertised: Sequence[str] | None) -> str:
    """Why gpufrac must not serve `nvidia.com/gpu` itself (managed mode, before it registered); empty when
    nothing else does. Two plugins handing out the same GPUs, under any of NVIDIA's names, would each hand
    out every GPU."""
    label = node_inventory.OPERATOR_DEVICE_PLUGIN_LABEL
    if labels.get(label) != "false":
        return f"NVIDIA's device plugin is not switched off on this node: label it {label}=false"
    if kubelet_count > 0 or advertised:
        count = kubelet_count or len(advertised or ())
        return (
            f"another device plugin already advertises {count} {node_inventory.GPU_RESOURCE} (or NVIDIA's "
            f"other GPU resources): stop it on this node (GPU operator: {label}=false), or run the agent "
            "with --device-plugin coexist"
        )
    return ""


def native(labels: Mapping[str, str], label: tuple[str, str]) -> bool:
    """NVIDIA's operator shows on the node that the driver holds limits there (`--native-label`)."""
    key, value = label
    return labels.get(key) == value


def enforcement(*, native: bool, nvml_ok: bool, mps_healthy: bool, acting: bool) -> Enforcement:
    """The node's level (see `node_inventory.Enforcement`); `native`: NVIDIA's operator shows on the node
    that the driver holds limits there; `acting`: the watchdog kills or evicts."""
    if native:
        return Enforcement.NATIVE
    if not nvml_ok:
        return Enforcement.NONE  # nothing can be observed, so nothing is held
    if mps_healthy:
        return Enforcement.MPS
    return Enforcement.WATCHDOG if acting else Enforcement.NONE


def gpu_enforcement(node: Enforcement, *, healthy: bool, sm_sharing: bool, acting: bool) -> Enforcement:
    """One GPU's level: MPS holds only sm-sharing shares; everything else on the GPU is the watchdog's."""
    if node is Enforcement.NATIVE:
        return node
    if not healthy:
        return Enforcement.NONE
    if node is Enforcement.MPS and sm_sharing:
        return Enforcement.MPS
    return Enforcement.WATCHDOG if acting else Enforcement.NONE


def node_patch(
    metadata: Mapping[str, Any],
    *,
    gpus: Sequence[GpuInfo],
    driver_version: str,
    level: Enforcement,
    mode: DevicePluginMode,
) -> dict[str, Any] | None:
    """The merge patch that brings the Node's labels and annotations up to date; None if nothing changes.

    The `nvidia.com/gpu.*` labels are written only where absent: GPU Feature Discovery owns them where it
    runs. An unknown driver version (NVML down) leaves the driver annotation as it was.
    """
    have_labels: Mapping[str, str] = metadata.get("labels") or {}
    have_annotations: Mapping[str, str] = metadata.get("annotations") or {}
    want_annotations = {node_inventory.GPUS_ANNOTATION: node_inventory.dump_gpus(gpus)}
    want_labels = {
        node_inventory.ENFORCEMENT_LABEL: level.value,
        node_inventory.DEVICE_PLUGIN_LABEL: mode.value,
    }
    if driver_version:
        want_annotations[node_inventory.DRIVER_VERSION_ANNOTATION] = driver_version
    if gpus:
        first = min(gpus, key=lambda gpu: gpu.index)
        defaults = {
            node_inventory.GPU_COUNT_LABEL: str(len(gpus)),
            node_inventory.GPU_MEMORY_LABEL: str(min(gpu.memory_mib for gpu in gpus)),
            node_inventory.GPU_PRODUCT_LABEL: node_inventory.label_value(first.model),
        }
        want_labels.update(
            {key: value for key, value in defaults.items() if key not in have_labels and value}
        )
    patch: dict[str, Any] = {}
    changed_labels = {k: v for k, v in want_labels.items() if have_labels.get(k) != v}
    changed_annotations = {k: v for k, v in want_annotations.items() if have_annotations.get(k) != v}
    if changed_labels:
        patch["labels"] = changed_labels
    if changed_annotations:
        patch["annotations"] = changed_annotations
    return {"metadata": patch} if patch else None


def capacity_patch(
    status: Mapping[str, Any], *, gpus: Sequence[GpuInfo], reference_mib: int
) -> dict[str, Any] | None:
    """The merge patch for `nodes/status` that advertises the node's `gpufrac.io/gpu-memory`, or None when
    it already does. Allocatable is written with capacity: the kubelet copies one to the other only at its
    next status update, and a share pod bound before then would be refused for want of it."""
    want = memory_resource.capacity_mib((gpu.usable_mib for gpu in gpus), reference_mib)
    resource = memory_resource.GPU_MEMORY_RESOURCE
    have = [_mib_or_none((status.get(field) or {}).get(resource)) for field in ("capacity", "allocatable")]
    if have == [want, want]:
        return None
    quantity = format_mib(want)
    return {"status": {"capacity": {resource: quantity}, "allocatable": {resource: quantity}}}


def _mib_or_none(quantity: object) -> int | None:
    """A quantity in whole MiB; None for one missing or unreadable. (The API writes `81920Mi` as `80Gi`.)"""
    try:
        return int(parse_quantity(str(quantity)) / MIB) if quantity is not None else None
    except ValueError:
        return None


@dataclass(frozen=True)
class Facts:
    """What one tick found that decides readiness. `pod_resources_error`, `plugin_*` and `kubelet_gpus`
    matter only in the modes that need them."""

    mode: DevicePluginMode
    nvml_error: str
    gpu_count: int
    published: bool = False  # the inventory patch went through (or was not needed)
    mps_supervised: bool = False  # the agent runs the sm-sharing MPS daemon, so sm-sharing is offered
    mps_healthy: bool = False
    pod_resources_error: str = ""
    plugin_conflict: str = ""
    plugin_error: str = ""
    plugin_registered: bool = False
    kubelet_gpus: int = 0
    plugin_shares: bool = False  # the device plugin hands out parts of GPUs (`plugin_shares`)


@dataclass(frozen=True)
class Readiness:
    ready: bool
    reason: str  # CamelCase, as a condition's reason
    message: str  # one line


def readiness(facts: Facts) -> Readiness:
    """`gpufrac.io/Ready`: True only when every prerequisite of the node's mode holds; else False with
    the first that fails, so the scheduler never places on a node whose GPUs it cannot account for."""
    failed = _first_failure(facts)
    if failed is not None:
        return Readiness(False, *failed)
    return Readiness(
        True, "AgentReady", f"{facts.gpu_count} GPUs published; device plugin mode {facts.mode.value}"
    )


def device_plugin_failure(facts: Facts) -> tuple[str, str] | None:
    """(reason, message) of the first device-plugin prerequisite that fails, whatever else does; None when
    none does. While one fails, the grants the agent read may not be all there are (a plugin it does not
    know, or none read), so the watchdog only reports: a process they leave out is not one to kill."""
    mode = facts.mode
    checks = (
        (
            mode is not DevicePluginMode.NONE and bool(facts.pod_resources_error),
            "PodResourcesUnreadable",
            f"cannot tell which GPUs the device plugin gave to whom: {facts.pod_resources_error}",
        ),
        (
            mode is DevicePluginMode.MANAGED and bool(facts.plugin_conflict),
            "DevicePluginConflict",
            facts.plugin_conflict,
        ),
        (
            mode is DevicePluginMode.MANAGED and not facts.plugin_registered,
            "DevicePluginNotRegistered",
            facts.plugin_error or f"gpufrac's {node_inventory.GPU_RESOURCE} device plugin is not registered",
        ),
        (
            mode is DevicePluginMode.COEXIST and facts.kubelet_gpus == 0,
            "NoDevicePlugin",
            f"the Node's allocatable has no {node_inventory.GPU_RESOURCE}: no device plugin runs here",
        ),
        (
            mode is DevicePluginMode.COEXIST and facts.plugin_shares,
            "DevicePluginSharesGPUs",
            "the device plugin hands out parts of this node's GPUs (time-slicing or MPS replicas, or MIG "
            "slices): a GPU gpufrac reserves could still be handed to other pods; switch that sharing off on "
            "this node, or keep it out of gpufrac (gpufrac.io/enabled)",
        ),
    )
    return _first(checks)


def _first_failure(facts: Facts) -> tuple[str, str] | None:
    checks = (
        (bool(facts.nvml_error), "NVMLUnavailable", facts.nvml_error),
        (facts.gpu_count == 0, "NoGPUs", "NVML sees no GPU on this node"),
        (not facts.published, "InventoryNotPublished", "the GPU inventory could not be written to the Node"),
        (
            facts.mps_supervised and not facts.mps_healthy,
            "MPSUnhealthy",
            "the sm-sharing MPS control daemon is not running",
        ),
    )
    return _first(checks) or device_plugin_failure(facts)


def _first(checks: Iterable[tuple[bool, str, str]]) -> tuple[str, str] | None:
    for failed, reason, message in checks:
        if failed:
            return reason, " ".join(message.split())
    return None


def find_condition(conditions: Iterable[Mapping[str, Any]] | None) -> Mapping[str, Any] | None:
    """The Node's `gpufrac.io/Ready` condition, as read."""
    for condition in conditions or ():
        if condition.get("type") == node_inventory.READY_CONDITION:
            return condition
    return None


def condition_patch(
    current: Mapping[str, Any] | None, want: Readiness, now: datetime.datetime
) -> dict[str, Any] | None:
    """The strategic merge patch for `nodes/status` that sets the condition (keyed by type, so the
    kubelet's conditions stay), or None when status, reason and message are already what they should be and
    the heartbeat is younger than `HEARTBEAT_SECONDS`: a steady node costs one write a minute, so the
    scheduler can tell a live agent from a dead one. `lastTransitionTime` moves only when the status does. A
    heartbeat ahead of `now` (the node's clock stepped back) is written again at once: left, it would keep
    a dead agent's condition fresh for as long as the clock was ahead."""
    status = "True" if want.ready else "False"
    beat = node_inventory.condition_time(current.get("lastHeartbeatTime")) if current is not None else None
    fresh = beat is not None and 0 <= (now - beat).total_seconds() < node_inventory.HEARTBEAT_SECONDS
    if (
        current is not None
        and fresh
        and (current.get("status"), current.get("reason"), current.get("message"))
        == (status, want.reason, want.message)
    ):
        return None
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    same = current is not None and current.get("status") == status and current.get("lastTransitionTime")
    condition = {
        "type": node_inventory.READY_CONDITION,
        "status": status,
        "reason": want.reason,
        "message": want.message,
        "lastHeartbeatTime": stamp,
        "lastTransitionTime": current["lastTransitionTime"] if same and current is not None else stamp,
    }
    return {"status": {"conditions": [condition]}}
