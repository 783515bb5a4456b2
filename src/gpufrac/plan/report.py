"""What a plan leaves behind: a terminal table, and with `--out`, plan.json, two charts and plan.html.

plan.html is meant to be forwarded: it opens with the answer, then the assumptions it rests on, the table,
the charts and the definitions, and embeds its charts so that it is one file.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from rich import box
from rich.table import Table

from gpufrac.plan import mig, planner
from gpufrac.sim import output
from gpufrac.sim.trace import MIB_PER_GB

COLUMNS = (  # (header, with a line break where the table may wrap it; what it means)
    ("strategy", "strategy"),
    ("GPUs\nneeded", "the fewest GPUs on which every pod places at once"),
    ("vs\nwhole", "GPUs needed against whole-gpu"),
    ("bound", "what ran out with one node fewer"),
    ("alloc\n%", "GPU memory allocated, % of the GPUs bought"),
    ("strand.\n%", "memory of busy GPUs backing no request, % of all bought"),
    ("pods\n/GPU", "GPU pods per GPU bought"),
    ("blast\nmax/mean", "pods sharing one fault domain: the largest and the mean"),
    ("tenants\n/GPU", "mean pods on a busy GPU"),
    ("SM\nshare", "mean SM share 1/n of an sm-sharing pod"),
    ("over-\nsub.", "pods allocated less memory than they ask for"),
    ("timed\npeak", "most GPUs busy at once in the timed replay"),
    ("cost\n/month", f"GPUs needed × price × {planner.HOURS_PER_MONTH} hours"),
)


def cells(summary: dict[str, Any], name: str) -> list[str]:
    row = summary["strategies"][name]
    baseline = summary["strategies"].get("whole-gpu")
    gpus = f"{row['gpus_needed']:,.0f}"
    if row["gpus_needed_min"] != row["gpus_needed_max"]:
        gpus += f" ({row['gpus_needed_min']:,} to {row['gpus_needed_max']:,})"
    versus = "-"
    if baseline and name != "whole-gpu":
        versus = f"{100 * (row['gpus_needed'] / baseline['gpus_needed'] - 1):+.1f}%"
    timed = row.get("timed")
    return [
        name,
        gpus,
        versus,
        row["bound"] or "-",
        f"{row['allocation_ratio']:.1f}",
        f"{row['stranded_percent']:.1f}",
        f"{row['pods_per_gpu']:.2f}",
        f"{row['blast_radius_max']} / {row['blast_radius_mean']:.2f}",
        f"{row['tenants_per_busy_gpu']:.2f}",
        "-" if row["sm_share"] is None else f"{row['sm_share']:.2f}",
        f"{row['oversubscribed_pods']:,.0f}",
        "-" if timed is None else f"{timed['peak_gpus']:,}",
        f"{row['cost_per_month']:,.0f}",
    ]


def title(summary: dict[str, Any]) -> str:
    cluster = summary["cluster"]
    settings = summary["settings"]
    seeds = settings["seeds"]
    return (
        f"{summary['trace']}: {summary['pods']:,} pods ({summary['gpu_pods']:,} with GPUs); trace cluster "
        f"{cluster['nodes']:,} nodes, {cluster['gpus']:,} GPUs; {settings['policy']}, "
        f"seed{'s' if len(seeds) > 1 else ''} {','.join(map(str, seeds))}"
    )


def summary_table(summary: dict[str, Any]) -> Table:
    price = summary["settings"]["price_per_gpu_hour"]
    table = Table(
        box=box.SIMPLE_HEAD,
        title=title(summary),
        caption=f"price {price:g} per GPU-hour; `gpufrac plan --out DIR` writes plan.html, which defines "
        "every column",
    )
    for header, _ in COLUMNS:
        first = header == "strategy"
        table.add_column(header, justify="left" if first else "right", no_wrap=first)
    for name in summary["strategies"]:
        table.add_row(*cells(summary, name))
    return table


def write(out: Path, summary: dict[str, Any]) -> list[Path]:
    """plan.json, gpus-needed.png, allocation-over-time.png (with the timed replay) and plan.html."""
    charts = {"gpus-needed.png": _needed_chart(summary)}
    if summary["settings"]["timed"]:
        charts["allocation-over-time.png"] = _timeline_chart(summary)
    files = {"plan.json": json.dumps(summary, indent=2).encode(), **charts}
    files["plan.html"] = _html(summary, charts).encode()
    return output.write_files(out, files)


def _needed_chart(summary: dict[str, Any]) -> bytes:
    names = list(summary["strategies"])
    values = [summary["strategies"][name]["gpus_needed"] for name in names]
    figure, axes = plt.subplots(figsize=(7, 0.5 * len(names) + 1.5), dpi=120)
    bars = axes.barh(names[::-1], values[::-1], color="#4878a8")
    axes.bar_label(bars, labels=[f"{value:,.0f}" for value in values[::-1]], padding=3, fontsize=8)
    trace_gpus = summary["cluster"]["gpus"]
    axes.axvline(trace_gpus, color="grey", linestyle=":", linewidth=1, label=f"trace cluster: {trace_gpus:,}")
    axes.legend(loc="lower right", fontsize=8)
    axes.set_xlabel("GPUs needed to place every pod at once")
    axes.set_xlim(0, max([*values, trace_gpus]) * 1.18)
    axes.set_title(summary["trace"], fontsize=10)
    figure.tight_layout()
    return output.png(figure)


def _timeline_chart(summary: dict[str, Any]) -> bytes:
    figure, axes = plt.subplots(figsize=(8, 4.5), dpi=120)
    for name, row in summary["strategies"].items():
        series = row.get("timed", {}).get("series", [])
        if series:
            start = series[0][0]
            axes.step(
                [(t - start) / 86400 for t, _ in series],
                [busy for _, busy in series],
                where="post",
                label=name,
                linewidth=1.2,
            )
    axes.set_xlabel("days since the first pod arrived")
    axes.set_ylabel("GPUs holding a pod (most in each span)")
    axes.set_title(f"{summary['trace']}: timed replay on the trace's cluster", fontsize=10)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    return output.png(figure)


def headline(summary: dict[str, Any]) -> str:
    """The answer in a few sentences, for the top of the report. The fewest GPUs is sought among the
    strategies that give every pod the memory it asks for; one that does not is named apart."""
    rows = summary["strategies"]
    honest = [name for name in rows if not rows[name]["oversubscribed_pods"]] or list(rows)
    best = min(honest, key=lambda name: rows[name]["gpus_needed"])
    text = (
        f"To run all {summary['pods']:,} pods at once, each with the memory it asks for, {best} needs the "
        f"fewest GPUs: {rows[best]['gpus_needed']:,.0f}, about {rows[best]['cost_per_month']:,.0f} a month."
    )
    if rows[best]["bound"] == "CPU":
        text += " At that size the nodes' CPU, not their GPUs, is what runs out."
    if "whole-gpu" in rows and best != "whole-gpu":
        whole = rows["whole-gpu"]
        saved = whole["gpus_needed"] - rows[best]["gpus_needed"]
        text += (
            f" Whole GPUs need {whole['gpus_needed']:,.0f} ({whole['cost_per_month']:,.0f} a month): "
            f"{saved:,.0f} GPUs ({100 * saved / whole['gpus_needed']:.1f}%) more."
        )
    for name, row in rows.items():
        if name not in honest and row["gpus_needed"] < rows[best]["gpus_needed"]:
            text += (
                f" {name} needs {row['gpus_needed']:,.0f} only by giving {row['oversubscribed_pods']:,.0f} "
                "pods less memory than they ask for, which nothing enforces."
            )
    return text


def _html_columns() -> list[tuple[str, str]]:
    return [(name.replace("\n/", "/").replace("-\n", "-").replace("\n", " "), tip) for name, tip in COLUMNS]


def _html(summary: dict[str, Any], charts: dict[str, bytes]) -> str:
    escape = html.escape
    header = "".join(f'<th title="{escape(tip)}">{escape(name)}</th>' for name, tip in _html_columns())
    body = "".join(
        "<tr>" + "".join(f"<td>{escape(cell)}</td>" for cell in cells(summary, name)) + "</tr>"
        for name in summary["strategies"]
    )
    definitions = "".join(
        f"<li><b>{escape(name)}</b>: {escape(tip)}</li>" for name, tip in _html_columns()[1:]
    )
    assumptions = "".join(f"<li>{escape(line)}</li>" for line in summary["assumptions"])
    images = "".join(
        f"<h2>{escape(heading)}</h2>{output.img(charts[name], heading)}"
        for name, heading in (
            ("gpus-needed.png", "GPUs needed per strategy"),
            ("allocation-over-time.png", "GPUs in use over time (timed replay)"),
        )
        if name in charts
    )
    timed_note = ""
    if summary["settings"]["timed"]:
        rejected = {name: row["timed"]["rejected_pods"] for name, row in summary["strategies"].items()}
        timed_note = (
            "<p>The timed replay runs on the trace's own cluster; pods that found no room when they arrived: "
            + ", ".join(f"{escape(name)} {count:,}" for name, count in rejected.items())
            + ".</p>"
        )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>GPU capacity plan: {escape(summary["trace"])}</title>
<style>body{{font-family:system-ui,sans-serif;max-width:68rem;margin:2rem auto;padding:0 1rem}}
table{{border-collapse:collapse;font-size:.9rem}}
td,th{{border:1px solid #ccc;padding:.3rem .5rem;text-align:right}}
td:first-child,th:first-child{{text-align:left}}img{{max-width:100%}}</style></head><body>
<h1>GPU capacity plan</h1>
<p>{escape(title(summary))}.</p>
<p><b>{escape(headline(summary))}</b></p>
<h2>Assumptions</h2><ul>{assumptions}</ul>
<h2>Strategies side by side</h2>
<table><tr>{header}</tr>{body}</table>
{timed_note}
{images}
<h2>Definitions</h2><ul>{definitions}
<li><b>stranded</b> counts memory allocated beyond a request (whole GPUs, MIG profiles) and memory left
free beside other tenants; idle GPUs are spare, not stranded. GB are nominal ({MIB_PER_GB} MiB).</li>
<li><b>fault domain</b>: every pod on an sm-sharing GPU shares one (its MPS server); a time-slicing, MIG
or whole-GPU pod is alone in its own.</li></ul>
<h2>Sources</h2>
<p>MIG profiles and placement slots ({escape(", ".join(mig.MIG_MODELS))}): NVIDIA Multi-Instance GPU User
Guide, "Supported MIG Profiles" and the placements listed by <code>nvidia-smi mig -lgipp</code>. Trace:
Alibaba cluster-trace-gpu-v2023 (openb), Weng et al., "Beware of Fragmentation", USENIX ATC '23.
Produced by <code>gpufrac plan</code>; every figure is also in plan.json.</p>
</body></html>
"""
