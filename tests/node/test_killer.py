"""The real killer signals the process the watchdog judged and no other: a pid whose process changed
(start time, container), or that no longer holds the GPU, is never signalled; and a process it could not
tell about is not signalled now but judged again next interval, never spared for good. Real child
processes, real /proc, a stub NVML. An eviction waits for the same second look."""

from __future__ import annotations

import dataclasses
import errno
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufrac.node import procfs
from gpufrac.node.agent import Agent, NotKilled, Settings, SignalKiller
from gpufrac.node.nvml import FakeBackend, GpuProcess, GpuSample, Snapshot
from gpufrac.node.watchdog import Gpu, Kind, Mode, Process
from gpufrac.testing.fakehost import FakeHost, RecordingKiller, container_id

from .fake_kube import FakeNodeClient
from .test_watchdog import bound_pod, share

GPU = Gpu(0, "GPU-0")


class StubNvml:
    def __init__(self, *pids: int, error: str = "", gpu_error: str = "") -> None:
        self.pids = pids
        self.samples = 0
        self.error, self.gpu_error = error, gpu_error

    def sample(self) -> Snapshot:
        self.samples += 1
        if self.error:
            return Snapshot(error=self.error)
        processes = () if self.gpu_error else tuple(GpuProcess(pid, 1) for pid in self.pids)
        gpu = GpuSample(0, GPU.uuid, "T4", 16384, not self.gpu_error, None, processes, self.gpu_error)
        return Snapshot("535.104.05", (gpu,))

    def close(self) -> None:
        pass


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(["sleep", "60"])
    yield process
    process.kill()
    process.wait()


def judged(child: subprocess.Popen[bytes]) -> Process:
    """The child as the tick saw it: its pid, start time and container from /proc."""
    info = procfs.ProcFS().process(child.pid)
    assert info is not None
    return Process(child.pid, info.start_time, GPU, 1, info.container_id)


def killer(*pids: int, **nvml: str) -> SignalKiller:
    return SignalKiller(procfs.ProcFS(Path("/proc")), StubNvml(*pids, **nvml))


def test_the_judged_process_is_killed(child: subprocess.Popen[bytes]) -> None:
    assert killer(child.pid).kill(judged(child)) == "killed"
    assert child.wait(timeout=10) == -9


@pytest.mark.parametrize(
    "change", [{"start_time": 1}, {"container_id": "f" * 64}], ids=["start time", "container"]
)
def test_a_pid_that_names_another_process_is_not_signalled(
    child: subprocess.Popen[bytes], change: dict[str, object]
) -> None:
    """The tick judged an earlier process with this pid: the one there now is left alone, and the judged
    one is gone."""
    outcome = killer(child.pid).kill(dataclasses.replace(judged(child), **change))
    assert outcome == "gone: its pid now names another process"
    assert child.poll() is None


@pytest.mark.parametrize(
    ("nvml", "why"),
    [
        ({}, "no longer on the GPU"),
        (
            {"error": "NVML unavailable: Unknown Error"},
            r"NVML cannot say .* \(NVML unavailable: Unknown Error\)",
        ),
        ({"gpu_error": "GPU is lost"}, r"NVML cannot say whether it still holds the GPU \(GPU is lost\)"),
    ],
    ids=["not listed", "NVML failing", "GPU unhealthy"],
)
def test_a_process_nvml_does_not_place_on_the_gpu_is_not_signalled_for_now(
    child: subprocess.Popen[bytes], nvml: dict[str, str], why: str
) -> None:
    """Not listed: the pid was reused between the NVML sample and the /proc read, or the process let go of
    the GPU. NVML failing says nothing either way. Neither is a kill done: the next interval judges again."""
    with pytest.raises(NotKilled, match=why):
        killer(**nvml).kill(judged(child))
    assert child.poll() is None


def test_a_process_whose_start_time_is_unknown_is_not_signalled_for_now(
    child: subprocess.Popen[bytes],
) -> None:
    with pytest.raises(NotKilled, match="its start time is unknown, so its pid may name another process"):
        killer(child.pid).kill(dataclasses.replace(judged(child), start_time=0))
    assert child.poll() is None


def test_a_process_that_ended_is_already_gone(child: subprocess.Popen[bytes]) -> None:
    seen = judged(child)
    child.kill()
    child.wait()
    assert killer(child.pid).kill(seen) == "already gone"


class FailingOnce:
    """The fake NVML, failing as a whole on its `fail_on`th sample: a transient NVML error."""

    def __init__(self, inner: FakeBackend, fail_on: int) -> None:
        self.inner, self.fail_on, self.calls = inner, fail_on, 0

    def sample(self) -> Snapshot:
        self.calls += 1
        if self.calls == self.fail_on:
            return Snapshot(error="NVML unavailable: Unknown Error")
        return self.inner.sample()

    def close(self) -> None:
        pass


async def test_a_breach_not_killed_because_nvml_failed_is_killed_next_interval(
    tmp_path: Path, child: subprocess.Popen[bytes]
) -> None:
    """The killer's second NVML sample fails: no kill, no Event, nothing remembered as done; the next
    interval kills the process, with one Event."""
    real = procfs.ProcFS().process(child.pid)
    assert real is not None
    host = FakeHost(tmp_path / "host")
    host.add_gpus(1, memory_mib=16384)
    host.add_process(child.pid, container=container_id(1), start_time=real.start_time)
    host.write({0: [(child.pid, 4096)]})  # over its 2048 MiB limit
    pod = bound_pod("greedy", share("app", host.uuid(0), request=1024, limit=2048), {"app": 1})
    node: dict[str, Any] = {"metadata": {"name": "n1", "labels": {}, "annotations": {}}, "status": {}}
    nvml = FailingOnce(FakeBackend(host.nvml_file), fail_on=2)  # 1: the first tick; 2: the killer's check
    client = FakeNodeClient(node, [pod])
    agent = Agent(
        Settings(node_name="n1", mode=Mode.KILL, proc_root=host.proc),
        client=client,
        nvml=nvml,
        killer=SignalKiller(procfs.ProcFS(host.proc), nvml),
    )

    (spared,) = (await agent.tick()).handled
    assert spared.finding.kind is Kind.BREACH and "not signalled: NVML cannot say" in spared.outcome
    assert child.poll() is None and client.events == []
    assert "gpufrac_watchdog_actions_total{" not in agent.exporter.text()

    (killed,) = (await agent.tick()).handled
    assert killed.outcome == f"Killed processes (pid, outcome): {child.pid} killed"
    assert child.wait(timeout=10) == -9
    (event,) = client.events
    assert event.reason == Kind.BREACH.value
    assert 'gpufrac_watchdog_actions_total{action="kill"} 1.0' in agent.exporter.text()


class RefusingKiller:
    """Kills every process but those in `refuse`, which it cannot tell about (NotKilled)."""

    def __init__(self, *refuse: int) -> None:
        self.refuse = set(refuse)
        self.killed: list[int] = []

    def kill(self, process: Process) -> str:
        if process.pid in self.refuse:
            raise NotKilled("NVML cannot say whether it still holds the GPU (Unknown Error)")
        self.killed.append(process.pid)
        return "killed"


async def test_a_breach_partly_killed_has_its_event_and_the_rest_is_killed_next_interval(
    tmp_path: Path,
) -> None:
    host = FakeHost(tmp_path / "host")
    host.add_gpus(1, memory_mib=16384)
    for pid in (101, 102):
        host.add_process(pid, container=container_id(1))
    host.write({0: [(101, 2048), (102, 2048)]})  # together over the share's 2048 MiB
    pod = bound_pod("greedy", share("app", host.uuid(0), request=1024, limit=2048), {"app": 1})
    node: dict[str, Any] = {"metadata": {"name": "n1", "labels": {}, "annotations": {}}, "status": {}}
    client, killer = FakeNodeClient(node, [pod]), RefusingKiller(102)
    settings = Settings(node_name="n1", mode=Mode.KILL, proc_root=host.proc)
    agent = Agent(settings, client=client, nvml=FakeBackend(host.nvml_file), killer=killer)

    (first,) = (await agent.tick()).handled
    assert first.outcome == (
        "Killed processes (pid, outcome): 101 killed; "
        "102 not signalled: NVML cannot say whether it still holds the GPU (Unknown Error)"
    )
    assert len(client.events) == 1  # 101 was killed: that is recorded

    killer.refuse.clear()  # the fake kills nothing: both are still listed, the finding unchanged
    (second,) = (await agent.tick()).handled
    assert second.outcome == "Killed processes (pid, outcome): 101 killed; 102 killed"
    assert killer.killed == [101, 101, 102] and len(client.events) == 2
    assert (await agent.tick()).handled == []  # done now


def two_breaches(tmp_path: Path, killer: Any = None) -> tuple[Agent, FakeHost]:
    """Pods p1 and p2, each with one process (101, 102) over its share's limit on GPU 0."""
    host = FakeHost(tmp_path / "host")
    host.add_gpus(1, memory_mib=16384)
    pods = []
    for n in (1, 2):
        pods.append(bound_pod(f"p{n}", share("app", host.uuid(0), request=1024, limit=2048), {"app": n}))
        host.add_process(100 + n, container=container_id(n))
    host.write({0: [(101, 4096), (102, 4096)]})
    node: dict[str, Any] = {"metadata": {"name": "n1", "labels": {}, "annotations": {}}, "status": {}}
    nvml = FakeBackend(host.nvml_file)
    agent = Agent(
        Settings(node_name="n1", mode=Mode.KILL, proc_root=host.proc),
        client=FakeNodeClient(node, pods),
        nvml=nvml,
        killer=killer or SignalKiller(procfs.ProcFS(host.proc), nvml),
    )
    return agent, host


@pytest.mark.parametrize(
    ("call", "code"),
    [("pidfd_open", errno.ENOSYS), ("pidfd_open", errno.EMFILE), ("pidfd_send_signal", errno.EPERM)],
    ids=["no pidfd_open (kernel < 5.3)", "too many open files", "signal refused"],
)
async def test_a_kill_the_kernel_refuses_is_not_signalled_for_now_and_the_tick_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: str, code: int
) -> None:
    def refused(*_: object) -> None:
        raise OSError(code, os.strerror(code))

    if call == "pidfd_open":
        monkeypatch.setattr(os, "pidfd_open", refused)
    else:
        # The fake tree's pids are made up: pin this test process instead of them, and refuse the signal.
        monkeypatch.setattr(os, "pidfd_open", lambda pid: os.open(os.devnull, os.O_RDONLY))
        monkeypatch.setattr(signal, "pidfd_send_signal", refused)
    agent, _ = two_breaches(tmp_path)
    report = await agent.tick()
    assert [h.outcome for h in report.handled] == [
        f"Killed processes (pid, outcome): {pid} not signalled: {os.strerror(code)}" for pid in (101, 102)
    ]
    assert report.problems == [] and agent.client.events == []
    assert "gpufrac_share_memory_used_bytes{" in agent.exporter.text()
    assert len((await agent.tick()).handled) == 2  # tried again


class BrokenKiller:
    """A killer with a bug for pid 101."""

    def kill(self, process: Process) -> str:
        if process.pid == 101:
            raise RuntimeError("a bug")
        return "killed"


async def test_one_finding_failing_does_not_stop_the_others(tmp_path: Path) -> None:
    agent, _ = two_breaches(tmp_path, BrokenKiller())
    report = await agent.tick()
    assert [h.outcome for h in report.handled] == ["Killed processes (pid, outcome): 102 killed"]
    (problem,) = report.problems
    assert problem.startswith("cannot handle container app of pod ns/p1 uses 4096 MiB") and problem.endswith(
        ": RuntimeError: a bug"
    )
    assert "gpufrac_share_memory_used_bytes{" in agent.exporter.text()


class Replaying:
    """NVML answering with `snapshots` in turn, then with the last one ever after."""

    def __init__(self, *snapshots: Snapshot) -> None:
        self.snapshots = list(snapshots)

    def sample(self) -> Snapshot:
        return self.snapshots.pop(0) if len(self.snapshots) > 1 else self.snapshots[0]

    def close(self) -> None:
        pass


async def test_an_eviction_waits_for_the_same_second_look_as_a_kill(tmp_path: Path) -> None:
    """NVML listed pid 201 with 60 GiB; by the tick's /proc read that process had ended and its pid named a
    fresh one of another share's container, with no GPU context. Asked again, NVML does not list it, so that
    innocent pod is not evicted, nor remembered as done; a process listed both times gets its pod evicted."""
    host = FakeHost(tmp_path / "host")
    host.add_gpus(1, memory_mib=81920)
    victim = bound_pod("victim", share("app", host.uuid(0), request=1024, limit=2048), {"app": 2})
    host.add_process(201, container=container_id(2))
    host.write({0: [(201, 60000)]})
    listed = FakeBackend(host.nvml_file).sample()
    host.write()
    nvml = Replaying(listed, FakeBackend(host.nvml_file).sample())
    node: dict[str, Any] = {"metadata": {"name": "n1", "labels": {}, "annotations": {}}, "status": {}}
    client = FakeNodeClient(node, [victim])
    settings = Settings(node_name="n1", mode=Mode.EVICT, proc_root=host.proc)
    agent = Agent(settings, client=client, nvml=nvml, killer=RecordingKiller())

    (spared,) = (await agent.tick()).handled
    assert spared.finding.kind is Kind.BREACH
    assert spared.outcome == "not evicted (pid, why): 201 no longer on the GPU"
    assert client.events == []

    nvml.snapshots = [listed]  # listed by both looks: the same process, over its limit
    (evicted,) = (await agent.tick()).handled
    assert evicted.outcome == "Evicted pod ns/victim"
    assert [type(o).__name__ for o in client.events] == ["_Eviction", "Event"]
