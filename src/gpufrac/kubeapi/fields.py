"""Reading fields of API objects that nobody checked (pods the webhook is asked about, pods the scheduler
and the agent watch): a field of the wrong type reads as empty instead of raising, and the few rules of the
pod spec that more than one program reads."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

# A DNS subdomain, as the API server requires of most objects' names (RFC 1123).
_OBJECT_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
MAX_OBJECT_NAME = 253


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


def is_object_name(value: object) -> bool:
    """Whether `value` could name an object (a claim, a ConfigMap): a name a pod gives goes into the path
    of an API request, where `../other-namespace/...` would reach another namespace's objects."""
    return isinstance(value, str) and len(value) <= MAX_OBJECT_NAME and bool(_OBJECT_NAME.fullmatch(value))
