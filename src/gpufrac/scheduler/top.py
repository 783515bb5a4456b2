"""`gpufrac top`: what every GPU holds, read from the API the way the scheduler reads it.

It feeds the listed nodes and pods into the scheduler's own cache, so what it shows is exactly the state a
scheduler starting now would rebuild.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpufrac.cluster.state import MODE_OF_CODE, ClusterState
from gpufrac.contract.queues import Resource
from gpufrac.kubeapi import client as kube_client
from gpufrac.kubeapi.custom import QUEUE_RESOURCE
from gpufrac.scheduler import objects
from gpufrac.scheduler.cache import SchedulerCache
from gpufrac.scheduler.problems import log_problem
from gpufrac.scheduler.tenants import Tenants


def gpu_rows(state: ClusterState, *, names: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """One entry per GPU: memory requested, limits, free, mode, and the shares on it.

    The state keys pods by UID; `names` gives people's names for them (namespace/name).
    """
    names = names or {}
    on_gpu: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for placement in state.placements.values():
        for assignment in placement.assignments:
            for gpu in assignment.gpus:
                on_gpu.setdefault((placement.node, gpu), []).append(
                    {
                        "pod": names.get(placement.pod, placement.pod),
                        "container": assignment.container,
                        "request_mib": assignment.request_mib,
                        "limit_mib": assignment.limit_mib,
                        "whole": assignment.mode is None,
                    }
                )
    rows = []
    for row, name in enumerate(state.names):
        if not state.active[row]:
            continue
        for gpu in range(int(state.gpu_count[row])):
            shares = sorted(on_gpu.get((name, gpu), []), key=lambda share: share["pod"])
            mode = MODE_OF_CODE.get(int(state.gpu_mode[row, gpu]))
            rows.append(
                {
                    "node": name,
                    "gpu": gpu,
                    "uuid": state.uuids[row][gpu],
                    "model": state.models[state.model_id[row]],
                    "healthy": bool(state.gpu_healthy[row, gpu]),
                    "memory_mib": int(state.gpu_mem[row, gpu]),
                    "mode": "whole" if state.gpu_whole[row, gpu] else (mode.value if mode else ""),
                    "requested_mib": int(state.gpu_mem[row, gpu] - state.gpu_free[row, gpu]),
                    "limits_mib": sum(share["limit_mib"] for share in shares),
                    "free_mib": int(state.gpu_free[row, gpu]),
                    "pods": shares,
                }
            )
    return rows


def table(rows: list[dict[str, Any]]) -> Table:
    view = Table(title="gpufrac: GPU memory by node and GPU (MiB)")
    for column in ("node", "gpu", "model", "mode", "requested", "limits", "free", "pods"):
        view.add_column(
            column, justify="right" if column in ("gpu", "requested", "limits", "free") else "left"
        )
    for row in rows:
        pods = ", ".join(f"{share['pod']}[{share['container']}]" for share in row["pods"])
        _add_row(
            view,
            row["node"],
            str(row["gpu"]) + ("" if row["healthy"] else " (unhealthy)"),
            row["model"],
            row["mode"] or "-",
            f"{row['requested_mib']}/{row['memory_mib']}",
            str(row["limits_mib"]),
            str(row["free_mib"]),
            pods or "-",
        )
    return view


def queue_rows(tenants: Tenants) -> list[dict[str, Any]]:
    """One entry per tenant queue: its parent, and per resource its quota, fair share and use."""
    return [
        {
            "queue": name,
            "parent": spec.parent or "",
            "resources": {
                resource.value: {
                    "quota": spec.entitlement(resource).quota,
                    "fair_share": round(tenants.shares.get(name, {}).get(resource, 0.0), 1),
                    "used": round(tenants.usage.get(name, {}).get(resource, 0.0), 1),
                }
                for resource in Resource
            },
        }
        for name, spec in sorted(tenants.specs.items())
    ]


def queue_table(rows: list[dict[str, Any]]) -> Table:
    view = Table(title="gpufrac: queues, used / fair share (GPU memory and memory in MiB, CPU in millicores)")
    view.add_column("queue")
    view.add_column("parent")
    for resource in Resource:
        view.add_column(resource.value, justify="right")
    for row in rows:
        cells = [
            f"{row['resources'][r.value]['used']:g} / {row['resources'][r.value]['fair_share']:g}"
            for r in Resource
        ]
        _add_row(view, row["queue"], row["parent"] or "-", *cells)
    return view


def _add_row(view: Table, *cells: str) -> None:
    """Every cell plain text, never markup: rich reads "[main]" as a style tag and drops it, and a "[/]" in a
    GPU model from a node's annotation or in a Queue's parentQueue would stop the whole table with a
    MarkupError."""
    view.add_row(*(Text(cell) for cell in cells))


async def collect(kubeconfig: Path | None, *, queues: bool = False) -> list[dict[str, Any]]:
    """Every GPU's rows, or with `queues` every queue's."""
    nodes, pods = await kube_client.list_nodes_and_pods(kubeconfig)
    cache = SchedulerCache()
    cache.sync_nodes(nodes)
    cache.sync_pods(pods)
    if not queues:
        return gpu_rows(cache.snapshot(), names=cache.names)
    tenants = Tenants(report=log_problem, refresh=0.0)
    tenants.on_listed(await kube_client.list_objects(kubeconfig, QUEUE_RESOURCE))
    pending = {
        objects.pod_uid(pod): pod
        for pod in pods
        if not (objects.node_name(pod) or objects.is_done(pod) or objects.terminating(pod))
    }
    tenants.rank(cache, pending)
    return queue_rows(tenants)


def show(rows: list[dict[str, Any]], *, output_format: str, queues: bool = False) -> None:
    if output_format == "json":
        print(json.dumps(rows, indent=2))
    else:
        # Piped output is read whole (grep, a log): do not truncate it to 80 columns.
        Console(width=None if sys.stdout.isatty() else 240).print(
            queue_table(rows) if queues else table(rows)
        )
