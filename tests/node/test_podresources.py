"""The PodResources client against a fake kubelet: what it reads from the answers, and a failure of every
kind told as one line naming the socket."""

from __future__ import annotations

import socket as sockets
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from gpufrac.node.kubelet import podresources, protos
from gpufrac.node.kubelet.podresources import ContainerDevices, PodResourcesClient, PodResourcesError

from .grpc_fakes import serving, unary

M = protos.podresources
SERVICE = "v1.PodResourcesLister"
GPU = "nvidia.com/gpu"


@pytest.fixture
def socket(tmp_path: Path) -> Path:
    return tmp_path / "kubelet.sock"


@pytest.fixture
def client(socket: Path) -> Iterator[PodResourcesClient]:
    client = PodResourcesClient(socket, timeout=5)
    yield client
    client.close()


def kubelet(socket: Path, *, listed: Any = None, allocatable: Any = None) -> Any:
    """A kubelet answering List with ``listed`` and, if given, GetAllocatableResources ``allocatable``."""
    handlers = {"List": unary(M["ListPodResourcesRequest"], lambda request, context: listed)}
    if allocatable is not None:
        handlers["GetAllocatableResources"] = unary(
            M["AllocatableResourcesRequest"], lambda request, context: allocatable
        )
    return serving(socket, SERVICE, handlers)


def devices(resource: str, *ids: str, numa: int = 0) -> Any:
    return M["ContainerDevices"](resource_name=resource, device_ids=ids, topology={"nodes": [{"ID": numa}]})


def pods(*devices_of_containers: list[Any]) -> Any:
    """One pod `p<i>` in namespace `ns` per argument, with one container `c` holding the devices given."""
    return M["ListPodResourcesResponse"](
        pod_resources=[
            {"name": f"p{i}", "namespace": "ns", "containers": [{"name": "c", "devices": held}]}
            for i, held in enumerate(devices_of_containers)
        ]
    )


def failure(excinfo: pytest.ExceptionInfo[PodResourcesError], socket: Path) -> str:
    """The error's message, checked to be one line naming the socket, with no grpc error chained."""
    message = str(excinfo.value)
    assert "\n" not in message and str(socket) in message
    error = excinfo.value
    assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__)
    return message


def test_list_reads_every_field_one_entry_per_container_and_resource(
    socket: Path, client: PodResourcesClient
) -> None:
    answer = M["ListPodResourcesResponse"](
        pod_resources=[
            {
                "name": "train",
                "namespace": "ml",
                "containers": [
                    # Newer kubelets: one group per device and NUMA node, a device on two nodes twice.
                    {
                        "name": "cuda",
                        "devices": [
                            devices(GPU, "GPU-a", numa=0),
                            devices(GPU, "GPU-b", numa=1),
                            devices(GPU, "GPU-b", numa=0),
                            devices("example.com/nic", "nic-0"),
                        ],
                        "cpu_ids": [2, 3],
                    },
                    {"name": "sidecar"},  # holds no device: not listed
                ],
            },
            {
                "name": "infer",
                "namespace": "web",
                "containers": [{"name": "app", "devices": [devices(GPU, "GPU-c", "GPU-d")]}],
            },
            {"name": "idle", "namespace": "web", "containers": [{"name": "app", "devices": [devices(GPU)]}]},
        ]
    )
    with kubelet(socket, listed=answer):
        assert client.list() == (
            ContainerDevices("ml", "train", "cuda", GPU, ("GPU-a", "GPU-b")),
            ContainerDevices("ml", "train", "cuda", "example.com/nic", ("nic-0",)),
            ContainerDevices("web", "infer", "app", GPU, ("GPU-c", "GPU-d")),
        )


def test_allocatable_gives_each_resource_its_devices(socket: Path, client: PodResourcesClient) -> None:
    answer = M["AllocatableResourcesResponse"](
        devices=[devices(GPU, "GPU-a", numa=0), devices(GPU, "GPU-b", numa=1), devices("x.io/y", "y0")],
        cpu_ids=[0, 1],
    )
    with kubelet(socket, listed=pods(), allocatable=answer):
        assert client.allocatable() == {GPU: ("GPU-a", "GPU-b"), "x.io/y": ("y0",)}


def test_allocatable_is_none_when_the_kubelet_does_not_have_it(
    socket: Path, client: PodResourcesClient
) -> None:
    with kubelet(socket, listed=pods([devices(GPU, "GPU-a")])):
        assert client.allocatable() is None
        assert client.list() == (ContainerDevices("ns", "p0", "c", GPU, ("GPU-a",)),)


def test_a_kubelet_without_list_is_an_error(socket: Path, client: PodResourcesClient) -> None:
    with serving(socket, SERVICE, {}), pytest.raises(PodResourcesError) as excinfo:
        client.list()
    assert "UNIMPLEMENTED" in failure(excinfo, socket)


def test_a_missing_socket_is_an_error_saying_what_to_mount(socket: Path, client: PodResourcesClient) -> None:
    for call in (client.list, client.allocatable):
        with pytest.raises(PodResourcesError) as excinfo:
            call()
        message = failure(excinfo, socket)
        assert "does not exist" in message and f"mount the host's {socket.parent}" in message


def test_a_plain_file_is_not_the_socket(socket: Path, client: PodResourcesClient) -> None:
    socket.write_text("")
    with pytest.raises(PodResourcesError) as excinfo:
        client.list()
    assert "is not a unix socket" in failure(excinfo, socket)


def test_a_socket_nobody_listens_on_is_unavailable(socket: Path, client: PodResourcesClient) -> None:
    """What a kubelet that died leaves behind."""
    with sockets.socket(sockets.AF_UNIX) as stale:
        stale.bind(str(socket))
        with pytest.raises(PodResourcesError) as excinfo:
            client.list()
    message = failure(excinfo, socket)
    assert "UNAVAILABLE" in message and "kubelet is running" in message


def test_a_kubelet_that_never_answers_is_an_error_once_the_timeout_is_over(socket: Path) -> None:
    released = threading.Event()

    def stuck(request: Any, context: grpc.ServicerContext) -> Any:
        released.wait()
        return pods()

    client = PodResourcesClient(socket, timeout=0.2)
    try:
        with serving(socket, SERVICE, {"List": unary(M["ListPodResourcesRequest"], stuck)}):
            with pytest.raises(PodResourcesError) as excinfo:
                client.list()
            released.set()
    finally:
        client.close()
    message = failure(excinfo, socket)
    assert "DEADLINE_EXCEEDED" in message and "did not answer in time" in message


def test_an_answer_that_is_not_podresources_is_an_error(socket: Path, client: PodResourcesClient) -> None:
    answer = b"\x0a\x05\xff"  # field 1, five bytes long, one given
    broken = serving(socket, SERVICE, {"List": unary(M["ListPodResourcesRequest"], lambda r, c: answer)})
    with broken, pytest.raises(PodResourcesError) as excinfo:
        client.list()
    assert "INTERNAL" in failure(excinfo, socket)


def test_an_answer_over_the_entries_bound_is_an_error(
    socket: Path, client: PodResourcesClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(podresources, "MAX_ENTRIES", 5)
    with kubelet(socket, listed=pods([devices(GPU, "a", "b")])):
        assert len(client.list()) == 1  # pod, container, group and two IDs: five
    with (
        kubelet(socket, listed=pods([devices(GPU, "a", "b", "c")])),
        pytest.raises(PodResourcesError) as excinfo,
    ):
        client.list()
    assert "malformed answer (more than 5 entries)" in failure(excinfo, socket)


@pytest.mark.parametrize("device", ["", "x" * (podresources.MAX_TEXT + 1)])
def test_an_empty_or_overlong_device_id_is_an_error(
    socket: Path, client: PodResourcesClient, device: str
) -> None:
    with kubelet(socket, listed=pods([devices(GPU, device)])), pytest.raises(PodResourcesError) as excinfo:
        client.list()
    assert "malformed answer" in failure(excinfo, socket)
