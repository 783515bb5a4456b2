"""The node agent against a real apiserver, with the fake NVML, a fake /proc and a fake MPS daemon.

Acceptance (issue 6): the inventory appears on the Node and the scheduler places by its UUIDs; a process
that grows past its limit is killed (or its pod evicted) within two intervals, with an Event; a process
with no contract is reported; a killed MPS daemon is restarted; an agent acts on nothing twice.
Issue 11: no Event a tenant creates stops an action; GPU processes in init and sidecar containers are
mapped to their pod.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import lightkube
import pytest
from lightkube.resources.core_v1 import Event, Node, Pod, Secret
from lightkube.types import PatchType

from gpufrac import contract
from gpufrac.contract import ComputeMode, PodPlacement, SharePlacement, node_inventory
from gpufrac.node import mps, procfs
from gpufrac.node.agent import Agent, Settings
from gpufrac.node.mps import DaemonSpec, Supervisor
from gpufrac.node.watchdog import Kind, Mode
from gpufrac.testing.fakehost import FakeHost, RecordingKiller, container_id

from . import controlplane, fakenodes
from .scheduling import gpu_pod, running_scheduler, wait_bound

FAKE_MPS = Path(__file__).parents[1] / "node" / "fake-mps-control"
GIB = 1024


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def agent_client(control_plane: controlplane.ControlPlane) -> AsyncIterator[lightkube.AsyncClient]:
    """An AsyncClient as the agent's service account, whose rights are the Helm chart's agent RBAC."""
    async with control_plane.client("agent") as client:
        yield client


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    made = FakeHost(tmp_path / "host")
    made.add_gpus(4, memory_mib=16 * GIB, model="Tesla T4")
    made.write()
    return made


def make_agent(
    client: lightkube.AsyncClient,
    node: str,
    host: FakeHost,
    *,
    mode: Mode = Mode.KILL,
    killer: RecordingKiller | None = None,
    supervisor: Supervisor | None = None,
    clock: Clock | None = None,
) -> Agent:
    from gpufrac.node.nvml import FakeBackend

    return Agent(
        Settings(node_name=node, mode=mode, interval=1.0, proc_root=host.proc),
        client=client,
        nvml=FakeBackend(host.nvml_file),
        killer=killer or RecordingKiller(),
        supervisor=supervisor,
        clock=clock or Clock(),
    )


async def node_name(gpu_nodes: fakenodes.GpuNodes, **kwargs: Any) -> str:
    node = await gpu_nodes.create(**kwargs)
    assert node.metadata is not None and node.metadata.name is not None
    return node.metadata.name


async def running_pod(
    admin: lightkube.AsyncClient,
    namespace: str,
    name: str,
    node: str,
    placement: PodPlacement | None,
    containers: dict[str, int],
) -> dict[str, Any]:
    """A pod bound to `node` with `placement`'s annotations, its containers running with the given IDs."""
    pod = Pod.from_dict(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "annotations": contract.render_annotations(placement) if placement else {},
            },
            "spec": {
                "automountServiceAccountToken": False,
                "containers": [{"name": c, "image": "busybox"} for c in containers],
            },
        }
    )
    await admin.create(pod)
    await controlplane.bind_pod(admin, name, node, namespace=namespace)
    statuses = [
        {
            "name": c,
            "containerID": f"containerd://{container_id(n)}",
            "image": "busybox",
            "imageID": "",
            "ready": True,
            "restartCount": 0,
            "state": {"running": {}},
        }
        for c, n in containers.items()
    ]
    status = {"status": {"phase": "Running", "containerStatuses": statuses}}
    await admin.patch(Pod.Status, name, status, namespace=namespace, patch_type=PatchType.MERGE)
    return (await admin.get(Pod, name, namespace=namespace)).to_dict()


def share(
    host: FakeHost,
    container: str,
    gpu: int,
    *,
    limit: int,
    mode: ComputeMode = ComputeMode.TIME_SLICING,
    request: int | None = None,
):
    """A placement of one share on `gpu`: its request half its limit unless given."""
    asked = limit // 2 if request is None else request
    return PodPlacement((SharePlacement(container, (host.uuid(gpu),), asked, limit, mode),))


async def events(client: lightkube.AsyncClient, namespace: str, reason: str) -> list[Event]:
    return [e async for e in client.list(Event, namespace=namespace) if e.reason == reason]


async def test_inventory_appears_on_the_node_and_the_scheduler_places_by_its_uuids(
    admin_client: lightkube.AsyncClient,
    agent_client: lightkube.AsyncClient,
    scheduler_client: lightkube.AsyncClient,
    namespace: str,
    gpu_nodes: fakenodes.GpuNodes,
    host: FakeHost,
) -> None:
    node = await node_name(gpu_nodes, gpus=4, gpu_memory_mib=16 * GIB, product="Tesla-T4")
    # No GPU Feature Discovery on this node: the agent fills in the nvidia.com labels.
    no_gfd = {
        key: None
        for key in (
            node_inventory.GPU_COUNT_LABEL,
            node_inventory.GPU_MEMORY_LABEL,
            node_inventory.GPU_PRODUCT_LABEL,
        )
    }
    await admin_client.patch(Node, node, {"metadata": {"labels": no_gfd}}, patch_type=PatchType.MERGE)
    host.write(errors={0: "GPU is lost"})

    report = await make_agent(agent_client, node, host).tick()

    meta = (await admin_client.get(Node, node)).metadata
    assert meta is not None and meta.labels is not None and meta.annotations is not None
    published = node_inventory.load_gpus(meta.annotations[node_inventory.GPUS_ANNOTATION])
    assert [(g.index, g.uuid, g.model, g.memory_mib, g.healthy) for g in published] == [
        (i, host.uuid(i), "Tesla T4", 16 * GIB, i != 0) for i in range(4)
    ]
    assert report.gpus == published
    assert meta.labels[node_inventory.ENFORCEMENT_LABEL] == "watchdog"
    assert meta.labels[node_inventory.DEVICE_PLUGIN_LABEL] == "none"
    assert meta.annotations[node_inventory.DRIVER_VERSION_ANNOTATION] == "535.104.05"
    assert (meta.labels[node_inventory.GPU_COUNT_LABEL], meta.labels[node_inventory.GPU_MEMORY_LABEL]) == (
        "4",
        str(16 * GIB),
    )
    assert meta.labels[node_inventory.GPU_PRODUCT_LABEL] == "Tesla-T4"

    await admin_client.create(gpu_pod("quarter", namespace, annotations={"gpu-fraction": "0.25"}))
    async with running_scheduler(scheduler_client, policy="binpack"):
        (pod,) = await wait_bound(admin_client, namespace, 1)
    placed = contract.parse_placement(pod)
    assert placed is not None
    (device,) = placed.shares[0].devices
    assert device in {host.uuid(i) for i in (1, 2, 3)}  # a UUID the agent published, of a healthy GPU


async def test_a_steady_node_is_not_patched_again(
    agent_client: lightkube.AsyncClient,
    admin_client: lightkube.AsyncClient,
    gpu_nodes: fakenodes.GpuNodes,
    host: FakeHost,
) -> None:
    node = await node_name(gpu_nodes, gpus=4)
    agent = make_agent(agent_client, node, host)
    await agent.tick()
    version = (await admin_client.get(Node, node)).metadata.resourceVersion  # type: ignore[union-attr]
    await agent.tick()
    assert (await admin_client.get(Node, node)).metadata.resourceVersion == version  # type: ignore[union-attr]
    host.write(nvml_error="libnvidia-ml.so.1: cannot open shared object file")
    await agent.tick()
    meta = (await admin_client.get(Node, node)).metadata
    assert meta is not None and meta.labels is not None and meta.annotations is not None
    assert meta.labels[node_inventory.ENFORCEMENT_LABEL] == "none"
    assert not any(
        g.healthy for g in node_inventory.load_gpus(meta.annotations[node_inventory.GPUS_ANNOTATION])
    )


async def test_a_process_over_its_limit_is_killed_once_with_an_event(
    admin_client: lightkube.AsyncClient,
    agent_client: lightkube.AsyncClient,
    namespace: str,
    gpu_nodes: fakenodes.GpuNodes,
    host: FakeHost,
) -> None:
    node = await node_name(gpu_nodes, gpus=4)
    await running_pod(admin_client, namespace, "web", node, share(host, "app", 1, limit=2 * GIB), {"app": 1})
    host.add_process(101, container=container_id(1))
    host.add_process(102, container=container_id(1), layout="cgroupfs-v1")
    killer = RecordingKiller()
    agent = make_agent(agent_client, node, host, killer=killer)

    host.write({1: [(101, 1500), (102, 500)]})
    first = await agent.tick()  # within its limit
    assert first.findings == () and [u.used_bytes >> 20 for u in first.usages] == [2000]

    host.write({1: [(101, 1700), (102, 500)]})  # grows past 2 GiB: the next interval kills it
    second = await agent.tick()
    assert [f.kind for f in second.findings] == [Kind.BREACH]
    assert sorted(killer.calls) == [101, 102]
    (event,) = await events(admin_client, namespace, Kind.BREACH.value)
    assert event.involvedObject.name == "web" and event.type == "Warning"
    assert event.message is not None and "2200 MiB on GPU 1" in event.message and "Killed" in event.message
    assert event.source is not None and event.source.host == node

    await agent.tick()  # still listed while it dies: not killed again
    assert sorted(killer.calls) == [101, 102]
    assert len(await events(admin_client, namespace, Kind.BREACH.value)) == 1
    samples = agent.exporter.text()
    assert 'gpufrac_watchdog_actions_total{action="kill"} 1.0' in samples

    # A restarted agent knows nothing of the kill: a process that is still there is killed again, one
    # that is gone is not.
    host.write({1: [(101, 2500)]})
    await make_agent(agent_client, node, host, killer=killer).tick()
    assert sorted(killer.calls) == [101, 101, 102]


async def test_no_event_a_tenant_creates_stops_a_kill(
    admin_client: lightkube.AsyncClient,
    agent_client: lightkube.AsyncClient,
    namespace: str,
    gpu_nodes: fakenodes.GpuNodes,
    host: FakeHost,
) -> None:
    """Before issue 11 the agent looked up an Event named after what it would act on, and took one found
    as proof the action was done. The tenant can compute that name (pod, container, GPU, pid and start
    time) and create the Event first; the agent must kill all the same."""
    node = await node_name(gpu_nodes, gpus=4)
    pod = await running_pod(
        admin_client, namespace, "web", node, share(host, "app", 1, limit=GIB), {"app": 1}
    )
    host.add_process(101, container=container_id(1))
    host.write({1: [(101, 3000)]})
    uid = pod["metadata"]["uid"]
    key = f"kill/{Kind.BREACH.value}/{uid}/app/{host.uuid(1)}/101@{100_000 + 101}"
    forged = f"web.gpufrac-{hashlib.sha256(key.encode()).hexdigest()[:20]}"
    await admin_client.create(
        Event.from_dict(
            {
                "metadata": {"name": forged, "namespace": namespace},
                "involvedObject": {"kind": "Pod", "name": "web", "namespace": namespace, "uid": uid},
                "reason": Kind.BREACH.value,
                "message": "Killed processes (pid, outcome): 101 killed",
                "type": "Warning",
            }
        )
    )
    killer = RecordingKiller()
    report = await make_agent(agent_client, node, host, killer=killer).tick()
    assert killer.calls == [101] and [h.action for h in report.handled] == ["kill"]
    recorded = await events(admin_client, namespace, Kind.BREACH.value)
    assert len(recorded) == 2 and forged in {e.metadata.name for e in recorded if e.metadata}


async def test_a_gpu_process_in_a_sidecar_of_a_share_pod_is_killed(
    admin_client: lightkube.AsyncClient,
    agent_client: lightkube.AsyncClient,
    namespace: str,
    gpu_nodes: fakenodes.GpuNodes,
    host: FakeHost,
) -> None:
    """A GPU process in an init or sidecar container is mapped to its pod: the contract grants the GPU to
    the share container only, so using it from the sidecar is a process without a contract."""
    node = await node_name(gpu_nodes, gpus=4)
    await running_pod(admin_client, namespace, "side", node, share(host, "app", 0, limit=GIB), {"app": 5})
    sidecar = {
        "name": "proxy",
        "containerID": f"containerd://{container_id(6)}",
        "image": "busybox",
        "imageID": "",
        "ready": True,
        "restartCount": 0,
        "state": {"running": {}},
    }
    await admin_client.patch(
        Pod.Status,
        "side",
        {"status": {"initContainerStatuses": [sidecar]}},
        namespace=namespace,
        patch_type=PatchType.MERGE,
    )
    host.add_process(500, container=container_id(5))
    host.add_process(600, container=container_id(6))
    host.write({0: [(500, 100), (600, 100)]})
    killer = RecordingKiller()
    agent = make_agent(agent_client, node, host, killer=killer)
    await agent.tick()
    await agent.tick()  # a process is acted on once
    assert killer.calls == [600]
    (event,) = await events(admin_client, namespace, Kind.NO_CONTRACT.value)
    assert event.involvedObject.name == "side"
    assert event.message is not None and "init container proxy of pod" in event.message


async def test_evict_mode_evicts_the_pod_once(
    admin_client: lightkube.AsyncClient,
    agent_client: lightkube.AsyncClient,
    namespace: str,
    gpu_nodes: fakenodes.GpuNodes,
    host: FakeHost,
) -> None:
    node = await node_name(gpu_nodes, gpus=4)
    await running_pod(admin_client, namespace, "nb", node, share(host, "app", 2, limit=GIB), {"app": 7})
    host.add_process(700, container=container_id(7), layout="crio")
    host.write({2: [(700, 3000)]})
    killer = RecordingKiller()

    report = await make_agent(agent_client, node, host, mode=Mode.EVICT, killer=killer).tick()

    assert [h.action for h in report.handled] == ["evict"]
    pod = await admin_client.get(Pod, "nb", namespace=namespace)  # no kubelet: it waits, terminating
    assert pod.metadata is not None and pod.metadata.deletionTimestamp is not None
    (event,) = await events(admin_client, namespace, Kind.BREACH.value)
    assert event.message is not None and event.message.startswith("Evicted pod")
    again = await make_agent(agent_client, node, host, mode=Mode.EVICT, killer=killer).tick()
    assert again.handled == [] and killer.calls == []


async def test_processes_without_a_contract_are_reported_within_two_intervals(
    admin_client: lightkube.AsyncClient,
    agent_client: lightkube.AsyncClient,
    namespace: str,
    gpu_nodes: fakenodes.GpuNodes,
    host: FakeHost,
) -> None:
    node = await node_name(gpu_nodes, gpus=4)
    await running_pod(admin_client, namespace, "plain", node, None, {"main": 3})
    host.add_process(300, container=container_id(3))  # a pod with no GPU contract
    host.add_process(301, container=None)  # a process on the host itself
    host.write({0: [(300, 100)], 3: [(301, 100)]})
    killer = RecordingKiller()
    agent = make_agent(agent_client, node, host, mode=Mode.REPORT, killer=killer)

    first = await agent.tick()
    # The pod's at once; the host's, seen once, maybe in a container the kubelet has not reported yet.
    assert len(first.findings) == 2 and [h.finding.container is not None for h in first.handled] == [True]
    second = await agent.tick()
    assert [(h.action, h.finding.container) for h in second.handled] == [("report", None)]
    (in_pod,) = await events(admin_client, namespace, Kind.NO_CONTRACT.value)
    assert in_pod.involvedObject.name == "plain"
    assert in_pod.message is not None and "which has no GPU contract" in in_pod.message
    on_node = [
        e
        for e in await events(admin_client, "default", Kind.NO_CONTRACT.value)
        if e.involvedObject.name == node
    ]
    assert len(on_node) == 1 and on_node[0].involvedObject.kind == "Node"
    assert on_node[0].message is not None and "process 301 on GPU 3" in on_node[0].message
    await agent.tick()
    assert len(await events(admin_client, namespace, Kind.NO_CONTRACT.value)) == 1
    await make_agent(agent_client, node, host, mode=Mode.REPORT, killer=killer).tick()
    assert len(await events(admin_client, namespace, Kind.NO_CONTRACT.value)) == 2  # once more a restart
    assert killer.calls == []


async def test_kill_mode_kills_a_process_without_a_contract(
    admin_client: lightkube.AsyncClient,
    agent_client: lightkube.AsyncClient,
    namespace: str,
    gpu_nodes: fakenodes.GpuNodes,
    host: FakeHost,
) -> None:
    node = await node_name(gpu_nodes, gpus=4)
    # The share is on GPU 0; its process also opened GPU 3, which its contract does not grant.
    await running_pod(admin_client, namespace, "sneaky", node, share(host, "app", 0, limit=GIB), {"app": 4})
    host.add_process(400, container=container_id(4))
    host.add_process(401, container=container_id(4))
    host.write({0: [(400, 100)], 3: [(401, 5000)]})
    killer = RecordingKiller()
    agent = make_agent(agent_client, node, host, killer=killer)
    await agent.tick()
    await agent.tick()
    assert killer.calls == [401]
    (event,) = await events(admin_client, namespace, Kind.NO_CONTRACT.value)
    assert event.message is not None and "not this one" in event.message


@pytest.fixture
def mps_dirs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonSpec]:
    root = tmp_path_factory.mktemp("mps")
    spec = DaemonSpec("sm-sharing", root / "pipe", root / "log", active_thread_percentage=100)
    yield spec
    pid_file = spec.pipe_directory / mps.PID_FILE
    if pid_file.exists() and procfs.ProcFS().alive(pid := int(pid_file.read_text())):
        os.kill(pid, signal.SIGKILL)


async def test_a_killed_mps_daemon_is_restarted_and_the_node_says_mps(
    admin_client: lightkube.AsyncClient,
    agent_client: lightkube.AsyncClient,
    namespace: str,
    gpu_nodes: fakenodes.GpuNodes,
    host: FakeHost,
    mps_dirs: DaemonSpec,
) -> None:
    node = await node_name(gpu_nodes, gpus=4)
    clock = Clock()
    supervisor = Supervisor([mps_dirs], program=str(FAKE_MPS))
    agent = make_agent(agent_client, node, host, supervisor=supervisor, clock=clock)
    # The MPS server the daemon starts is the agent's own, never a process without a contract.
    pid_file = mps_dirs.pipe_directory / mps.PID_FILE

    await agent.tick()
    daemon = int(pid_file.read_text())
    host.add_process(900, container=None, ppid=daemon)
    host.write({0: [(900, 300)]})

    async def level() -> str:
        meta = (await admin_client.get(Node, node)).metadata
        assert meta is not None and meta.labels is not None
        return meta.labels[node_inventory.ENFORCEMENT_LABEL]

    assert await level() == "mps"
    os.kill(daemon, signal.SIGKILL)
    while procfs.ProcFS().alive(daemon):
        await asyncio.sleep(0.01)
    clock.now = 10
    report = await agent.tick()
    assert await level() == "watchdog" and report.level.value == "watchdog"
    clock.now = 11  # one second of backoff
    report = await agent.tick()
    assert report.level.value == "mps" and await level() == "mps"
    assert int(pid_file.read_text()) != daemon
    assert supervisor.daemons["sm-sharing"].restarts == 1
    commands = (mps_dirs.pipe_directory / "commands.log").read_text().splitlines()
    assert commands.count("set_default_active_thread_percentage 100") == 2
    await agent.close()
    assert (mps_dirs.pipe_directory / "commands.log").read_text().splitlines()[-1] == "quit"


async def test_the_agent_command_runs_once_with_its_own_identity(
    admin_client: lightkube.AsyncClient,
    control_plane: controlplane.ControlPlane,
    gpu_nodes: fakenodes.GpuNodes,
    host: FakeHost,
) -> None:
    node = await node_name(gpu_nodes, gpus=4)
    host.add_process(55, container=None)
    host.write({0: [(55, 100)]})
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpufrac.cli",
            "agent",
            "--once",
            "--nvml",
            f"fake:{host.nvml_file}",
            "--proc-root",
            str(host.proc),
            "--kubeconfig",
            str(control_plane.kubeconfig("agent")),
            "--mps-control",
            "",
            "--metrics-port",
            "0",
            "--device-plugin",
            "none",  # no kubelet here
        ],
        env={**os.environ, "NODE_NAME": node},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["enforcement"] == "watchdog" and len(summary["gpus"]) == 4
    assert (summary["ready"], summary["ready_reason"], summary["device_plugin"]) == (
        True,
        "AgentReady",
        "none",
    )
    assert summary["findings"] == ["process 55 on GPU 0 (" + host.uuid(0) + ") runs in no container"]
    meta = (await admin_client.get(Node, node)).metadata
    assert (
        meta is not None
        and meta.annotations is not None
        and node_inventory.GPUS_ANNOTATION in meta.annotations
    )
    # The agent's own identity may set its condition on the Node's status; --once leaves it there.
    status = (await admin_client.get(Node, node)).status
    assert status is not None and status.conditions is not None
    (ready,) = [c for c in status.conditions if c.type == node_inventory.READY_CONDITION]
    assert (ready.status, ready.reason) == ("True", "AgentReady")


async def test_the_agents_rights_are_least_privilege(
    admin_client: lightkube.AsyncClient,
    agent_client: lightkube.AsyncClient,
    namespace: str,
    gpu_nodes: fakenodes.GpuNodes,
) -> None:
    node = await node_name(gpu_nodes, gpus=1)
    await running_pod(admin_client, namespace, "p", node, None, {"main": 1})
    [pod async for pod in agent_client.list(Pod, namespace="*", fields={"spec.nodeName": node})]
    for call in (
        agent_client.delete(Pod, "p", namespace=namespace),
        agent_client.delete(Node, node),
        agent_client.patch(Pod, "p", {"metadata": {"labels": {"x": "y"}}}, namespace=namespace),
    ):
        with pytest.raises(lightkube.ApiError) as caught:
            await call
        assert caught.value.status.code == 403
    with pytest.raises(lightkube.ApiError) as caught:
        [s async for s in agent_client.list(Secret, namespace=namespace)]
    assert caught.value.status.code == 403


async def test_a_poison_pod_does_not_stop_the_tick(
    admin_client: lightkube.AsyncClient,
    agent_client: lightkube.AsyncClient,
    namespace: str,
    gpu_nodes: fakenodes.GpuNodes,
    host: FakeHost,
) -> None:
    """A pod whose contract cannot be read (a 5,000-digit number, garbage) is reported and skipped: the
    share beside it is still guarded in the same tick."""
    node = await node_name(gpu_nodes, gpus=4)
    await running_pod(admin_client, namespace, "good", node, share(host, "app", 1, limit=GIB), {"app": 1})
    await running_pod(admin_client, namespace, "poison", node, None, {"app": 2})
    garbage = {
        "nvidia.com/container.app.gpu-memory.request": "9" * 5000,
        "nvidia.com/container.app.gpus.devices": "\x7f" * 100,
        "gpu-fraction": "\uff10.\uff15",  # full-width digits
    }
    await admin_client.patch(
        Pod, "poison", {"metadata": {"annotations": garbage}}, namespace=namespace, patch_type=PatchType.MERGE
    )
    host.add_process(101, container=container_id(1))
    host.write({1: [(101, 3000)]})
    killer = RecordingKiller()
    report = await make_agent(agent_client, node, host, killer=killer).tick()
    assert killer.calls == [101] and report.problems == []
    # The fixture's invariant check reads every pod's contract: the poison one must be gone first.
    await admin_client.delete(Pod, "poison", namespace=namespace, grace_period=0)


async def test_a_burst_into_a_neighbours_guarantee_is_reclaimed_with_an_event_naming_it(
    admin_client: lightkube.AsyncClient,
    agent_client: lightkube.AsyncClient,
    namespace: str,
    gpu_nodes: fakenodes.GpuNodes,
    host: FakeHost,
) -> None:
    """Burst rule, against the real apiserver: `greedy` (request 4 GiB, limit 12 GiB) uses 11 GiB of a 16 GiB
    GPU, leaving `steady` (request = limit = 8 GiB, using 2) less than its request: greedy is killed."""
    node = await node_name(gpu_nodes, gpus=4)
    greedy = share(host, "app", 1, request=4 * GIB, limit=12 * GIB)
    steady = share(host, "app", 1, request=8 * GIB, limit=8 * GIB)
    await running_pod(admin_client, namespace, "greedy", node, greedy, {"app": 1})
    await running_pod(admin_client, namespace, "steady", node, steady, {"app": 2})
    host.add_process(201, container=container_id(1))
    host.add_process(202, container=container_id(2))
    killer = RecordingKiller()
    agent = make_agent(agent_client, node, host, killer=killer)
    host.write({1: [(201, 6 * GIB), (202, 2 * GIB)]})  # room for both guarantees: nothing
    assert (await agent.tick()).findings == ()
    host.write({1: [(201, 11 * GIB), (202, 2 * GIB)]})
    report = await agent.tick()
    assert [(f.kind, f.container.pod.name) for f in report.findings if f.container] == [
        (Kind.BURST, "greedy")
    ]
    assert killer.calls == [201]
    (event,) = await events(admin_client, namespace, Kind.BURST.value)
    assert event.involvedObject.name == "greedy" and event.message is not None
    assert f"pod {namespace}/steady" in event.message and "Killed" in event.message
