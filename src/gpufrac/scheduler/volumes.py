"""Where a pod's persistent volumes let it run, and the claims whose volume is made only once its node is
chosen: kube-scheduler's VolumeBinding, for the volumes GPU pods carry (a notebook's home, a model cache).

- A bound claim: its PersistentVolume's `spec.nodeAffinity.required` (a zonal disk, a local volume) must
  hold on the node, as a required node affinity does.
- An unbound claim of a StorageClass with `volumeBindingMode: WaitForFirstConsumer` (the default classes of
  the big clouds): its provisioner makes the volume where the pod goes, once the claim's
  `volume.kubernetes.io/selected-node` annotation names the node, which `provision` writes before the bind;
  the bind then waits for the volume, and a provisioning that fails places the pod again. The class's
  `allowedTopologies` must hold on the node. A claim already annotated (a bind that failed after it) keeps
  the pod to that node, where its volume may be on the way.
- Anything else waits, saying why: a claim not there (yet: a generic ephemeral volume's is made by a
  controller) or being deleted, one unbound with immediate binding (the volume controller binds it), one
  whose volume is lost, one of a class without a provisioner (pre-made local volumes, which kube-scheduler
  binds by matching volumes to claims and gpufrac does not).

Read when the pod is decided, claim by claim, rather than watched: pods with volumes are a few, and every
claim and volume of a cluster held in memory would cost the scheduler more than these reads.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import lightkube
from lightkube.resources.core_v1 import PersistentVolume, PersistentVolumeClaim
from lightkube.resources.storage_v1 import StorageClass

from gpufrac import contract
from gpufrac.kubeapi.client import READ_ERRORS
from gpufrac.scheduler import affinity, objects

SELECTED_NODE_ANNOTATION = "volume.kubernetes.io/selected-node"
WAIT_FOR_FIRST_CONSUMER = "WaitForFirstConsumer"
NO_PROVISIONER = "kubernetes.io/no-provisioner"
# The most claims a pod may have: each is read on every try, and the pod is the tenant's. No node attaches
# more volumes than this.
MAX_CLAIMS = 128


@dataclass(frozen=True, slots=True)
class Volumes:
    """What a pod's volumes ask of its node: `constraints` that must each hold (each a tuple of terms, ORed,
    as `affinity.matches` takes them); or why it cannot be placed yet (`waits`)."""

    constraints: tuple[tuple[affinity.Term, ...], ...] = ()
    waits: str | None = None


NONE = Volumes()


def claim_names(pod: Mapping[str, Any]) -> list[str]:
    """The PersistentVolumeClaims the pod mounts: those it names, and those of its generic ephemeral
    volumes (`<pod>-<volume>`, made for it by a controller)."""
    found = []
    for volume in objects.pod_volumes(pod):
        claim = volume.get("persistentVolumeClaim")
        if isinstance(claim, Mapping) and isinstance(claim.get("claimName"), str):
            found.append(claim["claimName"])
        elif isinstance(volume.get("ephemeral"), Mapping) and isinstance(volume.get("name"), str):
            found.append(f"{objects.name_of(pod)}-{volume['name']}")
    return found


async def read(client: lightkube.AsyncClient, pod: Mapping[str, Any]) -> Volumes:
    """What the pod's claims ask of its node, read from the API server now."""
    names = claim_names(pod)
    if not names:
        return NONE
    if len(names) > MAX_CLAIMS:
        return Volumes(waits=f"the pod mounts {len(names)} persistent volume claims, more than {MAX_CLAIMS}")
    namespace = objects.meta(pod).get("namespace") or ""
    constraints: list[tuple[affinity.Term, ...]] = []
    try:
        for name in dict.fromkeys(names):
            why = await _claim_constraints(client, namespace, name, constraints)
            if why is not None:
                return Volumes(waits=why)
    except contract.ContractError as error:
        return Volumes(waits=f"unreadable volume of the pod: {error}")
    except READ_ERRORS as error:
        return Volumes(waits=f"cannot read the pod's volumes: {error}")
    return Volumes(tuple(constraints))


async def _claim_constraints(
    client: lightkube.AsyncClient, namespace: str, name: str, constraints: list[tuple[affinity.Term, ...]]
) -> str | None:
    """Add what claim `name` asks of the node to `constraints`; or why the pod must wait for it."""
    what = f"persistentvolumeclaim {namespace}/{name}"
    claim = await _get(client, PersistentVolumeClaim, name, namespace)
    if claim is None:
        return f"{what} not found"
    if objects.terminating(claim):
        return f"{what} is being deleted"
    if objects.text_field(claim, "status", "phase") == "Lost":
        return f"{what} lost its volume"
    volume_name = objects.text_field(claim, "spec", "volumeName")
    if volume_name:
        volume = await _get(client, PersistentVolume, volume_name, None)
        if volume is None:
            return f"persistentvolume {volume_name} of {what} not found"
        required = affinity.field_at(volume, "spec", "nodeAffinity", "required")
        if required is not None:
            where = f"persistentvolume {volume_name} spec.nodeAffinity.required"
            constraints.append(affinity.selector_terms(required, where))
        return None
    class_name = objects.text_field(claim, "spec", "storageClassName")
    storage_class = await _get(client, StorageClass, class_name, None) if class_name else None
    if storage_class is None or storage_class.get("volumeBindingMode") != WAIT_FOR_FIRST_CONSUMER:
        return f"{what} is not bound to a volume yet"
    if storage_class.get("provisioner") == NO_PROVISIONER:
        return (
            f"{what}: gpufrac does not bind pre-made volumes of StorageClass {class_name} (no provisioner); "
            "bind the claim to its volume, or leave the pod to another scheduler"
        )
    selected = objects.annotations_of(claim).get(SELECTED_NODE_ANNOTATION)
    if selected:
        constraints.append(affinity.node_named(selected))
    topologies = storage_class.get("allowedTopologies")
    if topologies:
        where = f"storageclass {class_name} allowedTopologies"
        constraints.append(affinity.topology_terms(topologies, where))
    return None


class NotProvisioned(Exception):
    """A claim was not bound to a volume for the pod's node: the pod is to be placed again."""


# Pauses between reads of the claims whose volumes a bind waits for, the last repeated.
POLL_SECONDS = (0.2, 0.5, 1.0, 2.0, 5.0)


async def provision(
    client: lightkube.AsyncClient,
    pod: Mapping[str, Any],
    node: str,
    *,
    timeout: float,
    gone: Callable[[], bool] = lambda: False,
) -> None:
    """Name `node` on each of the pod's unbound claims that names none yet, so that their provisioner makes
    their volumes there, then wait until every claim is bound to a volume, as kube-scheduler's PreBind
    waits: bound first, a pod whose provisioning fails would stay on a node without its volume. Raises
    `NotProvisioned` when a claim goes, loses the node (its provisioner gave up and asks for another) or
    is not bound within `timeout` seconds, and what the API server raises; returns at once if the pod is
    `gone`."""
    namespace = objects.meta(pod).get("namespace") or ""
    deadline = time.monotonic() + timeout
    pauses = iter(POLL_SECONDS)
    named: set[str] = set()
    while not gone():
        waiting = []
        for name in dict.fromkeys(claim_names(pod)):
            what = f"persistentvolumeclaim {namespace}/{name}"
            claim = await _get(client, PersistentVolumeClaim, name, namespace)
            if claim is None:
                raise NotProvisioned(f"{what} is gone")
            if objects.text_field(claim, "spec", "volumeName"):
                continue
            selected = objects.annotations_of(claim).get(SELECTED_NODE_ANNOTATION)
            if not selected and name not in named:
                change = {"metadata": {"annotations": {SELECTED_NODE_ANNOTATION: node}}}
                await client.patch(PersistentVolumeClaim, name, change, namespace=namespace)
                named.add(name)
            elif selected != node:
                raise NotProvisioned(f"{what} no longer names node {node}: its provisioner could not")
            waiting.append(what)
        if not waiting:
            return
        if time.monotonic() >= deadline:
            raise NotProvisioned(f"{', '.join(waiting)} not bound to a volume within {timeout:g}s")
        await asyncio.sleep(next(pauses, POLL_SECONDS[-1]))


async def _get(
    client: lightkube.AsyncClient, resource: Any, name: str, namespace: str | None
) -> dict[str, Any] | None:
    """The object as plain API data; None when there is none (404)."""
    try:
        found = await client.get(resource, name, namespace=namespace)
    except lightkube.ApiError as error:
        if error.status.code == 404:
            return None
        raise
    return found.to_dict()
