"""Kubernetes objects (plain dicts, as the API returns them) to and from the engine's types. Pure.

Everything the scheduler knows comes from here: a Node becomes a `NodeSpec`, a pending Pod a `PodDemand`,
a bound Pod a `Placement` read back from the annotations bind wrote. Keeping this pure is what lets a
restarted scheduler rebuild exactly the state it had, and lets tests check the conversions without an
API server.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpufrac import contract
from gpufrac.cluster.model import Assignment, GpuSpec, NodeSpec, Placement, PodDemand
from gpufrac.contract import keys, node_inventory

Obj = Mapping[str, Any]
log = logging.getLogger("gpufrac.scheduler")

DEFAULT_SCHEDULER = "default-scheduler"
_DONE_PHASES = ("Succeeded", "Failed")


def meta(obj: Obj) -> Obj:
    return obj.get("metadata") or {}


def pod_key(pod: Obj) -> str:
    """namespace/name: how people (logs, Events, `gpufrac top`) name a pod."""
    return f"{meta(pod).get('namespace', '')}/{meta(pod).get('name', '')}"


def pod_uid(pod: Obj) -> str:
    """How the scheduler tells pods apart: a pod recreated under the same name is another pod. Every pod the
    API returns has a UID; namespace/name stands in only for hand-made objects without one."""
    return str(meta(pod).get("uid") or pod_key(pod))


def cpu_milli(quantity: str | None) -> int:
    return 0 if not quantity else math.ceil(contract.parse_quantity(str(quantity)) * 1000)


def memory_mib(quantity: str | None) -> int:
    return 0 if not quantity else math.ceil(contract.parse_quantity(str(quantity)) / 2**20)


# ---- nodes ------------------------------------------------------------------------------------------------


def node_spec(node: Obj) -> NodeSpec:
    """The node's allocatable CPU and memory, and its GPUs.

    GPUs come from the node agent's `gpufrac.io/gpus` annotation when present (UUIDs and health), otherwise
    from the GPU Feature Discovery labels (count, memory in MiB, product), with indices standing in for
    UUIDs, as the contract allows.
    """
    name = meta(node)["name"]
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    node_meta_labels = meta(node).get("labels") or {}
    inventory = _agent_inventory(node)
    if inventory is not None:
        gpus = tuple(
            GpuSpec(gpu.index, gpu.uuid, gpu.model, gpu.memory_mib, healthy=gpu.healthy) for gpu in inventory
        )
    else:
        count = _int_label(node_meta_labels, node_inventory.GPU_COUNT_LABEL)
        memory = _int_label(node_meta_labels, node_inventory.GPU_MEMORY_LABEL)
        model = node_meta_labels.get(node_inventory.GPU_PRODUCT_LABEL, "")
        gpus = tuple(GpuSpec(i, str(i), model, memory) for i in range(count)) if memory else ()
    return NodeSpec(
        name=name,
        cpu_milli=cpu_milli(allocatable.get("cpu")),
        memory_mib=memory_mib(allocatable.get("memory")),
        gpus=gpus,
    )


def _agent_inventory(node: Obj) -> tuple[node_inventory.GpuInfo, ...] | None:
    """The agent's GPU list, or None when there is none or it cannot be read (then labels are used)."""
    text = (meta(node).get("annotations") or {}).get(node_inventory.GPUS_ANNOTATION)
    if text is None:
        return None
    try:
        return node_inventory.load_gpus(text)
    except ValueError as error:
        log.warning(
            "node %s: ignoring its %s annotation: %s",
            meta(node).get("name"),
            node_inventory.GPUS_ANNOTATION,
            error,
        )
        return None


def _int_label(labels: Mapping[str, str], key: str) -> int:
    try:
        return max(0, int(labels.get(key, "0")))
    except ValueError:
        return 0


def node_ready(node: Obj) -> bool:
    """Ready, and not cordoned: the only nodes a new pod may land on."""
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def node_labels_of(node: Obj) -> Mapping[str, str]:
    return meta(node).get("labels") or {}


def node_taints(node: Obj) -> list[Obj]:
    return [
        t
        for t in (node.get("spec") or {}).get("taints") or []
        if t.get("effect") in ("NoSchedule", "NoExecute")
    ]


# ---- pods -------------------------------------------------------------------------------------------------


def is_done(pod: Obj) -> bool:
    """A pod that holds nothing any more: finished, or being deleted."""
    return (pod.get("status") or {}).get("phase") in _DONE_PHASES or bool(meta(pod).get("deletionTimestamp"))


def node_name(pod: Obj) -> str:
    return (pod.get("spec") or {}).get("nodeName") or ""


def scheduler_name(pod: Obj) -> str:
    return (pod.get("spec") or {}).get("schedulerName") or DEFAULT_SCHEDULER


def pod_resources(pod: Obj) -> tuple[int, int]:
    """CPU (milli) and memory (MiB) the pod requests: the sum over containers, or the largest init
    container if that is more, as kube-scheduler counts them."""
    spec = pod.get("spec") or {}

    def requests(container: Obj) -> tuple[int, int]:
        wanted = (container.get("resources") or {}).get("requests") or {}
        return cpu_milli(wanted.get("cpu")), memory_mib(wanted.get("memory"))

    running = [requests(c) for c in spec.get("containers") or []]
    init = [requests(c) for c in spec.get("initContainers") or []]
    cpu = max(sum(c for c, _ in running), max((c for c, _ in init), default=0))
    memory = max(sum(m for _, m in running), max((m for _, m in init), default=0))
    return cpu, memory


def pod_demand(pod: Obj) -> PodDemand:
    """What a pending pod needs; raises `ContractError` for a pod that breaks the contract."""
    request = contract.parse_pod(pod)
    cpu, memory = pod_resources(pod)
    return PodDemand(
        name=pod_uid(pod),
        cpu_milli=cpu,
        memory_mib=memory,
        whole=request.whole,
        shares=request.shares,
        priority=int((pod.get("spec") or {}).get("priority") or 0),
    )


def bound_placement(pod: Obj, node: NodeSpec) -> Placement:
    """Where a bound pod sits, read back from its annotations.

    A pod that gpufrac did not place (another scheduler's, or a CPU-only pod) still holds its CPU and
    memory, so it becomes a placement with no GPUs. Raises `ContractError` when the annotations name GPUs
    the node does not have.
    """
    cpu, memory = pod_resources(pod)
    placed = contract.parse_placement(pod)
    assignments: list[Assignment] = []
    if placed is not None:
        index = {gpu.uuid: gpu.index for gpu in node.gpus} | {str(gpu.index): gpu.index for gpu in node.gpus}
        sizes = {gpu.index: gpu.memory_mib for gpu in node.gpus}

        def indices(container: str, devices: Sequence[str]) -> tuple[int, ...]:
            unknown = [device for device in devices if device not in index]
            if unknown:
                key = keys.container_key(container, keys.DEVICES)
                raise contract.ContractError(
                    key, ",".join(devices), f"node {node.name} has no GPU {unknown[0]}"
                )
            return tuple(index[device] for device in devices)

        for share in placed.shares:
            gpus = indices(share.container, share.devices)
            assignments.append(
                Assignment(share.container, gpus, share.request_mib, share.limit_mib, share.mode)
            )
        for whole in placed.whole:
            gpus = indices(whole.container, whole.devices)
            size = min(sizes[gpu] for gpu in gpus)
            assignments.append(Assignment(whole.container, gpus, size, size, None))
    return Placement(pod_uid(pod), node.name, cpu, memory, tuple(assignments))


# ---- binding ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BindPlan:
    """Everything bind writes for one pod, computed before any write so a failure leaves nothing half done.

    `annotations` travel on the Binding: the contract, and the UID of the pod they were granted to
    (`keys.BOUND_UID_ANNOTATION`).
    """

    annotations: dict[str, str]
    configmaps: dict[str, dict[str, str]]  # env ConfigMap name -> its data; empty without gpufrac delivery


def bound_for(pod: Obj) -> str | None:
    """The UID of the pod the Binding that bound `pod` was meant for; None on a pod gpufrac did not bind
    (or an older gpufrac did, before it wrote the marker)."""
    value = (meta(pod).get("annotations") or {}).get(keys.BOUND_UID_ANNOTATION)
    return value if isinstance(value, str) else None


def misbound(pod: Obj) -> bool:
    """A bound pod carrying a contract granted to another pod: its same-name predecessor's Binding bound it
    (kube-apiserver v1.20 ignores a Binding's UID). It must not keep GPUs it was not given."""
    marker, uid = bound_for(pod), meta(pod).get("uid")
    return bool(node_name(pod)) and marker is not None and bool(uid) and marker != uid


def holds_binding(pod: Obj, *, uid: str, node: str, plan: BindPlan) -> bool:
    """`pod`, read back after a Binding whose answer was lost, is bound as that Binding would bind it: the
    same pod, on `node`, carrying every annotation of `plan`."""
    annotations = meta(pod).get("annotations") or {}
    return (
        meta(pod).get("uid") == uid
        and node_name(pod) == node
        and all(annotations.get(key) == value for key, value in plan.annotations.items())
    )


def bind_plan(
    pod: Obj,
    placement: Placement,
    node: NodeSpec,
    *,
    mps_pipe_directory: str,
    env_delivery: contract.EnvDelivery,
) -> BindPlan:
    uuids = {gpu.index: gpu.uuid for gpu in node.gpus}
    shares = tuple(
        contract.SharePlacement(
            a.container, tuple(uuids[g] for g in a.gpus), a.request_mib, a.limit_mib, a.mode
        )
        for a in placement.assignments
        if a.mode is not None
    )
    whole = tuple(
        contract.WholeGpuPlacement(a.container, tuple(uuids[g] for g in a.gpus))
        for a in placement.assignments
        if a.mode is None
    )
    placed = contract.PodPlacement(shares, whole)
    base = (meta(pod).get("annotations") or {}).get(keys.ENV_CONFIGMAP_ANNOTATION, "")
    configmaps: dict[str, dict[str, str]] = {}
    if env_delivery == contract.EnvDelivery.CONFIGMAP and base:
        env = contract.render_env(placed, mps_pipe_directory=mps_pipe_directory)
        configmaps = {keys.env_configmap_name(base, container): dict(data) for container, data in env.items()}
    annotations = dict(contract.render_annotations(placed))
    # The marker goes with a contract only: a pod bound with no GPUs holds nothing another pod was granted.
    # Every pod the API returns has a UID; hand-made test objects may have none.
    if annotations and meta(pod).get("uid"):
        annotations[keys.BOUND_UID_ANNOTATION] = str(meta(pod)["uid"])
    return BindPlan(annotations, configmaps)
