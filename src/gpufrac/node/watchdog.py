"""The watchdog's decisions, as data in and data out: GPU processes and the contracts of the pods on the
node in, per-share usage and findings out. The agent does the I/O (NVML, /proc, the API) and the acting.

A process belongs to a container through its cgroup (see `procfs`), and a container to a pod through the
`containerID` in any of the pod's status lists: `containerStatuses`, `initContainerStatuses` (init
containers and sidecars) and `ephemeralContainerStatuses` (`kubectl debug`). Its memory counts against the
share of that container on that GPU; several processes of one container on one GPU share one limit. Their
SM utilization adds up likewise, reported against the share's compute cap; a share over its cap is no
finding, since MPS itself holds an sm-sharing client to its cap and NVML's samples are only approximate.
Two kinds of finding here, and a third, a share above its request reclaimed for a neighbour's guarantee,
in `bursts`:

- a breach: a share uses more than its limit on a GPU;
- a process without a contract: in no container, in a container of no pod on this node, in a container
  whose pod has no GPU contract (or a broken or unreadable one), in a container of a share pod that is not
  one of its share containers (an init container, a sidecar, a debug container or another app container:
  the contract grants GPUs to named containers only, so the GPU is being used outside the share), or on a
  GPU its contract does not grant. This is how the watchdog sees GPUs claimed through routes the webhook
  cannot see (docs/architecture.md, threat model).

A container the kubelet's device plugin gave GPUs to (under any of NVIDIA's names, `nvidia_resources`,
read from the PodResources API) holds them whole: that grant is its contract on those GPUs, beside any
annotation contract, so its processes there are never findings; one given a MIG instance, whose GPU the
agent cannot tell, holds every GPU so.

A pod is read defensively: one that cannot be read (a poison object) gives containers with a `problem`,
whose GPU processes are findings like any without a contract; it never stops the others being read.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gpufrac import contract
from gpufrac.kubeapi.eviction import grace_within
from gpufrac.kubeapi.fields import as_list, as_mapping, is_sidecar
from gpufrac.node import nvidia_resources, procfs
from gpufrac.node.nvml import MIB

log = logging.getLogger(__name__)


class Mode(StrEnum):
    """What the agent does about a finding."""

    KILL = "kill"  # SIGKILL the offending processes
    EVICT = "evict"  # evict the pod through the eviction API (PodDisruptionBudgets apply)
    REPORT = "report"  # an Event and a log line only


class Kind(StrEnum):
    """A finding's kind; the value is the Event reason."""

    BREACH = "GPUMemoryLimitExceeded"
    NO_CONTRACT = "GPUProcessWithoutContract"
    BURST = "GPUBurstReclaimed"  # a share above its request, reclaimed for a neighbour's (`bursts`)


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str
    uid: str
    deleting: bool = False
    eviction_grace: int | None = (
        None  # the grace period to evict it with (`BREACH_GRACE_SECONDS`); None: its own
    )


@dataclass(frozen=True)
class Container:
    """A container on the node, and the GPUs its pod's contract gives it; `limit_mib` None for whole GPUs,
    `devices` empty for a container with no GPU contract. `plugin_devices`: the GPUs the device plugin gave
    it, whole (no limit there). `compute_percent`: its share's compute cap, None for none."""

    pod: PodRef
    name: str
    devices: tuple[str, ...] = ()
    request_mib: int | None = None
    limit_mib: int | None = None
    sm_sharing: bool = False
    problem: str = ""  # why the pod has no usable contract, when it has a broken one
    kind: str = "container"  # or "init container", "sidecar container", "ephemeral container"
    pod_has_shares: bool = False  # the pod's contract grants GPUs, to other containers if not this one
    plugin_devices: tuple[str, ...] = ()
    priority: int = 0  # the pod's spec.priority: the lowest is reclaimed first (`bursts`)
    compute_percent: int | None = None


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str


@dataclass(frozen=True)
class Process:
    """A GPU process as the agent saw it this interval."""

    pid: int
    start_time: int
    gpu: Gpu
    used_bytes: int | None
    container_id: str | None
    sm_percent: int | None = None

    @property
    def ident(self) -> str:
        """pid@start: a pid alone may be reused by a later process."""
        return f"{self.pid}@{self.start_time}"


@dataclass(frozen=True)
class Usage:
    """What one share uses on one GPU: memory, and the percentage of the GPU's SMs its processes kept busy
    (those NVML took no sample of count 0)."""

    container: Container
    gpu: Gpu
    used_bytes: int
    processes: tuple[Process, ...]
    sm_percent: int = 0


@dataclass(frozen=True)
class Finding:
    kind: Kind
    gpu: Gpu
    processes: tuple[Process, ...]
    detail: str  # one sentence for the Event and the log line
    container: Container | None = None  # the container the processes are in, if any pod on the node has it
    used_bytes: int = 0
    limit_bytes: int | None = None

    @property
    def key(self) -> str:
        """Stable across ticks and agent restarts while the same processes are at fault."""
        owner = f"{self.container.pod.uid}/{self.container.name}" if self.container else "-"
        who = ",".join(sorted(p.ident for p in self.processes))
        return f"{self.kind.value}/{owner}/{self.gpu.uuid}/{who}"


@dataclass(frozen=True)
class Assessment:
    usages: tuple[Usage, ...]
    findings: tuple[Finding, ...]


# Where a pod lists the IDs of its running containers, and what each list's containers are called.
_STATUS_LISTS = (
    ("containerStatuses", "container"),
    ("initContainerStatuses", "init container"),
    ("ephemeralContainerStatuses", "ephemeral container"),
)
MAX_PROBLEM = 300  # characters of a broken contract quoted in a finding: values are the tenant's
# The longest grace period a pod evicted for what its processes do on a GPU gets (its own, if shorter, and
# Kubernetes' default): until it ends they go on taking memory promised to its neighbours, and a tenant
# whose pod asks for a day of it, deaf to SIGTERM, kept it a day.
BREACH_GRACE_SECONDS = 30


def containers_on_node(
    pods: Iterable[Mapping[str, Any]],
    *,
    device_plugin: Mapping[tuple[str, str, str], tuple[str, ...]] | None = None,
) -> dict[str, Container]:
    """Container ID -> container, for every container of the pods on the node (plain dicts as the API
    returns them), init, sidecar and ephemeral containers included. `device_plugin`: (namespace, pod,
    container) -> the `nvidia.com/gpu` device IDs the kubelet gave it (GPU UUIDs, or indices)."""
    plugin = device_plugin or {}
    found: dict[str, Container] = {}
    for pod in pods:
        metadata = as_mapping(pod.get("metadata"))
        # Being deleted, the grace period it has is the deletion's (its tenant may delete it with a day's).
        deleting = metadata.get("deletionTimestamp") is not None
        own_grace = (
            metadata.get("deletionGracePeriodSeconds")
            if deleting
            else as_mapping(pod.get("spec")).get("terminationGracePeriodSeconds")
        )
        ref = PodRef(
            namespace=str(metadata.get("namespace") or ""),
            name=str(metadata.get("name") or ""),
            uid=str(metadata.get("uid") or ""),
            deleting=deleting,
            eviction_grace=grace_within(own_grace, BREACH_GRACE_SECONDS),
        )
        grants, problem = _grants(pod)
        sidecars = _sidecars(pod)
        priority = _priority(pod)
        status = as_mapping(pod.get("status"))
        for field, kind in _STATUS_LISTS:
            for entry in as_list(status.get(field)):
                entry = as_mapping(entry)
                if not isinstance(entry.get("containerID"), str) or not entry["containerID"]:
                    continue  # not started yet
                name = str(entry.get("name") or "")
                devices, request, limit, sm_sharing, cap = grants.get(name, ((), None, None, False, None))
                container_id = procfs.runtime_container_id(entry["containerID"])
                found[container_id] = Container(
                    ref,
                    name,
                    devices,
                    request,
                    limit,
                    sm_sharing,
                    problem,
                    kind="sidecar container" if kind == "init container" and name in sidecars else kind,
                    pod_has_shares=bool(grants),
                    plugin_devices=plugin.get((ref.namespace, ref.name, name), ()),
                    priority=priority,
                    compute_percent=cap,
                )
    return found


_Grant = tuple[tuple[str, ...], int | None, int | None, bool, int | None]


def _grants(pod: Mapping[str, Any]) -> tuple[dict[str, _Grant], str]:
    """Per container: (devices, request MiB, limit MiB, sm-sharing, compute cap). A contract that cannot be
    read, or that was granted to another pod (`contract.granted_to_another`), is a problem, not a grant, nor
    a crash: a ContractError says why; anything else is a pod the contract parser could not take at all (a
    poison object), and a tick must go on with the other pods."""
    if (owner := contract.granted_to_another(pod)) is not None:
        return {}, f"its GPU contract was granted to another pod (UID {_short(owner)}) bound under its name"
    try:
        placement = contract.parse_placement(pod)
    except contract.ContractError as error:
        return {}, f"its GPU contract is broken ({_short(str(error))})"
    except Exception as error:  # a poison pod: reported as a finding, never the end of the tick
        log.exception("cannot read the GPU contract of a pod; treating it as having none")
        return {}, f"its GPU contract cannot be read ({type(error).__name__})"
    if placement is None:
        return {}, ""
    grants: dict[str, _Grant] = {
        share.container: (
            share.devices,
            share.request_mib,
            share.limit_mib,
            share.mode is contract.ComputeMode.SM_SHARING,
            share.compute_percent,
        )
        for share in placement.shares
    }
    for whole in placement.whole:
        grants[whole.container] = (whole.devices, None, None, False, None)
    return grants, ""


def _sidecars(pod: Mapping[str, Any]) -> set[str]:
    """Init containers that keep running beside the app (`restartPolicy: Always`)."""
    spec = as_mapping(pod.get("spec"))
    return {
        str(as_mapping(init).get("name")) for init in as_list(spec.get("initContainers")) if is_sidecar(init)
    }


def _priority(pod: Mapping[str, Any]) -> int:
    """The pod's spec.priority (set by the API server from its PriorityClass); 0, Kubernetes' default,
    where it is absent or not a whole number."""
    value = as_mapping(pod.get("spec")).get("priority")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _short(text: str) -> str:
    return text if len(text) <= MAX_PROBLEM else text[: MAX_PROBLEM - 3] + "..."


def assess(
    processes: Iterable[Process], containers: Mapping[str, Container], *, gpus: Iterable[Gpu] = ()
) -> Assessment:
    """Usage per share and GPU, every breach, and every process without a contract, in a stable order.

    Shares on `gpus` appear in the usage even with no process running, at zero.
    """
    by_share: dict[tuple[str, Gpu], list[Process]] = {}
    for gpu in gpus:
        for container_id, held in containers.items():
            if _limited(held, gpu):
                by_share[container_id, gpu] = []
    findings: list[Finding] = []
    for process in processes:
        container = containers.get(process.container_id) if process.container_id else None
        why = _no_contract(process, container)
        if why:
            findings.append(Finding(Kind.NO_CONTRACT, process.gpu, (process,), why, container))
            continue
        assert process.container_id is not None and container is not None
        by_share.setdefault((process.container_id, process.gpu), []).append(process)
    usages = []
    for (container_id, gpu), members in by_share.items():
        container = containers[container_id]
        used = sum(p.used_bytes or 0 for p in members)
        if not _limited(container, gpu) or container.limit_mib is None:
            continue  # whole GPUs: no limit below the GPU itself
        sm = sum(p.sm_percent or 0 for p in members)
        usages.append(Usage(container, gpu, used, tuple(members), sm))
        limit = container.limit_mib * MIB
        if used > limit:
            detail = (
                f"container {container.name} of pod {container.pod.namespace}/{container.pod.name} uses "
                f"{used // MIB} MiB on GPU {gpu.index} ({gpu.uuid}), "
                f"over its limit of {container.limit_mib} MiB"
            )
            findings.append(Finding(Kind.BREACH, gpu, tuple(members), detail, container, used, limit))
    findings.sort(key=lambda f: (f.kind.value, f.gpu.index, f.key))
    usages.sort(
        key=lambda u: (u.container.pod.namespace, u.container.pod.name, u.container.name, u.gpu.index)
    )
    return Assessment(tuple(usages), tuple(findings))


def _no_contract(process: Process, container: Container | None) -> str:
    """Why `process` has no contract on its GPU; empty if it has one."""
    where = f"process {process.pid} on GPU {process.gpu.index} ({process.gpu.uuid})"
    if process.container_id is None:
        return f"{where} runs in no container"
    if container is None:
        return f"{where} runs in container {process.container_id[:12]}, which is in no pod on this node"
    owner = f"{container.kind} {container.name} of pod {container.pod.namespace}/{container.pod.name}"
    if _holds_by_plugin(container, process.gpu):
        return ""
    if not container.devices and container.pod_has_shares:
        return f"{where} runs in {owner}, which is not one of the pod's GPU containers"
    if not container.devices and not container.plugin_devices:
        return f"{where} runs in {owner}, " + (container.problem or "which has no GPU contract")
    if not _holds(container, process.gpu):
        granted = ",".join(container.devices + container.plugin_devices)
        return f"{where} runs in {owner}, whose contract grants GPUs {granted}, not this one"
    return ""


def _names(devices: tuple[str, ...], gpu: Gpu) -> bool:
    """Devices name GPUs by UUID, or by index where UUIDs were unknown."""
    return gpu.uuid in devices or str(gpu.index) in devices


def _holds(container: Container, gpu: Gpu) -> bool:
    return _names(container.devices, gpu)


def _holds_by_plugin(container: Container, gpu: Gpu) -> bool:
    """The device plugin gave the container this GPU, or a part of a GPU it cannot name (a MIG instance,
    `nvidia_resources.ANY_GPU`), which may be this one."""
    return _names(container.plugin_devices, gpu) or nvidia_resources.ANY_GPU in container.plugin_devices


def _limited(container: Container, gpu: Gpu) -> bool:
    """The container's share on `gpu` has a limit: its contract grants the GPU with one, and the device
    plugin did not give it the whole GPU (a MIG instance of an unknown GPU lifts no limit)."""
    return (
        container.limit_mib is not None
        and _holds(container, gpu)
        and not _names(container.plugin_devices, gpu)
    )
