"""A GPU process without a contract in no pod on the node is acted on once its container has been seen
running one in two of the last three intervals: on any GPU, by any of its processes, with one interval's
gap allowed. One in a pod's container is acted on at once."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from gpufrac.node import suspects
from gpufrac.node.agent import Agent, Settings
from gpufrac.node.nvml import FakeBackend
from gpufrac.node.watchdog import Finding, Kind, Mode
from gpufrac.testing.fakehost import FakeHost, RecordingKiller, container_id

from .fake_kube import FakeNodeClient
from .test_watchdog import GPU0, GPU1, bound_pod, proc


def test_a_finding_waits_on_its_container_or_the_host() -> None:
    in_container = Finding(Kind.NO_CONTRACT, GPU0, (proc(7, GPU0, 1, container=1),), "")
    on_other_gpu = Finding(Kind.NO_CONTRACT, GPU1, (proc(8, GPU1, 1, container=1),), "")
    on_host = Finding(Kind.NO_CONTRACT, GPU0, (proc(9, GPU0, 1, container=None),), "")
    assert suspects.key(in_container) == suspects.key(on_other_gpu) == container_id(1)
    assert suspects.key(on_host) == suspects.HOST


@pytest.mark.parametrize(
    ("intervals", "ready"),
    [
        ([{"a"}, {"a"}], [set(), {"a"}]),
        ([{"a"}, set(), {"a"}], [set(), set(), {"a"}]),
        ([{"a"}, set(), set(), {"a"}], [set(), set(), set(), set()]),  # two of the last three only
        ([{"a"}, {"b"}, {"a", "b"}], [set(), set(), {"a", "b"}]),
    ],
    ids=["in a row", "one interval's gap", "two intervals' gap", "two containers"],
)
def test_a_suspect_is_ready_once_seen_in_two_of_the_last_three_intervals(
    intervals: list[set[str]], ready: list[set[str]]
) -> None:
    waiting = suspects.Suspects()
    assert [waiting.ready(keys) for keys in intervals] == ready


def test_suspects_gone_for_three_intervals_are_forgotten() -> None:
    waiting = suspects.Suspects()
    waiting.ready({f"c{n}" for n in range(100)})
    for _ in range(suspects.WINDOW):
        waiting.ready(set())
    assert waiting._seen == {}


Pattern = Callable[[int], Mapping[int, list[tuple[int, int]]]]


@pytest.mark.parametrize(
    "pattern",
    [
        pytest.param(lambda t: {t % 2: [(101, 12000)]}, id="hops GPU 0, 1, 0, 1"),
        pytest.param(lambda t: {0: [(101, 12000)]} if t % 2 == 0 else {}, id="on GPU 0 every other interval"),
        pytest.param(lambda t: {t % 2: [(101 + t % 2, 12000)]}, id="a new process on the other GPU"),
    ],
)
async def test_a_process_without_a_contract_that_hops_or_pauses_is_acted_on(
    tmp_path: Path, pattern: Pattern
) -> None:
    """A container in no pod on the node (the runtime's, started beside the kubelet) uses the GPUs, never
    on one GPU two intervals in a row."""
    host = FakeHost(tmp_path / "host")
    host.add_gpus(2, memory_mib=16384)
    for pid in (101, 102):
        host.add_process(pid, container=container_id(1))
    node: dict[str, Any] = {"metadata": {"name": "n1", "labels": {}, "annotations": {}}, "status": {}}
    client = FakeNodeClient(node, [])
    killer = RecordingKiller()
    settings = Settings(node_name="n1", mode=Mode.KILL, proc_root=host.proc)
    agent = Agent(settings, client=client, nvml=FakeBackend(host.nvml_file), killer=killer)
    host.write(pattern(0))
    assert (await agent.tick()).handled == []  # seen once: maybe a container the kubelet has not reported
    for tick in (1, 2):
        host.write(pattern(tick))
        await agent.tick()
    assert killer.calls and len(client.events) == len(killer.calls)  # by the third interval


async def test_a_container_of_a_pod_on_the_node_is_acted_on_without_waiting(tmp_path: Path) -> None:
    """The wait is for containers the kubelet has not reported yet; one a pod's status names has nothing to
    wait for. Made to wait, a tenant whose pod has no contract and that uses a GPU one interval in three,
    never two of the last three, ran without a contract for ever, not even reported."""
    host = FakeHost(tmp_path / "host")
    host.add_gpus(1, memory_mib=16384)
    host.add_process(101, container=container_id(1))
    node: dict[str, Any] = {"metadata": {"name": "n1", "labels": {}, "annotations": {}}, "status": {}}
    client = FakeNodeClient(node, [bound_pod("rogue", None, {"app": 1})])
    killer = RecordingKiller()
    settings = Settings(node_name="n1", mode=Mode.KILL, proc_root=host.proc)
    agent = Agent(settings, client=client, nvml=FakeBackend(host.nvml_file), killer=killer)
    for tick in range(6):
        host.write({0: [(101, 12000)]} if tick % 3 == 0 else {})
        await agent.tick()
    assert killer.calls == [101, 101]
