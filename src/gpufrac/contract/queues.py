"""Queues: how teams share the cluster, as the `Queue` custom resource (`queues.gpufrac.io`) says. Pure.

A queue is guaranteed its `quota` of each resource, may borrow what others leave idle in proportion to its
`overQuotaWeight`, and never holds more than its `limit`; what is left over goes to queues of higher
`priority` first, as in KAI Scheduler. Queues form a tree (`parentQueue`): a child's share comes out of its
parent's. Pods join a queue by the label `gpufrac.io/queue`, or KAI Scheduler's
`kai.scheduler/queue` so that teams move over without editing manifests; a pod with neither is in
`default`, which exists even when no Queue object names it (no quota, weight 1, no limit).

A label is the tenant's to write, so `namespaces` says which namespaces' pods may join a queue: without it
any may (as in KAI Scheduler, which has no such field), with it only those listed, and a child queue only
namespaces every queue above it lists too. Otherwise a tenant could label pods with another team's queue
and preempt that team's pods, or reclaim as that team.

Units are the engine's: GPU memory (what shares request) and memory in MiB, CPU in millicores, whole GPUs
as a count. The field names follow KAI's Queue where it has one (`parentQueue`, `quota`, `limit`,
`overQuotaWeight`, -1 for "no limit", `priority` 100 when absent, `preemptMinRuntime` and
`reclaimMinRuntime`), so a KAI queue reads with its resource names changed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from fractions import Fraction

from gpufrac.contract.errors import ContractError
from gpufrac.contract.quantity import parse_quantity

GROUP = "gpufrac.io"
VERSION = "v1alpha1"
KIND = "Queue"
PLURAL = "queues"
QUEUE_LABEL = "gpufrac.io/queue"
KAI_QUEUE_LABEL = "kai.scheduler/queue"
DEFAULT_QUEUE = "default"
NO_LIMIT = -1  # as KAI writes it
# The most of any resource a queue may name, in its unit: far beyond any cluster, and small enough that sums
# of them stay exact in the floats fair shares are computed in.
MAX_AMOUNT = 2**50
MAX_WEIGHT = 1_000_000  # weights are ratios: past this they only risk overflowing the sums
DEFAULT_PRIORITY = 100  # KAI's, for a queue that names none
MAX_PRIORITY = 2**31 - 1  # an int32, as Kubernetes priorities are
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # what a namespace's name must be


class Resource(StrEnum):
    GPU_MEMORY = "gpuMemory"  # MiB requested by GPU shares
    GPUS = "gpus"  # GPUs: whole ones, and each share as the part of its GPU it takes
    CPU = "cpu"  # millicores
    MEMORY = "memory"  # MiB


GPU_RESOURCES = (Resource.GPUS, Resource.GPU_MEMORY)  # the two ways a queue counts GPUs

_UNIT = {
    Resource.GPU_MEMORY: Fraction(2**20),
    Resource.GPUS: Fraction(1),
    Resource.CPU: Fraction(1, 1000),
    Resource.MEMORY: Fraction(2**20),
}


@dataclass(frozen=True, slots=True)
class Entitlement:
    """One resource of one queue, in the resource's unit: guaranteed, weight over it, and the most."""

    quota: int = 0
    over_quota_weight: float = 1.0
    limit: int | None = None  # None: no limit


@dataclass(frozen=True, slots=True)
class QueueSpec:
    name: str
    parent: str | None = None
    resources: Mapping[Resource, Entitlement] = field(default_factory=dict)
    namespaces: frozenset[str] | None = None  # None: pods of any namespace may join
    priority: int = DEFAULT_PRIORITY  # among siblings, the higher take what quotas leave first
    # Seconds a pod of the queue runs before it may be preempted (within its queue) or reclaimed (by another
    # queue); None: as the queue above it says, or the scheduler's `--min-runtime`; `math.inf`: never.
    preempt_min_runtime: float | None = None
    reclaim_min_runtime: float | None = None

    def entitlement(self, resource: Resource) -> Entitlement:
        return self.resources.get(resource, Entitlement())


def queue_of(labels: Mapping[str, object]) -> str:
    """The queue a pod joins: gpufrac's label, else KAI's, else `default`."""
    for key in (QUEUE_LABEL, KAI_QUEUE_LABEL):
        value = labels.get(key)
        if isinstance(value, str) and value:
            return value
    return DEFAULT_QUEUE


def parse_queue(obj: Mapping[str, object]) -> QueueSpec:
    """A Queue object as the API returns it; `ContractError` naming the first field that is wrong."""
    metadata = _map(obj.get("metadata"), "metadata")
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        raise ContractError("metadata.name", str(name), "a Queue needs a name")
    spec = _map(obj.get("spec", {}), "spec")
    parent = spec.get("parentQueue")
    if parent is not None and (not isinstance(parent, str) or not parent):
        raise ContractError("spec.parentQueue", str(parent), "must be the name of another Queue")
    if parent == name:
        raise ContractError("spec.parentQueue", name, "a Queue cannot be its own parent")
    resources: dict[Resource, Entitlement] = {}
    for key, value in _map(spec.get("resources", {}), "spec.resources").items():
        try:
            resource = Resource(key)
        except ValueError:
            known = ", ".join(r.value for r in Resource)
            raise ContractError(
                f"spec.resources.{key}", str(value), f"unknown resource; known: {known}"
            ) from None
        resources[resource] = _entitlement(resource, _map(value, f"spec.resources.{key}"))
    return QueueSpec(
        name,
        parent or None,
        resources,
        _namespaces(spec.get("namespaces")),
        _priority(spec.get("priority")),
        _runtime(spec.get("preemptMinRuntime"), "spec.preemptMinRuntime"),
        _runtime(spec.get("reclaimMinRuntime"), "spec.reclaimMinRuntime"),
    )


def ancestry(queues: Mapping[str, QueueSpec], name: str) -> list[str]:
    """`name` and the queues above it, up to its root; a cycle (a tree made without the webhook) ends it."""
    line: list[str] = []
    current: str | None = name
    while current is not None and current in queues and current not in line:
        line.append(current)
        current = queues[current].parent
    return line


def refusal(queues: Mapping[str, QueueSpec], queue: str, namespace: str) -> str | None:
    """Why pods of `namespace` may not join `queue`, or None when they may: every queue from it up to its
    root that lists namespaces lists this one."""
    for name in ancestry(queues, queue):
        allowed = queues[name].namespaces
        if allowed is not None and namespace not in allowed:
            whose = "its" if name == queue else f"its parent queue {name}'s"
            listed = f"lists only {', '.join(sorted(allowed))}" if allowed else "lists no namespace"
            return (
                f"namespace {namespace} may not use queue {queue}: {whose} spec.namespaces {listed}; use a "
                "queue of this namespace, or have an admin add it there"
            )
    return None


def preempt_min_runtime(queues: Mapping[str, QueueSpec], queue: str, default: float) -> float:
    """How long a pod of `queue` runs before a pod of its own queue may preempt it: the first
    `preemptMinRuntime` set from the queue up to its root (KAI Scheduler's rule), else `default`."""
    return _first_runtime(queues, ancestry(queues, queue), "preempt_min_runtime", default)


def reclaim_min_runtime(
    queues: Mapping[str, QueueSpec], reclaimer: str, victim: str, default: float
) -> float:
    """How long a pod of `victim` runs before a pod of `reclaimer` may reclaim it: KAI Scheduler's rule, the
    first `reclaimMinRuntime` set from the victim's side of the two queues' lowest common ancestor (the
    queue one step below it, towards the victim) up to the root, else `default`. So a setting deep in the
    tree rules only reclaims among the queues under it, and an admin of a branch cannot make its pods
    unreclaimable by the rest of the tree."""
    line = ancestry(queues, victim)
    theirs = set(ancestry(queues, reclaimer))
    below = next((at for at in range(1, len(line)) if line[at] in theirs), len(line)) - 1
    return _first_runtime(queues, line[max(below, 0) :], "reclaim_min_runtime", default)


def _first_runtime(queues: Mapping[str, QueueSpec], line: list[str], kind: str, default: float) -> float:
    for name in line:
        seconds: float | None = getattr(queues[name], kind)
        if seconds is not None:
            return seconds
    return default


def check_tree(queues: Mapping[str, QueueSpec]) -> None:
    """`ContractError` for the first thing wrong with the queues as a whole: a parent that does not exist, a
    cycle, or children whose quotas add up to more than their parent's quota (or whose limit passes it; a
    child without a limit is held to its parent's)."""
    for spec in queues.values():
        if spec.parent is not None and spec.parent not in queues:
            raise ContractError("spec.parentQueue", spec.parent, f"queue {spec.name}: no such Queue")
    rooted: set[str] = set()  # queues whose line of parents is known to end: each walked once
    for spec in queues.values():
        line: set[str] = set()
        name: str | None = spec.name
        while name is not None and name not in rooted:
            if name in line:
                raise ContractError("spec.parentQueue", spec.parent or "", f"queue {spec.name}: a cycle")
            line.add(name)
            name = queues[name].parent
        rooted |= line
    children_of: dict[str, list[QueueSpec]] = {}
    for spec in queues.values():
        if spec.parent is not None:
            children_of.setdefault(spec.parent, []).append(spec)
    for spec in queues.values():
        children = children_of.get(spec.name, [])
        for resource in Resource:
            ceiling = spec.entitlement(resource)
            promised = sum(child.entitlement(resource).quota for child in children)
            if promised > ceiling.quota:
                raise ContractError(
                    f"spec.resources.{resource.value}.quota",
                    str(promised),
                    f"queue {spec.name}'s children are promised more than its quota ({ceiling.quota})",
                )
            for child in children:
                limit = child.entitlement(resource).limit
                if ceiling.limit is not None and limit is not None and limit > ceiling.limit:
                    raise ContractError(
                        f"spec.resources.{resource.value}.limit",
                        str(limit),
                        f"queue {child.name} may not hold more than its parent {spec.name} ({ceiling.limit})",
                    )


def _namespaces(value: object) -> frozenset[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(
        isinstance(item, str) and _DNS_LABEL.fullmatch(item) for item in value
    ):
        raise ContractError(
            "spec.namespaces", str(value), "must be a list of namespace names (absent: any namespace)"
        )
    return frozenset(value)


_DURATION = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)")
_DURATION_UNIT = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
MAX_RUNTIME = 10 * 365 * 24 * 3600.0  # ten years: past it, a runtime means never (a negative one says so)


def _runtime(value: object, where: str) -> float | None:
    """A Kubernetes duration (`metav1.Duration`, as Go writes it: `90s`, `10m`, `1h30m`) in seconds; a
    negative one is never (KAI Scheduler's -1)."""
    if value is None:
        return None
    text = value if isinstance(value, str) else ""
    sign, digits = (-1.0, text[1:]) if text.startswith("-") else (1.0, text.removeprefix("+"))
    parts = _DURATION.findall(digits)
    if digits != "0" and (not parts or "".join(number + unit for number, unit in parts) != digits):
        raise ContractError(
            where, str(value), "must be a duration such as 90s, 10m or 1h30m (negative: never)"
        )
    seconds = sum(float(number) * _DURATION_UNIT[unit] for number, unit in parts)
    if seconds > MAX_RUNTIME:
        raise ContractError(
            where, str(value), "is over ten years; a negative duration such as -1s means never"
        )
    return math.inf if sign < 0 and seconds > 0 else seconds


def _priority(value: object) -> int:
    if value is None:
        return DEFAULT_PRIORITY
    if isinstance(value, bool) or not isinstance(value, int) or abs(value) > MAX_PRIORITY:
        raise ContractError(
            "spec.priority",
            str(value),
            f"must be a whole number from -{MAX_PRIORITY} to {MAX_PRIORITY} (absent: {DEFAULT_PRIORITY})",
        )
    return value


def _entitlement(resource: Resource, fields: Mapping[str, object]) -> Entitlement:
    where = f"spec.resources.{resource.value}"
    unknown = set(fields) - {"quota", "limit", "overQuotaWeight"}
    if unknown:
        raise ContractError(
            f"{where}.{sorted(map(str, unknown))[0]}",
            "",
            "unknown field; known: quota, limit, overQuotaWeight",
        )
    quota = _amount(resource, fields.get("quota", 0), f"{where}.quota")
    limit_text = fields.get("limit", NO_LIMIT)
    limit = (
        None if limit_text in (NO_LIMIT, str(NO_LIMIT)) else _amount(resource, limit_text, f"{where}.limit")
    )
    weight = fields.get("overQuotaWeight", 1)
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not 0 <= weight <= MAX_WEIGHT:
        raise ContractError(
            f"{where}.overQuotaWeight", str(weight), f"must be a number from 0 to {MAX_WEIGHT}"
        )
    if limit is not None and limit < quota:
        raise ContractError(f"{where}.limit", str(limit_text), f"is below the quota ({quota})")
    return Entitlement(quota, float(weight), limit)


def _amount(resource: Resource, value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ContractError(where, str(value), "must be a quantity such as 4, 500m or 80Gi")
    try:
        amount = parse_quantity(str(value))
    except ValueError as error:
        raise ContractError(where, str(value), str(error)) from None
    if amount < 0:
        raise ContractError(where, str(value), "must be 0 or more")
    if resource is Resource.GPUS and amount.denominator != 1:
        raise ContractError(where, str(value), "whole GPUs are counted whole")
    units = math.ceil(amount / _UNIT[resource])
    if units > MAX_AMOUNT:
        raise ContractError(where, str(value), f"is out of range (at most {MAX_AMOUNT} in its unit)")
    return units


def _map(value: object, where: str) -> Mapping[str, object]:
    if not isinstance(value, Mapping):
        raise ContractError(where, str(value), "must be a map")
    return value
