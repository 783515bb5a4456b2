"""`gpufrac scheduler` against a real kube-apiserver: binds, ConfigMaps, failures, restarts, leadership."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightkube
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import ConfigMap, Event, Pod

from gpufrac import contract
from gpufrac.contract import keys

from . import controlplane, fakenodes
from .scheduling import allocation_problems, gpu_pod, running_scheduler, top, wait_bound

GPU_MIB = 81920


def key(container: str, suffix: str) -> str:
    return keys.container_key(container, suffix)


async def test_binds_every_kind_of_gpu_pod_with_annotations_and_configmaps(
    admin_client: lightkube.AsyncClient,
    scheduler_client: lightkube.AsyncClient,
    namespace: str,
    gpu_nodes: fakenodes.GpuNodes,
) -> None:
    nodes = [(await gpu_nodes.create(gpus=4)).metadata.name for _ in range(2)]  # type: ignore[union-attr]
    pods = {
        "quarter": gpu_pod("quarter", namespace, annotations={"gpu-fraction": "0.25"}),
        "notebook": gpu_pod(
            "notebook", namespace, annotations={"gpu-memory": "20Gi", "gpu-memory.limit": "40Gi"}
        ),
        "pair": gpu_pod(
            "pair", namespace, annotations={"gpu-fraction": "0.5", "gpu-fraction-num-devices": "2"}
        ),
        "mps": gpu_pod(
            "mps",
            namespace,
            annotations={
                key("main", "gpu-memory.request"): "10Gi",
                key("main", "gpu-compute.mode"): "sm-sharing",
            },
        ),
        "whole": gpu_pod("whole", namespace, whole_gpus=2),
    }
    for pod in pods.values():
        await admin_client.create(pod)
    async with running_scheduler(scheduler_client, policy="binpack"):
        listed = await wait_bound(admin_client, namespace, len(pods))
    by_name = {pod["metadata"]["name"]: pod for pod in listed}
    for pod in by_name.values():
        assert pod["spec"]["nodeName"] in nodes
    quarter = by_name["quarter"]["metadata"]["annotations"]
    assert quarter[key("main", "gpu-memory.request")] == f"{GPU_MIB // 4}Mi"
    assert quarter[key("main", "gpu-memory.limit")] == f"{GPU_MIB // 4}Mi"
    assert quarter[key("main", "gpu-compute.mode")] == "time-slicing"
    notebook = by_name["notebook"]["metadata"]["annotations"]
    assert (notebook[key("main", "gpu-memory.request")], notebook[key("main", "gpu-memory.limit")]) == (
        "20480Mi",
        "40960Mi",
    )
    pair = contract.parse_placement(by_name["pair"])
    assert pair is not None and len(set(pair.shares[0].devices)) == 2
    assert by_name["mps"]["metadata"]["annotations"][key("main", "gpu-compute.mode")] == "sm-sharing"
    whole = contract.parse_placement(by_name["whole"])
    assert whole is not None and len(whole.whole[0].devices) == 2
    # The env ConfigMaps: one per GPU container, owned by the pod, immutable, with the resolved limits.
    for name, pod in by_name.items():
        base = pod["metadata"]["annotations"][keys.ENV_CONFIGMAP_ANNOTATION]
        configmap = await admin_client.get(
            ConfigMap, keys.env_configmap_name(base, "main"), namespace=namespace
        )
        assert configmap.immutable is True
        assert configmap.metadata.ownerReferences[0].uid == pod["metadata"]["uid"]  # type: ignore[union-attr,index]
        placed = contract.parse_placement(pod)
        assert placed is not None
        devices = placed.shares[0].devices if placed.shares else placed.whole[0].devices
        assert configmap.data[keys.ENV_VISIBLE_DEVICES] == ",".join(devices), name  # type: ignore[index]
    mps_env = (
        await admin_client.get(
            ConfigMap,
            keys.env_configmap_name(
                by_name["mps"]["metadata"]["annotations"][keys.ENV_CONFIGMAP_ANNOTATION], "main"
            ),
            namespace=namespace,
        )
    ).data
    assert (
        mps_env is not None
        and keys.ENV_MPS_PIPE_DIRECTORY in mps_env
        and keys.ENV_MPS_MEMORY_LIMIT in mps_env
    )
    assert await allocation_problems(admin_client) == []


async def test_an_unschedulable_pod_gets_an_event_and_a_condition_that_count_nodes_by_reason(
    admin_client: lightkube.AsyncClient,
    scheduler_client: lightkube.AsyncClient,
    namespace: str,
    gpu_nodes: fakenodes.GpuNodes,
) -> None:
    await gpu_nodes.create(gpus=1, gpu_memory_mib=16384)
    await gpu_nodes.create(gpus=1, gpu_memory_mib=16384)
    await admin_client.create(gpu_pod("big", namespace, annotations={"gpu-memory": "20Gi"}))
    async with running_scheduler(scheduler_client):
        deadline = time.monotonic() + 30
        while True:
            pod = await admin_client.get(Pod, "big", namespace=namespace)
            conditions = [c for c in (pod.status.conditions or []) if c.type == "PodScheduled"]  # type: ignore[union-attr]
            if conditions or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
    assert conditions and conditions[0].status == "False"
    assert "0/2 nodes are available" in (conditions[0].message or "")
    assert "2 not enough GPU memory" in (conditions[0].message or "")
    events = [e async for e in admin_client.list(Event, namespace=namespace)]
    assert any(
        e.reason == "FailedScheduling" and "not enough GPU memory" in (e.message or "") for e in events
    )
    assert not pod.spec.nodeName  # type: ignore[union-attr]


async def test_a_restarted_scheduler_rebuilds_its_state_and_never_double_books(
    admin_client: lightkube.AsyncClient,
    scheduler_client: lightkube.AsyncClient,
    namespace: str,
    gpu_nodes: fakenodes.GpuNodes,
) -> None:
    await gpu_nodes.create(gpus=2, gpu_memory_mib=16384)
    for i in range(2):
        await admin_client.create(gpu_pod(f"first-{i}", namespace, annotations={"gpu-fraction": "0.5"}))
    async with running_scheduler(scheduler_client):
        await wait_bound(admin_client, namespace, 2)
    # A new scheduler knows only what the API says; two more halves fit, a fifth does not.
    for i in range(3):
        await admin_client.create(gpu_pod(f"second-{i}", namespace, annotations={"gpu-fraction": "0.5"}))
    async with running_scheduler(scheduler_client) as scheduler:
        listed = await wait_bound(admin_client, namespace, 4)
        await asyncio.sleep(1.0)
        assert len(scheduler.cache.state.placements) == 4
    bound = [pod for pod in listed if pod["spec"].get("nodeName")]
    assert len(bound) == 4
    assert await allocation_problems(admin_client) == []


async def test_a_deleted_pod_releases_its_share(
    admin_client: lightkube.AsyncClient,
    scheduler_client: lightkube.AsyncClient,
    namespace: str,
    gpu_nodes: fakenodes.GpuNodes,
) -> None:
    await gpu_nodes.create(gpus=1, gpu_memory_mib=16384)
    await admin_client.create(gpu_pod("holder", namespace, annotations={"gpu-fraction": "0.75"}))
    async with running_scheduler(scheduler_client) as scheduler:
        await wait_bound(admin_client, namespace, 1)
        await admin_client.create(gpu_pod("waiter", namespace, annotations={"gpu-fraction": "0.5"}))
        await asyncio.sleep(1.0)
        assert (await admin_client.get(Pod, "waiter", namespace=namespace)).spec.nodeName is None  # type: ignore[union-attr]
        await admin_client.delete(Pod, "holder", namespace=namespace, grace_period=0)
        pods = await wait_bound(admin_client, namespace, 1, timeout=30)
        assert [p["metadata"]["name"] for p in pods if p["spec"].get("nodeName")] == ["waiter"]
        assert [scheduler.cache.names[uid] for uid in scheduler.cache.state.placements] == [
            f"{namespace}/waiter"
        ]


def start_scheduler(plane: controlplane.ControlPlane, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    """`gpufrac scheduler` as its own process, as the scheduler's service account."""
    command = [
        sys.executable,
        "-m",
        "gpufrac.cli",
        "scheduler",
        "--kubeconfig",
        str(plane.kubeconfig("scheduler")),
        "--metrics-port",
        "0",
        *extra,
    ]
    return subprocess.Popen(command, stdout=log.open("ab"), stderr=subprocess.STDOUT)


async def test_killed_mid_burst_every_pod_is_bound_exactly_once(
    control_plane: controlplane.ControlPlane,
    admin_client: lightkube.AsyncClient,
    namespace: str,
    gpu_nodes: fakenodes.GpuNodes,
    tmp_path: Path,
) -> None:
    for _ in range(8):
        await gpu_nodes.create(gpus=8, gpu_memory_mib=GPU_MIB)
    burst = 500
    create = [
        admin_client.create(gpu_pod(f"p{i:03d}", namespace, annotations={"gpu-fraction": "0.125"}))
        for i in range(burst)
    ]
    first = start_scheduler(control_plane, tmp_path / "first.log")
    try:
        await asyncio.gather(*create)
        await wait_bound(admin_client, namespace, burst // 5, timeout=120)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    second = start_scheduler(control_plane, tmp_path / "second.log")
    try:
        listed = await wait_bound(admin_client, namespace, burst, timeout=180)
    finally:
        second.terminate()
        stopped = second.wait()
    assert stopped == 0, "SIGTERM stops the scheduler cleanly"
    assert sum(1 for pod in listed if pod["spec"].get("nodeName")) == burst
    assert await allocation_problems(admin_client) == []
    # 8 nodes x 8 GPUs x 8 eighths = 512 slots: each pod has exactly one device, none counted twice.
    devices = [(pod["spec"]["nodeName"], contract.parse_placement(pod).shares[0].devices) for pod in listed]  # type: ignore[union-attr]
    assert all(len(d) == 1 for _, d in devices)


async def logs_saying(folder: Path, names: list[str], text: str, *, count: int) -> list[str]:
    """The logs once `count` of them say `text`, or as they are after 10 s."""
    deadline = time.monotonic() + 10
    while True:
        logs = [(folder / name).read_text() for name in names]
        if sum(text in log for log in logs) >= count or time.monotonic() > deadline:
            return logs
        await asyncio.sleep(0.1)


async def test_of_two_replicas_only_the_leader_binds_and_the_other_takes_over(
    control_plane: controlplane.ControlPlane,
    admin_client: lightkube.AsyncClient,
    namespace: str,
    gpu_nodes: fakenodes.GpuNodes,
    tmp_path: Path,
) -> None:
    await gpu_nodes.create(gpus=8)
    replicas = [start_scheduler(control_plane, tmp_path / f"r{i}.log", "--leader-elect") for i in range(2)]
    try:
        await admin_client.create(gpu_pod("before", namespace, annotations={"gpu-fraction": "0.5"}))
        await wait_bound(admin_client, namespace, 1, timeout=60)
        lease = await admin_client.get(Lease, "gpufrac", namespace=controlplane.SCHEDULER_NAMESPACE)
        holder = lease.spec.holderIdentity  # type: ignore[union-attr]
        leader = next(r for r in replicas if holder.endswith(f"_{r.pid}"))  # type: ignore[union-attr]
        standby = next(r for r in replicas if r is not leader)
        leader.send_signal(signal.SIGKILL)
        leader.wait()
        killed = time.monotonic()
        await admin_client.create(gpu_pod("after", namespace, annotations={"gpu-fraction": "0.5"}))
        await wait_bound(admin_client, namespace, 2, timeout=40)
        took = time.monotonic() - killed
        lease = await admin_client.get(Lease, "gpufrac", namespace=controlplane.SCHEDULER_NAMESPACE)
        assert lease.spec.holderIdentity.endswith(f"_{standby.pid}")  # type: ignore[union-attr]
        assert took < (lease.spec.leaseDurationSeconds or 15) + 10  # type: ignore[union-attr]
        # The API shows the pod bound a moment before its scheduler logs the bind.
        logs = await logs_saying(tmp_path, ["r0.log", "r1.log"], "bound to", count=2)
        assert sum("bound to" in text for text in logs) == 2  # one bind each: never both for one pod
        assert all(text.count("pod " + f"{namespace}/before bound") <= 1 for text in logs)
    finally:
        for replica in replicas:
            if replica.poll() is None:
                os.kill(replica.pid, signal.SIGTERM)
                replica.wait()


async def test_top_shows_each_gpu_with_its_pods(
    control_plane: controlplane.ControlPlane,
    admin_client: lightkube.AsyncClient,
    scheduler_client: lightkube.AsyncClient,
    namespace: str,
    gpu_nodes: fakenodes.GpuNodes,
) -> None:
    node = (await gpu_nodes.create(gpus=1, gpu_memory_mib=16384)).metadata.name  # type: ignore[union-attr]
    await admin_client.create(
        gpu_pod("half", namespace, annotations={"gpu-fraction": "0.5", "gpu-fraction.limit": "0.75"})
    )
    async with running_scheduler(scheduler_client):
        await wait_bound(admin_client, namespace, 1)
    shown, table = top(control_plane)
    (gpu,) = [row for row in json.loads(shown) if row["node"] == node]
    assert (gpu["requested_mib"], gpu["limits_mib"], gpu["free_mib"], gpu["mode"]) == (
        8192,
        12288,
        8192,
        "time-slicing",
    )
    assert [share["pod"] for share in gpu["pods"]] == [f"{namespace}/half"]
    assert node in table and "8192/16384" in table
