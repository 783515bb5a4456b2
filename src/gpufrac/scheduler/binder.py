"""One bind: the env ConfigMaps, then a single Binding that carries the contract; unclear answers read back.

1. Create the pod's env ConfigMaps (gpufrac delivery): owned by the pod's UID, labelled, immutable. The
   kubelet cannot start a container whose `envFrom` names a missing ConfigMap, so the limits arrive first.
2. POST one Binding carrying the node and the contract annotations (with `keys.BOUND_UID_ANNOTATION`, the
   UID they are granted to). kube-apiserver copies a Binding's annotations onto the pod in the same write
   that sets `nodeName`, so the pod is bound with its contract or not at all: nothing on the pod is ever
   undone, and a tenant's own `gpu-memory.request|limit` or `gpu-compute.mode` is never erased.
3. An answer that does not say what happened (no reply, a 5xx, 409 Conflict, 404, 408, 429) is resolved by
   reading the pod back, never by assuming failure: bound as this Binding would bind it is success; unbound,
   the same Binding is sent again (a first one landing late then meets 409 and is read back too); bound
   otherwise, another bind won; deleted or replaced under its name, the pod is gone.

kube-apiserver v1.20 ignores the Binding's UID, so a Binding for a pod deleted and recreated under the same
name meanwhile binds the successor. The bind is not sent once the watch has reported the pod deleted
(`gone`), and a pod bound with a contract granted to another UID (`objects.misbound`) is deleted by
`unbind_misbound`, with a UID precondition (docs/architecture.md, "The bind").

`BindError` means nothing was bound and the pod may be retried; its subclasses `PodGone` and
`BoundElsewhere` mean it must not be.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import lightkube
from lightkube import ApiError
from lightkube.core import resource
from lightkube.generic_resource import Generic
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Pod

from gpufrac.contract import keys
from gpufrac.kubeapi import events
from gpufrac.kubeapi.client import READ_ERRORS, TRANSPORT_ERRORS, build, delete_exactly
from gpufrac.scheduler.objects import BindPlan, bound_for, holds_binding, meta

# How often one bind sends its Binding while read-backs find the pod still unbound.
BINDING_ATTEMPTS = 3
# Pauses between reads of a pod whose Binding had no clear answer, while the API server does not answer
# either: the reservation stays held meanwhile, since the Binding may have landed.
READ_BACK_DELAYS = (0.0, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
# Answers under 500 that do not say the Binding was refused: read back like a 5xx or no answer. Any other
# 4xx is a refusal.
_UNCLEAR = frozenset({404, 408, 409, 429})


class BindError(Exception):
    """Nothing was bound; the pod may be tried again. The message says which step failed and why."""


class PodGone(BindError):
    """The pod was deleted, or another pod has taken its name: never retry it."""


class BoundElsewhere(BindError):
    """Another bind of the same pod won: `pod` is the pod as read back, to account as bound."""

    def __init__(self, message: str, pod: dict[str, Any]) -> None:
        super().__init__(message)
        self.pod = pod


async def bind(
    client: lightkube.AsyncClient,
    pod: Mapping[str, Any],
    node: str,
    plan: BindPlan,
    *,
    gone: Callable[[], bool] = lambda: False,
) -> None:
    """Bind `pod` to `node` as `plan` says; returns once it is bound so, raises `BindError` otherwise.
    `gone()` tells whether the watch has reported the pod deleted since it was picked."""
    for configmap, data in plan.configmaps.items():
        await _ensure_configmap(client, pod, configmap, data, node=node, plan=plan)
    uid = str(meta(pod).get("uid") or "")
    for _ in range(BINDING_ATTEMPTS):
        if gone():
            raise PodGone("deleted before its Binding was sent")
        try:
            await post_binding(
                client,
                name=meta(pod)["name"],
                namespace=meta(pod)["namespace"],
                node=node,
                uid=uid or None,
                annotations=plan.annotations,
            )
            return
        except ApiError as error:
            code = error.status.code or 500
            if code not in _UNCLEAR and code < 500:
                raise BindError(f"Binding refused: {_describe(error)}") from error
        except TRANSPORT_ERRORS:
            pass
        current = await read_back(client, pod)
        if _settled(current, pod, node=node, plan=plan):
            return
    raise BindError(f"Binding sent {BINDING_ATTEMPTS} times without a clear answer; the pod is still unbound")


def _settled(current: dict[str, Any] | None, pod: Mapping[str, Any], *, node: str, plan: BindPlan) -> bool:
    """What a read-back pod says of a bind: True when it is bound exactly as this bind would bind it, False
    when it is still unbound (the Binding may be sent again); raises `PodGone` or `BoundElsewhere`."""
    uid = str(meta(pod).get("uid") or "")
    if current is None or (uid and meta(current).get("uid") != uid):
        raise PodGone("deleted (or replaced under its name) while it was being bound")
    bound_to = (current.get("spec") or {}).get("nodeName")
    if not bound_to and meta(current).get("deletionTimestamp"):
        raise PodGone("being deleted")
    if not bound_to:
        return False
    if holds_binding(current, uid=uid or str(meta(current).get("uid")), node=node, plan=plan):
        return True
    raise BoundElsewhere(f"bound to {bound_to} by another bind", current)


async def read_back(
    client: lightkube.AsyncClient, pod: Mapping[str, Any], *, delays: Sequence[float] | None = None
) -> dict[str, Any] | None:
    """The pod as the API server has it now (None when there is none), asking after each of `delays`
    (default `READ_BACK_DELAYS`) until it answers; BindError when it never does."""
    error: Exception | None = None
    for delay in READ_BACK_DELAYS if delays is None else delays:
        await asyncio.sleep(delay)
        try:
            found = await client.get(Pod, meta(pod)["name"], namespace=meta(pod)["namespace"])
        except ApiError as failure:
            if failure.status.code == 404:
                return None
            error = failure
        except READ_ERRORS as failure:  # no answer, or one that cannot be read: says nothing of the bind
            error = failure
        else:
            return found.to_dict()
    raise BindError(f"Binding unanswered and the pod cannot be read back: {_describe(error)}")


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
    client: lightkube.AsyncClient,
    *,
    name: str,
    namespace: str,
    node: str,
    uid: str | None = None,
    annotations: Mapping[str, str] | None = None,
) -> None:
    """Bind a pod to a node as a scheduler does, copying `annotations` onto the pod in the same write.

    `uid` is a precondition that kube-apiserver v1.20 ignores (later versions refuse a Binding whose UID is
    not the pod's); sent anyway, since it costs nothing where it is honoured.
    """
    binding = _PodBinding(
        apiVersion="v1",
        kind="Binding",
        metadata=ObjectMeta(name=name, namespace=namespace, uid=uid, annotations=dict(annotations or {})),
        target={"apiVersion": "v1", "kind": "Node", "name": node},
    )
    await client.create(binding, name, namespace=namespace)


# ---- env ConfigMaps ---------------------------------------------------------------------------------------


async def _ensure_configmap(
    client: lightkube.AsyncClient,
    pod: Mapping[str, Any],
    name: str,
    data: Mapping[str, str],
    *,
    node: str,
    plan: BindPlan,
) -> None:
    """Create it, or find it made already for this pod with this data.

    On 409 AlreadyExists: one owned by anything but this pod's UID is never touched (a forgery or a
    collision); one of this pod with this data was made by an earlier attempt whose reply was lost, and is
    reused; one of this pod with other data was made by an earlier bind of this pod that chose other GPUs.
    That one is left alone if the pod is bound (that bind landed, and the ConfigMap is its), and otherwise
    replaced, deleting exactly the object read (UID precondition), never one made since.
    """
    namespace, uid = meta(pod)["namespace"], str(meta(pod).get("uid") or "")
    body = _configmap_body(pod, name, data)
    error: Exception | None = None
    for _ in range(3):
        try:
            await client.create(body)
            return
        except TRANSPORT_ERRORS as failure:
            error = failure  # it may have been made: the next create then says 409, and the check below runs
            continue
        except ApiError as failure:
            if failure.status.code != 409:
                raise BindError(f"create env ConfigMap {name} failed: {_describe(failure)}") from failure
        try:
            existing = (await client.get(ConfigMap, name, namespace=namespace)).to_dict()
        except READ_ERRORS as failure:
            error = failure
            continue
        if not _owned_by(existing, uid):
            raise BindError(
                f"ConfigMap {namespace}/{name} exists and does not belong to this pod; left alone"
            )
        if existing.get("data") == dict(data) and existing.get("immutable"):
            return
        current = await read_back(client, pod)
        if _settled(current, pod, node=node, plan=plan) and current is not None:
            raise BoundElsewhere("bound already, by an earlier bind of this pod", current)
        try:
            await delete_exactly(client, ConfigMap, name, namespace=namespace, uid=meta(existing)["uid"])
        except ApiError as failure:
            if failure.status.code not in (404, 409):  # 409: replaced since it was read, by someone else
                raise BindError(f"replace env ConfigMap {name} failed: {_describe(failure)}") from failure
        except TRANSPORT_ERRORS as failure:
            error = failure
    raise BindError(f"create env ConfigMap {name} failed: {_describe(error)}")


def _configmap_body(pod: Mapping[str, Any], name: str, data: Mapping[str, str]) -> ConfigMap:
    return build(
        ConfigMap,
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "namespace": meta(pod)["namespace"],
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


def _owned_by(configmap: Mapping[str, Any], uid: str) -> bool:
    owners = meta(configmap).get("ownerReferences") or []
    return bool(uid) and any(o.get("kind") == "Pod" and o.get("uid") == uid for o in owners)


# ---- a pod bound with another pod's contract --------------------------------------------------------------


async def unbind_misbound(client: lightkube.AsyncClient, pod: Mapping[str, Any], *, component: str) -> bool:
    """Delete a pod that a Binding meant for its same-name predecessor bound (`objects.misbound`), with a
    Warning Event saying why. True when settled (deleted, or gone already); False to try again later.

    A bound pod cannot be unbound, and left alone it would run with GPUs it was never granted (and, with
    ConfigMap delivery, wait forever for env ConfigMaps made for its predecessor).
    """
    message = (
        f"deleted by {component}: bound by a Binding meant for pod UID {bound_for(pod)}, which this pod "
        "replaced under the same name while it was being bound, so its GPU contract is not its own; "
        "create it again to have it scheduled"
    )
    return await delete_pod(client, pod, component=component, reason="BoundToAnotherPod", message=message)


async def delete_pod(
    client: lightkube.AsyncClient,
    pod: Mapping[str, Any],
    *,
    component: str,
    reason: str = "",
    message: str = "",
) -> bool:
    """Delete `pod`, only that very pod (UID precondition: should its name belong to another pod by now,
    nothing is deleted), and record a Warning Event with `reason` and `message` when given. True when
    settled (deleted, gone already, or the name taken by another pod); False to try again later."""
    namespace, name, uid = meta(pod)["namespace"], meta(pod)["name"], str(meta(pod).get("uid"))
    try:
        await delete_exactly(client, Pod, name, namespace=namespace, uid=uid)
    except ApiError as error:
        return error.status.code in (404, 409)
    except TRANSPORT_ERRORS:
        return False
    if reason:
        involved = {"kind": "Pod", "name": name, "namespace": namespace, "uid": uid}
        await events.record(
            client, events.warning(involved=involved, reason=reason, message=message, component=component)
        )
    return True


def _describe(error: Exception | None) -> str:
    if isinstance(error, ApiError):
        return f"{error.status.code} {error.status.reason}: {error.status.message}"
    return f"{type(error).__name__}: {error}"
