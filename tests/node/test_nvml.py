"""NVML backends: the fake plays scenarios from a file; failures degrade GPUs, never the agent."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pynvml
import pytest

from gpufrac.node import nvml
from gpufrac.node.agent import Agent, Settings
from gpufrac.node.nvml import MIB, GpuProcess
from gpufrac.node.watchdog import Mode
from gpufrac.testing.fakehost import FakeHost, RecordingKiller

from .fake_kube import FakeNodeClient


def test_open_backend() -> None:
    assert isinstance(nvml.open_backend("real"), nvml.RealBackend)
    fake = nvml.open_backend("fake:some/file.yaml")
    assert isinstance(fake, nvml.FakeBackend) and fake.path == Path("some/file.yaml")
    for bad in ("", "fake:", "nvidia", "fake"):
        with pytest.raises(ValueError, match="use 'real' or 'fake:FILE'"):
            nvml.open_backend(bad)


def test_fake_plays_a_scenario_and_follows_changes(tmp_path: Path) -> None:
    host = FakeHost(tmp_path)
    host.add_gpus(2, memory_mib=40960)
    host.write({0: [(100, 512)]}, utilization=0.5)
    backend = nvml.FakeBackend(host.nvml_file)
    first = backend.sample()
    assert first.error == "" and first.driver_version == "535.104.05"
    assert [(g.index, g.uuid, g.memory_mib, g.healthy) for g in first.gpus] == [
        (0, host.uuid(0), 40960, True),
        (1, host.uuid(1), 40960, True),
    ]
    assert first.gpus[0].processes == (GpuProcess(100, 512 * MIB),)
    assert first.gpus[0].utilization == 0.5
    assert backend.sample() is first  # unchanged file: not read again

    host.write({0: [(100, 2048)], 1: [(200, 1)]})
    second = backend.sample()
    assert second.gpus[0].processes == (GpuProcess(100, 2048 * MIB),)
    assert second.gpus[1].processes == (GpuProcess(200, MIB),)


def test_fake_gpu_error_degrades_that_gpu_only(tmp_path: Path) -> None:
    host = FakeHost(tmp_path)
    host.add_gpus(2)
    host.write({0: [(1, 1)], 1: [(2, 1)]}, errors={1: "GPU is lost"})
    snapshot = nvml.FakeBackend(host.nvml_file).sample()
    assert [g.healthy for g in snapshot.gpus] == [True, False]
    assert snapshot.gpus[1].error == "GPU is lost" and snapshot.gpus[1].processes == ()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "No such file"),
        ("gpus: [", "fake NVML file"),
        ("- 1\n", "must be a mapping"),
        ("gpus:\n  - index: 0\n", "'uuid'"),
        ("nvml_error: libnvidia-ml.so.1 not found\n", "NVML unavailable: libnvidia-ml.so.1 not found"),
    ],
)
def test_fake_nvml_unavailable(tmp_path: Path, content: str | None, message: str) -> None:
    path = tmp_path / "nvml.yaml"
    if content is not None:
        path.write_text(content)
    snapshot = nvml.FakeBackend(path).sample()
    assert message in snapshot.error and snapshot.gpus == ()


def test_real_backend_without_nvml_reports_an_error() -> None:
    """On a machine without the NVIDIA driver (CI), NVML fails to load; the backend says so, every time."""
    backend = nvml.RealBackend()
    try:
        snapshot = backend.sample()
        if not snapshot.error:
            pytest.skip("this machine has a working NVML")
        assert snapshot.error.startswith("NVML unavailable") and snapshot.gpus == ()
        assert backend.sample().error == snapshot.error
    finally:
        backend.close()


class _NVMLError(Exception):
    pass


class _FunctionNotFound(_NVMLError):
    pass


class _LibraryMismatch(Exception):  # as nvidia-ml-py's: not an NVMLError
    pass


def _fake_pynvml(broken: set[int], v2: int | None = None) -> Any:
    """A pynvml stand-in with two GPUs; `broken` GPUs fail their memory query; `v2`: the reserved MiB
    memory info v2 gives, None for a driver without it."""
    module: Any = types.ModuleType("pynvml")
    module.NVMLError = _NVMLError
    module.NVMLError_FunctionNotFound = _FunctionNotFound
    module.NVMLLibraryMismatchError = _LibraryMismatch
    module.nvmlMemory_v2 = 0x2000028
    module.nvmlInit = lambda: None
    module.nvmlShutdown = lambda: None
    module.nvmlSystemGetDriverVersion = lambda: b"550.54.15"
    module.nvmlDeviceGetCount = lambda: 2
    module.nvmlDeviceGetHandleByIndex = lambda index: index
    module.nvmlDeviceGetUUID = lambda handle: f"GPU-{handle}"
    module.nvmlDeviceGetName = lambda handle: "NVIDIA L4"

    def memory(handle: int, version: int | None = None) -> Any:
        if handle in broken:
            raise _NVMLError("Unknown Error")
        if version is None:
            return types.SimpleNamespace(total=24 * 1024 * MIB)
        if v2 is None:
            raise _NVMLError("Function Not Found")  # a driver without memory info v2
        return types.SimpleNamespace(total=24 * 1024 * MIB, reserved=v2 * MIB)

    def processes(handle: int) -> list[Any]:
        return [
            types.SimpleNamespace(pid=7, usedGpuMemory=MIB),
            types.SimpleNamespace(pid=8, usedGpuMemory=None),
        ]

    def mps_processes(handle: int) -> list[Any]:
        return [types.SimpleNamespace(pid=8, usedGpuMemory=3 * MIB)]

    def utilization(handle: int) -> Any:
        raise _NVMLError("Not Supported")

    def process_utilization(handle: int, since: int) -> list[Any]:
        module.asked.append(since)
        samples = [
            types.SimpleNamespace(pid=7, timeStamp=100, smUtil=20),
            types.SimpleNamespace(pid=7, timeStamp=200, smUtil=41),
        ]
        newer = [sample for sample in samples if sample.timeStamp > since]
        if not newer:
            raise _NVMLError("Not Found")  # as NVML answers when it has no sample since `since`
        return newer

    module.nvmlDeviceGetMemoryInfo = memory
    module.nvmlDeviceGetComputeRunningProcesses = processes
    module.nvmlDeviceGetMPSComputeRunningProcesses = mps_processes
    module.nvmlDeviceGetUtilizationRates = utilization
    module.nvmlDeviceGetProcessUtilization = process_utilization
    module.asked = []
    return module


def test_real_backend_degrades_one_failing_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(broken={1}))
    snapshot = nvml.RealBackend().sample()
    assert snapshot.driver_version == "550.54.15" and snapshot.error == ""
    good, bad = snapshot.gpus
    assert (good.uuid, good.model, good.memory_mib, good.healthy) == ("GPU-0", "NVIDIA L4", 24576, True)
    assert good.reserved_mib is None
    # MPS clients listed apart are merged in, with the memory the MPS listing knows.
    assert good.processes == (GpuProcess(7, MIB, 30), GpuProcess(8, 3 * MIB))
    assert good.utilization is None
    assert (bad.uuid, bad.healthy, bad.error) == ("GPU-1", False, "Unknown Error")


def test_real_backend_retries_after_nvml_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    module = _fake_pynvml(broken=set())
    calls = {"init": 0}

    def init() -> None:
        calls["init"] += 1
        if calls["init"] == 1:
            raise _NVMLError("Driver Not Loaded")

    module.nvmlInit = init
    monkeypatch.setitem(sys.modules, "pynvml", module)
    backend = nvml.RealBackend()
    assert backend.sample().error == "NVML unavailable: Driver Not Loaded"
    assert len(backend.sample().gpus) == 2


def test_real_backend_reads_reserved_memory_where_the_driver_has_v2(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(broken=set(), v2=423))
    gpu = nvml.RealBackend().sample().gpus[0]
    assert (gpu.memory_mib, gpu.reserved_mib) == (24576, 423)


def test_real_backend_asks_nvml_for_the_sm_samples_since_the_last_it_saw(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    module = _fake_pynvml(broken=set())
    monkeypatch.setitem(sys.modules, "pynvml", module)
    backend = nvml.RealBackend()
    assert backend.sample().gpus[0].processes[0].sm_percent == 30  # the mean of 20 and 41, rounded
    second = backend.sample().gpus[0]
    assert module.asked == [0, 0, 200, 200]  # per GPU: everything, then after the newest sample seen
    assert second.healthy and [p.sm_percent for p in second.processes] == [None, None]


def test_fake_scenario_per_process_sm_percent(tmp_path: Path) -> None:
    path = tmp_path / "nvml.yaml"
    path.write_text("gpus: [{index: 0, uuid: GPU-0, processes: [{pid: 1, sm_percent: 25}, {pid: 2}]}]")
    (gpu,) = nvml.FakeBackend(path).sample().gpus
    assert [p.sm_percent for p in gpu.processes] == [25, None]


def test_fake_scenario_reserved_memory(tmp_path: Path) -> None:
    path = tmp_path / "nvml.yaml"
    path.write_text(
        "gpus: [{index: 0, uuid: GPU-0, memory_mib: 16384, reserved_mib: 300}, {index: 1, uuid: GPU-1}]"
    )
    first, second = nvml.FakeBackend(path).sample().gpus
    assert (first.reserved_mib, second.reserved_mib) == (300, None)


def _c_listing(entries: list[tuple[int, int]]) -> Any:
    """A C process listing as NVML's are called: with no array, the count (INSUFFICIENT_SIZE); then the
    entries."""

    def function(handle: int, count: Any, array: Any) -> int:
        count._obj.value = len(entries)
        if array is None:
            return pynvml.NVML_ERROR_INSUFFICIENT_SIZE if entries else pynvml.NVML_SUCCESS
        for slot, (pid, used) in zip(array, entries, strict=False):
            slot.pid, slot.usedGpuMemory = pid, used
        return pynvml.NVML_SUCCESS

    return function


def _old_driver(monkeypatch: pytest.MonkeyPatch, symbols: dict[str, list[tuple[int, int]]]) -> None:
    """The real nvidia-ml-py over a driver that has only the process listings in `symbols` (C name ->
    entries as (pid, bytes)); every other call the agent makes answers as any driver does."""
    calls = {
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: None,
        "nvmlSystemGetDriverVersion": lambda: "470.256.02",
        "nvmlDeviceGetCount": lambda: 1,
        "nvmlDeviceGetHandleByIndex": lambda index: index,
        "nvmlDeviceGetUUID": lambda handle: "GPU-0",
        "nvmlDeviceGetName": lambda handle: "Tesla T4",
        "nvmlDeviceGetMemoryInfo": lambda handle, version=None: types.SimpleNamespace(total=16384 * MIB),
        "nvmlDeviceGetUtilizationRates": lambda handle: types.SimpleNamespace(gpu=10),
        "nvmlDeviceGetProcessUtilization": lambda handle, since: [],
    }
    for name, value in calls.items():
        monkeypatch.setattr(pynvml, name, value)

    def lookup(name: str) -> Any:
        if name not in symbols:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return _c_listing(symbols[name])

    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer", lookup)


UNKNOWN = pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value


@pytest.mark.parametrize(
    "symbols",
    [
        pytest.param(
            {
                "nvmlDeviceGetComputeRunningProcesses_v2": [(7, MIB), (8, UNKNOWN)],
                "nvmlDeviceGetMPSComputeRunningProcesses_v2": [(8, 3 * MIB)],
            },
            id="R470: _v2, no _v3",
        ),
        pytest.param(
            {
                "nvmlDeviceGetComputeRunningProcesses": [(7, MIB), (8, UNKNOWN)],
                "nvmlDeviceGetMPSComputeRunningProcesses": [(8, 3 * MIB)],
            },
            id="oldest: v1 only",
        ),
    ],
)
def test_a_driver_without_the_newest_process_listing_is_read_through_an_older_one(
    monkeypatch: pytest.MonkeyPatch, symbols: dict[str, list[tuple[int, int]]]
) -> None:
    """nvidia-ml-py's unversioned listings are `_v3`, which it reports missing with NVMLLibraryMismatchError
    (not an NVMLError): the older listings are asked instead, and the GPU is healthy."""
    _old_driver(monkeypatch, symbols)
    (gpu,) = nvml.RealBackend().sample().gpus
    assert gpu.healthy and gpu.error == ""
    assert gpu.processes == (GpuProcess(7, MIB), GpuProcess(8, 3 * MIB))


def test_a_driver_without_mps_listings_still_lists_compute_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    _old_driver(monkeypatch, {"nvmlDeviceGetComputeRunningProcesses_v2": [(7, UNKNOWN)]})
    (gpu,) = nvml.RealBackend().sample().gpus
    assert gpu.healthy and gpu.processes == (GpuProcess(7, None),)


def test_a_gpu_whose_processes_cannot_be_listed_is_unhealthy_not_a_crash(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _old_driver(monkeypatch, {})
    snapshot = nvml.RealBackend().sample()
    assert snapshot.error == ""
    (gpu,) = snapshot.gpus
    assert (gpu.uuid, gpu.healthy, gpu.error) == ("GPU-0", False, "Function Not Found")


def test_any_error_of_one_gpu_makes_it_unhealthy_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever nvidia-ml-py raises for one GPU, sample() does not raise, and the other GPU is read."""
    module = _fake_pynvml(broken=set())

    def name(handle: int) -> str:
        if handle == 1:
            raise _LibraryMismatch("Unversioned function called")
        return "NVIDIA L4"

    module.nvmlDeviceGetName = name
    monkeypatch.setitem(sys.modules, "pynvml", module)
    good, bad = nvml.RealBackend().sample().gpus
    assert good.healthy
    assert (bad.uuid, bad.healthy, bad.error) == (
        "GPU-1",
        False,
        "_LibraryMismatch: Unversioned function called",
    )


async def test_the_agent_publishes_an_old_drivers_gpus(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _old_driver(monkeypatch, {"nvmlDeviceGetComputeRunningProcesses_v2": []})
    node: dict[str, Any] = {"metadata": {"name": "n1", "labels": {}, "annotations": {}}, "status": {}}
    client = FakeNodeClient(node)
    agent = Agent(
        Settings(node_name="n1", mode=Mode.KILL, proc_root=tmp_path),
        client=client,
        nvml=nvml.RealBackend(),
        killer=RecordingKiller(),
    )
    report = await agent.tick()
    assert report.problems == [] and [gpu.healthy for gpu in report.snapshot.gpus] == [True]
    assert "gpufrac.io/gpus" in node["metadata"]["annotations"]


def test_an_nvidia_ml_py_without_its_library_mismatch_error_still_lists_processes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """nvidia-ml-py 12.535 (within the range the project declares) has no NVMLLibraryMismatchError: naming
    it made every GPU's sample fail, so every GPU read as unhealthy."""
    module = _fake_pynvml(broken=set())
    del module.NVMLLibraryMismatchError
    monkeypatch.setitem(sys.modules, "pynvml", module)
    gpu = nvml.RealBackend().sample().gpus[0]
    assert gpu.healthy and [process.pid for process in gpu.processes] == [7, 8], gpu.error
