"""benchmarks/scale.py at a tiny size: the report's shape and bookkeeping, whatever the machine's speed."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from tests.benchmarks import scripts

run = functools.partial(scripts.run, "scale.py")


@pytest.mark.parametrize("decisions", ["5", "0"])
def test_a_tiny_cluster_reports_every_policy_and_a_relist_that_binds_what_the_fill_placed(
    tmp_path: Path, decisions: str
) -> None:
    out = tmp_path / "scale.json"
    done = run(
        *("--nodes", "20", "--pods", "100", "--policies", "fgd,spread"),
        *("--decisions", decisions, "--out", str(out)),
    )
    assert done.returncode == 0, done.stderr
    assert "decision time per policy" in done.stdout
    report = json.loads(out.read_text())
    assert (report["nodes"], report["pods"]) == (20, 100)
    assert report["gpus"] >= 20
    expected = {"fgd", "spread", "binpack (full fill)"} if decisions != "0" else {"binpack", "fgd", "spread"}
    assert set(report["policies"]) == expected
    for name, row in report["policies"].items():
        assert row["placed"] + row["failed"] == row["decisions"] + row["cold_decisions"], name
        assert row["cold_decisions"] == 1  # each policy is built once, as a scheduler builds it
        assert row["wall_ms"]["p50"] <= row["wall_ms"]["p99"] <= row["wall_ms"]["max"]
        assert row["cpu_ms"]["p50"] <= row["cpu_ms"]["p99"] <= row["cpu_ms"]["max"]
    fill = report["policies"]["binpack (full fill)" if decisions != "0" else "binpack"]
    relisted = report["relist"]
    assert (relisted["nodes"], relisted["pods_listed"]) == (20, 100)
    assert relisted["pods_bound"] == fill["placed"] > 0  # every placement read back from its annotations
    assert relisted["problems"] == 0
    assert relisted["rss_mib"] > 0 and relisted["wall_s"] >= 0
    assert report["fill_levels"]["100"] > 0


def test_an_unknown_policy_is_refused() -> None:
    done = run("--nodes", "2", "--pods", "2", "--policies", "nope")
    assert done.returncode != 0
    assert "unknown policy nope" in done.stderr
