"""The reservation keeper: which reservation pods to create and delete, and which shares to take off a GPU
they lost, on device-plugin nodes (see `devices` and `reservations`). Decisions only: `tend` returns
what to do and the scheduling loop does it, so tests drive it on a cache without an API server.

It converges from whatever it finds, which is what makes a restart of the scheduler or of the agent, or a
reservation deleted by hand, safe:

- a reservation whose GPU holds no share and that no pending pod waits for is deleted after
  `idle_seconds`, so a GPU goes back to the device plugin once its last share leaves;
- a reservation the kubelet never gave a GPU to (still unpublished after `stuck_seconds`, pods waiting
  for it or not: they then decide again) or refused (Failed) is deleted;
- a GPU that holds shares but no reservation (one was deleted by hand, or evicted) is held again: one new
  reservation for every free GPU of its node at once, since the kubelet, not gpufrac, picks the GPU each
  gets; the ones that land elsewhere are idle, and go;
- a GPU holding shares that the device plugin gave to another pod meanwhile is a double booking gpufrac
  can only end on its side: those share pods are deleted, to be created again and placed elsewhere by
  their controllers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpufrac import retrying
from gpufrac.scheduler import objects
from gpufrac.scheduler.cache import SchedulerCache
from gpufrac.scheduler.devices import Hold

Obj = Mapping[str, Any]
_NODE = "node/"  # a node's key among the refusals, apart from pod UIDs


@dataclass(frozen=True)
class Actions:
    create: dict[str, int] = field(default_factory=dict)  # node -> reservations to create there
    delete: list[Obj] = field(default_factory=list)  # reservation pods to delete
    evict: list[tuple[Obj, str]] = field(default_factory=list)  # share pods to delete, and why


class ReservationKeeper:
    def __init__(self, *, idle_seconds: float = 10.0, stuck_seconds: float = 120.0) -> None:
        self.idle_seconds = idle_seconds
        self.stuck_seconds = stuck_seconds
        self.awaiting: dict[str, set[str]] = {}  # pending pod uid -> reservation uids it waits for
        self.failed: dict[str, Obj] = {}  # reservation uid -> a finished reservation still to delete
        self._first_seen: dict[str, float] = {}  # reservation uid -> when the keeper first saw it
        self._idle_since: dict[str, float] = {}
        self._asked: set[str] = set()  # reservation and share pod uids whose deletion is under way
        self._tended_at: float | None = None
        # A node's creates, or a pod's deletion, refused lately: asked again after a backoff.
        self._refusals = retrying.Backoffs(first=1.0, ceiling=60.0)

    def due(self, now: float, *, every: float = 0.5) -> bool:
        """Whether to tend now: at most every `every` seconds, since a burst runs many rounds a second and
        each tend reads every reservation and device-plugin node."""
        if self._tended_at is not None and now - self._tended_at < every:
            return False
        self._tended_at = now
        return True

    def waits(self, cache: SchedulerCache, uid: str) -> bool:
        """Whether pending pod `uid` still waits for a reservation of its own to be given a GPU; forgets the
        ones that were (or are gone)."""
        waiting = {
            r for r in self.awaiting.get(uid, ()) if r in cache.reservations and not _published(cache, r)
        }
        if waiting:
            self.awaiting[uid] = waiting
        else:
            self.awaiting.pop(uid, None)
        return bool(waiting)

    def forget_pod(self, uid: str) -> None:
        self.awaiting.pop(uid, None)

    def finished(self, pod: Obj) -> None:
        """A reservation pod ended (the kubelet refused it, say): it must still be deleted."""
        if not objects.terminating(pod):
            self.failed[objects.pod_uid(pod)] = pod

    def retry(self, uid: str, *, now: float) -> None:
        """A deletion this keeper asked for did not go through: ask again after a backoff."""
        self._asked.discard(uid)
        self._refusals.refused(uid, now=now)

    def created(self, node: str, *, ok: bool, now: float) -> None:
        """A reservation create on `node` went through, or not; after a refusal, asked again after a backoff
        (tending runs twice a second, for each free GPU of each node)."""
        if ok:
            self._refusals.forget(_NODE + node)
        else:
            self._refusals.refused(_NODE + node, now=now)

    def _busy(self, uid: str, now: float) -> bool:
        """Whether a pod's deletion is under way, or waits out a backoff after a refusal."""
        return uid in self._asked or self._refusals.waiting(uid, now=now)

    def deleted(self, uid: str) -> None:
        for table in (self.failed, self._first_seen, self._idle_since):
            table.pop(uid, None)
        self._refusals.forget(uid)
        self._asked.discard(uid)

    def tend(self, cache: SchedulerCache, now: float) -> Actions:
        actions = Actions()
        awaited = {r for waiting in self.awaiting.values() for r in waiting}
        for uid, pod in list(self.failed.items()):
            if not self._busy(uid, now):
                actions.delete.append(pod)
                self._asked.add(uid)
        self._first_seen = {uid: self._first_seen.get(uid, now) for uid in cache.reservations}
        self._idle_since = {uid: t for uid, t in self._idle_since.items() if uid in cache.reservations}
        unpublished_on: set[str] = set()  # nodes with a reservation the kubelet's answer is awaited for
        for uid, pod in cache.reservations.items():
            held = _reserved_gpu(cache, uid)
            if held is None:
                unpublished_on.add(objects.node_name(pod))
            if self._busy(uid, now):
                continue
            if held is None:
                # Stuck even if pods wait for it: they would wait for ever; with it gone they decide again.
                if now - self._first_seen[uid] >= self.stuck_seconds:
                    actions.delete.append(pod)
                    self._asked.add(uid)
                continue
            where, index = cache.state.index[held[0]], held[1]
            if uid in awaited or cache.state.gpu_tenants[where, index] or cache.state.gpu_whole[where, index]:
                self._idle_since.pop(uid, None)
                continue
            if now - self._idle_since.setdefault(uid, now) >= self.idle_seconds:
                actions.delete.append(pod)
                self._asked.add(uid)
        for node, view in cache.devices.items():
            found = cache.state.index.get(node)
            if found is None or not cache.state.active[found]:
                continue
            row = found
            shared = [gpu for gpu in range(len(view.holds)) if cache.state.gpu_tenants[row, gpu]]
            unheld = [gpu for gpu in shared if view.holds[gpu] in (Hold.FREE, Hold.PENDING, Hold.CLAIMED)]
            waiting = self._refusals.waiting(_NODE + node, now=now)
            # Each reservation is a pod: as many as the kubelet still takes there (it would refuse the rest).
            slots = min(view.count(Hold.FREE), max(int(cache.state.pods_free[row]), 0))
            if unheld and node not in unpublished_on and slots and not waiting:
                actions.create[node] = slots
            for gpu in shared:
                if view.holds[gpu] is Hold.HELD:
                    actions.evict.extend(self._evictions(cache, node, row, gpu, now))
        return actions

    def _evictions(
        self, cache: SchedulerCache, node: str, row: int, gpu: int, now: float
    ) -> list[tuple[Obj, str]]:
        found = []
        for uid in sorted(cache.state.pods_on[row]):
            placement = cache.state.placements[uid]
            on_gpu = any(a.mode is not None and gpu in a.gpus for a in placement.assignments)
            pod = cache.bound.get(uid)
            if on_gpu and pod is not None and not self._busy(uid, now):
                self._asked.add(uid)
                why = (
                    f"its GPU {gpu} on {node} lost its reservation and the device plugin gave it to another "
                    "pod; deleted so that it is placed again"
                )
                found.append((pod, why))
        return found


def _reserved_gpu(cache: SchedulerCache, uid: str) -> tuple[str, int] | None:
    """The node and GPU the reservation `uid` holds, once the agent has published it."""
    pod = cache.reservations[uid]
    node = objects.node_name(pod)
    view = cache.devices.get(node)
    if view is None:
        return None
    key = objects.pod_key(pod)
    for index, holder in view.reservations.items():
        if holder == key:
            return node, index
    return None


def _published(cache: SchedulerCache, uid: str) -> bool:
    return _reserved_gpu(cache, uid) is not None
