"""What the agent publishes on its Node, and the enforcement levels."""

from __future__ import annotations

import json

import pytest

from gpufrac.contract import node_inventory
from gpufrac.contract.node_inventory import Enforcement, GpuInfo
from gpufrac.node import inventory
from gpufrac.node.nvml import GpuSample, Snapshot

A100 = "NVIDIA A100-SXM4-80GB"


def _snapshot(*healthy: bool, driver: str = "535.104.05") -> Snapshot:
    gpus = tuple(
        GpuSample(i, f"GPU-{i}", A100, 81920, ok)
        if ok
        else GpuSample(i, "", "", 0, False, error="Unknown Error")
        for i, ok in enumerate(healthy)
    )
    return Snapshot(driver, gpus)


def test_gpus_from_a_snapshot() -> None:
    assert inventory.gpus(_snapshot(True, True), ()) == (
        GpuInfo(0, "GPU-0", A100, 81920, True),
        GpuInfo(1, "GPU-1", A100, 81920, True),
    )


def test_a_failing_gpu_keeps_what_was_published_for_it() -> None:
    before = (GpuInfo(0, "GPU-0", A100, 81920, True), GpuInfo(1, "GPU-1", A100, 81920, True))
    assert inventory.gpus(_snapshot(True, False), before)[1] == GpuInfo(1, "GPU-1", A100, 81920, False)
    assert inventory.gpus(_snapshot(False), ())[0] == GpuInfo(0, "unknown-0", "unknown", 0, False)


def test_nvml_gone_marks_every_published_gpu_unhealthy() -> None:
    before = (GpuInfo(0, "GPU-0", A100, 81920, True),)
    assert inventory.gpus(Snapshot(error="NVML unavailable"), before) == (
        GpuInfo(0, "GPU-0", A100, 81920, False),
    )
    assert inventory.gpus(Snapshot(error="NVML unavailable"), ()) == ()


@pytest.mark.parametrize(
    ("native", "nvml_ok", "mps", "acting", "level"),
    [
        (True, True, False, False, Enforcement.NATIVE),
        (True, False, False, False, Enforcement.NATIVE),
        (False, True, True, True, Enforcement.MPS),
        (False, True, True, False, Enforcement.MPS),
        (False, True, False, True, Enforcement.WATCHDOG),
        (False, True, False, False, Enforcement.NONE),
        (False, False, True, True, Enforcement.NONE),
    ],
)
def test_enforcement(native: bool, nvml_ok: bool, mps: bool, acting: bool, level: Enforcement) -> None:
    assert inventory.enforcement(native=native, nvml_ok=nvml_ok, mps_healthy=mps, acting=acting) is level


def test_gpu_enforcement() -> None:
    level = inventory.gpu_enforcement
    assert level(Enforcement.NATIVE, healthy=False, sm_sharing=False, acting=False) is Enforcement.NATIVE
    assert level(Enforcement.MPS, healthy=True, sm_sharing=True, acting=True) is Enforcement.MPS
    assert level(Enforcement.MPS, healthy=True, sm_sharing=False, acting=True) is Enforcement.WATCHDOG
    assert level(Enforcement.MPS, healthy=True, sm_sharing=False, acting=False) is Enforcement.NONE
    assert level(Enforcement.WATCHDOG, healthy=False, sm_sharing=False, acting=True) is Enforcement.NONE


def test_patch_fills_gfd_labels_only_where_absent() -> None:
    gpus = inventory.gpus(_snapshot(True, True), ())
    patch = inventory.node_patch({}, gpus=gpus, driver_version="535.104.05", level=Enforcement.WATCHDOG)
    assert patch is not None
    assert patch["metadata"]["labels"] == {
        node_inventory.ENFORCEMENT_LABEL: "watchdog",
        node_inventory.DRIVER_MAJOR_LABEL: "535",
        node_inventory.GPU_COUNT_LABEL: "2",
        node_inventory.GPU_MEMORY_LABEL: "81920",
        node_inventory.GPU_PRODUCT_LABEL: "NVIDIA-A100-SXM4-80GB",
    }
    annotations = patch["metadata"]["annotations"]
    assert annotations[node_inventory.DRIVER_VERSION_ANNOTATION] == "535.104.05"
    assert [gpu["uuid"] for gpu in json.loads(annotations[node_inventory.GPUS_ANNOTATION])] == [
        "GPU-0",
        "GPU-1",
    ]

    gfd = {
        node_inventory.GPU_COUNT_LABEL: "8",
        node_inventory.GPU_MEMORY_LABEL: "81559",
        node_inventory.GPU_PRODUCT_LABEL: "H100",
    }
    patch = inventory.node_patch({"labels": gfd}, gpus=gpus, driver_version="535.1", level=Enforcement.MPS)
    assert patch is not None and set(patch["metadata"]["labels"]) == {
        node_inventory.ENFORCEMENT_LABEL,
        node_inventory.DRIVER_MAJOR_LABEL,
    }


def test_an_up_to_date_node_needs_no_patch() -> None:
    gpus = inventory.gpus(_snapshot(True), ())
    patch = inventory.node_patch({}, gpus=gpus, driver_version="535.1", level=Enforcement.MPS)
    assert patch is not None
    assert (
        inventory.node_patch(patch["metadata"], gpus=gpus, driver_version="535.1", level=Enforcement.MPS)
        is None
    )
    # NVML down: the driver labels stay, the GPUs turn unhealthy and the level drops.
    down = inventory.gpus(Snapshot(error="gone"), inventory.published_gpus(patch["metadata"]["annotations"]))
    again = inventory.node_patch(patch["metadata"], gpus=down, driver_version="", level=Enforcement.NONE)
    assert again is not None and again["metadata"]["labels"] == {node_inventory.ENFORCEMENT_LABEL: "none"}
    assert json.loads(again["metadata"]["annotations"][node_inventory.GPUS_ANNOTATION])[0]["healthy"] is False


def test_an_unreadable_annotation_is_replaced() -> None:
    assert inventory.published_gpus({node_inventory.GPUS_ANNOTATION: "not json"}) == ()
    assert inventory.published_gpus({}) == ()
