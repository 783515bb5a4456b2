"""`gpufrac top`'s rows and table, from a small state."""

from __future__ import annotations

from rich.console import Console

from gpufrac.cluster.model import Assignment, GpuSpec, NodeSpec, Placement
from gpufrac.cluster.state import ClusterState
from gpufrac.contract.model import ComputeMode
from gpufrac.contract.queues import Resource
from gpufrac.scheduler.top import gpu_rows, queue_table, table

MIB = 16_000
TS, SM = ComputeMode.TIME_SLICING, ComputeMode.SM_SHARING


def share(pod: str, gpus: tuple[int, ...], request: int, limit: int, mode: ComputeMode | None) -> Placement:
    return Placement(pod, "n1", assignments=(Assignment("main", gpus, request, limit, mode),))


def small_state() -> ClusterState:
    gpus = tuple(GpuSpec(i, f"GPU-{i}", "Tesla-T4", MIB, healthy=i != 3) for i in range(4))
    state = ClusterState([NodeSpec("n1", 8000, 32_768, gpus), NodeSpec("gone", 1, 1, gpus[:1])])
    state.remove_node("gone")
    for placement in (
        share("team/b", (0,), 4000, 8000, TS),
        share("team/a", (0,), 2000, 2000, TS),
        share("team/w", (1,), MIB, MIB, None),
        share("team/m", (2,), 6000, 10_000, SM),
    ):
        state.apply(placement)
    return state


def test_gpu_rows_sum_requests_and_limits_per_gpu() -> None:
    rows = gpu_rows(small_state())
    assert [(row["node"], row["gpu"], row["uuid"]) for row in rows] == [
        ("n1", i, f"GPU-{i}") for i in range(4)
    ]
    summary = [
        (row["mode"], row["requested_mib"], row["limits_mib"], row["free_mib"], row["healthy"])
        for row in rows
    ]
    assert summary == [
        ("time-slicing", 6000, 10_000, 10_000, True),
        ("whole", MIB, MIB, 0, True),
        ("sm-sharing", 6000, 10_000, 10_000, True),
        ("", 0, 0, MIB, False),
    ]
    assert all(row["model"] == "Tesla-T4" and row["memory_mib"] == MIB for row in rows)
    assert rows[0]["pods"] == [
        {"pod": "team/a", "container": "main", "request_mib": 2000, "limit_mib": 2000, "whole": False},
        {"pod": "team/b", "container": "main", "request_mib": 4000, "limit_mib": 8000, "whole": False},
    ]
    assert rows[1]["pods"][0]["whole"] is True
    assert rows[3]["pods"] == []


def test_a_multi_gpu_share_shows_on_each_of_its_gpus() -> None:
    gpus = tuple(GpuSpec(i, f"GPU-{i}", "T4", MIB) for i in range(2))
    state = ClusterState([NodeSpec("n1", 8000, 32_768, gpus)])
    state.apply(share("team/pair", (0, 1), 5000, 5000, TS))
    assert [[p["pod"] for p in row["pods"]] for row in gpu_rows(state)] == [["team/pair"], ["team/pair"]]


def test_the_table_shows_every_gpu() -> None:
    console = Console(record=True, width=200)
    console.print(table(gpu_rows(small_state())))
    text = console.export_text()
    assert "6000/16000" in text and "16000/16000" in text
    assert "team/a[main], team/b[main]" in text
    assert "3 (unhealthy)" in text
    assert "gone" not in text


def test_text_that_looks_like_markup_is_shown_as_it_is() -> None:
    """A GPU model comes from the agent's annotation and a parent queue from a Queue, either any text."""
    gpus = (GpuSpec(0, "GPU-0", "T4 [/] [bold]x", MIB),)
    console = Console(record=True, width=200)
    console.print(table(gpu_rows(ClusterState([NodeSpec("n1", 8000, 32_768, gpus)]))))
    use = {"quota": 1.0, "fair_share": 1.0, "used": 0.0}
    resources = {resource.value: use for resource in Resource}
    console.print(queue_table([{"queue": "a", "parent": "[red]team[/]", "resources": resources}]))
    text = console.export_text()
    assert "T4 [/] [bold]x" in text and "[red]team[/]" in text
