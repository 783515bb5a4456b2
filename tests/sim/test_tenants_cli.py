"""`gpufrac simulate --tenants` as a user runs it: a subprocess on a tiny trace, its JSON, its report files,
its table, and its one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .test_cli import assert_one_line_error, simulate

REPORT_FILES = ["allocation.png", "evictions.png", "gangs.png", "reclaim.png", "report.html", "results.json"]
QUEUE_KEYS = {
    "pods",
    "gangs",
    "never_fit",
    "never_ran",
    "resources",
    "wait_seconds",
    "reclaim_seconds",
    "entitled_wait_seconds",
    "evicted",
    "wasted_gpu_hours",
    "gang_wait_seconds",
    "gang_timeouts",
}
CONFIG = """
[eviction]
minRuntimeSeconds = 60
graceSeconds = 10

[gangs]
fraction = 0.5
size = 2

[[queues]]
name = "a"
traffic = [0, 1]
resources.gpus = {quota = 1}

[[queues]]
name = "b"
traffic = [1, 0]
"""


@pytest.fixture
def tiny(tmp_path: Path) -> tuple[Path, Path, Path]:
    """Two GPUs; b's four pods come first and borrow both, a's two come when b's have run long enough."""
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,32000,65536,2,T4\n")
    pods = tmp_path / "pods.csv"
    rows = [f"b{i},1000,1024,1,1000,0,5000" for i in range(2)] + [
        f"b{i},1000,1024,1,500,1,5000" for i in (2, 3)
    ]
    rows += [f"a{i},1000,1024,1,1000,{1000 + i},1100" for i in range(4)]
    pods.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time,deletion_time\n" + "\n".join(rows)
    )
    config = tmp_path / "tenants.toml"
    config.write_text(CONFIG)
    return nodes, pods, config


def test_json_report_files_and_table(tiny: tuple[Path, Path, Path], tmp_path: Path) -> None:
    nodes, pods, config = tiny
    out = tmp_path / "report"
    args = ("--nodes", nodes, "--pods", pods, "--tenants", config, "--seeds", "3")
    result = simulate(*args, "--format", "json", "--out", out)
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert (document["trace"], document["seed"], document["policy"], document["gpus"]) == (
        "pods",
        3,
        "binpack",
        2,
    )
    assert list(document["queues"]) == ["a", "b"]
    assert all(set(row) == QUEUE_KEYS for row in document["queues"].values())
    assert document["queues"]["b"]["evicted"] > 0 and document["queues"]["a"]["reclaim_seconds"]["count"] > 0
    assert sorted(path.name for path in out.iterdir()) == REPORT_FILES
    assert json.loads((out / "results.json").read_text()) == document
    for png in REPORT_FILES[:4]:
        assert (out / png).read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    page = (out / "report.html").read_text()
    assert page.count("<img") == 4 and "reclaim" in page
    table = simulate(*args)
    assert table.returncode == 0, table.stderr
    assert "pods: 2 queues on 2 GPUs (1 node), seed 3, binpack" in table.stdout
    assert "held/fair: what the queue held over its fair share" in " ".join(table.stdout.split())


def test_the_same_seed_gives_the_same_figures(tiny: tuple[Path, Path, Path]) -> None:
    nodes, pods, config = tiny
    runs = [
        simulate("--nodes", nodes, "--pods", pods, "--tenants", config, "--format", "json").stdout
        for _ in range(2)
    ]
    assert runs[0] == runs[1] and json.loads(runs[0])["seed"] == 42


@pytest.mark.parametrize(
    "extra, fragments",
    [
        (("--inflation", "2"), ["--inflation: not read with --tenants"]),
        (("--move-budget", "5"), ["--move-budget: not read with --tenants"]),
        (("--whole-gpu-reserve", "18"), ["--whole-gpu-reserve: not read with --tenants"]),
        (("--seeds", "1-2"), ["--seeds: --tenants replays one at a time", "--seeds 42"]),
        (("--policies", "fgd,bestfit"), ["--policies: --tenants replays one at a time"]),
    ],
)
def test_options_of_the_sweep_are_refused(
    tiny: tuple[Path, Path, Path], extra: tuple[str, ...], fragments: list[str]
) -> None:
    nodes, pods, config = tiny
    assert_one_line_error(simulate("--nodes", nodes, "--pods", pods, "--tenants", config, *extra), *fragments)


def test_a_bad_config_is_one_line(tiny: tuple[Path, Path, Path]) -> None:
    nodes, pods, config = tiny
    config.write_text('[[queues]]\nname = "a"\nresources.gpus = {quota = -2}\n')
    result = simulate("--nodes", nodes, "--pods", pods, "--tenants", config)
    assert_one_line_error(result, str(config), "queues.a.resources.gpus.quota", "must be 0 or more")
    assert_one_line_error(
        simulate("--tenants", config.with_name("missing.toml")), "missing.toml: no such file"
    )
