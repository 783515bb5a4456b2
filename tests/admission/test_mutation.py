"""The mutating webhook: what it adds to a share pod, what it leaves alone, and that the contract reads the
mutated pod exactly as it read the original."""

from __future__ import annotations

from typing import Any

from hypothesis import given

from gpufrac.admission import mutation, settings
from gpufrac.contract import EnvDelivery, parse_pod

from .reviews import (
    NAME,
    POLICY,
    SCHEDULER,
    apply_patch,
    container,
    mutate,
    mutated,
    pod,
    request,
    share_pods,
    validate,
)

N = "nvidia.com/container."
RESOURCE = "gpufrac.io/gpu-memory"


def env_from(name: str) -> dict[str, Any]:
    return {"configMapRef": {"name": name, "optional": False}}


def test_a_kai_share_pod_is_routed_made_explicit_and_given_its_env_configmap() -> None:
    original = pod({"gpu-fraction": "0.5"})
    assert list(mutate(original).patch) == [
        {"op": "add", "path": "/spec/schedulerName", "value": "gpufrac"},
        {
            "op": "add",
            "path": "/metadata/annotations/nvidia.com~1container.app.gpu-compute.mode",
            "value": "time-slicing",
        },
        {"op": "add", "path": "/metadata/annotations/gpu-fraction-container-name", "value": "app"},
        {"op": "add", "path": "/metadata/annotations/gpufrac.io~1env-configmap", "value": NAME},
        {"op": "add", "path": "/spec/containers/0/envFrom", "value": [env_from(f"{NAME}-app")]},
        {"op": "add", "path": "/spec/containers/0/resources", "value": {}},
        {"op": "add", "path": "/spec/containers/0/resources/requests", "value": {RESOURCE: "40960Mi"}},
        {"op": "add", "path": "/spec/containers/0/resources/limits", "value": {RESOURCE: "40960Mi"}},
    ]
    after = mutated(original)
    assert parse_pod(after) == parse_pod(original)
    assert validate(after).allowed


def test_the_env_configmap_comes_last_after_the_pods_own_sources() -> None:
    original = pod({"gpu-memory": "8Gi"})
    container(original)["envFrom"] = [{"configMapRef": {"name": "settings"}}]
    after = mutated(original)
    assert container(after)["envFrom"] == [{"configMapRef": {"name": "settings"}}, env_from(f"{NAME}-app")]
    assert parse_pod(after) == parse_pod(original)


def test_every_gpu_container_gets_its_own_configmap_and_sm_sharing_the_mps_directory() -> None:
    original = pod(
        {
            f"{N}train.gpu-memory.request": "8Gi",
            f"{N}train.gpu-compute.mode": "sm-sharing",
            f"{N}serve.gpu-memory.request": "4Gi",
        },
        ("train", "serve", "whole", "log"),
        volumes=[{"name": "data", "emptyDir": {}}],
    )
    container(original, "whole")["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    container(original, "train")["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
    after = mutated(original)
    assert container(after, "train")["envFrom"] == [env_from(f"{NAME}-train")]
    assert container(after, "serve")["envFrom"] == [env_from(f"{NAME}-serve")]
    assert container(after, "whole")["envFrom"] == [env_from(f"{NAME}-whole")]
    assert "envFrom" not in container(after, "log")
    mps = {"name": "gpufrac-mps", "mountPath": "/run/gpufrac/mps"}
    assert container(after, "train")["volumeMounts"] == [{"name": "data", "mountPath": "/data"}, mps]
    assert "volumeMounts" not in container(after, "serve")
    assert after["spec"]["volumes"] == [
        {"name": "data", "emptyDir": {}},
        {"name": "gpufrac-mps", "hostPath": {"path": "/run/gpufrac/mps", "type": "DirectoryOrCreate"}},
    ]
    annotations = after["metadata"]["annotations"]
    assert annotations[f"{N}serve.gpu-compute.mode"] == "time-slicing"
    assert annotations[f"{N}train.gpu-compute.mode"] == "sm-sharing"
    assert "gpu-fraction-container-name" not in annotations
    assert parse_pod(after) == parse_pod(original)
    assert validate(after).allowed


def test_a_volume_the_pod_named_like_gpufracs_is_replaced() -> None:
    original = pod(
        {f"{N}app.gpu-memory.request": "8Gi", f"{N}app.gpu-compute.mode": "sm-sharing"},
        volumes=[{"name": "gpufrac-mps", "emptyDir": {}}],
    )
    assert mutated(original)["spec"]["volumes"] == [
        {"name": "gpufrac-mps", "hostPath": {"path": "/run/gpufrac/mps", "type": "DirectoryOrCreate"}}
    ]


def test_a_forged_configmap_annotation_is_overwritten() -> None:
    original = pod({"gpu-fraction": "0.5", "gpufrac.io/env-configmap": "gpufrac-env-victim"})
    assert mutated(original)["metadata"]["annotations"]["gpufrac.io/env-configmap"] == NAME


def test_pods_the_mutation_leaves_alone() -> None:
    share = {"gpu-fraction": "0.5"}
    whole = pod({})
    container(whole)["resources"] = {"limits": {"nvidia.com/gpu": "2"}}
    cases: list[tuple[dict[str, Any], dict[str, Any]]] = [
        (pod({}), {}),
        (whole, {}),
        (pod({"gpu-fraction": "2"}), {}),  # broken: the validating webhook says why
        (pod(share, schedulerName="kai-scheduler"), {}),
        (pod(share, nodeName="node-1"), {}),
        (pod(share), {"namespace": "kube-system"}),
        (pod(share), {"operation": "UPDATE", "old": pod(share)}),
        (pod(share), {"resource": "configmaps"}),
        (pod(share), {"sub_resource": "ephemeralcontainers", "operation": "UPDATE"}),
    ]
    for untouched, fields in cases:
        decision = mutate(untouched, **fields)
        assert decision.allowed and decision.patch == (), (untouched, fields)


def test_a_pod_already_for_gpufrac_is_prepared_all_the_same() -> None:
    after = mutated(pod({"gpu-fraction": "0.5"}, schedulerName="gpufrac"))
    assert after["spec"]["schedulerName"] == "gpufrac"
    assert container(after)["envFrom"] == [env_from(f"{NAME}-app")]


def test_annotations_only_delivery_adds_no_configmap() -> None:
    policy = settings.Policy(env_delivery=EnvDelivery.ANNOTATIONS_ONLY, scheduler_name="fractions")
    after = mutated(pod({"gpu-fraction": "0.5"}), policy)
    assert after["spec"]["schedulerName"] == "fractions"
    assert "gpufrac.io/env-configmap" not in after["metadata"]["annotations"]
    assert "envFrom" not in container(after)
    assert validate(after, policy).allowed


def test_the_mutation_does_not_depend_on_who_creates_the_pod() -> None:
    assert (
        mutate(pod({"gpu-fraction": "0.5"}), user=SCHEDULER).patch
        == mutate(pod({"gpu-fraction": "0.5"})).patch
    )


# Any valid share pod: the mutation keeps its request, and the result passes validation.


@given(share_pods())
def test_the_mutated_pod_asks_for_exactly_what_the_pod_asked_for(original: dict[str, Any]) -> None:
    before = parse_pod(original)
    decision = mutation.mutate(request(original), POLICY, configmap_name=NAME, trusted_namespace=True)
    after = apply_patch(original, decision.patch)
    assert parse_pod(after) == before
    if before.shares:
        assert after["spec"]["schedulerName"] == "gpufrac"
        decision = validate(after)
        assert decision.allowed, decision.message
        for share in before.shares:
            assert env_from(f"{NAME}-{share.container}") in container(after, share.container)["envFrom"]
    else:
        assert decision.patch == ()


# `gpufrac.io/gpu-memory`: what a ResourceQuota and the kubelet count.


def limits_of(after: dict[str, Any], name: str = "app") -> tuple[object, object]:
    resources = container(after, name)["resources"]
    return resources["requests"].get(RESOURCE), resources["limits"].get(RESOURCE)


def test_each_share_container_requests_what_its_share_is_guaranteed() -> None:
    memory = mutated(pod({f"{N}app.gpu-memory.request": "6Gi", f"{N}app.gpu-memory.limit": "8Gi"}))
    assert limits_of(memory) == ("6144Mi", "6144Mi")  # the request: what is guaranteed, not the limit
    spread = mutated(pod({"gpu-memory": "4000", "gpu-fraction-num-devices": "2"}))
    assert limits_of(spread) == ("8000Mi", "8000Mi")  # on each of its devices
    # A fraction counts on the reference GPU (80 GiB unless the webhook is told otherwise).
    assert limits_of(mutated(pod({"gpu-fraction": "0.25"}))) == ("20480Mi", "20480Mi")
    small = settings.Policy(fraction_reference_mib=24_000)
    assert limits_of(mutated(pod({"gpu-fraction": "0.25"}), small)) == ("6000Mi", "6000Mi")
    # Tiny fractions still count: a resource of 0 would let any number of them past a quota.
    assert limits_of(mutated(pod({"gpu-fraction": "0.00001"}))) == ("1Mi", "1Mi")


def test_the_resource_joins_what_the_container_already_asks_and_replaces_a_tenants_own_value() -> None:
    original = pod({"gpu-memory": "8Gi"}, ("app", "side"))
    container(original)["resources"] = {"requests": {"cpu": "1", RESOURCE: "1Mi"}}
    after = mutated(original)
    assert container(after)["resources"] == {
        "requests": {"cpu": "1", RESOURCE: "8192Mi"},
        "limits": {RESOURCE: "8192Mi"},
    }
    assert "resources" not in container(after, "side")
    assert validate(after).allowed
