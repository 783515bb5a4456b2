"""Hand-made traces for the planner's tests, written as openb CSV files, and a one-call plan."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufrac.plan import planner
from gpufrac.plan.planner import Settings
from gpufrac.sim import trace


@dataclass(frozen=True)
class Pod:
    name: str
    gpu_milli: int = 0  # 1000 with num_gpu for whole GPUs
    num_gpu: int = 1
    cpu: int = 1000
    memory: int = 1024
    created: float | None = 0.0
    deleted: float | None = 100.0


def share(name: str, milli: int, **fields: Any) -> Pod:
    return Pod(name, milli, **fields)


def whole(name: str, gpus: int = 1, **fields: Any) -> Pod:
    return Pod(name, 1000, gpus, **fields)


def cpu_only(name: str, **fields: Any) -> Pod:
    return Pod(name, 0, 0, **fields)


def write(
    folder: Path,
    pods: Sequence[Pod],
    *,
    nodes: int = 8,
    gpus: int = 1,
    model: str = "T4",
    cpu: int = 8000,
    memory: int = 65536,
) -> tuple[Path, Path]:
    """`nodes` identical nodes, and the pods, as node and pod list CSVs in `folder`."""
    node_csv = folder / "nodes.csv"
    rows = [f"node-{i:02d},{cpu},{memory},{gpus},{model}" for i in range(nodes)]
    node_csv.write_text("sn,cpu_milli,memory_mib,gpu,model\n" + "\n".join(rows) + "\n")
    pod_csv = folder / "pods.csv"
    lines = ["name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,creation_time,deletion_time"]
    for pod in pods:
        created = "" if pod.created is None else f"{pod.created:g}"
        deleted = "" if pod.deleted is None else f"{pod.deleted:g}"
        num_gpu = pod.num_gpu if pod.gpu_milli else 0
        lines.append(f"{pod.name},{pod.cpu},{pod.memory},{num_gpu},{pod.gpu_milli},,{created},{deleted}")
    pod_csv.write_text("\n".join(lines) + "\n")
    return node_csv, pod_csv


def plan(files: tuple[Path, Path], **settings: Any) -> dict[str, Any]:
    """The summary `gpufrac plan --format json` would print, computed in this process."""
    loaded = trace.load(*files)
    prepared = planner.prepare(loaded, Settings(**{"workers": 1, **settings}))
    static, replays = planner.run(prepared)
    return planner.summarize(loaded, prepared, static, replays)


# Four half-GPU shares, one whole-GPU pod and one CPU-only pod: each strategy's answer is worked out by
# hand in test_strategies.py.
HALVES = [share("a", 500), share("b", 500), share("c", 500), share("d", 500), whole("e"), cpu_only("f")]
