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
- kube-scheduler's VolumeRestrictions for ReadWriteOncePod: a claim whose `spec.accessModes` (the modes
  asked, as kube-scheduler reads them, bound or not) has `ReadWriteOncePod` keeps the pod waiting while
  another placed pod (bound or being bound, any scheduler's) mounts it, until that pod is gone: the kubelet
  would refuse the second mount, and the pod would sit in ContainerCreating holding its GPU share. Judged
  once every claim is read, against the cache as the pod is decided, and looked up in the cache's index of
  placed pods by claim (`PodIndex.mounting`), not by scanning them. kube-scheduler judges only the claims
  a pod names; a generic ephemeral volume's claim is judged too, since a second mount of it fails the same.

Read when the pod is decided rather than watched: pods with volumes are a few, and every claim and volume
of a cluster held in memory would cost the scheduler more than these reads. The claims of a pod are read
`READS_AT_ONCE` at a time (and each StorageClass once), since the scheduler decides one pod at a time: a
tenant's pod of many claims read one by one would hold every other pod up for as many round trips.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import lightkube
from lightkube.resources.core_v1 import PersistentVolume, PersistentVolumeClaim
from lightkube.resources.storage_v1 import StorageClass

from gpufrac import contract
from gpufrac.contract.errors import brief
from gpufrac.kubeapi import fields
from gpufrac.kubeapi.client import READ_ERRORS
from gpufrac.scheduler import affinity, objects

if TYPE_CHECKING:
    from gpufrac.scheduler.cache import SchedulerCache

SELECTED_NODE_ANNOTATION = "volume.kubernetes.io/selected-node"
WAIT_FOR_FIRST_CONSUMER = "WaitForFirstConsumer"
NO_PROVISIONER = "kubernetes.io/no-provisioner"
READ_WRITE_ONCE_POD = "ReadWriteOncePod"
# The most claims a pod may have: each is read on every try, and the pod is the tenant's. No node attaches
# more volumes than this.
MAX_CLAIMS = 128
# Reads of one pod's claims (and their volumes and classes) in flight at once.
READS_AT_ONCE = 16


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


async def read(client: lightkube.AsyncClient, pod: Mapping[str, Any], cache: SchedulerCache) -> Volumes:
    """What the pod's claims ask of its node, read from the API server now, with the pods `cache` has
    placed. Where several claims make the pod wait, it says why for the first the pod names."""
    names = claim_names(pod)
    if not names:
        return NONE
    if len(names) > MAX_CLAIMS:
        return Volumes(waits=f"the pod mounts {len(names)} persistent volume claims, more than {MAX_CLAIMS}")
    if why := _misnamed(names):
        return Volumes(waits=why)
    reader = _Reader(client, objects.meta(pod).get("namespace") or "")
    unique = list(dict.fromkeys(names))
    found = await asyncio.gather(*(reader.claim_constraints(name) for name in unique))
    constraints: list[tuple[affinity.Term, ...]] = []
    for name, terms in zip(unique, found, strict=True):
        if isinstance(terms, str):
            return Volumes(waits=terms)
        if name in reader.read_write_once_pod and (user := _other_user(cache, pod, reader.namespace, name)):
            return Volumes(
                waits=f"persistentvolumeclaim {reader.namespace}/{name} has access mode "
                f"{READ_WRITE_ONCE_POD} and pod {user} uses it"
            )
        constraints += terms
    return Volumes(tuple(constraints))


def _other_user(cache: SchedulerCache, pod: Mapping[str, Any], namespace: str, claim: str) -> str | None:
    """The namespace/name of a pod placed besides `pod` that mounts the claim; None when none does. Found in
    the cache's index by claim (a ReadWriteOncePod claim has one such pod at most), so that a decision costs
    the same however many pods are placed."""
    uid = objects.pod_uid(pod)
    other = next((user for user in cache.pods.mounting.get((namespace, claim), ()) if user != uid), None)
    return None if other is None else cache.names.get(other, other)


class _Reader:
    """The reads of one pod's claims, `READS_AT_ONCE` in flight, each StorageClass read once. The claims
    that ask for `ReadWriteOncePod` are noted in `read_write_once_pod`, for `read` to judge once every read
    is done: the cache changes while reads are awaited."""

    def __init__(self, client: lightkube.AsyncClient, namespace: str) -> None:
        self.client, self.namespace = client, namespace
        self.slots = asyncio.Semaphore(READS_AT_ONCE)
        self.classes: dict[str, asyncio.Task[dict[str, Any] | None]] = {}
        self.read_write_once_pod: set[str] = set()

    async def get(self, resource: Any, name: str, namespace: str | None) -> dict[str, Any] | None:
        async with self.slots:
            return await _get(self.client, resource, name, namespace)

    async def storage_class(self, name: str) -> dict[str, Any] | None:
        if name not in self.classes:
            self.classes[name] = asyncio.ensure_future(self.get(StorageClass, name, None))
        return await self.classes[name]

    async def claim_constraints(self, name: str) -> list[tuple[affinity.Term, ...]] | str:
        """What claim `name` asks of the node; or why the pod must wait for it."""
        try:
            return await self._claim_constraints(name)
        except contract.ContractError as error:
            return f"unreadable volume of the pod: {error}"
        except READ_ERRORS as error:
            return f"cannot read the pod's volumes: {error}"

    async def _claim_constraints(self, name: str) -> list[tuple[affinity.Term, ...]] | str:
        what = f"persistentvolumeclaim {self.namespace}/{name}"
        claim = await self.get(PersistentVolumeClaim, name, self.namespace)
        if claim is None:
            return f"{what} not found"
        if objects.terminating(claim):
            return f"{what} is being deleted"
        if objects.text_field(claim, "status", "phase") == "Lost":
            return f"{what} lost its volume"
        if READ_WRITE_ONCE_POD in (affinity.field_at(claim, "spec", "accessModes") or ()):
            self.read_write_once_pod.add(name)
        volume_name = objects.text_field(claim, "spec", "volumeName")
        if volume_name:
            volume = await self.get(PersistentVolume, volume_name, None)
            if volume is None:
                return f"persistentvolume {volume_name} of {what} not found"
            required = affinity.field_at(volume, "spec", "nodeAffinity", "required")
            if required is None:
                return []
            return [
                affinity.selector_terms(
                    required, f"persistentvolume {volume_name} spec.nodeAffinity.required"
                )
            ]
        class_name = objects.text_field(claim, "spec", "storageClassName")
        storage_class = await self.storage_class(class_name) if class_name else None
        if storage_class is None or storage_class.get("volumeBindingMode") != WAIT_FOR_FIRST_CONSUMER:
            return f"{what} is not bound to a volume yet"
        if storage_class.get("provisioner") == NO_PROVISIONER:
            return (
                f"{what}: gpufrac does not bind pre-made volumes of StorageClass {class_name} "
                "(no provisioner); bind the claim to its volume, or leave the pod to another scheduler"
            )
        constraints = []
        selected = objects.annotations_of(claim).get(SELECTED_NODE_ANNOTATION)
        if selected:
            constraints.append(affinity.node_named(selected))
        topologies = storage_class.get("allowedTopologies")
        if topologies:
            constraints.append(
                affinity.topology_terms(topologies, f"storageclass {class_name} allowedTopologies")
            )
        return constraints


def _misnamed(names: list[str]) -> str | None:
    """Why the claims cannot be read: one named by no object name (its name goes into the request's path,
    where `../` would reach another namespace's claims)."""
    bad = next((name for name in names if not fields.is_object_name(name)), None)
    return (
        None
        if bad is None
        else f"persistentvolumeclaim name {json.dumps(brief(bad))} is not a valid object name"
    )


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
    names = claim_names(pod)
    if why := _misnamed(names):  # `read` let no such pod be placed
        raise NotProvisioned(why)
    while not gone():
        waiting = []
        for name in dict.fromkeys(names):
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
