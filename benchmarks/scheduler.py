"""Scheduler throughput and latency against a real kube-apiserver (issue 4).

One control plane (`hack/test-cluster start`: etcd and kube-apiserver v1.20.2, no controllers), the openb
node list as fake nodes (Ready, untainted, GPU Feature Discovery labels and `nvidia.com/gpu` capacity), then,
for each run, a burst of pods taken from the openb pod list (seeded shuffle) in a fresh namespace:

- `gpufrac`: `gpufrac scheduler --policy binpack` as a subprocess; share pods ask with the `gpu-fraction`
  annotation, whole-GPU pods with `nvidia.com/gpu`, and GPU pods carry `gpufrac.io/env-configmap` (what the
  webhook adds), so every GPU bind is the full one: env ConfigMap, then one Binding carrying the contract;
- `gpufrac-annotations-only`: the same with `--env-delivery annotations-only` (no ConfigMap);
- `gpufrac-queues`: `gpufrac` with `--queues`, the pods dealt round-robin into four tenant queues (Queue
  objects, each guaranteed a quarter of the GPUs and their memory), so every pop ranks the queues;
- `kube-scheduler`: the real kube-scheduler v1.20.2 with its defaults (client QPS 50, burst 100), every pod
  asking for whole GPUs (`nvidia.com/gpu`: the trace's GPU count, at least 1) and the same CPU and memory;
- `kube-scheduler-qps1000`: the same with `--kube-api-qps 1000 --kube-api-burst 1000`.

Pods are created by one client with `--concurrency` requests in flight (raw JSON over HTTP/1.1, so that this
process spends as little of the shared CPUs as it can), all at once or paced with `--rate`, and a watch on
bound pods (`spec.nodeName!=`) stamps when each is first seen bound. Reported per run: pods created and their
rate, pods bound, pods/s (bound / (last bound - first create returned)), and create-to-bound latency (p50,
p99, max; from the moment the pod's create returned to the moment the watch saw it bound). In a burst, pods
are created faster than any scheduler here binds them, so latency is mostly time in the queue: p99 is about
burst size / bind rate - burst size / create rate. `--rate` below the bind rate measures latency without that
queue. CPU seconds used during the burst by the scheduler, kube-apiserver, etcd, this client and everything
else on the machine say which was the bottleneck, and, per bound pod, what each scheduler costs itself and the
apiserver; on a shared machine the rates move with the others' load, the costs much less. `--repeat N` takes
turns between the runs N times. Both schedulers run with the admin kubeconfig. Targets (gpufrac, configmap
delivery): >= 100 pods/s, p99 < 2 s.

`--profile DIR` samples the gpufrac scheduler's CPU time (SIGPROF at every 2 ms of CPU or the kernel's tick,
about 1% overhead), writes the stacks to DIR/<run>-<round>.json and prints where its CPU time went.

Run: .venv/bin/python benchmarks/scheduler.py [--pods 5000] [--nodes all] [--concurrency 64] [--rate 0]
     [--runs gpufrac,...] [--repeat 1] [--profile DIR]
Needs the binaries of `hack/test-cluster build` (`make kube-bins`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import lightkube
import yaml
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.core_v1 import Namespace, ServiceAccount
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from gpufrac import contract
from gpufrac.cluster.model import NodeSpec
from gpufrac.contract import keys, queues
from gpufrac.kubeapi.custom import QUEUE_RESOURCE
from gpufrac.sim import trace as openb
from gpufrac.sim.trace import TracePod
from gpufrac.testing.fake_nodes import create_gpu_node

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "hack" / "test-cluster"
RUNS = ("gpufrac", "gpufrac-annotations-only", "gpufrac-queues", "kube-scheduler", "kube-scheduler-qps1000")
# `gpufrac-queues`: the pods of `gpufrac`, dealt round-robin into this many tenant queues, each guaranteed an
# equal part of the cluster, and the scheduler run with `--queues`.
QUEUES = 4
TARGET_PODS_PER_SECOND = 100.0
TARGET_P99_SECONDS = 2.0
IMAGE = "registry.k8s.io/pause:3.2"  # never pulled: there are no kubelets
JSON = {"Content-Type": "application/json"}
console = Console(stderr=True)


class BenchmarkError(Exception):
    """Something the benchmark cannot go on without; the message is one line."""


# ---- control plane ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cluster:
    rundir: Path
    url: str
    ca_file: Path
    kubeconfig: Path
    token: str

    def pid(self, name: str) -> int | None:
        path = self.rundir / f"{name}.pid"
        return int(path.read_text()) if path.is_file() else None


def start_cluster(rundir: Path) -> Cluster:
    """etcd and kube-apiserver on free loopback ports; they stop when this process dies, however it dies."""
    env = dict(os.environ, OWNER_PID=str(os.getpid()))
    for name in ("PORT", "ETCD_PORT", "CONTROLLERS"):
        env.pop(name, None)
    try:
        done = subprocess.run(
            [str(SCRIPT), "start", str(rundir)], env=env, capture_output=True, text=True, timeout=180
        )
    except subprocess.TimeoutExpired:
        raise BenchmarkError(f"hack/test-cluster start timed out after 180 s; logs in {rundir}") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise BenchmarkError(f"hack/test-cluster start failed (exit {done.returncode}): {last}; see {rundir}")
    settings = dict(
        line.split("=", 1) for line in (rundir / "cluster.env").read_text().splitlines() if "=" in line
    )
    kubeconfig = Path(settings["KUBECONFIG"])
    token = yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]["token"]
    return Cluster(rundir, settings["APISERVER_URL"], Path(settings["CA_FILE"]), kubeconfig, token)


def stop_cluster(rundir: Path) -> None:
    subprocess.run([str(SCRIPT), "stop", str(rundir)], check=False, capture_output=True, timeout=60)


def http_client(cluster: Cluster, *, connections: int) -> httpx2.AsyncClient:
    """Plain JSON requests as the admin: no typed models to build or decode during the burst."""
    return httpx2.AsyncClient(
        base_url=cluster.url,
        verify=ssl.create_default_context(cafile=str(cluster.ca_file)),
        headers={"Authorization": f"Bearer {cluster.token}"},
        limits=httpx2.Limits(max_connections=connections, max_keepalive_connections=connections),
        timeout=httpx2.Timeout(60.0),
        trust_env=False,
    )


def kube_client(cluster: Cluster) -> lightkube.AsyncClient:
    config = lightkube.KubeConfig.from_file(cluster.kubeconfig)
    return lightkube.AsyncClient(config, trust_env=False, field_manager="gpufrac-benchmark")


# ---- workload ---------------------------------------------------------------------------------------------


def progress() -> Progress:
    return Progress(
        TextColumn("{task.description:<34}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )


async def create_nodes(cluster: Cluster, nodes: list[NodeSpec], *, concurrency: int) -> None:
    slots = asyncio.Semaphore(concurrency)
    async with kube_client(cluster) as client:

        async def one(spec: NodeSpec) -> None:
            async with slots:
                await create_gpu_node(
                    client,
                    spec.name,
                    gpus=len(spec.gpus),
                    gpu_memory_mib=spec.gpus[0].memory_mib if spec.gpus else 0,
                    product=spec.gpus[0].model if spec.gpus else "",
                    cpu=f"{spec.cpu_milli}m",
                    memory=f"{spec.memory_mib}Mi",
                )
            bar.advance(task)

        with progress() as bar:
            task = bar.add_task(f"{len(nodes)} fake nodes", total=len(nodes))
            await asyncio.gather(*(one(spec) for spec in nodes))


async def create_namespace(cluster: Cluster, name: str) -> None:
    """With a `default` ServiceAccount that mounts no token: the ServiceAccount admission plugin wants the
    account, and nothing here makes token Secrets."""
    async with kube_client(cluster) as client:
        await client.create(Namespace(metadata=ObjectMeta(name=name)))
        account = ServiceAccount(metadata=ObjectMeta(name="default", namespace=name))
        account.automountServiceAccountToken = False
        await client.create(account)


def sample(pods: tuple[TracePod, ...], count: int, seed: int) -> list[TracePod]:
    """`count` pods of the trace in a seeded random order (the list again, reshuffled, past its end)."""
    rng = random.Random(seed)
    chosen: list[TracePod] = []
    while len(chosen) < count:
        batch = list(pods)
        rng.shuffle(batch)
        chosen.extend(batch[: count - len(chosen)])
    return chosen


def pod_body(
    name: str,
    namespace: str,
    *,
    scheduler: str | None,
    pod: TracePod,
    whole_gpus: int,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The trace pod's CPU and memory as requests, `whole_gpus` as `nvidia.com/gpu`, and an `envFrom` to
    the env ConfigMap that `gpufrac.io/env-configmap` names, as the admission webhook would add."""
    requests = {}
    if pod.cpu_milli > 0:
        requests["cpu"] = f"{pod.cpu_milli}m"
    if pod.memory_mib > 0:
        requests["memory"] = f"{pod.memory_mib}Mi"
    limits = {}
    if whole_gpus:
        requests["nvidia.com/gpu"] = limits["nvidia.com/gpu"] = str(whole_gpus)
    container: dict[str, Any] = {"name": "main", "image": IMAGE, "resources": {"requests": requests}}
    if limits:
        container["resources"]["limits"] = limits
    annotations = annotations or {}
    if keys.ENV_CONFIGMAP_ANNOTATION in annotations:
        configmap = keys.env_configmap_name(annotations[keys.ENV_CONFIGMAP_ANNOTATION], "main")
        container["envFrom"] = [{"configMapRef": {"name": configmap, "optional": False}}]
    spec: dict[str, Any] = {
        "containers": [container],
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 0,
    }
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    metadata = {"name": name, "namespace": namespace, "annotations": annotations}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def gpufrac_pod(name: str, namespace: str, pod: TracePod) -> dict[str, Any]:
    """A share pod (gpu_milli < 1000) asks with `gpu-fraction`, a whole-GPU pod with `nvidia.com/gpu`; GPU
    pods get their env ConfigMap's name."""
    share = pod.num_gpu > 0 and pod.gpu_milli < 1000
    annotations = {}
    if share:
        annotations[keys.GPU_FRACTION] = f"{pod.gpu_milli / 1000:g}"
        if pod.num_gpu > 1:
            annotations[keys.NUM_DEVICES] = str(pod.num_gpu)
    if pod.num_gpu:
        annotations[keys.ENV_CONFIGMAP_ANNOTATION] = f"{keys.ENV_CONFIGMAP_PREFIX}{name}"
    whole = 0 if share else pod.num_gpu
    return pod_body(name, namespace, scheduler="gpufrac", pod=pod, whole_gpus=whole, annotations=annotations)


def queued_pod(name: str, namespace: str, pod: TracePod) -> dict[str, Any]:
    """`gpufrac_pod`, in one of the `QUEUES` tenant queues (by its number)."""
    body = gpufrac_pod(name, namespace, pod)
    body["metadata"]["labels"] = {queues.QUEUE_LABEL: f"team-{int(name.rpartition('-')[2]) % QUEUES}"}
    return body


async def create_queues(cluster: Cluster, nodes: list[NodeSpec]) -> None:
    """The Queue CRD and `QUEUES` queues, each guaranteed an equal part of the GPUs and their memory."""
    crd = yaml.safe_load((REPO / "deploy/helm/gpufrac/crds/queues.gpufrac.io.yaml").read_text())
    gpus = sum(len(node.gpus) for node in nodes)
    memory = sum(gpu.memory_mib for node in nodes for gpu in node.gpus)
    async with kube_client(cluster) as client:
        await client.create(CustomResourceDefinition.from_dict(crd))
        for _ in range(100):  # served once Established: the API server does it itself, in a moment
            got = (await client.get(CustomResourceDefinition, crd["metadata"]["name"])).to_dict()
            if any(c["type"] == "Established" for c in got["status"].get("conditions", [])):
                break
            await asyncio.sleep(0.1)
        for i in range(QUEUES):
            share = {"gpus": {"quota": gpus // QUEUES}, "gpuMemory": {"quota": f"{memory // QUEUES}Mi"}}
            body = {"metadata": {"name": f"team-{i}"}, "spec": {"resources": share}}
            await client.create(QUEUE_RESOURCE.from_dict(body))


def whole_gpu_pod(name: str, namespace: str, pod: TracePod) -> dict[str, Any]:
    """What kube-scheduler can place: whole GPUs only, at least one."""
    return pod_body(name, namespace, scheduler=None, pod=pod, whole_gpus=max(pod.num_gpu, 1))


# ---- one run ----------------------------------------------------------------------------------------------


@dataclass
class Run:
    name: str
    namespace: str
    scheduler_name: str  # spec.schedulerName the pods use
    command: list[str]
    make_pod: Callable[[str, str, TracePod], dict[str, Any]]
    profile: Path | None = None


@dataclass
class Result:
    run: str
    pods: int
    profile: Path | None = None
    created_at: dict[str, float] = field(default_factory=dict)
    bound_at: dict[str, float] = field(default_factory=dict)
    create_failed: int = 0
    first_sent: float = 0.0
    last_created: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)
    busiest_others: list[tuple[str, float]] = field(default_factory=list)

    @property
    def bound(self) -> int:
        return sum(1 for name in self.bound_at if name in self.created_at)

    def latencies(self) -> list[float]:
        return sorted(self.bound_at[n] - t for n, t in self.created_at.items() if n in self.bound_at)

    def pods_per_second(self) -> float:
        if not self.bound_at or not self.created_at:
            return 0.0
        span = max(self.bound_at.values()) - min(self.created_at.values())
        return self.bound / span if span > 0 else 0.0

    def create_rate(self) -> float:
        span = self.last_created - self.first_sent
        return len(self.created_at) / span if span > 0 else 0.0


def percentile(ordered: list[float], q: float) -> float:
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


class Cpu:
    """CPU seconds of the processes that matter, of the whole machine, and of the busiest other processes,
    between two snapshots."""

    def __init__(self, pids: dict[str, int | None]) -> None:
        self.pids = {name: pid for name, pid in pids.items() if pid}
        self.tick = os.sysconf("SC_CLK_TCK")
        self.start, self.start_all = self._read(), self._all()

    def _read(self) -> dict[str, float]:
        values = {name: self._process(pid)[1] for name, pid in self.pids.items()}
        with open("/proc/stat") as stat:
            fields = [int(v) for v in stat.readline().split()[1:]]
        values["machine"] = (sum(fields[:8]) - fields[3] - fields[4]) / self.tick  # all but idle and iowait
        values["wall"] = time.monotonic()
        return values

    def _process(self, pid: int) -> tuple[str, float]:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                comm, rest = stat.read().split(" (", 1)[1].rsplit(")", 1)
        except (OSError, ValueError):
            return "", 0.0
        fields = rest.split()
        return comm, (int(fields[11]) + int(fields[12])) / self.tick  # utime, stime

    def _all(self) -> dict[int, tuple[str, float]]:
        return {int(pid): self._process(int(pid)) for pid in os.listdir("/proc") if pid.isdigit()}

    def used(self) -> tuple[dict[str, float], list[tuple[str, float]]]:
        end, end_all = self._read(), self._all()
        used = {name: end[name] - self.start[name] for name in end}
        used["other"] = used["machine"] - sum(used[name] for name in self.pids)
        ours = set(self.pids.values())
        others: dict[str, float] = {}
        for pid, (comm, seconds) in end_all.items():
            if pid not in ours and comm:
                others[comm] = others.get(comm, 0.0) + seconds - self.start_all.get(pid, (comm, 0.0))[1]
        busiest = sorted(((c, s) for c, s in others.items() if s >= 0.5), key=lambda item: -item[1])
        return used, busiest[:3]


async def watch_bound(http: httpx2.AsyncClient, result: Result, namespace: str, version: str) -> None:
    """Stamp each pod the first time it is seen with a node. Only bound pods match the field selector, so
    this process parses one event per pod."""
    params = {
        "watch": "1",
        "fieldSelector": "spec.nodeName!=",
        "resourceVersion": version,
        "timeoutSeconds": "3600",
    }
    while True:
        async with http.stream(
            "GET",
            f"/api/v1/namespaces/{namespace}/pods",
            params=params,
            timeout=httpx2.Timeout(60.0, read=None),
        ) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if not line:
                    continue
                event = json.loads(line)
                seen = time.monotonic()
                item = event.get("object") or {}
                if event.get("type") == "ERROR":
                    raise BenchmarkError(f"watch of bound pods failed: {item.get('message')}")
                params["resourceVersion"] = item["metadata"]["resourceVersion"]
                if event["type"] != "DELETED" and (item.get("spec") or {}).get("nodeName"):
                    result.bound_at.setdefault(item["metadata"]["name"], seen)


async def create_pods(
    http: httpx2.AsyncClient,
    result: Result,
    namespace: str,
    bodies: list[tuple[str, bytes]],
    concurrency: int,
    rate: float,
) -> None:
    """`rate` > 0 paces the creates at that many a second; 0 creates them as fast as the apiserver answers."""
    path = f"/api/v1/namespaces/{namespace}/pods"
    pending: Iterator[tuple[int, tuple[str, bytes]]] = enumerate(bodies)

    async def worker() -> None:
        for i, (name, body) in pending:  # one iterator shared by all workers
            if rate > 0:
                await asyncio.sleep(result.first_sent + i / rate - time.monotonic())
            for attempt in range(6):
                try:
                    response = await http.post(path, content=body, headers=JSON)
                except httpx2.TransportError:
                    response = None
                # 409 after a retry: the create that seemed lost did go through.
                if response is not None and (
                    response.status_code == 201 or (attempt and response.status_code == 409)
                ):
                    result.created_at[name] = result.last_created = time.monotonic()
                    break
                if response is not None and response.status_code not in (429, 500, 503, 504):
                    raise BenchmarkError(f"creating pod {name}: {response.status_code} {response.text[:200]}")
                await asyncio.sleep(0.1 * 2**attempt)
            else:
                result.create_failed += 1

    result.first_sent = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def warm_up(
    http: httpx2.AsyncClient,
    namespace: str,
    pod: dict[str, Any],
    scheduler: subprocess.Popen[bytes],
    log: Path,
) -> None:
    """Create one small pod and wait until it is bound: the scheduler has synced and binds. Then delete it."""
    name = pod["metadata"]["name"]
    path = f"/api/v1/namespaces/{namespace}/pods"
    (await http.post(path, content=json.dumps(pod), headers=JSON)).raise_for_status()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if scheduler.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
            raise BenchmarkError(f"the scheduler exited ({scheduler.returncode}): {tail[0]}; see {log}")
        response = await http.get(f"{path}/{name}")
        if response.status_code == 200 and response.json()["spec"].get("nodeName"):
            await http.delete(f"{path}/{name}", params={"gracePeriodSeconds": "0"})
            return
        await asyncio.sleep(0.2)
    raise BenchmarkError(f"the scheduler bound no warm-up pod within 120 s; see {log}")


async def delete_pods(http: httpx2.AsyncClient, namespace: str) -> None:
    """Free the nodes for the next run. A bound pod is only deleted at once with grace period 0."""
    path = f"/api/v1/namespaces/{namespace}/pods"
    (await http.delete(path, params={"gracePeriodSeconds": "0"}, timeout=300)).raise_for_status()
    while (await http.get(path, params={"limit": "1"})).json()["items"]:
        await asyncio.sleep(0.5)


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGINT first: the profiler still writes its file."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def run_one(
    cluster: Cluster, run: Run, trace_pods: list[TracePod], *, concurrency: int, rate: float, stall: float
) -> Result:
    await create_namespace(cluster, run.namespace)
    bodies = [
        (f"p-{i:05d}", json.dumps(run.make_pod(f"p-{i:05d}", run.namespace, pod)).encode())
        for i, pod in enumerate(trace_pods)
    ]
    result = Result(run.name, len(bodies), profile=run.profile)
    log = cluster.rundir / f"{run.name}.log"
    with log.open("wb") as output:
        scheduler = subprocess.Popen(run.command, stdout=output, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        async with http_client(cluster, connections=concurrency + 4) as http:
            scheduler_name = None if run.scheduler_name == "default-scheduler" else run.scheduler_name
            warmup = pod_body(
                "warm-up", run.namespace, scheduler=scheduler_name, pod=trace_pods[0], whole_gpus=0
            )
            warmup["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "10m"}}
            await warm_up(http, run.namespace, warmup, scheduler, log)
            listing = (
                await http.get(f"/api/v1/namespaces/{run.namespace}/pods", params={"limit": "1"})
            ).json()
            watcher = asyncio.create_task(
                watch_bound(http, result, run.namespace, listing["metadata"]["resourceVersion"])
            )
            cpu = Cpu(
                {
                    "scheduler": scheduler.pid,
                    "kube-apiserver": cluster.pid("apiserver"),
                    "etcd": cluster.pid("etcd"),
                    "client": os.getpid(),
                }
            )
            with progress() as bar:
                created = bar.add_task(f"{run.name}: created", total=len(bodies))
                bound = bar.add_task(f"{run.name}: bound", total=len(bodies))
                creator = asyncio.create_task(
                    create_pods(http, result, run.namespace, bodies, concurrency, rate)
                )
                last_count, last_change = 0, time.monotonic()
                while True:
                    await asyncio.sleep(0.25)
                    if watcher.done():
                        watcher.result()  # raises what stopped it
                    if creator.done():
                        creator.result()
                    if scheduler.poll() is not None:
                        raise BenchmarkError(f"the scheduler exited ({scheduler.returncode}); see {log}")
                    bar.update(created, completed=len(result.created_at))
                    bar.update(bound, completed=result.bound)
                    now = time.monotonic()
                    if result.bound != last_count:
                        last_count, last_change = result.bound, now
                    if creator.done() and result.bound >= len(result.created_at):
                        break
                    if creator.done() and now - max(last_change, result.last_created) > stall:
                        break  # the rest do not fit, or the scheduler is stuck
                result.cpu, result.busiest_others = cpu.used()
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            stop(scheduler)
            with progress() as bar:
                bar.add_task(f"{run.name}: deleting the pods", total=None)
                await delete_pods(http, run.namespace)
    finally:
        stop(scheduler)
    return result


# ---- report -----------------------------------------------------------------------------------------------


def report(results: list[Result], *, cores: int, load: tuple[float, float, float], paced: float) -> None:
    table = Table(title="scheduler benchmark", title_justify="left")
    table.add_column("run", no_wrap=True)
    for column in ("pods", "bound", "not bound", "create/s", "pods/s", "p50 s", "p99 s", "max s"):
        table.add_column(column, justify="right")
    for result in results:
        latencies = result.latencies()
        table.add_row(
            result.run,
            str(result.pods),
            str(result.bound),
            str(len(result.created_at) - result.bound + result.create_failed),
            f"{result.create_rate():.0f}",
            f"{result.pods_per_second():.1f}",
            f"{percentile(latencies, 0.50):.2f}",
            f"{percentile(latencies, 0.99):.2f}",
            f"{latencies[-1] if latencies else float('nan'):.2f}",
        )
    out = Console(width=140)
    out.print(table)
    cpu = Table(
        title=f"CPU seconds during each burst ({cores} cores; load average before: {load[0]:.2f})",
        title_justify="left",
        caption="others: the whole machine less the four processes; "
        "busiest: other processes alive at both ends",
        caption_justify="left",
    )
    columns = ("wall s", "scheduler", "apiserver", "etcd", "client", "others", "busiest", "sched ms/pod")
    cpu.add_column("run", no_wrap=True)
    for column in (*columns, "api+etcd ms/pod"):
        cpu.add_column(column, justify="right")
    for result in results:
        used = result.cpu
        cpu.add_row(
            result.run,
            f"{used['wall']:.1f}",
            *(f"{used[name]:.1f}" for name in ("scheduler", "kube-apiserver", "etcd", "client", "other")),
            ", ".join(f"{comm} {seconds:.0f}" for comm, seconds in result.busiest_others),
            f"{1000 * used['scheduler'] / max(result.bound, 1):.1f}",
            f"{1000 * (used['kube-apiserver'] + used['etcd']) / max(result.bound, 1):.1f}",
        )
    out.print(cpu)
    for result in results:
        if result.run.split(" #")[0] != "gpufrac":
            continue
        rate, p99 = result.pods_per_second(), percentile(result.latencies(), 0.99)
        if paced:  # pods/s is the arrival rate: only the latency is measured
            verdict = "met" if p99 < TARGET_P99_SECONDS else "MISSED"
            out.print(
                f"{result.run} at {paced:g} pods/s arriving: p99 < {TARGET_P99_SECONDS:.0f} s {verdict} "
                f"(p99 {p99:.2f} s); pods/s is the arrival rate, not what the scheduler can do"
            )
            continue
        verdict = "met" if rate >= TARGET_PODS_PER_SECOND and p99 < TARGET_P99_SECONDS else "MISSED"
        targets = f">= {TARGET_PODS_PER_SECOND:.0f} pods/s, p99 < {TARGET_P99_SECONDS:.0f} s"
        out.print(f"{result.run} targets ({targets}): {verdict} ({rate:.1f} pods/s, p99 {p99:.2f} s)")


# A sampling profiler of CPU time, for the scheduler subprocess: SIGPROF every 2 ms of CPU the process uses,
# and the Python stack it interrupted. Unlike cProfile it costs about 1% and does not inflate code made of
# many small calls (the HTTP client is), so the shares it reports are those of an unprofiled run. SIGINT
# stops the scheduler and still writes the file.
SAMPLED = """
import collections, json, runpy, signal, sys, time
out, module = sys.argv.pop(1), sys.argv.pop(1)
stacks = collections.Counter()
def sample(signum, frame):
    stack = []
    while frame is not None:
        stack.append(frame.f_code.co_filename + ":" + frame.f_code.co_name)
        frame = frame.f_back
    stacks[tuple(stack)] += 1
signal.signal(signal.SIGPROF, sample)
signal.setitimer(signal.ITIMER_PROF, 0.002, 0.002)
try:
    runpy.run_module(module, run_name="__main__", alter_sys=True)
except (SystemExit, KeyboardInterrupt):
    pass
finally:
    signal.setitimer(signal.ITIMER_PROF, 0, 0)
    with open(out, "w") as file:
        stacks_ = [[list(k), v] for k, v in stacks.items()]
        json.dump({"cpu_seconds": time.process_time(), "stacks": stacks_}, file)
"""

# Where the innermost Python frame of a sample is: the first area whose pattern is in "file:function".
PROFILE_AREAS = (
    ("engine (gpufrac.placement, gpufrac.cluster)", ("gpufrac/placement/", "gpufrac/cluster/")),
    ("contract parsing and rendering", ("gpufrac/contract/",)),
    (
        "scheduler, objects, queue, reflector (gpufrac.scheduler, gpufrac.kubeapi)",
        ("gpufrac/scheduler/", "gpufrac/kubeapi/"),
    ),
    ("lightkube (request building, models, to_dict)", ("lightkube/",)),
    ("HTTP client (httpx2, httpcore2, h11)", ("httpx2/", "httpcore2/", "h11/")),
    ("anyio streams and TLS", ("anyio/", "ssl.py")),
    ("asyncio event loop and sockets", ("asyncio/", "selectors.py", "socket.py")),
    ("json, logging", ("json/", "logging/")),
    ("numpy", ("numpy/",)),
)
# Steps of the scheduler, counted when their frame is anywhere on the sampled stack. Patterns of one step
# must all be on the stack: ("scheduler/loop.py:_bind", "lightkube/") is lightkube's share of binding.
PROFILE_STEPS: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("decide: Scheduler._schedule", ("scheduler/loop.py:_schedule",), ()),
    ("  engine decide()", ("placement/engine.py:decide",), ()),
    ("  objects.pod_demand()", ("scheduler/objects.py:pod_demand",), ()),
    ("  Eligibility.rows_for()", ("scheduler/eligibility.py:rows_for",), ()),
    ("bind: Scheduler._bind", ("scheduler/loop.py:_bind",), ()),
    ("  objects.bind_plan()", ("scheduler/objects.py:bind_plan",), ()),
    ("  create the env ConfigMap", ("scheduler/binder.py:_ensure_configmap",), ()),
    ("  Binding", ("scheduler/binder.py:post_binding",), ()),
    ("  of which HTTP pool bookkeeping", ("scheduler/loop.py:_bind", "_assign_requests_to_connections"), ()),
    ("  of which HTTP client, TLS", ("scheduler/loop.py:_bind",), ("httpx2/", "httpcore2/", "anyio/")),
    ("events: reflect()", ("kubeapi/reflector.py:reflect",), ()),
    (
        "  watch decode (lightkube)",
        ("kubeapi/reflector.py:reflect", "core/generic_client.py:process_one_line"),
        (),
    ),
    ("  to_dict()", ("kubeapi/reflector.py:reflect", "dictmixin.py:to_dict"), ()),
    ("  on_pod_event()", ("scheduler/loop.py:on_pod_event",), ()),
    ("  on_node_event()", ("scheduler/loop.py:on_node_event",), ()),
    ("  HTTP client and TLS", ("kubeapi/reflector.py:reflect",), ("httpx2/", "httpcore2/", "anyio/")),
    ("failures: Scheduler._report_failure", ("scheduler/loop.py:_report_failure",), ()),
    ("logging", ("logging/__init__.py:",), ()),
)


def _on_stack(stack: list[str], pattern: str) -> bool:
    return any(pattern in frame for frame in stack)


def report_profile(name: str, path: Path) -> None:
    """Where the scheduler's CPU time went: by the area of the innermost frame, and by scheduler step."""
    if not path.is_file():
        console.print(f"{name}: no profile was written ({path})")
        return
    data = json.loads(path.read_text())
    samples: list[tuple[list[str], int]] = [(stack, count) for stack, count in data["stacks"]]
    total = sum(count for _, count in samples)
    if not total:
        return
    interval = data["cpu_seconds"] / total  # the kernel's timer ticks may be coarser than asked
    out = Console(width=140)
    areas: dict[str, int] = {}
    for stack, count in samples:
        leaf = stack[0] if stack else ""
        area = next((label for label, parts in PROFILE_AREAS if any(p in leaf for p in parts)), "other")
        areas[area] = areas.get(area, 0) + count
    title = f"{name}: scheduler CPU by innermost frame ({total} samples, {total * interval:.1f} s)"
    table = Table(title=title, title_justify="left")
    for column in ("area", "CPU s", "%"):
        table.add_column(column, justify="left" if column == "area" else "right")
    for area, count in sorted(areas.items(), key=lambda item: -item[1]):
        table.add_row(area, f"{count * interval:.1f}", f"{100 * count / total:.0f}")
    out.print(table)
    table = Table(
        title=f"{name}: scheduler CPU by step (a step includes what it calls)", title_justify="left"
    )
    for column in ("step", "CPU s", "%"):
        table.add_column(column, justify="left" if column == "step" else "right")
    for label, required, any_of in PROFILE_STEPS:
        count = sum(
            n
            for stack, n in samples
            if all(_on_stack(stack, p) for p in required)
            and (not any_of or any(_on_stack(stack, p) for p in any_of))
        )
        table.add_row(label, f"{count * interval:.1f}", f"{100 * count / total:.0f}")
    steps = [required for label, required, _ in PROFILE_STEPS if not label.startswith(" ")]
    rest = sum(n for stack, n in samples if not any(all(_on_stack(stack, p) for p in r) for r in steps))
    label = "none of these (event loop callbacks, socket I/O, start-up)"
    table.add_row(label, f"{rest * interval:.1f}", f"{100 * rest / total:.0f}")
    out.print(table)


# ---- main -------------------------------------------------------------------------------------------------


def make_runs(
    names: list[str], cluster: Cluster, profile: Path | None, *, round_: int, rounds: int
) -> list[Run]:
    bindir = subprocess.run(
        [str(SCRIPT), "bindir"], capture_output=True, text=True, check=True
    ).stdout.strip()
    runs = []
    for kind in names:
        name = f"{kind} #{round_}" if rounds > 1 else kind
        namespace = f"bench-{kind}-{round_}"
        if kind.startswith("gpufrac"):
            delivery = "annotations-only" if kind.endswith("annotations-only") else "configmap"
            samples = profile / f"{kind}-{round_}.json" if profile else None
            python = [sys.executable, "-c", SAMPLED, str(samples)] if samples else [sys.executable, "-m"]
            command = [
                *python,
                *("gpufrac.cli", "scheduler", "--kubeconfig", str(cluster.kubeconfig)),
                *("--metrics-port", "0", "--policy", "binpack", "--env-delivery", delivery),
            ]
            queued = kind == "gpufrac-queues"
            command += ["--queues"] if queued else []
            make = queued_pod if queued else gpufrac_pod
            runs.append(Run(name, namespace, "gpufrac", command, make, samples))
        else:
            command = [
                str(Path(bindir) / "kube-scheduler"),
                f"--kubeconfig={cluster.kubeconfig}",
                *("--leader-elect=false", "--port=0", "--secure-port=0"),
            ]
            if kind.endswith("qps1000"):
                command += ["--kube-api-qps=1000", "--kube-api-burst=1000"]
            runs.append(Run(name, namespace, "default-scheduler", command, whole_gpu_pod))
    return runs


async def benchmark(args: argparse.Namespace, rundir: Path) -> list[Result]:
    loaded = openb.load()
    nodes = list(loaded.nodes if args.nodes == "all" else loaded.nodes[: int(args.nodes)])
    pods = sample(loaded.pods, args.pods, args.seed)
    for i, pod in enumerate(pods):  # a pod the contract refuses would measure nothing
        contract.parse_pod(gpufrac_pod(f"p-{i:05d}", "check", pod))
    console.print(f"starting etcd and kube-apiserver in {rundir}")
    cluster = start_cluster(rundir)
    try:
        await create_nodes(cluster, nodes, concurrency=args.concurrency)
        if "gpufrac-queues" in args.runs:
            await create_queues(cluster, nodes)
        results = []
        runs = [
            run
            for round_ in range(1, args.repeat + 1)
            for run in make_runs(args.runs, cluster, args.profile, round_=round_, rounds=args.repeat)
        ]
        for run in runs:
            results.append(
                await run_one(
                    cluster, run, pods, concurrency=args.concurrency, rate=args.rate, stall=args.stall
                )
            )
        return results
    finally:
        stop_cluster(rundir)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pods", type=int, default=5000)
    parser.add_argument("--nodes", default="all", help="all, or how many of the openb nodes")
    parser.add_argument("--concurrency", type=int, default=64, help="creates in flight")
    parser.add_argument("--rate", type=float, default=0.0, help="pace creates at pods/s (default: a burst)")
    parser.add_argument("--seed", type=int, default=42, help="shuffle of the openb pod list")
    parser.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated, of: {', '.join(RUNS)}")
    parser.add_argument("--repeat", type=int, default=1, help="do the runs this many times, in turn")
    parser.add_argument("--stall", type=float, default=20.0, help="give up after this long without a bind")
    parser.add_argument("--profile", type=Path, help="sample gpufrac's CPU, write DIR/<run>.json")
    parser.add_argument("--keep", action="store_true", help="keep the run folder (logs, etcd data)")
    args = parser.parse_args()
    args.runs = [name.strip() for name in args.runs.split(",") if name.strip()]
    unknown = [name for name in args.runs if name not in RUNS]
    if unknown or args.pods < 1 or args.repeat < 1 or not (args.nodes == "all" or args.nodes.isdigit()):
        parser.error(
            f"unknown run {unknown[0]}" if unknown else "--pods, --repeat >= 1; --nodes all or a number"
        )
    if args.profile:
        args.profile = args.profile.resolve()
        args.profile.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    rundir = Path(tempfile.mkdtemp(prefix="gpufrac-bench-"))
    failed = True
    try:
        results = asyncio.run(benchmark(args, rundir))
        failed = False
    except BenchmarkError as error:
        print(f"benchmarks/scheduler.py: {error}", file=sys.stderr)
        sys.exit(1)
    finally:
        if failed or args.keep:
            print(f"logs: {rundir}", file=sys.stderr)
        else:
            shutil.rmtree(rundir, ignore_errors=True)
    print(
        f"{args.pods} openb pods (seed {args.seed}) on {args.nodes} openb nodes, "
        f"{args.concurrency} creates in flight"
        + (f", paced at {args.rate:g} pods/s" if args.rate > 0 else " (burst)")
    )
    report(results, cores=os.cpu_count() or 1, load=load, paced=args.rate)
    for result in results:
        if result.profile:
            report_profile(result.run, result.profile)


if __name__ == "__main__":
    main()
