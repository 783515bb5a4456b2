"""10x scale (issue 15): decision latency per policy, the scheduler's memory, and a full relist.

The cluster is the openb GPU node list sampled with replacement (seeded) up to `--nodes` nodes, each row
weighted by the square of its GPU count: the list's own mix averages 5.1 GPUs a node, and no row has more
than 8, so 8 on average would leave only 8-GPU nodes; squared weights keep some of every kind and give
about 7.6 (about 76,000 GPUs on 10,000 nodes; the exact count is reported). Pods are drawn from the openb
default pod list with replacement (seeded), in arrival order. Both are built as the API returns them: Nodes
with the node agent's `gpufrac.io/gpus` annotation and Ready conditions, Pods as the webhook leaves them
(`gpu-fraction`, `nvidia.com/gpu`, the env ConfigMap's name), and the engine reads them through
`scheduler.objects`, as the scheduler does, so every figure is for the scheduler's own inputs.

(a) Decision latency. One fill with `binpack` (a cheap policy: the fill only sets the stage) decides every
arrival through `placement.engine.decide` on a `ClusterState` and applies what fits; its times are binpack's.
Filling the cluster once per policy would take hours on a shared 2-core machine, so at each fill level (every
quarter of the arrivals, and the end) every policy, built once for the whole fill as a scheduler builds it,
decides the next `--decisions` arrivals, applying each placement and releasing them all afterwards. Before
that it decides one pod of each shape among them, untimed and not applied: a running scheduler's per-shape
memos already hold every node but the few its last decisions changed, while the fill changed thousands since
the last probe. A policy's very first decision fills its memos for every node (fgd: the fragmentation of every
node) and is reported apart as `cold`; a scheduler pays it once per policy rebuild (fgd: every 10 minutes).
`--decisions 0` fills the cluster once per policy instead. Wall time and CPU time (`time.thread_time`) are
taken around each `decide`: on a machine shared with other work the wall time includes waiting for a core, the
CPU time does not.

(b) The scheduler's memory and a relist. The bound pods are binpack's placements, with the annotations
`objects.bind_plan` writes; arrivals that did not fit are listed pending (the openb pods ask 10.5 cores on
average, so 100,000 of them ask more CPU than 10,000 openb nodes have). A fresh process (the scheduler's
imports, nothing else) reads the lists from JSON and feeds a `SchedulerCache` through `sync_nodes` and
`sync_pods`, what a relist does; the time is wall and CPU, and memory is that process's resident set (from
/proc) at start, with the listed objects, and after the relist, with the objects alive, as they are in the
scheduler (the cache keeps each bound pod's object).

Targets: decision p99 < 5 ms for every policy (judged on CPU time, which other load does not inflate),
resident memory < 1 GiB, relist < 10 s.

Run: .venv/bin/python benchmarks/scale.py [--nodes 10000] [--pods 100000] [--seed 42] [--policies all]
     [--decisions 200] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from gpufrac import contract
from gpufrac.cluster.model import NodeSpec, Placement, PodDemand
from gpufrac.cluster.state import ClusterState
from gpufrac.contract import keys, node_inventory
from gpufrac.placement.cache import shape_key
from gpufrac.placement.engine import decide
from gpufrac.placement.framework import POLICIES, PolicyContext
from gpufrac.placement.workload import Workload
from gpufrac.scheduler import objects
from gpufrac.scheduler.cache import SchedulerCache
from gpufrac.sim import trace as openb
from gpufrac.sim.trace import TracePod
from scheduler import gpufrac_pod  # benchmarks/scheduler.py, on the path as this script's folder

TARGET_P99_MS = 5.0
TARGET_RSS_MIB = 1024.0
TARGET_RELIST_S = 10.0
FILL_POLICY = "binpack"
NAMESPACE = "bench"
CREATED = "2024-05-01T12:00:00Z"
console = Console(stderr=True)


# ---- the synthetic cluster --------------------------------------------------------------------------------


def sample_nodes(nodes: Sequence[NodeSpec], count: int, rng: np.random.Generator) -> list[NodeSpec]:
    """`count` rows of the node list, with replacement, weighted by GPU count squared (see the module)."""
    weights = np.array([len(node.gpus) ** 2 for node in nodes], float)
    rows = rng.choice(len(nodes), size=count, p=weights / weights.sum())
    return [nodes[row] for row in rows]


def node_object(name: str, row: NodeSpec) -> dict[str, Any]:
    """A Node as a cluster with the node agent returns it: GFD labels, the agent's GPU list (UUIDs, health)
    and both Ready conditions, allocatable CPU and memory of the openb row."""
    gpus = tuple(
        node_inventory.GpuInfo(gpu.index, f"GPU-{name}-{gpu.index}", gpu.model, gpu.memory_mib, healthy=True)
        for gpu in row.gpus
    )
    model = row.gpus[0].model if row.gpus else ""
    memory = row.gpus[0].memory_mib if row.gpus else 0
    resources = {
        "cpu": f"{row.cpu_milli}m",
        "memory": f"{row.memory_mib}Mi",
        "pods": "110",
        keys.GPU_RESOURCE: str(len(gpus)),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "resourceVersion": "1",
            "creationTimestamp": CREATED,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "gpufrac.io/enabled": "true",
                node_inventory.GPU_COUNT_LABEL: str(len(gpus)),
                node_inventory.GPU_MEMORY_LABEL: str(memory),
                node_inventory.GPU_PRODUCT_LABEL: model,
            },
            "annotations": {node_inventory.GPUS_ANNOTATION: node_inventory.dump_gpus(gpus)},
        },
        "spec": {"podCIDR": "10.244.0.0/24"},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory"},
                {"type": "Ready", "status": "True", "reason": "KubeletReady"},
                {"type": node_inventory.READY_CONDITION, "status": "True", "reason": "AgentReady"},
            ],
            "addresses": [{"type": "Hostname", "address": name}],
        },
    }


def pod_object(name: str, pod: TracePod) -> dict[str, Any]:
    """A pending Pod as the scheduler benchmark creates it (what the webhook leaves: `gpu-fraction` or
    `nvidia.com/gpu`, the env ConfigMap's name), with what the API server adds."""
    body = gpufrac_pod(name, NAMESPACE, pod)
    body["metadata"] |= {"uid": f"uid-{name}", "resourceVersion": "1", "creationTimestamp": CREATED}
    body["status"] = {"phase": "Pending", "qosClass": "Burstable"}
    return body


def bound_object(pending: dict[str, Any], node: str, annotations: dict[str, str]) -> dict[str, Any]:
    """`pending` after its Binding: the contract annotations, the node, and a running pod's status."""
    metadata = {**pending["metadata"], "annotations": {**pending["metadata"]["annotations"], **annotations}}
    status = {
        "phase": "Running",
        "qosClass": "Burstable",
        "hostIP": "10.0.0.1",
        "podIP": "10.244.0.2",
        "startTime": CREATED,
        "conditions": [
            {"type": kind, "status": "True", "lastTransitionTime": CREATED}
            for kind in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
        ],
    }
    return {**pending, "metadata": metadata, "spec": {**pending["spec"], "nodeName": node}, "status": status}


@dataclass
class Cluster:
    nodes: list[dict[str, Any]]  # Node objects
    specs: list[NodeSpec]  # as the scheduler reads them
    gpus: int
    pods: list[dict[str, Any]]  # pending Pod objects, in arrival order
    demands: list[PodDemand]  # as the scheduler reads them


def build_cluster(node_count: int, pod_count: int, seed: int) -> Cluster:
    trace = openb.load()
    rng = np.random.default_rng(seed)
    rows = sample_nodes(trace.nodes, node_count, rng)
    nodes = [node_object(f"node-{i:05d}", row) for i, row in enumerate(rows)]
    specs = [objects.node_spec(node) for node in nodes]
    drawn = rng.integers(len(trace.pods), size=pod_count)
    pods = [pod_object(f"pod-{i:06d}", trace.pods[row]) for i, row in enumerate(drawn)]
    demands = [objects.pod_demand(pod) for pod in pods]
    return Cluster(nodes, specs, sum(len(spec.gpus) for spec in specs), pods, demands)


def fresh_state(cluster: Cluster, seed: int) -> ClusterState:
    """Ties go to the first node of a seeded order, as in the simulator."""
    state = ClusterState(cluster.specs)
    state.tie_rank[: len(cluster.specs)] = np.random.default_rng(seed).permutation(len(cluster.specs))
    return state


def workload_of(cluster: Cluster, state: ClusterState) -> Workload:
    """The target workload the scheduler gathers for fgd: the shapes of the pods it knows."""
    memory = state.gpu_mem[state.gpu_mem > 0]
    return Workload.from_pods(cluster.demands, reference_gpu_mib=int(np.median(memory)))


# ---- (a) decision latency ---------------------------------------------------------------------------------


@dataclass
class Timings:
    wall: list[float] = field(default_factory=list)  # seconds per decision
    cpu: list[float] = field(default_factory=list)
    cold_wall: list[float] = field(default_factory=list)  # first decision of each fresh policy
    placed: int = 0
    failed: int = 0

    def decide(self, state: ClusterState, demand: PodDemand, policy: Any, *, cold: bool = False) -> Any:
        wall, cpu = time.perf_counter(), time.thread_time()
        outcome = decide(state, demand, policy)
        cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
        if cold:
            self.cold_wall.append(wall)
        else:
            self.wall.append(wall)
            self.cpu.append(cpu)
        if isinstance(outcome, Placement):
            state.apply(outcome)
            self.placed += 1
        else:
            self.failed += 1
        return outcome

    def summary(self) -> dict[str, Any]:
        def ms(values: list[float], q: float) -> float:
            return round(1000 * float(np.percentile(values, q)), 3) if values else float("nan")

        return {
            "decisions": len(self.wall),
            "placed": self.placed,
            "failed": self.failed,
            "wall_ms": {"p50": ms(self.wall, 50), "p99": ms(self.wall, 99), "max": ms(self.wall, 100)},
            "cpu_ms": {"p50": ms(self.cpu, 50), "p99": ms(self.cpu, 99), "max": ms(self.cpu, 100)},
            "cold_decisions": len(self.cold_wall),
            "cold_wall_ms_max": ms(self.cold_wall, 100),
        }


def build_policy(name: str, workload: Workload, seed: int) -> Any:
    return POLICIES[name](PolicyContext(rng=np.random.default_rng(seed), workload=workload))


def probe(
    state: ClusterState,
    demands: Sequence[PodDemand],
    policies: dict[str, Any],
    timings: dict[str, Timings],
) -> None:
    """Each policy decides `demands` on `state`, its placements released afterwards, so every policy starts
    from the same fill. A running scheduler's policy has decided pods of these shapes recently, so its
    per-shape memos hold every node but the few the last decisions changed; here the fill changed thousands
    of nodes since the last probe, so each policy first decides one pod of every shape untimed (nothing
    applied), which brings its memos to where a running scheduler's are."""
    shapes = {shape_key(demand): demand for demand in demands}
    for name, policy in policies.items():
        for demand in shapes.values():
            decide(state, demand, policy)
        placed_before = set(state.placements)
        for demand in demands:
            timings[name].decide(state, demand, policy)
        for pod in [pod for pod in state.placements if pod not in placed_before]:
            state.release(pod)


def fill_levels(pods: int, decisions: int) -> list[int]:
    """Arrival counts at which the policies are probed: every quarter, and the end less one probe."""
    return sorted({max(0, min(pods - decisions, pods * quarter // 4)) for quarter in range(5)})


def sampled_latency(
    cluster: Cluster,
    policies: Sequence[str],
    *,
    decisions: int,
    seed: int,
    on_fill: Callable[[int], None],
) -> tuple[dict[str, Timings], ClusterState, dict[int, float]]:
    """The binpack fill, probing every policy at each fill level; also the filled state, and the share of
    GPU memory allocated at each level."""
    state = fresh_state(cluster, seed)
    workload = workload_of(cluster, state)
    timings = {name: Timings() for name in policies}
    fill = Timings()
    fill_policy = build_policy(FILL_POLICY, workload, seed)
    levels = fill_levels(len(cluster.demands), decisions)
    allocated: dict[int, float] = {}
    # One policy each for the whole fill, as in a scheduler; the first decision of each is timed apart.
    probing = {name: build_policy(name, workload, seed) for name in policies}
    first = cluster.demands[0]
    for name, policy in probing.items():
        if isinstance(timings[name].decide(state, first, policy, cold=True), Placement):
            state.release(first.name)
    for i, demand in enumerate(cluster.demands):
        if i in levels:
            allocated[i] = allocation(state)
            probe(state, cluster.demands[i : i + decisions], probing, timings)
        fill.decide(state, demand, fill_policy, cold=i == 0)
        on_fill(i + 1)
    timings[f"{FILL_POLICY} (full fill)"] = fill
    return timings, state, allocated


def full_latency(
    cluster: Cluster, policies: Sequence[str], *, seed: int, on_fill: Callable[[int], None]
) -> tuple[dict[str, Timings], ClusterState]:
    """Every policy fills the cluster with every arrival; the binpack fill's state is returned."""
    timings = {}
    filled = None
    for name in dict.fromkeys([FILL_POLICY, *policies]):
        state = fresh_state(cluster, seed)
        policy = build_policy(name, workload_of(cluster, state), seed)
        timings[name] = Timings()
        for i, demand in enumerate(cluster.demands):
            timings[name].decide(state, demand, policy, cold=i == 0)
            on_fill(i + 1)
        if name == FILL_POLICY:
            filled = state
    assert filled is not None
    return timings, filled


def allocation(state: ClusterState) -> float:
    """Percent of the cluster's GPU memory requested."""
    total = int(state.gpu_mem.sum())
    return round(100 * (total - int(state.gpu_free.sum())) / total, 1) if total else 0.0


# ---- (b) the scheduler's memory and a relist --------------------------------------------------------------


def resident_mib() -> float:
    """This process's resident set now (not its peak), from /proc."""
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * resource.getpagesize() / 2**20


def listed_pods(cluster: Cluster, state: ClusterState) -> list[dict[str, Any]]:
    """Every arrival as a relist returns it: bound where the fill placed it, with what bind wrote."""
    specs = {spec.name: spec for spec in cluster.specs}
    listed = []
    for pod in cluster.pods:
        placement = state.placements.get(objects.pod_uid(pod))
        if placement is None:
            listed.append(pod)
            continue
        plan = objects.bind_plan(
            pod,
            placement,
            specs[placement.node],
            mps_pipe_directory=contract.DEFAULT_MPS_PIPE_DIRECTORY,
            env_delivery=contract.EnvDelivery.CONFIGMAP,
        )
        listed.append(bound_object(pod, placement.node, plan.annotations))
    return listed


def relist(nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> dict[str, Any]:
    """The relist in a fresh process, as the scheduler would hold it: its imports, the listed objects read
    from JSON (fresh dicts, as the reflector's are) and the cache. This process holds the fill and every
    pod twice over, which would count against the scheduler."""
    with tempfile.TemporaryDirectory(prefix="gpufrac-scale-") as folder:
        lists = Path(folder) / "lists.jsonl"
        with lists.open("w") as file:
            file.write(f"{len(nodes)}\n")
            for obj in (*nodes, *pods):
                file.write(json.dumps(obj, separators=(",", ":")) + "\n")
        done = subprocess.run(
            [sys.executable, __file__, "--relist-from", str(lists)],
            capture_output=True,
            text=True,
            check=False,
        )
    if done.returncode != 0:
        raise SystemExit(f"benchmarks/scale.py: the relist failed: {done.stderr.strip()[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def relist_child(lists: Path) -> dict[str, Any]:
    """`relist`'s side in the fresh process: read the lists, then time `sync_nodes` + `sync_pods`."""
    import gpufrac.scheduler.loop  # noqa: F401  (what the scheduler process has loaded besides the cache)

    start = resident_mib()
    with lists.open() as file:
        count = int(file.readline())
        listed = [json.loads(line) for line in file]
    nodes, pods = listed[:count], listed[count:]
    with_lists = resident_mib()
    problems: list[Any] = []
    cache = SchedulerCache(report=problems.append)
    wall, cpu = time.perf_counter(), time.process_time()
    cache.sync_nodes(nodes)
    nodes_wall = time.perf_counter() - wall
    cache.sync_pods(pods)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return {
        "nodes": len(cache.nodes),
        "pods_listed": len(pods),
        "pods_bound": len(cache.state.placements),
        "problems": len(problems),
        "wall_s": round(wall, 2),
        "nodes_wall_s": round(nodes_wall, 2),
        "cpu_s": round(cpu, 2),
        "rss_mib": round(resident_mib(), 1),
        "start_rss_mib": round(start, 1),
        "lists_rss_mib": round(with_lists - start, 1),
        "cache_rss_mib": round(resident_mib() - with_lists, 1),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


# ---- report -----------------------------------------------------------------------------------------------


def benchmark(args: argparse.Namespace) -> dict[str, Any]:
    policies = list(POLICIES) if args.policies == "all" else args.policies.split(",")
    started = time.perf_counter()
    cluster = build_cluster(args.nodes, args.pods, args.seed)
    console.print(
        f"{len(cluster.nodes)} nodes, {cluster.gpus} GPUs, {len(cluster.pods)} pods "
        f"({time.perf_counter() - started:.1f} s to build)"
    )
    step = max(1, len(cluster.pods) // 10)

    def on_fill(done: int) -> None:
        if done % step == 0:
            console.print(f"  {done} arrivals decided ({time.perf_counter() - started:.0f} s)")

    allocated: dict[int, float] = {}
    if args.decisions:
        timings, state, allocated = sampled_latency(
            cluster, policies, decisions=args.decisions, seed=args.seed, on_fill=on_fill
        )
    else:
        timings, state = full_latency(cluster, policies, seed=args.seed, on_fill=on_fill)
    allocated[len(cluster.pods)] = allocation(state)
    relisted = relist(cluster.nodes, listed_pods(cluster, state))
    return {
        "nodes": len(cluster.nodes),
        "gpus": cluster.gpus,
        "pods": len(cluster.pods),
        "seed": args.seed,
        "mode": f"{args.decisions} decisions per policy at each fill level" if args.decisions else "full",
        "fill_levels": {str(k): v for k, v in allocated.items()},
        "policies": {name: timing.summary() for name, timing in timings.items()},
        "relist": relisted,
        "targets": {"p99_ms": TARGET_P99_MS, "rss_mib": TARGET_RSS_MIB, "relist_s": TARGET_RELIST_S},
        "seconds": round(time.perf_counter() - started, 1),
    }


def verdict(met: bool) -> str:
    return "[green]met[/]" if met else "[red]MISSED[/]"


def print_report(report: dict[str, Any]) -> None:
    out = Console(width=140)
    out.print(
        f"{report['nodes']} nodes, {report['gpus']} GPUs, {report['pods']} openb pods "
        f"(seed {report['seed']}); "
        f"latency: {report['mode']}; GPU memory allocated at those arrivals: "
        + ", ".join(f"{k}: {v}%" for k, v in report["fill_levels"].items())
    )
    table = Table(title=f"decision time per policy (target p99 < {TARGET_P99_MS:g} ms)", title_justify="left")
    columns = ("policy", "decisions", "p50 ms", "p99 ms", "max ms", "CPU p50", "CPU p99", "cold ms", "")
    for column in columns:
        table.add_column(column, justify="left" if column == "policy" else "right")
    for name, row in report["policies"].items():
        wall, cpu = row["wall_ms"], row["cpu_ms"]
        table.add_row(
            name,
            str(row["decisions"]),
            f"{wall['p50']:.2f}",
            f"{wall['p99']:.2f}",
            f"{wall['max']:.1f}",
            f"{cpu['p50']:.2f}",
            f"{cpu['p99']:.2f}",
            f"{row['cold_wall_ms_max']:.1f}",
            verdict(cpu["p99"] < TARGET_P99_MS),
        )
    out.print(table)
    relisted = report["relist"]
    table = Table(title="scheduler cache: a full relist", title_justify="left")
    for column in ("figure", "value", "target", ""):
        table.add_column(column, justify="left" if column == "figure" else "right")
    relist_s, rss = relisted["wall_s"], relisted["rss_mib"]
    target = f"< {TARGET_RELIST_S:g} s"
    table.add_row(
        "relist (sync_nodes + sync_pods), wall",
        f"{relist_s:.2f} s",
        target,
        verdict(relist_s < TARGET_RELIST_S),
    )
    table.add_row("  of which nodes", f"{relisted['nodes_wall_s']:.2f} s", "", "")
    table.add_row("  CPU", f"{relisted['cpu_s']:.2f} s", "", "")
    target = f"< {TARGET_RSS_MIB:g} MiB"
    table.add_row("resident memory after it", f"{rss:.0f} MiB", target, verdict(rss < TARGET_RSS_MIB))
    table.add_row("  interpreter and imports", f"{relisted['start_rss_mib']:.0f} MiB", "", "")
    table.add_row("  the listed objects", f"{relisted['lists_rss_mib']:.0f} MiB", "", "")
    table.add_row("  the cache", f"{relisted['cache_rss_mib']:.0f} MiB", "", "")
    table.add_row("peak resident memory", f"{relisted['peak_rss_mib']:.0f} MiB", "", "")
    table.add_row("pods bound / listed", f"{relisted['pods_bound']} / {relisted['pods_listed']}", "", "")
    table.add_row("objects reported (skipped)", str(relisted["problems"]), "0", "")
    out.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--pods", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument(
        "--policies", default="all", help=f"all, or comma-separated of: {', '.join(POLICIES)}"
    )
    parser.add_argument(
        "--decisions", type=int, default=200, help="per policy at each fill level; 0: a full fill per policy"
    )
    parser.add_argument("--out", type=Path, help="write the report as JSON here")
    parser.add_argument("--relist-from", type=Path, help=argparse.SUPPRESS)  # `relist`'s fresh process
    args = parser.parse_args()
    if args.relist_from:
        print(json.dumps(relist_child(args.relist_from)))
        return
    unknown = [] if args.policies == "all" else [p for p in args.policies.split(",") if p not in POLICIES]
    if unknown or args.nodes < 1 or args.pods < 1 or args.decisions < 0:
        parser.error(f"unknown policy {unknown[0]}" if unknown else "--nodes, --pods >= 1; --decisions >= 0")
    report = benchmark(args)
    print_report(report)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
