"""What judging the pods already placed costs a decision: inter-pod anti-affinity and topology spread at
scale (`scheduler/neighbours.py`, `scheduler/pod_index.py`).

The cluster is `--nodes` nodes of the openb list (sampled as `benchmarks/scale.py` samples them), labelled
with their hostname and one of three zones, and `--pods` pods bound round-robin over them in one namespace,
labelled `app=a<i mod --apps>`; with `--anti-affine`, each also keeps away from its own app's pods by
hostname, the way replicas do. Then `SchedulerCache.eligible_rows` (the nodes a pod may use, before the
engine's decision) is timed in CPU time for a pending pod of one app: with no terms, with a hostname
anti-affinity to its app, with a zone spread and with a hostname spread (`maxSkew: 1`).

Run: .venv/bin/python benchmarks/neighbours.py [--nodes 10000] [--pods 20000] [--apps 50] [--anti-affine]
     [--repeat 5] [--out FILE]
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from gpufrac.scheduler.cache import SchedulerCache
from gpufrac.sim import trace as openb
from scale import node_object, sample_nodes  # benchmarks/scale.py, on the path as this script's folder

HOST, ZONE = "kubernetes.io/hostname", "topology.kubernetes.io/zone"


def anti_affinity(app: str) -> dict[str, Any]:
    term = {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": HOST}
    return {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}


def spread(app: str, key: str) -> list[dict[str, Any]]:
    return [{"maxSkew": 1, "topologyKey": key, "labelSelector": {"matchLabels": {"app": app}}}]


def cluster(nodes: int, pods: int, apps: int, anti_affine: bool, seed: int) -> SchedulerCache:
    rows = sample_nodes(openb.load().nodes, nodes, np.random.default_rng(seed))
    objects = [node_object(f"node-{i:05d}", row) for i, row in enumerate(rows)]
    for i, node in enumerate(objects):
        node["metadata"]["labels"][ZONE] = f"zone-{i % 3}"
    cache = SchedulerCache(require_ready=False)
    cache.sync_nodes(objects)
    placed = []
    for i in range(pods):
        app = f"a{i % apps}"
        spec: dict[str, Any] = {
            "nodeName": objects[i % nodes]["metadata"]["name"],
            "containers": [{"name": "main", "resources": {"requests": {"cpu": "10m"}}}],
        }
        if anti_affine:
            spec["affinity"] = anti_affinity(app)
        meta = {"name": f"p{i}", "namespace": "team", "uid": f"uid-p{i}", "labels": {"app": app}}
        placed.append({"metadata": meta, "spec": spec, "status": {"phase": "Running"}})
    cache.sync_pods(placed)
    return cache


def timed(cache: SchedulerCache, pod: dict[str, Any], repeat: int) -> tuple[float, int]:
    """CPU milliseconds a call of `eligible_rows` takes, and the nodes it leaves."""
    started = time.process_time()
    for _ in range(repeat):
        rows, _ = cache.eligible_rows(pod, gpus=False)
    return 1000 * (time.process_time() - started) / repeat, len(rows)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--pods", type=int, default=20_000)
    parser.add_argument("--apps", type=int, default=50)
    parser.add_argument("--anti-affine", action="store_true")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    cache = cluster(args.nodes, args.pods, args.apps, args.anti_affine, args.seed)
    pending = {
        "metadata": {"name": "new", "namespace": "team", "uid": "uid-new", "labels": {"app": "a1"}},
        "spec": {"containers": [{"name": "main", "resources": {"requests": {"cpu": "10m"}}}]},
    }
    cases = {
        "no terms": {},
        "hostname anti-affinity": {"affinity": anti_affinity("a1")},
        "zone spread": {"topologySpreadConstraints": spread("a1", ZONE)},
        "hostname spread": {"topologySpreadConstraints": spread("a1", HOST)},
    }
    report: dict[str, Any] = {"nodes": args.nodes, "pods": args.pods, "apps": args.apps}
    table = Table(title=f"{args.nodes} nodes, {args.pods} pods placed (anti-affine: {args.anti_affine})")
    for column in ("pending pod", "CPU ms a decision", "nodes left"):
        table.add_column(column, justify="left" if column == "pending pod" else "right")
    for name, extra in cases.items():
        pod = copy.deepcopy(pending)
        pod["spec"].update(extra)
        milliseconds, left = timed(cache, pod, args.repeat)
        report[name] = {"cpu_ms": round(milliseconds, 2), "nodes_left": left}
        table.add_row(name, f"{milliseconds:.1f}", str(left))
    Console().print(table)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
