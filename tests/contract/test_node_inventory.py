"""The node annotation format the scheduler reads."""

from __future__ import annotations

import json

import pytest

from gpufrac.contract import node_inventory
from gpufrac.contract.node_inventory import GpuInfo


def test_gpus_round_trip_sorted_by_index() -> None:
    gpus = [GpuInfo(1, "GPU-b", "NVIDIA H100 80GB HBM3", 81559, False), GpuInfo(0, "GPU-a", "A", 40960, True)]
    text = node_inventory.dump_gpus(gpus)
    assert json.loads(text) == [
        {"index": 0, "uuid": "GPU-a", "model": "A", "memory_mib": 40960, "healthy": True},
        {
            "index": 1,
            "uuid": "GPU-b",
            "model": "NVIDIA H100 80GB HBM3",
            "memory_mib": 81559,
            "healthy": False,
        },
    ]
    assert node_inventory.load_gpus(text) == tuple(sorted(gpus, key=lambda gpu: gpu.index))
    assert node_inventory.dump_gpus(reversed(gpus)) == text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "is not JSON"),
        ('{"index": 0}', "must be a JSON list"),
        ("[1]", "[0] must be an object"),
        (
            '[{"index": true, "uuid": "u", "model": "m", "memory_mib": 1, "healthy": true}]',
            ".index must be int",
        ),
        (
            '[{"index": 0, "uuid": "u", "model": "m", "memory_mib": "1", "healthy": true}]',
            ".memory_mib must be",
        ),
        ('[{"index": 0, "uuid": "u", "model": "m", "memory_mib": 1}]', ".healthy must be bool"),
        (
            '[{"index": 1, "uuid": "u", "model": "m", "memory_mib": 1, "healthy": true}]',
            "GPU indices must be 0..0, one each",
        ),
    ],
)
def test_bad_annotations_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        node_inventory.load_gpus(text)


@pytest.mark.parametrize(
    ("model", "value"),
    [
        ("NVIDIA A100-SXM4-80GB", "NVIDIA-A100-SXM4-80GB"),
        ("  Tesla T4 ", "Tesla-T4"),
        ("NVIDIA GeForce RTX 4090 (rev 2)", "NVIDIA-GeForce-RTX-4090-rev-2"),
        ("x" * 80, "x" * 63),
        ("-(A)-", "A"),
    ],
)
def test_label_values_are_valid(model: str, value: str) -> None:
    assert node_inventory.label_value(model) == value
