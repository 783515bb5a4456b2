"""AdmissionReviews as the apiserver sends them, the pods in them, and the JSONPatch the apiserver applies."""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Mapping, Sequence
from typing import Any

from hypothesis import strategies as st

from gpufrac import admission
from gpufrac.admission import exchange, mutation, settings

TENANT = "tenant"
SCHEDULER = settings.DEFAULT_SCHEDULER_IDENTITY
POLICY = settings.Policy()
NAME = "gpufrac-env-0123456789abcdef"
N = "nvidia.com/container."


def pod(
    annotations: Mapping[str, object] | None = None,
    containers: Sequence[str] = ("app",),
    **spec: Any,
) -> dict[str, Any]:
    """A pod as the API holds it after defaulting: `default-scheduler`, containers named `containers`."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "team", "annotations": dict(annotations or {})},
        "spec": {
            "schedulerName": "default-scheduler",
            "containers": [{"name": name, "image": "busybox"} for name in containers],
            **spec,
        },
    }


def container(pod: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    """The container `name` of `pod` (default: the first), to change in place."""
    containers: list[dict[str, Any]] = pod["spec"]["containers"]
    return next(c for c in containers if name is None or c["name"] == name)


def review(
    obj: Mapping[str, Any] | None,
    *,
    operation: str = "CREATE",
    resource: str = "pods",
    sub_resource: str = "",
    user: str = TENANT,
    old: Mapping[str, Any] | None = None,
    namespace: str = "team",
    name: str = "",
    uid: str = "0d5bd2ea-5a2c-4b8c-9a2e-6c3d0e1f2a3b",
) -> dict[str, Any]:
    resource, _, group = resource.partition(".")  # "queues.gpufrac.io": as the API server sends it
    request: dict[str, Any] = {
        "uid": uid,
        "kind": {"group": group, "version": "v1", "kind": "ConfigMap" if resource == "configmaps" else "Pod"},
        "resource": {"group": group, "version": "v1", "resource": resource},
        "operation": operation,
        "namespace": namespace,
        "name": name,
        "userInfo": {"username": user, "groups": ["system:authenticated"]},
        "object": obj,
        "oldObject": old,
        "dryRun": False,
    }
    if sub_resource:
        request["subResource"] = sub_resource
    return {"apiVersion": exchange.API_VERSION, "kind": "AdmissionReview", "request": request}


def request(obj: Mapping[str, Any] | None, **fields: Any) -> exchange.Request:
    return exchange.read_review(json.dumps(review(obj, **fields)).encode())


def validate(
    obj: Mapping[str, Any] | None,
    policy: settings.Policy = POLICY,
    *,
    trusted_namespace: bool = True,
    **fields: Any,
) -> exchange.Decision:
    """The validation of `obj`, by default in a namespace of the trusted tier (the tier's own tests say
    otherwise)."""
    return admission.validate(request(obj, **fields), policy, trusted_namespace=trusted_namespace)


def mutate(
    obj: Mapping[str, Any],
    policy: settings.Policy = POLICY,
    *,
    trusted_namespace: bool = True,
    **fields: Any,
) -> exchange.Decision:
    return mutation.mutate(
        request(obj, **fields), policy, configmap_name=NAME, trusted_namespace=trusted_namespace
    )


def mutated(obj: Mapping[str, Any], policy: settings.Policy = POLICY, **fields: Any) -> dict[str, Any]:
    """`obj` as the apiserver stores it after the mutation."""
    return apply_patch(obj, mutate(obj, policy, **fields).patch)


def denial(obj: dict[str, Any] | None, rule: str, **fields: Any) -> str:
    decision = validate(obj, **fields)
    assert not decision.allowed, "expected a denial"
    assert decision.rule == rule, decision.message
    assert decision.code == 403
    return decision.message


def allowed(obj: dict[str, Any] | None, **fields: Any) -> bool:
    decision = validate(obj, **fields)
    assert decision.allowed, decision.message
    return True


def configmap(name: str = "gpufrac-env-dddd-app", **metadata: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, **metadata},
        "data": {"A": "1"},
    }


def decoded_patch(response: Mapping[str, Any]) -> list[dict[str, Any]]:
    patch: list[dict[str, Any]] = json.loads(base64.b64decode(response["patch"]))
    return patch


def apply_patch(document: Mapping[str, Any], patch: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """RFC 6902 `add` and `replace`, the only operations the webhook emits, with RFC 6901 pointers."""
    result = copy.deepcopy(dict(document))
    for operation in patch:
        assert operation["op"] in ("add", "replace"), operation
        tokens = [t.replace("~1", "/").replace("~0", "~") for t in operation["path"].split("/")[1:]]
        parent: Any = result
        for token in tokens[:-1]:
            parent = parent[int(token)] if isinstance(parent, list) else parent[token]
        last, value = tokens[-1], copy.deepcopy(operation["value"])
        if isinstance(parent, list):
            if last == "-":
                assert operation["op"] == "add"
                parent.append(value)
            elif operation["op"] == "add":
                parent.insert(int(last), value)
            else:
                parent[int(last)] = value
        else:
            assert operation["op"] == "add" or last in parent, operation
            parent[last] = value
    return result


# Valid pods of every form, for properties: the contract reads each one without error.

names = st.sampled_from(["app", "main", "sidecar", "trainer"])
quantities = st.sampled_from(["512Mi", "1Gi", "8Gi", "20480Mi", "1000M"])
modes = st.sampled_from([None, "time-slicing", "sm-sharing"])


@st.composite
def share_pods(draw: st.DrawFn) -> dict[str, Any]:
    containers = draw(st.lists(names, min_size=1, max_size=3, unique=True))
    annotations: dict[str, str] = {}
    if draw(st.booleans()):
        if draw(st.booleans()):
            annotations["gpu-fraction"] = draw(st.sampled_from(["0.1", "0.25", "0.5", "0.75"]))
            if draw(st.booleans()):
                annotations["gpu-fraction.limit"] = "0.9"
        else:
            annotations["gpu-memory"] = draw(st.sampled_from(["4096", "8Gi"]))
        if draw(st.booleans()):
            annotations["gpu-fraction-container-name"] = draw(st.sampled_from(containers))
        if draw(st.booleans()):
            annotations["gpu-fraction-num-devices"] = draw(st.sampled_from(["1", "2"]))
    kai = annotations.get("gpu-fraction-container-name", containers[0]) if annotations else None
    for name in containers:
        if name != kai and draw(st.booleans()):
            annotations[f"{N}{name}.gpu-memory.request"] = draw(quantities)
        if (name == kai or f"{N}{name}.gpu-memory.request" in annotations) and (mode := draw(modes)):
            annotations[f"{N}{name}.gpu-compute.mode"] = mode
    if draw(st.booleans()):
        annotations["team"] = "a"
    result = pod(annotations, containers)
    if draw(st.booleans()):
        result["spec"]["volumes"] = [{"name": "data", "emptyDir": {}}]
    for name in containers:
        if draw(st.booleans()):
            container(result, name)["envFrom"] = [{"configMapRef": {"name": "settings"}}]
        if draw(st.booleans()):
            container(result, name)["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
    if not annotations.keys() - {"team"}:
        del result["metadata"]["annotations"]
    return result
