"""The event-driven replay: arrivals and departures in time order, peaks, rejections, bad times."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufrac.cluster.model import GpuSpec, NodeSpec
from gpufrac.errors import UserError
from gpufrac.plan.mig_packer import MigPacker
from gpufrac.plan.timed import downsample, replay, require_times
from gpufrac.sim.trace import TracePod

from . import traces
from .traces import cpu_only, share, whole


def pod(name: str, created: float | None, deleted: float | None, *, gpus: int = 1) -> TracePod:
    return TracePod(name, 1000, 1024, gpus, 1000, None, created, deleted)


def packer(gpus: int) -> MigPacker:
    """Whole GPUs on a model without MIG: the simplest packer to count busy GPUs with."""
    return MigPacker(
        [NodeSpec("n", 64_000, 262_144, tuple(GpuSpec(i, f"g{i}", "T4", 16_000) for i in range(gpus)))]
    )


def run(pods: list[TracePod], gpus: int = 4) -> tuple[int, float, int]:
    result = replay(packer(gpus), pods, [p.demand() for p in pods])
    return result.peak_gpus, result.peak_time, result.rejected


def test_departures_free_gpus_before_arrivals_at_the_same_time() -> None:
    # a [0, 10), b [5, 15), d [10, 20) arrives as a leaves, c [20, 30): never more than two at once.
    pods = [pod("a", 0, 10), pod("b", 5, 15), pod("c", 20, 30), pod("d", 10, 20)]
    assert run(pods, gpus=2) == (2, 5, 0)


def test_the_peak_counts_gpus_not_pods() -> None:
    pods = [pod("wide", 0, 10, gpus=3), pod("one", 5, 8)]
    assert run(pods) == (4, 5, 0)


def test_a_pod_that_lives_no_time_arrives_then_leaves() -> None:
    assert run([pod("blink", 7, 7), pod("other", 7, 9)]) == (2, 7, 0)


def test_a_pod_without_deletion_time_runs_to_the_end() -> None:
    assert run([pod("stays", 0, None), pod("later", 50, 60)]) == (2, 50, 0)


def test_a_pod_that_finds_no_room_is_rejected_and_never_released() -> None:
    assert run([pod("first", 0, 10), pod("second", 5, 15)], gpus=1) == (1, 0, 1)


def test_pods_need_a_creation_time() -> None:
    with pytest.raises(UserError, match=r"pod late has no creation_time.*--no-timed"):
        require_times([pod("ok", 0, 1), pod("late", None, 5)])


def test_deletion_cannot_come_before_creation() -> None:
    with pytest.raises(UserError, match="pod back: deletion_time 3 is before creation_time 5"):
        require_times([pod("back", 5, 3)])


def test_downsampling_keeps_the_largest_value_of_each_span() -> None:
    states = [(0.0, 1), (1.0, 5), (1.5, 2), (9.0, 3), (10.0, 0)]
    assert downsample(states, points=2) == ((0.0, 5), (5.0, 3))
    # A span without events holds the value it started with.
    assert downsample([(0.0, 2), (10.0, 0)], points=4) == ((0.0, 2), (2.5, 2), (5.0, 2), (7.5, 2))


def test_the_planner_replays_each_strategy_on_the_trace_cluster(tmp_path: Path) -> None:
    # On 8 one-GPU nodes: x and y overlap in [5, 10). Whole GPUs: 2 at the peak; two halves share one.
    pods = [share("x", 500, created=0, deleted=10), share("y", 500, created=5, deleted=15), cpu_only("z")]
    summary = traces.plan(traces.write(tmp_path, pods), strategies=("whole-gpu", "fractions-time-slicing"))
    peaks = {name: row["timed"]["peak_gpus"] for name, row in summary["strategies"].items()}
    assert peaks == {"whole-gpu": 2, "fractions-time-slicing": 1}
    timed = summary["strategies"]["whole-gpu"]["timed"]
    assert (timed["peak_time"], timed["rejected_pods"]) == (5, 0)


def test_a_trace_without_times_needs_no_timed(tmp_path: Path) -> None:
    files = traces.write(tmp_path, [whole("a", created=None, deleted=None)])
    with pytest.raises(UserError, match="--no-timed"):
        traces.plan(files)
    assert traces.plan(files, timed=False)["strategies"]["whole-gpu"]["gpus_needed"] == 1
