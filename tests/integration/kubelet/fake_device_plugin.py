"""A stand-in for NVIDIA's device plugin on the real test node: gpufrac's device plugin server serving
`nvidia.com/gpu`, one healthy device per GPU of a fake NVML scenario under the GPU's UUID, as NVIDIA's plugin
does. Allocate answers `NVIDIA_VISIBLE_DEVICES` with the UUIDs given, which is what NVIDIA's container
runtime would read; no runtime here reads it.
"""

from __future__ import annotations

from pathlib import Path

from gpufrac.node.kubelet.device_plugin import DevicePluginServer

RESOURCE = "nvidia.com/gpu"


class FakeDevicePlugin(DevicePluginServer):
    """Serves `nvidia.com/gpu` devices named by ``uuids`` from ``plugin_dir``."""

    def __init__(self, plugin_dir: Path, uuids: list[str], *, endpoint: str = "fake-gpu.sock") -> None:
        super().__init__(plugin_dir, RESOURCE, uuids, endpoint=endpoint)
