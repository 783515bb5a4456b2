"""`gpufrac plan` as a user runs it: a subprocess, its JSON, its files, and its one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpufrac.plan import planner, report

from . import traces
from .traces import HALVES, whole


def gpufrac(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpufrac.cli", "plan", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        check=False,
    )


def test_json_and_report_files(tmp_path: Path) -> None:
    nodes, pods = traces.write(tmp_path, HALVES, nodes=6)
    out = tmp_path / "report"
    done = gpufrac(
        "--nodes", nodes, "--pods", pods, "--format", "json", "--out", out, "--workers", "2",
        "--price-per-gpu-hour", "2.5", "--replicas", "2", "--fault-domains", "1",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    rows = summary["strategies"]
    assert tuple(rows) == planner.ORDER
    needed = {name: row["gpus_needed"] for name, row in rows.items()}
    assert needed == {
        "whole-gpu": 5,
        "time-slicing-replicas": 3,
        "mig": 5,
        "fractions-time-slicing": 3,
        "fractions-sm-sharing": 3,
        "fractions-mixed": 3,
    }
    assert rows["whole-gpu"]["cost_per_month"] == 5 * 2.5 * 730
    assert rows["whole-gpu"]["timed"]["peak_gpus"] == 5  # every pod runs from 0 to 100
    assert summary["assumptions"][0].startswith("The trace gives no GPU memory sizes")
    assert sorted(path.name for path in out.iterdir()) == [
        "allocation-over-time.png",
        "gpus-needed.png",
        "plan.html",
        "plan.json",
    ]
    assert json.loads((out / "plan.json").read_text()) == summary
    page = (out / "plan.html").read_text()
    assert "Assumptions" in page and "portions stand for memory" in page and "data:image/png;base64," in page
    # Two replicas oversubscribe no pod here and tie with the fractions; the first in order is named.
    assert "time-slicing-replicas needs the fewest GPUs: 3, about 5,475 a month" in page


def test_the_headline_sets_apart_a_strategy_that_oversubscribes(tmp_path: Path) -> None:
    # Four replicas: 2 GPUs, but each half-GPU pod gets a quarter; fractions need 3, whole GPUs 5.
    summary = traces.plan(traces.write(tmp_path, HALVES), replicas=4, timed=False)
    assert report.headline(summary) == (
        "To run all 6 pods at once, each with the memory it asks for, fractions-time-slicing needs the "
        "fewest GPUs: 3, about 4,380 a month. Whole GPUs need 5 (7,300 a month): 2 GPUs (40.0%) more. "
        "time-slicing-replicas needs 2 only by giving 4 pods less memory than they ask for, which nothing "
        "enforces."
    )


def test_the_table_names_every_strategy(tmp_path: Path) -> None:
    nodes, pods = traces.write(tmp_path, HALVES, nodes=6)
    done = gpufrac("--nodes", nodes, "--pods", pods, "--strategies", "whole-gpu,mig", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "whole-gpu" in done.stdout and "mig" in done.stdout and "fractions" not in done.stdout
    assert "GPUs" in done.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--strategies", "whole-gpu,spot"], 'gpufrac: --strategies "whole-gpu,spot": unknown spot; known: '),
        (["--gpu-model", "B300"], 'gpufrac: --gpu-model "B300": unknown; known: A10, A100-40GB'),
        (["--trusted-share", "1.5"], "gpufrac: --trusted-share 1.5: must be a portion between 0 and 1"),
        (["--replicas", "0"], "gpufrac: --replicas 0: must be 1 to 1000 replicas per GPU"),
        (
            ["--replicas", "99999999999999999999"],
            "gpufrac: --replicas 99999999999999999999: must be 1 to 1000",
        ),
        (["--price-per-gpu-hour", "-1"], "gpufrac: --price-per-gpu-hour -1.0: must be a price, 0 or more"),
        (["--policy", "random"], 'gpufrac: --policy "random": the planner needs a deterministic policy'),
        (["--seeds", "9-1"], "gpufrac: --seeds"),
        (["--reference-gb", "0"], "gpufrac: --reference-gb 0.0: must be a positive number of GB"),
        # Finite, yet a monthly cost of Infinity (not JSON) and MiB past any int: refused like the rest.
        (
            ["--price-per-gpu-hour", "1e308"],
            "gpufrac: --price-per-gpu-hour 1e+308: must be a price, 0 or more",
        ),
        (["--reference-gb", "1e308"], "gpufrac: --reference-gb 1e+308: must be a positive number of GB"),
    ],
)
def test_bad_options_get_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    nodes, pods = traces.write(tmp_path, HALVES)
    done = gpufrac("--nodes", nodes, "--pods", pods, *args, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.startswith(message), done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_a_trace_without_times_is_refused_for_the_timed_replay(tmp_path: Path) -> None:
    nodes, pods = traces.write(tmp_path, [whole("a", created=None, deleted=None)])
    done = gpufrac("--nodes", nodes, "--pods", pods, cwd=tmp_path)
    assert done.returncode == 2
    assert "pod a has no creation_time" in done.stderr and "--no-timed" in done.stderr
    assert "Traceback" not in done.stderr
    done = gpufrac("--nodes", nodes, "--pods", pods, "--no-timed", "--format", "json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "timed" not in json.loads(done.stdout)["strategies"]["whole-gpu"]


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    done = gpufrac("--pods", tmp_path / "absent.csv", cwd=tmp_path)
    assert done.returncode == 2 and "absent.csv: no such file" in done.stderr


def test_fractions_mixed_counts_what_keeping_tenants_apart_costs(tmp_path: Path) -> None:
    """sm-sharing tenants never share a GPU: with every pod trusted and each its own tenant, the halves
    that one tenant could stack two to a GPU need a GPU each."""
    nodes, pods = traces.write(tmp_path, HALVES, nodes=6)

    def needed(domains: int) -> int:
        done = gpufrac(
            "--nodes", nodes, "--pods", pods, "--format", "json", "--strategies", "fractions-mixed",
            "--trusted-share", "1", "--fault-domains", str(domains), "--no-timed", cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return int(json.loads(done.stdout)["strategies"]["fractions-mixed"]["gpus_needed"])

    # Four halves and one whole GPU: two GPUs of halves for one tenant, four for four.
    assert (needed(1), needed(10_000)) == (3, 5)
