"""The node's GPU inventory as the scheduler reads it (format in `contract.node_inventory`), and how
strongly limits hold.

Pure: the agent hands in the NVML snapshot and the Node's current labels and annotations, and gets back the
merge patch to send, or None when the Node already says it all, so a steady node costs no writes.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from gpufrac.contract import node_inventory
from gpufrac.contract.node_inventory import Enforcement, GpuInfo
from gpufrac.node.nvml import Snapshot

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


def gpus(snapshot: Snapshot, previous: Sequence[GpuInfo]) -> tuple[GpuInfo, ...]:
    """The GPUs to publish. With NVML down, the ones published before, all unhealthy: the scheduler must
    stop placing on them, but the pods already there still count. A GPU whose UUID or model NVML could not
    read keeps what was published for its index."""
    if snapshot.error:
        return tuple(replace(gpu, healthy=False) for gpu in previous)
    known = {gpu.index: gpu for gpu in previous}
    found = []
    for sample in snapshot.gpus:
        before = known.get(sample.index)
        found.append(
            GpuInfo(
                index=sample.index,
                uuid=sample.uuid or (before.uuid if before else f"unknown-{sample.index}"),
                model=sample.model or (before.model if before else "unknown"),
                memory_mib=sample.memory_mib or (before.memory_mib if before else 0),
                healthy=sample.healthy,
            )
        )
    return tuple(found)


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
    metadata: Mapping[str, Any], *, gpus: Sequence[GpuInfo], driver_version: str, level: Enforcement
) -> dict[str, Any] | None:
    """The merge patch that brings the Node's labels and annotations up to date; None if nothing changes.

    The `nvidia.com/gpu.*` labels are written only where absent: GPU Feature Discovery owns them where it
    runs. An unknown driver version (NVML down) leaves the driver labels as they were.
    """
    have_labels: Mapping[str, str] = metadata.get("labels") or {}
    have_annotations: Mapping[str, str] = metadata.get("annotations") or {}
    want_annotations = {node_inventory.GPUS_ANNOTATION: node_inventory.dump_gpus(gpus)}
    want_labels = {node_inventory.ENFORCEMENT_LABEL: level.value}
    major = node_inventory.driver_major(driver_version)
    if major is not None:
        want_annotations[node_inventory.DRIVER_VERSION_ANNOTATION] = driver_version
        want_labels[node_inventory.DRIVER_MAJOR_LABEL] = str(major)
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
