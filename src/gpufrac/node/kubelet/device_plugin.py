"""A device plugin (the kubelet's device plugin API v1beta1): serves one extended resource, its devices and
their health, and answers Allocate with the environment variable NVIDIA's container runtime reads.

It is how a node's GPUs are offered to pods asking an extended resource the way NVIDIA's plugin offers
`nvidia.com/gpu`, and, in the real-node tests, a stand-in for NVIDIA's plugin itself.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from . import calls, protos

_M = protos.deviceplugin
# How long Register may take: the kubelet answers at once, or is stuck.
REGISTER_TIMEOUT = 10.0
KEPT_ALLOCATIONS = 1024


class DevicePluginError(Exception):
    """The plugin could not serve or register: one line naming the resource, what failed and the fix."""


class DevicePluginServer:
    """Serves one extended resource to the kubelet (device plugin API v1beta1) from a unix socket in the
    kubelet's device-plugins folder, and registers it. Allocate answers ``env_var`` = the comma-joined device
    IDs (NVIDIA_VISIBLE_DEVICES by default, as NVIDIA's plugin does).

    `allocations` records the device IDs of the last `KEPT_ALLOCATIONS` containers allocated, in order:
    enough to see what the kubelet asked for, bounded over an agent's months of pod churn."""

    def __init__(
        self,
        plugin_dir: Path,
        resource: str,
        device_ids: Sequence[str],
        *,
        endpoint: str,
        env_var: str = "NVIDIA_VISIBLE_DEVICES",
    ) -> None:
        self.plugin_dir = plugin_dir
        self.resource = resource
        self.endpoint = endpoint
        self.env_var = env_var
        self.allocations: collections.deque[list[str]] = collections.deque(maxlen=KEPT_ALLOCATIONS)
        # Guards the health, its version (bumped at each change) and `_stopped`; ListAndWatch streams wait
        # on it for a change to send.
        self._changed = threading.Condition()
        self._health = dict.fromkeys(device_ids, True)
        self._version = 0
        self._stopped = False
        self._registered = False
        self._server: grpc.Server | None = None
        self._socket: tuple[int, int] | None = None  # (device, inode) of the socket served on

    @property
    def registered(self) -> bool:
        """Whether the kubelet accepted the registration, the plugin has not stopped since, and the socket it
        serves on is still there. A kubelet that restarts removes every socket in its device-plugins folder
        and forgets every plugin until it registers again: a plugin that went on thinking itself registered
        would leave the node without the resource until the agent restarted."""
        return self._registered and self._socket is not None and _identity(self._endpoint) == self._socket

    def start(self) -> None:
        """Serve on <plugin_dir>/<endpoint>, then register with <plugin_dir>/kubelet.sock; again after a
        kubelet restart (see `registered`), in place of the server the kubelet no longer reaches."""
        kubelet = self.plugin_dir / protos.KUBELET_SOCKET
        problem = calls.socket_problem(kubelet)
        if problem is not None:
            raise self._error(f"the kubelet's socket {kubelet} {problem}: is the kubelet running?")
        if self._server is not None:
            self.stop()
        with self._changed:
            self._stopped = False
        self._serve()
        try:
            self._register(kubelet)
        except DevicePluginError:
            self.stop()
            raise
        self._registered = True

    def set_health(self, healthy: Mapping[str, bool]) -> None:
        """Device ID -> healthy; the kubelet gets the devices again when any changed."""
        unknown = self._unknown(healthy)
        if unknown:
            raise ValueError(unknown)
        with self._changed:
            if any(self._health[device] != ok for device, ok in healthy.items()):
                self._health.update(healthy)
                self._version += 1
                self._changed.notify_all()

    def stop(self) -> None:
        """Ends the ListAndWatch streams, stops serving and removes the socket."""
        with self._changed:
            self._stopped = True
            self._changed.notify_all()
        self._registered = False
        if self._server is not None:
            self._server.stop(grace=None)
            self._server = None
        if self._socket is not None and _identity(self._endpoint) == self._socket:
            self._endpoint.unlink()
        self._socket = None

    @property
    def _endpoint(self) -> Path:
        return self.plugin_dir / self.endpoint

    def _serve(self) -> None:
        # ListAndWatch holds a worker for as long as the kubelet watches; the others are short.
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
        socket = self._endpoint
        socket.unlink(missing_ok=True)  # a socket left by an earlier run
        try:
            server.add_insecure_port(f"unix:{socket}")
        except RuntimeError as error:
            raise self._error(f"cannot serve on {socket} ({error}): is {self.plugin_dir} writable?") from None
        server.start()
        self._server = server
        self._socket = _identity(socket)

    def _register(self, kubelet: Path) -> None:
        request = _M["RegisterRequest"](
            version=protos.DEVICE_PLUGIN_VERSION, endpoint=self.endpoint, resource_name=self.resource
        )
        with grpc.insecure_channel(f"unix:{kubelet}") as channel:
            register = protos.unary(channel, "/v1beta1.Registration/Register", _M["Empty"])
            try:
                register(request, timeout=REGISTER_TIMEOUT)
            except grpc.RpcError as error:
                _, line = calls.status(error)
                raise self._error(f"the kubelet at {kubelet} refused the registration ({line})") from None

    def _list_and_watch(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        """The devices now, then again at each health change, until the plugin stops or the kubelet goes."""

        def wake() -> None:
            with self._changed:
                self._changed.notify_all()

        context.add_callback(wake)  # called when the stream ends, the kubelet gone
        sent: int | None = None
        while (news := self._devices_after(sent, context)) is not None:
            sent, devices = news
            yield _M["ListAndWatchResponse"](devices=devices)

    def _devices_after(self, sent: int | None, context: grpc.ServicerContext) -> tuple[int, list[Any]] | None:
        """The devices once their version is other than ``sent``, with it; None once the stream is over."""
        with self._changed:
            while not self._stopped and context.is_active() and self._version == sent:
                self._changed.wait()
            if self._stopped or not context.is_active():
                return None
            devices = [
                _M["Device"](ID=device, health="Healthy" if ok else "Unhealthy")
                for device, ok in self._health.items()
            ]
            return self._version, devices

    def _allocate(self, request: Any, context: grpc.ServicerContext) -> Any:
        """Each container's devices in the env. A device this plugin never advertised is refused, as NVIDIA's
        plugin refuses it: passed on, the runtime would read whatever it names (`all`, another GPU)."""
        asked = [list(container.devicesIDs) for container in request.container_requests]
        unknown = self._unknown(device for ids in asked for device in ids)
        if unknown:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, unknown)
        self.allocations.extend(asked)
        responses = [_M["ContainerAllocateResponse"](envs={self.env_var: ",".join(ids)}) for ids in asked]
        return _M["AllocateResponse"](container_responses=responses)

    def _unknown(self, devices: Iterable[str]) -> str:
        """What is wrong with `devices` naming one this plugin does not serve; empty when none does."""
        unknown = sorted(set(devices) - set(self._health))
        return f"{self.resource} has no device {', '.join(unknown)}" if unknown else ""

    def _error(self, what: str) -> DevicePluginError:
        return DevicePluginError(f"device plugin for {self.resource}: {what}")


def _identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the file at `path`, None where there is none: tells the socket a plugin made from
    one made in its place."""
    try:
        found = path.stat()
    except OSError:
        return None
    return found.st_dev, found.st_ino


def _codec(request: str) -> dict[str, Any]:
    return {"request_deserializer": _M[request].FromString, "response_serializer": protos.serialize}
