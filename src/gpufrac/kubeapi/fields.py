"""Reading fields of API objects that nobody checked (pods the webhook is asked about, pods the scheduler
and the agent watch): a field of the wrong type reads as empty instead of raising, and the few rules of the
pod spec that more than one program reads."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def as_mapping(value: object) -> Mapping[str, Any]:
    # A JSON object is a dict: its exact-type test is far cheaper than the Mapping ABC's, on every field read.
    return value if type(value) is dict or isinstance(value, Mapping) else {}


def as_list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def as_str(value: object) -> str:
    return value if isinstance(value, str) else ""


def is_sidecar(container: object) -> bool:
    """An init container of `restartPolicy: Always`: it keeps running beside the pod's containers, so its
    resources, ports and GPU memory count for as long as the pod runs."""
    return as_mapping(container).get("restartPolicy") == "Always"
