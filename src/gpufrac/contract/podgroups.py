"""Pod groups (gangs): the `PodGroup` custom resource (`podgroups.gpufrac.io`), read. Pure.

A training job's pods are useless one by one: a PodGroup says how many of them (`minMember`) must be able
to run at once before any is bound. Pods join a group by the label `gpufrac.io/pod-group`, or KAI
Scheduler's annotation `pod-group-name`, naming a PodGroup of their namespace. A group whose pods cannot all
be placed within `scheduleTimeoutSeconds` gives back the room held for those that could.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from gpufrac.contract.errors import ContractError

GROUP = "gpufrac.io"
VERSION = "v1alpha1"
KIND = "PodGroup"
PLURAL = "podgroups"
POD_GROUP_LABEL = "gpufrac.io/pod-group"
KAI_POD_GROUP_ANNOTATION = "pod-group-name"
DEFAULT_TIMEOUT_SECONDS = 300.0
MAX_MEMBERS = 10_000


@dataclass(frozen=True, slots=True)
class PodGroupSpec:
    namespace: str
    name: str
    min_member: int
    queue: str | None = None
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS


def group_of(pod: Mapping[str, object]) -> str | None:
    """`namespace/name` of the pod group the pod is in, if any."""
    metadata = pod.get("metadata")
    if not isinstance(metadata, Mapping):
        return None
    labels, annotations = metadata.get("labels"), metadata.get("annotations")
    name = labels.get(POD_GROUP_LABEL) if isinstance(labels, Mapping) else None
    if not (isinstance(name, str) and name) and isinstance(annotations, Mapping):
        name = annotations.get(KAI_POD_GROUP_ANNOTATION)
    namespace = metadata.get("namespace")
    return f"{namespace}/{name}" if isinstance(name, str) and name and isinstance(namespace, str) else None


def parse_pod_group(obj: Mapping[str, object]) -> PodGroupSpec:
    """A PodGroup as the API returns it; `ContractError` naming the first field that is wrong."""
    metadata = obj.get("metadata")
    spec = obj.get("spec", {})
    if not isinstance(metadata, Mapping) or not isinstance(spec, Mapping):
        raise ContractError("metadata", str(metadata), "a PodGroup needs metadata and a spec map")
    name, namespace = metadata.get("name"), metadata.get("namespace")
    if not isinstance(name, str) or not name or not isinstance(namespace, str) or not namespace:
        raise ContractError("metadata.name", str(name), "a PodGroup needs a name and a namespace")
    members = spec.get("minMember")
    if isinstance(members, bool) or not isinstance(members, int) or not 1 <= members <= MAX_MEMBERS:
        raise ContractError("spec.minMember", str(members), f"must be a whole number from 1 to {MAX_MEMBERS}")
    queue = spec.get("queue")
    if queue is not None and (not isinstance(queue, str) or not queue):
        raise ContractError("spec.queue", str(queue), "must be the name of a Queue")
    timeout = spec.get("scheduleTimeoutSeconds", DEFAULT_TIMEOUT_SECONDS)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not math.isfinite(timeout):
        raise ContractError("spec.scheduleTimeoutSeconds", str(timeout), "must be a number of seconds")
    if not 0 < timeout <= 86_400:
        raise ContractError("spec.scheduleTimeoutSeconds", str(timeout), "must be above 0 and at most 86400")
    return PodGroupSpec(namespace, name, members, queue, float(timeout))
