"""The real killer signals the process the watchdog judged and no other: a pid whose process changed
(start time, container), or that no longer holds the GPU, is never signalled. Real child processes, real
/proc, a stub NVML."""

from __future__ import annotations

import dataclasses
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufrac.node import procfs
from gpufrac.node.agent import SignalKiller
from gpufrac.node.nvml import GpuProcess, GpuSample, Snapshot
from gpufrac.node.watchdog import Gpu, Process

GPU = Gpu(0, "GPU-0")


class StubNvml:
    def __init__(self, *pids: int) -> None:
        self.pids = pids
        self.samples = 0

    def sample(self) -> Snapshot:
        self.samples += 1
        processes = tuple(GpuProcess(pid, 1) for pid in self.pids)
        return Snapshot("535.104.05", (GpuSample(0, GPU.uuid, "T4", 16384, True, None, processes),))

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


def killer(*pids: int) -> SignalKiller:
    return SignalKiller(procfs.ProcFS(Path("/proc")), StubNvml(*pids))


def test_the_judged_process_is_killed(child: subprocess.Popen[bytes]) -> None:
    assert killer(child.pid).kill(judged(child)) == "killed"
    assert child.wait(timeout=10) == -9


@pytest.mark.parametrize(
    ("change", "outcome"),
    [
        ({"start_time": 1}, "not signalled: its pid now names another process"),
        ({"container_id": "f" * 64}, "not signalled: its pid now names another process"),
        ({"start_time": 0}, "not signalled: its start time is unknown, so its pid may name another process"),
    ],
    ids=["pid reused (start time)", "pid reused (container)", "start time unknown"],
)
def test_a_pid_that_names_another_process_is_not_signalled(
    child: subprocess.Popen[bytes], change: dict[str, object], outcome: str
) -> None:
    """The tick judged an earlier process with this pid: the one there now is left alone."""
    assert killer(child.pid).kill(dataclasses.replace(judged(child), **change)) == outcome
    assert child.poll() is None


def test_a_process_no_longer_on_the_gpu_is_not_signalled(child: subprocess.Popen[bytes]) -> None:
    """The pid was reused between the NVML sample and the /proc read: /proc describes the new process,
    which NVML, asked again, does not list."""
    assert killer().kill(judged(child)) == "not signalled: no longer on the GPU"
    assert child.poll() is None


def test_a_process_that_ended_is_already_gone(child: subprocess.Popen[bytes]) -> None:
    seen = judged(child)
    child.kill()
    child.wait()
    assert killer(child.pid).kill(seen) == "already gone"
