"""The report's files, and its page as Chromium shows it."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from gpufrac.report import analysis, render

from .browser import check_page
from .pods import node, pod

TABLES = {"densification", "shares", "gpus"}


def example() -> analysis.Figures:
    pods = [pod("a", share=("0",)), pod("b", share=("0",), limit_mib=4096), pod("c", whole=("1",))]
    samples = (
        analysis.ShareSample("ml/a", "main", "", "0", 6000 * analysis.MIB),  # a burst
        analysis.ShareSample("ml/b", "main", "", "0", 5000 * analysis.MIB),  # a breach
    )
    usage = analysis.Usage(samples, {"GPUMemoryLimitExceeded": 1}, {"report": 1}, (analysis.Source("u"),))
    return analysis.figures([node("n1")], pods, usage)


def test_the_report_writes_every_file(tmp_path: Path) -> None:
    written = render.write(tmp_path / "out", example())
    assert sorted(path.name for path in written) == [
        "cotenancy.png",
        "densification.png",
        "gpus.csv",
        "index.html",
        "memory.png",
        "report.json",
        "shares.csv",
    ]
    data = json.loads((tmp_path / "out" / "report.json").read_text())
    assert (data["in_use"], data["without_sharing"], data["saved"]) == (2, 3, 1)
    assert [share["status"] for share in data["shares"]] == ["burst", "breach"]
    with (tmp_path / "out" / "shares.csv").open() as rows:
        assert [row["status"] for row in csv.DictReader(rows)] == ["burst", "breach"]
    assert not list((tmp_path / "out").glob(".*"))  # no partial file left behind


def test_without_usage_the_page_says_not_measured_and_invents_nothing(tmp_path: Path) -> None:
    figures = analysis.figures([node("n1")], [pod("a", share=("0",))], analysis.Usage())
    render.write(tmp_path, figures)
    page = (tmp_path / "index.html").read_text()
    assert "not measured" in page
    assert json.loads((tmp_path / "report.json").read_text())["shares"][0]["used_mib"] is None


def test_an_empty_cluster_still_renders(tmp_path: Path) -> None:
    render.write(tmp_path, analysis.figures([], [], analysis.Usage()))
    assert "No bound pod holds a GPU" in (tmp_path / "index.html").read_text()


def test_chromium_shows_the_tables_and_every_chart(tmp_path: Path) -> None:
    render.write(tmp_path / "out", example())
    dom = check_page(tmp_path / "out" / "index.html", tmp_path / "profile", tables=TABLES, images=3)
    assert "ml/b" in dom and "breach" in dom


def test_a_gpu_name_a_tenant_wrote_opens_as_text_in_a_spreadsheet_and_draws_as_text(tmp_path: Path) -> None:
    """On a cluster without gpufrac's webhook a tenant writes its own `gpus.devices`: a formula must not run
    in shares.csv or gpus.csv, and a `$` must not be read as TeX by the charts (an invalid one aborted the
    report with a traceback)."""
    formula, tex = '=HYPERLINK("http://x")', r"$\undefinedcommand$"
    pods = [pod("a", share=(formula,)), pod("b", share=(tex,), node="n2")]
    render.write(tmp_path, analysis.figures([node("n1"), node("n2")], pods, analysis.Usage()))
    with (tmp_path / "shares.csv").open() as rows:
        assert [row["gpu"] for row in csv.DictReader(rows)] == [f"'{formula}", tex]
    with (tmp_path / "gpus.csv").open() as rows:
        assert [row["gpu"] for row in csv.DictReader(rows)] == [f"'{formula}", tex]
    assert render.inert("-1+1") == "'-1+1" and render.inert("4096") == "4096"


def test_a_share_larger_than_any_gpu_is_set_aside_and_the_report_still_renders(tmp_path: Path) -> None:
    """A bound pod's gpu-memory.request and .limit are the scheduler's to write, but anyone who may annotate
    a pod can write 10^23 MiB there: the memory chart took it and matplotlib overflowed (a traceback, and no
    report written)."""
    forged = pod("forged", share=("0",), request_mib=10**23, limit_mib=10**23)
    figures = analysis.figures([node("n1")], [forged, pod("ok", share=("1",))], analysis.Usage())
    assert [name for name, _ in figures.skipped] == ["ml/forged"]
    assert "larger than any GPU" in figures.skipped[0][1]
    assert "memory.png" in [path.name for path in render.write(tmp_path / "out", figures)]
