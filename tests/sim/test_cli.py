"""`gpufrac simulate` as a user runs it: a subprocess on a tiny trace, its JSON, its report, its errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpufrac.errors import UserError
from gpufrac.sim import experiment
from gpufrac.sim import simulate as simulation

from .json_contract import POLICY_KEYS, READ_ELSEWHERE_KEY, SUMMARY_KEYS

# What `--out` holds, for one trace or several.
REPORT_FILES = ["allocation.png", "curves.csv", "fragmentation.png", "report.html", "results.json"]


@pytest.fixture
def tiny(tmp_path: Path) -> tuple[Path, Path]:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,32000,65536,2,T4\nn1,32000,65536,1,T4\n")
    pods = tmp_path / "pods.csv"
    pods.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
        "p0,1000,1024,1,500\np1,1000,1024,1,1000\np2,1000,1024,0,0\np3,1000,1024,1,250\n"
    )
    return nodes, pods


def simulate(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpufrac.cli", "simulate", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("gpufrac: ")
    for fragment in fragments:
        assert fragment in lines[0]


def test_json_output_and_report_files(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    nodes, pods = tiny
    out = tmp_path / "report"
    args = ("--policies", "fgd,bestfit,spread", "--seeds", "1-2", "--workers", "1", "--inflation", "1.5")
    result = simulate("--nodes", nodes, "--pods", pods, *args, "--format", "json", "--out", out)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert set(summary) == SUMMARY_KEYS | {READ_ELSEWHERE_KEY}
    assert (summary["trace"], summary["gpus"], summary["seeds"]) == ("pods", 3, [1, 2])
    assert summary["inflation"] == 1.5
    # Three GPUs take steps of 8-33%: seed 2's arrivals jump from 92% to 125%, and are read at 92%.
    assert summary[READ_ELSEWHERE_KEY] == [92, 100]
    assert list(summary["policies"]) == ["fgd", "bestfit", "spread"]
    for row in summary["policies"].values():
        assert set(row) - {"published_at_100"} == POLICY_KEYS
    assert sorted(path.name for path in out.iterdir()) == REPORT_FILES
    assert json.loads((out / "results.json").read_text()) == summary
    for png in ("allocation.png", "fragmentation.png"):
        assert (out / png).read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    page = (out / "report.html").read_text()
    assert page.count("<img") == 2 and "data:image/png;base64," in page and "fgd" in page
    assert "<th>published</th>" not in page
    assert "to 1.5&times; the cluster's GPUs" in page  # the inflation the run used, not the default
    assert "allocation at 92-100% arrival (%)" in page and "not at 100% arrival for every run" in page
    curves = (out / "curves.csv").read_text().splitlines()
    assert curves[0] == "policy,seed,arrival_percent,allocation_percent,fragmentation_percent"
    assert {line.split(",")[0] for line in curves[1:]} == {"fgd", "bestfit", "spread"}


@pytest.mark.parametrize(
    ("option", "label", "html", "column"),
    [
        (("--move-budget", "0,5"), "fgd +moves 5", "moves per 100 arrivals", "moves/100"),
        (
            ("--whole-gpu-reserve", "0,50"),
            "fgd +reserve 50%",
            "turned away by the whole-GPU reserve",
            "kept out",
        ),
    ],
)
def test_variants_are_compared_in_the_json_the_table_and_the_report(
    tiny: tuple[Path, Path], tmp_path: Path, option: tuple[str, str], label: str, html: str, column: str
) -> None:
    nodes, pods = tiny
    out = tmp_path / "report"
    args = ("--policies", "fgd", "--seeds", "1", "--workers", "1", *option)
    result = simulate("--nodes", nodes, "--pods", pods, *args, "--format", "json", "--out", out)
    assert result.returncode == 0, result.stderr
    assert list(json.loads(result.stdout)["policies"]) == ["fgd", label]
    assert html in (out / "report.html").read_text()
    table = simulate("--nodes", nodes, "--pods", pods, *args)
    assert table.returncode == 0 and column in table.stdout and label in table.stdout


def test_the_default_table(tiny: tuple[Path, Path]) -> None:
    nodes, pods = tiny
    result = simulate(
        "--nodes", nodes, "--pods", pods, "--policies", "packing", "--seeds", "1", "--workers", "1"
    )
    assert result.returncode == 0, result.stderr
    assert "packing" in result.stdout and "alloc@100%" in result.stdout
    assert "not at 100% arrival" not in result.stdout
    assert "paper" not in result.stdout  # the paper's figures are the default trace's, not this one's


def test_figures_not_read_at_100_percent_arrival_say_where_they_were_read(
    tiny: tuple[Path, Path], tmp_path: Path
) -> None:
    """At --inflation 0.5 the runs end at 58%: the column said alloc@100% and showed the 58% value, which
    read as a policy leaving 42% of the cluster unallocated."""
    nodes, pods = tiny
    out = tmp_path / "report"
    args = ("--nodes", nodes, "--pods", pods, "--policies", "fgd", "--seeds", "1", "--workers", "1")
    table = simulate(*args, "--inflation", "0.5")
    assert table.returncode == 0, table.stderr
    words = " ".join(table.stdout.split())  # the caption wraps with the table's width
    assert "alloc@58%" in words and "alloc@100%" not in words
    assert "not at 100% arrival: at inflation 0.5 the runs end at 58% of the cluster's GPUs" in words
    result = simulate(*args, "--inflation", "0.5", "--format", "json", "--out", out)
    summary = json.loads(result.stdout)
    assert (summary["inflation"], summary[READ_ELSEWHERE_KEY]) == (0.5, [58])
    assert json.loads((out / "results.json").read_text()) == summary
    page = (out / "report.html").read_text()
    assert "allocation at 58% arrival (%)" in page and "Upper bound at 58% arrival" in page
    assert "at inflation 0.5 the runs end at 58%" in page
    # Seed 3's arrivals jump from 92% to 108%: read at 92%, the nearest, and said so.
    words = " ".join(simulate(*args[:-3], "3", "--workers", "1").stdout.split())
    assert "alloc@92%" in words and "read at 92%, the point nearest 100% that each run reached" in words


def test_a_broken_csv_is_one_line_naming_file_and_line(tiny: tuple[Path, Path]) -> None:
    nodes, pods = tiny
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,1024,1,500\np1,lots,1024,1,500\n")
    result = simulate("--nodes", nodes, "--pods", pods, "--seeds", "1", "--workers", "1")
    assert_one_line_error(result, f"{pods}:3:", "cpu_milli")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--policies", "fgd,nope"), "unknown nope"),
        (("--seeds", "ten"), '--seeds "ten"'),
        (("--seeds", "9-1"), "runs backwards"),
        (("--inflation", "0"), "--inflation"),
        (("--workers", "-1"), "--workers"),
        (("--workers", "100000"), "--workers 100000: at most"),
        (("--move-budget", ",".join(map(str, range(11)))), "11 values, at most 10"),
        (("--move-budget", "lots"), "--move-budget"),
        (("--whole-gpu-reserve", "101"), "--whole-gpu-reserve"),
        (("--whole-gpu-reserve", "a lot"), "percents of the cluster's GPUs"),
        (("--move-budget", "0,1,2,3", "--whole-gpu-reserve", "0,5,10"), "4 x 3 variants, at most 10"),
        # An empty value (an unset variable in a script) is not the default: it must not run the sweep.
        (("--policies", ""), "none given"),
        (("--seeds", ""), '--seeds ""'),
        (("--move-budget", ""), '--move-budget ""'),
        (("--whole-gpu-reserve", ""), '--whole-gpu-reserve ""'),
        (("--out", ""), "--out': empty"),
    ],
)
def test_bad_options_exit_2_with_one_line(tiny: tuple[Path, Path], args: tuple[str, ...], says: str) -> None:
    nodes, pods = tiny
    assert_one_line_error(simulate("--nodes", nodes, "--pods", pods, *args), says)


@pytest.mark.parametrize("where", ["a-file", "a-file/report"])
def test_an_out_that_cannot_be_a_folder_is_refused_before_the_replay(
    tiny: tuple[Path, Path], tmp_path: Path, where: str
) -> None:
    """Refused up front, not after the replay (which may have taken an hour): a line of its own."""
    nodes, pods = tiny
    (tmp_path / "a-file").write_text("kept\n")
    result = simulate("--nodes", nodes, "--pods", pods, "--seeds", "1", "--out", tmp_path / where)
    assert_one_line_error(result, f"--out {tmp_path / where}", "not a folder")
    assert (tmp_path / "a-file").read_text() == "kept\n"


def test_a_report_that_cannot_be_written_leaves_no_part_of_it(
    tiny: tuple[Path, Path], tmp_path: Path
) -> None:
    """A folder where report.html goes fails the last file: the others must not be left looking whole."""
    nodes, pods = tiny
    out = tmp_path / "report"
    (out / "report.html").mkdir(parents=True)
    result = simulate("--nodes", nodes, "--pods", pods, "--seeds", "1", "--workers", "1", "--out", out)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(f"gpufrac: --out {out}: cannot write the report")
    assert [path.name for path in out.iterdir()] == ["report.html"]


def test_a_node_list_without_gpus_is_one_line(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    """Allocation is a share of the cluster's GPUs: with none, the replay divided by zero."""
    _, pods = tiny
    nodes = tmp_path / "cpu-nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,32000,65536,0,\n")
    assert_one_line_error(simulate("--nodes", nodes, "--pods", pods, "--seeds", "1"), "no GPUs")


def test_a_trace_of_tiny_requests_is_refused_before_it_draws_millions_of_pods(tmp_path: Path) -> None:
    """One pod of 1 milli-GPU on openb's 6,212 GPUs: 8 million arrivals (1.9 GB before the first decision)."""
    pods = tmp_path / "one.csv"
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np1,0,0,1,1\n")
    result = simulate("--pods", pods, "--policies", "fgd", "--seeds", "1", "--workers", "1")
    assert_one_line_error(result, "--pods", "--inflation 1.3", "about 8,075,600 pods", "at most 1,000,000")


def test_the_arrivals_are_checked_before_any_replay_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In this process, before the pool: a worker that drew millions of pods would be too late."""
    pods = tmp_path / "mixed.csv"
    cpu_only = "".join(f"c{i},100,100,0,0\n" for i in range(999))
    pods.write_text(f"name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,0,0,1,1\n{cpu_only}")

    def no_replay(*args: object, **kwargs: object) -> None:
        raise AssertionError("a replay started")

    monkeypatch.setattr(experiment, "run_sweep", no_replay)
    with pytest.raises(UserError, match="about 8,075,600,000 pods"):
        simulation.run(
            nodes=None,
            pods=pods,
            traces=None,
            trace_dir=None,
            policies="fgd",
            seeds="1",
            inflation=None,
            workers=1,
            out=None,
            output_format="json",
        )


def test_a_missing_file_exits_2(tmp_path: Path) -> None:
    missing = tmp_path / "absent.csv"
    assert_one_line_error(simulate("--pods", missing, "--seeds", "1"), str(missing), "no such file")


@pytest.fixture
def trace_dir(tiny: tuple[Path, Path], tmp_path: Path) -> Path:
    """Two pod lists under their openb names, beside the node list, as `--traces` reads them."""
    nodes, pods = tiny
    folder = tmp_path / "openb"
    folder.mkdir()
    (folder / "openb_node_list_gpu_node.csv").write_text(nodes.read_text())
    (folder / "openb_pod_list_default.csv").write_text(pods.read_text())
    (folder / "openb_pod_list_cpu050.csv").write_text(pods.read_text().replace("1000,1024", "500,1024"))
    return folder


def test_several_traces_make_one_report(trace_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "report"
    args = ("--traces", "default,cpu050", "--trace-dir", trace_dir, "--policies", "fgd,bestfit")
    result = simulate(*args, "--seeds", "1-2", "--workers", "1", "--format", "json", "--out", out)
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert json.loads((out / "results.json").read_text()) == document
    assert list(document["allocation_at_100"]) == ["default", "cpu050"]  # one row per trace
    for name, row in document["allocation_at_100"].items():
        assert list(row) == ["fgd", "bestfit", "bound"]
        assert row["bound"] >= max(row["fgd"], row["bestfit"])
        assert set(document["traces"][name]) == SUMMARY_KEYS | {READ_ELSEWHERE_KEY}  # seed 2: 92%
    assert document["inflation"] == 1.3
    assert sorted(path.name for path in out.iterdir()) == REPORT_FILES
    page = (out / "report.html").read_text()
    assert page.count("<img") == 2 and page.count("<h2>default</h2>") == page.count("<h2>cpu050</h2>") == 1
    assert "not at 100% arrival (the nearest point their runs reached): default at 92-100%, cpu050 at" in page
    curves = (out / "curves.csv").read_text().splitlines()
    assert curves[0].startswith("trace,policy,seed,")
    assert {line.split(",")[0] for line in curves[1:]} == {"default", "cpu050"}
    table = simulate(*args, "--seeds", "1", "--workers", "1")
    assert table.returncode == 0, table.stderr
    assert "best gap" in table.stdout and "cpu050" in table.stdout


def test_the_single_trace_table_shows_the_bound_and_the_gap(tiny: tuple[Path, Path]) -> None:
    nodes, pods = tiny
    result = simulate("--nodes", nodes, "--pods", pods, "--policies", "fgd", "--seeds", "1", "--workers", "1")
    assert result.returncode == 0, result.stderr
    assert "bound" in result.stdout and "gap" in result.stdout


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--traces", "default,gpushare40"), "openb_pod_list_gpushare40.csv not found in"),
        (("--traces", "all"), "--trace-dir"),
        (("--traces", "../etc"), "expected all, or names such as default,cpu050"),
        (("--traces", ","), "expected all"),
    ],
)
def test_a_missing_or_bad_trace_is_one_line(trace_dir: Path, args: tuple[str, ...], says: str) -> None:
    assert_one_line_error(simulate(*args, "--trace-dir", trace_dir, "--seeds", "1"), says, "--trace")


def test_every_trace_is_read_against_the_node_lists_models(trace_dir: Path) -> None:
    """`--traces` reads the pod lists beside one node list: a gpu_spec no node has is refused there too."""
    bad = trace_dir / "openb_pod_list_cpu050.csv"
    bad.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np0,1000,1024,1,500,t4\n")
    result = simulate("--traces", "default,cpu050", "--trace-dir", trace_dir, "--seeds", "1")
    assert_one_line_error(result, f"{bad}:2: column gpu_spec", "(did you mean T4?)")


def test_without_a_trace_dir_only_the_bundled_default_is_there() -> None:
    assert_one_line_error(simulate("--traces", "cpu050", "--seeds", "1"), "the bundled data", "--trace-dir")


def test_traces_and_pods_exclude_each_other(tiny: tuple[Path, Path]) -> None:
    assert_one_line_error(simulate("--traces", "default", "--pods", tiny[1]), "--traces and --pods")
