"""Reading processes from /proc: which container a GPU process runs in, and who it is.

NVML gives host pids (the agent runs with `hostPID`); `/proc/<pid>/cgroup` names the process's cgroup, whose
path ends in the container's ID under every runtime and cgroup layout Kubernetes nodes use:

- cgroup v2 or v1, systemd driver: `/kubepods.slice/kubepods-burstable.slice/
  kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope` (CRI-O: `crio-<id>.scope`; Docker:
  `docker-<id>.scope`);
- cgroupfs driver: `/kubepods/burstable/pod<uid>/<id>`; plain Docker: `/docker/<id>`.

The root is configurable, so tests and the benchmark use a fake tree of `<pid>/cgroup` and `<pid>/stat`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_CONTAINER_ID = re.compile(r"[0-9a-f]{64}")
# A pod's cgroup: `pod<uid>` (cgroupfs driver), `kubepods-burstable-pod<uid>.slice` (systemd driver).
_POD = re.compile(r"(?:[a-z-]*-)?pod[0-9a-f_-]+(?:\.slice)?")
_RUNTIME_PREFIXES = ("cri-containerd-", "crio-", "docker-", "containerd-", "libpod-")


@dataclass(frozen=True)
class ProcessInfo:
    """A live process: `start_time` (clock ticks after boot) tells it apart from a later one with its pid."""

    pid: int
    ppid: int
    state: str
    start_time: int
    container_id: str | None


def container_id_from_cgroup(text: str) -> str | None:
    """The container ID in the contents of a `/proc/<pid>/cgroup` file, None for a process in no container.

    The cgroup v2 line (`0::<path>`) is read first; on a v1 host every hierarchy names the same container, so
    the first line that names one is taken. In a path, the container is the first ID below the pod's own
    cgroup (the first `pod<uid>` part; the whole path where there is none): cgroups below the container's
    are its processes' to make where they may write their cgroup tree, and one named with another
    container's ID must not make a process count as that container's (nor kind's node container, above
    the pod, as the process's).
    """
    lines = [line.split(":", 2) for line in text.splitlines() if line.count(":") >= 2]
    lines.sort(key=lambda parts: parts[0] != "0")
    for _, _, path in lines:
        parts = path.split("/")
        pod = next((i for i, part in enumerate(parts) if _POD.fullmatch(part)), -1)
        for part in parts[pod + 1 :]:
            found = _container_id_in(part)
            if found is not None:
                return found
    return None


def _container_id_in(part: str) -> str | None:
    name = part.removesuffix(".scope")
    if name.startswith("crio-conmon-"):
        return None  # CRI-O's monitor process, outside the container
    for prefix in _RUNTIME_PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix) :]
            break
    return name if _CONTAINER_ID.fullmatch(name) else None


def runtime_container_id(status_id: str) -> str:
    """`abc...` from a container status's `containerID`, `containerd://abc...` (or `cri-o://`, `docker://`)."""
    return status_id.partition("://")[2] or status_id


def parse_stat(data: bytes) -> tuple[str, int, int]:
    """(state, ppid, start time) from `/proc/<pid>/stat`. The command name is the process's to choose: it may
    hold spaces and parentheses, so fields are counted from the last `)`, and any bytes, so the file is read
    as bytes (decoded, a name that is not UTF-8 would hide the start time, and an unknown start time is a
    process the killer must spare)."""
    fields = data[data.rindex(b")") + 2 :].split()
    return fields[0].decode("ascii"), int(fields[1]), int(fields[19])


class ProcFS:
    def __init__(self, root: Path = Path("/proc")) -> None:
        self.root = root

    def process(self, pid: int) -> ProcessInfo | None:
        """The process, or None if it has ended (or this /proc cannot see it: no `hostPID`)."""
        base = self.root / str(pid)
        try:
            # Paths are bytes; a cgroup name that is not UTF-8 names no container (IDs are hex).
            cgroup = (base / "cgroup").read_bytes().decode("utf-8", "replace")
        except OSError:
            return None
        try:
            state, ppid, start_time = parse_stat((base / "stat").read_bytes())
        except (OSError, ValueError, IndexError):
            # A fake tree may leave stat out; a real process always has one, unless it just ended.
            state, ppid, start_time = "R", 0, 0
        return ProcessInfo(pid, ppid, state, start_time, container_id_from_cgroup(cgroup))

    def alive(self, pid: int) -> bool:
        """True for a process that exists and is not a zombie waiting to be reaped."""
        info = self.process(pid)
        return info is not None and info.state not in ("Z", "X")
