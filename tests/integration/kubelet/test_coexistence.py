"""gpufrac beside a device plugin, on the real node: the fake NVIDIA device plugin hands out `nvidia.com/gpu`,
pods of another scheduler ask it for whole GPUs, and gpufrac's shares go only on GPUs its reservation pods
hold, in every order of arrival, through restarts and a reservation deleted by hand.

What is checked throughout, by a watcher that reads the kubelet's PodResources API and the API server every
few tenths of a second while each test runs: no GPU is both given by the device plugin to a pod that is not
a gpufrac reservation and named by a share's contract, and no device is given twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import lightkube
import pytest
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node, Pod, ServiceAccount

from gpufrac import contract
from gpufrac.contract import keys, node_inventory
from gpufrac.node.agent import PLUGIN_ENDPOINT, Agent, Settings, SignalKiller
from gpufrac.node.kubelet.device_plugin import DevicePluginServer
from gpufrac.node.kubelet.podresources import PodResourcesClient
from gpufrac.node.nvml import FakeBackend
from gpufrac.node.procfs import ProcFS
from gpufrac.node.watchdog import Mode
from gpufrac.scheduler import reservations
from gpufrac.scheduler.loop import Scheduler

from .. import controlplane
from ..scheduling import running_scheduler
from . import realnode
from . import test_pods as pods
from .fake_device_plugin import FakeDevicePlugin

RESERVATIONS = controlplane.SCHEDULER_NAMESPACE
PAUSE = "docker.io/local/pause:1"


def share(name: str, fraction: str = "0.5") -> dict[str, Any]:
    return _busybox(name, {"schedulerName": "gpufrac"}, annotations={"gpu-fraction": fraction})


def whole(name: str) -> dict[str, Any]:
    """A pod of another scheduler (bound by nodeName, as any scheduler binds) asking the device plugin."""
    return _busybox(name, {"nodeName": realnode.NAME}, limits={keys.GPU_RESOURCE: "1"})


def _busybox(
    name: str,
    spec: dict[str, Any],
    *,
    annotations: dict[str, str] | None = None,
    limits: dict[str, str] | None = None,
) -> dict[str, Any]:
    container = {
        "name": "main",
        "image": realnode.BUSYBOX,
        "imagePullPolicy": "Never",
        "command": pods.SLEEP,
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": dict(limits or {})},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": dict(annotations or {})},
        "spec": {
            **spec,
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
            "containers": [container],
        },
    }


class Watcher:
    """Reads who holds which GPU, from the kubelet and from the shares' contracts, until stopped; every
    double booking it ever saw is in `violations`."""

    def __init__(self, node: realnode.RealNode, client: lightkube.AsyncClient, namespace: str) -> None:
        self.kubelet = PodResourcesClient(node.podresources_socket, timeout=10)
        self.client = client
        self.namespace = namespace
        self.violations: list[str] = []
        self.rounds = 0

    async def holders(self) -> dict[str, list[str]]:
        """GPU UUID -> namespace/name of each pod the device plugin gave it to."""
        found: dict[str, list[str]] = {}
        for entry in await asyncio.to_thread(self.kubelet.list):
            if entry.resource == keys.GPU_RESOURCE:
                for device in entry.device_ids:
                    found.setdefault(device, []).append(f"{entry.namespace}/{entry.pod}")
        return found

    async def shared(self) -> dict[str, list[str]]:
        """GPU UUID -> the live share pods whose contract names it."""
        found: dict[str, list[str]] = {}
        async for item in self.client.list(Pod, namespace=self.namespace):
            pod = item.to_dict()
            if pod["metadata"].get("deletionTimestamp") or pod["status"].get("phase") in (
                "Failed",
                "Succeeded",
            ):
                continue
            placed = contract.parse_placement(pod) if pod["spec"].get("nodeName") else None
            for placement in placed.shares if placed else ():
                for device in placement.devices:
                    found.setdefault(device, []).append(pod["metadata"]["name"])
        return found

    async def check(self) -> None:
        holders = await self.holders()
        shared = await self.shared()
        self.rounds += 1
        for device, held in holders.items():
            if len(held) > 1:
                self.violations.append(f"{device} given to {held}")
        for device, names in shared.items():
            strangers = [h for h in holders.get(device, []) if not _reservation(h)]
            if strangers:
                self.violations.append(f"{device} shared by {names} and given to {strangers}")

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.check()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=0.3)


def _reservation(holder: str) -> bool:
    return reservations.named_as_reservation(holder, RESERVATIONS)


@pytest.fixture
def device_plugin(real_node: realnode.RealNode) -> Iterator[FakeDevicePlugin]:
    plugin = FakeDevicePlugin(real_node.device_plugin_dir, pods.GPUS)
    plugin.start()
    yield plugin
    plugin.stop()


class AgentRunner:
    """The node agent (kill mode, every half second) on the real node, in this process, as its service
    account; its fake NVML scenario is `file`. `plugins` are the device plugins it served (managed)."""

    def __init__(self, plane: controlplane.ControlPlane, node: realnode.RealNode, file: Path) -> None:
        self.plane, self.node, self.file = plane, node, file
        self.plugins: list[DevicePluginServer] = []
        self._running: list[tuple[asyncio.Task[None], asyncio.Event, Agent, lightkube.AsyncClient]] = []

    async def start(self, device_plugin: str = "coexist") -> None:
        client = self.plane.client("agent")
        backend = FakeBackend(self.file)

        def plugin(devices: Sequence[str]) -> DevicePluginServer:
            made = DevicePluginServer(
                self.node.device_plugin_dir, keys.GPU_RESOURCE, devices, endpoint=PLUGIN_ENDPOINT
            )
            self.plugins.append(made)
            return made

        agent = Agent(
            Settings(node_name=realnode.NAME, mode=Mode.KILL, interval=0.5, device_plugin=device_plugin),
            client=client,
            nvml=backend,
            killer=SignalKiller(ProcFS(), backend),
            pod_resources=PodResourcesClient(self.node.podresources_socket, timeout=10),
            plugin_server=plugin,
        )
        stop = asyncio.Event()
        self._running.append((asyncio.create_task(agent.run(stop)), stop, agent, client))

    async def halt(self) -> None:
        task, stop, agent, client = self._running.pop()
        stop.set()
        await task
        await agent.close(stopping=False)
        await client.close()

    async def stop(self) -> None:
        while self._running:
            await self.halt()

    async def restart(self, device_plugin: str = "coexist") -> None:
        await self.halt()
        await self.start(device_plugin)

    async def condition(self) -> dict[str, Any]:
        async with self.plane.client("admin") as admin:
            node = (await admin.get(Node, realnode.NAME)).to_dict()
        found = [
            c for c in node["status"].get("conditions") or [] if c["type"] == node_inventory.READY_CONDITION
        ]
        return found[0] if found else {}

    async def ready(self) -> None:
        async def ready() -> bool:
            return (await self.condition()).get("status") == "True"

        await pods.wait_for("the agent's gpufrac.io/Ready condition", ready)


@pytest.fixture
def agent_runner(
    real_node: realnode.RealNode, control_plane: controlplane.ControlPlane, tmp_path: Path
) -> AgentRunner:
    file = tmp_path / "scenario.yaml"
    file.write_text(pods.scenario())
    return AgentRunner(control_plane, real_node, file)


@pytest.fixture
async def agent_runs(
    agent_runner: AgentRunner, device_plugin: FakeDevicePlugin
) -> AsyncIterator[Callable[[], Any]]:
    """The agent in coexist mode beside the fake device plugin, Ready; returns a function that restarts it."""
    await agent_runner.start()
    await agent_runner.ready()
    yield agent_runner.restart
    await agent_runner.stop()


@pytest.fixture
async def scheduler_runs(control_plane: controlplane.ControlPlane) -> AsyncIterator[Callable[[], Any]]:
    """Runs gpufrac's scheduler in this process, as its service account; returns a function that restarts
    it (a new process would rebuild the same state from the API)."""
    async with control_plane.client("admin") as admin:
        with contextlib.suppress(lightkube.ApiError):  # the namespace's default ServiceAccount
            meta = ObjectMeta(name="default", namespace=RESERVATIONS)
            await admin.create(ServiceAccount(metadata=meta, automountServiceAccountToken=False))
    settings = {"namespace": RESERVATIONS, "reservation_image": PAUSE, "reservation_idle_seconds": 1.0}
    stack = contextlib.AsyncExitStack()
    current: list[Scheduler] = []

    async def start() -> None:
        client = await stack.enter_async_context(control_plane.client("scheduler"))
        current.append(await stack.enter_async_context(running_scheduler(client, **settings)))

    async def restart() -> None:
        await stack.aclose()
        await start()

    await start()
    yield restart
    await stack.aclose()
    async with control_plane.client("admin") as admin:  # what the last round did not release yet
        for name in await names(admin, RESERVATIONS):
            await admin.delete(Pod, name, namespace=RESERVATIONS, grace_period=0)


@pytest.fixture
async def watcher(
    real_node: realnode.RealNode, admin_client: lightkube.AsyncClient, namespace: str
) -> AsyncIterator[Watcher]:
    watching = Watcher(real_node, admin_client, namespace)

    async def released() -> bool:
        return not await watching.holders()

    # The last test's pods were deleted from the API at once (grace 0), but the kubelet may still hold their
    # GPUs for a while: a test that starts before then sees fewer free GPUs than it counts on.
    await pods.wait_for("the last test's GPUs released by the kubelet", released, timeout=90)
    stop = asyncio.Event()
    task = asyncio.create_task(watching.run(stop))
    yield watching
    stop.set()
    await task
    watching.kubelet.close()
    assert watching.rounds > 5 and watching.violations == []


async def names(client: lightkube.AsyncClient, namespace: str) -> list[str]:
    return [item.to_dict()["metadata"]["name"] async for item in client.list(Pod, namespace=namespace)]


async def create(client: lightkube.AsyncClient, namespace: str, *bodies: dict[str, Any]) -> None:
    for body in bodies:
        await client.create(Pod.from_dict(body), namespace=namespace)


async def settled(
    client: lightkube.AsyncClient, namespace: str, timeout: float = 90
) -> dict[str, dict[str, Any]]:
    """The namespace's pods once none is left pending on the node (each runs, failed admission, or waits
    for the scheduler with a reason) and nothing has changed for three seconds."""
    deadline = time.monotonic() + timeout
    last: dict[str, tuple[str, str]] = {}
    since = time.monotonic()
    while True:
        listed = [item.to_dict() async for item in client.list(Pod, namespace=namespace)]
        found = {pod["metadata"]["name"]: pod for pod in listed}
        unsettled = [name for name, pod in found.items() if not _settled(pod)]
        now = {
            name: (pod["spec"].get("nodeName", ""), pod["status"].get("phase", ""))
            for name, pod in found.items()
        }
        if now != last or unsettled:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= 3:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"pods not settled after {timeout:.0f}s: {unsettled or now}")
        await asyncio.sleep(0.5)


def _settled(pod: dict[str, Any]) -> bool:
    status = pod.get("status") or {}
    if status.get("phase") in ("Running", "Failed"):
        return status.get("phase") == "Failed" or pods._all_started(pod)
    conditions = [c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"]
    return not pod["spec"].get("nodeName") and any(c.get("reason") == "Unschedulable" for c in conditions)


async def reserved_gpus(watching: Watcher) -> set[str]:
    return {device for device, held in (await watching.holders()).items() if any(map(_reservation, held))}


def phases(found: dict[str, dict[str, Any]], prefix: str) -> Counter[str]:
    return Counter(
        pod["status"].get("phase") if pod["spec"].get("nodeName") else "Unscheduled"
        for name, pod in found.items()
        if name.startswith(prefix)
    )


ORDERS = {
    "shares-first": ["s0", "s1", "s2", "w0", "w1", "w2"],
    "whole-first": ["w0", "w1", "w2", "s0", "s1", "s2"],
    "interleaved": ["s0", "w0", "s1", "w1", "s2", "w2"],
}


@pytest.mark.parametrize("order", ORDERS)
async def test_shares_and_device_plugin_pods_never_share_a_gpu_in_any_order(
    order: str,
    agent_runs: Callable[[], Any],
    scheduler_runs: Callable[[], Any],
    watcher: Watcher,
    admin_client: lightkube.AsyncClient,
    namespace: str,
) -> None:
    """Four GPUs; three half-GPU shares (two GPUs reserved at most) and three whole-GPU pods of another
    scheduler. Whatever comes first, every pod that runs holds a GPU nobody else was given, and no GPU is
    reserved that no share needs."""
    for name in ORDERS[order]:
        await create(admin_client, namespace, share(name) if name.startswith("s") else whole(name))
        await asyncio.sleep(0.3)
    found = await settled(admin_client, namespace)
    await watcher.check()
    holders = await watcher.holders()
    assert len(holders) <= len(pods.GPUS)
    # Every share that runs is on a reserved GPU; the device plugin's pods had the rest.
    shares = phases(found, "s")
    wholes = phases(found, "w")
    assert shares["Running"] + shares["Unscheduled"] == 3 and wholes["Running"] + wholes["Failed"] == 3
    reserved = await reserved_gpus(watcher)
    # Five GPUs' worth of demand for four: every GPU is used, none by two, and no share waits for want of a
    # reservation while its GPU's room is free.
    assert len(reserved) + wholes["Running"] == len(pods.GPUS)
    assert shares["Running"] == min(3, 2 * len(reserved))
    if order == "shares-first":
        assert (len(reserved), wholes["Running"]) == (2, 2)
    if order == "whole-first":
        assert (len(reserved), wholes["Running"]) == (1, 3)
    # The kubelet's own account: never more nvidia.com/gpu given than it has.
    node = (await admin_client.get(Node, realnode.NAME)).to_dict()
    assert int(node["status"]["allocatable"][keys.GPU_RESOURCE]) == len(pods.GPUS)
    assert sum(len(held) for held in holders.values()) <= len(pods.GPUS)


async def test_reservations_follow_the_shares_through_restarts_and_a_deletion_by_hand(
    real_node: realnode.RealNode,
    agent_runs: Callable[[], Any],
    scheduler_runs: Callable[[], Any],
    watcher: Watcher,
    admin_client: lightkube.AsyncClient,
    namespace: str,
    tmp_path: Path,
) -> None:
    await create(admin_client, namespace, share("s0"), share("s1", "0.75"), whole("w0"))
    found = await settled(admin_client, namespace)
    assert phases(found, "s") == {"Running": 2} and phases(found, "w") == {"Running": 1}
    assert len(await reserved_gpus(watcher)) == 2

    # The agent in kill mode sees the device-plugin pod's process on its GPU, and leaves it be.
    [w0] = [device for device, held in (await watcher.holders()).items() if f"{namespace}/w0" in held]
    pid = pods.host_pid(real_node, found["w0"], "main")
    (tmp_path / "scenario.yaml").write_text(pods.scenario({pods.GPUS.index(w0): [(pid, 4096)]}))
    await asyncio.sleep(2)  # four ticks: enough to judge it twice
    assert pods.alive(pid)

    # Restarts change nothing: no reservation made or released while the shares stay.
    before = await reserved_gpus(watcher)
    await scheduler_runs()
    await agent_runs()
    await asyncio.sleep(3)
    assert await reserved_gpus(watcher) == before

    # A reservation deleted by hand: its share's GPU is reserved again, or the share goes; never shared with
    # a pod the device plugin gave it to.
    first = (await names(admin_client, RESERVATIONS))[0]
    await admin_client.delete(Pod, first, namespace=RESERVATIONS, grace_period=0)

    async def held_again() -> bool:
        live = await watcher.shared()
        return set(live) <= await reserved_gpus(watcher)

    await pods.wait_for("every shared GPU reserved again", held_again, timeout=90)

    # The shares leave: so do the reservations.
    for name in ("s0", "s1"):
        await admin_client.delete(Pod, name, namespace=namespace, grace_period=0)

    async def released() -> bool:
        return not await names(admin_client, RESERVATIONS)

    await pods.wait_for("every reservation released", released, timeout=60)


async def test_managed_mode_serves_the_gpus_itself_and_refuses_beside_another_device_plugin(
    real_node: realnode.RealNode,
    agent_runner: AgentRunner,
    device_plugin: FakeDevicePlugin,
    scheduler_runs: Callable[[], Any],
    admin_client: lightkube.AsyncClient,
    namespace: str,
) -> None:
    """NVIDIA's plugin switched off by the operator's label: `auto` is managed, and gpufrac's agent serves
    `nvidia.com/gpu`; but not while another plugin still advertises it."""
    label = node_inventory.OPERATOR_DEVICE_PLUGIN_LABEL
    await admin_client.patch(Node, realnode.NAME, {"metadata": {"labels": {label: "false"}}})
    try:
        await agent_runner.start("auto")

        async def refused() -> bool:
            return (await agent_runner.condition()).get("reason") == "DevicePluginConflict"

        await pods.wait_for("managed mode refused beside the fake plugin", refused)
        assert agent_runner.plugins == []
        await agent_runner.halt()
        device_plugin.stop()

        async def gone() -> bool:
            node = (await admin_client.get(Node, realnode.NAME)).to_dict()
            return node["status"]["allocatable"].get(keys.GPU_RESOURCE, "0") == "0"

        await pods.wait_for("the fake plugin's GPUs gone from the Node's allocatable", gone)
        await agent_runner.start("auto")
        await agent_runner.ready()
        [served] = agent_runner.plugins
        assert served.registered
        gpufrac_whole = _busybox("g0", {"schedulerName": "gpufrac"}, limits={keys.GPU_RESOURCE: "1"})
        await create(admin_client, namespace, share("s0"), whole("w0"), gpufrac_whole)
        found = await settled(admin_client, namespace)
        assert {name: pod["status"]["phase"] for name, pod in found.items()} == {
            "s0": "Running",
            "w0": "Running",
            "g0": "Running",
        }
        # Three GPUs handed out by gpufrac's own plugin: the reservation's and the two whole pods'.
        assert sorted(len(ids) for ids in served.allocations) == [1, 1, 1]
        watching = Watcher(real_node, admin_client, namespace)
        try:
            await watching.check()
            assert watching.violations == [] and len(await reserved_gpus(watching)) == 1
        finally:
            watching.kubelet.close()
    finally:
        await agent_runner.stop()
        await admin_client.patch(Node, realnode.NAME, {"metadata": {"labels": {label: None}}})
