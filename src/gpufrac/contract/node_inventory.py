"""What the node agent publishes on its Node, and how to read it back: the one format the scheduler and the
agent share. Pure: no I/O, and nothing here imports NVML.

On each GPU node the agent writes:

- annotation `gpufrac.io/gpus`: a JSON list, one object per GPU, sorted by index::

      [{"index": 0, "uuid": "GPU-5f0c...", "model": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920,
        "healthy": true, "allocatable_mib": 80640, "holder": "ml/trainer-0"}, ...]

  `index` is NVML's index, `uuid` NVML's UUID (what `gpus.devices` names), `memory_mib` the total memory
  in MiB, `healthy` false when NVML cannot read the GPU (or NVML itself is gone): never place on it.
  Optional: `allocatable_mib`, the memory a process can actually allocate (the total less what the driver
  and a CUDA context keep); portions are of it when it is published. `holder`, the `namespace/name` of the
  pod the kubelet's device plugin gave this GPU to (from the kubelet's PodResources API), absent when the
  device plugin gave it to nobody.
- label `gpufrac.io/device-plugin`: who hands out `nvidia.com/gpu` on the node, one of `DevicePluginMode`;
- node condition `gpufrac.io/Ready`: True once the agent has published all of this and the node's mode has
  what it needs (`READY_CONDITION`); the scheduler places GPU pods only on nodes where it is True.
- annotation `gpufrac.io/driver-version`: the driver version string NVML reports, e.g. `535.104.05`;
- label `gpufrac.io/enforcement`: how memory limits are held on this node, one of `Enforcement`;
- labels `nvidia.com/gpu.count`, `nvidia.com/gpu.memory` (MiB) and `nvidia.com/gpu.product`, only where
  GPU Feature Discovery has not set them already.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from enum import StrEnum

from gpufrac.contract.errors import brief

GPUS_ANNOTATION = "gpufrac.io/gpus"
DRIVER_VERSION_ANNOTATION = "gpufrac.io/driver-version"
ENFORCEMENT_LABEL = "gpufrac.io/enforcement"

# As GPU Feature Discovery writes them; the agent fills them in only where they are absent.
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"

DEVICE_PLUGIN_LABEL = "gpufrac.io/device-plugin"
# An agent that dies without a clean stop cannot clear its condition, so it refreshes the condition's
# `lastHeartbeatTime` at least every HEARTBEAT_SECONDS, and the scheduler takes a condition whose heartbeat is
# older than its timeout (`gpufrac scheduler --agent-heartbeat-timeout`, HEARTBEAT_TIMEOUT_SECONDS by
# default) for a node whose agent is gone. A condition without a heartbeat never goes stale.
HEARTBEAT_SECONDS = 60
HEARTBEAT_TIMEOUT_SECONDS = 300
# Set by the operator, not the agent: `kill` or `evict` on a node pool's nodes makes the watchdog act there;
# anything else (or nothing) leaves the agent's --mode, `report` by default in the chart.
WATCHDOG_MODE_LABEL = "gpufrac.io/watchdog"
# Set by the operator, not the agent: `true` on a node pool's nodes guarantees compute there, so the scheduler
# never lets the compute caps of the sm-sharing shares on one GPU add past 100% (an uncapped one counts 100).
COMPUTE_GUARANTEE_LABEL = "gpufrac.io/compute-guarantee"
COMPUTE_GUARANTEE_VALUE = "true"
READY_CONDITION = "gpufrac.io/Ready"

# The extended resource NVIDIA's device plugin (or gpufrac's, in managed mode) hands out, one per GPU.
GPU_RESOURCE = "nvidia.com/gpu"
# How NVIDIA's GPU operator is told not to run its device plugin on a node (its operand labels are
# `nvidia.com/gpu.deploy.<component>`; "false" keeps that component off the node).
OPERATOR_DEVICE_PLUGIN_LABEL = "nvidia.com/gpu.deploy.device-plugin"

# The label that shows NVIDIA's operator delivers driver-enforced memory limits (CUDA 13.4 with its
# gpu-fractioning components) on a node, ready. No such label is public: NVIDIA's docs and code were
# searched (GPU operator operand labels, GPU Feature Discovery labels, KAI's gpu-fractioning node agents)
# and none says "installed and ready". This follows the operator's `nvidia.com/gpu.deploy.<component>`
# convention and is a guess; the agent's `--native-label KEY=VALUE` replaces it. Until a node carries it,
# no node claims `native`, which is the safe side.
NATIVE_LABEL = "nvidia.com/gpu.deploy.gpu-fractioning"
NATIVE_LABEL_VALUE = "true"

# Bounds on what a Node may claim. Real nodes have at most 16 GPUs of at most a few hundred GiB; the scheduler
# sizes its arrays by the widest node and adds memory in int64, so an annotation or label listing a million
# GPUs, or a GPU of 10**30 MiB, must be refused as unreadable rather than allocated or overflowed.
MAX_GPUS_PER_NODE = 64
MAX_GPU_MEMORY_MIB = 2**30  # 1 PiB
MAX_NAME_LENGTH = 256  # a UUID or model; UUIDs label metrics, so they stay short


class DevicePluginMode(StrEnum):
    """Who hands out `nvidia.com/gpu` on a node, and so how gpufrac keeps its GPUs from the kubelet.

    - `coexist`: NVIDIA's device plugin runs; every GPU gpufrac shares is held from it by a reservation pod
      asking it for one `nvidia.com/gpu`, and GPUs it gave to anyone else are never shared;
    - `managed`: NVIDIA's device plugin is switched off on the node and gpufrac's agent serves
      `nvidia.com/gpu` itself, with the same reservations, so the kubelet still accounts every GPU;
    - `none`: no device plugin at all (`nvidia.com/gpu` is not a resource there); gpufrac alone hands out
      GPUs. Only for nodes where nothing else asks for them.
    """

    COEXIST = "coexist"
    MANAGED = "managed"
    NONE = "none"


class Enforcement(StrEnum):
    """How a memory limit is held on a node (or a GPU), strongest first.

    - `native`: the driver enforces the limit: a CUDA 13.4 driver with NVIDIA's operator, which shows on the
      node that it is installed and ready there;
    - `mps`: an MPS control daemon runs, so sm-sharing clients get a hard pinned-memory ceiling; time-slicing
      shares on the node are held by the watchdog when it acts;
    - `watchdog`: no MPS; the agent kills or evicts a share that goes over its limit, within an interval;
    - `none`: nothing holds the limit (the watchdog only reports, or NVML cannot be read).
    """

    NATIVE = "native"
    MPS = "mps"
    WATCHDOG = "watchdog"
    NONE = "none"


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as the annotation lists it."""

    index: int
    uuid: str
    model: str
    memory_mib: int
    healthy: bool
    allocatable_mib: int | None = None
    holder: str = ""

    @property
    def usable_mib(self) -> int:
        """What portions are of: the allocatable memory where published, else the total."""
        return self.allocatable_mib if self.allocatable_mib is not None else self.memory_mib


def dump_gpus(gpus: Iterable[GpuInfo]) -> str:
    """The annotation value: compact JSON, sorted by index, so an unchanged inventory is an unchanged string
    and the agent patches nothing."""
    ordered = sorted(gpus, key=lambda gpu: gpu.index)
    items = [
        {key: value for key, value in asdict(gpu).items() if key not in _OPTIONAL or value not in (None, "")}
        for gpu in ordered
    ]
    return json.dumps(items, separators=(",", ":"))


def load_gpus(text: str) -> tuple[GpuInfo, ...]:
    """Read the annotation back; a `ValueError` that says what is wrong if it is not the format above."""
    try:
        items = json.loads(text)
    except (ValueError, RecursionError) as error:  # also a number past Python's 4300 digits, deep nesting
        raise ValueError(f"{GPUS_ANNOTATION} is not JSON: {str(error)[:200]}") from None
    if not isinstance(items, list):
        raise ValueError(f"{GPUS_ANNOTATION} must be a JSON list, not {type(items).__name__}")
    if len(items) > MAX_GPUS_PER_NODE:
        raise ValueError(f"{GPUS_ANNOTATION} lists {len(items)} GPUs; a node has at most {MAX_GPUS_PER_NODE}")
    gpus = tuple(_gpu(item, position) for position, item in enumerate(items))
    if sorted(gpu.index for gpu in gpus) != list(range(len(gpus))):
        raise ValueError(f"{GPUS_ANNOTATION}: GPU indices must be 0..{len(gpus) - 1}, one each")
    return gpus


def _gpu(item: object, position: int) -> GpuInfo:
    where = f"{GPUS_ANNOTATION}[{position}]"
    if not isinstance(item, dict):
        raise ValueError(f"{where} must be an object")
    fields = {"index": int, "uuid": str, "model": str, "memory_mib": int, "healthy": bool}
    for name, kind in fields.items():
        value = item.get(name)
        # bool is an int in Python; an index or a size given as true/false is still wrong.
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ValueError(f"{where}.{name} must be {kind.__name__}, got {brief(repr(value))}")
    allocatable = item.get("allocatable_mib")
    holder = item.get("holder", "")
    if allocatable is not None and (not isinstance(allocatable, int) or isinstance(allocatable, bool)):
        raise ValueError(f"{where}.allocatable_mib must be int, got {brief(repr(allocatable))}")
    if not isinstance(holder, str):
        raise ValueError(f"{where}.holder must be str, got {brief(repr(holder))}")
    if not 1 <= item["memory_mib"] <= MAX_GPU_MEMORY_MIB:
        raise ValueError(
            f"{where}.memory_mib must be 1..{MAX_GPU_MEMORY_MIB}, got {brief(repr(item['memory_mib']))}"
        )
    if allocatable is not None and not 1 <= allocatable <= item["memory_mib"]:
        raise ValueError(f"{where}.allocatable_mib must be 1..memory_mib, got {brief(repr(allocatable))}")
    for name, value in (("uuid", item["uuid"]), ("model", item["model"]), ("holder", holder)):
        if len(value) > MAX_NAME_LENGTH:
            raise ValueError(f"{where}.{name} is longer than {MAX_NAME_LENGTH} characters")
    return GpuInfo(
        item["index"], item["uuid"], item["model"], item["memory_mib"], item["healthy"], allocatable, holder
    )


_OPTIONAL = ("allocatable_mib", "holder")


def condition_time(text: object) -> datetime | None:
    """A condition's RFC 3339 time (`2026-11-30T20:00:00Z`) as an aware datetime; None if unreadable."""
    if not isinstance(text, str) or len(text) > 64:
        return None
    try:
        stamp = datetime.fromisoformat(text)
    except ValueError:
        return None
    return stamp if stamp.tzinfo is not None else stamp.replace(tzinfo=UTC)


def device_plugin_mode(labels: Mapping[str, str]) -> DevicePluginMode:
    """The node's mode as its agent published it; `none` where no agent said (a node without one)."""
    try:
        return DevicePluginMode(labels.get(DEVICE_PLUGIN_LABEL, DevicePluginMode.NONE.value))
    except ValueError:
        return DevicePluginMode.NONE


_LABEL_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def label_value(text: str) -> str:
    """`text` as a valid label value, the way GPU Feature Discovery writes products: spaces become dashes,
    anything else a label cannot hold is dropped, at most 63 characters, alphanumeric at both ends."""
    value = _LABEL_UNSAFE.sub("", text.strip().replace(" ", "-"))[:63]
    return value.strip("-_.")
