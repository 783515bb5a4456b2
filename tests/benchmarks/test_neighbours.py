"""benchmarks/neighbours.py at a tiny size: the report's shape and the nodes each kind of pod may use."""

from __future__ import annotations

import functools
import json
from pathlib import Path

from tests.benchmarks import scripts

run = functools.partial(scripts.run, "neighbours.py")


def test_a_tiny_cluster_reports_each_kind_of_pending_pod(tmp_path: Path) -> None:
    out = tmp_path / "neighbours.json"
    done = run(
        *("--nodes", "6", "--pods", "12", "--apps", "3", "--anti-affine", "--repeat", "1"), "--out", str(out)
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert (report["nodes"], report["pods"]) == (6, 12)
    # App a1's 4 pods run on nodes 1 and 4 (round-robin): its anti-affinity and theirs rule those out.
    assert report["no terms"]["nodes_left"] == 4
    assert report["hostname anti-affinity"]["nodes_left"] == 4
    # Zones hold nodes 0,3 / 1,4 / 2,5: a1's pods are all in zone 1, so the spread rules it out.
    assert report["zone spread"]["nodes_left"] == 4
    assert report["hostname spread"]["nodes_left"] == 4
    assert all(report[name]["cpu_ms"] >= 0 for name in ("no terms", "zone spread"))
