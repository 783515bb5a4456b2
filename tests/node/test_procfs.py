"""From a GPU process's pid to its container: cgroup paths of every runtime and layout."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufrac.node import procfs
from gpufrac.testing.fakehost import LAYOUTS, FakeHost, container_id

ID = container_id(0xABC)
OTHER = container_id(0xDEF)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_every_layout_names_the_container(layout: str) -> None:
    text = LAYOUTS[layout].format(id=ID, pod="1234_5678")
    assert procfs.container_id_from_cgroup(text) == ID


@pytest.mark.parametrize(
    "text",
    [
        # cgroup v1 with the systemd driver: every hierarchy names the container.
        f"12:pids:/kubepods.slice/kubepods-pod1.slice/cri-containerd-{ID}.scope\n"
        f"1:name=systemd:/kubepods.slice/kubepods-pod1.slice/cri-containerd-{ID}.scope\n",
        # the v2 line wins over stale v1 lines of a hybrid host
        f"1:name=systemd:/user.slice\n0::/kubepods/pod1/{ID}\n",
        # docker under the systemd driver, and containerd without the cri prefix
        f"0::/system.slice/docker-{ID}.scope\n",
        f"0::/kubepods/besteffort/pod1/containerd-{ID}.scope\n",
        # kind and other nested hierarchies
        f"0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod1.slice/cri-containerd-{ID}.scope\n",
        # A process that may write its cgroup tree (a privileged container, systemd inside one) made a
        # cgroup below its container's and named it with another container's ID: it is still its own.
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1_2.slice/cri-containerd-{ID}.scope/"
        f"{OTHER}\n",
        f"0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-{ID}.scope/cri-containerd-{OTHER}.scope/x\n",
        f"4:memory:/kubepods/burstable/pod1/{ID}/pod2/{OTHER}\n",
        # kind on cgroup v1: the node is itself a Docker container, above the pod
        f"4:memory:/docker/{OTHER}/kubepods/besteffort/pod1/{ID}\n",
    ],
)
def test_more_hierarchies(text: str) -> None:
    assert procfs.container_id_from_cgroup(text) == ID


@pytest.mark.parametrize(
    "text",
    [
        "0::/system.slice/ssh.service\n",
        "0::/\n",
        "",
        f"0::/kubepods.slice/kubepods-pod1.slice/crio-conmon-{ID}.scope\n",
        "0::/docker/abc123\n",  # too short to be an ID
        "garbage\n",
    ],
)
def test_no_container(text: str) -> None:
    assert procfs.container_id_from_cgroup(text) is None


def test_runtime_container_id() -> None:
    assert procfs.runtime_container_id(f"containerd://{ID}") == ID
    assert procfs.runtime_container_id(f"cri-o://{ID}") == ID
    assert procfs.runtime_container_id(ID) == ID


def test_stat_with_a_hostile_command_name() -> None:
    fields = ["S", "77", *["0"] * 17, "424242", "0"]
    assert procfs.parse_stat(f"12 (a) b) (c) {' '.join(fields)}".encode()) == ("S", 77, 424242)


def test_a_command_name_that_is_not_utf8_still_gives_the_start_time(tmp_path: Path) -> None:
    """Any process may name itself with any bytes (`/proc/self/comm`); read as text, such a name hid its start
    time, and the killer spares a process whose start time is unknown: a watchdog evaded by one write."""
    host = FakeHost(tmp_path)
    host.add_process(10, container=ID, ppid=3, start_time=99)
    stat = host.proc / "10" / "stat"
    stat.write_bytes(stat.read_bytes().replace(b"python3 my app", b"\xff\xfe) R 1"))
    cgroup = host.proc / "10" / "cgroup"
    cgroup.write_bytes(cgroup.read_bytes() + b"1:name=\xff:/\n")
    assert procfs.ProcFS(host.proc).process(10) == procfs.ProcessInfo(10, 3, "S", 99, ID)


def test_fake_tree(tmp_path: Path) -> None:
    host = FakeHost(tmp_path)
    host.add_process(10, container=ID, ppid=3, start_time=99)
    host.add_process(11, container=None)
    proc = procfs.ProcFS(host.proc)
    assert proc.process(10) == procfs.ProcessInfo(10, 3, "S", 99, ID)
    info = proc.process(11)
    assert info is not None and info.container_id is None
    assert proc.process(12) is None
    assert proc.alive(10) and not proc.alive(12)
    host.remove_process(10)
    assert proc.process(10) is None


def test_this_process_is_alive() -> None:
    import os

    proc = procfs.ProcFS()
    me = proc.process(os.getpid())
    assert me is not None and me.start_time > 0 and proc.alive(os.getpid())
