"""The scheduling queue: the tenant queue furthest below its fair share first, then highest priority, then
oldest; pods that did not fit wait.

Pods are kept per tenant queue (`contract.queues`); `pop` takes the head of the tenant queue that `rank`
puts first (lowest), and without a rank the head of them all, which is plain priority-then-age order.

A pod that did not fit is parked. It comes back when the cluster changes (a pod left, a node came or
changed) once its backoff has passed, or `max_park` seconds after that regardless, much as
kube-scheduler's unschedulable queue does. A pod whose bind failed backs off the same way but does not
wait for a change. Pure bookkeeping with an injectable clock, so tests drive it step by step.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from gpufrac import retrying
from gpufrac.contract.queues import DEFAULT_QUEUE


@dataclass(order=True)
class _Entry:
    priority: int  # negated: heapq pops the smallest
    created: float
    arrival: int  # when the queue first had the pod: ties of age (creation times are whole seconds) go by it
    key: str = field(compare=False)


@dataclass(frozen=True, slots=True)
class _Waiting:
    priority: int
    created: float
    tenant: str
    token: int  # tells this wait's heap entries from those of an earlier one


class SchedulingQueue:
    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        initial_backoff: float = 1.0,
        max_backoff: float = 30.0,
        max_park: float = 60.0,
    ) -> None:
        self._clock = clock
        self._initial = initial_backoff
        self._max = max_backoff
        self._max_park = max_park
        self._heaps: dict[str, list[_Entry]] = {}  # tenant queue -> its pods' entries
        self._active: dict[str, _Entry] = {}
        self._waiting: dict[str, _Waiting] = {}
        self._attempts: dict[str, int] = {}
        self._sequence = itertools.count()
        # Per pod, its place among pods of equal priority and age, kept while it waits and comes back: a pod
        # queued again after a sibling created in the same second stays ahead of it.
        self._arrival: dict[str, int] = {}
        # Waiting pods by when they may be tried, so that taking the next pod reads only the pods due, not
        # every pod that waits (a round over thousands of parked pods was quadratic): `_due`, those that
        # need no change, by the end of their backoff; `_parked`, those parked since the last change, by the
        # same (a change moves them all to `_due`); `_by_park`, parked ones by the end of their park.
        # Entries of a wait since ended or replaced are skipped as they surface.
        self._due: list[tuple[float, int, str]] = []
        self._parked: list[tuple[float, int, str]] = []
        self._by_park: list[tuple[float, int, str]] = []

    def __len__(self) -> int:
        return len(self._active) + len(self._waiting)

    def __contains__(self, key: str) -> bool:
        return key in self._active or key in self._waiting

    def add(self, key: str, *, priority: int, created: float, tenant: str = DEFAULT_QUEUE) -> None:
        """Queue a pod to try now (a new pod, or one whose spec changed)."""
        self._waiting.pop(key, None)
        if key not in self._active:
            entry = _Entry(-priority, created, self._arrival.setdefault(key, next(self._sequence)), key)
            self._active[key] = entry
            heapq.heappush(self._heaps.setdefault(tenant, []), entry)

    def pop(self, rank: Callable[[str], float] | None = None) -> str | None:
        """The next pod to try: from the tenant queue `rank` puts first (ties, and no rank: by the pods'
        own order), or None."""
        self._promote()
        heads: list[tuple[float, _Entry, str]] = []
        for tenant, heap in list(self._heaps.items()):
            while heap and self._active.get(heap[0].key) is not heap[0]:
                heapq.heappop(heap)  # forgotten, or queued again since
            if heap:
                heads.append((rank(tenant) if rank else 0.0, heap[0], tenant))
            else:
                del self._heaps[tenant]
        if not heads:
            return None
        _, entry, tenant = min(heads)
        heapq.heappop(self._heaps[tenant])
        del self._active[entry.key]
        return entry.key

    def tenants(self) -> set[str]:
        """The tenant queues with pods ready to try."""
        return {tenant for tenant, heap in self._heaps.items() if heap}

    def regroup(self, tenant_of: Callable[[str], str]) -> None:
        """Put every pod in the tenant queue `tenant_of` names for it now: which that is changes with the
        Queue and PodGroup objects (a queue made after its pods were queued; a PodGroup's queue)."""
        heaps: dict[str, list[_Entry]] = {}
        for key, entry in self._active.items():
            heaps.setdefault(tenant_of(key), []).append(entry)
        for heap in heaps.values():
            heapq.heapify(heap)
        self._heaps = heaps
        for key, waiting in self._waiting.items():
            self._waiting[key] = replace(waiting, tenant=tenant_of(key))

    def park(self, key: str, *, priority: int, created: float, tenant: str = DEFAULT_QUEUE) -> None:
        """The pod fits nowhere: wait for the cluster to change."""
        self._wait(key, priority, created, tenant, needs_change=True)

    def backoff(self, key: str, *, priority: int, created: float, tenant: str = DEFAULT_QUEUE) -> None:
        """Binding failed: try again after the backoff, change or no change."""
        self._wait(key, priority, created, tenant, needs_change=False)

    def _wait(self, key: str, priority: int, created: float, tenant: str, *, needs_change: bool) -> None:
        attempts = self._attempts[key] = self._attempts.get(key, 0) + 1
        ready_at = self._clock() + retrying.doubling(attempts - 1, first=self._initial, ceiling=self._max)
        waiting = self._waiting[key] = _Waiting(priority, created, tenant, next(self._sequence))
        entry = (ready_at, waiting.token, key)
        if not needs_change:
            heapq.heappush(self._due, entry)
            return
        heapq.heappush(self._parked, entry)
        heapq.heappush(self._by_park, (ready_at + self._max_park, waiting.token, key))
        if len(self._parked) > 2 * len(self._waiting) + 64:  # parks that ended without a change since
            self._parked = [item for item in self._parked if self._current(item)]
            heapq.heapify(self._parked)

    def cluster_changed(self) -> None:
        """Every pod parked so far may be tried once its backoff ends."""
        self._due += self._parked
        heapq.heapify(self._due)
        self._parked = []

    def forget(self, key: str) -> None:
        """The pod was bound or deleted."""
        self._active.pop(key, None)
        self._waiting.pop(key, None)
        self._attempts.pop(key, None)
        self._arrival.pop(key, None)

    def next_ready_in(self) -> float | None:
        """Seconds until a waiting pod may be retried; None when nothing waits."""
        if self._active:
            return 0.0
        times = []
        for heap in (self._due, self._by_park):
            while heap and not self._current(heap[0]):
                heapq.heappop(heap)
            if heap:
                times.append(heap[0][0])
        return max(0.0, min(times) - self._clock()) if times else None

    def _current(self, entry: tuple[float, int, str]) -> bool:
        waiting = self._waiting.get(entry[2])
        return waiting is not None and waiting.token == entry[1]

    def _promote(self) -> None:
        """Queue the waiting pods that are due: those needing no change whose backoff is over, and parked
        ones whose park is over."""
        now = self._clock()
        for heap in (self._due, self._by_park):
            while heap and heap[0][0] <= now:
                entry = heapq.heappop(heap)
                if self._current(entry):
                    waiting = self._waiting[entry[2]]
                    self.add(
                        entry[2], priority=waiting.priority, created=waiting.created, tenant=waiting.tenant
                    )
