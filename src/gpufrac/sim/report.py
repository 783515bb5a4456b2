"""What a simulation leaves behind: a terminal table, and with `--out`, data files, plots and an HTML page.

Files are written to a temporary name and renamed, so an interrupted run never leaves a half-written
report that looks whole.
"""

from __future__ import annotations

import csv
import html
import io
import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from rich.table import Table

from gpufrac.sim import output
from gpufrac.sim.experiment import RESTART_SECONDS
from gpufrac.sim.replay import RunResult


def summary_table(summary: dict[str, Any]) -> Table:
    bound = summary["bound"]
    paper = _published(summary)
    at = read_at(summary)
    table = Table(
        title=f"{summary['trace']}: {summary['gpus']} GPUs, seeds {_seed_text(summary['seeds'])}",
        caption=f"alloc@{at}%: GPU allocation ratio at {at}% arrival; "
        + ("paper: Weng et al. (ATC '23); " if paper else "")
        + f"bound: no placement allocates more (LP, {bound['variables']} variables, {bound['constraints']} "
        f"constraints, {bound['seconds']:.2f} s per seed); gap: bound - alloc@{at}%"
        + "".join(f"\n{note}" for note in _read_elsewhere(summary)),
    )
    columns: tuple[str, ...] = (
        "policy",
        f"alloc@{at}%",
        "std",
        *(("paper",) if paper else ()),
        "bound",
        "gap",
        "unalloc %",
        "frag %",
        "failed",
        "s/run",
    )
    moving, reserving = _has(summary, "move_budget"), _has(summary, "whole_gpu_reserve")
    if moving:
        columns += ("moves/100 arrivals", "moved GPU-s")
    if reserving:
        columns += ("kept out",)
    for column in columns:
        table.add_column(column, justify="left" if column == "policy" else "right")
    for policy, row in summary["policies"].items():
        published = row.get("published_at_100")
        table.add_row(
            policy,
            f"{row['allocation_at_100']:.2f}",
            f"{row['allocation_at_100_std']:.2f}",
            *((f"{published:.2f}" if published is not None else "",) if paper else ()),
            f"{bound['allocation_at_100']:.2f}",
            f"{row['gap_to_bound']:.2f}",
            f"{row['unallocated_at_100']:.2f}",
            f"{row['fragmentation_at_100']:.2f}",
            f"{row['failed_pods']:.0f}",
            f"{row['seconds']:.2f}",
            *(_move_cells(row) if moving else ()),
            *((_kept_out_cell(row),) if reserving else ()),
        )
    return table


def read_at(summary: dict[str, Any]) -> str:
    """The arrival % at which a summary's figures "at 100" were read: `100`, or where the runs did not reach
    it, the points nearest it that they did (`58`, or `96-104` over seeds)."""
    points = summary.get("read_at_arrival", [100])
    return str(points[0]) if len(points) == 1 else f"{points[0]}-{points[-1]}"


def _read_elsewhere(summary: dict[str, Any]) -> list[str]:
    """A line saying where and why the figures were read, where that is not 100% arrival; none where it is."""
    if "read_at_arrival" not in summary:
        return []
    at = read_at(summary)
    reached = max(int(x) for row in summary["policies"].values() for x in row["allocation"])
    if reached < 100:
        return [
            f"not at 100% arrival: at inflation {summary['inflation']:g} the runs end at {at}% of the "
            "cluster's GPUs, so every figure is read there"
        ]
    return [
        f"not at 100% arrival for every run: the figures are read at {at}%, the point nearest 100% that each "
        "run reached"
    ]


def _traces_read_elsewhere(summaries: dict[str, dict[str, Any]]) -> list[str]:
    """The line of a multi-trace table or page naming the traces whose figures were not read at 100%."""
    elsewhere = [
        f"{name} at {read_at(summary)}%"
        for name, summary in summaries.items()
        if "read_at_arrival" in summary
    ]
    if not elsewhere:
        return []
    return [f"not at 100% arrival (the nearest point their runs reached): {', '.join(elsewhere)}"]


def _published(summary: dict[str, Any]) -> bool:
    """Whether the paper's figures stand beside this run (`experiment.publishes`): only then is their
    column shown."""
    return any("published_at_100" in row for row in summary["policies"].values())


def _has(summary: dict[str, Any], variant: str) -> bool:
    """Whether any row is a variant that moved pods (`move_budget`) or kept GPUs whole (`whole_gpu_reserve`):
    only then do tables show what that cost."""
    return any(variant in row for row in summary["policies"].values())


def _move_cells(row: dict[str, Any]) -> tuple[str, str]:
    if "move_budget" not in row:
        return "", ""
    return f"{row['moves_per_100_arrivals']:.2f}", f"{row['moved_gpu_seconds_at_100']:,}"


def _kept_out_cell(row: dict[str, Any]) -> str:
    return f"{row['kept_out_at_100']:.1f}" if "whole_gpu_reserve" in row else ""


def overview(summaries: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The JSON document of a multi-trace run: each trace's summary, and the trace × policy table."""
    first = next(iter(summaries.values()))
    return {
        "seeds": first["seeds"],
        "gpus": first["gpus"],
        "inflation": first["inflation"],
        "allocation_at_100": {
            name: {
                **{policy: row["allocation_at_100"] for policy, row in summary["policies"].items()},
                "bound": summary["bound"]["allocation_at_100"],
            }
            for name, summary in summaries.items()
        },
        "traces": summaries,
    }


def traces_table(document: dict[str, Any]) -> Table:
    """One row per trace: each policy's allocation at 100% arrival, then the bound and the best gap to it."""
    rows = document["allocation_at_100"]
    policies = [column for column in next(iter(rows.values())) if column != "bound"]
    table = Table(
        title=f"GPU allocation at 100% arrival, {document['gpus']} GPUs, "
        f"seeds {_seed_text(document['seeds'])}",
        caption="bound: no placement allocates more (LP); best gap: bound - the best policy"
        + "".join(f"\n{note}" for note in _traces_read_elsewhere(document["traces"])),
    )
    for column in ("trace", *policies, "bound", "best gap"):
        table.add_column(column, justify="left" if column == "trace" else "right")
    for name, row in rows.items():
        best = max(row[policy] for policy in policies)
        table.add_row(
            name,
            *(f"{row[policy]:.2f}" for policy in policies),
            f"{row['bound']:.2f}",
            f"{row['bound'] - best:.2f}",
        )
    return table


def write(out: Path, summary: dict[str, Any], results: Sequence[RunResult]) -> list[Path]:
    """results.json, curves.csv, allocation.png, fragmentation.png and report.html in `out`."""
    allocation_png = _plot({summary["trace"]: summary}, {summary["trace"]: results}, field="allocation")
    fragmentation_png = _plot({summary["trace"]: summary}, {summary["trace"]: results}, field="fragmentation")
    intro = (
        f"<p>Trace <b>{html.escape(summary['trace'])}</b>, {summary['gpus']} GPUs, seeds "
        f"{_seed_text(summary['seeds'])}. {_METHOD.format(inflation=results[0].inflation)}</p>"
    )
    files = {
        "results.json": json.dumps(summary, indent=2).encode(),
        "curves.csv": _csv(CURVE_COLUMNS, _curve_rows(results)).encode(),
        "allocation.png": allocation_png,
        "fragmentation.png": fragmentation_png,
        "report.html": output.page(
            f"gpufrac simulation: {summary['trace']}",
            intro + _policy_table(summary) + _figures(allocation_png, fragmentation_png),
        ).encode(),
    }
    return output.write_files(out, files)


def write_traces(
    out: Path, document: dict[str, Any], results: Mapping[str, Sequence[RunResult]]
) -> list[Path]:
    """The same files as `write`, over several traces: one table row per trace, a grid of plots with one
    panel per trace, and every trace's own table on the page."""
    summaries = document["traces"]
    allocation_png = _plot(summaries, results, field="allocation")
    fragmentation_png = _plot(summaries, results, field="fragmentation")
    inflation = next(iter(results.values()))[0].inflation
    rows = document["allocation_at_100"]
    columns = list(next(iter(rows.values())))
    overview_table = "<table><tr><th>trace</th>{}</tr>{}</table>".format(
        "".join(f"<th>{html.escape(column)}</th>" for column in columns),
        "".join(
            f"<tr><td>{html.escape(name)}</td>{''.join(f'<td>{row[c]:.2f}</td>' for c in columns)}</tr>"
            for name, row in rows.items()
        ),
    )
    body = (
        f"<p>{len(summaries)} traces, {document['gpus']} GPUs, seeds {_seed_text(document['seeds'])}. "
        f"{_METHOD.format(inflation=inflation)}</p>"
        f"<h2>GPU allocation at 100% arrival (%)</h2>{overview_table}"
        + "".join(f"<p><b>{html.escape(note)}</b></p>" for note in _traces_read_elsewhere(summaries))
        + _figures(allocation_png, fragmentation_png)
        + "".join(
            f"<h2>{html.escape(name)}</h2>{_policy_table(summary)}" for name, summary in summaries.items()
        )
    )
    files = {
        "results.json": json.dumps(document, indent=2).encode(),
        "curves.csv": _csv(
            ("trace", *CURVE_COLUMNS),
            ([name, *row] for name, runs in results.items() for row in _curve_rows(runs)),
        ).encode(),
        "allocation.png": allocation_png,
        "fragmentation.png": fragmentation_png,
        "report.html": output.page(f"gpufrac simulation: {len(summaries)} traces", body).encode(),
    }
    return output.write_files(out, files)


CURVE_COLUMNS = ("policy", "seed", "arrival_percent", "allocation_percent", "fragmentation_percent")
_METHOD = (
    "Pods arrive in a seeded order, inflated by sampling to {inflation:g}&times; the cluster's GPUs; a pod "
    'that does not fit is dropped (the method of Weng et al., USENIX ATC \'23, "Beware of Fragmentation"). '
    "Published figures are the paper's means over seeds 42&ndash;51 on the default trace. The bound is an "
    "upper bound on what any placement of the pods arrived by 100% could allocate (a linear program over "
    "node types and pod shapes): the gap to it is the most a better policy could still gain."
)


def _csv(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buffer.getvalue()


def _curve_rows(results: Sequence[RunResult]) -> Iterator[list[object]]:
    for run in results:
        for x in sorted(run.allocation):
            fragmentation = run.fragmentation.get(x)
            yield [
                run.label,
                run.seed,
                x,
                run.allocation[x],
                "" if fragmentation is None else round(fragmentation, 3),
            ]


def _plot(
    summaries: dict[str, dict[str, Any]], results: Mapping[str, Sequence[RunResult]], *, field: str
) -> bytes:
    """One panel per trace (a grid of up to four columns when there are several), the bound as a line."""
    columns = min(4, len(summaries))
    rows = math.ceil(len(summaries) / columns)
    figure, grid = plt.subplots(
        rows,
        columns,
        figsize=(7 if columns == 1 else 4.2 * columns, 4.5 if rows == 1 else 3.4 * rows),
        dpi=120,
        squeeze=False,
    )
    for axes, (name, summary) in zip(grid.flat, summaries.items(), strict=False):
        _draw(axes, summary, results[name], field=field)
    for axes in list(grid.flat)[len(summaries) :]:
        axes.set_visible(False)
    figure.tight_layout()
    return output.png(figure)


def _draw(axes: Axes, summary: dict[str, Any], results: Sequence[RunResult], *, field: str) -> None:
    for policy in summary["policies"]:
        runs = [getattr(run, field) for run in results if run.label == policy]
        xs = sorted(set().union(*runs))
        means = [
            sum(curve[x] for curve in runs if x in curve) / sum(x in curve for curve in runs) for x in xs
        ]
        axes.plot(xs, means, label=policy, linewidth=1.6)
    if field == "allocation":
        axes.plot([0, 100], [0, 100], color="grey", linestyle=":", linewidth=1, label="everything placed")
        bound = summary["bound"]["allocation_at_100"]
        # A marker where the figures are read only: the bound holds for the pods arrived by then, not along
        # the curve. That is 100% but where the runs did not reach it (a low inflation, a small trace).
        points = summary.get("read_at_arrival", [100])
        x = (points[0] + points[-1]) / 2
        axes.plot([x], [bound], "kv", label=f"upper bound at {read_at(summary)}% ({bound:.2f})")
        low = min(60, 10 * math.floor(min(x, bound) / 10) - 10)
        axes.set_xlim(low, None)
        axes.set_ylim(low, None)
    axes.set_xlabel("arrived workload (% of cluster GPUs)")
    axes.set_ylabel("GPU allocation ratio (%)" if field == "allocation" else "fragmentation (% of GPUs)")
    axes.set_title(f"{summary['trace']}, {len(summary['seeds'])} seed(s)")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)


def _policy_table(summary: dict[str, Any]) -> str:
    bound = summary["bound"]
    moving, reserving = _has(summary, "move_budget"), _has(summary, "whole_gpu_reserve")
    paper = _published(summary)
    at = read_at(summary)
    rows = "".join(
        "<tr><td>{}</td><td>{:.2f} ± {:.2f}</td>{}<td>{:.2f}</td><td>{:.2f}</td><td>{:.2f}</td>"
        "<td>{:.0f}</td>{}{}</tr>".format(
            html.escape(policy),
            row["allocation_at_100"],
            row["allocation_at_100_std"],
            f"<td>{row['published_at_100']:.2f}</td>" if "published_at_100" in row else "<td></td>" * paper,
            row["gap_to_bound"],
            row["unallocated_at_100"],
            row["fragmentation_at_100"],
            row["failed_pods"],
            "".join(f"<td>{cell}</td>" for cell in _move_cells(row)) if moving else "",
            f"<td>{_kept_out_cell(row)}</td>" if reserving else "",
        )
        for policy, row in summary["policies"].items()
    )
    move_headers = (
        f"<th>moves per 100 arrivals</th><th>moved GPU-seconds (restart {RESTART_SECONDS} s)</th>"
        if moving
        else ""
    )
    move_headers += "<th>large shares turned away by the whole-GPU reserve</th>" * reserving
    return (
        "".join(f"<p><b>{html.escape(note)}</b></p>" for note in _read_elsewhere(summary))
        + f"<table><tr><th>policy</th><th>allocation at {at}% arrival (%)</th>"
        + "<th>published</th>" * paper
        + "<th>gap to the bound</th><th>unallocated (%)</th><th>fragmentation (% of GPUs)</th>"
        f"<th>failed pods</th>{move_headers}</tr>{rows}</table>"
        f"<p>Upper bound at {at}% arrival: <b>{bound['allocation_at_100']:.2f}</b> (per seed: "
        + ", ".join(f"{seed}: {value:.2f}" for seed, value in bound["per_seed"].items())
        + f"; LP of {bound['variables']} variables and {bound['constraints']} constraints, "
        f"{bound['seconds']:.2f} s per seed).</p>"
    )


def _figures(allocation_png: bytes, fragmentation_png: bytes) -> str:
    return (
        f"<h2>GPU allocation against arrived workload</h2>{output.img(allocation_png, 'allocation')}"
        f"<h2>Fragmentation against arrived workload</h2>{output.img(fragmentation_png, 'fragmentation')}"
    )


def _seed_text(seeds: Sequence[int]) -> str:
    if seeds and list(seeds) == list(range(seeds[0], seeds[0] + len(seeds))) and len(seeds) > 2:
        return f"{seeds[0]}-{seeds[-1]}"
    return ",".join(map(str, seeds))
