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
from rich.markup import escape
from rich.table import Table

from gpufrac.cluster.state import MODE_OF_CODE, ClusterState
from gpufrac.kubeapi import client as kube_client
from gpufrac.scheduler.cache import SchedulerCache


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
        # Escaped: rich would read "[main]" as a style tag and drop it.
        pods = escape(", ".join(f"{share['pod']}[{share['container']}]" for share in row["pods"]))
        view.add_row(
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


async def collect(kubeconfig: Path | None) -> list[dict[str, Any]]:
    nodes, pods = await kube_client.list_nodes_and_pods(kubeconfig)
    cache = SchedulerCache()
    cache.sync_nodes(nodes)
    cache.sync_pods(pods)
    return gpu_rows(cache.snapshot(), names=cache.names)


def show(rows: list[dict[str, Any]], *, output_format: str) -> None:
    if output_format == "json":
        print(json.dumps(rows, indent=2))
    else:
        # Piped output is read whole (grep, a log): do not truncate it to 80 columns.
        Console(width=None if sys.stdout.isatty() else 240).print(table(rows))
