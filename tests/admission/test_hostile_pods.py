"""The routes around the webhook that issue 11 lists, each closed as a class: every kind of container,
every route of a variable, every spelling of a path, every malformed or missing object."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufrac.admission import exchange, mutation, settings, shapes
from gpufrac.contract import keys, parse_pod

from .reviews import (
    NAME,
    POLICY,
    SCHEDULER,
    allowed,
    container,
    denial,
    mutate,
    mutated,
    pod,
    request,
    review,
    share_pods,
    validate,
)

N = "nvidia.com/container."
KINDS = ("containers", "initContainers", "ephemeralContainers")
SM = {f"{N}app.gpu-memory.request": "8Gi", f"{N}app.gpu-compute.mode": "sm-sharing"}


def share_pod_with(
    kind: str, extra: dict[str, Any], annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    """A mutated share pod with one more container `extra` in the list `kind`, or, where `kind` is "app",
    with `extra`'s fields in the share container (lists before what the mutation added)."""
    result = mutated(pod(annotations or {"gpu-fraction": "0.5"}))
    if kind == "app":
        share = container(result)
        for field, value in extra.items():
            share[field] = value + share.get(field, []) if isinstance(value, list) else value
    else:
        result["spec"].setdefault(kind, []).append({"name": "other", "image": "busybox", **extra})
    return result


# GPU variables: by env name or by envFrom prefix, in every kind of container.


@pytest.mark.parametrize("kind", [*KINDS, "app"])
@pytest.mark.parametrize(
    "prefix", ["NVIDIA_", "NVIDIA_VISIBLE_", "CUDA_", "CUDA_MPS_", "NVIDIA_GPU_MEMORY_X_"]
)
def test_an_envfrom_prefix_that_spells_a_gpu_variable_is_denied(kind: str, prefix: str) -> None:
    for source in ({"configMapRef": {"name": "mine"}}, {"secretRef": {"name": "mine"}}):
        obj = share_pod_with(kind, {"envFrom": [{"prefix": prefix, **source}]})
        assert f'imports env with prefix "{prefix}", which with a key of the source would set ' in denial(
            obj, "env"
        )
    plain = pod({})
    container(plain)["envFrom"] = [{"prefix": prefix, "configMapRef": {"name": "mine"}}]
    assert denial(plain, "env")


@pytest.mark.parametrize("kind", KINDS)
def test_a_gpu_variable_is_denied_in_every_kind_of_container_from_any_source(kind: str) -> None:
    for variable in (
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
        {"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"configMapKeyRef": {"name": "m", "key": "k"}}},
        {"name": "CUDA_MPS_PIPE_DIRECTORY", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
        {"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ):
        assert denial(share_pod_with(kind, {"env": [variable]}), "env")


def test_variables_that_only_narrow_are_allowed() -> None:
    obj = share_pod_with(
        "app",
        {
            "env": [
                {"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": "25"},
                {
                    "name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
                    "valueFrom": {"configMapKeyRef": {"name": "m", "key": "k"}},
                },
                {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"},
            ],
            "envFrom": [
                {"prefix": "APP_", "configMapRef": {"name": "settings"}},
                {"configMapRef": {"name": "settings"}},
                {"prefix": "nvidia_", "secretRef": {"name": "s"}},
            ],
        },
        SM,
    )
    assert allowed(obj)


def test_containers_without_a_gpu_are_given_none_whatever_their_sources_hold() -> None:
    original = pod(
        {"gpu-fraction": "0.5"}, ("app", "sidecar"), initContainers=[{"name": "init", "image": "x"}]
    )
    container(original, "sidecar")["env"] = [{"name": "A", "value": "1"}]
    container(original, "sidecar")["envFrom"] = [{"configMapRef": {"name": "tenant-settings"}}]
    after = mutated(original)
    void = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}
    assert container(after, "sidecar")["env"] == [{"name": "A", "value": "1"}, void]  # last: it wins
    assert after["spec"]["initContainers"][0]["env"] == [void]
    assert "env" not in container(after, "app")
    assert parse_pod(after) == parse_pod(original)
    assert allowed(after)


# Privilege in a pod that holds GPUs.


@pytest.mark.parametrize("kind", [*KINDS, "app"])
@pytest.mark.parametrize(
    "security",
    [
        {"privileged": True},
        {"capabilities": {"add": ["SYS_ADMIN"]}},
        {"capabilities": {"add": ["NET_ADMIN", "CAP_SYS_ADMIN"]}},
        {"capabilities": {"add": ["ALL"]}},
        {"capabilities": {"add": ["sys_admin"]}},
        {"capabilities": {"add": ["SYS_MODULE"]}},
        {"capabilities": {"add": ["CHOWN", "DAC_READ_SEARCH"]}},
        {"capabilities": {"add": ["SYS_RAWIO"]}},
        {"capabilities": {"add": ["BPF"]}},
        {"capabilities": {"add": ["NET_ADMIN"]}},
    ],
)
def test_privilege_in_any_container_of_a_gpu_pod_is_denied(kind: str, security: dict[str, Any]) -> None:
    message = denial(share_pod_with(kind, {"securityContext": security}), "privileged")
    assert "in a pod that holds GPUs from gpufrac" in message


def test_a_shared_process_namespace_is_denied_beside_an_sm_sharing_share() -> None:
    sm = mutated(pod(SM))
    sm["spec"]["shareProcessNamespace"] = True
    assert "reach the MPS pipes through the share's /proc/<pid>/root" in denial(sm, "privileged")
    time_slicing = mutated(pod({"gpu-fraction": "0.5"}))
    time_slicing["spec"]["shareProcessNamespace"] = True
    assert allowed(time_slicing)


def test_baseline_capabilities_are_allowed_in_a_gpu_pod() -> None:
    security = {"capabilities": {"add": ["CAP_CHOWN", "net_bind_service", "SYS_CHROOT"], "drop": ["ALL"]}}
    assert allowed(share_pod_with("app", {"securityContext": security}))


@pytest.mark.parametrize("field", ["hostPID", "hostIPC"])
def test_the_nodes_processes_and_ipc_are_denied_to_a_gpu_pod(field: str) -> None:
    share = mutated(pod({"gpu-fraction": "0.5"}))
    share["spec"][field] = True
    assert denial(share, "privileged").startswith(f"spec.{field} in a pod that holds GPUs from gpufrac")
    plain = pod({})
    plain["spec"][field] = True
    assert allowed(plain)


def test_a_whole_gpu_pod_for_gpufrac_holds_gpus_and_one_for_the_device_plugin_is_not_ours() -> None:
    whole = pod({}, schedulerName="gpufrac")
    container(whole)["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    prepared = mutated(whole)
    prepared["spec"]["initContainers"] = [
        {"name": "init", "image": "x", "securityContext": {"privileged": True}}
    ]
    assert denial(prepared, "privileged")
    plugin = pod({})
    container(plugin)["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    container(plugin)["securityContext"] = {"privileged": True}
    assert allowed(plugin)


# Ephemeral containers, through the subresource.


def ephemeral(container_fields: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The EphemeralContainers object v1.20 sends, before and after `kubectl debug` adds one."""
    before = {"kind": "EphemeralContainers", "metadata": {"name": "p"}, "ephemeralContainers": []}
    after = dict(before, ephemeralContainers=[{"name": "debug", "image": "busybox", **container_fields}])
    return before, after


@pytest.mark.parametrize(
    ("fields", "rule"),
    [
        ({"securityContext": {"privileged": True}}, "privileged"),
        ({"securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}, "privileged"),
        ({"envFrom": [{"prefix": "NVIDIA_", "configMapRef": {"name": "m"}}]}, "env"),
        ({"volumeMounts": [{"name": "gpufrac-mps", "mountPath": "/mps"}]}, "mps-mount"),
        (
            {"volumeMounts": [{"name": "data", "mountPath": "/var/run/nvidia-container-devices/all"}]},
            "device-mount",
        ),
        ({"envFrom": [{"configMapRef": {"name": f"{NAME}-app"}}]}, "env-configmap-ref"),
    ],
)
def test_an_ephemeral_container_is_held_to_the_rules_of_a_gpu_pod(fields: dict[str, Any], rule: str) -> None:
    before, after = ephemeral(fields)
    review = {"operation": "UPDATE", "sub_resource": "ephemeralcontainers", "old": before}
    message = denial(after, rule, **review)
    if rule == "privileged":
        assert "in a pod that may hold GPUs" in message
    assert allowed(after, user=SCHEDULER, **review)
    assert allowed(ephemeral({"env": [{"name": "A", "value": "1"}]})[1], **review)


@pytest.mark.parametrize("shape", ["EphemeralContainers", "Pod"])
def test_an_ephemeral_container_may_not_join_an_sm_sharing_shares_processes(shape: str) -> None:
    """`kubectl debug --target` puts the ephemeral container in the target's process namespace, where the
    share's /proc/<pid>/root reaches the MPS pipes: what shareProcessNamespace is refused for. Kubernetes
    1.20 sends the pod's metadata without its containers, later versions the pod."""

    def debug(obj: dict[str, Any], target: str) -> exchange.Decision:
        before = copy.deepcopy(obj)
        if shape == "EphemeralContainers":
            before = {"kind": shape, "metadata": obj["metadata"], "ephemeralContainers": []}
        after = copy.deepcopy(before)
        added = {"name": "debug", "image": "busybox", "targetContainerName": target}
        after.get("spec", after).setdefault("ephemeralContainers", []).append(added)
        return validate(after, operation="UPDATE", sub_resource="ephemeralcontainers", old=before)

    sm = mutated(pod(SM, ("app", "side")))
    denied = debug(sm, "app")
    assert not denied.allowed and denied.rule == "privileged", denied.message
    assert 'ephemeral container "debug" targets "app", an sm-sharing share' in denied.message
    assert debug(sm, "side").allowed
    assert debug(mutated(pod({"gpu-fraction": "0.5"})), "app").allowed


# Devices asked of the container runtime by annotation.


@pytest.mark.parametrize(
    "key",
    [
        "cdi.k8s.io/gpu",
        "cdi.k8s.io/nvidia_devices0",
        "nvidia.cdi.k8s.io/container.app",  # NVIDIA's NRI plugin (GPU Operator, cdi.nriPluginEnabled)
        "nvidia.cdi.k8s.io/pod",
        "vendor.cdi.k8s.io/x",
    ],
)
def test_a_cdi_device_annotation_is_denied_on_create_and_on_update(key: str) -> None:
    """Runtimes that pass `cdi.k8s.io/*` pod annotations through (Kata's NVIDIA GPU runtime classes,
    containerd with `pod_annotations`) inject the CDI devices they name: a GPU by annotation, as by
    NVIDIA_VISIBLE_DEVICES. So does NVIDIA's own NRI plugin, for `nvidia.cdi.k8s.io/container.<c>` (the GPU
    Operator also sets the runtime's CDI annotation prefix to `nvidia.cdi.k8s.io/`): with
    `management.nvidia.com/gpu=all` or `nvidia.com/gpu=all` it hands a container every GPU of its node,
    whatever the toolkit does with NVIDIA_VISIBLE_DEVICES. Every subdomain of CDI's is a CDI prefix."""
    for base in (pod({}), mutated(pod({"gpu-fraction": "0.5"}))):
        asking = copy.deepcopy(base)
        asking["metadata"]["annotations"][key] = "nvidia.com/gpu=all"
        assert f"{key}=" in denial(asking, "device-annotation")
        for sub_resource in ("", "status"):
            update: dict[str, Any] = {"operation": "UPDATE", "sub_resource": sub_resource, "old": base}
            assert denial(asking, "device-annotation", **update)
        assert allowed(asking, operation="UPDATE", old=asking)  # a pod from before the webhook may be updated


@pytest.mark.parametrize("key", ["notcdi.k8s.io/x", "cdi.k8s.io.example.com/x", "example.com/cdi.k8s.io"])
def test_annotations_only_named_like_cdi_are_not_device_annotations(key: str) -> None:
    assert allowed(pod({key: "nvidia.com/gpu=all"}))


# Host paths and the MPS volume.


@pytest.mark.parametrize(
    "path",
    [
        "//run/gpufrac/mps",
        "/run/./gpufrac/mps/",
        "/run/gpufrac",
        "/run",
        "/",
        "/var/run",
        "/proc",
        "/proc/1/root/run/gpufrac/mps",
        "/var/run/../proc/self/root",
    ],
)
def test_a_host_path_that_reaches_the_mps_pipes_is_denied_whatever_its_spelling(path: str) -> None:
    assert denial(pod({}, volumes=[{"name": "v", "hostPath": {"path": path}}]), "mps-host-path")
    sm = mutated(pod(SM))
    sm["spec"]["volumes"].append({"name": "v", "hostPath": {"path": path}})
    assert denial(sm, "mps-host-path")


@pytest.mark.parametrize(
    "path",
    [
        "/run/containerd/containerd.sock",
        "/var/run/docker.sock",
        "/dev/shm",
        "/var/tmp/x/link",
        "/var/lib/kubelet",
    ],
)
def test_any_other_host_path_is_denied_in_every_pod_unless_the_operator_allows_its_directory(
    path: str,
) -> None:
    """A host directory a tenant can write is one it can link the MPS pipes or the runtime's socket into."""
    for target in (pod({}), mutated(pod(SM))):
        target["spec"].setdefault("volumes", []).append({"name": "v", "hostPath": {"path": path}})
        assert denial(target, "host-path")
    allowing = settings.Policy(allowed_host_paths=(path.rsplit("/", 1)[0] or "/",))
    assert allowed(pod({}, volumes=[{"name": "v", "hostPath": {"path": path}}]), policy=allowing)


def test_gpufracs_mps_volume_is_only_at_the_directory_and_only_for_sm_sharing() -> None:
    sm = mutated(pod(SM))
    assert allowed(sm)
    sm["spec"]["volumes"][-1]["hostPath"]["path"] = "/run/gpufrac"
    assert "which holds /run/gpufrac/mps" in denial(sm, "mps-host-path")
    time_slicing = pod({}, volumes=[{"name": "gpufrac-mps", "hostPath": {"path": "/run/gpufrac/mps"}}])
    assert denial(time_slicing, "mps-host-path")


@pytest.mark.parametrize("kind", ["initContainers", "containers", "ephemeralContainers"])
def test_the_mps_volume_is_mounted_only_by_the_sm_sharing_share_it_was_added_for(kind: str) -> None:
    sm = mutated(pod(SM))
    sm["spec"].setdefault(kind, []).append(
        {"name": "other", "image": "x", "volumeMounts": [{"name": "gpufrac-mps", "mountPath": "/x"}]}
    )
    assert 'container "other" mounts volume "gpufrac-mps"' in denial(sm, "mps-mount")


def test_a_time_slicing_share_beside_an_sm_sharing_one_may_not_mount_the_mps_volume() -> None:
    two = mutated(pod({**SM, f"{N}b.gpu-memory.request": "1Gi"}, ("app", "b")))
    container(two, "b")["volumeMounts"] = [{"name": "gpufrac-mps", "mountPath": "/run/gpufrac/mps"}]
    assert denial(two, "mps-mount")


@pytest.mark.parametrize(
    "path",
    [
        "/var/run/nvidia-container-devices/all",
        "/run/nvidia-container-devices",
        "//var/run/nvidia-container-devices/GPU-1",
        # The runtime takes the path as a string prefix: this asks for "all" GPUs too.
        "/var/run/nvidia-container-devicesall",
        "/var/run/nvidia-container-devices0",
    ],
)
def test_nothing_is_mounted_where_the_runtime_reads_device_requests(path: str) -> None:
    plain = pod({}, volumes=[{"name": "v", "emptyDir": {}}])
    container(plain)["volumeMounts"] = [{"name": "v", "mountPath": path}]
    assert denial(plain, "device-mount")


# Another pod's env ConfigMap as files.


@pytest.mark.parametrize(
    "volume",
    [
        {"name": "v", "configMap": {"name": "gpufrac-env-aaaaaaaaaaaaaaaa-main"}},
        {
            "name": "v",
            "projected": {
                "sources": [{"secret": {"name": "s"}}, {"configMap": {"name": "gpufrac-env-x-main"}}]
            },
        },
    ],
)
def test_an_env_configmap_mounted_as_a_volume_is_denied(volume: dict[str, Any]) -> None:
    assert "another pod's gpufrac env ConfigMap" in denial(pod({}, volumes=[volume]), "env-configmap-ref")
    own = mutated(pod({"gpu-fraction": "0.5"}))
    own["spec"]["volumes"] = [{"name": "v", "configMap": {"name": f"{NAME}-app"}}]
    assert "another container's" in denial(own, "env-configmap-ref")
    assert allowed(pod({}, volumes=[{"name": "v", "configMap": {"name": "settings"}}]))


# Whole GPUs for gpufrac: delivered as a share is, or refused.


def test_a_whole_gpu_pod_for_gpufrac_gets_its_env_configmap() -> None:
    whole = pod({}, ("app", "log"), schedulerName="gpufrac")
    container(whole)["resources"] = {"limits": {"nvidia.com/gpu": "2"}}
    after = mutated(whole)
    assert after["metadata"]["annotations"]["gpufrac.io/env-configmap"] == NAME
    assert container(after)["envFrom"] == [{"configMapRef": {"name": f"{NAME}-app", "optional": False}}]
    assert container(after, "log")["env"] == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]
    assert allowed(after)
    assert denial(whole, "delivery").startswith('container "app" asks for a GPU but its last envFrom is not')
    del whole["metadata"]["annotations"]  # as the API stores a pod that has none
    assert mutated(whole)["metadata"]["annotations"] == {"gpufrac.io/env-configmap": NAME}


# Numbers.


def test_a_number_in_other_digits_is_a_contract_denial() -> None:
    assert denial(pod({"gpu-fraction": "\uff10.\uff15"}), "contract").startswith(
        'gpu-fraction="\uff10.\uff15": '
    )
    assert mutate(pod({"gpu-fraction": "\uff10.\uff15"})).patch == ()


# pods/status.


def test_a_status_update_may_not_change_the_contract() -> None:
    before = mutated(pod({"gpu-fraction": "0.5"}))
    after = copy.deepcopy(before)
    after["metadata"]["annotations"]["gpu-fraction"] = "0.9"
    fields: dict[str, Any] = {"operation": "UPDATE", "sub_resource": "status", "old": before}
    assert denial(after, "contract-change", **fields).startswith('gpu-fraction: "0.5" -> "0.9"')
    kubelet = copy.deepcopy(before)
    kubelet["status"] = {"phase": "Running"}
    kubelet["metadata"]["annotations"]["note"] = "x"
    assert allowed(kubelet, user="system:node:n1", **fields)


@pytest.mark.parametrize("sub_resource", ["", "status"])
def test_the_bound_uid_marker_may_not_be_added_changed_or_removed_after_create(sub_resource: str) -> None:
    before = mutated(pod({"gpu-fraction": "0.5"}))
    before["metadata"]["annotations"][keys.BOUND_UID_ANNOTATION] = "uid-before"
    fields: dict[str, Any] = {"operation": "UPDATE", "sub_resource": sub_resource, "old": before}
    for value in ("uid-other", None):
        after = copy.deepcopy(before)
        if value is None:
            del after["metadata"]["annotations"][keys.BOUND_UID_ANNOTATION]
        else:
            after["metadata"]["annotations"][keys.BOUND_UID_ANNOTATION] = value
        assert keys.BOUND_UID_ANNOTATION in denial(after, "contract-change", **fields)


# Bindings: the apiserver merges a Binding's annotations into its pod's, with no pod UPDATE to review.


def binding(annotations: dict[str, str]) -> dict[str, Any]:
    """A Binding as `pods/binding` and `bindings` receive it: the pod's name, a node, annotations."""
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "p", "namespace": "team", "annotations": annotations},
        "target": {"kind": "Node", "name": "node-1"},
    }


BINDINGS = [{"sub_resource": "binding"}, {"resource": "bindings"}]


@pytest.mark.parametrize("route", BINDINGS)
@pytest.mark.parametrize(
    "annotations",
    [
        {f"{N}app.gpus.devices": "GPU-1"},
        {f"{N}app.gpu-memory.limit": "80Gi"},
        {"gpu-fraction": "0.9"},
        {keys.ENV_CONFIGMAP_ANNOTATION: "gpufrac-env-0123456789abcdef"},
        {keys.FAULT_DOMAIN_ANNOTATION: "other-team"},
    ],
)
def test_a_binding_may_not_write_the_contract(route: dict[str, str], annotations: dict[str, str]) -> None:
    """A tenant RBAC lets bind its own pod (`pods/*`) would otherwise write the devices and limits the pod
    UPDATE rules keep from it: the watchdog takes the annotations for a grant."""
    key = next(iter(annotations))
    assert denial(binding(annotations), "contract-change", **route).startswith(f"{key}: ")
    assert allowed(binding(annotations), user=SCHEDULER, **route)


@pytest.mark.parametrize("route", BINDINGS)
def test_a_binding_may_not_add_cdi_devices_or_make_its_pod_unreadable(route: dict[str, str]) -> None:
    assert "cdi.k8s.io/gpu" in denial(
        binding({"cdi.k8s.io/gpu": "nvidia.com/gpu=all"}), "device-annotation", **route
    )
    assert denial(binding({keys.MOVABLE_ANNOTATION: "maybe"}), "contract", **route).startswith(
        f'{keys.MOVABLE_ANNOTATION}="maybe"'
    )
    assert allowed(binding({}), user="system:kube-scheduler", **route)  # kube-scheduler's, as it sends them
    assert allowed(binding({"note": "x", keys.MOVABLE_ANNOTATION: "true"}), **route)


@pytest.mark.parametrize("route", BINDINGS)
def test_a_binding_without_its_object_is_denied(route: dict[str, str]) -> None:
    decision = validate(None, **route)
    assert not decision.allowed and decision.rule == "malformed"


# Missing and malformed objects: denied, never let through.


@pytest.mark.parametrize(
    ("fields", "missing"),
    [
        ({"operation": "CREATE"}, "object"),
        ({"operation": "UPDATE", "old": pod({})}, "object"),
        ({"operation": "UPDATE", "sub_resource": "status", "old": pod({})}, "object"),
        ({"operation": "UPDATE", "sub_resource": "ephemeralcontainers", "old": pod({})}, "object"),
        ({"operation": "DELETE", "resource": "configmaps"}, "oldObject"),
    ],
)
def test_a_review_without_its_object_is_denied(fields: dict[str, Any], missing: str) -> None:
    decision = validate(None, **fields)
    assert not decision.allowed and decision.rule == "malformed" and decision.code == 400
    assert decision.message == f'malformed AdmissionReview: "request.{missing}" is missing'
    assert validate(None, namespace="kube-system", **fields).allowed  # exempt namespaces stay exempt
    update = validate(pod({}), operation="UPDATE")
    assert not update.allowed and update.message.endswith('"request.oldObject" is missing')


def test_a_pod_delete_is_allowed_with_its_old_object_only() -> None:
    # As the apiserver sends it: no object. A hook registered for every operation must not stop deletions.
    assert allowed(None, operation="DELETE", old=pod({"gpu-fraction": "0.5"}))
    assert not validate(None, operation="DELETE").allowed  # without the old object it is still malformed


@pytest.mark.parametrize(
    ("path", "value", "where"),
    [
        (("spec", "initContainers"), "x", "object.spec.initContainers is not a list"),
        (("spec", "containers", 0, "env"), {"name": "X"}, "object.spec.containers[0].env is not a list"),
        (
            ("spec", "containers", 0, "envFrom"),
            [{"prefix": 7}],
            "object.spec.containers[0].envFrom[0].prefix is not a string",
        ),
        (
            ("spec", "containers", 0, "securityContext"),
            {"privileged": "true"},
            "securityContext.privileged is not a boolean",
        ),
        (("spec", "hostPID"), 1, "object.spec.hostPID is not a boolean"),
        (("spec", "volumes"), [{"name": "v", "hostPath": {"path": 7}}], "hostPath.path is not a string"),
        (("spec", "ephemeralContainers"), [["x"]], "object.spec.ephemeralContainers[0] is not an object"),
        (("metadata", "annotations"), ["x"], "object.metadata.annotations is not an object"),
    ],
)
def test_a_field_of_the_wrong_type_is_denied_not_read_as_empty(
    path: tuple[Any, ...], value: object, where: str
) -> None:
    obj = mutated(pod({"gpu-fraction": "0.5"}))
    parent: Any = obj
    for part in path[:-1]:
        parent = parent[part]
    parent[path[-1]] = value
    for user in ("tenant", SCHEDULER):
        decision = validate(obj, user=user)
        assert not decision.allowed and decision.rule in ("malformed", "contract"), decision.message
    if path[0] != "metadata":
        assert where in denial(obj, "malformed")
    assert mutate(obj).patch == ()


wrong_types = st.sampled_from(["x", 7, True, ["x"], {"x": 1}])
fields_read = st.sampled_from(
    [
        ("spec", "containers", 0, "env"),
        ("spec", "containers", 0, "envFrom"),
        ("spec", "containers", 0, "securityContext"),
        ("spec", "containers", 0, "volumeMounts"),
        ("spec", "containers", 0, "name"),
        ("spec", "initContainers"),
        ("spec", "ephemeralContainers"),
        ("spec", "volumes"),
        ("spec", "hostIPC"),
        ("spec", "schedulerName"),
        ("metadata", "annotations"),
        ("metadata", "name"),
    ]
)


@given(share_pods(), fields_read, wrong_types)
def test_no_pod_with_a_field_of_the_wrong_type_is_allowed_unchanged(
    obj: dict[str, Any], path: tuple[Any, ...], value: object
) -> None:
    expected = {"schedulerName": str, "name": str, "hostIPC": bool, "annotations": dict}.get(path[-1], list)
    if path[-1] == "securityContext":
        expected = dict
    if isinstance(value, expected) and not (expected is int and isinstance(value, bool)):
        return
    parent: Any = mutated(obj)
    target = parent
    for part in path[:-1]:
        parent = parent[part]
    parent[path[-1]] = value
    assert not validate(target).allowed


# Bounds.


def test_too_many_annotations_are_refused_before_they_are_read() -> None:
    many = mutated(pod({"gpu-fraction": "0.5"}))
    many["metadata"]["annotations"].update({f"a{i}": "" for i in range(shapes.MAX_ANNOTATIONS)})
    assert "annotations has 4100 entries, more than the 4096 allowed" in denial(many, "malformed")
    assert mutation.mutate(request(many), POLICY, configmap_name=NAME, trusted_namespace=True).patch == ()


def test_messages_quote_a_huge_value_briefly() -> None:
    before = mutated(pod({"gpu-fraction": "0.5"}))
    after = copy.deepcopy(before)
    after["metadata"]["annotations"]["gpu-fraction"] = "9" * 200_000
    message = denial(after, "contract-change", operation="UPDATE", old=before)
    assert len(message) < 400 and "..." in message
    assert len(denial(pod({"gpu-fraction": "0." + "5" * 200_000}), "contract")) < 400
    body = {"request": {"uid": "u", "operation": "X" * 100_000, "resource": {"resource": "pods"}}}
    with pytest.raises(exchange.MalformedReview) as caught:
        exchange.read_review(json.dumps(body).encode())
    assert len(str(caught.value)) < 120


@pytest.mark.parametrize(
    ("kind", "value", "where"),
    [
        ("shareProcessNamespace", "true", "object.spec.shareProcessNamespace is not a boolean"),
        (
            "initContainers",
            [{"name": "init", "resources": {"requests": ["gpufrac.io/gpu-memory"]}}],
            "object.spec.initContainers[0].resources.requests is not an object",
        ),
        (
            "ephemeralContainers",
            [{"name": "debug", "resources": "gpufrac.io/gpu-memory"}],
            "object.spec.ephemeralContainers[0].resources is not an object",
        ),
    ],
)
def test_a_field_only_one_rule_reads_is_type_checked_too(kind: str, value: object, where: str) -> None:
    """`shareProcessNamespace` (read beside an sm-sharing share) and the resources of containers the
    contract does not read (read for `gpufrac.io/gpu-memory`) were read as absent when of the wrong type."""
    obj = mutated(pod(SM))
    obj["spec"][kind] = value
    assert where in denial(obj, "malformed")


@pytest.mark.parametrize("group", [7, None, [], {"group": ""}])
def test_a_resource_group_of_the_wrong_type_is_malformed_not_another_resource(group: object) -> None:
    """A pod review whose `resource.group` is not a string was read as the resource `pods.<group>`,
    which no rule guards, and allowed."""
    obj = mutated(pod({"gpu-fraction": "0.5"}))
    container(obj)["securityContext"] = {"privileged": True}
    body = review(obj)
    body["request"]["resource"]["group"] = group
    with pytest.raises(exchange.MalformedReview, match=r'"request\.resource\.group" is not a string'):
        exchange.read_review(json.dumps(body).encode())
