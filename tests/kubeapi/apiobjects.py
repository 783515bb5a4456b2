"""Nodes and pods as the API returns them (plain dicts, camelCase keys), in one line each."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpufrac.contract import node_inventory
from gpufrac.contract.node_inventory import GpuInfo

GPU_MIB = 16_000
NAMESPACE = "team"


def inventory(
    node_name: str,
    count: int,
    *,
    memory: int = GPU_MIB,
    model: str = "NVIDIA A100",
    unhealthy: Iterable[int] = (),
) -> tuple[GpuInfo, ...]:
    """What the node agent publishes: GPUs with UUIDs `GPU-<node>-<i>`."""
    sick = set(unhealthy)
    return tuple(GpuInfo(i, f"GPU-{node_name}-{i}", model, memory, i not in sick) for i in range(count))


def node(
    name: str,
    *,
    gpus: int = 2,
    memory: int = GPU_MIB,
    product: str = "Tesla-T4",
    cpu: str = "16",
    mem: str = "64Gi",
    ready: bool | None = True,
    cordoned: bool = False,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    taints: Sequence[Mapping[str, str]] = (),
    agent: Sequence[GpuInfo] | None = None,
    gpu_ready: bool | None = True,
) -> dict[str, Any]:
    """A node with GPU Feature Discovery labels; `agent` adds the node agent's `gpufrac.io/gpus`;
    `ready=None` leaves out the Ready condition; `gpu_ready` is the agent's `gpufrac.io/Ready` (None: no
    agent said anything)."""
    notes = dict(annotations or {})
    if agent is not None:
        notes[node_inventory.GPUS_ANNOTATION] = node_inventory.dump_gpus(agent)
    spec: dict[str, Any] = {}
    if cordoned:
        spec["unschedulable"] = True
    if taints:
        spec["taints"] = [dict(taint) for taint in taints]
    conditions = [{"type": "MemoryPressure", "status": "False"}]
    if ready is not None:
        conditions.append({"type": "Ready", "status": "True" if ready else "False"})
    if gpu_ready is not None:
        status = "True" if gpu_ready else "False"
        conditions.append({"type": node_inventory.READY_CONDITION, "status": status, "reason": "Test"})
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "resourceVersion": "1",
            "labels": {
                node_inventory.GPU_COUNT_LABEL: str(gpus),
                node_inventory.GPU_MEMORY_LABEL: str(memory),
                node_inventory.GPU_PRODUCT_LABEL: product,
                **(labels or {}),
            },
            "annotations": notes,
        },
        "spec": spec,
        "status": {"allocatable": {"cpu": cpu, "memory": mem, "pods": "110"}, "conditions": conditions},
    }


def container(
    name: str = "main", *, cpu: str | None = "100m", mem: str | None = None, whole: int = 0
) -> dict[str, Any]:
    requests: dict[str, str] = {}
    if cpu is not None:
        requests["cpu"] = cpu
    if mem is not None:
        requests["memory"] = mem
    limits = {"nvidia.com/gpu": str(whole)} if whole else {}
    return {"name": name, "image": "busybox", "resources": {"requests": requests, "limits": limits}}


def pod(
    name: str,
    *,
    annotations: Mapping[str, str] | None = None,
    containers: Sequence[Mapping[str, Any]] | None = None,
    init_containers: Sequence[Mapping[str, Any]] = (),
    whole: int = 0,
    cpu: str | None = "100m",
    scheduler: str | None = "gpufrac",
    node_name: str | None = None,
    phase: str = "Pending",
    priority: int | None = None,
    created: str = "2024-05-01T12:00:00Z",
    node_selector: Mapping[str, str] | None = None,
    tolerations: Sequence[Mapping[str, str]] = (),
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [dict(c) for c in containers]
        if containers is not None
        else [container(cpu=cpu, whole=whole)]
    }
    if init_containers:
        spec["initContainers"] = [dict(c) for c in init_containers]
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    if node_name is not None:
        spec["nodeName"] = node_name
    if priority is not None:
        spec["priority"] = priority
    if node_selector is not None:
        spec["nodeSelector"] = dict(node_selector)
    if tolerations:
        spec["tolerations"] = [dict(t) for t in tolerations]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "uid": key(name),
            "resourceVersion": "1",
            "creationTimestamp": created,
            "annotations": dict(annotations or {}),
        },
        "spec": spec,
        "status": {"phase": phase},
    }


def bound(pending: Mapping[str, Any], node_name: str, annotations: Mapping[str, str]) -> dict[str, Any]:
    """`pending` as the API returns it after a bind wrote `annotations` and the Binding."""
    result = copy.deepcopy(dict(pending))
    result["metadata"]["annotations"].update(annotations)
    result["spec"]["nodeName"] = node_name
    result["status"] = {"phase": "Running"}
    return result


def with_status(obj: Mapping[str, Any], **status: Any) -> dict[str, Any]:
    result = copy.deepcopy(dict(obj))
    result["status"] = {**result.get("status", {}), **status}
    return result


def key(name: str) -> str:
    """How the scheduler keys the pod `pod(name)` makes: by its UID."""
    return f"uid-{name}"
