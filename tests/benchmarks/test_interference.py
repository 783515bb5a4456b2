"""benchmarks/interference.py on its CPU path: the report's shape, whatever the machine's speed."""

from __future__ import annotations

import functools
import json
from pathlib import Path

from tests.benchmarks import scripts

run = functools.partial(scripts.run, "interference.py")


def test_the_cpu_path_reports_each_client_the_total_and_the_ratio(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    done = run(
        "--device",
        "cpu",
        "--clients",
        "2",
        "--seconds",
        "0.5",
        "--size",
        "64",
        "--memory-over",
        "--out",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert (report["device"], report["library"], report["clients"]) == ("cpu", "numpy", 2)
    sliced = report["modes"]["time-slicing"]
    assert len(sliced["clients"]) == 2
    assert all(
        value > 0
        for value in [sliced["alone"], *sliced["clients"], sliced["total"], sliced["ratio_to_alone"]]
    )
    assert sliced["total"] == sum(sliced["clients"])
    assert report["modes"]["sm-sharing"] == {"skipped": "sm-sharing needs MPS on an NVIDIA GPU"}
    assert report["memory_over"] == {"skipped": "needs MPS on an NVIDIA GPU"}
    assert "time-slicing" in done.stdout and "says nothing about GPUs" in done.stdout


def test_bad_flags_are_one_line_and_exit_2() -> None:
    done = run("--device", "cpu", "--modes", "mig")
    assert done.returncode == 2
    assert done.stderr.strip() == "interference: --modes: unknown ['mig']; use time-slicing,sm-sharing"
