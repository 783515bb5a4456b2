"""What the tables and the page say beside a run's numbers: only what holds for that run."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufrac.cluster.model import GpuSpec, NodeSpec
from gpufrac.sim import bound, experiment, replay, report, trace


@pytest.fixture(scope="module")
def tiny() -> trace.Trace:
    nodes = tuple(
        NodeSpec(f"n{i}", 32_000, 65_536, tuple(GpuSpec(g, f"n{i}-{g}", "T4", 16_000) for g in range(2)))
        for i in range(2)
    )
    pods = tuple(trace.TracePod(f"p{i}", 1_000, 1_024, 1, 250, None) for i in range(6))  # reach 100% exactly
    return trace.Trace("tiny", nodes, pods)


def headers(summary: dict[str, object]) -> list[str]:
    return [str(column.header) for column in report.summary_table(summary).columns]


def test_the_paper_column_is_shown_only_beside_the_papers_trace(tiny: trace.Trace, tmp_path: Path) -> None:
    runs = [replay.replay(tiny, policy=policy, seed=1) for policy in ("fgd", "binpack")]
    found = {1: bound.at_report_point(tiny, seed=1, inflation=1.3)}
    summary = experiment.summarize(tiny, [1], runs, found)
    assert "paper" not in headers(summary) and "paper" not in str(report.summary_table(summary).caption)
    report.write(tmp_path / "mine", summary, runs)
    assert "<th>published</th>" not in (tmp_path / "mine" / "report.html").read_text()
    # Where the figures apply (the default trace at 1.3), the column stands, empty for other policies.
    paper = {**summary, "policies": dict(summary["policies"])}
    paper["policies"]["fgd"] = {**paper["policies"]["fgd"], "published_at_100": 95.23}
    assert headers(paper)[:4] == ["policy", "alloc@100%", "std", "paper"]
    report.write(tmp_path / "paper", paper, runs)
    page = (tmp_path / "paper" / "report.html").read_text()
    assert page.count("<th>published</th>") == 1 and "<td>95.23</td>" in page
