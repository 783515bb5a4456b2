"""Tenant queues in the scheduler: the Queue objects, what each queue's pods hold and ask for, the fair
shares (`placement.fairshare`) and the rank by which `SchedulingQueue.pop` takes queues.

Ranks are recomputed from the cache at most every `refresh` seconds (a pass over every bound pod), and
between two passes each placement the loop makes is added to its queue's use at once, so a burst of pods
from one queue does not all go before the others notice. Evictions under way count as done (`in_flight`),
and starting one makes the next rank recompute: the room promised counts for the pod it is for, the pods
leaving no longer for theirs, so a round of reclaims stops at the quota and at the victims' fair share.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

import numpy as np

from gpufrac import contract
from gpufrac.cluster.model import Placement, PodDemand
from gpufrac.cluster.state import ClusterState
from gpufrac.contract import keys, queues
from gpufrac.contract.podgroups import PodGroupSpec, group_of
from gpufrac.contract.queues import QueueSpec, Resource
from gpufrac.kubeapi.custom import Index, queue_index
from gpufrac.placement import fairshare, tenancy
from gpufrac.placement.tenancy import Amounts
from gpufrac.scheduler import constraints, objects
from gpufrac.scheduler.cache import SchedulerCache
from gpufrac.scheduler.problems import INVALID, Problem

_UNIT_TEXT = {Resource.GPU_MEMORY: " MiB", Resource.GPUS: "", Resource.CPU: "m", Resource.MEMORY: " MiB"}


# The scheduling queue's heap of the pods naming a queue that does not exist: no queue is named "".
NO_SUCH_QUEUE = ""


def tenant_of(pod: Mapping[str, Any]) -> str:
    """The pod's queue; labels that are not a map (an object the API would not return) read as none."""
    return queues.queue_of(objects.node_labels_of(pod))


class Tenants:
    def __init__(
        self,
        *,
        report: Callable[[Problem], None],
        refresh: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        pod_groups: Index[PodGroupSpec] | None = None,
        in_flight: Callable[[], tuple[Mapping[str, Placement], Collection[str]]] = lambda: ({}, ()),
        protected_priority: int | None = None,
    ) -> None:
        self.report, self.refresh, self.clock = report, refresh, clock
        # Pods at or above it are never evicted, so they run within their queue's quota (`past_limit`);
        # None: no pod is reclaimed (preemption off), so none is held to its quota either.
        self.protected_priority = protected_priority
        self.in_flight = in_flight  # rooms promised to pending pods by uid, and the pods evicted for them
        self.pod_groups = pod_groups  # a PodGroup's queue is its members' queue
        self.specs: dict[str, QueueSpec] = fairshare.with_default({})
        self.index = queue_index(
            on_bad=lambda item, error: report(Problem.about("Queue", item, INVALID, f"ignored: {error}"))
        )
        self.usage: dict[str, Amounts] = {}
        # What each queue's pods of the protected priority hold: the part of its use no reclaim can take
        # back, which alone is held to its quota (`past_limit`).
        self.protected_usage: dict[str, Amounts] = {}
        self.held: dict[str, dict[Resource, float]] = {}  # per queue, with the queues under it
        self.shares: dict[str, dict[Resource, float]] = {}
        self.contested: set[Resource] = set()  # what the queues ask more of than the cluster has
        self.ranks: dict[str, float] = {}
        # The queues of the placements the loop made (`placed`) that are neither bound nor pending (binds
        # under way and gang members held, whose pods only the loop holds), and whether each is protected.
        self._placed_in: dict[str, tuple[str, bool]] = {}
        self._weighed: set[str] = set()  # the pending pods the last pass counted
        self._state = ClusterState()  # the cache's, from the first pass: the GPUs placements are on
        self._at = -math.inf
        self._reference = 0  # the cluster's median GPU memory, MiB, as of the last pass
        # Per pending pod, what it asks (`_asked`), kept with the object and reference it was read from:
        # reading a pod's demand and constraints is the dearest part of a pass, and pending pods rarely
        # change (a new version is a new object).
        self._asks: dict[str, tuple[Mapping[str, Any], int, Amounts]] = {}
        # The whole GPUs a pod asked the kubelet's device plugin for beyond its placement: the cache's, from
        # the first pass (`SchedulerCache.claimed_gpus`).
        self._claimed: Callable[[str], int] = lambda uid: 0

    # ---- Queue objects ------------------------------------------------------------------------------------

    def on_listed(self, items: list[dict[str, Any]]) -> None:
        self.index.listed(items)
        self._rebuild()

    def on_event(self, event: str, item: dict[str, Any]) -> None:
        self.index.changed(event, item)
        self._rebuild()

    def _rebuild(self) -> None:
        """The queues to share by; a tree the webhook would have refused (made without it) is reported, and
        its queues still get what `fair_shares` can give them."""
        try:
            queues.check_tree(self.index.specs)
        except contract.ContractError as error:
            self.report(Problem("Queue", "queues", None, None, INVALID, f"the queue tree: {error}"))
        self.specs = fairshare.with_default(self.index.specs)
        self._at = -math.inf

    # ---- ranks ---------------------------------------------------------------------------------------------

    def rank(self, cache: SchedulerCache, pending: Mapping[str, Mapping[str, Any]]) -> Callable[[str], float]:
        """How far each tenant queue is above its fair share (lower goes first), fresh at most `refresh`
        seconds ago."""
        if self.clock() - self._at >= self.refresh:
            self._recompute(cache, pending)
            # From the pass's end: a pass that took longer than `refresh` (thousands of pending pods) must
            # not make the next decision, and every one after it, pay another.
            self._at = self.clock()
        return lambda tenant: self.ranks.get(tenant, 0.0)

    def outdated(self) -> None:
        """Evictions started: the next `rank` recomputes, counting them."""
        self._at = -math.inf

    def weighed(self, uid: str) -> bool:
        """Whether the last pass counted the pending pod's demand in its queue's fair share: before it has,
        a share measured without the pod may show no queue over its share to reclaim from."""
        return uid in self._weighed

    def placed(self, tenant: str, placement: Placement, priority: int) -> None:
        """Count a placement the loop just made at once, before the next pass."""
        protected = self._protected(priority)
        self._placed_in[placement.pod] = (tenant, protected)
        usage = self.usage.setdefault(tenant, {})
        amounts = self._held(placement)
        tenancy.add(usage, amounts)
        if protected:
            tenancy.add(self.protected_usage.setdefault(tenant, {}), amounts)
        for queue in fairshare.ancestry(self.specs, tenant):
            tenancy.add(self.held.setdefault(queue, {}), amounts)
        self.ranks[tenant] = fairshare.starvation(usage, self.shares.get(tenant, {}))

    def claimed(self, pod: Mapping[str, Any]) -> str:
        """The queue the pod names: the one its bind recorded, once it is bound by gpufrac (so that a PodGroup
        whose queue changes under its running pods cannot move them); else its PodGroup's, when that names
        one, else its label's (`tenant_of`)."""
        notes = objects.annotations_of(pod)
        recorded = notes.get(keys.BOUND_QUEUE_ANNOTATION)
        if (
            isinstance(recorded, str)
            and recorded
            and notes.get(keys.BOUND_UID_ANNOTATION) == objects.pod_uid(pod)
        ):
            return recorded
        if self.pod_groups is not None and (group := group_of(pod)) is not None:
            spec = self.pod_groups.specs.get(group)
            if spec is not None and spec.queue:
                return spec.queue
        return tenant_of(pod)

    def refusal(self, pod: Mapping[str, Any]) -> str | None:
        """Why the pod may not be scheduled in the queue it names: a queue nobody made has no share to be
        measured against (placed, it would always go first), and a queue may be closed to the pod's
        namespace (`queues.refusal`)."""
        queue = self.claimed(pod)
        if queue not in self.specs:
            return f"queue {queue} does not exist: create the Queue, or label the pod with one that does"
        return queues.refusal(self.specs, queue, objects.text_field(pod, "metadata", "namespace"))

    def heap(self, pod: Mapping[str, Any]) -> str:
        """Which tenant's pods the pod waits among in the scheduling queue: its queue's, or one shared by
        every pod naming a queue nobody made (refused when tried, `refusal`), so that pods labelled with
        thousands of made-up queues cost a pop no more than pods of one."""
        tenant = self.tenant(pod)
        return tenant if tenant in self.specs else NO_SUCH_QUEUE

    def tenant(self, pod: Mapping[str, Any]) -> str:
        """The queue the pod counts in: the one it names, unless that queue is closed to its namespace (a
        PodGroup whose queue changed after its pods ran, a pod made before its queue was closed or past a
        webhook that does not watch Queues); then `default`, so that no namespace makes another team's queue
        look busy, or offers its pods as that queue's."""
        queue = self.claimed(pod)
        namespace = objects.text_field(pod, "metadata", "namespace")
        return queues.DEFAULT_QUEUE if queues.refusal(self.specs, queue, namespace) else queue

    def past_limit(
        self,
        tenant: str,
        demand: PodDemand,
        freeing: Iterable[Placement] = (),
        *,
        placed: Iterable[Placement] | None = None,
    ) -> str | None:
        """Why the pod may not be placed: with it (and without the queue's pods `freeing`), its queue or one
        above it would pass a limit, or, for a pod never evicted, the queue's pods never evicted would pass
        its quota (`tenancy.unguaranteed`); None when it may. A share asked as a fraction counts on the
        cluster's median GPU, as in fair shares, until it is `placed` (the pod's placement, or its gang's
        members' that `demand` stands for): then as what it takes there, which on a GPU larger than the
        median is more (a 0.9 portion judged as 9,000 MiB takes 72,000 of 80,000)."""
        wanted = self._wanted(demand, placed)
        asked = dict(wanted)
        tenancy.add(asked, self._held_by(freeing), -1.0)
        past = fairshare.past_limit(self.specs, self.held, tenant, asked)
        if past is not None:
            queue, over, limit = past
            return f"queue {queue} would pass its {over.value} limit ({limit}{_UNIT_TEXT[over]})"
        spec = self.specs.get(tenant)
        if not self._protected(demand.priority) or spec is None:
            return None
        # The pods `freeing` are victims, never protected: they leave the protected use as it is.
        resource = tenancy.unguaranteed(spec, self.protected_usage.get(tenant, {}), wanted)
        if resource is None:
            return None
        quota = f"{spec.entitlement(resource).quota}{_UNIT_TEXT[resource]}"
        return (
            f"queue {tenant}'s pods never evicted would pass its {resource.value} quota ({quota}) with this "
            f"one, of priority {demand.priority}: such pods run only on what their queue is guaranteed; "
            f"give queue {tenant} a larger quota, or the pod a priority below {self.protected_priority}"
        )

    def _wanted(self, demand: PodDemand, placed: Iterable[Placement] | None) -> Amounts:
        """What the pod takes: as asked (a fraction on the cluster's median GPU) until it is `placed`."""
        return tenancy.asked(demand, self._reference) if placed is None else self._held_by(placed)

    def _held_by(self, placements: Iterable[Placement]) -> Amounts:
        """What the placements count against their queue in all (`_held`)."""
        amounts: Amounts = {}
        for placement in placements:
            tenancy.add(amounts, self._held(placement))
        return amounts

    def _held(self, placement: Placement) -> Amounts:
        """What a placement counts against its queue (`tenancy.held`), and the whole GPUs its pod asked the
        kubelet's device plugin for, which it does not name: used and freed alike."""
        amounts = tenancy.held(placement, self._state)
        amounts[Resource.GPUS] += self._claimed(placement.pod)
        return amounts

    def _protected(self, priority: int) -> bool:
        """Whether a pod of `priority` is never evicted, and so held to its queue's quota."""
        return self.protected_priority is not None and priority >= self.protected_priority

    def reclaiming(
        self, tenant: str, demand: PodDemand, *, placed: Iterable[Placement] | None = None
    ) -> set[Resource]:
        """The resources the pod asks for that its queue may reclaim (`tenancy.reclaiming`): asked as a
        fraction, on the cluster's median GPU until it is `placed` (see `past_limit`)."""
        spec = self.specs.get(tenant)
        if spec is None:
            return set()
        wanted = self._wanted(demand, placed)
        return tenancy.reclaiming(spec, self.usage.get(tenant, {}), wanted, self.contested)

    def surplus_covers(self, tenant: str, placements: Iterable[Placement], resources: set[Resource]) -> bool:
        """Whether the queue, without these placements (a pod, or a gang's), keeps its fair share of
        `resources` (`tenancy.surplus_covers`)."""
        return tenancy.surplus_covers(
            self.usage.get(tenant, {}), self.shares.get(tenant, {}), self._held_by(placements), resources
        )

    def over_share(self) -> set[str]:
        """The queues using more than their fair share of some resource (`tenancy.over_share`)."""
        return {
            tenant
            for tenant in self.ranks
            if tenancy.over_share(self.usage.get(tenant, {}), self.shares.get(tenant, {}))
        }

    def _recompute(self, cache: SchedulerCache, pending: Mapping[str, Mapping[str, Any]]) -> None:
        self._weighed, self._state, self._claimed = set(pending), cache.state, cache.claimed_gpus
        usage: dict[str, Amounts] = {}
        protected_usage: dict[str, Amounts] = {}
        promised, leaving = self.in_flight()
        for uid, placement in [*cache.state.placements.items(), *promised.items()]:
            if uid in leaving:
                continue
            pod = cache.bound.get(uid) or pending.get(uid)
            if pod is not None:
                known: tuple[str, bool] | None = (self.tenant(pod), self._protected(objects.priority(pod)))
            else:
                known = self._placed_in.get(uid)
            if known is None:
                continue
            tenant, protected = known
            amounts = self._held(placement)
            tenancy.add(usage.setdefault(tenant, {}), amounts)
            if protected:
                tenancy.add(protected_usage.setdefault(tenant, {}), amounts)
        self._placed_in = {uid: known for uid, known in self._placed_in.items() if uid in cache.assumed}
        demand = {tenant: dict(amounts) for tenant, amounts in usage.items()}
        memory = cache.state.gpu_mem[cache.state.gpu_mem > 0]
        self._reference = int(np.median(memory)) if memory.size else 0  # what a portion means, roughly
        asks = {}
        for uid, pod in pending.items():
            read = self._asks.get(uid)
            if read is None or read[0] is not pod or read[1] != self._reference:
                read = (pod, self._reference, _asked(pod, self._reference))
            asks[uid] = read
            tenant = self.tenant(pod)
            if tenant in self.specs:  # a queue nobody made takes no share: its pods are refused
                tenancy.add(demand.setdefault(tenant, {}), read[2])
        self._asks = asks
        self.usage, self.protected_usage = usage, protected_usage
        self.held = fairshare.held_under(self.specs, usage)
        capacity = tenancy.capacity(cache.state)
        self.shares = fairshare.fair_shares(self.specs, capacity, demand)
        self.contested = tenancy.contested(capacity, demand)
        self.ranks = {
            tenant: fairshare.starvation(usage.get(tenant, {}), self.shares.get(tenant, {}))
            for tenant in set(usage) | set(demand)
        }


def _asked(pod: Mapping[str, Any], reference_gpu_mib: int) -> Amounts:
    """What a pending pod asks for: nothing for one that will not be placed as it is (unreadable, or with
    placement constraints gpufrac cannot read: it is reported where it is scheduled), since a demand that
    can never run must not take a fair share, nor make a resource look contested."""
    if constraints.refusal(pod):
        return {}
    try:
        demand = objects.pod_demand(pod)
    except contract.ContractError:
        return {}
    return tenancy.asked(demand, reference_gpu_mib)
