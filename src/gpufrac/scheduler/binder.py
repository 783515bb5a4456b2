"""The three writes of a bind, in the order that keeps a pod from ever running without its limits.

1. Create the pod's env ConfigMaps (gpufrac delivery): owned by the pod, labelled, immutable. The kubelet
   cannot start a container whose `envFrom` names a missing ConfigMap, so the limits arrive first.
2. Write the contract annotations in one merge patch.
3. POST the Binding, with the pod's UID as precondition, so a pod deleted and recreated under the same
   name is never bound to another pod's GPUs.

Any failure undoes what this bind wrote (best effort) and raises `BindError`; the caller releases its
reservation and retries the pod later.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import lightkube
from lightkube import ApiError
from lightkube.core import resource
from lightkube.generic_resource import Generic
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Pod
from lightkube.types import PatchType

from gpufrac.contract import keys
from gpufrac.kubeapi.client import API_ERRORS, build
from gpufrac.scheduler.objects import BindPlan, meta


class BindError(Exception):
    """A bind step failed; the message says which step and why."""


async def bind(client: lightkube.AsyncClient, pod: Mapping[str, Any], node: str, plan: BindPlan) -> None:
    namespace, name, uid = meta(pod)["namespace"], meta(pod)["name"], meta(pod).get("uid")
    created: list[str] = []
    step = "create env ConfigMap"
    try:
        for configmap, data in plan.configmaps.items():
            await _create_configmap(client, pod, configmap, data)
            created.append(configmap)
        step = "annotate"
        if plan.annotations:
            patch = {"metadata": {"annotations": plan.annotations}}
            await client.patch(Pod, name, patch, namespace=namespace, patch_type=PatchType.MERGE)
        step = "bind"
        await post_binding(client, name=name, namespace=namespace, node=node, uid=uid)
    except (BindError, *API_ERRORS) as error:
        await _undo(client, namespace=namespace, name=name, plan=plan, configmaps=created)
        raise BindError(f"{step} failed: {_describe(error)}") from error


class _PodBinding(resource.NamespacedSubResource, Generic):  # type: ignore[misc]
    """`pods/binding`, answered as a plain dict.

    The apiserver answers a Binding with a `Status`, while the OpenAPI schema (and so lightkube's own
    `PodBinding`) says it returns a Binding; lightkube then fails to decode the reply of a binding that
    succeeded.
    """

    _api_info = resource.ApiInfo(
        resource=resource.ResourceDef("", "v1", "Binding"),
        parent=resource.ResourceDef("", "v1", "Pod"),
        plural="pods",
        verbs=["post"],
        action="binding",
    )


async def post_binding(
    client: lightkube.AsyncClient, *, name: str, namespace: str, node: str, uid: str | None = None
) -> None:
    """Bind a pod to a node as a scheduler does. With `uid`, the apiserver refuses to bind a different pod
    that has taken the same name meanwhile."""
    binding = _PodBinding(
        apiVersion="v1",
        kind="Binding",
        metadata=ObjectMeta(name=name, namespace=namespace, uid=uid),
        target={"apiVersion": "v1", "kind": "Node", "name": node},
    )
    await client.create(binding, name, namespace=namespace)


async def _create_configmap(
    client: lightkube.AsyncClient, pod: Mapping[str, Any], name: str, data: Mapping[str, str]
) -> None:
    """Create it; one left by an earlier, interrupted bind of this very pod is replaced, since it may
    name other GPUs. One owned by anything else is never touched: that is a forgery or a collision."""
    namespace = meta(pod)["namespace"]
    body = build(
        ConfigMap,
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {keys.ENV_CONFIGMAP_LABEL: "true"},
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "name": meta(pod)["name"],
                        "uid": meta(pod).get("uid"),
                        "controller": True,
                        "blockOwnerDeletion": False,
                    }
                ],
            },
            "data": dict(data),
            "immutable": True,
        },
    )
    try:
        await client.create(body)
    except ApiError as error:
        if error.status.code != 409:
            raise
        existing = await client.get(ConfigMap, name, namespace=namespace)
        owners = existing.metadata.ownerReferences if existing.metadata else None
        if not any(owner.uid == meta(pod).get("uid") for owner in owners or ()):
            raise BindError(f"ConfigMap {namespace}/{name} exists and does not belong to this pod") from None
        await client.delete(ConfigMap, name, namespace=namespace)
        await client.create(body)


async def _undo(
    client: lightkube.AsyncClient, *, namespace: str, name: str, plan: BindPlan, configmaps: list[str]
) -> None:
    """Best effort: what is left behind is harmless (an unbound pod's annotations are rewritten at the next
    bind, and its ConfigMaps are replaced then or collected with the pod)."""
    for configmap in configmaps:
        with contextlib.suppress(*API_ERRORS):
            await client.delete(ConfigMap, configmap, namespace=namespace)
    try:
        removal = {"metadata": {"annotations": dict.fromkeys(plan.annotations)}}
        await client.patch(Pod, name, removal, namespace=namespace, patch_type=PatchType.MERGE)
    except API_ERRORS:
        pass


def _describe(error: Exception) -> str:
    if isinstance(error, BindError):
        return str(error)
    if isinstance(error, ApiError):
        return f"{error.status.code} {error.status.reason}: {error.status.message}"
    return f"{type(error).__name__}: {error}"
