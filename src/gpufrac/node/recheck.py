"""A second look at a process the watchdog judged, before the agent kills it or evicts its pod: between
the tick's NVML sample and its /proc read the process may have ended and its pid gone to another, which
would then be charged with the memory NVML listed and punished for it.

/proc says whether the pid still names the judged process (same start time, same container), NVML, asked
again, whether it still holds its GPU, and /proc again whether it is still the same process. A pid cannot
be reused while its process lives, so a process seen the same before and after that NVML sample is the one
NVML listed; a pid reused before the tick's /proc read names a process that is not on the GPU, and the
second sample says so.
"""

from __future__ import annotations

from gpufrac.node import procfs, watchdog
from gpufrac.node.nvml import Backend


class Unconfirmed(Exception):
    """The process cannot be told to still hold its GPU (start time unknown, NVML failing or not listing
    it): nothing is done to it now, and the next interval judges it again, rather than a hiccup sparing it
    for good."""


class SecondLook:
    def __init__(self, proc: procfs.ProcFS, nvml: Backend) -> None:
        self._proc = proc
        self._nvml = nvml

    def gone(self, process: watchdog.Process) -> str:
        """How the judged process is gone (ended, or its pid reused); empty while it still holds its GPU.
        Unconfirmed when that cannot be told."""
        if not process.start_time:
            raise Unconfirmed("its start time is unknown, so its pid may name another process")
        gone = self._changed(process)
        if not gone:
            self._check_on_gpu(process)
            gone = self._changed(process)
        return gone

    def _changed(self, process: watchdog.Process) -> str:
        info = self._proc.process(process.pid)
        if info is None:
            return "already gone"
        if info.start_time != process.start_time or info.container_id != process.container_id:
            return "gone: its pid now names another process"
        return ""

    def _check_on_gpu(self, process: watchdog.Process) -> None:
        snapshot = self._nvml.sample()
        gpu = next((gpu for gpu in snapshot.gpus if gpu.uuid == process.gpu.uuid), None)
        if snapshot.error or gpu is None or not gpu.healthy:
            why = snapshot.error or (gpu.error if gpu is not None else "the GPU is not listed")
            raise Unconfirmed(f"NVML cannot say whether it still holds the GPU ({why})")
        if all(p.pid != process.pid for p in gpu.processes):
            raise Unconfirmed("no longer on the GPU")
