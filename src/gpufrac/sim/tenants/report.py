"""What a tenant replay leaves behind: a terminal table of the fairness figures, and with `--out` the JSON
document, four plots and an HTML page that carries them."""

from __future__ import annotations

import html
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from rich.table import Table

from gpufrac.sim import output
from gpufrac.sim.tenants.figures import GPU_RESOURCES
from gpufrac.sim.tenants.replay import RESOURCES, TenantRun

DAY = 86400.0
# Shares' GPU memory is plotted in thousands of MiB: a nominal GB of the trace's GPUs (`sim/trace.py`).
_SCALE = {"gpus": (1.0, "whole GPUs"), "gpuMemory": (1000.0, "shares' GPU memory (1000 MiB)")}
COLUMNS = (
    "queue",
    "pods",
    "GPUs held/fair",
    "GPU quota met",
    "memory held/fair",
    "memory quota met",
    "wait p50/p95",
    "reclaims",
    "reclaim p50/p95",
    "evicted",
    "wasted GPU-h",
    "gang wait p50/p95",
    "never ran",
)


CAPTION = (
    "held/fair: what the queue held over its fair share, both integrated over time (memory: shares' GPU "
    "memory); quota met: of the time its demand reached its quota, the part it held it; reclaim: from "
    "entitled to running on reclaimed room; wasted: GPU-hours evicted pods had run"
)


def table(document: dict[str, Any]) -> Table:
    result = Table(
        title=f"{document['trace']}: {len(document['queues'])} queues on {_cluster(document)}, seed "
        f"{document['seed']}, {document['policy']}",
        caption=CAPTION,
    )
    for column in COLUMNS:
        result.add_column(column, justify="left" if column == "queue" else "right")
    for name, row in document["queues"].items():
        result.add_row(*_cells(name, row))
    return result


def _cluster(document: dict[str, Any]) -> str:
    nodes = document["nodes"]
    return f"{document['gpus']} GPUs ({nodes} node{'' if nodes == 1 else 's'})"


def _cells(name: str, row: dict[str, Any]) -> list[str]:
    gpus, memory = (row["resources"][resource.value] for resource in GPU_RESOURCES)
    return [
        name,
        f"{row['pods']:,}",
        _ratio(gpus["allocation_over_fair_share"]),
        _ratio(gpus["quota_met"]),
        _ratio(memory["allocation_over_fair_share"]),
        _ratio(memory["quota_met"]),
        _spread(row["wait_seconds"]),
        f"{row['reclaim_seconds']['count']:,}",
        _spread(row["reclaim_seconds"]),
        f"{row['evicted']:,}",
        f"{row['wasted_gpu_hours']:,.1f}",
        _spread(row["gang_wait_seconds"]),
        f"{row['never_ran']:,}",
    ]


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _spread(figures: dict[str, Any]) -> str:
    if not figures["count"]:
        return "-"
    return f"{duration(figures['p50'])}/{duration(figures['p95'])}"


def duration(seconds: float) -> str:
    """Seconds as a person reads them: 30 s, 12 min, 5.2 h, 3.1 d."""
    for unit, size in (("d", DAY), ("h", 3600.0), ("min", 60.0)):
        if seconds >= 2 * size:
            return f"{seconds / size:.1f} {unit}" if unit != "min" else f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"


def write(out: Path, document: dict[str, Any], run: TenantRun) -> list[Path]:
    """results.json, allocation.png, reclaim.png, evictions.png, gangs.png and report.html in `out`."""
    plots = {
        "allocation.png": (_allocation(run, document), "Allocation against fair share, per queue"),
        "reclaim.png": (
            _cdf(run, lambda tally: tally.reclaims, "seconds from entitled to running on reclaimed room"),
            "How long a reclaim takes",
        ),
        "evictions.png": (_evictions(document), "Evictions and the GPU-hours they wasted"),
        "gangs.png": (
            _cdf(
                run,
                lambda tally: tally.gang_waits,
                "seconds from a gang's arrival (or return after an eviction) to all members running",
            ),
            "Gang waits",
        ),
    }
    rows = "".join(
        "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in _cells(name, row)) + "</tr>"
        for name, row in document["queues"].items()
    )
    body = (
        f"<p>{_intro(document)}</p><table><tr>"
        + "".join(f"<th>{html.escape(column)}</th>" for column in COLUMNS)
        + f"</tr>{rows}</table><p>{html.escape(CAPTION)}. The allocation plot shows the span in which pods "
        "waited.</p>"
        + "".join(f"<h2>{title}</h2>{output.img(data, title)}" for data, title in plots.values())
    )
    files = {
        "results.json": json.dumps(document, indent=2).encode(),
        **{name: data for name, (data, _) in plots.items()},
        "report.html": output.page(f"gpufrac tenant replay: {document['trace']}", body).encode(),
    }
    return output.write_files(out, files)


def _intro(document: dict[str, Any]) -> str:
    rules = document["rules"]
    gangs = rules["gangs"]
    return html.escape(
        f"Trace {document['trace']}, {document['pods']:,} pods dealt to {len(document['queues'])} queues by "
        f"the rules of {document['config']} (seed {document['seed']}), replayed on {_cluster(document)} "
        f"with {document['policy']}, over {document['days']:.1f} days. Pods wait "
        "until they fit, taken from the queue furthest below its fair share; a queue below its quota "
        "reclaims from queues over their fair share, sparing pods younger than "
        f"{duration(rules['min_runtime_seconds'])}; evicted pods terminate for "
        f"{duration(rules['grace_seconds'])} and run again from the start. "
        f"{gangs['fraction']:.0%} of GPU pods are gangs of {gangs['size']}, holding room at most "
        f"{duration(gangs['timeout_seconds'])} for their other members."
    )


def _allocation(run: TenantRun, document: dict[str, Any]) -> bytes:
    """One row per queue, one column per GPU resource: held, fair share and demand over time, the quota."""
    figure, grid = plt.subplots(
        len(run.queues), 2, figsize=(11, 2.4 * len(run.queues) + 0.6), dpi=110, squeeze=False, sharex=True
    )
    start, stop = _window(run)
    days = run.times / DAY
    for at, queue in enumerate(run.queues):
        for column, resource in enumerate(GPU_RESOURCES):
            axes: Axes = grid[at, column]
            scale, label = _SCALE[resource.value]
            r = RESOURCES.index(resource)
            axes.step(days, run.demand[:, at, r] / scale, where="post", color="0.75", lw=0.8, label="demand")
            axes.step(days, run.share[:, at, r] / scale, where="post", color="C1", lw=1.0, label="fair share")
            axes.step(days, run.usage[:, at, r] / scale, where="post", color="C0", lw=1.0, label="held")
            quota = document["queues"][queue]["resources"][resource.value]["quota"]
            if quota:
                axes.axhline(quota / scale, color="k", linestyle=":", lw=1, label="quota")
            axes.set_xlim(start / DAY, stop / DAY)
            axes.set_title(f"{queue}: {label}", fontsize=9)
            axes.grid(alpha=0.3)
    grid[0, 0].legend(fontsize=7, loc="upper left")
    for axes in grid[-1]:
        axes.set_xlabel("day of the trace")
    figure.tight_layout()
    return output.png(figure)


def _window(run: TenantRun) -> tuple[float, float]:
    """The span the allocation plot shows: from the first time any queue's demand passed what it held (a
    pod waited) to the last, with a margin; the whole replay when nothing ever waited."""
    waiting = np.flatnonzero((run.demand - run.usage > 1e-9).any(axis=(1, 2)))
    if waiting.size == 0:
        return float(run.times[0]) if run.times.size else 0.0, run.end
    first, last = float(run.times[waiting[0]]), float(run.times[min(waiting[-1] + 1, run.times.size - 1)])
    margin = max((last - first) * 0.02, 3600.0)
    return first - margin, last + margin


def _cdf(run: TenantRun, values: Callable[[Any], Sequence[float]], label: str) -> bytes:
    """Per queue, the share of cases done within x seconds (x on a log scale)."""
    figure, axes = plt.subplots(figsize=(7, 4), dpi=110)
    drawn = False
    for queue in run.queues:
        seconds = np.sort(np.asarray(values(run.tallies[queue]), float))
        if seconds.size:
            shares = np.arange(1, seconds.size + 1) / seconds.size
            axes.step(np.maximum(seconds, 1.0), shares, where="post", label=f"{queue} ({seconds.size:,})")
            drawn = True
    if drawn:
        axes.set_xscale("log")
        axes.legend(fontsize=8)
    else:
        axes.text(0.5, 0.5, "none in this replay", ha="center", va="center", transform=axes.transAxes)
    axes.set_xlabel(f"{label} (log; under 1 s drawn at 1 s)")
    axes.set_ylabel("share of cases")
    axes.grid(alpha=0.3)
    figure.tight_layout()
    return output.png(figure)


def _evictions(document: dict[str, Any]) -> bytes:
    queues = list(document["queues"])
    figure, (count, wasted) = plt.subplots(1, 2, figsize=(9, 3.6), dpi=110)
    count.bar(queues, [document["queues"][q]["evicted"] for q in queues], color="C3")
    count.set_ylabel("pods evicted")
    wasted.bar(queues, [document["queues"][q]["wasted_gpu_hours"] for q in queues], color="C4")
    wasted.set_ylabel("GPU-hours the evicted pods had run")
    for axes in (count, wasted):
        axes.grid(alpha=0.3, axis="y")
    figure.tight_layout()
    return output.png(figure)
