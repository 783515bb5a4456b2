"""The validating webhook's rules for pods: the contract, then for anyone but the scheduler's identity the
guards of the threat model.

The guards: scheduler-owned keys, contract keys changed after create, GPU variables set directly,
privileged share containers, references to another pod's env ConfigMap, pods that skipped the mutation,
host paths into the MPS pipe directory. Each denial carries a short `rule` name for the metrics.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping
from typing import Any

from gpufrac import contract
from gpufrac.admission import exchange, mutation, settings, shapes
from gpufrac.contract import keys

# Variables that grant or bound GPUs: a container setting them itself could claim any GPU on its node.
RESERVED_ENV = frozenset(keys.ENV_KEYS | {"CUDA_VISIBLE_DEVICES"})
RESERVED_ENV_PREFIXES = ("NVIDIA_GPU_MEMORY_", "CUDA_MPS_")


def validate(request: exchange.Request, policy: settings.Policy) -> exchange.Decision:
    """Allowed, or denied with the first rule broken; see the module doc for the rules."""
    if request.object is None:
        return exchange.ALLOW
    trusted = policy.is_scheduler(request.user)
    if request.sub_resource == "ephemeralcontainers":
        if trusted:
            return exchange.ALLOW
        return _reserved_env(request.object) or _ephemeral_env_configmap(request.object) or exchange.ALLOW
    if request.sub_resource:
        return exchange.ALLOW
    if request.operation == "CREATE":
        return _validate_new_pod(request.object, request.user, policy, trusted=trusted)
    if request.operation == "UPDATE":
        return _validate_pod_update(request, policy, trusted=trusted)
    return exchange.ALLOW


def _contract(pod: Mapping[str, Any], *, placement: bool) -> contract.PodGpuRequest | exchange.Decision:
    """What the pod asks for; with `placement`, a pod that carries devices must also read back as placed,
    so that even the scheduler cannot write a bind it could not rebuild its state from."""
    try:
        asked = contract.parse_pod(pod)
        if placement and _scheduler_owned_annotations(pod):
            contract.parse_placement(pod)
    except contract.ContractError as error:
        return exchange.deny("contract", str(error))
    return asked


def _validate_new_pod(
    pod: Mapping[str, Any], user: str, policy: settings.Policy, *, trusted: bool
) -> exchange.Decision:
    asked = _contract(pod, placement=trusted)
    if isinstance(asked, exchange.Decision):
        return asked
    if trusted:
        return exchange.ALLOW
    return (
        _scheduler_owned(pod, user, policy)
        or _reserved_env(pod)
        or _privileged_share(pod, {share.container for share in asked.shares})
        or _env_configmap(pod, asked, policy)
        or _mps_host_path(pod, asked, policy)
        or exchange.ALLOW
    )


def _validate_pod_update(
    request: exchange.Request, policy: settings.Policy, *, trusted: bool
) -> exchange.Decision:
    new = _guarded_annotations(request.object)
    old = _guarded_annotations(request.old_object)
    changed = sorted(key for key in new.keys() | old.keys() if new.get(key) != old.get(key))
    if not changed:
        return exchange.ALLOW
    if not trusted:
        key = changed[0]
        before = "absent" if key not in old else json.dumps(_text(old[key]))
        after = "removed" if key not in new else json.dumps(_text(new[key]))
        return exchange.deny(
            "contract-change",
            f"{key}: {before} -> {after}: GPU contract annotations cannot change once the pod exists; only "
            f"the gpufrac scheduler ({policy.scheduler_identity}) may write them, not "
            f"{exchange.who(request.user)}; delete the pod and create it with the keys it needs",
        )
    assert request.object is not None
    checked = _contract(request.object, placement=True)
    return checked if isinstance(checked, exchange.Decision) else exchange.ALLOW


def _scheduler_owned(pod: Mapping[str, Any], user: str, policy: settings.Policy) -> exchange.Decision | None:
    owned = _scheduler_owned_annotations(pod)
    if not owned:
        return None
    key, value = next(iter(owned.items()))
    return exchange.deny(
        "scheduler-owned",
        f"{key}={json.dumps(shapes.as_str(value))}: is written by the gpufrac scheduler at bind "
        f"({policy.scheduler_identity}) and names the GPUs a container may use; "
        f"{exchange.who(user)} may not set it; remove it",
    )


def _reserved_env(pod: Mapping[str, Any]) -> exchange.Decision | None:
    for container in shapes.containers(pod):
        for variable in shapes.as_list(container.get("env")):
            name = shapes.as_mapping(variable).get("name")
            if isinstance(name, str) and (name in RESERVED_ENV or name.startswith(RESERVED_ENV_PREFIXES)):
                return exchange.deny(
                    "env",
                    f'container "{shapes.as_str(container.get("name"))}" sets {name} in its env: the GPUs a '
                    "container sees and its memory limits come only from gpufrac; remove the variable and "
                    f"ask for a share with {keys.GPU_FRACTION} or {keys.GPU_MEMORY}, or whole GPUs with "
                    f"{keys.GPU_RESOURCE}",
                )
    return None


def _privileged_share(pod: Mapping[str, Any], share_containers: set[str]) -> exchange.Decision | None:
    for container in shapes.containers(pod):
        name = shapes.as_str(container.get("name"))
        privileged = shapes.as_mapping(container.get("securityContext")).get("privileged") is True
        if name in share_containers and privileged:
            return exchange.deny(
                "privileged",
                f'container "{name}" asks for a GPU share and is privileged: a privileged container sees '
                "every GPU on its node, so no share boundary holds for it; drop securityContext.privileged",
            )
    return None


def _env_configmap(
    pod: Mapping[str, Any], asked: contract.PodGpuRequest, policy: settings.Policy
) -> exchange.Decision | None:
    """References to env ConfigMaps go only from this pod's GPU containers, each to its own ConfigMap.

    The webhook names them itself at mutation (from a fresh random base, whatever the pod came with), so
    a pod whose annotation names another pod's base did not pass the mutation. Such a pod is denied here
    unless the gpufrac scheduler is to bind it, and that scheduler refuses to bind a pod to a ConfigMap
    another pod owns.
    """
    own = shapes.annotations_of(pod).get(keys.ENV_CONFIGMAP_ANNOTATION)
    spec = shapes.as_mapping(pod.get("spec"))
    for_gpufrac = spec.get("schedulerName") == policy.scheduler_name
    if own is not None:
        problem = None
        if not isinstance(own, str) or not own.startswith(keys.ENV_CONFIGMAP_PREFIX):
            problem = f'does not name a gpufrac env ConfigMap ("{keys.ENV_CONFIGMAP_PREFIX}...")'
        elif not asked.shares:
            problem = "is set on a pod that asks for no GPU share"
        elif not for_gpufrac:
            problem = f'is set on a pod not scheduled by "{policy.scheduler_name}"'
        elif spec.get("nodeName"):
            problem = "is set on a pod that names its node itself (spec.nodeName)"
        if problem:
            return exchange.deny(
                "env-configmap",
                f"{keys.ENV_CONFIGMAP_ANNOTATION}={json.dumps(_text(own))}: {problem}; only "
                "gpufrac's mutating webhook sets this annotation; remove it",
            )
    base = own if isinstance(own, str) else None
    gpu = set(mutation.gpu_containers(asked))
    for kind, container in shapes.containers_by_list(pod):
        name = shapes.as_str(container.get("name"))
        mine = keys.env_configmap_name(base, name) if base and kind == "containers" and name in gpu else None
        if denial := _foreign_env_configmap(container, mine, base):
            return denial
    if policy.env_delivery == contract.EnvDelivery.CONFIGMAP and asked.shares and for_gpufrac:
        for container in shapes.containers(pod):
            name = shapes.as_str(container.get("name"))
            if name in gpu and (
                not base or keys.env_configmap_name(base, name) not in shapes.configmap_refs(container)
            ):
                return exchange.deny(
                    "delivery",
                    f'container "{name}" asks for a GPU but has no envFrom to its gpufrac env ConfigMap: the '
                    "pod did not pass gpufrac's mutating webhook, so it would run without its limits; create "
                    "it in a namespace the webhook serves, and leave schedulerName, envFrom and the "
                    f"{keys.ENV_CONFIGMAP_ANNOTATION} annotation to gpufrac",
                )
    return None


def _ephemeral_env_configmap(obj: Mapping[str, Any]) -> exchange.Decision | None:
    """An ephemeral container (`kubectl debug`) may take env from no gpufrac env ConfigMap at all."""
    base = shapes.annotations_of(obj).get(keys.ENV_CONFIGMAP_ANNOTATION)
    for kind, container in shapes.containers_by_list(obj):
        if kind == "ephemeralContainers" and (denial := _foreign_env_configmap(container, None, base)):
            return denial
    return None


def _foreign_env_configmap(
    container: Mapping[str, Any], mine: str | None, base: object
) -> exchange.Decision | None:
    """A reference from `container` to a gpufrac env ConfigMap other than its own, `mine`."""
    for ref in shapes.configmap_refs(container):
        if ref.startswith(keys.ENV_CONFIGMAP_PREFIX) and ref != mine:
            ours = isinstance(base, str) and ref.startswith(base + "-")
            whose = "another container's" if ours else "another pod's"
            return exchange.deny(
                "env-configmap-ref",
                f'container "{shapes.as_str(container.get("name"))}" takes its env from ConfigMap "{ref}", '
                f"{whose} gpufrac env ConfigMap, which holds the GPU devices and limits of the share it was "
                "made for; remove the reference (gpufrac adds the right one to each share container itself)",
            )
    return None


def _mps_host_path(
    pod: Mapping[str, Any], asked: contract.PodGpuRequest, policy: settings.Policy
) -> exchange.Decision | None:
    """A host path into the MPS pipe directory reaches the MPS daemons with no limit set: only the
    volume the mutation adds to a pod with an sm-sharing share may mount it."""
    root = posixpath.normpath(policy.mps_host_directory)
    sm_sharing = bool(mutation.sm_sharing_containers(asked))
    for volume in shapes.as_list(shapes.as_mapping(pod.get("spec")).get("volumes")):
        volume = shapes.as_mapping(volume)
        path = shapes.as_mapping(volume.get("hostPath")).get("path")
        if not isinstance(path, str) or not path:
            continue
        path = posixpath.normpath(path)
        if path.startswith("/var/run/"):  # a link to /run on every distribution Kubernetes runs on
            path = path.removeprefix("/var")
        if path != root and not path.startswith(root.rstrip("/") + "/"):
            continue
        if volume.get("name") == mutation.MPS_VOLUME and sm_sharing and path == root:
            continue
        return exchange.deny(
            "mps-host-path",
            f'volume "{shapes.as_str(volume.get("name"))}" mounts {path} from the host, where gpufrac\'s '
            "MPS daemons listen: only an sm-sharing share gets it, from gpufrac; remove the volume",
        )
    return None


def _guarded_annotations(pod: Mapping[str, Any] | None) -> dict[str, object]:
    """The annotations nobody but the scheduler may change after create: the contract keys and the name
    of the env ConfigMap."""
    return {
        key: value
        for key, value in shapes.annotations_of(pod).items()
        if isinstance(key, str) and (contract.is_contract_key(key) or key == keys.ENV_CONFIGMAP_ANNOTATION)
    }


def _scheduler_owned_annotations(pod: Mapping[str, Any]) -> dict[str, object]:
    """The annotations only the scheduler may write (the devices, set at bind), in the pod's order."""
    return {
        key: value
        for key, value in shapes.annotations_of(pod).items()
        if isinstance(key, str) and contract.is_scheduler_owned(key)
    }


def _text(value: object) -> str:
    """A short rendering of a value of any type for a message."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= 80 else text[:77] + "..."
