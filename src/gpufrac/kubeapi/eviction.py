"""Evicting a pod through the `pods/eviction` subresource, which honours PodDisruptionBudgets.

The body is `policy/v1` from Kubernetes 1.22 on and `policy/v1beta1` before; lightkube only knows the
first, and both answer with a `Status` where its schema expects an `Eviction`. So the request is built as a
plain dict, v1 first, and v1beta1 when the server says it does not know v1.
"""

from __future__ import annotations

from typing import Any

import lightkube
from lightkube.core import resource
from lightkube.generic_resource import Generic
from lightkube.models.meta_v1 import ObjectMeta

_VERSIONS = ("v1", "v1beta1")


def _subresource(version: str) -> type[Any]:
    class _Eviction(resource.NamespacedSubResource, Generic):  # type: ignore[misc]
        _api_info = resource.ApiInfo(
            resource=resource.ResourceDef("policy", version, "Eviction"),
            parent=resource.ResourceDef("", "v1", "Pod"),
            plural="pods",
            verbs=["post"],
            action="eviction",
        )

    return _Eviction


_EVICTIONS = {version: _subresource(version) for version in _VERSIONS}
_preferred: list[str] = list(_VERSIONS)


async def evict(
    client: lightkube.AsyncClient,
    name: str,
    *,
    namespace: str,
    uid: str | None = None,
    grace_seconds: int | None = None,
    dry_run: bool = False,
) -> None:
    """Evict the pod (with `dry_run`, only ask whether it may be: a disruption budget is checked, nothing
    is evicted); raises `lightkube.ApiError` when refused (429 while a disruption budget forbids it). With
    `uid`, only that very pod: should the name belong to another pod by now (a StatefulSet's, recreated
    under it), the API server answers 409 Conflict and evicts nothing. With `grace_seconds`, that grace
    period instead of the pod's own."""
    delete_options: dict[str, Any] = {}
    if uid:
        delete_options["preconditions"] = {"uid": uid}
    if grace_seconds is not None:
        delete_options["gracePeriodSeconds"] = grace_seconds
    options = {"deleteOptions": delete_options} if delete_options else {}
    for version in list(_preferred):
        body = _EVICTIONS[version](
            apiVersion=f"policy/{version}",
            kind="Eviction",
            metadata=ObjectMeta(name=name, namespace=namespace),
            **options,
        )
        try:
            await client.create(body, name, namespace=namespace, dry_run=dry_run)
            return
        except lightkube.ApiError as error:
            if version != _preferred[-1] and _unknown_version(error):
                _preferred.remove(version)  # this server never will; ask in the older version from now on
                continue
            raise


def grace_within(own: object, most: int) -> int | None:
    """The grace period to evict a pod with whose own is `own` (its `spec.terminationGracePeriodSeconds`):
    `most` where its own is longer, else None (its own). The grace period is its tenant's to set, and an
    evicted pod holds what it holds until it ends."""
    longer = isinstance(own, int) and not isinstance(own, bool) and own > most
    return most if longer else None


def _unknown_version(error: lightkube.ApiError) -> bool:
    message = (error.status.message or "").lower()
    return error.status.code in (400, 404, 415, 422) and "policy/v1" in message
