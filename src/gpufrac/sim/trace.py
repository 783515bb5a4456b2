"""Loading traces in the openb CSV format (Alibaba cluster-trace-gpu-v2023) into engine types.

A malformed file is a `UserError` naming the file, the line and the column, so a broken trace never gets
as far as a half-finished replay.
"""

from __future__ import annotations

import csv
import functools
import io
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from importlib import resources
from pathlib import Path
from typing import TypeVar

from gpufrac import reading
from gpufrac.cluster.model import GpuSpec, NodeSpec, PodDemand
from gpufrac.contract.model import Portion, ShareRequest, WholeGpuRequest
from gpufrac.contract.node_inventory import MAX_GPUS_PER_NODE
from gpufrac.errors import UserError

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")

# The trace gives GPU models but no GPU memory. The simulator sizes each GPU at MIB_PER_GB MiB per nominal
# GB, so that a portion in thousandths resolves to whole MiB exactly and MiB accounting equals the paper's
# milli-GPU accounting. G2 and G3 are undisclosed models; their size does not change a portion-only replay.
MIB_PER_GB = 1000
MODEL_MEMORY_GB = {"P100": 16, "T4": 16, "V100M16": 16, "V100M32": 32, "A10": 24, "G2": 32, "G3": 32}
DEFAULT_MEMORY_GB = 16

# The most CPU (milli) or memory (MiB) one row may give: far beyond any machine (a billion cores, an EiB),
# small enough that a 64 MiB trace of them adds up in the engine's int64 and the bound's LP accepts them
# (HiGHS refuses coefficients from 1e15). Python's ints would otherwise carry a typo of thirty digits on.
MAX_AMOUNT = 2**40

# A hundred times the bundled pod list: more is not a trace a replay could finish with.
MAX_TRACE_BYTES = 64 * reading.MIB
BUNDLED_NODES = "openb_node_list_gpu_node.csv"
BUNDLED_PODS = "openb_pod_list_default.csv"


@dataclass(frozen=True, slots=True)
class TracePod:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int  # per GPU, thousandths; 1000 for whole GPUs
    gpu_spec: frozenset[str] | None
    creation_time: float | None = None
    deletion_time: float | None = None

    @property
    def gpu_demand_milli(self) -> int:
        return self.num_gpu * self.gpu_milli

    def demand(self) -> PodDemand:
        """The engine's view: whole GPUs for gpu_milli 1000, otherwise one time-sliced share."""
        whole, shares = _gpu_requests(self.num_gpu, self.gpu_milli)
        return PodDemand(
            self.name,
            cpu_milli=self.cpu_milli,
            memory_mib=self.memory_mib,
            whole=whole,
            shares=shares,
            models=self.gpu_spec,
        )


@functools.lru_cache(maxsize=1024)
def _gpu_requests(
    num_gpu: int, gpu_milli: int
) -> tuple[tuple[WholeGpuRequest, ...], tuple[ShareRequest, ...]]:
    """A trace pod's GPU requests, made once per size: a replay turns thousands of pods of a few dozen sizes
    into demands, and equal requests that are one object compare at once (the memos' shape keys)."""
    if num_gpu and gpu_milli >= 1000:
        return (WholeGpuRequest("main", num_gpu),), ()
    if num_gpu:
        portion = Portion(Fraction(gpu_milli, 1000))
        return (), (ShareRequest("main", request=portion, limit=portion, num_devices=num_gpu),)
    return (), ()


@dataclass(frozen=True, slots=True)
class Trace:
    name: str
    nodes: tuple[NodeSpec, ...]
    pods: tuple[TracePod, ...]

    @property
    def gpus(self) -> int:
        return sum(len(node.gpus) for node in self.nodes)


def load(nodes: Path | None = None, pods: Path | None = None) -> Trace:
    """The given trace files, or the bundled openb default trace for any file not given."""
    data = resources.files("gpufrac") / "data"
    with (
        resources.as_file(data / BUNDLED_NODES) as bundled_nodes,
        resources.as_file(data / BUNDLED_PODS) as bundled_pods,
    ):
        node_path = nodes or bundled_nodes
        pod_path = pods or bundled_pods
        name = pod_path.stem if pods else "openb default (bundled)"
        node_list = tuple(load_nodes(node_path))
        return Trace(name=name, nodes=node_list, pods=tuple(load_pods(pod_path, models=models_of(node_list))))


def models_of(nodes: Sequence[NodeSpec]) -> frozenset[str]:
    """The GPU models the node list has: what a pod's gpu_spec may name."""
    return frozenset(gpu.model for node in nodes for gpu in node.gpus)


def load_nodes(path: Path) -> list[NodeSpec]:
    nodes = []
    names: dict[str, int] = {}
    for line, row in _rows(path, NODE_COLUMNS):
        cell = _Cells(path, line, row)
        cell.unique("sn", names)
        count = cell.integer("gpu", maximum=MAX_GPUS_PER_NODE)
        model = row["model"].strip()
        if count and not model:
            raise cell.error("model", "a node with GPUs needs a model")
        memory = MIB_PER_GB * MODEL_MEMORY_GB.get(model, DEFAULT_MEMORY_GB)
        name = cell.text("sn")
        gpus = tuple(GpuSpec(i, f"{name}-gpu{i}", model, memory) for i in range(count))
        nodes.append(NodeSpec(name, cell.integer("cpu_milli"), cell.integer("memory_mib"), gpus))
    if not nodes:
        raise UserError(f"{path}: no nodes; the node list needs a header and at least one row")
    return nodes


def load_pods(path: Path, *, models: frozenset[str] = frozenset()) -> list[TracePod]:
    """The pod list at `path`. With `models` (the node list's, `models_of`), a pod with GPUs whose gpu_spec
    names none of them is refused: no node could ever take it, and the replay would drop it silently."""
    pods = []
    names: dict[str, int] = {}
    for line, row in _rows(path, POD_COLUMNS):
        cell = _Cells(path, line, row)
        cell.unique("name", names)
        num_gpu, gpu_milli = cell.integer("num_gpu", maximum=MAX_GPUS_PER_NODE), cell.integer("gpu_milli")
        if num_gpu and not 0 < gpu_milli <= 1000:
            raise cell.error("gpu_milli", "must be between 1 and 1000 for a pod with GPUs")
        spec = cell.models("gpu_spec")
        if num_gpu and spec and models and not spec & models:
            raise cell.error("gpu_spec", _unknown_models(spec, models))
        pods.append(
            TracePod(
                name=cell.text("name"),
                cpu_milli=cell.integer("cpu_milli"),
                memory_mib=cell.integer("memory_mib"),
                num_gpu=num_gpu,
                gpu_milli=gpu_milli if num_gpu else 0,
                gpu_spec=spec,
                creation_time=cell.optional_time("creation_time"),
                deletion_time=cell.optional_time("deletion_time"),
            )
        )
    if not pods:
        raise UserError(f"{path}: no pods; the pod list needs a header and at least one row")
    return pods


def _unknown_models(spec: frozenset[str], models: frozenset[str]) -> str:
    """Why a gpu_spec no node can take is refused, and the fix: the node list's models, and the one meant
    where only its case differs."""
    by_case = {model.casefold(): model for model in models}
    meant = sorted({by_case[item.casefold()] for item in spec if item.casefold() in by_case})
    hint = f" (did you mean {'|'.join(meant)}?)" if meant else ""
    return (
        f"names no GPU model of the node list{hint}: give one or more of {', '.join(sorted(models))} "
        "separated by |, or leave it empty for any model"
    )


def require_times(pods: Sequence[TracePod], *, replay: str, fix: str = "") -> None:
    """What a replay in time needs of every pod: a creation time, and no deletion time before it."""
    for pod in pods:
        if pod.creation_time is None:
            raise UserError(
                f"pod {pod.name} has no creation_time: {replay} needs creation_time (and deletion_time, "
                f"empty for a pod still running) on every pod{fix}"
            )
        if pod.deletion_time is not None and pod.deletion_time < pod.creation_time:
            raise UserError(
                f"pod {pod.name}: deletion_time {pod.deletion_time:g} is before creation_time "
                f"{pod.creation_time:g}"
            )


def _rows(path: Path, required: Sequence[str]) -> list[tuple[int, dict[str, str]]]:
    text = reading.read_text(path, limit=MAX_TRACE_BYTES)
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        reader.fieldnames = _header(path, reader.fieldnames or (), required)
        rows = []
        for row in reader:
            if _blank(row):
                continue
            if None in row or any(value is None for value in row.values()):
                raise UserError(f"{path}:{reader.line_num}: expected {len(reader.fieldnames or ())} fields")
            rows.append((reader.line_num, row))
        return rows
    except csv.Error as error:
        raise UserError(f"{path}: cannot read it as CSV ({error})") from None


def _header(path: Path, names: Sequence[str], required: Sequence[str]) -> list[str]:
    """The header's column names, stripped as cells are. Refused where a required one is missing, or where
    a name is given twice: `csv.DictReader` would read the last of them without a word."""
    names = [name.strip() for name in names]
    missing = [column for column in required if column not in names]
    if missing:
        expected = ",".join(required)
        raise UserError(f"{path}:1: missing column(s) {', '.join(missing)}; the header needs {expected}")
    repeated = sorted({name for name in names if name and names.count(name) > 1})
    if repeated:
        raise UserError(f"{path}:1: column(s) {', '.join(repeated)} named more than once; give each once")
    return names


def _blank(row: dict[str | None, str | list[str] | None]) -> bool:
    """A row of empty cells or spaces only, as a spreadsheet leaves below its last: no node or pod."""
    cells = (cell for value in row.values() for cell in (value if isinstance(value, list) else [value]))
    return not any(cell and cell.strip() for cell in cells)


T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class _Cells:
    path: Path
    line: int
    row: dict[str, str]

    def error(self, column: str, rule: str) -> UserError:
        return UserError(f'{self.path}:{self.line}: column {column}="{self.row.get(column, "")}": {rule}')

    def _parse(self, column: str, convert: Callable[[str], T], rule: str) -> T:
        try:
            return convert(self.row[column].strip())
        except ValueError:
            raise self.error(column, rule) from None

    def text(self, column: str) -> str:
        value = self.row[column].strip()
        if not value:
            raise self.error(column, "must not be empty")
        return value

    def models(self, column: str) -> frozenset[str] | None:
        """GPU models separated by `|`, each stripped as a node list's model is; None (any) if none."""
        items = (item.strip() for item in (self.row.get(column) or "").split("|"))
        return frozenset(item for item in items if item) or None

    def unique(self, column: str, seen: dict[str, int]) -> None:
        """A name no earlier row in `seen` (name -> line) has: nodes and pods are known by name, so a second
        row of the same name would stand for the first one's node or pod and the replay could not place it."""
        value = self.text(column)
        first = seen.setdefault(value, self.line)
        if first != self.line:
            raise self.error(column, f"line {first} has this name already; every row needs its own")

    def integer(self, column: str, *, maximum: int = MAX_AMOUNT) -> int:
        """A whole number from 0 to `maximum`: a node's GPUs are built one by one, and every amount ends in
        an int64 array, so a huge one is refused here rather than hanging or overflowing the replay."""
        value = self._parse(column, int, "must be a whole number")
        if value < 0:
            raise self.error(column, "must not be negative")
        if value > maximum:
            raise self.error(column, f"must be at most {maximum}")
        return value

    def optional_time(self, column: str) -> float | None:
        if not (self.row.get(column) or "").strip():
            return None
        value = self._parse(column, float, "must be a time in seconds")
        if not math.isfinite(value) or value < 0:
            raise self.error(column, "must be a time in seconds, not negative")
        return value
