"""A client of the kubelet's PodResources API (v1): which devices each container holds, and which devices
the node has.

The kubelet decides which device a pod asking `nvidia.com/gpu` gets, and tells nobody but this API; the
agent reads it to know which GPUs a device plugin has handed out. The answer is bounded (entries and text
length) before it is used, since a broken kubelet, or whatever else listens on the socket, must not make
the agent build an unbounded list.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc

from . import calls, protos

DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
# Pods, containers, device groups and device IDs read from one answer, all counted together: a node runs
# at most a few hundred pods, each with a few devices.
MAX_ENTRIES = 100_000
# A device ID, resource, pod or container name: Kubernetes names are at most 253 characters, GPU UUIDs 40.
MAX_TEXT = 1024
# The kubelet's own PodResources client accepts answers of up to 16 MiB; gRPC's default is 4.
MAX_ANSWER_BYTES = 16 * 1024 * 1024

_M = protos.podresources
_T = TypeVar("_T")


@dataclass(frozen=True)
class ContainerDevices:
    """The devices of one extended resource (e.g. `nvidia.com/gpu`) one container holds."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]


class PodResourcesError(Exception):
    """The kubelet's PodResources API could not be read: one line naming the socket, what failed, the fix."""


class PodResourcesClient:
    """Calls the kubelet's PodResources API on ``socket``, each call waiting at most ``timeout`` seconds.

    The channel reconnects by itself when the kubelet restarts and makes its socket again, so one client
    serves the agent's whole life."""

    def __init__(self, socket: Path = DEFAULT_SOCKET, *, timeout: float = 5.0) -> None:
        self.socket = socket
        self.timeout = timeout
        self._channel = grpc.insecure_channel(
            f"unix:{socket}", options=[("grpc.max_receive_message_length", MAX_ANSWER_BYTES)]
        )

    def list(self) -> tuple[ContainerDevices, ...]:
        """/v1.PodResourcesLister/List: one entry per (pod, container, resource) that holds devices."""
        answer = self._call("List", "ListPodResourcesRequest", "ListPodResourcesResponse")
        read = _Reader(self.socket)
        found = []
        for pod in read.each(answer.pod_resources):
            for container in read.each(pod.containers):
                for resource, ids in read.devices(container.devices).items():
                    names = (read.text(pod.namespace), read.text(pod.name), read.text(container.name))
                    found.append(ContainerDevices(*names, resource, ids))
        return tuple(found)

    def allocatable(self) -> dict[str, tuple[str, ...]] | None:
        """/v1.PodResourcesLister/GetAllocatableResources: resource -> device IDs. None when this kubelet
        does not have it (gRPC UNIMPLEMENTED: Kubernetes before 1.21, or its feature gate off)."""
        answer = self._call(
            "GetAllocatableResources",
            "AllocatableResourcesRequest",
            "AllocatableResourcesResponse",
            optional=True,
        )
        return None if answer is None else _Reader(self.socket).devices(answer.devices)

    def close(self) -> None:
        self._channel.close()

    def _call(self, method: str, request: str, response: str, *, optional: bool = False) -> Any:
        """The kubelet's answer to ``method``; None when ``optional`` and the kubelet does not have it."""
        problem = calls.socket_problem(self.socket)
        if problem is not None:
            raise _error(self.socket, f"{problem}: mount the host's {self.socket.parent} into the agent")
        call = protos.unary(self._channel, f"/v1.PodResourcesLister/{method}", _M[response])
        try:
            return call(_M[request](), timeout=self.timeout)
        except grpc.RpcError as error:
            code, line = calls.status(error)
            if optional and code == grpc.StatusCode.UNIMPLEMENTED:
                return None
            raise _error(self.socket, f"{method} failed ({line}); {_FIXES.get(code, _FIX_OTHER)}") from None


def _error(socket: Path, what: str) -> PodResourcesError:
    return PodResourcesError(f"kubelet PodResources socket {socket}: {what}")


_FIX_OTHER = "check the kubelet's log"
_FIXES = {
    grpc.StatusCode.DEADLINE_EXCEEDED: "the kubelet did not answer in time; check that it is running",
    grpc.StatusCode.UNAVAILABLE: "check that the kubelet is running and the agent runs as root",
    grpc.StatusCode.UNIMPLEMENTED: "this kubelet has no PodResources v1; it needs Kubernetes 1.20 or later",
    grpc.StatusCode.INTERNAL: "the answer is not PodResources v1; check what listens on the socket",
    grpc.StatusCode.RESOURCE_EXHAUSTED: f"the answer is over {MAX_ANSWER_BYTES} bytes",
}


class _Reader:
    """Reads one answer, counting its entries and bounding its text (see MAX_ENTRIES and MAX_TEXT)."""

    def __init__(self, socket: Path) -> None:
        self.socket = socket
        self.left = MAX_ENTRIES

    def each(self, items: Iterable[_T]) -> Iterator[_T]:
        for item in items:
            self.left -= 1
            if self.left < 0:
                raise self._malformed(f"more than {MAX_ENTRIES} entries")
            yield item

    def text(self, value: str) -> str:
        if not value or len(value) > MAX_TEXT:
            raise self._malformed(f"a name or device ID empty or over {MAX_TEXT} characters")
        return value

    def devices(self, groups: Iterable[Any]) -> dict[str, tuple[str, ...]]:
        """Resource -> device IDs, in the order given and each ID once: newer kubelets send one group per
        device (and NUMA node), older ones one per resource."""
        found: dict[str, dict[str, None]] = {}
        for group in self.each(groups):
            ids = found.setdefault(self.text(group.resource_name), {})
            ids.update((self.text(device), None) for device in self.each(group.device_ids))
        return {resource: tuple(ids) for resource, ids in found.items() if ids}

    def _malformed(self, what: str) -> PodResourcesError:
        return _error(self.socket, f"malformed answer ({what}); check what listens on the socket")
