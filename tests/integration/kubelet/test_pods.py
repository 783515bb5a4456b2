"""gpufrac end to end on a real node: pods admitted by the webhook, placed by the scheduler, run by a kubelet
with containerd and runc, and watched by the node agent through the real /proc and cgroups.

The node has no GPU and no NVIDIA runtime. The fake NVML scenario gives it GPUs (the agent publishes
them; the scheduler places on them), and what is checked in a container is its environment: what the
NVIDIA runtime would read to pick the devices and the limits.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightkube
import pytest
import yaml
from lightkube.resources.core_v1 import ConfigMap, Namespace, Node, Pod

from gpufrac import contract
from gpufrac.admission import settings
from gpufrac.contract import keys, memory_resource
from gpufrac.node.agent import Agent, Settings, SignalKiller, TickReport
from gpufrac.node.kubelet.podresources import PodResourcesClient
from gpufrac.node.nvml import FakeBackend
from gpufrac.node.procfs import ProcFS
from gpufrac.node.watchdog import Mode

from .. import controlplane
from ..test_scheduler import start_scheduler
from ..webhook_fixtures import LABEL, RunningWebhook, serving, wait_until_guarded
from . import kubelet_api, realnode
from .fake_device_plugin import FakeDevicePlugin

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "examples"
GIB = 1024
GPUS = [f"GPU-7e57{i:04d}-0000-4000-8000-00000000000{i}" for i in range(4)]
SLEEP = ["sleep", "3600"]
RESOURCE = memory_resource.GPU_MEMORY_RESOURCE


def scenario(processes: dict[int, list[tuple[int, int]]] | None = None) -> str:
    """A fake NVML scenario: four 80 GiB GPUs, with ``processes`` (pid, MiB) on the GPUs by index."""
    gpus = [
        {
            "index": i,
            "uuid": uuid,
            "model": "NVIDIA A100-SXM4-80GB",
            "memory_mib": 80 * GIB,
            "processes": [{"pid": pid, "used_mib": mib} for pid, mib in (processes or {}).get(i, [])],
        }
        for i, uuid in enumerate(GPUS)
    ]
    return yaml.safe_dump({"driver_version": "535.104.05", "gpus": gpus})


def run_agent(plane: controlplane.ControlPlane, file: Path) -> dict[str, Any]:
    """`gpufrac agent --once` on the host, for the real node; its JSON summary."""
    command = [sys.executable, "-m", "gpufrac.cli", "agent", "--once"]
    command += ["--nvml", f"fake:{file}"]
    command += ["--kubeconfig", str(plane.kubeconfig("agent")), "--mps-control", "", "--metrics-port", "0"]
    command += ["--device-plugin", "none"]  # these tests give the scheduler the GPUs without a device plugin
    done = subprocess.run(
        command,
        env={**os.environ, "NODE_NAME": realnode.NAME},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def gpu_node(
    real_node: realnode.RealNode,
    control_plane: controlplane.ControlPlane,
    tmp_path_factory: pytest.TempPathFactory,
) -> realnode.RealNode:
    """The real node with the fake GPUs, published by `gpufrac agent --once` as on a GPU node."""
    file = tmp_path_factory.mktemp("nvml") / "scenario.yaml"
    file.write_text(scenario())
    summary = run_agent(control_plane, file)
    assert [gpu["uuid"] for gpu in summary["gpus"]] == GPUS
    return real_node


@pytest.fixture(scope="module")
def webhook(
    control_plane: controlplane.ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[RunningWebhook, str]]:
    """`gpufrac webhook`, registered for namespaces labelled with the token. The MPS pipe directory it
    mounts into sm-sharing containers is a folder of the test's, not /run on this machine."""
    folder = tmp_path_factory.mktemp("webhook")
    with (
        control_plane.sync_client() as admin,
        serving(admin, folder, "--mps-host-directory", str(folder / "mps")) as webhook,
    ):
        yield webhook


@pytest.fixture(scope="module")
def scheduler(
    control_plane: controlplane.ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[subprocess.Popen[bytes]]:
    """`gpufrac scheduler` as its own process, as its service account. The GPU node's agent ran once
    (`gpu_node`), and no agent keeps its condition's heartbeat fresh here, so staleness is not judged."""
    log = tmp_path_factory.mktemp("scheduler") / "scheduler.log"
    process = start_scheduler(control_plane, log, "--agent-heartbeat-timeout", "0")
    yield process
    process.terminate()
    process.wait(timeout=30)


@pytest.fixture
async def guarded(
    webhook: tuple[RunningWebhook, str],
    scheduler: subprocess.Popen[bytes],
    gpu_node: realnode.RealNode,
    namespace: str,
    admin_client: lightkube.AsyncClient,
) -> AsyncIterator[str]:
    """The test's namespace, served by the webhook and the scheduler, with the GPU node ready."""
    _, token = webhook
    # The trusted tier, where sm-sharing is allowed (test_trust_tiers.py has the untrusted one).
    labels = {LABEL: token, settings.TRUST_LABEL: settings.TRUSTED}
    await admin_client.patch(Namespace, namespace, {"metadata": {"labels": labels}})
    await wait_until_guarded(admin_client, namespace)
    yield namespace


def for_the_node(document: dict[str, Any], *, replicas: int = 2) -> dict[str, Any]:
    """An example adapted to the test node: the local busybox image, never pulled, sleeping; small CPU
    and memory requests; at most ``replicas`` replicas. Its GPU annotations and extended resources
    (`nvidia.com/gpu`) are left as they are."""
    template = document["spec"].get("template", document)
    spec = template["spec"]
    for container in spec["containers"]:
        container.update(image=realnode.BUSYBOX, imagePullPolicy="Never", command=SLEEP)
        container.pop("args", None)
        resources = container.setdefault("resources", {})
        for part in ("requests", "limits"):
            kept = {k: v for k, v in resources.get(part, {}).items() if k not in ("cpu", "memory")}
            resources[part] = {**kept, "cpu": "10m", "memory": "16Mi"} if part == "requests" else kept
    spec["terminationGracePeriodSeconds"] = 1
    spec["automountServiceAccountToken"] = False
    if "replicas" in document["spec"]:
        document["spec"]["replicas"] = min(document["spec"]["replicas"], replicas)
    return document


def kubectl_apply(
    node: realnode.RealNode, plane: controlplane.ControlPlane, namespace: str, text: str
) -> None:
    done = node.kubectl(plane, "apply", "-n", namespace, "-f", "-", identity="tenant", stdin=text)
    assert done.returncode == 0, done.stderr


async def running_pods(client: lightkube.AsyncClient, namespace: str, count: int) -> list[dict[str, Any]]:
    """The namespace's pods once ``count`` of them run with every container started; fails with their
    phases and container states after two minutes."""
    deadline = time.monotonic() + 120
    while True:
        pods = [pod.to_dict() async for pod in client.list(Pod, namespace=namespace)]
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        running = [p for p in live if p.get("status", {}).get("phase") == "Running" and _all_started(p)]
        if len(running) >= count:
            return running
        if time.monotonic() > deadline:
            states = {p["metadata"]["name"]: p.get("status", {}) for p in live}
            raise AssertionError(f"{len(running)} of {count} pods running after 120s: {states}")
        await asyncio.sleep(0.5)


def _all_started(pod: dict[str, Any]) -> bool:
    statuses = pod.get("status", {}).get("containerStatuses") or []
    return len(statuses) == len(pod["spec"]["containers"]) and all("running" in s["state"] for s in statuses)


def container_env(
    node: realnode.RealNode, plane: controlplane.ControlPlane, pod: dict[str, Any], container: str
) -> dict[str, str]:
    """The environment of a running container, read inside it with `kubectl exec env`."""
    meta = pod["metadata"]
    done = node.kubectl(plane, "exec", "-n", meta["namespace"], meta["name"], "-c", container, "--", "env")
    assert done.returncode == 0, done.stderr
    return dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)


def contract_env(env: dict[str, str]) -> dict[str, str]:
    return {key: value for key, value in env.items() if key in keys.ENV_KEYS}


async def check_env(
    node: realnode.RealNode,
    plane: controlplane.ControlPlane,
    client: lightkube.AsyncClient,
    pod: dict[str, Any],
) -> dict[str, dict[str, str]]:
    """Each container's contract variables are exactly what the scheduler wrote: the placement in the
    pod's annotations, rendered, equals the env ConfigMap it wrote, equals what the container sees; a
    container with no share sees `NVIDIA_VISIBLE_DEVICES=void` and nothing else of the contract."""
    placement = contract.parse_placement(pod)
    assert placement is not None, pod["metadata"].get("annotations")
    expected = contract.render_env(placement)
    base = pod["metadata"]["annotations"][keys.ENV_CONFIGMAP_ANNOTATION]
    seen = {}
    for container in pod["spec"]["containers"]:
        name = container["name"]
        env = contract_env(container_env(node, plane, pod, name))
        seen[name] = env
        if name in expected:
            written = await client.get(
                ConfigMap, keys.env_configmap_name(base, name), namespace=pod["metadata"]["namespace"]
            )
            assert written.data == expected[name]
            assert env == expected[name], f"container {name}"
        else:
            assert env == {keys.ENV_VISIBLE_DEVICES: "void"}, f"container {name}"
    return seen


EXAMPLE_FILES = sorted(path.name for path in EXAMPLES.glob("*.yaml"))


@pytest.mark.parametrize("example", EXAMPLE_FILES)
async def test_an_example_runs_with_the_env_the_scheduler_wrote(
    example: str,
    real_node: realnode.RealNode,
    control_plane: controlplane.ControlPlane,
    admin_client: lightkube.AsyncClient,
    guarded: str,
) -> None:
    documents = [for_the_node(d) for d in yaml.safe_load_all((EXAMPLES / example).read_text()) if d]
    kubectl_apply(real_node, control_plane, guarded, yaml.safe_dump_all(documents))
    expected = sum(d["spec"].get("replicas", 1) for d in documents)
    pods = await running_pods(admin_client, guarded, expected)
    for pod in pods:
        assert pod["spec"]["nodeName"] == realnode.NAME
        seen = await check_env(real_node, control_plane, admin_client, pod)
        assert any(keys.ENV_MEMORY_LIMIT in env for env in seen.values()), seen


def share_pod(
    name: str,
    shares: dict[str, tuple[str, str]],
    *,
    others: tuple[str, ...] = (),
    env_from: str = "",
    sm_sharing: tuple[str, ...] = (),
) -> str:
    """A pod as a tenant writes it: per-container GPU memory (request, limit) for each container of
    ``shares`` (in sm-sharing for those named in ``sm_sharing``), containers ``others`` with no GPU, each
    optionally with ``envFrom`` the ConfigMap named."""
    annotations = {}
    for container, (request, limit) in shares.items():
        annotations[f"{keys.CONTAINER_PREFIX}{container}.{keys.MEMORY_REQUEST}"] = request
        annotations[f"{keys.CONTAINER_PREFIX}{container}.{keys.MEMORY_LIMIT}"] = limit
        if container in sm_sharing:
            annotations[f"{keys.CONTAINER_PREFIX}{container}.{keys.COMPUTE_MODE}"] = "sm-sharing"
    containers = [{"name": c} for c in (*shares, *others)]
    if env_from:
        for container in containers:
            container["envFrom"] = [{"configMapRef": {"name": env_from}}]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"schedulerName": "gpufrac", "containers": containers},
    }
    return yaml.safe_dump(for_the_node(pod))


async def test_two_share_containers_and_a_plain_one_in_one_pod(
    real_node: realnode.RealNode,
    control_plane: controlplane.ControlPlane,
    admin_client: lightkube.AsyncClient,
    guarded: str,
) -> None:
    text = share_pod("pair", {"a": ("4Gi", "8Gi"), "b": ("2Gi", "2Gi")}, others=("side",))
    kubectl_apply(real_node, control_plane, guarded, text)
    [pod] = await running_pods(admin_client, guarded, 1)
    seen = await check_env(real_node, control_plane, admin_client, pod)
    assert (seen["a"][keys.ENV_MEMORY_REQUEST], seen["a"][keys.ENV_MEMORY_LIMIT]) == ("4096", "8192")
    assert (seen["b"][keys.ENV_MEMORY_REQUEST], seen["b"][keys.ENV_MEMORY_LIMIT]) == ("2048", "2048")
    assert seen["a"][keys.ENV_VISIBLE_DEVICES] in GPUS and seen["b"][keys.ENV_VISIBLE_DEVICES] in GPUS
    # Each share counts its request in gpufrac.io/gpu-memory, against the capacity the agent advertised, and
    # the kubelet, which checks that, admitted the pod.
    counted = {
        c["name"]: c.get("resources", {}).get("requests", {}).get(RESOURCE) for c in pod["spec"]["containers"]
    }
    assert counted == {"a": "4Gi", "b": "2Gi", "side": None}
    node = (await admin_client.get(Node, realnode.NAME)).to_dict()
    assert contract.parse_quantity(node["status"]["allocatable"][RESOURCE]) == 4 * 80 * 2**30


async def test_a_tenants_own_env_from_cannot_override_the_contract(
    real_node: realnode.RealNode,
    control_plane: controlplane.ControlPlane,
    admin_client: lightkube.AsyncClient,
    guarded: str,
) -> None:
    """The kubelet applies `envFrom` sources in order and `env` last: gpufrac's ConfigMap comes after the
    tenant's, so every variable the scheduler wrote keeps its value (all five for the sm-sharing
    container), and a container without a share has `NVIDIA_VISIBLE_DEVICES=void` in `env`."""
    mine = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "mine"}}
    mine["data"] = {key: "all" if key == keys.ENV_VISIBLE_DEVICES else "999999" for key in keys.ENV_KEYS}
    shares = {"mps": ("1Gi", "2Gi"), "app": ("1Gi", "1Gi")}
    pod_text = share_pod("greedy", shares, others=("side",), env_from="mine", sm_sharing=("mps",))
    kubectl_apply(real_node, control_plane, guarded, yaml.safe_dump(mine) + "---\n" + pod_text)
    [pod] = await running_pods(admin_client, guarded, 1)
    placement = contract.parse_placement(pod)
    assert placement is not None
    written = contract.render_env(placement)
    assert sorted(written["mps"]) == sorted(keys.ENV_KEYS)
    for container in shares:
        env = container_env(real_node, control_plane, pod, container)
        assert {key: env.get(key) for key in written[container]} == written[container], container
    assert container_env(real_node, control_plane, pod, "side")[keys.ENV_VISIBLE_DEVICES] == "void"


# --- the node agent on the host ---------------------------------------------------------------------------


async def tick(plane: controlplane.ControlPlane, file: Path, mode: Mode) -> TickReport:
    """One tick of the node agent on the host, as its service account, with the real /proc and the real
    killer. (The command pairs a fake NVML with a killer that never signals, since a scenario's pids are
    usually made up; here they are real.)"""
    backend = FakeBackend(file)
    async with plane.client("agent") as client:
        agent = Agent(
            Settings(node_name=realnode.NAME, mode=mode, interval=1.0),
            client=client,
            nvml=backend,
            killer=SignalKiller(ProcFS(), backend),
        )
        try:
            return await agent.tick()
        finally:
            await agent.close(stopping=False)  # one tick, not the node's agent going away


def host_pid(node: realnode.RealNode, pod: dict[str, Any], container: str) -> int:
    """The host pid of ``container``'s first process, as runc, which started it, records it."""
    [status] = [s for s in pod["status"]["containerStatuses"] if s["name"] == container]
    return node.container_pid(status["containerID"].partition("://")[2])


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


async def wait_for(what: str, check: Any, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f}s")
        await asyncio.sleep(0.3)


@dataclass(frozen=True)
class Hungry:
    """A running share pod (limit 2 GiB, container `app`, and `side` with no GPU) whose `app` process
    the fake NVML scenario in `file` shows using 3 GiB on the pod's GPU; `pid` is that host pid."""

    pod: dict[str, Any]
    pid: int
    file: Path

    @property
    def namespace(self) -> str:
        return str(self.pod["metadata"]["namespace"])


@pytest.fixture
async def hungry(
    real_node: realnode.RealNode,
    control_plane: controlplane.ControlPlane,
    admin_client: lightkube.AsyncClient,
    guarded: str,
    tmp_path: Path,
) -> Hungry:
    kubectl_apply(
        real_node, control_plane, guarded, share_pod("hungry", {"app": ("1Gi", "2Gi")}, others=("side",))
    )
    [pod] = await running_pods(admin_client, guarded, 1)
    pid = host_pid(real_node, pod, "app")
    placement = contract.parse_placement(pod)
    assert placement is not None
    gpu = GPUS.index(placement.shares[0].devices[0])
    file = tmp_path / "scenario.yaml"
    file.write_text(scenario({gpu: [(pid, 3 * GIB)]}))
    return Hungry(pod, pid, file)


def mapped(report: TickReport, hungry: Hungry) -> None:
    """The agent's one finding is the pid, mapped from its cgroup to the pod's `app` container."""
    [finding] = report.findings
    assert [p.pid for p in finding.processes] == [hungry.pid]
    assert finding.container is not None
    meta = hungry.pod["metadata"]
    assert (finding.container.pod.uid, finding.container.name) == (meta["uid"], "app")
    assert f"container app of pod {meta['namespace']}/{meta['name']} uses 3072 MiB" in finding.detail


def outcomes(report: TickReport) -> list[tuple[str, str]]:
    return [(handled.action, handled.outcome) for handled in report.handled]


async def test_kill_mode_ends_the_process_found_through_proc_and_cgroups(
    hungry: Hungry, control_plane: controlplane.ControlPlane, admin_client: lightkube.AsyncClient
) -> None:
    report = await tick(control_plane, hungry.file, Mode.KILL)
    mapped(report, hungry)
    assert outcomes(report) == [("kill", f"Killed processes (pid, outcome): {hungry.pid} killed")]

    async def ended() -> bool:
        return not alive(hungry.pid)

    await wait_for(f"process {hungry.pid} ended", ended)

    async def restarted() -> bool:
        now = (await admin_client.get(Pod, "hungry", namespace=hungry.namespace)).to_dict()
        return any(s["name"] == "app" and s["restartCount"] >= 1 for s in now["status"]["containerStatuses"])

    await wait_for("the container restarted by the kubelet", restarted)


async def test_evict_mode_gets_the_pod_evicted_and_it_stops(
    real_node: realnode.RealNode,
    hungry: Hungry,
    control_plane: controlplane.ControlPlane,
    admin_client: lightkube.AsyncClient,
) -> None:
    side = host_pid(real_node, hungry.pod, "side")
    report = await tick(control_plane, hungry.file, Mode.EVICT)
    mapped(report, hungry)
    assert [action for action, _ in outcomes(report)] == ["evict"], outcomes(report)

    async def gone() -> bool:
        try:
            await admin_client.get(Pod, "hungry", namespace=hungry.namespace)
        except lightkube.ApiError as error:
            return error.status.code == 404
        return False

    await wait_for("the pod deleted", gone)

    async def stopped() -> bool:
        return not alive(hungry.pid) and not alive(side)

    await wait_for("its containers' processes ended", stopped)


async def test_report_mode_only_reports(
    hungry: Hungry, control_plane: controlplane.ControlPlane, admin_client: lightkube.AsyncClient
) -> None:
    report = await tick(control_plane, hungry.file, Mode.REPORT)
    mapped(report, hungry)
    assert not [action for action, _ in outcomes(report) if action in ("kill", "evict")], outcomes(report)
    await asyncio.sleep(2)
    assert alive(hungry.pid)
    now = (await admin_client.get(Pod, "hungry", namespace=hungry.namespace)).to_dict()
    assert now["metadata"].get("deletionTimestamp") is None
    assert all(s["restartCount"] == 0 for s in now["status"]["containerStatuses"])


# --- the kubelet's gRPC APIs ------------------------------------------------------------------------------


async def test_the_pod_resources_api_lists_the_running_pods(
    real_node: realnode.RealNode,
    control_plane: controlplane.ControlPlane,
    admin_client: lightkube.AsyncClient,
    guarded: str,
) -> None:
    kubectl_apply(
        real_node, control_plane, guarded, share_pod("listed", {"app": ("1Gi", "1Gi")}, others=("side",))
    )
    await running_pods(admin_client, guarded, 1)
    answer = await asyncio.to_thread(kubelet_api.list_pod_resources, str(real_node.podresources_socket))
    listed = {(p.namespace, p.name): sorted(c.name for c in p.containers) for p in answer.pod_resources}
    assert listed[guarded, "listed"] == ["app", "side"]


@pytest.fixture
def default_scheduler(
    real_node: realnode.RealNode, control_plane: controlplane.ControlPlane, tmp_path: Path
) -> Iterator[None]:
    """Kubernetes' own kube-scheduler (v1.20.2, from the same build), placing pods that name no scheduler."""
    log = tmp_path / "kube-scheduler.log"
    binary = real_node.kubectl_binary.with_name("kube-scheduler")
    command = [str(binary), f"--kubeconfig={control_plane.kubeconfig('admin')}", "--leader-elect=false"]
    command += ["--port=0", "--secure-port=0"]
    process = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT)
    yield
    process.terminate()
    process.wait(timeout=30)


@pytest.fixture
def device_plugin(real_node: realnode.RealNode) -> Iterator[FakeDevicePlugin]:
    plugin = FakeDevicePlugin(real_node.device_plugin_dir, GPUS)
    plugin.start()
    yield plugin
    plugin.stop()


async def test_a_device_plugin_pod_gets_a_gpu_visible_in_pod_resources(
    real_node: realnode.RealNode,
    control_plane: controlplane.ControlPlane,
    admin_client: lightkube.AsyncClient,
    namespace: str,
    device_plugin: FakeDevicePlugin,
    default_scheduler: None,
) -> None:
    """NVIDIA's path, beside gpufrac's: the plugin's GPUs in the node's allocatable, a pod asking
    `nvidia.com/gpu: 1` from the default scheduler, one device allocated, and the kubelet telling which."""

    async def advertised() -> bool:
        node = (await admin_client.get(Node, real_node.name)).to_dict()
        return node["status"].get("allocatable", {}).get("nvidia.com/gpu") == str(len(GPUS))

    await wait_for("nvidia.com/gpu in the node's allocatable", advertised)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "whole"},
        "spec": {"containers": [{"name": "cuda", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }
    kubectl_apply(real_node, control_plane, namespace, yaml.safe_dump(for_the_node(pod)))
    [running] = await running_pods(admin_client, namespace, 1)
    client = PodResourcesClient(real_node.podresources_socket, timeout=10)
    try:
        listed = await asyncio.to_thread(client.list)
        # Kubernetes 1.20's kubelet has no GetAllocatableResources (1.21 and later).
        assert await asyncio.to_thread(client.allocatable) is None
    finally:
        client.close()
    [devices] = [d for d in listed if (d.namespace, d.pod) == (namespace, "whole")]
    assert devices.container == "cuda" and devices.resource == "nvidia.com/gpu"
    assert len(devices.device_ids) == 1 and devices.device_ids[0] in GPUS
    assert device_plugin.registered
    assert list(device_plugin.allocations) == [list(devices.device_ids)]
    env = container_env(real_node, control_plane, running, "cuda")
    assert env[keys.ENV_VISIBLE_DEVICES] == devices.device_ids[0]
