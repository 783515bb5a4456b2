"""A fake GPU host on disk: a scenario file for the fake NVML backend and a fake /proc tree to match.

For the tests, the benchmark and trying the agent without a GPU (`gpufrac agent --nvml fake:FILE
--proc-root DIR`). Scenario changes are written by replacing the file, so the backend never reads half of
one.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from gpufrac.node.watchdog import Process

LAYOUTS = {
    "containerd": "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{pod}.slice/"
    "cri-containerd-{id}.scope\n",
    "crio": "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{pod}.slice/"
    "crio-{id}.scope\n",
    "cgroupfs-v1": "12:memory:/kubepods/burstable/pod{pod}/{id}\n"
    "11:cpu,cpuacct:/kubepods/burstable/pod{pod}/{id}\n",
    "docker": "4:devices:/docker/{id}\n",
}


def container_id(n: int) -> str:
    """A made-up 64-hex-digit container ID."""
    return f"{n:064x}"


@dataclass
class FakeHost:
    root: Path
    driver_version: str = "535.104.05"
    gpus: list[dict[str, Any]] = field(default_factory=list)

    @property
    def proc(self) -> Path:
        return self.root / "proc"

    @property
    def nvml_file(self) -> Path:
        return self.root / "nvml.yaml"

    def add_gpus(self, count: int, *, memory_mib: int = 81920, model: str = "NVIDIA A100-SXM4-80GB") -> None:
        for index in range(len(self.gpus), len(self.gpus) + count):
            uuid = f"GPU-{index:08x}-0000-4000-8000-{index:012x}"
            self.gpus.append({"index": index, "uuid": uuid, "model": model, "memory_mib": memory_mib})

    def uuid(self, index: int) -> str:
        return str(self.gpus[index]["uuid"])

    def add_process(
        self,
        pid: int,
        *,
        container: str | None,
        layout: str = "containerd",
        ppid: int = 1,
        start_time: int | None = None,
        pod_uid: str = "0000",
    ) -> None:
        """A process in `container` (an ID; None: a host process outside any container)."""
        base = self.proc / str(pid)
        base.mkdir(parents=True, exist_ok=True)
        cgroup = "0::/system.slice/ssh.service\n" if container is None else LAYOUTS[layout]
        (base / "cgroup").write_text(cgroup.format(id=container, pod=pod_uid.replace("-", "_")))
        started = 100_000 + pid if start_time is None else start_time
        fields = ["S", str(ppid), *["0"] * 17, str(started), "0"]
        (base / "stat").write_text(f"{pid} (python3 my app) {' '.join(fields)}\n")

    def remove_process(self, pid: int) -> None:
        base = self.proc / str(pid)
        for child in base.iterdir():
            child.unlink()
        base.rmdir()

    def write(
        self,
        processes: Mapping[int, Iterable[tuple[int, int]]] | None = None,
        *,
        nvml_error: str = "",
        errors: Mapping[int, str] | None = None,
        utilization: float | None = None,
    ) -> None:
        """The scenario: per GPU index, its processes as (pid, used MiB); `errors` per GPU index."""
        gpus = []
        for gpu in self.gpus:
            entry = dict(gpu)
            listed = (processes or {}).get(gpu["index"], ())
            entry["processes"] = [{"pid": pid, "used_mib": used} for pid, used in listed]
            if errors and gpu["index"] in errors:
                entry["error"] = errors[gpu["index"]]
            if utilization is not None:
                entry["utilization"] = utilization
            gpus.append(entry)
        data: dict[str, Any] = {"driver_version": self.driver_version, "gpus": gpus}
        if nvml_error:
            data["nvml_error"] = nvml_error
        self.root.mkdir(parents=True, exist_ok=True)
        partial = self.nvml_file.with_suffix(".tmp")
        partial.write_text(yaml.safe_dump(data, sort_keys=False))
        os.replace(partial, self.nvml_file)


class RecordingKiller:
    """Kills nothing; remembers whom it was asked to kill."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def kill(self, process: Process) -> str:
        self.calls.append(process.pid)
        return "killed"
