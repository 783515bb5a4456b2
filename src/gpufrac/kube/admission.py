"""Admission decisions for pods and gpufrac's env ConfigMaps: an AdmissionReview in, its response out.

Pure: the HTTP server (`webhook_server`) decides nothing; it passes the body's bytes to `read_review`, the
request to `decide`, and sends back `review_response`, so every rule is unit-tested here without a server
or a cluster. The one input that is not in the review, the random name of a pod's env ConfigMap, is
passed in, since a pure function cannot draw it.

Mutation (pod CREATE, for pods that ask for a GPU share and are not placed by another scheduler):
- `schedulerName` becomes gpufrac's, unless the pod names a scheduler other than `default-scheduler` (say
  KAI, the other writer of the contract) or already has a `nodeName`; such pods are left as they are.
- "Per-container form": the KAI keys (`gpu-fraction`, `gpu-memory`, their limits, `num-devices`) stay the
  source of truth. They cannot all be translated (a portion has no per-container key, nor has a share on
  N GPUs), and the contract treats `<c>.gpu-memory.*` next to a KAI key as the scheduler's resolved value,
  so writing them at admission would make the pod look bound. What the mutation adds instead is what the
  contract leaves implicit: `nvidia.com/container.<c>.gpu-compute.mode` on each share container that has
  none (`time-slicing`, the default) and `gpu-fraction-container-name` for a KAI share. The mutated pod
  parses to exactly the same request; the tests check that.
- Delivery 2 (DESIGN.md): a fresh `gpufrac-env-<random>` base name, always, in the
  `gpufrac.io/env-configmap` annotation (overwriting any the pod came with), and on each GPU container an
  `envFrom` to its own ConfigMap, `keys.env_configmap_name(base, container)`, appended last so that it
  wins over any earlier source of the same variables; sm-sharing containers also get the MPS pipe
  directory from the host.

Validation: the contract, then for anyone but the scheduler's identity the guards of the threat model
(scheduler-owned keys, contract keys changed after create, GPU variables set directly, privileged share
containers, references to another pod's env ConfigMap, pods that skipped the mutation) and the guard on
the env ConfigMaps themselves. Each denial carries a short `rule` name for the metrics.
"""

from __future__ import annotations

import base64
import json
import posixpath
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpufrac import contract
from gpufrac.contract import keys

API_VERSION = "admission.k8s.io/v1"
DEFAULT_SCHEDULER_IDENTITY = "system:serviceaccount:gpufrac-system:gpufrac-scheduler"
DEFAULT_SCHEDULER_NAME = "gpufrac"
DEFAULT_EXEMPT_NAMESPACES = ("kube-system", "kube-public", "kube-node-lease", "gpufrac-system")
# Who deletes an env ConfigMap once its pod is gone: the garbage collector (it is owned by the pod) and
# the namespace controller, under their own service accounts or, without per-controller credentials, the
# controller manager's. A deletion grants nothing: a container whose ConfigMap is gone cannot start.
DEFAULT_CONFIGMAP_DELETERS = (
    "system:serviceaccount:kube-system:generic-garbage-collector",
    "system:serviceaccount:kube-system:namespace-controller",
    "system:kube-controller-manager",
)
MPS_VOLUME = "gpufrac-mps"

# Variables that grant or bound GPUs: a container setting them itself could claim any GPU on its node.
RESERVED_ENV = frozenset(keys.ENV_KEYS | {"CUDA_VISIBLE_DEVICES"})
RESERVED_ENV_PREFIXES = ("NVIDIA_GPU_MEMORY_", "CUDA_MPS_")

_CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")


@dataclass(frozen=True)
class Policy:
    """How this webhook is configured (the `gpufrac webhook` flags)."""

    scheduler_identity: str = DEFAULT_SCHEDULER_IDENTITY
    scheduler_name: str = DEFAULT_SCHEDULER_NAME
    exempt_namespaces: frozenset[str] = frozenset(DEFAULT_EXEMPT_NAMESPACES)
    configmap_deleters: frozenset[str] = frozenset(DEFAULT_CONFIGMAP_DELETERS)
    env_delivery: contract.EnvDelivery = contract.EnvDelivery.CONFIGMAP
    mps_host_directory: str = contract.DEFAULT_MPS_PIPE_DIRECTORY


@dataclass(frozen=True)
class Request:
    """The fields of an AdmissionRequest the rules read, shape-checked."""

    uid: str
    operation: str
    resource: str
    sub_resource: str
    namespace: str
    name: str
    user: str
    object: Mapping[str, Any] | None
    old_object: Mapping[str, Any] | None

    @property
    def target(self) -> str:
        """`namespace/name` of the object for logs; a pod created with generateName has no name yet."""
        meta = _map((self.object or self.old_object or {}).get("metadata"))
        name = self.name or _str(meta.get("name")) or (_str(meta.get("generateName")) + "<generated>")
        return f"{self.namespace}/{name}" if self.namespace else name


@dataclass(frozen=True)
class Decision:
    """Allowed or not; why not (`message`, and `rule` for the metrics); the JSONPatch of a mutation."""

    allowed: bool
    message: str = ""
    rule: str = ""
    patch: Sequence[Mapping[str, Any]] = field(default_factory=tuple)
    code: int = 403


ALLOW = Decision(allowed=True)


class MalformedReview(ValueError):
    """A body that is not an AdmissionReview; `uid` is the request's uid where one could be read."""

    def __init__(self, message: str, uid: str = "") -> None:
        super().__init__(message)
        self.uid = uid


def deny(rule: str, message: str) -> Decision:
    return Decision(allowed=False, message=message, rule=rule)


# The exchange: read the review, decide at an endpoint, answer.


def decide(request: Request, *, endpoint: str, policy: Policy, configmap_name: str) -> Decision:
    """The decision at `endpoint`: "mutate" (which never denies) or "validate"."""
    if endpoint == "mutate":
        return mutate(request, policy, configmap_name=configmap_name)
    return validate(request, policy)


def malformed(error: MalformedReview) -> Decision:
    """The answer to a body that is not an AdmissionReview: denied, as the webhook fails closed."""
    return Decision(False, f"malformed AdmissionReview: {error}", "malformed", code=400)


def read_review(body: bytes) -> Request:
    """The AdmissionRequest in `body`; MalformedReview if it is not JSON or not shaped like one."""
    try:
        review = json.loads(body)
    except (ValueError, RecursionError) as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise MalformedReview(f"not JSON ({type(error).__name__})") from None
    if not isinstance(review, dict):
        raise MalformedReview("not a JSON object")
    request = review.get("request")
    if not isinstance(request, dict):
        raise MalformedReview('no "request" object')
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise MalformedReview('"request.uid" is missing or not a string')
    strings = {}
    for name in ("operation", "namespace", "name", "subResource"):
        value = request.get(name, "")
        if not isinstance(value, str):
            raise MalformedReview(f'"request.{name}" is not a string', uid)
        strings[name] = value
    if strings["operation"] not in ("CREATE", "UPDATE", "DELETE", "CONNECT"):
        raise MalformedReview(f'"request.operation" is {strings["operation"]!r}', uid)
    resource = request.get("resource")
    if not isinstance(resource, dict) or not isinstance(resource.get("resource"), str):
        raise MalformedReview('"request.resource.resource" is missing', uid)
    group = resource.get("group", "")
    user_info = request.get("userInfo", {})
    user = user_info.get("username", "") if isinstance(user_info, dict) else None
    if not isinstance(user, str):
        raise MalformedReview('"request.userInfo.username" is not a string', uid)
    objects = []
    for name in ("object", "oldObject"):
        value = request.get(name)
        if value is not None and not isinstance(value, dict):
            raise MalformedReview(f'"request.{name}" is not an object', uid)
        objects.append(value)
    return Request(
        uid=uid,
        operation=strings["operation"],
        # Only core resources are guarded; anything else routed here is let through.
        resource=resource["resource"] if group == "" else f"{resource['resource']}.{group}",
        sub_resource=strings["subResource"],
        namespace=strings["namespace"],
        name=strings["name"],
        user=user,
        object=objects[0],
        old_object=objects[1],
    )


def review_response(uid: str, decision: Decision) -> dict[str, Any]:
    """The AdmissionReview v1 reply: uid, allowed, the denial's status, the base64 JSONPatch.

    Every body gets one, even garbage (with the uid where one could be read), so the apiserver always
    reads an answer and the denial's message, never a bare HTTP error.
    """
    response: dict[str, Any] = {"uid": uid, "allowed": decision.allowed}
    if not decision.allowed:
        reason = "BadRequest" if decision.code == 400 else "Forbidden"
        response["status"] = {"code": decision.code, "reason": reason, "message": decision.message}
    if decision.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(list(decision.patch)).encode()).decode()
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}


# Mutation.


def mutate(request: Request, policy: Policy, *, configmap_name: str) -> Decision:
    """The JSONPatch that routes a share pod to gpufrac and prepares its delivery; see the module doc.

    Anything this does not prepare (not a pod CREATE, no share, a broken contract, another scheduler) is
    allowed unchanged: the validating webhook, which runs after every mutation, is where denials are made.
    """
    if (
        request.operation != "CREATE"
        or request.resource != "pods"
        or request.sub_resource
        or request.namespace in policy.exempt_namespaces
        or request.object is None
    ):
        return ALLOW
    pod = request.object
    try:
        asked = contract.parse_pod(pod)
    except contract.ContractError:
        return ALLOW
    spec = _map(pod.get("spec"))
    scheduler = spec.get("schedulerName")
    if (
        not asked.shares
        or spec.get("nodeName")
        or scheduler not in (None, "", "default-scheduler", policy.scheduler_name)
    ):
        return ALLOW
    patch: list[dict[str, Any]] = [
        {"op": "add", "path": "/spec/schedulerName", "value": policy.scheduler_name}
    ]
    patch += _annotation_patch(
        pod, asked, configmap_name if policy.env_delivery == contract.EnvDelivery.CONFIGMAP else None
    )
    if policy.env_delivery == contract.EnvDelivery.CONFIGMAP:
        patch += _delivery_patch(pod, asked, configmap_name, policy)
    return Decision(allowed=True, patch=tuple(patch))


def _annotation_patch(
    pod: Mapping[str, Any], asked: contract.PodGpuRequest, configmap_name: str | None
) -> list[dict[str, Any]]:
    current = _map(_map(pod.get("metadata")).get("annotations"))
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
    # A share pod has annotations: parse_pod found its share there.
    return [
        {"op": "add", "path": f"/metadata/annotations/{_pointer(key)}", "value": value}
        for key, value in added.items()
    ]


def _delivery_patch(
    pod: Mapping[str, Any], asked: contract.PodGpuRequest, base: str, policy: Policy
) -> list[dict[str, Any]]:
    """An `envFrom` on each GPU container to its own env ConfigMap (one per container, since `envFrom`
    imports a whole ConfigMap), and the MPS pipe directory for sm-sharing containers."""
    spec = _map(pod.get("spec"))
    containers = _list(spec.get("containers"))
    index = {name: i for i, name in enumerate(_names(containers))}
    patch: list[dict[str, Any]] = []
    for name in _gpu_containers(asked):
        i = index[name]
        container = _map(containers[i])
        source = {"configMapRef": {"name": keys.env_configmap_name(base, name), "optional": False}}
        patch.append(_append(f"/spec/containers/{i}/envFrom", container.get("envFrom"), source))
    sm_sharing = [share.container for share in asked.shares if share.mode is contract.ComputeMode.SM_SHARING]
    for name in sm_sharing:
        i = index[name]
        mount = {"name": MPS_VOLUME, "mountPath": contract.DEFAULT_MPS_PIPE_DIRECTORY}
        patch.append(
            _append(f"/spec/containers/{i}/volumeMounts", _map(containers[i]).get("volumeMounts"), mount)
        )
    if sm_sharing:
        volume = {
            "name": MPS_VOLUME,
            "hostPath": {"path": policy.mps_host_directory, "type": "DirectoryOrCreate"},
        }
        volumes = spec.get("volumes")
        existing = [i for i, v in enumerate(_list(volumes)) if _map(v).get("name") == MPS_VOLUME]
        if existing:
            patch.append({"op": "replace", "path": f"/spec/volumes/{existing[0]}", "value": volume})
        else:
            patch.append(_append("/spec/volumes", volumes, volume))
    return patch


def _gpu_containers(asked: contract.PodGpuRequest) -> list[str]:
    """The containers the scheduler gives GPUs and an env ConfigMap: every share and whole-GPU one."""
    return [share.container for share in asked.shares] + [whole.container for whole in asked.whole]


def _append(path: str, current: object, item: dict[str, Any]) -> dict[str, Any]:
    """Append `item` to the list at `path`, creating the list where the pod has none."""
    if isinstance(current, list):
        return {"op": "add", "path": f"{path}/-", "value": item}
    return {"op": "add", "path": path, "value": [item]}


def _pointer(key: str) -> str:
    """`key` as one JSON Pointer token (RFC 6901): annotation keys hold slashes."""
    return key.replace("~", "~0").replace("/", "~1")


# Validation.


def validate(request: Request, policy: Policy) -> Decision:
    """Allowed, or denied with the first rule broken; see the module doc for the rules."""
    if request.namespace in policy.exempt_namespaces:
        return ALLOW
    if request.resource == "configmaps" and not request.sub_resource:
        return _validate_configmap(request, policy)
    if request.resource != "pods" or request.object is None:
        return ALLOW
    trusted = request.user == policy.scheduler_identity
    if request.sub_resource == "ephemeralcontainers":
        if trusted:
            return ALLOW
        return _reserved_env(request.object) or _ephemeral_env_configmap(request.object) or ALLOW
    if request.sub_resource:
        return ALLOW
    if request.operation == "CREATE":
        return _validate_new_pod(request.object, request.user, policy)
    if request.operation == "UPDATE":
        return _validate_pod_update(request, policy, trusted=trusted)
    return ALLOW


def _contract(pod: Mapping[str, Any], *, placement: bool) -> contract.PodGpuRequest | Decision:
    """What the pod asks for; with `placement`, a pod that carries devices must also read back as placed,
    so that even the scheduler cannot write a bind it could not rebuild its state from."""
    try:
        asked = contract.parse_pod(pod)
        annotations = _map(_map(pod.get("metadata")).get("annotations"))
        if placement and any(
            isinstance(key, str) and contract.is_scheduler_owned(key) for key in annotations
        ):
            contract.parse_placement(pod)
    except contract.ContractError as error:
        return deny("contract", str(error))
    return asked


def _validate_new_pod(pod: Mapping[str, Any], user: str, policy: Policy) -> Decision:
    trusted = user == policy.scheduler_identity
    asked = _contract(pod, placement=trusted)
    if isinstance(asked, Decision):
        return asked
    if trusted:
        return ALLOW
    return (
        _scheduler_owned(pod, user, policy)
        or _reserved_env(pod)
        or _privileged_share(pod, {share.container for share in asked.shares})
        or _env_configmap(pod, asked, policy)
        or _mps_host_path(pod, asked, policy)
        or ALLOW
    )


def _validate_pod_update(request: Request, policy: Policy, *, trusted: bool) -> Decision:
    new = _guarded_annotations(request.object)
    old = _guarded_annotations(request.old_object)
    changed = sorted(key for key in new.keys() | old.keys() if new.get(key) != old.get(key))
    if not changed:
        return ALLOW
    if not trusted:
        key = changed[0]
        before = "absent" if key not in old else json.dumps(_text(old[key]))
        after = "removed" if key not in new else json.dumps(_text(new[key]))
        return deny(
            "contract-change",
            f"{key}: {before} -> {after}: GPU contract annotations cannot change once the pod exists; only "
            f"the gpufrac scheduler ({policy.scheduler_identity}) may write them, not {_who(request.user)}; "
            "delete the pod and create it with the keys it needs",
        )
    assert request.object is not None
    checked = _contract(request.object, placement=True)
    return checked if isinstance(checked, Decision) else ALLOW


def _scheduler_owned(pod: Mapping[str, Any], user: str, policy: Policy) -> Decision | None:
    for key, value in _map(_map(pod.get("metadata")).get("annotations")).items():
        if isinstance(key, str) and contract.is_scheduler_owned(key):
            return deny(
                "scheduler-owned",
                f"{key}={json.dumps(_str(value))}: is written by the gpufrac scheduler at bind "
                f"({policy.scheduler_identity}) and names the GPUs a container may use; {_who(user)} may not "
                "set it; remove it",
            )
    return None


def _reserved_env(pod: Mapping[str, Any]) -> Decision | None:
    for container in _containers(pod):
        for variable in _list(container.get("env")):
            name = _map(variable).get("name")
            if isinstance(name, str) and (name in RESERVED_ENV or name.startswith(RESERVED_ENV_PREFIXES)):
                return deny(
                    "env",
                    f'container "{_str(container.get("name"))}" sets {name} in its env: the GPUs a container '
                    "sees and its memory limits come only from gpufrac; remove the variable and ask for a "
                    f"share with {keys.GPU_FRACTION} or {keys.GPU_MEMORY}, or whole GPUs with "
                    f"{keys.GPU_RESOURCE}",
                )
    return None


def _privileged_share(pod: Mapping[str, Any], share_containers: set[str]) -> Decision | None:
    for container in _containers(pod):
        name = _str(container.get("name"))
        if name in share_containers and _map(container.get("securityContext")).get("privileged") is True:
            return deny(
                "privileged",
                f'container "{name}" asks for a GPU share and is privileged: a privileged container sees '
                "every GPU on its node, so no share boundary holds for it; drop securityContext.privileged",
            )
    return None


def _env_configmap(pod: Mapping[str, Any], asked: contract.PodGpuRequest, policy: Policy) -> Decision | None:
    """References to env ConfigMaps go only from this pod's GPU containers, each to its own ConfigMap.

    The webhook names them itself at mutation (from a fresh random base, whatever the pod came with), so
    a pod whose annotation names another pod's base did not pass the mutation. Such a pod is denied here
    unless the gpufrac scheduler is to bind it, and that scheduler refuses to bind a pod to a ConfigMap
    another pod owns.
    """
    annotations = _map(_map(pod.get("metadata")).get("annotations"))
    own = annotations.get(keys.ENV_CONFIGMAP_ANNOTATION)
    spec = _map(pod.get("spec"))
    if own is not None:
        problem = None
        if not isinstance(own, str) or not own.startswith(keys.ENV_CONFIGMAP_PREFIX):
            problem = f'does not name a gpufrac env ConfigMap ("{keys.ENV_CONFIGMAP_PREFIX}...")'
        elif not asked.shares:
            problem = "is set on a pod that asks for no GPU share"
        elif spec.get("schedulerName") != policy.scheduler_name:
            problem = f'is set on a pod not scheduled by "{policy.scheduler_name}"'
        elif spec.get("nodeName"):
            problem = "is set on a pod that names its node itself (spec.nodeName)"
        if problem:
            return deny(
                "env-configmap",
                f"{keys.ENV_CONFIGMAP_ANNOTATION}={json.dumps(_text(own))}: {problem}; only "
                "gpufrac's mutating webhook sets this annotation; remove it",
            )
    base = own if isinstance(own, str) else None
    gpu = set(_gpu_containers(asked))
    for kind, container in _containers_by_list(pod):
        name = _str(container.get("name"))
        mine = keys.env_configmap_name(base, name) if base and kind == "containers" and name in gpu else None
        if denial := _foreign_env_configmap(container, mine, base):
            return denial
    if (
        policy.env_delivery == contract.EnvDelivery.CONFIGMAP
        and asked.shares
        and spec.get("schedulerName") == policy.scheduler_name
    ):
        for container in _containers(pod):
            name = _str(container.get("name"))
            if name in gpu and (
                not base or keys.env_configmap_name(base, name) not in _configmap_refs(container)
            ):
                return deny(
                    "delivery",
                    f'container "{name}" asks for a GPU but has no envFrom to its gpufrac env ConfigMap: the '
                    "pod did not pass gpufrac's mutating webhook, so it would run without its limits; create "
                    "it in a namespace the webhook serves, and leave schedulerName, envFrom and the "
                    f"{keys.ENV_CONFIGMAP_ANNOTATION} annotation to gpufrac",
                )
    return None


def _ephemeral_env_configmap(obj: Mapping[str, Any]) -> Decision | None:
    """An ephemeral container (`kubectl debug`) may take env from no gpufrac env ConfigMap at all."""
    base = _map(_map(obj.get("metadata")).get("annotations")).get(keys.ENV_CONFIGMAP_ANNOTATION)
    for kind, container in _containers_by_list(obj):
        if kind == "ephemeralContainers" and (denial := _foreign_env_configmap(container, None, base)):
            return denial
    return None


def _foreign_env_configmap(container: Mapping[str, Any], mine: str | None, base: object) -> Decision | None:
    """A reference from `container` to a gpufrac env ConfigMap other than its own, `mine`."""
    for ref in _configmap_refs(container):
        if ref.startswith(keys.ENV_CONFIGMAP_PREFIX) and ref != mine:
            ours = isinstance(base, str) and ref.startswith(base + "-")
            whose = "another container's" if ours else "another pod's"
            return deny(
                "env-configmap-ref",
                f'container "{_str(container.get("name"))}" takes its env from ConfigMap "{ref}", {whose} '
                "gpufrac env ConfigMap, which holds the GPU devices and limits of the share it was made "
                "for; remove the reference (gpufrac adds the right one to each share container itself)",
            )
    return None


def _mps_host_path(pod: Mapping[str, Any], asked: contract.PodGpuRequest, policy: Policy) -> Decision | None:
    """A host path into the MPS pipe directory reaches the MPS daemons with no limit set: only the
    volume the mutation adds to a pod with an sm-sharing share may mount it."""
    root = posixpath.normpath(policy.mps_host_directory)
    sm_sharing = any(share.mode is contract.ComputeMode.SM_SHARING for share in asked.shares)
    for volume in _list(_map(pod.get("spec")).get("volumes")):
        volume = _map(volume)
        path = _map(volume.get("hostPath")).get("path")
        if not isinstance(path, str) or not path:
            continue
        path = posixpath.normpath(path)
        if path.startswith("/var/run/"):  # a link to /run on every distribution Kubernetes runs on
            path = path.removeprefix("/var")
        if path != root and not path.startswith(root.rstrip("/") + "/"):
            continue
        if volume.get("name") == MPS_VOLUME and sm_sharing and path == root:
            continue
        return deny(
            "mps-host-path",
            f'volume "{_str(volume.get("name"))}" mounts {path} from the host, where gpufrac\'s MPS daemons '
            "listen: only an sm-sharing share gets it, from gpufrac; remove the volume",
        )
    return None


def _validate_configmap(request: Request, policy: Policy) -> Decision:
    """Only the scheduler writes env ConfigMaps; the controllers that clean up after pods may delete them."""
    names = [request.name]
    guarded = False
    for obj in (request.object, request.old_object):
        meta = _map(_map(obj).get("metadata"))
        names += [_str(meta.get("name")), _str(meta.get("generateName"))]
        guarded = guarded or keys.ENV_CONFIGMAP_LABEL in _map(meta.get("labels"))
    guarded = guarded or any(name.startswith(keys.ENV_CONFIGMAP_PREFIX) for name in names)
    if not guarded or request.user == policy.scheduler_identity:
        return ALLOW
    if request.operation == "DELETE" and request.user in policy.configmap_deleters:
        return ALLOW
    if request.operation not in ("CREATE", "UPDATE", "DELETE"):
        return ALLOW
    name = next((n for n in names if n), "")
    verb = request.operation.lower()
    return deny(
        "env-configmap-write",
        f'ConfigMap "{name}" is a gpufrac env ConfigMap (name "{keys.ENV_CONFIGMAP_PREFIX}..." or label '
        f"{keys.ENV_CONFIGMAP_LABEL}), which sets a pod's GPU devices and memory limits: only the gpufrac "
        f"scheduler ({policy.scheduler_identity}) may {verb} it, not {_who(request.user)}",
    )


# Reading untrusted shapes: the API sends well-formed objects, but nothing here may raise on others.


def _guarded_annotations(pod: Mapping[str, Any] | None) -> dict[str, object]:
    """The annotations nobody but the scheduler may change after create: the contract keys and the name
    of the env ConfigMap."""
    annotations = _map(_map(_map(pod).get("metadata")).get("annotations"))
    return {
        key: value
        for key, value in annotations.items()
        if isinstance(key, str) and (contract.is_contract_key(key) or key == keys.ENV_CONFIGMAP_ANNOTATION)
    }


def _containers_by_list(pod: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every container of a pod, or of an EphemeralContainers object, with the list it is in."""
    spec = _map(pod.get("spec")) if "spec" in pod else pod
    for kind in _CONTAINER_LISTS:
        for container in _list(spec.get(kind)):
            if isinstance(container, Mapping):
                yield kind, container


def _containers(pod: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    return (container for _, container in _containers_by_list(pod))


def _configmap_refs(container: Mapping[str, Any]) -> list[str]:
    """The ConfigMaps a container takes env from: `envFrom[].configMapRef` and `env[].valueFrom`."""
    refs = [_map(_map(source).get("configMapRef")).get("name") for source in _list(container.get("envFrom"))]
    refs += [
        _map(_map(_map(variable).get("valueFrom")).get("configMapKeyRef")).get("name")
        for variable in _list(container.get("env"))
    ]
    return [ref for ref in refs if isinstance(ref, str)]


def _names(containers: Sequence[object]) -> list[str]:
    return [_str(_map(container).get("name")) for container in containers]


def _who(user: str) -> str:
    return f'"{user}"' if user else "an anonymous user"


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> Sequence[object]:
    return value if isinstance(value, list) else []


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


def _text(value: object) -> str:
    """A short rendering of a value of any type for a message."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= 80 else text[:77] + "..."
