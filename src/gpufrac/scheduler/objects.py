"""Kubernetes objects (plain dicts, as the API returns them) to and from the engine's types. Pure.

Everything the scheduler knows comes from here: a Node becomes a `NodeSpec`, a pending Pod a `PodDemand`,
a bound Pod a `Placement` read back from the annotations bind wrote. Keeping this pure is what lets a
restarted scheduler rebuild exactly the state it had, and lets tests check the conversions without an
API server.

Objects are untrusted input: one odd pod or node must never stop the watch every other object arrives on.
So the identity readers (`meta`, `pod_uid`, `node_name`, `is_done`, ...) never raise (a field of the wrong
type reads as absent), and everything that parses (`check`, `node_spec`, `pod_resources`, `pod_demand`,
`bound_placement`) raises only `ContractError`, which names the field; the cache and the loop catch it per
object, report the object and skip it.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpufrac import contract
from gpufrac.cluster.model import Assignment, GpuSpec, NodeSpec, Placement, PodDemand, Scalars
from gpufrac.contract import keys, node_inventory
from gpufrac.contract.memory_resource import GPU_MEMORY_RESOURCE
from gpufrac.kubeapi.fields import as_mapping, is_sidecar

Obj = Mapping[str, Any]
log = logging.getLogger("gpufrac.scheduler")

DEFAULT_SCHEDULER = "default-scheduler"
_DONE_PHASES = ("Succeeded", "Failed")

# The largest CPU (in milli) or memory (in MiB) one node offers or one pod asks for. The state adds these
# up in int64; 2**50 leaves room to add thousands of them, and is far beyond any real machine.
MAX_AMOUNT = 2**50
_MAX_PRIORITY = 2**31  # Kubernetes priorities are int32


def meta(obj: Obj) -> Obj:
    return as_mapping(obj.get("metadata"))


def text_field(obj: Obj, part: str, name: str) -> str:
    """`obj[part][name]` when it is a string, else "": identity fields of an object that may be malformed."""
    value = as_mapping(obj.get(part)).get(name)
    return value if isinstance(value, str) else ""


def name_of(obj: Obj) -> str:
    """metadata.name; "" when it is missing or not a string."""
    return text_field(obj, "metadata", "name")


def pod_key(pod: Obj) -> str:
    """namespace/name: how people (logs, Events, `gpufrac top`) name a pod."""
    return f"{text_field(pod, 'metadata', 'namespace')}/{name_of(pod)}"


def pod_uid(pod: Obj) -> str:
    """How the scheduler tells pods apart: a pod recreated under the same name is another pod. Every pod the
    API returns has a UID; namespace/name stands in only for hand-made objects without one."""
    return text_field(pod, "metadata", "uid") or pod_key(pod)


def _amount(value: object, where: str, units: Callable[[str], int]) -> int:
    """A resource quantity in whole units (`units` reads a text), rounded up; 0 when absent."""
    if value is None or value == "":
        return 0
    text = str(value)
    try:
        amount = units(text)
    except ValueError as error:
        raise contract.ContractError(where, text, str(error)) from None
    if not 0 <= amount <= MAX_AMOUNT:
        raise contract.ContractError(where, text, f"is out of range (0 to {MAX_AMOUNT} in all)")
    return amount


# A relist reads the same few quantity texts ("100m", "16Gi") thousands of times: each is parsed once.
@functools.lru_cache(maxsize=4096)
def _milli_units(text: str) -> int:
    return math.ceil(contract.parse_quantity(text) * 1000)


@functools.lru_cache(maxsize=4096)
def _mib_units(text: str) -> int:
    return math.ceil(contract.parse_quantity(text) / 2**20)


@functools.lru_cache(maxsize=4096)
def _mib_floor(text: str) -> int:
    return math.floor(contract.parse_quantity(text) / 2**20)


@functools.lru_cache(maxsize=4096)
def _whole_units(text: str) -> int:
    return math.floor(contract.parse_quantity(text))


# Resources the scheduler weighs otherwise: CPU and memory, the kubelet's pod slots, and GPUs (whole by
# `nvidia.com/gpu`, shares by annotation, which `gpufrac.io/gpu-memory` only mirrors for quotas to count).
_NOT_SCALARS = frozenset({"cpu", "memory", "pods", keys.GPU_RESOURCE, GPU_MEMORY_RESOURCE})


def _is_scalar(name: str) -> bool:
    """Whether kube-scheduler's fit filter weighs the resource beside CPU and memory: ephemeral-storage,
    hugepages-*, and extended resources (any domain-prefixed name outside kubernetes.io). Unweighed, a pod
    would be placed where the kubelet then refuses it (OutOfephemeral-storage, UnexpectedAdmissionError)."""
    if name in _NOT_SCALARS:
        return False
    if _in_bytes(name):
        return True
    domain, slash, _ = name.partition("/")
    return bool(slash) and domain != "kubernetes.io" and not domain.endswith(".kubernetes.io")


def _in_bytes(name: str) -> bool:
    return name == "ephemeral-storage" or name.startswith("hugepages-")


def _scalar(name: str, value: object, where: str, *, offered: bool = False) -> int:
    """An amount of a scalar resource in the engine's unit: MiB for bytes, else a count; what a pod asks is
    rounded up and what a node `offered` down, so that no rounding fits a pod the kubelet then refuses."""
    units = (_mib_floor if offered else _mib_units) if _in_bytes(name) else _whole_units
    return _amount(value, where, units)


def pod_scalars(pod: Obj) -> Scalars:
    """The scalar resources (`_is_scalar`) the pod requests, as `pod_total` adds them up. `ContractError` for
    a malformed amount."""
    spec = as_mapping(pod.get("spec"))
    containers = [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]
    names = sorted({name for container in containers for name in _requests(container) if _is_scalar(name)})
    if not names:
        return ()

    def measure(container: Obj, where: str) -> tuple[int, ...]:
        wanted = _requests(container)
        return tuple(_scalar(name, wanted.get(name), f"{where}.resources.requests.{name}") for name in names)

    totals = pod_total(spec, measure)
    for name, total in zip(names, totals, strict=True):
        if total > MAX_AMOUNT:
            raise contract.ContractError(f"resources.requests.{name}", str(total), "more than any node has")
    return tuple((name, total) for name, total in zip(names, totals, strict=True) if total)


def _requests(container: object) -> Obj:
    """A container's `resources.requests` (empty where missing or malformed)."""
    return as_mapping(as_mapping(as_mapping(container).get("resources")).get("requests"))


def cpu_milli(quantity: object, where: str = "cpu") -> int:
    return _amount(quantity, where, _milli_units)


def memory_mib(quantity: object, where: str = "memory") -> int:
    return _amount(quantity, where, _mib_units)


# ---- shapes -----------------------------------------------------------------------------------------------

# The fields the scheduler reads, with their types: a type (or tuple of types), a dict of field -> shape, a
# `{str: shape}` map of any keys, or a one-item list of the shape of every item. A field may be absent or
# null, a list item may not. `check` runs once per object, so the readers may then use the fields freely.
_STRINGS = {str: str}
_QUANTITY = (str, int, float)
_CONTAINER = {
    "name": str,
    "restartPolicy": str,
    "ports": [{"hostPort": int, "hostIP": str, "protocol": str}],
    "resources": {"requests": {str: _QUANTITY}, "limits": {str: _QUANTITY}},
}
POD_SHAPE: Mapping[Any, Any] = {
    "metadata": {"name": str, "namespace": str, "uid": str, "annotations": _STRINGS},
    "spec": {
        "nodeName": str,
        "schedulerName": str,
        "priority": int,
        "containers": [_CONTAINER],
        "initContainers": [_CONTAINER],
        "overhead": {str: _QUANTITY},
        "resources": {"requests": {str: _QUANTITY}},
        "schedulingGates": [{"name": str}],
        "preemptionPolicy": str,
        "nodeSelector": _STRINGS,
        "tolerations": [{"key": str, "operator": str, "value": str, "effect": str}],
    },
    "status": {"phase": str},
}
NODE_SHAPE: Mapping[Any, Any] = {
    "metadata": {"name": str, "labels": _STRINGS, "annotations": _STRINGS},
    "spec": {"unschedulable": bool, "taints": [{"key": str, "value": str, "effect": str}]},
    "status": {"allocatable": {str: _QUANTITY}, "conditions": [{"type": str, "status": str}]},
}


def check(obj: Obj, shape: Mapping[Any, Any]) -> None:
    """Raise `ContractError` naming the first field the scheduler reads that has the wrong type.

    A relist checks every pod, so the common case (nothing wrong) runs a walk that builds no field names;
    only an object that fails it is walked again to name the field."""
    if not _fits(obj, shape):
        _check(obj, shape, "", optional=False)


def check_pod(pod: Obj) -> None:
    """`check` for a pod, which must also be named: Events and conditions about it need the name."""
    check(pod, POD_SHAPE)
    for field in ("namespace", "name"):
        if not text_field(pod, "metadata", field):
            raise contract.ContractError(f"metadata.{field}", "", "a pod needs one")


def _fits(value: object, shape: Any) -> bool:
    """`_check` without the field names: whether `value` has `shape` (None read as absent inside it).
    Plain loops: this runs for every field of every pod of a relist."""
    if type(shape) is dict:
        if not isinstance(value, dict):
            return False  # a Mapping of another type is rare: `_check` judges it
        if str in shape:
            inner = shape[str]
            if inner is str:  # labels and annotations, the most items of an object: no call per item
                for key, item in value.items():  # noqa: SIM110 (a loop: all() over a generator is slower)
                    if type(key) is not str or type(item) is not str:
                        return False
                return True
            for key, item in value.items():  # noqa: SIM110 (as above)
                if type(key) is not str or not _fits(item, inner):
                    return False
            return True
        for key, inner in shape.items():
            item = value.get(key)
            if item is not None and not _fits(item, inner):
                return False
        return True
    if type(shape) is list:
        if type(value) is not list:
            return False
        inner = shape[0]
        for item in value:  # noqa: SIM110 (as above)
            if not _fits(item, inner):
                return False
        return True
    if shape is str:
        return type(value) is str
    kinds = shape if isinstance(shape, tuple) else (shape,)
    return isinstance(value, kinds) and (not isinstance(value, bool) or bool in kinds)


def _check(value: object, shape: Any, where: str, *, optional: bool) -> None:
    if value is None and optional:
        return
    if isinstance(shape, dict):
        if not isinstance(value, Mapping):
            raise contract.ContractError(where or "object", str(value), "must be a map")
        if str in shape:
            for key, item in value.items():
                if not isinstance(key, str):
                    raise contract.ContractError(where, str(key), "keys must be strings")
                _check(item, shape[str], f"{where}[{key}]", optional=False)
            return
        for key, inner in shape.items():
            _check(value.get(key), inner, f"{where}.{key}" if where else key, optional=True)
    elif isinstance(shape, list):
        if not isinstance(value, list):
            raise contract.ContractError(where, str(value), "must be a list")
        for position, item in enumerate(value):
            _check(item, shape[0], f"{where}[{position}]", optional=False)
    else:
        kinds = shape if isinstance(shape, tuple) else (shape,)
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            wanted = " or ".join(kind.__name__ for kind in kinds)
            raise contract.ContractError(where, str(value), f"must be {wanted}")


# ---- nodes ------------------------------------------------------------------------------------------------


def node_spec(node: Obj) -> NodeSpec:
    """The node's allocatable CPU and memory, and its GPUs; `ContractError` for a node that is unreadable.

    GPUs come from the node agent's `gpufrac.io/gpus` annotation when present (UUIDs and health), otherwise
    from the GPU Feature Discovery labels (count, memory in MiB, product), with indices standing in for
    UUIDs, as the contract allows. An unreadable annotation falls back to the labels (`inventory_problem`
    says why, for the report).
    """
    check(node, NODE_SHAPE)
    name = name_of(node)
    if not name:
        raise contract.ContractError("metadata.name", "", "a Node needs a name")
    allocatable = as_mapping(as_mapping(node.get("status")).get("allocatable"))
    node_meta_labels = node_labels_of(node)
    inventory, _ = _agent_inventory(node)
    if inventory is not None:
        # Portions are of what a process can allocate where the agent published it (`usable_mib`), so two
        # halves fit on a real GPU after the driver and the CUDA contexts have taken their part.
        gpus = tuple(
            GpuSpec(gpu.index, gpu.uuid, gpu.model, gpu.usable_mib, healthy=gpu.healthy) for gpu in inventory
        )
    else:
        count = _int_label(node_meta_labels, node_inventory.GPU_COUNT_LABEL, node_inventory.MAX_GPUS_PER_NODE)
        memory = _int_label(
            node_meta_labels, node_inventory.GPU_MEMORY_LABEL, node_inventory.MAX_GPU_MEMORY_MIB
        )
        model = node_meta_labels.get(node_inventory.GPU_PRODUCT_LABEL, "")
        gpus = tuple(GpuSpec(i, str(i), model, memory) for i in range(count)) if memory and count else ()
    return NodeSpec(
        name=name,
        cpu_milli=cpu_milli(allocatable.get("cpu"), "status.allocatable.cpu"),
        memory_mib=memory_mib(allocatable.get("memory"), "status.allocatable.memory"),
        gpus=gpus,
        compute_guarantee=guarantees_compute(node_meta_labels),
        max_pods=_max_pods(allocatable.get("pods")),
        scalars=tuple(
            (name, amount)
            for name, value in sorted(allocatable.items())
            if _is_scalar(name)
            and (amount := _scalar(name, value, f"status.allocatable.{name}", offered=True))
        ),
    )


def _max_pods(quantity: object) -> int | None:
    """The node's allocatable `pods`: None when it does not say (the kubelet always does)."""
    if quantity is None:
        return None
    return _amount(quantity, "status.allocatable.pods", _whole_units)


def guarantees_compute(labels: Mapping[str, str]) -> bool:
    """The operator's `gpufrac.io/compute-guarantee=true` on the node (its pool). Any other value, or none,
    leaves compute unguaranteed, as before the label existed: a typo must not make a pool's shares wait."""
    return labels.get(node_inventory.COMPUTE_GUARANTEE_LABEL) == node_inventory.COMPUTE_GUARANTEE_VALUE


def device_plugin_gpus(node: Obj) -> tuple[node_inventory.GpuInfo, ...] | None:
    """The agent's GPUs, holders included, on a node where a device plugin hands out `nvidia.com/gpu`;
    None on a node without one (`DevicePluginMode.NONE`, or no agent)."""
    if node_inventory.device_plugin_mode(node_labels_of(node)) is node_inventory.DevicePluginMode.NONE:
        return None
    return _agent_inventory(node)[0] or ()


def gpu_ready(node: Obj) -> str | None:
    """Why the node takes no GPU pod now: its agent has not said it is ready (`READY_CONDITION`), with the
    agent's reason; None when it has."""
    conditions = as_mapping(node.get("status")).get("conditions") or []
    for condition in conditions:
        if isinstance(condition, Mapping) and condition.get("type") == node_inventory.READY_CONDITION:
            if condition.get("status") == "True":
                return None
            reason = condition.get("reason")
            return (
                f"gpufrac agent not ready ({reason})"
                if isinstance(reason, str) and reason
                else ("gpufrac agent not ready")
            )
    return "no gpufrac agent ready on the node"


def gpu_heartbeat(node: Obj) -> float | None:
    """When the agent last refreshed `READY_CONDITION` (seconds since the epoch); None without one."""
    for condition in as_mapping(node.get("status")).get("conditions") or []:
        if isinstance(condition, Mapping) and condition.get("type") == node_inventory.READY_CONDITION:
            stamp = node_inventory.condition_time(condition.get("lastHeartbeatTime"))
            return stamp.timestamp() if stamp is not None else None
    return None


def inventory_problem(node: Obj) -> str | None:
    """Why the agent's GPU list on `node` is ignored, or None when it is absent or readable."""
    return _agent_inventory(node)[1]


def _agent_inventory(node: Obj) -> tuple[tuple[node_inventory.GpuInfo, ...] | None, str | None]:
    """The agent's GPU list, or None when there is none or it cannot be read (then labels are used); and
    why it was not read."""
    text = annotations_of(node).get(node_inventory.GPUS_ANNOTATION)
    return _read_inventory(text) if isinstance(text, str) else (None, None)


@functools.lru_cache(maxsize=256)
def _read_inventory(text: str) -> tuple[tuple[node_inventory.GpuInfo, ...] | None, str | None]:
    """`_agent_inventory` of one annotation text, memoized: reading a Node asks for it three times (its
    spec, its device-plugin GPUs, its problems), and the answer is immutable."""
    try:
        return node_inventory.load_gpus(text), None
    except ValueError as error:
        return (
            None,
            f"ignoring its {node_inventory.GPUS_ANNOTATION} annotation, using the GPU labels: {error}",
        )


def _int_label(labels: Mapping[str, str], key: str, most: int) -> int:
    """A whole-number label in 0..most; 0 (no GPUs) for anything else, as for a node without the label."""
    text = labels.get(key, "0")
    if not (text.isascii() and text.isdigit()) or len(text) > 18:
        return 0
    value = int(text)
    return value if value <= most else 0


def pod_volumes(pod: Obj) -> list[Obj]:
    """The pod's `spec.volumes` that are objects (none when the field is missing or not a list)."""
    volumes = as_mapping(pod.get("spec")).get("volumes")
    return [volume for volume in volumes if isinstance(volume, Mapping)] if isinstance(volumes, list) else []


def annotations_of(obj: Obj) -> Obj:
    """The annotations of a node or pod, empty when they are missing or not a map."""
    return as_mapping(meta(obj).get("annotations"))


def node_ready(node: Obj) -> bool:
    """Ready, and not cordoned: the only nodes a new pod may land on."""
    if as_mapping(node.get("spec")).get("unschedulable"):
        return False
    conditions = as_mapping(node.get("status")).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def node_labels_of(node: Obj) -> Mapping[str, str]:
    return as_mapping(meta(node).get("labels"))


def node_taints(node: Obj) -> list[Obj]:
    return [
        t
        for t in as_mapping(node.get("spec")).get("taints") or []
        if t.get("effect") in ("NoSchedule", "NoExecute")
    ]


# ---- pods -------------------------------------------------------------------------------------------------


def never_preempts(pod: Obj) -> bool:
    """`preemptionPolicy: Never`: the pod waits for room rather than have other pods evicted for it (its
    PriorityClass's policy, copied into the pod at admission)."""
    return as_mapping(pod.get("spec")).get("preemptionPolicy") == "Never"


HostPort = tuple[str, str, int]  # host IP ("0.0.0.0": every address), protocol, port


def host_ports(pod: Obj) -> set[HostPort]:
    """The node ports the pod's containers and sidecars bind (`hostPort`; a hostNetwork pod's ports have
    one too, the API server defaults it), which no two pods on a node may share."""
    spec = as_mapping(pod.get("spec"))
    running = [*(spec.get("containers") or [])]
    running += [c for c in spec.get("initContainers") or [] if is_sidecar(c)]
    found = set()
    for container in running:
        for port in as_mapping(container).get("ports") or []:
            number = as_mapping(port).get("hostPort")
            if isinstance(number, int) and not isinstance(number, bool) and number > 0:
                found.add((port.get("hostIP") or "0.0.0.0", port.get("protocol") or "TCP", number))
    return found


def ports_clash(wanted: set[HostPort], taken: set[HostPort]) -> bool:
    """Whether a port of `wanted` is one of `taken`'s: the same protocol and port on the same host IP, or on
    every address (0.0.0.0) on either side."""
    return any(
        (protocol, number) == (other_protocol, other_number)
        and (ip == other_ip or "0.0.0.0" in (ip, other_ip))
        for ip, protocol, number in wanted
        for other_ip, other_protocol, other_number in taken
    )


def gated(pod: Obj) -> bool:
    """Whether the pod still has scheduling gates: something (a queueing controller such as Kueue, an
    operator) holds it back, and no scheduler may place it until the last gate is removed."""
    return bool(as_mapping(pod.get("spec")).get("schedulingGates"))


def is_done(pod: Obj) -> bool:
    """A pod that holds nothing any more: finished (Succeeded or Failed). One being deleted is not done: its
    containers run out their grace period holding their GPU memory, CPU and pod slot, which the kubelet,
    and so the scheduler, count until the pod is gone."""
    return text_field(pod, "status", "phase") in _DONE_PHASES


def terminating(pod: Obj) -> bool:
    """A pod being deleted: never scheduled, never evicted, still counted where it runs (`is_done`)."""
    return bool(meta(pod).get("deletionTimestamp"))


def termination_grace(pod: Obj) -> object:
    """The pod's `spec.terminationGracePeriodSeconds` as written (None where absent): see
    `kubeapi.eviction.grace_within`."""
    return as_mapping(pod.get("spec")).get("terminationGracePeriodSeconds")


def deletion_due(pod: Obj) -> float | None:
    """When a pod being deleted is to be gone (epoch seconds: its `deletionTimestamp`, which the API server
    sets to the request's time plus the grace period); None for one not being deleted, or an unreadable
    time."""
    return _epoch(text_field(pod, "metadata", "deletionTimestamp"))


def pod_total(spec: Obj, measure: Callable[[Obj, str], tuple[int, ...]]) -> tuple[int, ...]:
    """What a pod asks of its node, of amounts `measure` reads per container (given the container and
    where it is, `spec.containers[0]`), as Kubernetes counts a pod's requests: its containers and its
    sidecars (init containers of `restartPolicy: Always`, which keep running beside them) together, or, if
    more, an init container with the sidecars started before it. Counted otherwise, a pod with sidecars
    would be placed where the kubelet then refuses it."""

    def plus(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(x + y for x, y in zip(a, b, strict=True))

    def most(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(max(x, y) for x, y in zip(a, b, strict=True))

    running: tuple[int, ...] | None = None
    for position, container in enumerate(spec.get("containers") or []):
        own = measure(as_mapping(container), f"spec.containers[{position}]")
        running = own if running is None else plus(running, own)
    if running is None:
        return ()
    sidecars = starting = tuple(0 for _ in running)
    for position, container in enumerate(spec.get("initContainers") or []):
        own = measure(as_mapping(container), f"spec.initContainers[{position}]")
        if is_sidecar(container):
            running, sidecars = plus(running, own), plus(sidecars, own)
            starting = most(starting, sidecars)
        else:
            starting = most(starting, plus(own, sidecars))
    return most(running, starting)


def gpu_resource_count(pod: Obj) -> int:
    """The `nvidia.com/gpu` a pod asks the kubelet for, as the kubelet counts it (`pod_total`); 0 for
    anything unreadable, which the kubelet would refuse."""

    def count(container: Obj, _: str) -> tuple[int]:
        resources = as_mapping(container.get("resources"))
        value = as_mapping(resources.get("limits")).get(keys.GPU_RESOURCE)
        if value is None:
            value = as_mapping(resources.get("requests")).get(keys.GPU_RESOURCE)
        text = str(value) if isinstance(value, str | int) and not isinstance(value, bool) else "0"
        return (int(text) if text.isascii() and text.isdigit() and len(text) < 4 else 0,)

    return sum(pod_total(as_mapping(pod.get("spec")), count))


def movable_since(pod: Obj) -> float | None:
    """When a pod that may be moved started (`running_since`); None for a pod that may not: one without the
    tenant's `gpufrac.io/movable: "true"`, or without a controller to recreate it."""
    if annotations_of(pod).get(keys.MOVABLE_ANNOTATION) != "true":
        return None
    owners = meta(pod).get("ownerReferences")
    if not isinstance(owners, list) or not any(
        isinstance(owner, Mapping) and owner.get("controller") is True for owner in owners
    ):
        return None
    return running_since(pod)


def created(pod: Mapping[str, Any]) -> float:
    """The pod's creationTimestamp as seconds since the epoch. The API writes it in UTC (`Z`), which
    `fromisoformat` honours; 0 for a pod without one, so it sorts first among equals."""
    stamp = meta(pod).get("creationTimestamp")
    try:
        return datetime.fromisoformat(stamp).timestamp() if isinstance(stamp, str) else 0.0
    except ValueError:
        return 0.0


def running_since(pod: Obj, *, going: bool = False) -> float | None:
    """When a pod started (epoch seconds: `status.startTime`, else its creation), for the minimum runtime
    before it may be evicted; None for one done, without a readable time, or already going (unless
    `going`: one being deleted counts too)."""
    if is_done(pod) or (terminating(pod) and not going):
        return None
    return _epoch(text_field(pod, "status", "startTime") or text_field(pod, "metadata", "creationTimestamp"))


def _epoch(stamp: str) -> float | None:
    """An RFC 3339 time as epoch seconds; None for none, or one that does not read."""
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def node_name(pod: Obj) -> str:
    return text_field(pod, "spec", "nodeName")


def scheduler_name(pod: Obj) -> str:
    return text_field(pod, "spec", "schedulerName") or DEFAULT_SCHEDULER


def priority(pod: Obj) -> int:
    """spec.priority, an int32 in Kubernetes; 0 when absent or not one."""
    value = as_mapping(pod.get("spec")).get("priority")
    if isinstance(value, int) and not isinstance(value, bool) and -_MAX_PRIORITY <= value < _MAX_PRIORITY:
        return value
    return 0


def pod_resources(pod: Obj) -> tuple[int, int]:
    """CPU (milli) and memory (MiB) the pod requests, as kube-scheduler counts them: its pod-level
    `resources.requests` where set (Kubernetes 1.32+), else its containers' as `pod_total` adds them up, and
    its RuntimeClass's `overhead`. `ContractError` for a malformed amount."""
    check(pod, POD_SHAPE)
    spec = as_mapping(pod.get("spec"))

    def cpu_and_memory(wanted: Obj, where: str) -> tuple[int, int]:
        return cpu_milli(wanted.get("cpu"), f"{where}.cpu"), memory_mib(
            wanted.get("memory"), f"{where}.memory"
        )

    def requests(container: Obj, where: str) -> tuple[int, int]:
        return cpu_and_memory(_requests(container), f"{where}.resources.requests")

    cpu, memory = pod_total(spec, requests) or (0, 0)
    level = as_mapping(as_mapping(spec.get("resources")).get("requests"))
    level_cpu, level_memory = cpu_and_memory(level, "spec.resources.requests")
    cpu = level_cpu if level.get("cpu") is not None else cpu
    memory = level_memory if level.get("memory") is not None else memory
    extra_cpu, extra_memory = cpu_and_memory(as_mapping(spec.get("overhead")), "spec.overhead")
    cpu, memory = cpu + extra_cpu, memory + extra_memory
    if cpu > MAX_AMOUNT or memory > MAX_AMOUNT:
        raise contract.ContractError(
            "spec.containers", f"{cpu}m, {memory}Mi", "the pod asks for more than any node has"
        )
    return cpu, memory


def pod_demand(pod: Obj, *, fault_domain: str = "") -> PodDemand:
    """What a pending pod needs; raises `ContractError` for a pod that breaks the contract. `fault_domain`:
    the group its sm-sharing shares may share GPUs with (see `Scheduler.fault_domain`)."""
    cpu, memory = pod_resources(pod)
    request = contract.parse_pod(pod)
    for share in request.shares:
        _bounded_share(share.container, share.num_devices, [share.request, share.limit])
    for whole in request.whole:
        if whole.count > node_inventory.MAX_GPUS_PER_NODE:
            raise contract.ContractError(
                keys.GPU_RESOURCE,
                str(whole.count),
                f"no node has more than {node_inventory.MAX_GPUS_PER_NODE} GPUs",
            )
    return PodDemand(
        name=pod_uid(pod),
        cpu_milli=cpu,
        memory_mib=memory,
        whole=request.whole,
        shares=request.shares,
        priority=priority(pod),
        fault_domain=fault_domain,
        scalars=pod_scalars(pod),
    )


def _bounded_share(container: str, devices: int, amounts: Sequence[object]) -> None:
    if devices > node_inventory.MAX_GPUS_PER_NODE:
        raise contract.ContractError(
            keys.NUM_DEVICES, str(devices), f"no node has more than {node_inventory.MAX_GPUS_PER_NODE} GPUs"
        )
    for amount in amounts:
        if isinstance(amount, contract.Mebibytes) and amount.value > node_inventory.MAX_GPU_MEMORY_MIB:
            raise contract.ContractError(
                keys.container_key(container, keys.MEMORY_REQUEST),
                f"{amount.value}Mi",
                "is larger than any GPU",
            )


def bound_placement(pod: Obj, node: NodeSpec) -> Placement:
    """Where a bound pod sits, read back from its annotations.

    A pod that gpufrac did not place (another scheduler's, or a CPU-only pod) still holds its CPU and
    memory, so it becomes a placement with no GPUs. Raises `ContractError` when the annotations name GPUs
    the node does not have.
    """
    cpu, memory = pod_resources(pod)
    # Only what bind wrote is read: a pod without `gpus.devices` holds no GPU gpufrac knows of, whatever
    # else its annotations say, so a foreign pod's odd annotations cannot make its node unusable.
    placed = contract.parse_placement(pod) if _names_devices(pod) else None
    assignments: list[Assignment] = []
    if placed is not None:
        index = {gpu.uuid: gpu.index for gpu in node.gpus} | {str(gpu.index): gpu.index for gpu in node.gpus}
        sizes = {gpu.index: gpu.memory_mib for gpu in node.gpus}

        def indices(container: str, devices: Sequence[str]) -> tuple[int, ...]:
            unknown = [device for device in devices if device not in index]
            if unknown:
                key = keys.container_key(container, keys.DEVICES)
                raise contract.ContractError(
                    key, ",".join(devices), f"node {node.name} has no GPU {unknown[0]}"
                )
            return tuple(index[device] for device in devices)

        for share in placed.shares:
            gpus = indices(share.container, share.devices)
            assignments.append(
                Assignment(
                    share.container,
                    gpus,
                    share.request_mib,
                    share.limit_mib,
                    share.mode,
                    share.compute_percent,
                )
            )
        for whole in placed.whole:
            gpus = indices(whole.container, whole.devices)
            size = min(sizes[gpu] for gpu in gpus)
            assignments.append(Assignment(whole.container, gpus, size, size, None))
    return Placement(
        pod_uid(pod),
        node.name,
        cpu,
        memory,
        tuple(assignments),
        _fault_domain(pod, assignments),
        pod_scalars(pod),
    )


def _fault_domain(pod: Obj, assignments: Sequence[Assignment]) -> str:
    """The domain a bound pod's sm-sharing shares were placed in: as its Binding recorded it, or, for a pod
    bound before gpufrac recorded it, its namespace; none for a pod without sm-sharing shares."""
    if not any(a.mode is contract.ComputeMode.SM_SHARING for a in assignments):
        return ""
    recorded = annotations_of(pod).get(keys.FAULT_DOMAIN_ANNOTATION)
    return recorded if isinstance(recorded, str) else text_field(pod, "metadata", "namespace")


def _names_devices(pod: Obj) -> bool:
    return any(isinstance(key, str) and keys.is_devices_key(key) for key in annotations_of(pod))


# ---- binding ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BindPlan:
    """Everything bind writes for one pod, computed before any write so a failure leaves nothing half done.

    `annotations` travel on the Binding: the contract, and the UID of the pod they were granted to
    (`keys.BOUND_UID_ANNOTATION`).
    """

    annotations: dict[str, str]
    configmaps: dict[str, dict[str, str]]  # env ConfigMap name -> its data; empty without gpufrac delivery


def bound_for(pod: Obj) -> str | None:
    """The UID of the pod the Binding that bound `pod` was meant for; None on a pod gpufrac did not bind
    (or an older gpufrac did, before it wrote the marker)."""
    value = annotations_of(pod).get(keys.BOUND_UID_ANNOTATION)
    return value if isinstance(value, str) else None


def misbound(pod: Obj) -> bool:
    """A bound pod carrying a contract granted to another pod: its same-name predecessor's Binding bound it
    (kube-apiserver v1.20 ignores a Binding's UID). It must not keep GPUs it was not given."""
    return bool(node_name(pod)) and contract.granted_to_another(pod) is not None


def holds_binding(pod: Obj, *, uid: str, node: str, plan: BindPlan) -> bool:
    """`pod`, read back after a Binding whose answer was lost, is bound as that Binding would bind it: the
    same pod, on `node`, carrying every annotation of `plan`."""
    annotations = annotations_of(pod)
    return (
        meta(pod).get("uid") == uid
        and node_name(pod) == node
        and all(annotations.get(key) == value for key, value in plan.annotations.items())
    )


def bind_plan(
    pod: Obj,
    placement: Placement,
    node: NodeSpec,
    *,
    mps_pipe_directory: str,
    env_delivery: contract.EnvDelivery,
    kubelet_gpus: bool = False,
    queue: str | None = None,
) -> BindPlan:
    """What to write for `placement`. `kubelet_gpus`: the node's device plugin hands out whole GPUs, so a
    whole-GPU container gets its GPU and its env from the kubelet, and from gpufrac only its (empty) env
    ConfigMap, which its `envFrom` needs to start. `queue`: the queue it is placed in, recorded with its
    contract (`keys.BOUND_QUEUE_ANNOTATION`)."""
    uuids = {gpu.index: gpu.uuid for gpu in node.gpus}
    shares = tuple(
        contract.SharePlacement(
            a.container,
            tuple(uuids[g] for g in a.gpus),
            a.request_mib,
            a.limit_mib,
            a.mode,
            a.compute_percent,
        )
        for a in placement.assignments
        if a.mode is not None
    )
    whole = tuple(
        contract.WholeGpuPlacement(a.container, tuple(uuids[g] for g in a.gpus))
        for a in placement.assignments
        if a.mode is None
    )
    placed = contract.PodPlacement(shares, whole)
    base = annotations_of(pod).get(keys.ENV_CONFIGMAP_ANNOTATION, "")
    configmaps: dict[str, dict[str, str]] = {}
    if env_delivery == contract.EnvDelivery.CONFIGMAP and base:
        env = dict(contract.render_env(placed, mps_pipe_directory=mps_pipe_directory))
        if kubelet_gpus:
            env.update({whole.container: {} for whole in contract.parse_pod(pod).whole})
        configmaps = {keys.env_configmap_name(base, container): dict(data) for container, data in env.items()}
    annotations = dict(contract.render_annotations(placed))
    # The marker goes with a contract only: a pod bound with no GPUs holds nothing another pod was granted.
    # Every pod the API returns has a UID; hand-made test objects may have none.
    if annotations and meta(pod).get("uid"):
        annotations[keys.BOUND_UID_ANNOTATION] = str(meta(pod)["uid"])
        if queue is not None:
            annotations[keys.BOUND_QUEUE_ANNOTATION] = queue
    if any(share.mode is contract.ComputeMode.SM_SHARING for share in shares):
        annotations[keys.FAULT_DOMAIN_ANNOTATION] = placement.fault_domain
    return BindPlan(annotations, configmaps)
