"""What a simulation leaves behind: a terminal table, and with `--out`, data files, plots and an HTML page.

Files are written to a temporary name and renamed, so an interrupted run never leaves a half-written
report that looks whole.
"""

from __future__ import annotations

import csv
import html
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from rich.table import Table

from gpufrac.sim import output
from gpufrac.sim.replay import RunResult


def summary_table(summary: dict[str, Any]) -> Table:
    table = Table(
        title=f"{summary['trace']}: {summary['gpus']} GPUs, seeds {_seed_text(summary['seeds'])}",
        caption="alloc@100%: GPU allocation ratio at 100% arrival; paper: Weng et al. (ATC '23)",
    )
    columns = ("policy", "alloc@100%", "std", "paper", "unalloc %", "frag %", "failed", "s/run")
    for column in columns:
        table.add_column(column, justify="left" if column == "policy" else "right")
    for policy, row in summary["policies"].items():
        published = row.get("published_at_100")
        table.add_row(
            policy,
            f"{row['allocation_at_100']:.2f}",
            f"{row['allocation_at_100_std']:.2f}",
            f"{published:.2f}" if published is not None else "",
            f"{row['unallocated_at_100']:.2f}",
            f"{row['fragmentation_at_100']:.2f}",
            f"{row['failed_pods']:.0f}",
            f"{row['seconds']:.2f}",
        )
    return table


def write(out: Path, summary: dict[str, Any], results: Sequence[RunResult]) -> list[Path]:
    """results.json, curves.csv, allocation.png, fragmentation.png and report.html in `out`."""
    allocation_png = _plot(summary, results, field="allocation", ylabel="GPU allocation ratio (%)")
    fragmentation_png = _plot(summary, results, field="fragmentation", ylabel="fragmentation (% of GPUs)")
    files = {
        "results.json": json.dumps(summary, indent=2).encode(),
        "curves.csv": _curves_csv(results).encode(),
        "allocation.png": allocation_png,
        "fragmentation.png": fragmentation_png,
        "report.html": _html(
            summary, allocation_png, fragmentation_png, inflation=results[0].inflation
        ).encode(),
    }
    return output.write_files(out, files)


def _curves_csv(results: Sequence[RunResult]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["policy", "seed", "arrival_percent", "allocation_percent", "fragmentation_percent"])
    for run in results:
        for x in sorted(run.allocation):
            fragmentation = run.fragmentation.get(x)
            writer.writerow(
                [
                    run.policy,
                    run.seed,
                    x,
                    run.allocation[x],
                    "" if fragmentation is None else round(fragmentation, 3),
                ]
            )
    return buffer.getvalue()


def _plot(summary: dict[str, Any], results: Sequence[RunResult], *, field: str, ylabel: str) -> bytes:
    figure, axes = plt.subplots(figsize=(7, 4.5), dpi=120)
    for policy in summary["policies"]:
        runs = [getattr(run, field) for run in results if run.policy == policy]
        xs = sorted(set().union(*runs))
        means = [
            sum(curve[x] for curve in runs if x in curve) / sum(x in curve for curve in runs) for x in xs
        ]
        axes.plot(xs, means, label=policy, linewidth=1.6)
    if field == "allocation":
        axes.plot([0, 100], [0, 100], color="grey", linestyle=":", linewidth=1, label="everything placed")
        axes.set_xlim(60, None)
        axes.set_ylim(60, None)
    axes.set_xlabel("arrived workload (% of cluster GPUs)")
    axes.set_ylabel(ylabel)
    axes.set_title(f"{summary['trace']}, {len(summary['seeds'])} seed(s)")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    return output.png(figure)


def _html(
    summary: dict[str, Any], allocation_png: bytes, fragmentation_png: bytes, *, inflation: float
) -> str:
    rows = "".join(
        "<tr><td>{}</td><td>{:.2f} ± {:.2f}</td><td>{}</td><td>{:.2f}</td><td>{:.2f}</td>"
        "<td>{:.0f}</td></tr>".format(
            html.escape(policy),
            row["allocation_at_100"],
            row["allocation_at_100_std"],
            f"{row['published_at_100']:.2f}" if "published_at_100" in row else "",
            row["unallocated_at_100"],
            row["fragmentation_at_100"],
            row["failed_pods"],
        )
        for policy, row in summary["policies"].items()
    )

    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>gpufrac simulation: {html.escape(summary["trace"])}</title>
<style>body{{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:.3rem .6rem;text-align:right}}
td:first-child,th:first-child{{text-align:left}}img{{max-width:100%}}</style></head><body>
<h1>gpufrac simulation</h1>
<p>Trace <b>{html.escape(summary["trace"])}</b>, {summary["gpus"]} GPUs, seeds {_seed_text(summary["seeds"])}.
Pods arrive in a seeded order, inflated by sampling to {inflation:g}&times; the cluster's GPUs;
a pod that does not fit is dropped (the method of Weng et al., USENIX ATC '23, "Beware of Fragmentation").
Published figures are the paper's means over seeds 42&ndash;51 on the same trace.</p>
<table><tr><th>policy</th><th>allocation at 100% arrival (%)</th><th>published</th><th>unallocated (%)</th>
<th>fragmentation (% of GPUs)</th><th>failed pods</th></tr>{rows}</table>
<h2>GPU allocation against arrived workload</h2>{output.img(allocation_png, "allocation")}
<h2>Fragmentation against arrived workload</h2>{output.img(fragmentation_png, "fragmentation")}
</body></html>
"""


def _seed_text(seeds: Sequence[int]) -> str:
    if seeds and list(seeds) == list(range(seeds[0], seeds[0] + len(seeds))) and len(seeds) > 2:
        return f"{seeds[0]}-{seeds[-1]}"
    return ",".join(map(str, seeds))
