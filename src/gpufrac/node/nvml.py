"""What the agent needs from NVML, behind one small interface, with a real backend and a fake one.

`Backend.sample()` returns a `Snapshot`: the driver version and, per GPU, its identity, memory, utilization
and compute processes, each with its SM utilization where NVML sampled it. It never raises: NVML missing
(no driver, no library) is a snapshot with `error` set and no GPUs, and a call failing on one GPU marks
that GPU unhealthy with the reason, so one bad GPU cannot stop the agent from reporting and guarding the
others.

The fake backend reads a JSON or YAML file and reads it again whenever it changes, so a test plays out a
scenario by rewriting the file between ticks::

    driver_version: "535.104.05"
    nvml_error: "..."            # optional: NVML as a whole fails, as if the library were missing
    gpus:
      - index: 0
        uuid: GPU-00000000-0000-0000-0000-000000000000
        model: NVIDIA A100-SXM4-80GB
        memory_mib: 81920
        reserved_mib: 512        # optional: what the driver keeps (NVML's memory info v2)
        utilization: 0.25        # optional, 0 to 1
        error: "GPU is lost"     # optional: every call on this GPU fails
        processes:
          - {pid: 4242, used_mib: 1024, sm_percent: 30}   # sm_percent optional, 0 to 100
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
from dataclasses import dataclass, replace
from pathlib import Path
from statistics import mean
from typing import Any, Protocol

from gpufrac import reading
from gpufrac.errors import UserError

log = logging.getLogger(__name__)

MIB = 1024 * 1024
MAX_SCENARIO_BYTES = 4 * MIB


@dataclass(frozen=True)
class GpuProcess:
    """A process with a CUDA context on a GPU; `used_bytes` is None where NVML cannot tell. `sm_percent`: the
    percentage of the GPU's SMs it kept busy since the last sample, None where NVML took no sample of it."""

    pid: int
    used_bytes: int | None
    sm_percent: int | None = None


@dataclass(frozen=True)
class GpuSample:
    """One GPU at one moment. Unhealthy GPUs carry `error`, and whatever NVML still answered.
    `reserved_mib`: the memory the driver keeps for itself, None where NVML cannot tell (before memory
    info v2)."""

    index: int
    uuid: str
    model: str
    memory_mib: int
    healthy: bool
    utilization: float | None = None
    processes: tuple[GpuProcess, ...] = ()
    error: str = ""
    reserved_mib: int | None = None


@dataclass(frozen=True)
class Snapshot:
    """Every GPU of the node at one moment; `error` set (and no GPUs) when NVML itself is unavailable."""

    driver_version: str = ""
    gpus: tuple[GpuSample, ...] = ()
    error: str = ""


class Backend(Protocol):
    def sample(self) -> Snapshot: ...

    def close(self) -> None: ...


def open_backend(spec: str) -> Backend:
    """`real`, or `fake:FILE`; a ValueError naming both forms for anything else."""
    if spec == "real":
        return RealBackend()
    if spec.startswith("fake:") and len(spec) > len("fake:"):
        return FakeBackend(Path(spec[len("fake:") :]))
    raise ValueError(f"--nvml {spec!r}: use 'real' or 'fake:FILE'")


class RealBackend:
    """NVML through `nvidia-ml-py`. Initialised on first use and again after NVML fails as a whole, so an
    agent started before the driver was loaded picks the GPUs up once it is."""

    def __init__(self) -> None:
        self._ready = False
        self._sampled: dict[int, int] = {}  # GPU index -> NVML timestamp (µs) of its newest process sample

    def sample(self) -> Snapshot:
        try:
            import pynvml
        except ImportError as error:  # pragma: no cover - a dependency of gpufrac
            return Snapshot(error=f"nvidia-ml-py is not installed ({error})")
        try:
            if not self._ready:
                pynvml.nvmlInit()
                self._ready = True
            driver = _text(pynvml.nvmlSystemGetDriverVersion())
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as error:
            self.close()
            return Snapshot(error=f"NVML unavailable: {error}")
        return Snapshot(driver, tuple(self._gpu(pynvml, index) for index in range(count)))

    def _gpu(self, pynvml: Any, index: int) -> GpuSample:
        uuid, model, memory_mib = "", "", 0
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
            model = _text(pynvml.nvmlDeviceGetName(handle))
            memory_mib, reserved_mib = _memory(pynvml, handle)
            processes = _processes(pynvml, handle)
            sm, self._sampled[index] = _sm_percent(pynvml, handle, self._sampled.get(index, 0))
            processes = tuple(replace(process, sm_percent=sm.get(process.pid)) for process in processes)
            utilization = _utilization(pynvml, handle)
        except Exception as error:
            # Not only NVMLError: nvidia-ml-py raises others too (NVMLLibraryMismatchError, not an NVMLError,
            # for a call the driver is too old for), and whatever it is, it is this GPU's problem alone.
            reason = str(error) if isinstance(error, pynvml.NVMLError) else f"{type(error).__name__}: {error}"
            return GpuSample(index, uuid, model, memory_mib, healthy=False, error=reason)
        return GpuSample(index, uuid, model, memory_mib, True, utilization, processes, "", reserved_mib)

    def close(self) -> None:
        if self._ready:
            self._ready = False
            try:
                import pynvml

                pynvml.nvmlShutdown()
            except Exception:
                pass


def _memory(pynvml: Any, handle: Any) -> tuple[int, int | None]:
    """Total and reserved MiB. Memory info v2 has `reserved` (what the driver keeps: a process can never
    allocate it); a driver or nvidia-ml-py without v2 gives the total alone."""
    try:
        info = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
        return int(info.total) // MIB, int(info.reserved) // MIB
    except (pynvml.NVMLError, AttributeError, TypeError):
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).total) // MIB, None


def _utilization(pynvml: Any, handle: Any) -> float | None:
    """The GPU's utilization, 0 to 1; None where NVML cannot tell (not supported on every GPU), which is not
    a health problem."""
    try:
        return float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu) / 100
    except pynvml.NVMLError:
        return None


def _processes(pynvml: Any, handle: Any) -> tuple[GpuProcess, ...]:
    """Compute processes, and MPS clients where the driver lists them apart; one entry per pid."""
    found: dict[int, int | None] = {}
    listings = [_listing(pynvml, handle, "nvmlDeviceGetComputeRunningProcesses")]
    # No MPS on this GPU, or a driver that does not list MPS clients apart: the first listing has them all.
    with contextlib.suppress(pynvml.NVMLError):
        listings.append(_listing(pynvml, handle, "nvmlDeviceGetMPSComputeRunningProcesses"))
    for listing in listings:
        for pid, used in listing:
            if used is not None or pid not in found:
                found[pid] = used
    return tuple(GpuProcess(pid, used) for pid, used in sorted(found.items()))


def _listing(pynvml: Any, handle: Any, name: str) -> list[tuple[int, int | None]]:
    """The process listing `name` as (pid, bytes used or None), in the newest version the driver has.

    nvidia-ml-py's unversioned call is its newest version (`_v3` today), which R470 and older drivers lack;
    it then raises NVMLLibraryMismatchError, which is not an NVMLError, so without a fallback an old driver
    would list no process on any GPU. Older drivers have `_v2`, and the oldest only the plain symbol (v1),
    which nvidia-ml-py no longer wraps. A driver with none of them raises an NVMLError (function not found).
    """
    # nvidia-ml-py 12.535, which the agent supports, has no NVMLLibraryMismatchError (its unversioned call
    # is v2 there, which every supported driver has).
    missing = (
        pynvml.NVMLError_FunctionNotFound,
        getattr(pynvml, "NVMLLibraryMismatchError", pynvml.NVMLError_FunctionNotFound),
    )
    for call in (getattr(pynvml, name), getattr(pynvml, f"{name}_v2", None)):
        if call is not None:
            with contextlib.suppress(*missing):
                return [_entry(info.pid, info.usedGpuMemory, None) for info in call(handle)]
    return _listing_v1(pynvml, handle, name)


def _entry(pid: int, used: int | None, unknown: int | None) -> tuple[int, int | None]:
    return int(pid), None if used is None or used == unknown else int(used)


class _ProcessInfoV1(ctypes.Structure):
    """`nvmlProcessInfo_v1_t`, the entry of the plain (v1) process listings."""

    _fields_ = (("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong))


def _listing_v1(pynvml: Any, handle: Any, name: str) -> list[tuple[int, int | None]]:
    """The plain (v1) listing `name`, called as nvidia-ml-py calls the newer ones: once for the count, then
    with room for a few more processes started in between."""
    function = pynvml._nvmlGetFunctionPointer(name)
    count = ctypes.c_uint(0)
    status = function(handle, ctypes.byref(count), None)
    if status == pynvml.NVML_SUCCESS:
        return []  # no process
    if status != pynvml.NVML_ERROR_INSUFFICIENT_SIZE:
        raise pynvml.NVMLError(status)
    count.value = count.value * 2 + 5
    entries = (_ProcessInfoV1 * count.value)()
    status = function(handle, ctypes.byref(count), entries)
    if status != pynvml.NVML_SUCCESS:
        raise pynvml.NVMLError(status)
    unknown = pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value  # nvidia-ml-py's newer calls give None
    return [_entry(entry.pid, entry.usedGpuMemory, unknown) for entry in entries[: count.value]]


def _sm_percent(pynvml: Any, handle: Any, since: int) -> tuple[dict[int, int], int]:
    """Per pid, the mean SM utilization of the samples NVML took after `since` (its µs timestamp), and the
    newest sample's timestamp, to ask from next time.

    NVML keeps a short buffer of per-process samples; asking from the last one seen gives each tick the
    samples of its own interval. No sample (NVML raises then, even with nothing wrong) or no support leaves
    the processes without one: compute use is reported, never a reason to call a GPU unhealthy.
    """
    try:
        samples = pynvml.nvmlDeviceGetProcessUtilization(handle, since)
    except pynvml.NVMLError:
        return {}, since
    by_pid: dict[int, list[int]] = {}
    for sample in samples:
        by_pid.setdefault(int(sample.pid), []).append(int(sample.smUtil))
    newest = max((int(sample.timeStamp) for sample in samples), default=since)
    return {pid: round(mean(values)) for pid, values in by_pid.items()}, newest


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


class FakeBackend:
    """Reads a scenario file (format in the module docstring), again each time it changes or is replaced."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int, int] | None = None
        self._snapshot = Snapshot(error="not read yet")

    def sample(self) -> Snapshot:
        try:
            stat = os.stat(self.path)
        except OSError as error:
            self._stamp = None
            return Snapshot(error=f"fake NVML file {self.path}: {error.strerror}")
        # The inode too: a file replaced twice within the clock's resolution keeps its mtime.
        stamp = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        if stamp != self._stamp:
            self._stamp = stamp
            try:
                text = reading.read_text(self.path, limit=MAX_SCENARIO_BYTES)
                self._snapshot = _scenario(reading.load_yaml(text, name=str(self.path)))
            except UserError as error:
                self._snapshot = Snapshot(error=f"fake NVML file {error}")
            except (ValueError, TypeError, KeyError, AttributeError) as error:
                self._snapshot = Snapshot(error=f"fake NVML file {self.path}: {error}")
        return self._snapshot

    def close(self) -> None:
        pass


def _scenario(data: Any) -> Snapshot:
    if not isinstance(data, dict):
        raise ValueError("must be a mapping with driver_version and gpus")
    if data.get("nvml_error"):
        return Snapshot(error=f"NVML unavailable: {data['nvml_error']}")
    gpus = []
    for item in data.get("gpus") or []:
        processes = tuple(
            GpuProcess(
                int(p["pid"]),
                None if p.get("used_mib") is None else int(p["used_mib"]) * MIB,
                None if p.get("sm_percent") is None else int(p["sm_percent"]),
            )
            for p in item.get("processes") or []
        )
        error = str(item.get("error") or "")
        utilization = item.get("utilization")
        reserved = item.get("reserved_mib")
        gpus.append(
            GpuSample(
                index=int(item["index"]),
                uuid=str(item["uuid"]),
                model=str(item.get("model", "")),
                memory_mib=int(item.get("memory_mib", 0)),
                healthy=not error,
                utilization=None if utilization is None or error else float(utilization),
                processes=() if error else processes,
                error=error,
                reserved_mib=None if reserved is None else int(reserved),
            )
        )
    return Snapshot(str(data.get("driver_version", "")), tuple(gpus))
