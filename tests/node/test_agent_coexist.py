"""The agent beside a device plugin: holders from the kubelet, the device-plugin mode label, the
gpufrac.io/Ready condition, gpufrac's own device plugin in managed mode, and native enforcement."""

from __future__ import annotations

import datetime
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpufrac.contract import node_inventory
from gpufrac.contract.node_inventory import Enforcement
from gpufrac.node.agent import Agent, Settings
from gpufrac.node.kubelet.device_plugin import DevicePluginError
from gpufrac.node.kubelet.podresources import ContainerDevices, PodResourcesError
from gpufrac.node.nvml import FakeBackend
from gpufrac.node.watchdog import Mode
from gpufrac.testing.fakehost import FakeHost, RecordingKiller, container_id

from .fake_kube import FakeNodeClient

GPU = node_inventory.GPU_RESOURCE


@dataclass
class FakePodResources:
    listing: list[ContainerDevices] = field(default_factory=list)
    advertised: dict[str, tuple[str, ...]] | None = None
    error: str = ""
    closed: bool = False

    def list(self) -> tuple[ContainerDevices, ...]:
        if self.error:
            raise PodResourcesError(self.error)
        return tuple(self.listing)

    def allocatable(self) -> dict[str, tuple[str, ...]] | None:
        return self.advertised

    def close(self) -> None:
        self.closed = True


@dataclass
class FakePlugin:
    devices: tuple[str, ...]
    fail: str = ""
    registered: bool = False
    health: dict[str, bool] = field(default_factory=dict)
    stopped: bool = False

    def start(self) -> None:
        if self.fail:
            raise DevicePluginError(self.fail)
        self.registered = True

    def set_health(self, healthy: Mapping[str, bool]) -> None:
        self.health = dict(healthy)

    def stop(self) -> None:
        self.registered, self.stopped = False, True


class Wall:
    def __init__(self) -> None:
        self.now = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)

    def __call__(self) -> datetime.datetime:
        return self.now

    def later(self, seconds: int) -> None:
        self.now += datetime.timedelta(seconds=seconds)


RESOURCE = "gpufrac.io/gpu-memory"


def node(labels: dict[str, str] | None = None, allocatable: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "n1", "labels": dict(labels or {}), "annotations": {}},
        "status": {"allocatable": {"cpu": "8", **(allocatable or {})}, "conditions": []},
    }


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    made = FakeHost(tmp_path / "host")
    made.add_gpus(2, memory_mib=16384, model="Tesla T4")
    made.write()
    return made


@dataclass
class Rig:
    agent: Agent
    client: FakeNodeClient
    kubelet: FakePodResources
    plugins: list[FakePlugin]
    killer: RecordingKiller
    wall: Wall


def rig(
    host: FakeHost,
    kube_node: dict[str, Any],
    *,
    device_plugin: str = "coexist",
    mode: Mode = Mode.REPORT,
    plugin_fail: str = "",
    **settings: Any,
) -> Rig:
    client = FakeNodeClient(kube_node)
    kubelet = FakePodResources()
    plugins: list[FakePlugin] = []
    killer = RecordingKiller()
    wall = Wall()

    def make_plugin(devices: Sequence[str]) -> FakePlugin:
        plugins.append(FakePlugin(tuple(devices), fail=plugin_fail))
        return plugins[-1]

    agent = Agent(
        Settings(node_name="n1", mode=mode, proc_root=host.proc, device_plugin=device_plugin, **settings),
        client=client,  # type: ignore[arg-type]
        nvml=FakeBackend(host.nvml_file),
        killer=killer,
        pod_resources=kubelet,
        plugin_server=make_plugin,
        wall_clock=wall,
    )
    return Rig(agent, client, kubelet, plugins, killer, wall)


def published(client: FakeNodeClient) -> list[node_inventory.GpuInfo]:
    return list(
        node_inventory.load_gpus(client.node["metadata"]["annotations"][node_inventory.GPUS_ANNOTATION])
    )


async def test_coexist_publishes_holders_and_is_ready_and_a_steady_node_costs_no_writes(
    host: FakeHost,
) -> None:
    r = rig(host, node(allocatable={GPU: "2"}))
    r.kubelet.listing = [
        ContainerDevices("ml", "trainer-0", "app", GPU, (host.uuid(1),)),
        ContainerDevices("ml", "trainer-0", "app", "example.com/fpga", ("fpga-0",)),
    ]
    r.kubelet.advertised = {GPU: (host.uuid(0), host.uuid(1))}
    report = await r.agent.tick()
    assert report.problems == [] and report.advertised == (host.uuid(0), host.uuid(1))
    assert [gpu.holder for gpu in published(r.client)] == ["", "ml/trainer-0"]
    assert r.client.node["metadata"]["labels"][node_inventory.DEVICE_PLUGIN_LABEL] == "coexist"
    condition = r.client.condition()
    assert condition is not None and (condition["status"], condition["reason"]) == ("True", "AgentReady")
    assert condition["lastTransitionTime"] == condition["lastHeartbeatTime"] == "2026-01-01T00:00:00Z"

    writes = len(r.client.writes)
    r.wall.later(30)
    await r.agent.tick()
    assert len(r.client.writes) == writes  # nothing changed: nothing written
    r.wall.later(30)
    await r.agent.tick()  # a minute on: the heartbeat alone, so the scheduler knows the agent lives
    assert len(r.client.writes) == writes + 1
    beat = r.client.condition()
    assert beat is not None and beat["lastHeartbeatTime"] == "2026-01-01T00:01:00Z"
    assert beat["lastTransitionTime"] == "2026-01-01T00:00:00Z" and beat["status"] == "True"
    writes += 1

    r.kubelet.listing = []  # the trainer is gone
    await r.agent.tick()
    assert [gpu.holder for gpu in published(r.client)] == ["", ""]


async def test_pod_resources_unreadable_keeps_holders_and_the_node_is_not_ready(host: FakeHost) -> None:
    r = rig(host, node(allocatable={GPU: "2"}), mode=Mode.KILL)
    r.kubelet.listing = [ContainerDevices("ml", "trainer-0", "app", GPU, ("0",))]  # an index works too
    await r.agent.tick()
    assert published(r.client)[0].holder == "ml/trainer-0"
    first = r.client.condition()
    assert first is not None and first["status"] == "True"

    r.kubelet.error = "the kubelet's PodResources socket is gone"
    host.add_process(4242, container=container_id(9))
    host.write({0: [(4242, 100)]})
    r.wall.later(10)
    for _ in range(2):  # a process without a contract is acted on only in its second interval
        report = await r.agent.tick()
    assert any("PodResources socket is gone" in problem for problem in report.problems)
    assert published(r.client)[0].holder == "ml/trainer-0"
    condition = r.client.condition()
    assert condition is not None and (condition["status"], condition["reason"]) == (
        "False",
        "PodResourcesUnreadable",
    )
    assert condition["lastTransitionTime"] == "2026-01-01T00:00:10Z"
    assert report.findings == () and r.killer.calls == []  # no grants, no judgement


@pytest.mark.parametrize(
    ("allocatable", "advertised"),
    [("4", None), ("2", ("GPU-a::0", "GPU-a::1"))],
    ids=["more than the GPUs", "replicas"],
)
async def test_a_device_plugin_that_shares_the_gpus_makes_the_node_not_ready(
    host: FakeHost, allocatable: str, advertised: tuple[str, ...] | None
) -> None:
    """NVIDIA's plugin sharing by time-slicing or MPS hands one GPU to several pods: a GPU gpufrac reserved
    for shares could still go to another pod, so no share is placed there."""
    r = rig(host, node(allocatable={GPU: allocatable}))
    r.kubelet.advertised = None if advertised is None else {GPU: advertised}
    report = await r.agent.tick()
    assert report.ready is not None and report.ready.reason == "DevicePluginSharesGPUs"


async def test_coexist_without_a_device_plugin_is_not_ready(host: FakeHost) -> None:
    r = rig(host, node())
    report = await r.agent.tick()
    assert report.ready is not None and report.ready.reason == "NoDevicePlugin"


@pytest.mark.parametrize(
    ("labels", "mode"),
    [
        ({}, "coexist"),
        ({node_inventory.OPERATOR_DEVICE_PLUGIN_LABEL: "true"}, "coexist"),
        ({node_inventory.OPERATOR_DEVICE_PLUGIN_LABEL: "false"}, "managed"),
    ],
)
async def test_auto_mode(host: FakeHost, labels: dict[str, str], mode: str) -> None:
    r = rig(host, node(labels, {GPU: "2"}), device_plugin="auto")
    report = await r.agent.tick()
    assert report.mode is not None and report.mode.value == mode
    assert r.client.node["metadata"]["labels"][node_inventory.DEVICE_PLUGIN_LABEL] == mode


async def test_managed_serves_the_gpus_and_stops_on_close(host: FakeHost) -> None:
    switched_off = {node_inventory.OPERATOR_DEVICE_PLUGIN_LABEL: "false"}
    r = rig(host, node(switched_off), device_plugin="managed")
    report = await r.agent.tick()
    (plugin,) = r.plugins
    assert plugin.devices == (host.uuid(0), host.uuid(1)) and plugin.registered
    assert plugin.health == {host.uuid(0): True, host.uuid(1): True}
    assert report.ready is not None and report.ready.ready, report.ready

    # Registered: the kubelet now shows gpufrac's own nvidia.com/gpu, which is no conflict.
    r.client.node["status"]["allocatable"][GPU] = "2"
    r.kubelet.advertised = {GPU: plugin.devices}
    host.write(errors={1: "GPU is lost"})
    report = await r.agent.tick()
    assert report.ready is not None and report.ready.ready
    assert plugin.health == {host.uuid(0): True, host.uuid(1): False}

    await r.agent.close()
    assert plugin.stopped and r.kubelet.closed
    condition = r.client.condition()
    assert condition is not None and (condition["status"], condition["reason"]) == ("False", "AgentStopped")


async def test_managed_serves_a_gpu_nvml_names_only_after_the_plugin_was_made(host: FakeHost) -> None:
    """A GPU whose UUID NVML could not read when gpufrac's plugin was made (or one added since) would be
    published healthy but never offered: the plugin is made anew for every GPU known. One unreadable again
    is still served, unhealthy, with no plugin made."""
    uuid = host.uuid(1)
    host.gpus[1]["uuid"] = ""  # as the real backend reports a GPU whose handle or UUID NVML could not read
    host.write(errors={1: "GPU is lost"})
    r = rig(host, node({node_inventory.OPERATOR_DEVICE_PLUGIN_LABEL: "false"}), device_plugin="managed")
    await r.agent.tick()
    (first,) = r.plugins
    assert first.devices == (host.uuid(0),) and first.registered

    host.gpus[1]["uuid"] = uuid
    host.write()
    r.client.node["status"]["allocatable"][GPU] = "1"  # gpufrac's own, registered
    r.kubelet.advertised = {GPU: first.devices}
    report = await r.agent.tick()
    assert report.ready is not None and report.ready.ready
    assert first.stopped and len(r.plugins) == 2
    second = r.plugins[1]
    assert second.devices == (host.uuid(0), uuid) and second.registered
    assert second.health == {host.uuid(0): True, uuid: True}

    host.gpus[1]["uuid"] = ""
    host.write(errors={1: "GPU is lost"})
    await r.agent.tick()
    assert len(r.plugins) == 2 and second.health == {host.uuid(0): True, uuid: False}


@pytest.mark.parametrize(
    ("labels", "allocatable", "advertised", "says"),
    [
        ({}, {}, None, "nvidia.com/gpu.deploy.device-plugin=false"),
        ({node_inventory.OPERATOR_DEVICE_PLUGIN_LABEL: "false"}, {GPU: "8"}, None, "already advertises 8"),
        ({node_inventory.OPERATOR_DEVICE_PLUGIN_LABEL: "false"}, {}, ("GPU-a",), "already advertises 1"),
    ],
    ids=["operator label", "node allocatable", "kubelet allocatable"],
)
async def test_managed_refuses_to_serve_beside_another_device_plugin(
    host: FakeHost,
    caplog: pytest.LogCaptureFixture,
    labels: dict[str, str],
    allocatable: dict[str, str],
    advertised: tuple[str, ...] | None,
    says: str,
) -> None:
    r = rig(host, node(labels, allocatable), device_plugin="managed")
    r.kubelet.advertised = None if advertised is None else {GPU: advertised}
    with caplog.at_level(logging.WARNING):
        report = await r.agent.tick()
        await r.agent.tick()
    assert r.plugins == []
    assert report.ready is not None and report.ready.reason == "DevicePluginConflict"
    assert says in report.ready.message
    warnings = [rec.getMessage() for rec in caplog.records if "not serving" in rec.getMessage()]
    assert len(warnings) == 1 and says in warnings[0]  # once, not every interval


async def test_managed_plugin_that_cannot_register_is_a_problem(host: FakeHost) -> None:
    labels = {node_inventory.OPERATOR_DEVICE_PLUGIN_LABEL: "false"}
    r = rig(host, node(labels), device_plugin="managed", plugin_fail="the kubelet's socket is missing")
    report = await r.agent.tick()
    assert "the kubelet's socket is missing" in report.problems
    assert report.ready is not None and report.ready.reason == "DevicePluginNotRegistered"
    r.plugins[0].fail = ""
    report = await r.agent.tick()  # tried again
    assert report.ready is not None and report.ready.ready


async def test_kill_mode_spares_a_container_the_device_plugin_gave_the_gpu_to(host: FakeHost) -> None:
    r = rig(host, node(allocatable={GPU: "2"}), mode=Mode.KILL)
    pod = {
        "metadata": {"name": "trainer-0", "namespace": "ml", "uid": "u1"},
        "spec": {"containers": [{"name": "app", "resources": {"limits": {GPU: "1"}}}]},
        "status": {"containerStatuses": [{"name": "app", "containerID": f"containerd://{container_id(1)}"}]},
    }
    r.client.pods = [pod]
    r.kubelet.listing = [ContainerDevices("ml", "trainer-0", "app", GPU, (host.uuid(0),))]
    host.add_process(100, container=container_id(1))
    host.write({0: [(100, 15000)], 1: [(100, 10)]})
    for _ in range(2):
        report = await r.agent.tick()
    # On its GPU: nothing. On the GPU it was not given: a finding, killed.
    assert [f.gpu.index for f in report.findings] == [1]
    assert r.killer.calls == [100]


def plugin_pod(name: str, resource: str) -> dict[str, Any]:
    """A running pod of another scheduler, its container `app` (container_id(1)) asking one `resource`."""
    return {
        "metadata": {"name": name, "namespace": "team", "uid": "u1"},
        "spec": {"containers": [{"name": "app", "resources": {"limits": {resource: "1"}}}]},
        "status": {
            "containerStatuses": [
                {"name": "app", "containerID": f"containerd://{container_id(1)}", "state": {"running": {}}}
            ]
        },
    }


@pytest.mark.parametrize(
    ("resource", "device", "holder"),
    [("nvidia.com/gpu.shared", "{uuid}::3", "team/notebook"), ("nvidia.com/mig-1g.5gb", "MIG-5f0c1a2b", "")],
    ids=["time-slicing renamed", "MIG mixed strategy"],
)
async def test_a_gpu_handed_out_under_another_nvidia_name_is_its_pods_contract(
    host: FakeHost, resource: str, device: str, holder: str
) -> None:
    """The device plugin's own grant is never a finding, and the node says the plugin shares GPUs. A MIG
    instance's GPU is unknown to the agent: its pod holds no GPU it can name, and is a finding on none."""
    r = rig(host, node(allocatable={resource: "4"}), mode=Mode.KILL)
    r.client.pods = [plugin_pod("notebook", resource)]
    granted = device.format(uuid=host.uuid(0))
    r.kubelet.listing = [ContainerDevices("team", "notebook", "app", resource, (granted,))]
    r.kubelet.advertised = {resource: (granted,)}
    host.add_process(100, container=container_id(1))
    host.write({0: [(100, 3000)]})
    for _ in range(2):
        report = await r.agent.tick()
    assert report.problems == [] and report.findings == () and r.killer.calls == []
    assert report.ready is not None and report.ready.reason == "DevicePluginSharesGPUs"
    assert [gpu.holder for gpu in published(r.client)] == [holder, ""]


async def test_the_watchdog_only_reports_while_the_device_plugin_is_not_as_the_node_needs(
    host: FakeHost,
) -> None:
    """Grants the agent cannot read or understand would make a device plugin's pods look contract-less:
    until the node has its device plugin, a process without a contract is reported, not killed."""
    r = rig(host, node(), mode=Mode.KILL)  # coexist, and no device plugin advertises anything yet
    host.add_process(100, container=None)
    host.write({0: [(100, 10)]})
    for _ in range(2):
        report = await r.agent.tick()
    assert report.ready is not None and report.ready.reason == "NoDevicePlugin"
    assert [h.action for h in report.handled] == ["report"] and r.killer.calls == []
    assert r.agent.watchdog_mode is Mode.REPORT
    # Nothing holds the limits meanwhile, and the node says so: not "watchdog", on the label or the GPUs.
    assert report.level is Enforcement.NONE
    assert r.agent.exporter.latest.node_level is Enforcement.NONE
    assert {gpu.level for gpu in r.agent.exporter.latest.gpus} == {Enforcement.NONE}
    assert r.client.node["metadata"]["labels"][node_inventory.ENFORCEMENT_LABEL] == "none"

    r.client.node["status"]["allocatable"][GPU] = "2"
    report = await r.agent.tick()
    assert report.ready is not None and report.ready.ready
    assert [h.action for h in report.handled] == ["kill"] and r.killer.calls == [100]
    assert report.level is Enforcement.WATCHDOG
    assert r.client.node["metadata"]["labels"][node_inventory.ENFORCEMENT_LABEL] == "watchdog"


async def test_a_kubelet_answer_that_leaves_out_a_running_gpu_container_is_not_acted_on(
    host: FakeHost,
) -> None:
    """A kubelet that just restarted answers PodResources before it has synced its pods: the trainer, running
    with the GPU it was given, is missing. Used, that answer would publish the GPU as held by nobody and make
    the trainer's process look contract-less, to be killed; it is not used."""
    r = rig(host, node(allocatable={GPU: "2"}), mode=Mode.KILL)
    pod = {
        "metadata": {"name": "trainer-0", "namespace": "ml", "uid": "u1"},
        "spec": {"containers": [{"name": "app", "resources": {"limits": {GPU: "1"}}}]},
        "status": {
            "containerStatuses": [
                {"name": "app", "containerID": f"containerd://{container_id(1)}", "state": {"running": {}}}
            ]
        },
    }
    r.client.pods = [pod]
    r.kubelet.listing = [ContainerDevices("ml", "trainer-0", "app", GPU, (host.uuid(0),))]
    host.add_process(100, container=container_id(1))
    host.write({0: [(100, 15000)]})
    assert (await r.agent.tick()).problems == []
    assert published(r.client)[0].holder == "ml/trainer-0"

    r.kubelet.listing = []  # restarted, not yet synced
    for _ in range(2):
        report = await r.agent.tick()
    assert any("no nvidia.com/gpu device for running ml/trainer-0/app" in p for p in report.problems)
    assert published(r.client)[0].holder == "ml/trainer-0" and r.killer.calls == []

    pod["status"]["containerStatuses"][0]["state"] = {"terminated": {}}  # the trainer ended: nothing missing
    report = await r.agent.tick()
    assert report.problems == [] and published(r.client)[0].holder == ""


async def test_a_pod_asking_for_a_gpu_resource_the_node_lacks_does_not_blind_the_watchdog(
    host: FakeHost,
) -> None:
    """A tenant may name the node itself (`spec.nodeName`) and ask for one of NVIDIA's resources that no
    device plugin there advertises: the kubelet ignores an extended resource it does not know, runs the
    container and grants it nothing. Taken for a kubelet still syncing, that pod stopped the watchdog judging
    anything on the node, and kept the node not Ready, for as long as it ran."""
    r = rig(host, node(allocatable={GPU: "2"}), mode=Mode.KILL)
    r.client.pods = [plugin_pod("squatter", "nvidia.com/mig-1g.5gb")]
    host.add_process(100, container=container_id(1))
    host.write({0: [(100, 3000)]})
    for _ in range(2):
        report = await r.agent.tick()
    assert report.problems == [] and report.ready is not None and report.ready.ready
    assert r.killer.calls == [100]  # its own process, on a GPU nothing gave it


async def test_a_container_without_a_contract_cannot_dodge_the_second_look_with_new_processes(
    host: FakeHost,
) -> None:
    """The wait of one interval is for the container, not the process: a tenant that starts a new GPU
    process every interval is acted on at the second look, and another container's first process is not."""
    r = rig(host, node(), device_plugin="none", mode=Mode.KILL)
    host.add_process(100, container=container_id(7))
    host.write({0: [(100, 1000)]})
    assert (await r.agent.tick()).handled == []
    host.remove_process(100)
    host.add_process(101, container=container_id(7))
    host.add_process(200, container=container_id(8))
    host.write({0: [(101, 1000), (200, 1000)]})
    await r.agent.tick()
    assert r.killer.calls == [101]


async def test_native_where_the_operator_label_says_so(host: FakeHost) -> None:
    labels = {"example.com/fractions": "ready"}
    r = rig(host, node(labels), device_plugin="none", mode=Mode.KILL)
    assert (await r.agent.tick()).level.value == "watchdog"  # the default label is not on this node
    r = rig(host, node(labels), device_plugin="none", native_label=("example.com/fractions", "ready"))
    report = await r.agent.tick()
    assert report.level.value == "native"
    assert r.client.node["metadata"]["labels"][node_inventory.ENFORCEMENT_LABEL] == "native"


async def test_allocatable_memory_is_published(host: FakeHost) -> None:
    host.gpus[0]["reserved_mib"] = 300
    host.write()
    r = rig(host, node(), device_plugin="none", cuda_context_mib=500)
    await r.agent.tick()
    gpus = published(r.client)
    assert [(g.memory_mib, g.allocatable_mib, g.usable_mib) for g in gpus] == [
        (16384, 16384 - 300 - 500, 16384 - 800),
        (16384, 16384 - 500, 16384 - 500),
    ]


async def test_the_nodes_gpu_memory_is_advertised_as_an_extended_resource(host: FakeHost) -> None:
    """Each GPU counts its usable MiB, or the reference GPU's where that is more (a fraction f counts f x
    the reference): the kubelet then admits every pod the scheduler places."""
    r = rig(host, node(), device_plugin="none", cuda_context_mib=500, fraction_reference_mib=10_000)
    await r.agent.tick()
    usable = 16384 - 500
    want = {RESOURCE: f"{2 * usable}Mi"}
    assert {k: r.client.node["status"][k].get(RESOURCE) for k in ("capacity", "allocatable")} == {
        "capacity": want[RESOURCE],
        "allocatable": want[RESOURCE],
    }
    writes = len(r.client.writes)
    r.client.node["status"]["capacity"][RESOURCE] = r.client.node["status"]["allocatable"][RESOURCE] = (
        f"{2 * usable * 1024 * 1024}"  # the same amount as the API may write it back
    )
    await r.agent.tick()
    assert len(r.client.writes) == writes  # unchanged: nothing written

    bigger = rig(host, node(), device_plugin="none", cuda_context_mib=500, fraction_reference_mib=20_000)
    await bigger.agent.tick()
    assert bigger.client.node["status"]["capacity"][RESOURCE] == f"{2 * 20_000}Mi"
    # A kubelet that lost it (a node re-registered) gets it back at the next tick.
    del bigger.client.node["status"]["allocatable"][RESOURCE]
    await bigger.agent.tick()
    assert bigger.client.node["status"]["allocatable"][RESOURCE] == f"{2 * 20_000}Mi"


async def test_a_node_whose_gpu_memory_cannot_be_advertised_is_not_ready(host: FakeHost) -> None:
    r = rig(host, node(), device_plugin="none")
    r.client.fail.add("patch NodeStatus")
    report = await r.agent.tick()
    assert report.ready is not None and report.ready.reason == "InventoryNotPublished"
    assert any("cannot advertise gpufrac.io/gpu-memory on Node n1" in p for p in report.problems)


async def test_an_unwritable_inventory_is_not_ready(host: FakeHost) -> None:
    r = rig(host, node(), device_plugin="none")
    r.client.fail.add("patch Node")
    report = await r.agent.tick()
    assert report.ready is not None and report.ready.reason == "InventoryNotPublished"
    assert json.dumps(r.client.condition())  # still written: the status is another subresource


def test_a_device_plugin_mode_needs_pod_resources(host: FakeHost) -> None:
    with pytest.raises(ValueError, match="needs the kubelet's PodResources API"):
        Agent(Settings("n1", device_plugin="coexist"), client=None, nvml=None, killer=None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("label", "acts"), [(None, False), ("kill", True), ("report", False), ("explode", False)]
)
async def test_acting_is_opted_into_per_node_by_label(host: FakeHost, label: str | None, acts: bool) -> None:
    labels = {} if label is None else {node_inventory.WATCHDOG_MODE_LABEL: label}
    r = rig(host, node(labels), device_plugin="none", mode=Mode.REPORT)
    host.add_process(100, container=None)
    host.write({0: [(100, 10)]})
    for _ in range(2):
        report = await r.agent.tick()
    assert [h.action for h in report.handled] == ["kill" if acts else "report"]
    assert r.killer.calls == ([100] if acts else [])
