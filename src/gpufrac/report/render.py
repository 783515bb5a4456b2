"""What `gpufrac report` leaves behind: a terminal table, and in the out folder report.json, shares.csv,
gpus.csv, three charts and index.html, one page that embeds its charts so that it can be forwarded alone.

Every file is rendered before the first is written, and each is then replaced in one step
(`sim.output.write_files`), so a failed run leaves the previous report whole.
"""

from __future__ import annotations

import csv
import dataclasses
import html
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from rich import box
from rich.table import Table
from rich.text import Text

from gpufrac.report.analysis import NOT_MEASURED, Figures, Share
from gpufrac.sim import output

MAX_SHARES_PLOTTED = 60  # beyond that a bar chart is unreadable; the table and shares.csv have them all
SHARE_COLUMNS = ("pod", "container", "node", "gpu", "mode", "request MiB", "limit MiB", "used MiB", "status")
GPU_COLUMNS = ("node", "gpu", "tenants", "pods")
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def headline(figures: Figures) -> str:
    """The comparison in one sentence: GPUs held now against GPUs the same pods would hold unshared."""
    if not figures.gpu_pods:
        return "No bound pod holds a GPU: nothing to compare."
    text = (
        f"{figures.gpu_pods} GPU pods hold {figures.in_use} GPUs today; with whole GPUs only they would hold "
        f"{figures.without_sharing}"
    )
    if figures.saved > 0:
        text += f", so sharing saves {figures.saved} ({100 * figures.saved / figures.without_sharing:.0f}%)"
    if figures.without_sharing > figures.cluster_gpus:
        text += f", more than the {figures.cluster_gpus} GPUs the cluster has"
    return text + "."


def densification_rows(figures: Figures) -> list[tuple[str, str]]:
    rows = [
        ("nodes", str(figures.nodes)),
        ("GPUs in the cluster", str(figures.cluster_gpus)),
        ("GPU pods bound", str(figures.gpu_pods)),
        ("GPUs in use (shares and whole GPUs)", str(figures.in_use)),
        ("GPUs with whole-GPU allocation", str(figures.without_sharing)),
        ("GPUs saved by sharing", str(figures.saved)),
    ]
    if figures.unidentified_whole:
        rows.append(("of those in use, given by the device plugin", str(figures.unidentified_whole)))
    statuses = figures.statuses()
    for status in ("within", "burst", "breach", NOT_MEASURED):
        rows.append((f"shares {status}", str(statuses.get(status, 0))))
    usage = figures.usage
    for reason, count in sorted(usage.breaches.items()):
        rows.append((f"watchdog findings: {reason}", f"{count:.0f}"))
    for action, count in sorted(usage.actions.items()):
        rows.append((f"watchdog actions: {action}", f"{count:.0f}"))
    if not usage.counters_read:
        rows.append(("watchdog findings", NOT_MEASURED))
    return rows


def share_cells(share: Share) -> list[str]:
    used = NOT_MEASURED if share.used_mib is None else f"{share.used_mib:.0f}"
    return [
        share.pod,
        share.container,
        share.node,
        share.gpu,
        share.mode,
        str(share.request_mib),
        str(share.limit_mib),
        used,
        share.status,
    ]


def gpu_cells(figures: Figures) -> list[list[str]]:
    return [
        [
            gpu.node,
            gpu.gpu,
            str(len(gpu.tenants)),
            ", ".join(f"{t.pod}[{t.container}] {t.kind}" for t in gpu.tenants),
        ]
        for gpu in figures.gpus
    ]


def summary_table(figures: Figures) -> Table:
    table = Table(
        box=box.SIMPLE_HEAD, title="gpufrac report: GPUs in use against whole GPUs", caption=headline(figures)
    )
    table.add_column("figure")
    table.add_column("value", justify="right")
    for name, value in densification_rows(figures):
        table.add_row(Text(name), value)  # not markup: a finding's reason is a label an agent wrote
    return table


def write(out: Path, figures: Figures) -> list[Path]:
    """Every file of the report, rendered first, then written."""
    charts = {
        "densification.png": _densification_chart(figures),
        "memory.png": _memory_chart(figures.shares),
        "cotenancy.png": _cotenancy_chart(figures),
    }
    files = {
        "report.json": json.dumps(_json(figures), indent=2).encode(),
        "shares.csv": _csv(SHARE_COLUMNS, [share_cells(share) for share in figures.shares]),
        "gpus.csv": _csv(GPU_COLUMNS, gpu_cells(figures)),
        **charts,
    }
    files["index.html"] = _html(figures, charts).encode()
    return output.write_files(out, files)


def _json(figures: Figures) -> dict[str, Any]:
    data = dataclasses.asdict(figures)
    data["headline"] = headline(figures)
    data["saved"] = figures.saved
    data["tenants_histogram"] = figures.tenants_histogram()
    for share, row in zip(figures.shares, data["shares"], strict=True):
        row["status"] = share.status
    return data


def _csv(header: Sequence[str], rows: list[list[str]]) -> bytes:
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(header)
    writer.writerows([inert(cell) for cell in row] for row in rows)
    return text.getvalue().encode()


def inert(cell: str) -> str:
    """The cell, with a leading `'` where a spreadsheet would run it as a formula (OWASP's rule for CSV
    injection). The GPU names come from `gpus.devices`, which on a cluster without gpufrac's webhook any
    tenant may write: `=HYPERLINK(...)` there must open as text. gpufrac's own numbers never start so."""
    return f"'{cell}" if cell[:1] in FORMULA_STARTS else cell


def _densification_chart(figures: Figures) -> bytes:
    names = ["in use today (shared)", "whole GPUs only"]
    values = [figures.in_use, figures.without_sharing]
    figure, axes = plt.subplots(figsize=(7, 2.4), dpi=120)
    bars = axes.barh(names[::-1], values[::-1], color=["#a0a0a0", "#4878a8"])
    axes.bar_label(bars, labels=[str(value) for value in values[::-1]], padding=3, fontsize=8)
    axes.axvline(
        figures.cluster_gpus, color="grey", linestyle=":", label=f"cluster: {figures.cluster_gpus} GPUs"
    )
    axes.set_xlim(0, max([*values, figures.cluster_gpus, 1]) * 1.2)
    axes.set_xlabel("GPUs holding the cluster's GPU pods")
    axes.legend(loc="lower right", fontsize=8)
    figure.tight_layout()
    return output.png(figure)


def _memory_chart(shares: Sequence[Share]) -> bytes:
    """Per share and GPU: the guarantee, the limit, and what was used (nothing drawn when not measured)."""
    shown = list(shares[:MAX_SHARES_PLOTTED])
    figure, axes = plt.subplots(figsize=(8, 0.3 * len(shown) + 1.8), dpi=120)
    labels = [f"{share.pod}[{share.container}] {share.node}/{share.gpu}" for share in shown][::-1]
    rows = range(len(shown))
    axes.barh(rows, [s.limit_mib for s in shown][::-1], color="#dde6f0", label="limit")
    axes.barh(rows, [s.request_mib for s in shown][::-1], color="#9ab4d0", label="request")
    measured = [(i, s.used_mib) for i, s in enumerate(shown[::-1]) if s.used_mib is not None]
    if measured:
        axes.scatter(
            [used for _, used in measured], [i for i, _ in measured], color="#c0392b", zorder=3, label="used"
        )
    axes.set_yticks(list(rows), labels, fontsize=7)
    axes.set_xlabel("GPU memory, MiB")
    title = "memory requested, limit and used per share"
    if len(shares) > len(shown):
        title += f" (first {len(shown)} of {len(shares)})"
    if not measured:
        title += f": used {NOT_MEASURED}"
    axes.set_title(title, fontsize=10)
    axes.legend(fontsize=8, loc="lower right")
    figure.tight_layout()
    return output.png(figure)


def _cotenancy_chart(figures: Figures) -> bytes:
    histogram = figures.tenants_histogram()
    figure, axes = plt.subplots(figsize=(6, 3), dpi=120)
    bars = axes.bar([str(n) for n in histogram], list(histogram.values()), color="#4878a8")
    axes.bar_label(bars, padding=2, fontsize=8)
    axes.set_xlabel("containers per GPU")
    axes.set_ylabel("GPUs")
    axes.set_title("co-tenancy of the GPUs in use", fontsize=10)
    figure.tight_layout()
    return output.png(figure)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], name: str) -> str:
    escape = html.escape
    head = "".join(f"<th>{escape(cell)}</th>" for cell in header)
    body = "".join("<tr>" + "".join(f"<td>{escape(cell)}</td>" for cell in row) + "</tr>" for row in rows)
    return f'<table id="{name}"><tr>{head}</tr>{body}</table>'


def _html(figures: Figures, charts: dict[str, bytes]) -> str:
    escape = html.escape
    sources = (
        "".join(
            f"<li>{escape(source.url)}: {escape(source.problem or 'read')}</li>"
            for source in figures.usage.sources
        )
        or f"<li>none given: memory used is {NOT_MEASURED}</li>"
    )
    skipped = (
        "".join(f"<li>{escape(pod)}: {escape(why)}</li>" for pod, why in figures.skipped) or "<li>none</li>"
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>gpufrac report: GPUs in use against whole GPUs</title>
<style>body{{font-family:system-ui,sans-serif;max-width:68rem;margin:2rem auto;padding:0 1rem}}
table{{border-collapse:collapse;font-size:.9rem;margin-bottom:1rem}}
td,th{{border:1px solid #ccc;padding:.3rem .5rem;text-align:left}}img{{max-width:100%}}</style></head><body>
<h1>GPUs in use against whole GPUs</h1>
<p><b>{escape(headline(figures))}</b></p>
<h2>Densification</h2>
{_table(("figure", "value"), densification_rows(figures), "densification")}
{output.img(charts["densification.png"], "GPUs in use against whole GPUs")}
<h2>Memory requested and used per share</h2>
<p>burst: using more than its guarantee, within its limit; breach: over its limit (the watchdog acts on it
by its mode); {NOT_MEASURED}: no usage source reported the share.</p>
{_table(SHARE_COLUMNS, [share_cells(share) for share in figures.shares], "shares")}
{output.img(charts["memory.png"], "memory requested, limit and used per share")}
<h2>Co-tenancy</h2>
{_table(GPU_COLUMNS, gpu_cells(figures), "gpus")}
{output.img(charts["cotenancy.png"], "containers per GPU")}
<h2>Sources</h2><ul>{sources}</ul>
<h2>Pods not counted</h2><ul>{skipped}</ul>
<h2>Definitions</h2><ul>
<li><b>GPUs in use</b>: GPUs named by at least one bound pod's <code>gpus.devices</code>, plus whole GPUs the
kubelet's device plugin gave to pods gpufrac did not place.</li>
<li><b>whole-GPU allocation</b>: the same pods with every share taking whole GPUs, one per device it holds
(the rule of <code>gpufrac plan</code>'s whole-gpu strategy).</li>
<li><b>used</b>: <code>gpufrac_share_memory_used_bytes</code> from the node agents when the report was made,
one reading, not a peak.</li></ul>
<p>Produced by <code>gpufrac report</code>; every figure is also in report.json.</p>
</body></html>
"""
