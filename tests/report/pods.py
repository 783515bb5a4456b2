"""Pods and nodes as the API returns them once gpufrac's scheduler has bound them, for the report's tests."""

from __future__ import annotations

from typing import Any

from gpufrac import contract
from gpufrac.contract import keys, node_inventory


def node(name: str, gpus: int = 2, **annotations: str) -> dict[str, Any]:
    labels = {node_inventory.GPU_COUNT_LABEL: str(gpus), node_inventory.GPU_MEMORY_LABEL: "16384"}
    return {"metadata": {"name": name, "labels": labels, "annotations": annotations}}


def pod(
    name: str,
    *,
    node: str = "n1",
    namespace: str = "ml",
    share: tuple[str, ...] = (),
    request_mib: int = 4096,
    limit_mib: int = 8192,
    mode: str = "time-slicing",
    whole: tuple[str, ...] = (),
    whole_count: int = 0,
    phase: str = "Running",
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A bound pod of one container `main`: a share on the devices `share`, or whole GPUs on `whole` (or
    `whole_count` given by a device plugin, with no devices written); neither for a pod without GPUs."""
    annotations: dict[str, str] = {}
    if share:
        annotations[keys.NUM_DEVICES] = str(len(share))
        placement = contract.PodPlacement(
            shares=(
                contract.SharePlacement("main", share, request_mib, limit_mib, contract.ComputeMode(mode)),
            )
        )
        annotations |= {keys.GPU_MEMORY: f"{request_mib}Mi", **contract.render_annotations(placement)}
    count = len(whole) or whole_count
    if whole:
        placement = contract.PodPlacement(whole=(contract.WholeGpuPlacement("main", whole),))
        annotations |= contract.render_annotations(placement)
    limits = {keys.GPU_RESOURCE: str(count)} if count else {}
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{name}",
            "annotations": annotations,
            "labels": labels or {},
        },
        "spec": {
            "nodeName": node,
            "containers": [{"name": "main", "image": "busybox", "resources": {"limits": limits}}],
        },
        "status": {"phase": phase},
    }
