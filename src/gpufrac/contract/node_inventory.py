"""What the node agent publishes on its Node, and how to read it back: the one format the scheduler and the
agent share. Pure: no I/O, and nothing here imports NVML.

On each GPU node the agent writes:

- annotation `gpufrac.io/gpus`: a JSON list, one object per GPU, sorted by index::

      [{"index": 0, "uuid": "GPU-5f0c...", "model": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920,
        "healthy": true}, ...]

  `index` is NVML's index, `uuid` NVML's UUID (what `gpus.devices` names), `memory_mib` the total memory
  in MiB, `healthy` false when NVML cannot read the GPU (or NVML itself is gone): never place on it.
- annotation `gpufrac.io/driver-version`: the driver version string NVML reports, e.g. `535.104.05`;
- label `gpufrac.io/driver-major`: its major number, e.g. `535`;
- label `gpufrac.io/enforcement`: how memory limits are held on this node, one of `Enforcement`;
- labels `nvidia.com/gpu.count`, `nvidia.com/gpu.memory` (MiB) and `nvidia.com/gpu.product`, only where
  GPU Feature Discovery has not set them already.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from enum import StrEnum

from gpufrac.contract.errors import brief

GPUS_ANNOTATION = "gpufrac.io/gpus"
DRIVER_VERSION_ANNOTATION = "gpufrac.io/driver-version"
DRIVER_MAJOR_LABEL = "gpufrac.io/driver-major"
ENFORCEMENT_LABEL = "gpufrac.io/enforcement"

# As GPU Feature Discovery writes them; the agent fills them in only where they are absent.
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"

# The first driver branch whose driver enforces per-container memory limits itself (CUDA 13.4).
NATIVE_DRIVER_MAJOR = 615

# Bounds on what a Node may claim. Real nodes have at most 16 GPUs of at most a few hundred GiB; the scheduler
# sizes its arrays by the widest node and adds memory in int64, so an annotation or label listing a million
# GPUs, or a GPU of 10**30 MiB, must be refused as unreadable rather than allocated or overflowed.
MAX_GPUS_PER_NODE = 64
MAX_GPU_MEMORY_MIB = 2**30  # 1 PiB
MAX_NAME_LENGTH = 256  # a UUID or model; UUIDs label metrics, so they stay short


class Enforcement(StrEnum):
    """How a memory limit is held on a node (or a GPU), strongest first.

    - `native`: the driver enforces the limit (r615+ with NVIDIA's operator delivering it);
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


def dump_gpus(gpus: Iterable[GpuInfo]) -> str:
    """The annotation value: compact JSON, sorted by index, so an unchanged inventory is an unchanged string
    and the agent patches nothing."""
    ordered = sorted(gpus, key=lambda gpu: gpu.index)
    return json.dumps([asdict(gpu) for gpu in ordered], separators=(",", ":"))


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
    if not 1 <= item["memory_mib"] <= MAX_GPU_MEMORY_MIB:
        raise ValueError(
            f"{where}.memory_mib must be 1..{MAX_GPU_MEMORY_MIB}, got {brief(repr(item['memory_mib']))}"
        )
    for name in ("uuid", "model"):
        if len(item[name]) > MAX_NAME_LENGTH:
            raise ValueError(f"{where}.{name} is longer than {MAX_NAME_LENGTH} characters")
    return GpuInfo(item["index"], item["uuid"], item["model"], item["memory_mib"], item["healthy"])


def driver_major(version: str) -> int | None:
    """535 for "535.104.05"; None for a version NVML did not give or that does not start with a number."""
    head = version.split(".", 1)[0]
    return int(head) if head.isascii() and head.isdigit() else None


_LABEL_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def label_value(text: str) -> str:
    """`text` as a valid label value, the way GPU Feature Discovery writes products: spaces become dashes,
    anything else a label cannot hold is dropped, at most 63 characters, alphanumeric at both ends."""
    value = _LABEL_UNSAFE.sub("", text.strip().replace(" ", "-"))[:63]
    return value.strip("-_.")
