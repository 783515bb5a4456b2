"""The validating webhook's rules for pods: each one, with its exact message, and who it lets through."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpufrac.admission import settings
from gpufrac.contract import ContractError, EnvDelivery, keys, parse_pod

from .reviews import NAME, SCHEDULER, TENANT, allowed, container, denial, mutated, pod

N = "nvidia.com/container."
IDENTITY = SCHEDULER
CM = f"{NAME}-app"  # the env ConfigMap the mutation gives container "app"


def bound(obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` after the scheduler's bind patch on container "app"."""
    result = dict(obj, metadata=dict(obj["metadata"], annotations=dict(obj["metadata"]["annotations"])))
    result["metadata"]["annotations"].update(
        {
            f"{N}app.gpu-memory.request": "40960Mi",
            f"{N}app.gpu-memory.limit": "40960Mi",
            f"{N}app.gpu-compute.mode": "time-slicing",
            f"{N}app.gpus.devices": "GPU-1",
        }
    )
    result["spec"] = dict(obj["spec"], nodeName="node-1")
    return result


# The contract, for everyone.


@pytest.mark.parametrize(
    "annotations",
    [
        {"gpu-fraction": "1.5"},
        {"gpu-fraction": "0.5", f"{N}app.gpu-memory.limit": "80Gi"},  # a raised limit beside a KAI share
        {f"{N}app.gpu-memory.request": "9Gi", f"{N}app.gpu-memory.limit": "8Gi"},
        {f"{N}app.gpu-compute.mode": " "},
        {f"{N}other.gpu-memory.request": "1Gi"},
        {"gpu-fraction": "0.5", "gpufrac.io/movable": "yes"},  # consent is "true" or "false", nothing looser
    ],
)
@pytest.mark.parametrize("user", [TENANT, SCHEDULER])
def test_every_contract_error_is_the_denial_with_its_message(annotations: dict[str, str], user: str) -> None:
    with pytest.raises(ContractError) as caught:
        parse_pod(pod(annotations))
    assert denial(pod(annotations), "contract", user=user) == str(caught.value)


CAP = "gpufrac.io/container.app.compute-percentage"


@pytest.mark.parametrize("mode", [{}, {f"{N}app.gpu-compute.mode": "time-slicing"}])
def test_a_compute_cap_on_a_time_slicing_share_is_denied_with_the_reason(mode: dict[str, str]) -> None:
    message = denial(pod({"gpu-fraction": "0.5", **mode, CAP: "40"}), "contract")
    assert message.startswith(f'{CAP}="40": caps SMs through MPS, which a time-slicing share does not use:')
    assert "time-slicing gives each process the whole GPU in turn" in message
    assert f'set {N}app.gpu-compute.mode: "sm-sharing", or remove the cap' in message


def test_a_compute_cap_on_an_sm_sharing_share_is_allowed_and_frozen_like_the_contract() -> None:
    before = mutated(pod({"gpu-fraction": "0.5", f"{N}app.gpu-compute.mode": "sm-sharing", CAP: "40"}))
    assert allowed(before)
    after = copy.deepcopy(before)
    after["metadata"]["annotations"][CAP] = "100"
    assert denial(after, "contract-change", operation="UPDATE", old=before).startswith(
        f'{CAP}: "40" -> "100": GPU contract annotations cannot change once the pod exists'
    )


def test_a_pod_without_gpu_keys_and_a_valid_share_pod_are_allowed() -> None:
    assert allowed(pod({"prometheus.io/scrape": "true"}))
    assert allowed(mutated(pod({"gpu-fraction": "0.5"})))
    assert allowed(mutated(pod({f"{N}app.gpu-memory.request": "8Gi"})))


# Scheduler-owned keys on create.


def test_only_the_scheduler_creates_a_pod_with_devices() -> None:
    forged = bound(mutated(pod({"gpu-fraction": "0.5"})))
    del forged["spec"]["nodeName"]
    assert denial(forged, "scheduler-owned") == (
        f'{N}app.gpus.devices="GPU-1": is written by the gpufrac scheduler at bind ({IDENTITY}) and names '
        'the GPUs a container may use; "tenant" may not set it; remove it'
    )
    assert allowed(forged, user=SCHEDULER)


def test_the_bound_uid_marker_is_the_schedulers_alone() -> None:
    marked = pod({"gpu-fraction": "0.5", keys.BOUND_UID_ANNOTATION: "uid-other"})
    assert "names the pod its Binding was meant for" in denial(marked, "scheduler-owned")
    assert allowed(marked, user=SCHEDULER)


def test_devices_on_a_whole_gpu_container_are_the_schedulers_too() -> None:
    whole = pod({f"{N}app.gpus.devices": "GPU-1"})
    container(whole)["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    assert "may not set it" in denial(whole, "scheduler-owned")
    assert allowed(whole, user=SCHEDULER)


# Contract keys after create.


def test_a_tenant_cannot_raise_a_limit_after_binding() -> None:
    before = bound(mutated(pod({"gpu-fraction": "0.5"})))
    after = bound(before)
    after["metadata"]["annotations"][f"{N}app.gpu-memory.limit"] = "81920Mi"
    message = denial(after, "contract-change", operation="UPDATE", old=before)
    assert message == (
        f'{N}app.gpu-memory.limit: "40960Mi" -> "81920Mi": GPU contract annotations cannot change once the '
        f'pod exists; only the gpufrac scheduler ({IDENTITY}) may write them, not "tenant"; delete the pod '
        "and create it with the keys it needs"
    )
    assert allowed(after, operation="UPDATE", old=before, user=SCHEDULER)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"gpu-fraction": "0.9"}, 'gpu-fraction: "0.5" -> "0.9"'),
        ({"gpu-fraction-num-devices": "2"}, "gpu-fraction-num-devices: absent -> " + '"2"'),
        ({"gpufrac.io/env-configmap": "gpufrac-env-other"}, "gpufrac.io/env-configmap: "),
        (
            {f"{N}app.gpu-compute.mode": "sm-sharing"},
            f'{N}app.gpu-compute.mode: "time-slicing" -> "sm-sharing"',
        ),
    ],
)
def test_every_change_to_a_contract_key_is_denied_even_before_binding(
    change: dict[str, str], expected: str
) -> None:
    before = mutated(pod({"gpu-fraction": "0.5"}))
    after = mutated(pod({"gpu-fraction": "0.5"}))
    after["metadata"]["annotations"].update(change)
    assert denial(after, "contract-change", operation="UPDATE", old=before).startswith(expected)


def test_removing_a_contract_key_is_a_change() -> None:
    before = bound(mutated(pod({"gpu-fraction": "0.5"})))
    after = bound(before)
    del after["metadata"]["annotations"][f"{N}app.gpu-memory.limit"]
    assert denial(after, "contract-change", operation="UPDATE", old=before).startswith(
        f'{N}app.gpu-memory.limit: "40960Mi" -> removed:'
    )


def test_updates_that_leave_the_contract_alone_are_allowed() -> None:
    before = bound(mutated(pod({"gpu-fraction": "0.5"})))
    after = bound(before)
    after["metadata"]["labels"] = {"team": "a"}
    after["metadata"]["annotations"]["note"] = "hello"
    assert allowed(after, operation="UPDATE", old=before)


def test_an_update_may_not_leave_a_readable_pod_unreadable() -> None:
    """Consent to moves may change on a running pod, but only to what the contract reads: a restarted
    scheduler reads every bound pod back and holds the node of one it cannot read, for every tenant."""
    before = bound(mutated(pod({"gpu-fraction": "0.5"})))
    after = bound(before)
    after["metadata"]["annotations"]["gpufrac.io/movable"] = "yes"
    assert denial(after, "contract", operation="UPDATE", old=before).startswith('gpufrac.io/movable="yes"')
    after["metadata"]["annotations"]["gpufrac.io/movable"] = "true"
    assert allowed(after, operation="UPDATE", old=before)
    unreadable_already = bound(before)
    unreadable_already["metadata"]["annotations"]["gpufrac.io/movable"] = "yes"  # made before the webhook
    relabelled = bound(unreadable_already)
    relabelled["metadata"]["labels"] = {"team": "a"}
    assert allowed(relabelled, operation="UPDATE", old=unreadable_already)


def test_the_schedulers_bind_patch_is_allowed_and_must_keep_the_contract() -> None:
    before = mutated(pod({"gpu-fraction": "0.5"}))
    assert allowed(bound(before), operation="UPDATE", old=before, user=SCHEDULER)
    broken = bound(before)
    broken["metadata"]["annotations"][f"{N}app.gpus.devices"] = "GPU-1,GPU-1"
    assert denial(broken, "contract", operation="UPDATE", old=before, user=SCHEDULER) == (
        f'{N}app.gpus.devices="GPU-1,GPU-1": names the same GPU twice'
    )


# GPU variables set directly.


@pytest.mark.parametrize(
    "name",
    [
        "NVIDIA_VISIBLE_DEVICES",
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_GPU_MEMORY_LIMIT",
        "NVIDIA_GPU_MEMORY_REQUEST",
        "NVIDIA_GPU_MEMORY_ANYTHING",
        "CUDA_MPS_PIPE_DIRECTORY",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
        "CUDA_MPS_CLIENT_PRIORITY",
        "NVIDIA_MIG_CONFIG_DEVICES",
        "NVIDIA_MIG_MONITOR_DEVICES",
    ],
)
def test_containers_may_not_set_gpu_variables(name: str) -> None:
    plain = pod({})
    container(plain)["env"] = [{"name": "A", "value": "1"}, {"name": name, "value": "all"}]
    assert denial(plain, "env") == (
        f'container "app" sets {name} in its env: the GPUs a container sees and its memory limits come '
        "only from gpufrac; remove the variable and ask for a share with gpu-fraction or gpu-memory, or "
        "whole GPUs with nvidia.com/gpu"
    )
    assert allowed(plain, user=SCHEDULER)


def test_gpu_variables_are_refused_in_init_containers_and_from_any_source() -> None:
    plain = pod({}, initContainers=[{"name": "init", "image": "busybox"}])
    plain["spec"]["initContainers"][0]["env"] = [
        {"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}
    ]
    assert denial(plain, "env").startswith('container "init" sets NVIDIA_VISIBLE_DEVICES')


def test_other_nvidia_variables_are_allowed() -> None:
    plain = pod({})
    container(plain)["env"] = [{"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"}]
    assert allowed(plain)


def test_ephemeral_containers_may_not_set_gpu_variables_or_borrow_env() -> None:
    # v1.20 sends an EphemeralContainers object to the subresource; later versions send the pod.
    debug = {"name": "debug", "image": "busybox", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}
    before = {"kind": "EphemeralContainers", "metadata": {"name": "p"}, "ephemeralContainers": []}
    legacy = dict(before, ephemeralContainers=[debug])
    assert "NVIDIA_VISIBLE_DEVICES" in denial(
        legacy, "env", operation="UPDATE", sub_resource="ephemeralcontainers", old=before
    )
    target = mutated(pod({"gpu-fraction": "0.5"}))
    old_target = mutated(pod({"gpu-fraction": "0.5"}))
    target["spec"]["ephemeralContainers"] = [
        {"name": "debug", "image": "busybox", "envFrom": [{"configMapRef": {"name": CM}}]}
    ]
    fields: dict[str, Any] = {"operation": "UPDATE", "sub_resource": "ephemeralcontainers", "old": old_target}
    message = denial(target, "env-configmap-ref", **fields)
    assert message.startswith(f'container "debug" takes its env from ConfigMap "{CM}", another container\'s')
    assert allowed(target, user=SCHEDULER, **fields)


# Privileged shares.


def test_a_privileged_share_container_is_denied() -> None:
    share = mutated(pod({"gpu-fraction": "0.5"}))
    container(share)["securityContext"] = {"privileged": True}
    assert denial(share, "privileged") == (
        'container "app" is privileged in a pod that holds GPUs from gpufrac: a privileged container sees '
        "every GPU on its node, so no share boundary holds for it; drop securityContext.privileged"
    )


def test_a_privileged_container_outside_gpu_pods_is_not_this_webhooks_business() -> None:
    plain = pod({}, ("app", "sidecar"))
    container(plain, "sidecar")["securityContext"] = {
        "privileged": True,
        "capabilities": {"add": ["SYS_ADMIN"]},
    }
    assert allowed(plain)
    share = mutated(pod({"gpu-fraction": "0.5"}))
    container(share)["securityContext"] = {"privileged": False, "capabilities": {"add": ["NET_BIND_SERVICE"]}}
    assert allowed(share)


# References to env ConfigMaps.


def test_borrowing_another_pods_env_configmap_is_denied() -> None:
    thief = pod({})
    container(thief)["envFrom"] = [{"configMapRef": {"name": "gpufrac-env-aaaaaaaaaaaaaaaa-main"}}]
    assert denial(thief, "env-configmap-ref") == (
        'container "app" takes its env from ConfigMap "gpufrac-env-aaaaaaaaaaaaaaaa-main", another pod\'s '
        "gpufrac env ConfigMap, which holds the GPU devices and limits of the share it was made for; remove "
        "the reference (gpufrac adds the right one to each share container itself)"
    )
    assert allowed(thief, user=SCHEDULER)


def test_borrowing_one_variable_with_value_from_is_denied_too() -> None:
    thief = mutated(pod({"gpu-fraction": "0.5"}))
    container(thief)["env"] = [
        {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "gpufrac-env-bbbb-app", "key": "NVIDIA_GPU"}}}
    ]
    assert "another pod's" in denial(thief, "env-configmap-ref")


def test_a_sidecar_may_not_share_the_share_containers_configmap() -> None:
    share = mutated(pod({"gpu-fraction": "0.5"}, ("app", "sidecar")))
    container(share, "sidecar")["envFrom"] = [{"configMapRef": {"name": CM}}]
    assert "another container's" in denial(share, "env-configmap-ref")


def test_ordinary_configmaps_may_be_referenced() -> None:
    share = mutated(pod({"gpu-fraction": "0.5"}))
    container(share)["envFrom"].insert(0, {"configMapRef": {"name": "settings"}})
    assert allowed(share)


def test_the_env_configmap_annotation_comes_from_the_mutation_only() -> None:
    def forged(annotations: dict[str, str], **spec: Any) -> dict[str, Any]:
        return pod({"gpufrac.io/env-configmap": "gpufrac-env-cccc", **annotations}, **spec)

    assert denial(forged({}), "env-configmap") == (
        'gpufrac.io/env-configmap="gpufrac-env-cccc": is set on a pod that asks for no GPU; only '
        "gpufrac's mutating webhook sets this annotation; remove it"
    )
    share = {"gpu-fraction": "0.5"}
    assert 'not scheduled by "gpufrac"' in denial(forged(share), "env-configmap")
    assert "(spec.nodeName)" in denial(forged(share, schedulerName="gpufrac", nodeName="n"), "env-configmap")
    for name in ("mine", "gpufrac-env-x/../../../kube-system/configmaps/y"):  # another object's path
        wrong = pod({"gpufrac.io/env-configmap": name, **share}, schedulerName="gpufrac")
        assert 'does not name a gpufrac env ConfigMap ("gpufrac-env-...")' in denial(wrong, "env-configmap")


def test_a_share_pod_for_gpufrac_that_skipped_the_mutation_is_denied() -> None:
    unprepared = pod({"gpu-fraction": "0.5"}, schedulerName="gpufrac")
    assert denial(unprepared, "delivery") == (
        'container "app" asks for a GPU but its last envFrom is not its gpufrac env ConfigMap, without a '
        "prefix and not optional: the pod did not pass gpufrac's mutating webhook, so it would run without "
        "its limits or with GPUs gpufrac did not give it; create it in a namespace the webhook serves, and "
        "leave schedulerName, env, envFrom and the gpufrac.io/env-configmap annotation to gpufrac"
    )
    annotations_only = settings.Policy(env_delivery=EnvDelivery.ANNOTATIONS_ONLY)
    assert denial(unprepared, "gpu-memory-resource", policy=annotations_only).startswith(
        'container "app" requests gpufrac.io/gpu-memory is missing: the pod did not pass'
    )
    assert allowed(mutated(unprepared, annotations_only), policy=annotations_only)
    # A tenant source after gpufrac's would override the devices and limits; a container without a GPU
    # whose last env is not void could take every GPU from a tenant ConfigMap.
    prepared = mutated(pod({"gpu-fraction": "0.5"}, ("app", "side")))
    late = copy.deepcopy(prepared)
    container(late)["envFrom"].append({"configMapRef": {"name": "mine"}})
    assert "its last envFrom is not its gpufrac env ConfigMap" in denial(late, "delivery")
    # Written by hand (a namespace `labelled` mode leaves unmutated), its own ConfigMap under a prefix
    # delivers X_NVIDIA_VISIBLE_DEVICES, which nothing reads, so the image's NVIDIA_VISIBLE_DEVICES=all
    # stands; made optional, the container may start without it.
    for prefixed, optional in ((True, False), (False, True)):
        renamed = copy.deepcopy(prepared)
        own = container(renamed)["envFrom"][-1]
        own.update({"prefix": "X_"} if prefixed else {})
        own["configMapRef"]["optional"] = optional
        assert "its last envFrom is not its gpufrac env ConfigMap" in denial(renamed, "delivery")
    exposed = copy.deepcopy(prepared)
    container(exposed, "side")["env"].append({"name": "A", "value": "1"})
    assert 'container "side" of a GPU pod gets no GPU but its last env is not' in denial(exposed, "delivery")
    assert allowed(prepared)
    # A share pod for another scheduler (KAI, say) is that scheduler's business.
    assert allowed(pod({"gpu-fraction": "0.5"}, schedulerName="kai-scheduler"))


# The MPS pipe directory.


def test_only_the_mutations_volume_mounts_the_mps_directory() -> None:
    sm = mutated(pod({f"{N}app.gpu-memory.request": "8Gi", f"{N}app.gpu-compute.mode": "sm-sharing"}))
    assert allowed(sm)
    sneaky = pod({}, volumes=[{"name": "pipes", "hostPath": {"path": "/var/run/gpufrac/mps/"}}])
    assert denial(sneaky, "mps-host-path") == (
        'volume "pipes" mounts /run/gpufrac/mps from the host, where gpufrac\'s MPS daemons listen: only an '
        "sm-sharing share gets it, from gpufrac; remove the volume"
    )
    below = pod({}, volumes=[{"name": "gpufrac-mps", "hostPath": {"path": "/run/gpufrac/mps/0"}}])
    assert "mounts /run/gpufrac/mps/0" in denial(below, "mps-host-path")
    logs = pod({}, volumes=[{"name": "logs", "hostPath": {"path": "/var/log"}}])
    assert "mounts /var/log from the host" in denial(logs, "host-path")
    data = pod({}, volumes=[{"name": "data", "hostPath": {"path": "/data/var/run/gpufrac/mps"}}])
    operator = settings.Policy(allowed_host_paths=("/var/log/", "/data"))
    assert allowed(logs, policy=operator) and allowed(data, policy=operator)
    below = pod({}, volumes=[{"name": "x", "hostPath": {"path": "/var/log/../../etc"}}])
    assert "mounts /etc from the host" in denial(below, "host-path", policy=operator)
    dotted = pod({}, volumes=[{"name": "up", "hostPath": {"path": "/var/run/x/../gpufrac/mps"}}])
    assert "mounts /run/gpufrac/mps from the host" in denial(dotted, "mps-host-path")


@pytest.mark.parametrize("label", ["gpufrac.io/queue", "kai.scheduler/queue"])
@pytest.mark.parametrize(("was", "now"), [("team-a", "team-b"), ("team-a", None), (None, "team-b")])
def test_a_pods_queue_cannot_change_once_it_exists(label: str, was: str | None, now: str | None) -> None:
    """Relabelled, a running pod would count against another team's queue, making its own look idle."""
    before = bound(mutated(pod({"gpu-fraction": "0.5"})))
    after = bound(before)
    for obj, value in ((before, was), (after, now)):
        obj["metadata"]["labels"] = {"app": "x"} | ({label: value} if value else {})
    assert "a pod's queue cannot change once it exists" in denial(
        after, "queue-change", operation="UPDATE", old=before
    )
    same = bound(before)
    same["metadata"]["labels"]["app"] = "y"  # other labels stay the tenant's
    assert allowed(same, operation="UPDATE", old=before)
    assert allowed(after, operation="UPDATE", old=before, user=SCHEDULER)


# gpufrac.io/gpu-memory: only where the mutation puts it, only what the share counts.

RESOURCE = "gpufrac.io/gpu-memory"


def asking(body: dict[str, Any], name: str, **fields: dict[str, str]) -> dict[str, Any]:
    changed = copy.deepcopy(body)
    target = next(
        c
        for kind in ("containers", "initContainers")
        for c in changed["spec"].get(kind, [])
        if c["name"] == name
    )
    target["resources"] = {**target.get("resources", {}), **fields}
    return changed


def test_gpu_memory_is_counted_only_on_share_containers_and_only_as_much_as_the_share() -> None:
    share = mutated(pod({"gpu-memory": "8Gi"}, ("app", "side")))
    assert allowed(share)
    # Less than the share: past the quota with more than it counts.
    cheap = asking(share, "app", requests={RESOURCE: "1Mi"}, limits={RESOURCE: "1Mi"})
    assert denial(cheap, "gpu-memory-resource") == (
        'container "app" requests gpufrac.io/gpu-memory is 1Mi, but its share counts 8192Mi: remove it; '
        "gpufrac sets it from the share"
    )
    assert "limits gpufrac.io/gpu-memory is 9Gi" in denial(
        asking(share, "app", limits={RESOURCE: "9Gi"}), "gpu-memory-resource"
    )
    assert "is nonsense" in denial(
        asking(share, "app", requests={RESOURCE: "nonsense"}), "gpu-memory-resource"
    )
    # The same amount written another way is the same amount.
    assert allowed(asking(share, "app", requests={RESOURCE: "8Gi"}, limits={RESOURCE: "8589934592"}))
    # On a container without a share (or in any pod without one, for any scheduler), it would take a
    # node's capacity that gpufrac's shares were placed against, and the kubelet would refuse them.
    for squatter in (
        asking(share, "side", requests={RESOURCE: "8Gi"}, limits={RESOURCE: "8Gi"}),
        asking(pod({}), "app", limits={RESOURCE: "80Gi"}),
        asking(pod({}, schedulerName="kai-scheduler"), "app", requests={RESOURCE: "80Gi"}),
    ):
        assert "but it asks for no GPU share: remove it" in denial(squatter, "gpu-memory-resource")
    init = pod({}, initContainers=[{"name": "setup", "resources": {"requests": {RESOURCE: "1Gi"}}}])
    assert 'container "setup" requests gpufrac.io/gpu-memory, but it asks for no GPU share' in denial(
        init, "gpu-memory-resource"
    )
    # A share pod for another scheduler may go without it: gpufrac's mutation left it alone.
    assert allowed(pod({"gpu-fraction": "0.5"}, schedulerName="kai-scheduler"))
