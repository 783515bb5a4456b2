"""The device plugin server against a fake kubelet: its registration, the devices and their health it
streams, Allocate's answer, and a kubelet absent or refusing told as one line."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from gpufrac.node.kubelet import protos
from gpufrac.node.kubelet.device_plugin import DevicePluginError, DevicePluginServer

from .grpc_fakes import serving, unary

M = protos.deviceplugin
GPUS = ["GPU-a", "GPU-b"]


class Kubelet:
    """The kubelet's Registration service on <plugin_dir>/kubelet.sock, recording each RegisterRequest, or
    refusing them all with ``refusal``."""

    def __init__(self, refusal: str | None = None) -> None:
        self.requests: list[Any] = []
        self.refusal = refusal

    def register(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.requests.append(request)
        if self.refusal is not None:
            context.abort(grpc.StatusCode.UNKNOWN, self.refusal)
        return M["Empty"]()


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[Kubelet]:
    kubelet = Kubelet()
    handlers = {"Register": unary(M["RegisterRequest"], kubelet.register)}
    with serving(tmp_path / protos.KUBELET_SOCKET, "v1beta1.Registration", handlers):
        yield kubelet


@pytest.fixture
def plugin(tmp_path: Path, kubelet: Kubelet) -> Iterator[DevicePluginServer]:
    plugin = DevicePluginServer(tmp_path, "example.com/gpu", GPUS, endpoint="gpu.sock", env_var="VISIBLE")
    plugin.start()
    yield plugin
    plugin.stop()


@pytest.fixture
def channel(tmp_path: Path, plugin: DevicePluginServer) -> Iterator[grpc.Channel]:
    """The kubelet's connection to the plugin."""
    with grpc.insecure_channel(f"unix:{tmp_path / 'gpu.sock'}") as channel:
        yield channel


def health(answer: Any) -> dict[str, str]:
    return {device.ID: device.health for device in answer.devices}


def test_start_registers_the_resource_and_endpoint(
    tmp_path: Path, kubelet: Kubelet, plugin: DevicePluginServer
) -> None:
    [request] = kubelet.requests
    assert (request.version, request.endpoint, request.resource_name) == (
        "v1beta1",
        "gpu.sock",
        "example.com/gpu",
    )
    assert plugin.registered and (tmp_path / "gpu.sock").is_socket()
    plugin.stop()
    assert not plugin.registered and not (tmp_path / "gpu.sock").exists()


def test_after_a_kubelet_restart_it_is_no_longer_registered_and_registers_again(
    tmp_path: Path, kubelet: Kubelet, plugin: DevicePluginServer
) -> None:
    """A restarting kubelet removes every socket in its device-plugins folder and knows no plugin until it
    registers again."""
    socket = tmp_path / "gpu.sock"
    socket.unlink()
    assert not plugin.registered
    plugin.start()
    assert plugin.registered and socket.is_socket() and len(kubelet.requests) == 2
    with grpc.insecure_channel(f"unix:{socket}") as channel:
        allocate = protos.unary(channel, "/v1beta1.DevicePlugin/Allocate", M["AllocateResponse"])
        allocate(M["AllocateRequest"](container_requests=[{"devicesIDs": ["GPU-a"]}]), timeout=10)
    assert list(plugin.allocations) == [["GPU-a"]]


def test_list_and_watch_sends_the_devices_then_each_health_change(
    plugin: DevicePluginServer, channel: grpc.Channel
) -> None:
    watch = channel.unary_stream(
        "/v1beta1.DevicePlugin/ListAndWatch",
        request_serializer=protos.serialize,
        response_deserializer=M["ListAndWatchResponse"].FromString,
    )
    stream = watch(M["Empty"](), timeout=10)
    try:
        assert health(next(stream)) == {"GPU-a": "Healthy", "GPU-b": "Healthy"}
        plugin.set_health({"GPU-b": False})
        assert health(next(stream)) == {"GPU-a": "Healthy", "GPU-b": "Unhealthy"}
        plugin.set_health({"GPU-b": False, "GPU-a": True})  # no change: nothing sent
        plugin.set_health({"GPU-a": False})
        assert health(next(stream)) == {"GPU-a": "Unhealthy", "GPU-b": "Unhealthy"}
    finally:
        stream.cancel()


class Stream:
    """A ListAndWatch stream's context while the kubelet watches, until `hang_up`."""

    def __init__(self) -> None:
        self.active = True
        self.callbacks: list[Any] = []

    def is_active(self) -> bool:
        return self.active

    def add_callback(self, callback: Any) -> bool:
        self.callbacks.append(callback)
        return True

    def hang_up(self) -> None:
        self.active = False
        for callback in self.callbacks:
            callback()


@pytest.mark.parametrize("end", ["stop", "hang up"])
def test_list_and_watch_ends_when_the_plugin_stops_or_the_kubelet_hangs_up(
    plugin: DevicePluginServer, end: str
) -> None:
    stream = Stream()
    answers = plugin._list_and_watch(M["Empty"](), stream)  # type: ignore[arg-type]
    assert health(next(answers)) == {"GPU-a": "Healthy", "GPU-b": "Healthy"}
    rest: list[Any] = []
    watching = threading.Thread(target=lambda: rest.extend(answers), daemon=True)
    watching.start()
    plugin.stop() if end == "stop" else stream.hang_up()
    watching.join(timeout=10)
    assert not watching.is_alive() and rest == []


def test_allocate_answers_each_container_its_devices_in_the_env(
    plugin: DevicePluginServer, channel: grpc.Channel
) -> None:
    allocate = protos.unary(channel, "/v1beta1.DevicePlugin/Allocate", M["AllocateResponse"])
    request = M["AllocateRequest"](
        container_requests=[{"devicesIDs": ["GPU-b", "GPU-a"]}, {"devicesIDs": ["GPU-a"]}]
    )
    answer = allocate(request, timeout=10)
    assert [dict(container.envs) for container in answer.container_responses] == [
        {"VISIBLE": "GPU-b,GPU-a"},
        {"VISIBLE": "GPU-a"},
    ]
    assert list(plugin.allocations) == [["GPU-b", "GPU-a"], ["GPU-a"]]


@pytest.mark.parametrize("devices", [["GPU-z"], ["GPU-a", "all"]])
def test_allocate_refuses_a_device_it_never_advertised(
    plugin: DevicePluginServer, channel: grpc.Channel, devices: list[str]
) -> None:
    allocate = protos.unary(channel, "/v1beta1.DevicePlugin/Allocate", M["AllocateResponse"])
    request = M["AllocateRequest"](container_requests=[{"devicesIDs": ["GPU-b"]}, {"devicesIDs": devices}])
    with pytest.raises(grpc.RpcError) as excinfo:
        allocate(request, timeout=10)
    assert excinfo.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert excinfo.value.details() == f"example.com/gpu has no device {devices[-1]}"  # type: ignore[attr-defined]
    assert not plugin.allocations


def test_the_options_ask_for_no_pre_start(channel: grpc.Channel) -> None:
    options = protos.unary(channel, "/v1beta1.DevicePlugin/GetDevicePluginOptions", M["DevicePluginOptions"])
    assert not options(M["Empty"](), timeout=10).pre_start_required


def test_set_health_of_an_unknown_device_is_refused(plugin: DevicePluginServer) -> None:
    with pytest.raises(ValueError, match="has no device GPU-z"):
        plugin.set_health({"GPU-z": False})


def test_no_kubelet_is_one_line_and_leaves_no_socket(tmp_path: Path) -> None:
    plugin = DevicePluginServer(tmp_path, "example.com/gpu", GPUS, endpoint="gpu.sock")
    with pytest.raises(DevicePluginError) as excinfo:
        plugin.start()
    message = str(excinfo.value)
    assert "\n" not in message and str(tmp_path / "kubelet.sock") in message and "does not exist" in message
    assert not plugin.registered and not (tmp_path / "gpu.sock").exists()


def test_a_refusing_kubelet_is_one_line_and_leaves_no_socket(tmp_path: Path) -> None:
    kubelet = Kubelet(refusal="Requested device plugin version\nis not supported")
    handlers = {"Register": unary(M["RegisterRequest"], kubelet.register)}
    plugin = DevicePluginServer(tmp_path, "example.com/gpu", GPUS, endpoint="gpu.sock")
    refusing = serving(tmp_path / protos.KUBELET_SOCKET, "v1beta1.Registration", handlers)
    with refusing, pytest.raises(DevicePluginError) as excinfo:
        plugin.start()
    assert str(excinfo.value) == (
        f"device plugin for example.com/gpu: the kubelet at {tmp_path / 'kubelet.sock'} refused the "
        "registration (UNKNOWN: Requested device plugin version is not supported)"
    )
    assert excinfo.value.__cause__ is None and excinfo.value.__suppress_context__
    assert not plugin.registered and not (tmp_path / "gpu.sock").exists()
