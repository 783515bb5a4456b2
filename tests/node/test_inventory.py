"""What the agent publishes on its Node, and the enforcement levels."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from gpufrac.contract import node_inventory
from gpufrac.contract.node_inventory import GPU_RESOURCE, DevicePluginMode, Enforcement, GpuInfo
from gpufrac.node import inventory
from gpufrac.node.kubelet.podresources import ContainerDevices
from gpufrac.node.nvidia_resources import ANY_GPU
from gpufrac.node.nvml import GpuSample, Snapshot

A100 = "NVIDIA A100-SXM4-80GB"
COEXIST = DevicePluginMode.COEXIST


def _snapshot(*healthy: bool, driver: str = "535.104.05") -> Snapshot:
    gpus = tuple(
        GpuSample(i, f"GPU-{i}", A100, 81920, ok)
        if ok
        else GpuSample(i, "", "", 0, False, error="Unknown Error")
        for i, ok in enumerate(healthy)
    )
    return Snapshot(driver, gpus)


def test_gpus_from_a_snapshot() -> None:
    """Allocatable: the total less what the driver reserves (unknown: none) and one CUDA context."""
    assert inventory.gpus(_snapshot(True, True), ()) == (
        GpuInfo(0, "GPU-0", A100, 81920, True, 81920 - 512),
        GpuInfo(1, "GPU-1", A100, 81920, True, 81920 - 512),
    )
    reserved = Snapshot("535.1", (GpuSample(0, "GPU-0", A100, 81920, True, reserved_mib=600),))
    assert inventory.gpus(reserved, (), context_mib=400)[0].allocatable_mib == 81920 - 1000
    assert inventory.allocatable_mib(100, 90, 512) == 1  # never below 1: the annotation stays readable


def test_a_replica_of_a_shared_gpu_is_that_gpu() -> None:
    """NVIDIA's device plugin with time-slicing or MPS sharing names replicas `<uuid>::<n>`."""
    listing = [
        ContainerDevices("ml", "a", "app", GPU_RESOURCE, ("GPU-1::0", "GPU-1::3")),
        ContainerDevices("ml", "a", "app", GPU_RESOURCE, ("GPU-2::1",)),
        ContainerDevices("ml", "b", "app", "example.com/fpga", ("f::0",)),
    ]
    grants = inventory.gpu_grants(listing)
    assert grants == {("ml", "a", "app"): ("GPU-1", "GPU-2")}
    assert inventory.holders(grants, _snapshot(True, True, True)) == {0: "", 1: "ml/a", 2: "ml/a"}


def test_gpus_handed_out_under_nvidias_other_names_are_grants_of_their_gpus() -> None:
    """`renameByDefault` time-slicing hands out `nvidia.com/gpu.shared` replicas, MIG's mixed strategy
    `nvidia.com/mig-<profile>` instances of a GPU the agent cannot tell (`ANY_GPU`, holding no GPU)."""
    listing = [
        ContainerDevices("ml", "a", "app", "nvidia.com/gpu.shared", ("GPU-1::3",)),
        ContainerDevices("ml", "b", "app", "nvidia.com/mig-1g.10gb", ("MIG-5f0c1a2b",)),
        ContainerDevices("ml", "c", "app", "example.com/gpu", ("GPU-2",)),
    ]
    grants = inventory.gpu_grants(listing)
    assert grants == {("ml", "a", "app"): ("GPU-1",), ("ml", "b", "app"): (ANY_GPU,)}
    assert inventory.holders(grants, _snapshot(True, True, True)) == {0: "", 1: "ml/a", 2: ""}


def test_a_running_container_asking_any_nvidia_gpu_resource_must_be_granted() -> None:
    def pod(resource: str) -> dict[str, object]:
        return {
            "metadata": {"namespace": "ml", "name": "a"},
            "spec": {"containers": [{"name": "app", "resources": {"limits": {resource: "1"}}}]},
            "status": {"containerStatuses": [{"name": "app", "state": {"running": {}}}]},
        }

    for resource in (GPU_RESOURCE, "nvidia.com/gpu.shared", "nvidia.com/mig-3g.40gb"):
        assert inventory.ungranted([pod(resource)], {}, {resource: "4"}) == ["ml/a/app"], resource
        assert inventory.ungranted([pod(resource)], {}, None) == ["ml/a/app"], resource  # Node unread
    assert inventory.ungranted([pod("example.com/fpga")], {}, {"example.com/fpga": "1"}) == []


def test_a_gpu_resource_the_node_does_not_have_need_not_be_granted() -> None:
    """The kubelet runs a container asking for an extended resource no device plugin of the node advertises,
    and grants it nothing: a tenant naming the node itself must not make every answer look incomplete."""
    pod = {
        "metadata": {"namespace": "evil", "name": "squatter"},
        "spec": {"containers": [{"name": "app", "resources": {"limits": {"nvidia.com/mig-1g.5gb": "1"}}}]},
        "status": {"containerStatuses": [{"name": "app", "state": {"running": {}}}]},
    }
    assert inventory.ungranted([pod], {}, {GPU_RESOURCE: "2"}) == []


@pytest.mark.parametrize(
    ("advertised", "allocatable", "shares"),
    [
        (("GPU-0", "GPU-1"), {GPU_RESOURCE: "2"}, False),
        (("GPU-0::0", "GPU-0::1"), {GPU_RESOURCE: "2"}, True),
        ((), {GPU_RESOURCE: "3"}, True),
        ((), {"nvidia.com/gpu.shared": "8"}, True),
        ((), {"nvidia.com/mig-1g.10gb": "1"}, True),
        ((), {GPU_RESOURCE: "2", "nvidia.com/gpu.shared": "0"}, False),  # a plugin gone: the kubelet keeps 0
        (("MIG-5f0c1a2b",), {GPU_RESOURCE: "1"}, True),  # MIG's single strategy
    ],
)
def test_a_plugin_handing_out_parts_of_gpus_shares_them(
    advertised: tuple[str, ...], allocatable: dict[str, str], shares: bool
) -> None:
    assert inventory.plugin_shares(advertised, allocatable, 2) is shares


def test_holders_come_from_the_kubelets_gpu_grants() -> None:
    snapshot = _snapshot(True, True, True)
    grants = {("ml", "a", "app"): ("GPU-1",), ("ml", "b", "app"): ("2",), ("ml", "c", "app"): ("GPU-9",)}
    holders = inventory.holders(grants, snapshot)
    assert holders == {0: "", 1: "ml/a", 2: "ml/b"}
    published = inventory.gpus(snapshot, (), holders=holders)
    assert [gpu.holder for gpu in published] == ["", "ml/a", "ml/b"]
    # The kubelet unreadable (None): the holders published before stay, NVML down or not.
    assert [gpu.holder for gpu in inventory.gpus(snapshot, published)] == ["", "ml/a", "ml/b"]
    down = inventory.gpus(Snapshot(error="gone"), published, holders={1: ""})
    assert [(gpu.holder, gpu.healthy) for gpu in down] == [("", False)] * 3


def test_resolve_mode() -> None:
    off = {node_inventory.OPERATOR_DEVICE_PLUGIN_LABEL: "false"}
    assert inventory.resolve_mode("auto", {}) is DevicePluginMode.COEXIST
    assert inventory.resolve_mode("auto", off) is DevicePluginMode.MANAGED
    assert inventory.resolve_mode("none", off) is DevicePluginMode.NONE
    assert inventory.kubelet_gpus({"nvidia.com/gpu": "4"}) == 4
    assert inventory.kubelet_gpus({"nvidia.com/gpu": "4k"}) == inventory.kubelet_gpus(None) == 0
    assert (
        inventory.kubelet_gpus({"nvidia.com/gpu.shared": "8", "nvidia.com/mig-1g.10gb": "2", "cpu": "4"})
        == 10
    )


def _facts(**changes: object) -> inventory.Facts:
    base: dict[str, object] = {
        "mode": DevicePluginMode.COEXIST,
        "nvml_error": "",
        "gpu_count": 2,
        "published": True,
        "kubelet_gpus": 2,
    }
    return inventory.Facts(**{**base, **changes})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({}, "AgentReady"),
        ({"nvml_error": "NVML unavailable: gone", "gpu_count": 0}, "NVMLUnavailable"),
        ({"gpu_count": 0}, "NoGPUs"),
        ({"published": False}, "InventoryNotPublished"),
        ({"mps_supervised": True}, "MPSUnhealthy"),
        ({"mps_supervised": True, "mps_healthy": True}, "AgentReady"),
        ({"pod_resources_error": "socket gone"}, "PodResourcesUnreadable"),
        ({"kubelet_gpus": 0}, "NoDevicePlugin"),
        ({"mode": DevicePluginMode.NONE, "kubelet_gpus": 0, "pod_resources_error": "x"}, "AgentReady"),
        ({"mode": DevicePluginMode.MANAGED, "plugin_conflict": "another plugin"}, "DevicePluginConflict"),
        ({"mode": DevicePluginMode.MANAGED}, "DevicePluginNotRegistered"),
        ({"mode": DevicePluginMode.MANAGED, "plugin_registered": True, "kubelet_gpus": 0}, "AgentReady"),
    ],
)
def test_readiness_names_the_first_prerequisite_that_fails(changes: dict[str, object], reason: str) -> None:
    ready = inventory.readiness(_facts(**changes))
    assert ready.reason == reason and ready.ready is (reason == "AgentReady")
    assert "\n" not in ready.message and ready.message


def test_a_device_plugin_failure_is_told_even_behind_another_failure() -> None:
    """The watchdog only reports while one holds (`Agent._only_report_while`), whatever the node's reason."""
    facts = _facts(mps_supervised=True, kubelet_gpus=0)
    assert inventory.readiness(facts).reason == "MPSUnhealthy"
    assert inventory.device_plugin_failure(facts) == (
        "NoDevicePlugin",
        "the Node's allocatable has no nvidia.com/gpu: no device plugin runs here",
    )
    assert inventory.device_plugin_failure(_facts()) is None


def test_condition_patch_writes_only_changes_and_moves_the_transition_only_with_the_status() -> None:
    up = inventory.Readiness(True, "AgentReady", "2 GPUs")
    t1, t2, t3 = (datetime(2026, 1, 1, 0, 0, s, tzinfo=UTC) for s in (0, 10, 20))
    first = inventory.condition_patch(None, up, t1)
    assert first is not None
    (condition,) = first["status"]["conditions"]
    assert condition == {
        "type": node_inventory.READY_CONDITION,
        "status": "True",
        "reason": "AgentReady",
        "message": "2 GPUs",
        "lastHeartbeatTime": "2026-01-01T00:00:00Z",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    assert inventory.condition_patch(condition, up, t2) is None
    again = inventory.condition_patch(condition, inventory.Readiness(True, "AgentReady", "3 GPUs"), t2)
    assert (
        again is not None and again["status"]["conditions"][0]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    )
    down = inventory.condition_patch(condition, inventory.Readiness(False, "NoGPUs", "none"), t3)
    assert (
        down is not None and down["status"]["conditions"][0]["lastTransitionTime"] == "2026-01-01T00:00:20Z"
    )
    # Unchanged but a heartbeat old: written again, so a dead agent's condition can be told from a live one's.
    minute = datetime(2026, 1, 1, 0, 1, 0, tzinfo=UTC)
    beat = inventory.condition_patch(condition, up, minute)
    assert beat is not None and beat["status"]["conditions"][0]["lastHeartbeatTime"] == "2026-01-01T00:01:00Z"
    assert beat["status"]["conditions"][0]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    # The clock stepped back an hour: a heartbeat from the future is written again, not kept for an hour.
    back = inventory.condition_patch(condition, up, datetime(2025, 12, 31, 23, 0, 0, tzinfo=UTC))
    assert back is not None and back["status"]["conditions"][0]["lastHeartbeatTime"] == "2025-12-31T23:00:00Z"
    other = [{"type": "Ready", "status": "True"}, condition]
    assert inventory.find_condition(other) == condition and inventory.find_condition(None) is None


def test_plugin_conflict() -> None:
    off = {node_inventory.OPERATOR_DEVICE_PLUGIN_LABEL: "false"}
    assert "label it nvidia.com/gpu.deploy.device-plugin=false" in inventory.plugin_conflict({}, 0, None)
    assert "already advertises 8 nvidia.com/gpu" in inventory.plugin_conflict(off, 8, None)
    assert "already advertises 1 nvidia.com/gpu" in inventory.plugin_conflict(off, 0, ("GPU-a",))
    assert inventory.plugin_conflict(off, 0, ()) == inventory.plugin_conflict(off, 0, None) == ""


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
    patch = inventory.node_patch(
        {}, gpus=gpus, driver_version="535.104.05", level=Enforcement.WATCHDOG, mode=COEXIST
    )
    assert patch is not None
    assert patch["metadata"]["labels"] == {
        node_inventory.ENFORCEMENT_LABEL: "watchdog",
        node_inventory.DEVICE_PLUGIN_LABEL: "coexist",
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
    patch = inventory.node_patch(
        {"labels": gfd}, gpus=gpus, driver_version="535.1", level=Enforcement.MPS, mode=COEXIST
    )
    assert patch is not None and set(patch["metadata"]["labels"]) == {
        node_inventory.ENFORCEMENT_LABEL,
        node_inventory.DEVICE_PLUGIN_LABEL,
    }


def test_an_up_to_date_node_needs_no_patch() -> None:
    gpus = inventory.gpus(_snapshot(True), ())
    patch = inventory.node_patch({}, gpus=gpus, driver_version="535.1", level=Enforcement.MPS, mode=COEXIST)
    assert patch is not None
    assert (
        inventory.node_patch(
            patch["metadata"], gpus=gpus, driver_version="535.1", level=Enforcement.MPS, mode=COEXIST
        )
        is None
    )
    # NVML down: the driver annotation stays, the GPUs turn unhealthy and the level drops.
    down = inventory.gpus(Snapshot(error="gone"), inventory.published_gpus(patch["metadata"]["annotations"]))
    again = inventory.node_patch(
        patch["metadata"], gpus=down, driver_version="", level=Enforcement.NONE, mode=COEXIST
    )
    assert again is not None and again["metadata"]["labels"] == {node_inventory.ENFORCEMENT_LABEL: "none"}
    assert json.loads(again["metadata"]["annotations"][node_inventory.GPUS_ANNOTATION])[0]["healthy"] is False


def test_an_unreadable_annotation_is_replaced() -> None:
    assert inventory.published_gpus({node_inventory.GPUS_ANNOTATION: "not json"}) == ()
    assert inventory.published_gpus({}) == ()
