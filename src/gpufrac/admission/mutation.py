"""The mutating webhook: the JSONPatch that hands a share pod to gpufrac and prepares its env delivery.

Which pods: a pod CREATE that asks for a GPU share and is not placed by another scheduler, and one that
asks for whole GPUs (`nvidia.com/gpu`) only and names gpufrac's scheduler itself: it is prepared the same
way, so that gpufrac never binds a GPU pod that has no delivery. (One that names no scheduler is the
device plugin's, and left alone.)
- `schedulerName` becomes gpufrac's, unless the pod names a scheduler other than `default-scheduler` (say
  KAI, the other writer of the contract) or already has a `nodeName`; such pods are left as they are.
- "Per-container form": the KAI keys (`gpu-fraction`, `gpu-memory`, their limits, `num-devices`) stay the
  source of truth. They cannot all be translated (a portion has no per-container key, nor has a share on
  N GPUs), and the contract treats `<c>.gpu-memory.*` next to a KAI key as the scheduler's resolved value,
  so writing them at admission would make the pod look bound. What the mutation adds instead is what the
  contract leaves implicit: `nvidia.com/container.<c>.gpu-compute.mode` on each share container that has
  none (`time-slicing`, the default) and `gpu-fraction-container-name` for a KAI share. The mutated pod
  parses to exactly the same request; the tests check that.
- ConfigMap delivery (`EnvDelivery.CONFIGMAP`): a fresh `gpufrac-env-<random>` base name, always, in the
  `gpufrac.io/env-configmap` annotation (overwriting any the pod came with), and on each GPU container an
  `envFrom` to its own ConfigMap, `keys.env_configmap_name(base, container)`, appended last so that it
  wins over any earlier source of the same variables; sm-sharing containers also get the MPS pipe
  directory from the host.
- Each share container requests `gpufrac.io/gpu-memory` (`contract.memory_resource`), requests = limits,
  replacing whatever the pod said: what a `ResourceQuota` counts must be what the share is guaranteed.
- Every other container (`containers` and `initContainers`) gets `NVIDIA_VISIBLE_DEVICES=void` as its
  last `env` entry, with either delivery: `env` overrides the image's environment (CUDA images set
  `NVIDIA_VISIBLE_DEVICES=all`) and every `envFrom` source, so a container the contract gives no GPU
  sees none, whatever a tenant's ConfigMap holds (`gpu_env`).

The base name is random, and a pure function cannot draw it, so the server passes it in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpufrac import contract
from gpufrac.admission import exchange, gpu_env, settings, shapes
from gpufrac.contract import keys, memory_resource
from gpufrac.kubeapi import fields

MPS_VOLUME = "gpufrac-mps"


def mutate(
    request: exchange.Request, policy: settings.Policy, *, configmap_name: str, trusted_namespace: bool
) -> exchange.Decision:
    """The JSONPatch that routes a share pod to gpufrac and prepares its delivery; see the module doc.

    Anything this does not prepare (not a pod CREATE, no share, a broken contract, another scheduler) is
    allowed unchanged: the validating webhook, which runs after every mutation, is where denials are made.
    Outside the trusted tier (`trusted_namespace` False), where the admin chose it
    (`UntrustedSmSharing.TIME_SLICING`), sm-sharing shares become time-slicing ones, and the pod says so.
    """
    if (
        request.operation != "CREATE"
        or request.resource != "pods"
        or request.sub_resource
        or request.namespace in policy.exempt_namespaces
        or request.object is None
    ):
        return exchange.ALLOW
    pod = request.object
    try:
        shapes.check_pod(pod)
        asked = contract.parse_pod(pod)
    except (shapes.Malformed, contract.ContractError):
        return exchange.ALLOW
    spec = fields.as_mapping(pod.get("spec"))
    scheduler = spec.get("schedulerName")
    whole_for_gpufrac = bool(asked.whole) and scheduler == policy.scheduler_name
    if (
        not (asked.shares or whole_for_gpufrac)
        or spec.get("nodeName")
        or scheduler not in (None, "", "default-scheduler", policy.scheduler_name)
    ):
        return exchange.ALLOW
    patch: list[dict[str, Any]] = [
        {"op": "add", "path": "/spec/schedulerName", "value": policy.scheduler_name}
    ]
    if not trusted_namespace and policy.untrusted_sm_sharing is settings.UntrustedSmSharing.TIME_SLICING:
        try:
            pod, asked, rewrite = _without_sm_sharing(pod, asked, request.namespace)
        except contract.ContractError:  # a compute cap, which time-slicing cannot hold: validation says so
            return exchange.ALLOW
        patch += rewrite
    configmap_base = configmap_name if policy.env_delivery == contract.EnvDelivery.CONFIGMAP else None
    patch += _annotation_patch(pod, asked, configmap_base)
    if configmap_base is not None:
        patch += _delivery_patch(pod, asked, configmap_base, policy)
    patch += _resource_patch(pod, asked, policy.fraction_reference_mib)
    patch += _no_gpu_patch(pod, asked)
    return exchange.Decision(allowed=True, patch=tuple(patch))


def _without_sm_sharing(
    pod: Mapping[str, Any], asked: contract.PodGpuRequest, namespace: str
) -> tuple[Mapping[str, Any], contract.PodGpuRequest, list[dict[str, Any]]]:
    """The pod with each sm-sharing share made time-slicing (its compute-mode key set, which the contract
    reads first), what it then asks for, and the patch that does it; the pod as it was when none asks.
    Raises `ContractError` where the rewritten pod breaks the contract: a share with a compute cap, which
    only sm-sharing can hold, is not silently made uncapped."""
    rewritten = sm_sharing_containers(asked)
    if not rewritten:
        return pod, asked, []
    annotations = dict(shapes.annotations_of(pod))
    for container in rewritten:
        annotations[contract.container_key(container, keys.COMPUTE_MODE)] = (
            contract.ComputeMode.TIME_SLICING.value
        )
    annotations[settings.REWRITTEN_ANNOTATION] = (
        f"sm-sharing -> time-slicing for {', '.join(rewritten)}: namespace {namespace} is not trusted for "
        f"sm-sharing ({settings.TRUST_LABEL}={settings.TRUSTED})"
    )
    changed = {**pod, "metadata": {**shapes.metadata_of(pod), "annotations": annotations}}
    patch = [{"op": "add", "path": "/metadata/annotations", "value": annotations}]
    return changed, contract.parse_pod(changed), patch


def gpu_containers(asked: contract.PodGpuRequest) -> list[str]:
    """The containers the scheduler gives GPUs and an env ConfigMap: every share and whole-GPU one."""
    return [share.container for share in asked.shares] + [whole.container for whole in asked.whole]


def sm_sharing_containers(asked: contract.PodGpuRequest) -> list[str]:
    """The containers that get the MPS pipe directory, through the `MPS_VOLUME` the mutation adds."""
    return [share.container for share in asked.shares if share.mode is contract.ComputeMode.SM_SHARING]


def _annotation_patch(
    pod: Mapping[str, Any], asked: contract.PodGpuRequest, configmap_name: str | None
) -> list[dict[str, Any]]:
    current = shapes.annotations_of(pod)
    added: dict[str, str] = {}
    for share in asked.shares:
        mode_key = contract.container_key(share.container, keys.COMPUTE_MODE)
        if mode_key not in current:
            added[mode_key] = share.mode.value
    kai_container = contract.kai_share_container(pod)
    if kai_container is not None and keys.CONTAINER_NAME not in current:
        added[keys.CONTAINER_NAME] = kai_container  # which container the share went to, said explicitly
    if configmap_name is not None:
        added[keys.ENV_CONFIGMAP_ANNOTATION] = configmap_name
    if not isinstance(shapes.metadata_of(pod).get("annotations"), Mapping):  # a whole-GPU pod may have none
        return [{"op": "add", "path": "/metadata/annotations", "value": added}] if added else []
    return [
        {"op": "add", "path": f"/metadata/annotations/{_pointer(key)}", "value": value}
        for key, value in added.items()
    ]


def _delivery_patch(
    pod: Mapping[str, Any], asked: contract.PodGpuRequest, base: str, policy: settings.Policy
) -> list[dict[str, Any]]:
    """An `envFrom` on each GPU container to its own env ConfigMap (one per container, since `envFrom`
    imports a whole ConfigMap), and the MPS pipe directory for sm-sharing containers."""
    spec = fields.as_mapping(pod.get("spec"))
    containers, index = _containers(pod)
    patch: list[dict[str, Any]] = []
    for name in gpu_containers(asked):
        i = index[name]
        container = fields.as_mapping(containers[i])
        source = {"configMapRef": {"name": keys.env_configmap_name(base, name), "optional": False}}
        patch.append(_append(f"/spec/containers/{i}/envFrom", container.get("envFrom"), source))
    sm_sharing = sm_sharing_containers(asked)
    for name in sm_sharing:
        i = index[name]
        mount = {"name": MPS_VOLUME, "mountPath": contract.DEFAULT_MPS_PIPE_DIRECTORY}
        patch.append(
            _append(
                f"/spec/containers/{i}/volumeMounts",
                fields.as_mapping(containers[i]).get("volumeMounts"),
                mount,
            )
        )
    if sm_sharing:
        volume = {
            "name": MPS_VOLUME,
            "hostPath": {"path": policy.mps_host_directory, "type": "DirectoryOrCreate"},
        }
        volumes = spec.get("volumes")
        existing = [
            i for i, v in enumerate(fields.as_list(volumes)) if fields.as_mapping(v).get("name") == MPS_VOLUME
        ]
        if existing:
            patch.append({"op": "replace", "path": f"/spec/volumes/{existing[0]}", "value": volume})
        else:
            patch.append(_append("/spec/volumes", volumes, volume))
    return patch


def counted(asked: contract.PodGpuRequest, reference_mib: int) -> dict[str, str]:
    """Per share container, the quantity of `GPU_MEMORY_RESOURCE` it requests."""
    return {
        share.container: contract.format_mib(memory_resource.counted_mib(share, reference_mib))
        for share in asked.shares
    }


def _resource_patch(
    pod: Mapping[str, Any], asked: contract.PodGpuRequest, reference_mib: int
) -> list[dict[str, Any]]:
    """`GPU_MEMORY_RESOURCE` in the requests and limits of each share container."""
    containers, index = _containers(pod)
    resource = memory_resource.GPU_MEMORY_RESOURCE
    patch: list[dict[str, Any]] = []
    for name, quantity in counted(asked, reference_mib).items():
        path = f"/spec/containers/{index[name]}/resources"
        resources = fields.as_mapping(containers[index[name]]).get("resources")
        if not isinstance(resources, Mapping):
            patch.append({"op": "add", "path": path, "value": {}})
            resources = {}
        for field in ("requests", "limits"):
            if isinstance(resources.get(field), Mapping):
                patch.append({"op": "add", "path": f"{path}/{field}/{_pointer(resource)}", "value": quantity})
            else:
                patch.append({"op": "add", "path": f"{path}/{field}", "value": {resource: quantity}})
    return patch


def _no_gpu_patch(pod: Mapping[str, Any], asked: contract.PodGpuRequest) -> list[dict[str, Any]]:
    """`NVIDIA_VISIBLE_DEVICES=void` last in the `env` of every container the contract gives no GPU."""
    spec = fields.as_mapping(pod.get("spec"))
    gpu = set(gpu_containers(asked))
    variable = {"name": keys.ENV_VISIBLE_DEVICES, "value": gpu_env.NO_GPU}
    patch = []
    for kind in ("containers", "initContainers"):
        for i, entry in enumerate(fields.as_list(spec.get(kind))):
            entry = fields.as_mapping(entry)
            if kind == "containers" and entry.get("name") in gpu:
                continue
            patch.append(_append(f"/spec/{kind}/{i}/env", entry.get("env"), variable))
    return patch


def _containers(pod: Mapping[str, Any]) -> tuple[Sequence[object], dict[str, int]]:
    """The pod's regular containers, and each one's position by name: what a JSON Pointer names."""
    containers = fields.as_list(fields.as_mapping(pod.get("spec")).get("containers"))
    return containers, {
        fields.as_str(fields.as_mapping(entry).get("name")): i for i, entry in enumerate(containers)
    }


def _append(path: str, current: object, item: dict[str, Any]) -> dict[str, Any]:
    """Append `item` to the list at `path`, creating the list where the pod has none."""
    if isinstance(current, list):
        return {"op": "add", "path": f"{path}/-", "value": item}
    return {"op": "add", "path": path, "value": [item]}


def _pointer(key: str) -> str:
    """`key` as one JSON Pointer token (RFC 6901): annotation keys hold slashes."""
    return key.replace("~", "~0").replace("/", "~1")
