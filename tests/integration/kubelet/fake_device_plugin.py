"""A stand-in for NVIDIA's device plugin on the real test node: a test fixture, not a product.

It speaks the kubelet's device plugin API v1beta1 on a unix socket in the kubelet's device-plugins folder,
registers `nvidia.com/gpu`, and advertises one healthy device per GPU of a fake NVML scenario, under the
GPU's UUID, as NVIDIA's plugin does. Allocate answers `NVIDIA_VISIBLE_DEVICES` with the UUIDs given, which is
what NVIDIA's container runtime would read; no runtime here reads it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from gpufrac.node.kubelet import protos as kubelet_api

RESOURCE = "nvidia.com/gpu"
_M = kubelet_api.deviceplugin


class FakeDevicePlugin:
    """Serves `nvidia.com/gpu` devices named by ``uuids`` from ``plugin_dir``; `allocations` records each
    Allocate's device IDs per container."""

    def __init__(self, plugin_dir: Path, uuids: list[str], *, endpoint: str = "fake-gpu.sock") -> None:
        self.plugin_dir = plugin_dir
        self.uuids = uuids
        self.endpoint = endpoint
        self.allocations: list[list[str]] = []
        self._stopped = threading.Event()
        self._server: grpc.Server | None = None

    def start(self) -> None:
        """Serve, then register with the kubelet; raises grpc.RpcError when the kubelet refuses."""
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        handlers = {
            "GetDevicePluginOptions": grpc.unary_unary_rpc_method_handler(
                lambda request, context: _M["DevicePluginOptions"](), **_codec("Empty")
            ),
            "ListAndWatch": grpc.unary_stream_rpc_method_handler(self._list_and_watch, **_codec("Empty")),
            "Allocate": grpc.unary_unary_rpc_method_handler(self._allocate, **_codec("AllocateRequest")),
            "PreStartContainer": grpc.unary_unary_rpc_method_handler(
                lambda request, context: _M["PreStartContainerResponse"](),
                **_codec("PreStartContainerRequest"),
            ),
        }
        server.add_generic_rpc_handlers(
            [grpc.method_handlers_generic_handler("v1beta1.DevicePlugin", handlers)]
        )
        socket = self.plugin_dir / self.endpoint
        socket.unlink(missing_ok=True)
        server.add_insecure_port(f"unix:{socket}")
        server.start()
        self._server = server
        with grpc.insecure_channel(f"unix:{self.plugin_dir / kubelet_api.KUBELET_SOCKET}") as channel:
            register = kubelet_api.unary(channel, "/v1beta1.Registration/Register", _M["Empty"])
            request = _M["RegisterRequest"](
                version=kubelet_api.DEVICE_PLUGIN_VERSION, endpoint=self.endpoint, resource_name=RESOURCE
            )
            register(request, timeout=10)

    def stop(self) -> None:
        self._stopped.set()
        if self._server is not None:
            self._server.stop(grace=None)
        (self.plugin_dir / self.endpoint).unlink(missing_ok=True)

    def _list_and_watch(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        devices = [_M["Device"](ID=uuid, health="Healthy") for uuid in self.uuids]
        yield _M["ListAndWatchResponse"](devices=devices)
        # The kubelet reads this stream for as long as the plugin lives; the devices never change.
        while not self._stopped.wait(1) and context.is_active():
            pass

    def _allocate(self, request: Any, context: grpc.ServicerContext) -> Any:
        responses = []
        for container in request.container_requests:
            ids = list(container.devicesIDs)
            self.allocations.append(ids)
            responses.append(_M["ContainerAllocateResponse"](envs={"NVIDIA_VISIBLE_DEVICES": ",".join(ids)}))
        return _M["AllocateResponse"](container_responses=responses)


def _codec(request: str) -> dict[str, Any]:
    return {"request_deserializer": _M[request].FromString, "response_serializer": kubelet_api.serialize}
