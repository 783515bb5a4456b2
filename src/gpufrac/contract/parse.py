"""Read a pod, as the API returns it, into what it asks for, checking every rule of the contract.

The webhook, the scheduler, the simulator and `gpufrac validate` all call `parse_pod`, so a pod is accepted
or refused for the same reason everywhere. Input is untrusted: anything malformed raises `ContractError`
naming the key, never another exception.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import TypeVar

from gpufrac.contract import keys, node_inventory, quantity
from gpufrac.contract.errors import ContractError, brief
from gpufrac.contract.model import (
    FULL_COMPUTE,
    ComputeMode,
    Mebibytes,
    MemoryAmount,
    PodGpuRequest,
    PodPlacement,
    Portion,
    SharePlacement,
    ShareRequest,
    WholeGpuPlacement,
    WholeGpuRequest,
)

_T = TypeVar("_T")


@dataclass(frozen=True)
class _Pod:
    """The parts of a pod the contract reads, shape-checked."""

    annotations: Mapping[str, str]  # contract keys only
    containers: tuple[str, ...]
    whole: Mapping[str, int]  # container -> whole GPUs, only where > 0
    per_container: Mapping[str, Mapping[str, str]]  # container -> NVIDIA key suffix -> value


# The most containers of one pod that may each hold a share. The scheduler searches every way of putting
# them on a node's GPUs (`placement.exact`), and the pod spec is the tenant's; real pods hold a few.
MAX_SHARE_CONTAINERS = 64


def parse_pod(pod: Mapping[str, object]) -> PodGpuRequest:
    """What `pod` asks for: one `ShareRequest` per share container, one `WholeGpuRequest` per whole one.

    `pod` is a plain dict as the API returns it; only `metadata.annotations` and `spec.containers` (names and
    `nvidia.com/gpu` in limits, else requests) are read, so a workload's pod template works as well. A bound
    pod parses to the same request as before bind: on a container that holds `gpus.devices`, the memory keys
    the scheduler resolved from `gpu-fraction` or `gpu-memory` are its own, not a second request.
    """
    return _request(_read(pod))


def kai_share_container(pod: Mapping[str, object]) -> str | None:
    """The container the KAI annotations (`gpu-fraction`, `gpu-memory`) give their share to, if they ask
    for one: the one `gpu-fraction-container-name` names, or the first. Raises `ContractError` like
    `parse_pod` for a pod that breaks the contract."""
    share = _kai_share(_read(pod))
    return share.container if share is not None else None


def granted_to_another(pod: Mapping[str, object]) -> str | None:
    """The UID of the pod whose Binding bound `pod`, when that is not `pod` itself; else None.

    kube-apiserver v1.20 ignores a Binding's UID, so a pod recreated under the name of one being bound can
    be bound by its predecessor's Binding, contract and all. Every Binding gpufrac sends names the UID it
    was meant for (`keys.BOUND_UID_ANNOTATION`); a contract granted to another pod is no grant to this one.
    """
    metadata = pod.get("metadata")
    if not isinstance(metadata, Mapping):
        return None
    annotations = metadata.get("annotations")
    marker = annotations.get(keys.BOUND_UID_ANNOTATION) if isinstance(annotations, Mapping) else None
    uid = metadata.get("uid")
    if isinstance(marker, str) and isinstance(uid, str) and uid and marker != uid:
        return marker
    return None


def parse_placement(pod: Mapping[str, object]) -> PodPlacement | None:
    """Where a bound pod's GPU containers were put, read from the annotations bind wrote; None if unbound.

    This is how the scheduler rebuilds its state on start, so a bound pod whose annotations disagree with
    what it asks for (a container without devices, the wrong number of them) is an error, not a guess.
    """
    view = _read(pod)
    request = _request(view)
    bound = {
        container: _devices(keys.container_key(container, keys.DEVICES), own[keys.DEVICES])
        for container, own in view.per_container.items()
        if keys.DEVICES in own
    }
    if not bound:
        return None
    shares = []
    for share in request.shares:
        own = view.per_container.get(share.container, {})
        devices = _bound_devices(share.container, bound.pop(share.container, None), count=share.num_devices)
        memory = _memory(share.container, own)
        if memory is None:
            key = keys.container_key(share.container, keys.MEMORY_REQUEST)
            raise ContractError(key, "", "is missing: a bound share needs the memory the scheduler resolved")
        _within_a_gpu(share.container, own, limit_mib=memory[1])
        shares.append(SharePlacement(share.container, devices, *memory, share.mode, share.compute_percent))
    whole = [
        WholeGpuPlacement(
            item.container, _bound_devices(item.container, bound.pop(item.container, None), count=item.count)
        )
        for item in request.whole
    ]
    if bound:
        container, devices = next(iter(bound.items()))
        key = keys.container_key(container, keys.DEVICES)
        raise ContractError(key, ",".join(devices), f'container "{container}" asks for no GPU')
    return PodPlacement(tuple(shares), tuple(whole))


def _within_a_gpu(container: str, own: Mapping[str, str], *, limit_mib: int) -> None:
    """A bound share's memory was resolved on a GPU, so no GPU holding less is possible: one larger than any
    (anyone who may annotate a pod can write 10^23 MiB) is an error here, not a size every reader of bound
    pods must survive (the report's charts overflowed on it)."""
    if limit_mib > node_inventory.MAX_GPU_MEMORY_MIB:
        suffix = keys.MEMORY_LIMIT if keys.MEMORY_LIMIT in own else keys.MEMORY_REQUEST
        raise ContractError(keys.container_key(container, suffix), own[suffix], "is larger than any GPU")


def _request(view: _Pod) -> PodGpuRequest:
    kai = _kai_share(view)
    shares: list[ShareRequest] = []
    whole: list[WholeGpuRequest] = []
    for container in view.containers:
        own = view.per_container.get(container, {})
        mode = _mode(container, own)
        if kai is not None and kai.container == container:
            request, limit, devices = kai.request, kai.limit, kai.num_devices
        elif (memory := _memory(container, own)) is not None:
            _refuse_whole_gpus_too(view, container, own)
            request, limit, devices = Mebibytes(memory[0]), Mebibytes(memory[1]), 1
        elif stray := [suffix for suffix in _SHARE_ONLY if suffix in own]:
            key = keys.container_key(container, stray[0])
            raise ContractError(key, own[stray[0]], f'container "{container}" has no GPU share')
        else:
            if container in view.whole:
                whole.append(WholeGpuRequest(container, view.whole[container]))
            continue
        cap = _compute_percent(container, own, mode)
        shares.append(ShareRequest(container, request, limit, mode, devices, cap))
        if len(shares) > MAX_SHARE_CONTAINERS:
            key = keys.container_key(container, keys.MEMORY_REQUEST)
            rule = f"a pod may hold shares in at most {MAX_SHARE_CONTAINERS} containers"
            raise ContractError(key, own.get(keys.MEMORY_REQUEST, ""), rule)
    return PodGpuRequest(tuple(shares), tuple(whole))


def _refuse_whole_gpus_too(view: _Pod, container: str, own: Mapping[str, str]) -> None:
    """A container asks for a share or for whole GPUs; both at once would count its GPUs twice."""
    if container in view.whole:
        suffix = keys.MEMORY_REQUEST if keys.MEMORY_REQUEST in own else keys.MEMORY_LIMIT
        raise ContractError(
            keys.container_key(container, suffix),
            own[suffix],
            f'container "{container}" also has {keys.GPU_RESOURCE}; ask for a share or whole GPUs',
        )


@dataclass(frozen=True)
class _KaiShare:
    container: str
    request: MemoryAmount
    limit: MemoryAmount
    num_devices: int


def _kai_share(view: _Pod) -> _KaiShare | None:
    """The share asked for with the KAI pod annotations, if any, with their rules checked."""
    annotations = view.annotations
    asks = [
        key
        for key in (keys.GPU_FRACTION, keys.GPU_FRACTION_LIMIT, keys.GPU_MEMORY, keys.GPU_MEMORY_LIMIT)
        if key in annotations
    ]
    if not asks:
        for key in (keys.NUM_DEVICES, keys.CONTAINER_NAME):
            if key in annotations:
                raise ContractError(
                    key,
                    annotations[key],
                    f"applies to a share, but the pod sets neither {keys.GPU_FRACTION} nor {keys.GPU_MEMORY}",
                )
        return None
    first = asks[0]
    fraction_form = keys.GPU_FRACTION in asks or keys.GPU_FRACTION_LIMIT in asks
    memory_keys = [key for key in asks if key in (keys.GPU_MEMORY, keys.GPU_MEMORY_LIMIT)]
    if fraction_form and memory_keys:
        raise ContractError(
            memory_keys[0],
            annotations[memory_keys[0]],
            f"cannot be combined with {keys.GPU_FRACTION}; ask for a portion or an amount, not both",
        )
    for limit_key, base_key in (
        (keys.GPU_FRACTION_LIMIT, keys.GPU_FRACTION),
        (keys.GPU_MEMORY_LIMIT, keys.GPU_MEMORY),
    ):
        if limit_key in annotations and base_key not in annotations:
            raise ContractError(limit_key, annotations[limit_key], f"needs {base_key}, the guaranteed amount")
    if view.whole:
        container, count = next(iter(view.whole.items()))
        raise ContractError(
            first,
            annotations[first],
            f'cannot be combined with the {keys.GPU_RESOURCE} resource (container "{container}" has'
            f" {keys.GPU_RESOURCE}: {count}); ask for whole GPUs or a share, not both",
        )
    container = _share_container(view, first)
    own = view.per_container.get(container, {})
    if keys.DEVICES not in own:
        for suffix in (keys.MEMORY_REQUEST, keys.MEMORY_LIMIT):
            if suffix in own:
                raise ContractError(
                    keys.container_key(container, suffix),
                    own[suffix],
                    f'container "{container}" has its share from {first} already; set memory one way',
                )
    request, limit = _fractions(annotations) if fraction_form else _kai_memory(annotations)
    return _KaiShare(container, request, limit, _num_devices(annotations))


def _share_container(view: _Pod, first: str) -> str:
    """The container the KAI share goes to: the named one, or the first."""
    named = view.annotations.get(keys.CONTAINER_NAME)
    if named is None:
        if not view.containers:
            raise ContractError(
                first, view.annotations[first], "the pod has no container to give the share to"
            )
        return view.containers[0]
    if named not in view.containers:
        raise ContractError(
            keys.CONTAINER_NAME, named, f"no such container; the pod has {_listing(view.containers)}"
        )
    return named


# A portion is a share of a GPU's memory in MiB: no GPU has a billion MiB, so finer steps mean nothing, and
# unbounded ones (0.5000000000000000001) would overflow the engine's int64 arithmetic.
MAX_PORTION_DENOMINATOR = 10**9


def _portion(key: str, text: str) -> Fraction:
    value = _checked(key, text, quantity.parse_decimal)
    if value.denominator > MAX_PORTION_DENOMINATOR:
        raise ContractError(key, text, "has more than 9 decimal places; round it")
    return value


def _fractions(annotations: Mapping[str, str]) -> tuple[Portion, Portion]:
    request_text = annotations[keys.GPU_FRACTION]
    request = _portion(keys.GPU_FRACTION, request_text)
    if request <= 0:
        raise ContractError(keys.GPU_FRACTION, request_text, "must be greater than 0")
    if request >= 1:
        raise ContractError(
            keys.GPU_FRACTION,
            request_text,
            f"must be less than 1; ask for whole GPUs with the {keys.GPU_RESOURCE} resource",
        )
    limit_text = annotations.get(keys.GPU_FRACTION_LIMIT)
    if limit_text is None:
        return Portion(request), Portion(request)
    limit = _portion(keys.GPU_FRACTION_LIMIT, limit_text)
    if limit > 1:
        raise ContractError(keys.GPU_FRACTION_LIMIT, limit_text, "must be at most 1, a whole GPU")
    if request > limit:
        raise ContractError(keys.GPU_FRACTION, request_text, f'request exceeds limit "{brief(limit_text)}"')
    return Portion(request), Portion(limit)


def _kai_memory(annotations: Mapping[str, str]) -> tuple[Mebibytes, Mebibytes]:
    request_text = annotations[keys.GPU_MEMORY]
    request = _checked(keys.GPU_MEMORY, request_text, quantity.kai_memory_mib)
    limit_text = annotations.get(keys.GPU_MEMORY_LIMIT)
    if limit_text is None:
        return Mebibytes(request), Mebibytes(request)
    limit = _checked(keys.GPU_MEMORY_LIMIT, limit_text, quantity.kai_memory_mib)
    if request > limit:
        raise ContractError(keys.GPU_MEMORY, request_text, f'request exceeds limit "{brief(limit_text)}"')
    return Mebibytes(request), Mebibytes(limit)


def _num_devices(annotations: Mapping[str, str]) -> int:
    text = annotations.get(keys.NUM_DEVICES)
    if text is None:
        return 1
    return _checked(keys.NUM_DEVICES, text, quantity.positive_count)


def _memory(container: str, own: Mapping[str, str]) -> tuple[int, int] | None:
    """Request and limit MiB from a container's NVIDIA keys; one alone sets both; None when neither is set."""
    request_key = keys.container_key(container, keys.MEMORY_REQUEST)
    limit_key = keys.container_key(container, keys.MEMORY_LIMIT)
    request_text = own.get(keys.MEMORY_REQUEST)
    limit_text = own.get(keys.MEMORY_LIMIT)
    request = None if request_text is None else _checked(request_key, request_text, quantity.quantity_mib)
    limit = None if limit_text is None else _checked(limit_key, limit_text, quantity.quantity_mib)
    if request is None:
        return None if limit is None else (limit, limit)
    if limit is None:
        return request, request
    if request > limit:
        raise ContractError(
            request_key, own[keys.MEMORY_REQUEST], f'request exceeds limit "{brief(own[keys.MEMORY_LIMIT])}"'
        )
    return request, limit


# Keys that describe a share, and mean nothing on a container without one.
_SHARE_ONLY = (keys.COMPUTE_MODE, keys.COMPUTE_PERCENTAGE)
_PERCENT = re.compile(r"[0-9]{1,3}")


def _compute_percent(container: str, own: Mapping[str, str], mode: ComputeMode) -> int | None:
    """The container's compute cap, 1 to 100 percent of the GPU's SMs; None when it sets none.

    Only MPS caps a client's SMs, so the cap is refused on a time-slicing share rather than accepted and
    silently ignored: the tenant would believe in a cap nothing holds.
    """
    text = own.get(keys.COMPUTE_PERCENTAGE)
    if text is None:
        return None
    key = keys.container_key(container, keys.COMPUTE_PERCENTAGE)
    if not _PERCENT.fullmatch(text) or not 1 <= int(text) <= FULL_COMPUTE:
        raise ContractError(key, text, "must be a whole number from 1 to 100, a percentage of the GPU's SMs")
    if mode is not ComputeMode.SM_SHARING:
        mode_key = keys.container_key(container, keys.COMPUTE_MODE)
        raise ContractError(
            key,
            text,
            "caps SMs through MPS, which a time-slicing share does not use: time-slicing gives each process "
            "the whole GPU in turn, so there is no per-client SM cap to set; set "
            f'{mode_key}: "{ComputeMode.SM_SHARING.value}", or remove the cap',
        )
    return int(text)


def _mode(container: str, own: Mapping[str, str]) -> ComputeMode:
    text = own.get(keys.COMPUTE_MODE)
    if text is None:
        return ComputeMode.TIME_SLICING
    try:
        return ComputeMode(text)
    except ValueError:
        pass  # the message is built only for a broken key: every bound pod of a relist comes through here
    choices = " or ".join(f'"{mode.value}"' for mode in ComputeMode)
    key = keys.container_key(container, keys.COMPUTE_MODE)
    if not text.strip():
        raise ContractError(key, text, f"is blank; set {choices}, or remove the key for time-slicing")
    raise ContractError(key, text, f"must be exactly {choices}")


def _devices(key: str, text: str) -> tuple[str, ...]:
    devices = tuple(item.strip() for item in text.split(","))
    if not all(devices):
        raise ContractError(
            key, text, "must be a comma-separated list of GPU UUIDs or indices, with no empty entry"
        )
    if len(set(devices)) != len(devices):
        raise ContractError(key, text, "names the same GPU twice")
    return devices


def _bound_devices(container: str, devices: tuple[str, ...] | None, *, count: int) -> tuple[str, ...]:
    key = keys.container_key(container, keys.DEVICES)
    if devices is None:
        raise ContractError(key, "", "is missing, but other containers of this pod are bound")
    if len(devices) != count:
        raise ContractError(
            key, ",".join(devices), f"names {len(devices)} GPUs, but the container asks for {count}"
        )
    return devices


def _checked(key: str, text: str, parse: Callable[[str], _T]) -> _T:
    """`parse(text)`, with its ValueError turned into a ContractError naming the key."""
    try:
        return parse(text)
    except ValueError as error:
        raise ContractError(key, text, str(error)) from None


# The most container names a message lists.
_LISTED = 8


def _listing(containers: Sequence[str]) -> str:
    if not containers:
        return "no containers"
    listed = ", ".join(f'"{brief(name)}"' for name in containers[:_LISTED])
    more = len(containers) - _LISTED
    return f"containers {listed}" + (f" and {more} more" if more > 0 else "")


# Reading the pod's shape. The API always returns well-formed objects; a YAML file may not.


def _read(pod: Mapping[str, object]) -> _Pod:
    metadata = _mapping(pod.get("metadata"), "metadata")
    spec = _mapping(pod.get("spec"), "spec")
    raw_annotations = _mapping(metadata.get("annotations"), "metadata.annotations")
    annotations = _annotations(raw_annotations)
    consent = raw_annotations.get(keys.MOVABLE_ANNOTATION)
    if consent is not None and consent not in ("true", "false"):
        raise ContractError(
            keys.MOVABLE_ANNOTATION, _text(consent), 'expected "true" (the pod may be moved) or "false"'
        )
    containers: list[str] = []
    whole: dict[str, int] = {}
    for container in _sequence(spec.get("containers"), "spec.containers"):
        fields = _mapping(container, "spec.containers[]")
        name = fields.get("name")
        if not isinstance(name, str):
            raise ContractError("spec.containers[].name", _text(name), "every container needs a name")
        containers.append(name)
        count = _whole_gpus(name, _mapping(fields.get("resources"), f"spec.containers[{name}].resources"))
        if count:
            whole[name] = count
    named = set(containers)  # looked up once per annotation: a list would make this quadratic
    per_container: dict[str, dict[str, str]] = {}
    for key, value in annotations.items():
        split = keys.split_container_key(key)
        if split is None:
            continue
        container, suffix = split
        prefix = keys.container_prefix(key)
        assert prefix is not None  # `split` found it
        if suffix not in keys.CONTAINER_FAMILIES[prefix]:
            valid = ", ".join(keys.CONTAINER_FAMILIES[prefix])
            raise ContractError(key, value, f"unknown key; the keys under {prefix}<container>. are {valid}")
        if container not in named:
            raise ContractError(
                key, value, f'no container "{brief(container)}"; the pod has {_listing(containers)}'
            )
        per_container.setdefault(container, {})[suffix] = value
    return _Pod(annotations, tuple(containers), whole, per_container)


def _annotations(raw: Mapping[object, object]) -> dict[str, str]:
    """The contract keys among the annotations; their values must be strings, as the API requires."""
    found: dict[str, str] = {}
    for key, value in raw.items():
        if not isinstance(key, str) or not keys.is_contract_key(key):
            continue
        if not isinstance(value, str):
            raise ContractError(
                key,
                _text(value),
                f"annotation values must be strings, not {type(value).__name__}; quote the value",
            )
        found[key] = value
    return found


def _whole_gpus(container: str, resources: Mapping[object, object]) -> int:
    """The `nvidia.com/gpu` count, from limits or else requests; the two must agree where both are set."""
    texts = [
        _resource_text(
            container, _mapping(resources.get(part), f"spec.containers[{container}].resources.{part}")
        )
        for part in ("limits", "requests")
    ]
    present = [text for text in texts if text is not None]
    if not present:
        return 0
    counts = [_checked(keys.GPU_RESOURCE, text, quantity.parse_quantity) for text in present]
    if counts[0] != counts[-1]:
        raise ContractError(
            keys.GPU_RESOURCE,
            present[0],
            f'container "{container}" has limits "{brief(present[0])}", requests "{brief(present[-1])}"; '
            "make them equal",
        )
    if counts[0].denominator != 1 or counts[0] < 0:
        raise ContractError(
            keys.GPU_RESOURCE, present[0], f'container "{container}" must ask for a whole number of GPUs'
        )
    return int(counts[0])


def _resource_text(container: str, amounts: Mapping[object, object]) -> str | None:
    value = amounts.get(keys.GPU_RESOURCE)
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    raise ContractError(keys.GPU_RESOURCE, _text(value), f'container "{container}" must give a quantity')


def _mapping(value: object, where: str) -> Mapping[object, object]:
    if type(value) is dict:  # a JSON object: the exact-type test is far cheaper than the ABC's
        return value
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ContractError(where, _text(value), "must be a map")
    return value


def _sequence(value: object, where: str) -> Sequence[object]:
    if type(value) is list:  # a JSON array, as `_mapping`
        return value
    if value is None:
        return ()
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise ContractError(where, _text(value), "must be a list")
    return value


def _text(value: object) -> str:
    """A short rendering of a malformed value for an error message (shorter than a key's value: it is
    often a whole map or list)."""
    return brief(str(value), 60)
