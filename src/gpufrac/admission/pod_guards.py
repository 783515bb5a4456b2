"""The validating webhook's rules for pods: the contract, then for anyone but the scheduler's identity the
guards of the threat model.

The guards, each on every kind of container (`containers`, `initContainers`, `ephemeralContainers`):
- scheduler-owned keys, and contract keys changed after create (by `pods/status` too, and by a Binding,
  whose annotations the apiserver merges into the pod's);
- GPU variables by any route the webhook can see (`gpu_env`), and CDI device annotations, which a runtime
  may honour as it honours the variables;
- privilege in a pod that holds GPUs from gpufrac: `privileged`, the `SYS_ADMIN` capability, `hostPID`,
  `hostIPC`; beside an sm-sharing share, `shareProcessNamespace` or an ephemeral container targeting it;
- references to another pod's or container's env ConfigMap (`envFrom`, `valueFrom`, volumes);
- a queue label naming a queue closed to the pod's namespace (where the webhook watches Queues);
- GPU pods for gpufrac that skipped the mutation;
- `gpufrac.io/gpu-memory` on a container without a share, or other than its share counts: it is what a
  `ResourceQuota` and the kubelet count, so a tenant who set it could slip past the quota, or fill a node's
  capacity of it, where kube-scheduler would place the pod, and have the kubelet refuse gpufrac's shares;
- host paths that reach the MPS pipe directory (`host_paths`), the MPS volume mounted by any container
  but the sm-sharing share it was added for, and the runtime's device-request mount path.
Each denial carries a short `rule` name for the metrics. An object with a field of the wrong type is
denied before any rule reads it (`shapes.check_pod`).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from gpufrac import contract
from gpufrac.admission import exchange, gpu_env, host_paths, mutation, settings, shapes
from gpufrac.contract import keys, memory_resource, queues
from gpufrac.contract.errors import brief
from gpufrac.contract.queues import QueueSpec
from gpufrac.kubeapi import fields

ALL_KINDS = ("containers", "initContainers", "ephemeralContainers")
# The resource `POST /api/v1/namespaces/<ns>/bindings` reviews as, beside the `pods/binding` subresource.
BINDINGS = "bindings"
# The NVIDIA runtime reads a volume mounted below this path in a container as a request for the GPU the
# mount is named after (`accept-nvidia-visible-devices-as-volume-mounts`); `host_paths.canonical` form. It
# matches the path as a string prefix, not a directory (`strings.HasPrefix`), so `...-devicesall` asks for
# "all" just as `.../all` does: the rule compares the same way.
DEVICE_REQUEST_PATH = "/run/nvidia-container-devices"
# The pod annotations that ask the container runtime for devices: CDI's domain and every subdomain of it.
# A runtime that passes `cdi.k8s.io/*` through (Kata's NVIDIA GPU runtime classes set containerd's
# `pod_annotations` to it) injects the devices they name, and NVIDIA's NRI plugin (the GPU Operator's, with
# `cdi.nriPluginEnabled`) those of `nvidia.cdi.k8s.io/container.<c>`, where `management.nvidia.com/gpu=all`
# is every GPU of the node, whatever gpufrac gave the pod. Vendors name their prefixes below CDI's domain.
CDI_DOMAIN = "cdi.k8s.io"
# The capabilities a container of a GPU pod may add: Pod Security's "baseline" list. Any other can reach
# past the device rules that keep the node's other GPUs out (SYS_ADMIN remounts the cgroup filesystem,
# SYS_MODULE loads kernel code, SYS_RAWIO and DAC_READ_SEARCH read the host), so the rule is an allowlist:
# a denylist would miss the next one.
BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)


@dataclass(frozen=True)
class _Gpus:
    """What a pod's containers hold, for the rules on each container."""

    holds: bool | None  # whether the pod holds GPUs from gpufrac; None where the review does not say
    gpu: frozenset[str]  # regular containers given GPUs
    sm_sharing: frozenset[str]  # regular containers given the MPS volume
    base: str | None  # the env ConfigMap base name the pod's annotation records


def validate(
    request: exchange.Request,
    policy: settings.Policy,
    *,
    trusted_namespace: bool,
    queues: Mapping[str, QueueSpec] | None = None,
) -> exchange.Decision:
    """Allowed, or denied with the first rule broken; see the module doc for the rules. `trusted_namespace`:
    the pod's namespace is in the trusted tier, where sm-sharing is allowed. `queues`: the Queue objects,
    where the webhook watches them."""
    if request.operation == "DELETE":  # carries only the old object, and removing a pod grants nothing
        return exchange.ALLOW
    obj = request.object
    if obj is None:  # admission.validate denies this before it gets here; a rule never guesses
        return exchange.malformed(exchange.MalformedReview('"request.object" is missing'))
    try:
        for checked in (obj, request.old_object):
            if checked is not None:
                shapes.check_pod(checked)
    except shapes.Malformed as error:
        return exchange.deny("malformed", f"{error}: gpufrac refuses a pod it cannot read whole")
    trusted = policy.is_scheduler(request.user)
    if request.resource == BINDINGS or request.sub_resource == "binding":
        return exchange.ALLOW if trusted else _validate_binding(obj, request.user, policy)
    if request.sub_resource == "ephemeralcontainers":
        return exchange.ALLOW if trusted else _validate_ephemeral(obj, policy)
    if request.sub_resource == "status" or (not request.sub_resource and request.operation == "UPDATE"):
        return _validate_pod_update(request, policy, trusted=trusted)
    if request.sub_resource:
        return exchange.ALLOW
    if request.operation == "CREATE":
        return (
            None if trusted or queues is None else _queue_namespace(obj, request.namespace, queues)
        ) or _validate_new_pod(
            obj, request.user, policy, trusted=trusted, trusted_namespace=trusted_namespace
        )
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
    pod: Mapping[str, Any], user: str, policy: settings.Policy, *, trusted: bool, trusted_namespace: bool
) -> exchange.Decision:
    asked = _contract(pod, placement=trusted)
    if isinstance(asked, exchange.Decision):
        return asked
    if trusted:
        return exchange.ALLOW
    gpus = _gpus(pod, asked, policy)
    return (
        (None if trusted_namespace else _untrusted_sm_sharing(pod, asked))
        or _scheduler_owned(pod, user, policy)
        or _device_annotations(pod, None)
        or _reserved_env(pod, ALL_KINDS)
        or _capped_env(pod, asked)
        or _privileged(pod, gpus, ALL_KINDS)
        or _env_configmap(pod, asked, policy)
        or _foreign_env_configmaps(pod, gpus, ALL_KINDS)
        or _host_paths(pod, asked, policy)
        or _mounts(pod, gpus, ALL_KINDS)
        or _delivery(pod, asked, policy)
        or _memory_resource(pod, asked, policy)
        or exchange.ALLOW
    )


def _capped_env(pod: Mapping[str, Any], asked: contract.PodGpuRequest) -> exchange.Decision | None:
    """`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` in the `env` of a container whose share has a compute cap: `env`
    beats the env ConfigMap that delivers the cap, so it would lift the cap up to the MPS daemon's own."""
    capped = {share.container for share in asked.shares if share.compute_percent is not None}
    for kind, container in shapes.containers_by_list(pod):
        name = fields.as_str(container.get("name"))
        if kind != "containers" or name not in capped:
            continue
        for variable in fields.as_list(container.get("env")):
            if fields.as_str(fields.as_mapping(variable).get("name")) == keys.ENV_MPS_THREAD_PERCENTAGE:
                return exchange.deny(
                    "env",
                    f'container "{brief(name)}" sets {keys.ENV_MPS_THREAD_PERCENTAGE} in its env, which '
                    f"would lift its share's compute cap "
                    f"({keys.container_key(brief(name), keys.COMPUTE_PERCENTAGE)}): remove it; gpufrac sets "
                    "it from the cap",
                )
    return None


def _untrusted_sm_sharing(pod: Mapping[str, Any], asked: contract.PodGpuRequest) -> exchange.Decision | None:
    """sm-sharing from a namespace outside the trusted tier: its share would run in one MPS server, one
    fault domain, with other tenants' processes, where one client's fault can end the others'."""
    shared = [share.container for share in asked.shares if share.mode is contract.ComputeMode.SM_SHARING]
    if not shared:
        return None
    namespace = brief(fields.as_str(shapes.metadata_of(pod).get("namespace")))
    return exchange.deny(
        "untrusted-sm-sharing",
        f'container "{brief(shared[0])}" asks for sm-sharing, but namespace "{namespace}" is not trusted '
        f"for it (sm-sharing puts a GPU's processes in one MPS server, one fault domain): ask for "
        f"time-slicing, or have an admin label the namespace {settings.TRUST_LABEL}={settings.TRUSTED}",
    )


def _validate_ephemeral(obj: Mapping[str, Any], policy: settings.Policy) -> exchange.Decision:
    """Ephemeral containers added through `pods/ephemeralcontainers` (`kubectl debug`), judged by the
    rules on containers. kube-apiserver v1.20 sends an EphemeralContainers object, which does not say
    whether the pod holds GPUs: the rules then assume that it does. It carries the pod's metadata, so its
    sm-sharing shares are known (`_sm_sharing_named`)."""
    gpus = _Gpus(None, frozenset(), _sm_sharing_named(obj), _base(obj))
    if "spec" in obj:  # later versions send the pod
        asked = _contract(obj, placement=False)
        if isinstance(asked, exchange.Decision):
            return asked
        gpus = _gpus(obj, asked, policy)
    kinds = ("ephemeralContainers",)
    return (
        _reserved_env(obj, kinds)
        or _privileged(obj, gpus, kinds)
        or _foreign_env_configmaps(obj, gpus, kinds)
        or _mounts(obj, gpus, kinds)
        or _targets(obj, gpus)
        or exchange.ALLOW
    )


def _sm_sharing_named(obj: Mapping[str, Any]) -> frozenset[str]:
    """The containers whose compute-mode key says sm-sharing: the pod's sm-sharing shares, since the
    mutation writes the key on every share (and the contract's default is time-slicing)."""
    return frozenset(
        split[0]
        for key, value in shapes.annotations_of(obj).items()
        if isinstance(key, str)
        and (split := keys.split_container_key(key)) is not None
        and key == keys.container_key(split[0], keys.COMPUTE_MODE)
        and value == contract.ComputeMode.SM_SHARING.value
    )


def _targets(obj: Mapping[str, Any], gpus: _Gpus) -> exchange.Decision | None:
    """An ephemeral container that targets an sm-sharing share (`kubectl debug --target`) joins its process
    namespace, where the share's /proc/<pid>/root reaches the MPS pipes only the share may mount: the
    reason shareProcessNamespace is refused beside one."""
    for kind, container in shapes.containers_by_list(obj):
        target = fields.as_str(container.get("targetContainerName"))
        if kind == "ephemeralContainers" and target in gpus.sm_sharing:
            return exchange.deny(
                "privileged",
                f'ephemeral container "{brief(fields.as_str(container.get("name")))}" targets '
                f'"{brief(target)}", an sm-sharing share, whose processes reach the MPS pipes through '
                "/proc/<pid>/root, though only the share may mount them; debug without --target, or a copy "
                "of the pod (kubectl debug --copy-to)",
            )
    return None


def _gpus(pod: Mapping[str, Any], asked: contract.PodGpuRequest, policy: settings.Policy) -> _Gpus:
    for_gpufrac = shapes.spec_of(pod).get("schedulerName") == policy.scheduler_name
    return _Gpus(
        holds=bool(asked.shares) or (bool(asked.whole) and for_gpufrac),
        gpu=frozenset(mutation.gpu_containers(asked)),
        sm_sharing=frozenset(mutation.sm_sharing_containers(asked)),
        base=_base(pod),
    )


def _base(obj: Mapping[str, Any]) -> str | None:
    base = shapes.annotations_of(obj).get(keys.ENV_CONFIGMAP_ANNOTATION)
    return base if isinstance(base, str) else None


def _validate_pod_update(
    request: exchange.Request, policy: settings.Policy, *, trusted: bool
) -> exchange.Decision:
    moved = _queue_change(request)
    if moved is not None and not trusted:
        return moved
    if not trusted and (devices := _device_annotations(request.object, request.old_object)):
        return devices
    new = _guarded_annotations(request.object)
    old = _guarded_annotations(request.old_object)
    changed = sorted(key for key in new.keys() | old.keys() if new.get(key) != old.get(key))
    if not changed:
        return (None if trusted else _made_unreadable(request)) or exchange.ALLOW
    if not trusted:
        key = changed[0]
        before = "absent" if key not in old else json.dumps(_text(old[key]))
        after = "removed" if key not in new else json.dumps(_text(new[key]))
        return _contract_change(f"{brief(key)}: {before} -> {after}", request.user, policy)
    assert request.object is not None
    checked = _contract(request.object, placement=True)
    return checked if isinstance(checked, exchange.Decision) else exchange.ALLOW


def _contract_change(change: str, user: str, policy: settings.Policy) -> exchange.Decision:
    return exchange.deny(
        "contract-change",
        f"{change}: GPU contract annotations cannot change once the pod exists; only the gpufrac scheduler "
        f"({policy.scheduler_identity}) may write them, not {exchange.who(user)}; delete the pod and create "
        "it with the keys it needs",
    )


def _validate_binding(binding: Mapping[str, Any], user: str, policy: settings.Policy) -> exchange.Decision:
    """A Binding from anyone but the scheduler (`pods/binding`, or `bindings`: who may bind pods, as RBAC
    on `pods/*` allows). The apiserver merges a Binding's annotations into its pod's in storage, with no pod
    UPDATE for the rules above to see, so it may carry none that they freeze or refuse: no contract key (the
    devices and limits the watchdog takes for a grant), no CDI device, nothing that leaves the pod
    unreadable."""
    guarded = _guarded_annotations(binding)
    if guarded:
        key = min(guarded)
        return _contract_change(
            f"{brief(key)}: set to {json.dumps(_text(guarded[key]))} by a Binding", user, policy
        )
    readable = _contract(binding, placement=False)
    return (
        _device_annotations(binding, None)
        or (readable if isinstance(readable, exchange.Decision) else None)
        or exchange.ALLOW
    )


def _made_unreadable(request: exchange.Request) -> exchange.Decision | None:
    """An update may not leave a readable pod unreadable (an annotation the contract reads, such as the
    consent to moves, set to a value it refuses): a scheduler that starts afresh reads each bound pod back,
    and holds the node of one it cannot read, so one tenant's edit would close a GPU node to every tenant."""
    assert request.object is not None and request.old_object is not None
    after = _contract(request.object, placement=False)
    if isinstance(after, exchange.Decision) and not isinstance(
        _contract(request.old_object, placement=False), exchange.Decision
    ):
        return after
    return None


def _queue_namespace(
    pod: Mapping[str, Any], namespace: str, known: Mapping[str, QueueSpec]
) -> exchange.Decision | None:
    """A pod labelled with a queue closed to its namespace (`queues.refusal`): the scheduler would leave it
    waiting; refused here, the tenant learns why at once."""
    why = queues.refusal(known, queues.queue_of(shapes.labels_of(pod)), namespace)
    return exchange.deny("queue-namespace", why) if why else None


def _queue_change(request: exchange.Request) -> exchange.Decision | None:
    """A pod's tenant queue is fixed when it is created: relabelled, a running pod would count against
    another team's queue, making its own look idle and its pods go first."""
    before, after = (shapes.labels_of(obj) for obj in (request.old_object, request.object))
    for key in (queues.QUEUE_LABEL, queues.KAI_QUEUE_LABEL):
        if before.get(key) != after.get(key):
            was, now = (
                json.dumps(_text(v)) if v is not None else "absent" for v in (before.get(key), after.get(key))
            )
            return exchange.deny(
                "queue-change",
                f"{key}: {was} -> {now}: a pod's queue cannot change once it exists; delete the pod and "
                "create it in the queue it belongs to",
            )
    return None


def _scheduler_owned(pod: Mapping[str, Any], user: str, policy: settings.Policy) -> exchange.Decision | None:
    owned = _scheduler_owned_annotations(pod)
    if not owned:
        return None
    key, value = next(iter(owned.items()))
    what = {
        keys.BOUND_UID_ANNOTATION: "names the pod its Binding was meant for",
        keys.FAULT_DOMAIN_ANNOTATION: "names the tenants whose sm-sharing shares may share its GPUs",
        keys.BOUND_QUEUE_ANNOTATION: "names the queue the pod counts in while it runs",
    }.get(key, "names the GPUs a container may use")
    return exchange.deny(
        "scheduler-owned",
        f"{brief(key)}={json.dumps(_text(value))}: is written by the gpufrac scheduler at bind "
        f"({policy.scheduler_identity}) and {what}; {exchange.who(user)} may not set it; remove it",
    )


def _device_annotations(
    pod: Mapping[str, Any] | None, old: Mapping[str, Any] | None
) -> exchange.Decision | None:
    """A CDI annotation (`_is_cdi_annotation`) set or changed since `old`: it can grant GPUs as
    NVIDIA_VISIBLE_DEVICES can, by a route the webhook sees. One the pod already had (made before the
    webhook) is the watchdog's, as an image's variables are; removing one only narrows."""
    before = shapes.annotations_of(old)
    for key, value in shapes.annotations_of(pod).items():
        if isinstance(key, str) and _is_cdi_annotation(key) and before.get(key) != value:
            return exchange.deny(
                "device-annotation",
                f"{brief(key)}={json.dumps(_text(value))}: asks the container runtime for CDI devices, "
                "which can be GPUs gpufrac did not give; GPUs come only from gpufrac: remove the annotation "
                f"and ask for a share with {keys.GPU_FRACTION} or {keys.GPU_MEMORY}, or whole GPUs with "
                f"{keys.GPU_RESOURCE}",
            )
    return None


def _is_cdi_annotation(key: str) -> bool:
    """Whether annotation `key` is under `CDI_DOMAIN` or a subdomain of it (`nvidia.cdi.k8s.io/...`)."""
    domain, slash, _ = key.partition("/")
    return bool(slash) and (domain == CDI_DOMAIN or domain.endswith("." + CDI_DOMAIN))


def _reserved_env(pod: Mapping[str, Any], kinds: Collection[str]) -> exchange.Decision | None:
    """A GPU variable set by `env` or spelled by an `envFrom` prefix (`gpu_env`)."""
    for kind, container in shapes.containers_by_list(pod):
        if kind not in kinds:
            continue
        where = f'container "{brief(fields.as_str(container.get("name")))}"'
        for variable in fields.as_list(container.get("env")):
            variable = fields.as_mapping(variable)
            name = fields.as_str(variable.get("name"))
            if gpu_env.is_reserved(name) and not gpu_env.is_narrowing(name, variable.get("value")):
                return exchange.deny("env", f"{where} sets {brief(name)} in its env: {_GPU_ENV_FIX}")
        for source in fields.as_list(container.get("envFrom")):
            prefix = fields.as_str(fields.as_mapping(source).get("prefix"))
            if spelled := gpu_env.spelled_with_prefix(prefix):
                return exchange.deny(
                    "env",
                    f'{where} imports env with prefix "{brief(prefix)}", which with a key of the source '
                    f"would set {brief(spelled)}: {_GPU_ENV_FIX}; or choose a prefix that spells no "
                    "GPU variable",
                )
    return None


_GPU_ENV_FIX = (
    "the GPUs a container sees and its memory limits come only from gpufrac; remove the variable and ask "
    f"for a share with {keys.GPU_FRACTION} or {keys.GPU_MEMORY}, or whole GPUs with {keys.GPU_RESOURCE}"
)


def _privileged(pod: Mapping[str, Any], gpus: _Gpus, kinds: Collection[str]) -> exchange.Decision | None:
    """Privilege in a pod that holds GPUs: whoever has it sees every GPU on the node, or the MPS pipes."""
    if gpus.holds is False:
        return None
    pod_words = "in a pod that holds GPUs from gpufrac" if gpus.holds else "in a pod that may hold GPUs"
    for kind, container in shapes.containers_by_list(pod):
        if kind not in kinds:
            continue
        where = f'container "{brief(fields.as_str(container.get("name")))}"'
        security = fields.as_mapping(container.get("securityContext"))
        if security.get("privileged") is True:
            return exchange.deny(
                "privileged",
                f"{where} is privileged {pod_words}: a privileged container sees every GPU on its node, so "
                "no share boundary holds for it; drop securityContext.privileged",
            )
        added = fields.as_list(fields.as_mapping(security.get("capabilities")).get("add"))
        for capability in added:
            name = fields.as_str(capability).upper().removeprefix("CAP_")
            if name not in BASELINE_CAPABILITIES:
                return exchange.deny(
                    "privileged",
                    f"{where} adds capability {brief(fields.as_str(capability))} {pod_words}: only Pod "
                    "Security's baseline capabilities are allowed there, since the others can reach past the "
                    "device rules that keep the node's other GPUs out; drop it from "
                    "securityContext.capabilities.add",
                )
    if "containers" not in kinds or not gpus.holds:
        return None
    spec = shapes.spec_of(pod)
    for field, why in (
        ("hostPID", "every process on the node, and through /proc/<pid>/root the MPS pipes"),
        ("hostIPC", "the node's IPC namespace, where MPS clients and daemons meet"),
    ):
        if spec.get(field) is True:
            return exchange.deny(
                "privileged",
                f"spec.{field} in a pod that holds GPUs from gpufrac shares {why}; remove spec.{field}",
            )
    if gpus.sm_sharing and spec.get("shareProcessNamespace") is True:
        return exchange.deny(
            "privileged",
            "spec.shareProcessNamespace in a pod with an sm-sharing share lets every container reach the MPS "
            "pipes through the share's /proc/<pid>/root, though only the share may mount them; remove it",
        )
    return None


def _env_configmap(
    pod: Mapping[str, Any], asked: contract.PodGpuRequest, policy: settings.Policy
) -> exchange.Decision | None:
    """The env ConfigMap annotation, and the delivery of a GPU pod for gpufrac.

    The webhook names a pod's env ConfigMaps itself at mutation (from a fresh random base, whatever the
    pod came with), so a pod whose annotation names another pod's base did not pass the mutation. Such a
    pod is denied here unless the gpufrac scheduler is to bind it, and that scheduler refuses to bind a
    pod to a ConfigMap another pod owns. A pod for gpufrac that asks for GPUs, shares or whole, must carry
    the `envFrom` of each GPU container: bound without it, it would run without its limits.
    """
    own = shapes.annotations_of(pod).get(keys.ENV_CONFIGMAP_ANNOTATION)
    spec = fields.as_mapping(pod.get("spec"))
    for_gpufrac = spec.get("schedulerName") == policy.scheduler_name
    asks = bool(asked.shares or asked.whole)
    if own is not None:
        problem = None
        if not fields.is_object_name(own) or not str(own).startswith(keys.ENV_CONFIGMAP_PREFIX):
            problem = f'does not name a gpufrac env ConfigMap ("{keys.ENV_CONFIGMAP_PREFIX}...")'
        elif not asks:
            problem = "is set on a pod that asks for no GPU"
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
    return None


_UNMUTATED = (
    "the pod did not pass gpufrac's mutating webhook, so it would run without its limits or with GPUs "
    "gpufrac did not give it; create it in a namespace the webhook serves, and leave schedulerName, env, "
    f"envFrom and the {keys.ENV_CONFIGMAP_ANNOTATION} annotation to gpufrac"
)


def _delivery(
    pod: Mapping[str, Any], asked: contract.PodGpuRequest, policy: settings.Policy
) -> exchange.Decision | None:
    """What the mutation put last is still last: each GPU container's own env ConfigMap as its last
    `envFrom` (later sources win, so a tenant source after it would override its devices and limits), and
    `NVIDIA_VISIBLE_DEVICES=void` as the last `env` of every other container (env wins over every
    `envFrom`). Without them the pod did not pass the mutation, or was changed after it."""
    spec = fields.as_mapping(pod.get("spec"))
    if spec.get("schedulerName") != policy.scheduler_name or not (asked.shares or asked.whole):
        return None
    own = shapes.annotations_of(pod).get(keys.ENV_CONFIGMAP_ANNOTATION)
    base = own if isinstance(own, str) else None
    gpu = set(mutation.gpu_containers(asked))
    for kind in ("containers", "initContainers"):
        for container in fields.as_list(spec.get(kind)):
            container = fields.as_mapping(container)
            name = fields.as_str(container.get("name"))
            if kind == "containers" and name in gpu:
                if policy.env_delivery != contract.EnvDelivery.CONFIGMAP:
                    continue
                sources = fields.as_list(container.get("envFrom"))
                if not base or not sources or not _delivers(sources[-1], keys.env_configmap_name(base, name)):
                    return exchange.deny(
                        "delivery",
                        f'container "{brief(name)}" asks for a GPU but its last envFrom is not its '
                        f"gpufrac env ConfigMap, without a prefix and not optional: {_UNMUTATED}",
                    )
                continue
            variables = fields.as_list(container.get("env"))
            last = fields.as_mapping(variables[-1]) if variables else {}
            variable = fields.as_str(last.get("name"))
            if set(last) != {"name", "value"} or not gpu_env.is_narrowing(variable, last.get("value")):
                return exchange.deny(
                    "delivery",
                    f'container "{brief(name)}" of a GPU pod gets no GPU but its last env is not '
                    f"{keys.ENV_VISIBLE_DEVICES}={gpu_env.NO_GPU}: {_UNMUTATED}",
                )
    return None


def _delivers(source: object, configmap: str) -> bool:
    """Whether an `envFrom` entry imports `configmap` as the mutation writes it: without a prefix, which
    would rename `NVIDIA_VISIBLE_DEVICES` and the limits to variables nothing reads (leaving the image's
    `NVIDIA_VISIBLE_DEVICES=all`), and not optional, which would let the container start without them."""
    entry = fields.as_mapping(source)
    ref = fields.as_mapping(entry.get("configMapRef"))
    return ref.get("name") == configmap and not entry.get("prefix") and ref.get("optional") in (None, False)


def _memory_resource(
    pod: Mapping[str, Any], asked: contract.PodGpuRequest, policy: settings.Policy
) -> exchange.Decision | None:
    """`gpufrac.io/gpu-memory` exactly where and as the mutation puts it (see the module doc). A pod of
    another scheduler may go without it, since gpufrac's mutation left it alone."""
    resource = memory_resource.GPU_MEMORY_RESOURCE
    counted = mutation.counted(asked, policy.fraction_reference_mib)
    ours = fields.as_mapping(pod.get("spec")).get("schedulerName") == policy.scheduler_name
    for kind, container in shapes.containers_by_list(pod):
        name = fields.as_str(container.get("name"))
        want = counted.get(name) if kind == "containers" else None
        resources = fields.as_mapping(container.get("resources"))
        for field in ("requests", "limits"):
            have = fields.as_mapping(resources.get(field)).get(resource)
            where = f'container "{brief(name)}" {field} {resource}'
            if have is None:
                if want is not None and ours:
                    return exchange.deny("gpu-memory-resource", f"{where} is missing: {_UNMUTATED}")
                continue
            if want is None:
                return exchange.deny(
                    "gpu-memory-resource",
                    f"{where}, but it asks for no GPU share: remove it; gpufrac sets it on share containers "
                    "from their share",
                )
            if _bytes(have) != contract.parse_quantity(want):
                return exchange.deny(
                    "gpu-memory-resource",
                    f"{where} is {brief(str(have))}, but its share counts {want}: remove it; gpufrac sets it "
                    "from the share",
                )
    return None


def _bytes(quantity: object) -> Fraction | None:
    try:
        return contract.parse_quantity(str(quantity))
    except ValueError:
        return None


def _foreign_env_configmaps(
    pod: Mapping[str, Any], gpus: _Gpus, kinds: Collection[str]
) -> exchange.Decision | None:
    """References to env ConfigMaps go only from a pod's GPU containers, each to its own ConfigMap, and
    only through `envFrom`/`valueFrom`: gpufrac never mounts one as a volume."""
    for kind, container in shapes.containers_by_list(pod):
        if kind not in kinds:
            continue
        name = fields.as_str(container.get("name"))
        mine = (
            keys.env_configmap_name(gpus.base, name)
            if gpus.base and kind == "containers" and name in gpus.gpu
            else None
        )
        for ref in shapes.configmap_refs(container):
            if ref.startswith(keys.ENV_CONFIGMAP_PREFIX) and ref != mine:
                return exchange.deny(
                    "env-configmap-ref",
                    f'container "{brief(name)}" takes its env from ConfigMap "{brief(ref)}", '
                    f"{_whose(ref, gpus.base)} gpufrac env ConfigMap, {_ENV_CONFIGMAP_FIX}",
                )
    if "containers" not in kinds:
        return None
    for volume in shapes.volumes(pod):
        for ref in shapes.volume_configmaps(volume):
            if ref.startswith(keys.ENV_CONFIGMAP_PREFIX):
                return exchange.deny(
                    "env-configmap-ref",
                    f'volume "{brief(fields.as_str(volume.get("name")))}" mounts ConfigMap "{brief(ref)}", '
                    f"{_whose(ref, gpus.base)} gpufrac env ConfigMap, {_ENV_CONFIGMAP_FIX}",
                )
    return None


_ENV_CONFIGMAP_FIX = (
    "which holds the GPU devices and limits of the share it was made for; remove the reference (gpufrac "
    "adds the right one to each share container itself)"
)


def _whose(ref: str, base: str | None) -> str:
    return "another container's" if base and ref.startswith(base + "-") else "another pod's"


def _host_paths(
    pod: Mapping[str, Any], asked: contract.PodGpuRequest, policy: settings.Policy
) -> exchange.Decision | None:
    """No host path but the MPS volume the mutation adds, and the directories the operator allows.

    A host path that reaches the MPS pipe directory reaches the MPS daemons with no limit set: only the
    volume the mutation adds to a pod with an sm-sharing share may mount it, and only at the directory.
    Matching other paths by name cannot be made sound: a tenant who may write one host directory can link
    any host path into it (the pipes, /proc, the container runtime's socket), and the kubelet follows the
    link when it mounts it for the next pod. So every other host path is refused unless it lies in a
    directory the operator allows (`--allow-host-paths`), as Pod Security's baseline does.
    """
    root = host_paths.canonical(policy.mps_host_directory)
    allowed = [host_paths.canonical(directory) for directory in policy.allowed_host_paths]
    sm_sharing = bool(mutation.sm_sharing_containers(asked))
    for volume in shapes.volumes(pod):
        if "hostPath" not in volume:
            continue
        path = fields.as_str(fields.as_mapping(volume.get("hostPath")).get("path"))
        canonical = host_paths.canonical(path)
        name = fields.as_str(volume.get("name"))
        if name == mutation.MPS_VOLUME and sm_sharing and canonical == root:
            continue
        if why := host_paths.reaches(path, root):
            return exchange.deny(
                "mps-host-path",
                f'volume "{brief(name)}" {why}: only an sm-sharing share gets it, from gpufrac; remove the '
                "volume",
            )
        if not any(host_paths.is_within(canonical, directory) for directory in allowed):
            return exchange.deny(
                "host-path",
                f'volume "{brief(name)}" mounts {brief(canonical)} from the host: a tenant who '
                "can write one host directory can link any other into it, the MPS pipes and the container "
                "runtime's socket included, so host paths are refused outside the directories the operator "
                "allows (gpufrac webhook --allow-host-paths); use another volume type",
            )
    return None


def _mounts(pod: Mapping[str, Any], gpus: _Gpus, kinds: Collection[str]) -> exchange.Decision | None:
    """The MPS volume is mounted only by the sm-sharing share containers it was added for; nothing is
    mounted where the NVIDIA runtime reads device requests."""
    for kind, container in shapes.containers_by_list(pod):
        if kind not in kinds:
            continue
        name = fields.as_str(container.get("name"))
        for mount in fields.as_list(container.get("volumeMounts")):
            mount = fields.as_mapping(mount)
            if mount.get("name") == mutation.MPS_VOLUME and not (
                kind == "containers" and name in gpus.sm_sharing
            ):
                return exchange.deny(
                    "mps-mount",
                    f'container "{brief(name)}" mounts volume "{mutation.MPS_VOLUME}", gpufrac\'s MPS pipe '
                    "directory, which only the sm-sharing share containers it was added for may mount; "
                    "remove the volumeMount",
                )
            path = host_paths.canonical(fields.as_str(mount.get("mountPath")))
            if path.startswith(DEVICE_REQUEST_PATH):
                return exchange.deny(
                    "device-mount",
                    f'container "{brief(name)}" mounts a volume at {brief(path)}, where the NVIDIA runtime '
                    "reads requests for GPUs; mount it elsewhere",
                )
    return None


def _guarded_annotations(pod: Mapping[str, Any] | None) -> dict[str, object]:
    """The annotations nobody but the scheduler may change after create: the contract keys, the name
    of the env ConfigMap, and what only a Binding writes (the UID it was meant for)."""
    return {
        key: value
        for key, value in shapes.annotations_of(pod).items()
        if isinstance(key, str)
        and (
            contract.is_contract_key(key)
            or contract.is_scheduler_owned(key)
            or key == keys.ENV_CONFIGMAP_ANNOTATION
        )
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
    return brief(value if isinstance(value, str) else json.dumps(value, default=str))
