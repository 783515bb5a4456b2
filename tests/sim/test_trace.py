"""The openb CSV loader: the bundled trace as published, and every malformed file as a one-line UserError."""

from __future__ import annotations

from collections import Counter
from fractions import Fraction
from pathlib import Path

import pytest

from gpufrac.cluster.model import PodDemand
from gpufrac.contract.model import Portion, ShareRequest, WholeGpuRequest
from gpufrac.errors import UserError
from gpufrac.sim import replay, trace

NODES_HEADER = "sn,cpu_milli,memory_mib,gpu,model"
PODS_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,creation_time,deletion_time"


@pytest.fixture(scope="module")
def bundled() -> trace.Trace:
    return trace.load()


def test_the_bundled_trace_is_the_published_openb_default(bundled: trace.Trace) -> None:
    assert (len(bundled.nodes), bundled.gpus, len(bundled.pods)) == (1213, 6212, 8152)
    models = Counter(gpu.model for node in bundled.nodes for gpu in node.gpus)
    assert models == {"G2": 4392, "T4": 842, "G3": 312, "P100": 265, "V100M32": 204, "V100M16": 195, "A10": 2}
    assert sum(node.cpu_milli for node in bundled.nodes) == 107_018_000
    kinds = Counter(
        "cpu"
        if pod.num_gpu == 0
        else "share"
        if pod.gpu_milli < 1000
        else "one"
        if pod.num_gpu == 1
        else "many"
        for pod in bundled.pods
    )
    assert kinds == {"cpu": 1088, "share": 3078, "one": 3911, "many": 75}
    assert bundled.name == "openb default (bundled)"
    first = bundled.nodes[0]
    assert first.name == "openb-node-0000" and first.model == "P100" and first.gpus[0].memory_mib == 16_000


def test_gpus_are_sized_by_model_at_1000_mib_per_gb(bundled: trace.Trace) -> None:
    sizes = {gpu.model: gpu.memory_mib for node in bundled.nodes for gpu in node.gpus}
    assert sizes == {model: 1000 * gb for model, gb in trace.MODEL_MEMORY_GB.items()}


def test_trace_pods_become_engine_demands() -> None:
    whole = trace.TracePod("w", 4_000, 1_024, 2, 1000, frozenset({"T4"}))
    share = trace.TracePod("s", 1_000, 512, 1, 250, None)
    cpu = trace.TracePod("c", 500, 256, 0, 0, None)
    assert whole.demand() == PodDemand(
        "w", cpu_milli=4_000, memory_mib=1_024, whole=(WholeGpuRequest("main", 2),), models=frozenset({"T4"})
    )
    quarter = Portion(Fraction(1, 4))
    assert share.demand() == PodDemand(
        "s", cpu_milli=1_000, memory_mib=512, shares=(ShareRequest("main", quarter, quarter),)
    )
    assert cpu.demand() == PodDemand("c", cpu_milli=500, memory_mib=256)
    assert (whole.gpu_demand_milli, share.gpu_demand_milli, cpu.gpu_demand_milli) == (2000, 250, 0)


def write(path: Path, *lines: str) -> Path:
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


def test_a_small_trace_loads_with_optional_columns(tmp_path: Path) -> None:
    nodes = write(tmp_path / "nodes.csv", NODES_HEADER, "n0,32000,65536,2,V100M32", "cpu,8000,16384,0,")
    pods = write(
        tmp_path / "pods.csv",
        PODS_HEADER,
        "p0,1000,1024,1,500,V100M32|T4,10,20.5",
        "p1,1000,1024,0,750,,,",  # a CPU-only pod's gpu_milli is ignored
    )
    loaded = trace.load(nodes, pods)
    assert loaded.name == "pods" and loaded.gpus == 2
    assert loaded.nodes[0].gpus[1].memory_mib == 32_000 and loaded.nodes[1].gpus == ()
    p0, p1 = loaded.pods
    assert p0.gpu_spec == frozenset({"V100M32", "T4"})
    assert (p0.creation_time, p0.deletion_time) == (10.0, 20.5)
    assert (p1.gpu_milli, p1.gpu_spec, p1.creation_time) == (0, None, None)


def test_only_the_pods_given_uses_the_bundled_nodes(tmp_path: Path, bundled: trace.Trace) -> None:
    pods = write(tmp_path / "mine.csv", PODS_HEADER, "p,1000,1024,1,500,,,")
    loaded = trace.load(pods=pods)
    assert loaded.nodes == bundled.nodes and len(loaded.pods) == 1 and loaded.name == "mine"


def test_gpu_spec_models_are_stripped_as_node_models_are(tmp_path: Path) -> None:
    """`V100M32 ` (a space left by a spreadsheet) named no model, so every such pod was dropped, silently."""
    nodes = write(tmp_path / "nodes.csv", NODES_HEADER, "n0,32000,65536,2, V100M32 ")
    pods = write(
        tmp_path / "pods.csv", PODS_HEADER, "p0,1000,1024,1,500,V100M32 ,,", "p1,1000,1024,1,500, | ,,"
    )
    loaded = trace.load(nodes, pods)
    assert [pod.gpu_spec for pod in loaded.pods] == [frozenset({"V100M32"}), None]  # only spaces: any model
    run = replay.replay(loaded, policy="bestfit", seed=1, inflation=0.5)
    assert (run.failed_pods, run.allocation[50]) == (0, 50.0)


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        (
            "v100m32",
            ':3: column gpu_spec="v100m32": names no GPU model of the node list (did you mean V100M32?)',
        ),
        (
            "A100|H100",
            ':3: column gpu_spec="A100|H100": names no GPU model of the node list: give one or more '
            "of T4, V100M32 separated by |, or leave it empty for any model",
        ),
    ],
)
def test_a_gpu_spec_naming_no_model_of_the_node_list_is_refused(tmp_path: Path, spec: str, says: str) -> None:
    nodes = write(tmp_path / "nodes.csv", NODES_HEADER, "n0,32000,65536,2,V100M32", "n1,32000,65536,1,T4")
    pods = write(
        tmp_path / "pods.csv", PODS_HEADER, "p0,1000,1024,1,500,T4,,", f"p1,1000,1024,1,500,{spec},,"
    )
    with pytest.raises(UserError) as raised:
        trace.load(nodes, pods)
    assert str(raised.value).startswith(f"{pods}{says}")
    # One model the cluster has is enough: the pod can run there. A CPU-only pod's gpu_spec is never read.
    write(pods, PODS_HEADER, f"p0,1000,1024,1,500,{spec}|T4,,", f"p1,1000,1024,0,0,{spec},,")
    assert len(trace.load(nodes, pods).pods) == 2


MALFORMED_PODS = [
    pytest.param(
        ["name,cpu_milli,memory_mib,num_gpu", "p,1,1,1"],
        ":1:",
        "gpu_milli",
        "missing column",
        id="missing-column",
    ),
    pytest.param(
        [PODS_HEADER, "p,1,1,1,500,,,", "q,2.5,1,1,500,,,"], ":3:", "cpu_milli", "whole number", id="float"
    ),
    pytest.param([PODS_HEADER, "p,abc,1,1,500,,,"], ":2:", "cpu_milli", "whole number", id="not-a-number"),
    pytest.param([PODS_HEADER, "p,1,-5,1,500,,,"], ":2:", "memory_mib", "negative", id="negative"),
    pytest.param([PODS_HEADER, "p,1,1,1,0,,,"], ":2:", "gpu_milli", "between 1 and 1000", id="zero-share"),
    pytest.param(
        [PODS_HEADER, "p,1,1,1,1001,,,"], ":2:", "gpu_milli", "between 1 and 1000", id="above-one-gpu"
    ),
    pytest.param(
        [PODS_HEADER, f"p,{10**30},1,1,500,,,"], ":2:", "cpu_milli", "at most", id="cpu-beyond-int64"
    ),
    pytest.param(
        [PODS_HEADER, "p,1,1,1000000000,1000,,,"], ":2:", "num_gpu", "at most", id="gpus-beyond-a-node"
    ),
    pytest.param([PODS_HEADER, " ,1,1,1,500,,,"], ":2:", "name", "empty", id="empty-name"),
    pytest.param([PODS_HEADER, "p,1,1,1,500,,soon,"], ":2:", "creation_time", "seconds", id="bad-time"),
    pytest.param(
        [PODS_HEADER, "p,1,1,1,500,,,-1"], ":2:", "deletion_time", "not negative", id="negative-time"
    ),
    pytest.param([PODS_HEADER, "p,1,1,1,500,,,nan"], ":2:", "deletion_time", "not negative", id="nan-time"),
    pytest.param(
        [PODS_HEADER, "p,1,1,1,500,,,", "q,1,1,1,500,,,,extra"], ":3:", None, "fields", id="extra-field"
    ),
    pytest.param([PODS_HEADER, "p,1,1,1"], ":2:", None, "fields", id="missing-field"),
    pytest.param(
        [PODS_HEADER, "p,1,1,1,500,,,", "q,1,1,1,500,,,", " p ,1,1,1,500,,,"],
        ":4:",
        "name",
        "line 2 has this name already",
        id="repeated-name",
    ),
    pytest.param([], ":1:", "name", "missing column", id="empty-file"),
    pytest.param([PODS_HEADER], None, None, "no pods", id="header-only"),
]


@pytest.mark.parametrize(("lines", "line", "column", "rule"), MALFORMED_PODS)
def test_a_malformed_pod_list_names_file_line_and_column(
    tmp_path: Path, lines: list[str], line: str | None, column: str | None, rule: str
) -> None:
    path = write(tmp_path / "pods.csv", *lines)
    with pytest.raises(UserError) as raised:
        trace.load_pods(path)
    message = str(raised.value)
    assert message.startswith(str(path))
    assert "\n" not in message and raised.value.exit_code == 2
    assert rule in message
    if line is not None:
        assert message.startswith(f"{path}{line}")
    if column is not None:
        assert column in message


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        ([NODES_HEADER, "n,1000,1000,2,"], ':2: column model="": a node with GPUs needs a model'),
        ([NODES_HEADER, "n,1000,1000,two,T4"], ':2: column gpu="two": must be a whole number'),
        ([NODES_HEADER, "n,1000,-1,2,T4"], ':2: column memory_mib="-1": must not be negative'),
        # A node of a hundred million GPUs would be built GPU by GPU; a number past int64 breaks the arrays.
        ([NODES_HEADER, "n,1000,1000,100000000,T4"], ':2: column gpu="100000000": must be at most 64'),
        ([NODES_HEADER, f"n,{10**30},1000,2,T4"], f':2: column cpu_milli="{10**30}": must be at most'),
        (["sn,cpu_milli,gpu", "n,1,1"], ":1: missing column(s) memory_mib, model"),
        ([NODES_HEADER], ": no nodes"),
        (
            [NODES_HEADER, "n,1000,1000,2,T4", "n,1000,1000,2,T4"],
            ':3: column sn="n": line 2 has this name already; every row needs its own',
        ),
    ],
)
def test_a_malformed_node_list_names_file_line_and_column(
    tmp_path: Path, lines: list[str], expected: str
) -> None:
    path = write(tmp_path / "nodes.csv", *lines)
    with pytest.raises(UserError) as raised:
        trace.load_nodes(path)
    assert str(raised.value).startswith(f"{path}{expected}")


def test_a_missing_or_unreadable_file_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"nope\.csv: no such file"):
        trace.load(tmp_path / "nope.csv", tmp_path / "nope.csv")
    binary = tmp_path / "binary.csv"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(UserError, match=r"binary\.csv: not a UTF-8 text file"):
        trace.load_pods(binary)
    with pytest.raises(UserError, match="is a folder; pass a file"):
        trace.load_pods(tmp_path)
    with pytest.raises(UserError, match="more than 64 MiB"):
        trace.load_pods(Path("/dev/zero"))
    (tmp_path / "wide.csv").write_text("name," + "x" * 200_000 + "\n")
    with pytest.raises(UserError, match="cannot read it as CSV"):
        trace.load_pods(tmp_path / "wide.csv")


def test_a_column_named_twice_in_the_header_is_refused(tmp_path: Path) -> None:
    """csv.DictReader keeps the last of two columns of one name: `cpu_milli` given twice read the second
    (here 5 milli-CPU instead of 1000) with no word, so a replay ran on numbers the file's first column
    did not say. Columns of no name (a spreadsheet's trailing commas) are not read and stay allowed."""
    pods = write(
        tmp_path / "pods.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli,cpu_milli", "p,1000,1,1,500,5"
    )
    with pytest.raises(UserError) as raised:
        trace.load_pods(pods)
    assert str(raised.value).startswith(f"{pods}:1: column(s) cpu_milli named more than once")
    write(pods, "name,cpu_milli,memory_mib,num_gpu,gpu_milli,,", "p,1000,1,1,500,,")
    assert [pod.cpu_milli for pod in trace.load_pods(pods)] == [1000]


def test_spaces_around_header_names_and_rows_of_empty_cells_are_read_as_spreadsheets_mean_them(
    tmp_path: Path,
) -> None:
    """Cells are stripped, so `p, 1000` read, but a header `name, cpu_milli` said cpu_milli was missing; and a
    spreadsheet's trailing rows of nothing but commas (or spaces) were `expected 5 fields` or `name must not
    be empty`, though they hold no pod."""
    pods = write(
        tmp_path / "pods.csv",
        "name, cpu_milli ,memory_mib,num_gpu,gpu_milli",
        "p, 1000,1,1,500",
        ",,,,",
        "  ",
    )
    assert [(pod.name, pod.cpu_milli) for pod in trace.load_pods(pods)] == [("p", 1000)]
