"""`gpufrac scheduler`: watch nodes and pods, place pods with the engine, bind them.

The scheduler keeps no state of its own: its cache (`cache.SchedulerCache`) is rebuilt from the API on every
(re)list, and bound pods are read back from the annotations bind wrote, so a restart never double-books a
GPU. A placement is assumed in the cache before its bind starts, so binds run concurrently without two pods
counting the same memory; a failed bind forgets the placement and the pod is retried.

The class is driven by events (`on_node_*`, `on_pod_*`) and by `schedule_pending()`, so tests can step it;
`run()` wires those to reflectors, leader election and the HTTP endpoints.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import Counter
from collections.abc import Callable, Collection, Coroutine, Mapping
from dataclasses import replace
from typing import Any

import lightkube
import numpy as np
from lightkube.resources.core_v1 import Namespace, Node, Pod
from lightkube.types import PatchType

from gpufrac import contract, retrying
from gpufrac.cluster.model import Placement, PodDemand, Unschedulable
from gpufrac.cluster.state import PlacementRefused
from gpufrac.contract.podgroups import group_of
from gpufrac.kubeapi import events
from gpufrac.kubeapi.client import READ_ERRORS, build
from gpufrac.kubeapi.custom import POD_GROUP_RESOURCE, QUEUE_RESOURCE
from gpufrac.kubeapi.reflector import reflect
from gpufrac.placement.engine import decide
from gpufrac.placement.framework import POLICIES, Policy, PolicyContext
from gpufrac.placement.reserve import WholeGpuReserve
from gpufrac.placement.workload import Workload
from gpufrac.scheduler import constraints, objects, reservations, volumes
from gpufrac.scheduler.binder import (
    BindError,
    BoundElsewhere,
    PodGone,
    bind,
    delete_pod,
    read_back,
    unbind_misbound,
)
from gpufrac.scheduler.cache import SchedulerCache
from gpufrac.scheduler.config import SchedulerConfig
from gpufrac.scheduler.devices import Hold
from gpufrac.scheduler.evictions import Evictions
from gpufrac.scheduler.gangs import Gangs, Held, members_of
from gpufrac.scheduler.keeper import ReservationKeeper
from gpufrac.scheduler.metrics import SchedulerMetrics
from gpufrac.scheduler.mover import Mover
from gpufrac.scheduler.problems import INVALID, Problem, Problems
from gpufrac.scheduler.queue import SchedulingQueue
from gpufrac.scheduler.tenants import Tenants

log = logging.getLogger("gpufrac.scheduler")
WORKLOAD_REFRESH_SECONDS = 600.0
# The most pod shapes the target workload keeps. FGD's arrays grow with them (nodes x GPUs x shapes), and the
# workload is the cluster's own pods, so without a cap a tenant's pods of thousands of distinct sizes would
# make every decision slow and its memory large; the openb traces have 21 to 124.
MAX_WORKLOAD_SHAPES = 256
# A pod told why it cannot be placed is told the same again only this long after (kube-scheduler's Event
# recorder folds repeats alike): a tenant's thousand pods that fit nowhere would otherwise cost two writes
# (their condition, an Event) each on every try, and fill etcd with Events. Within the hour Events live.
RETELL_SECONDS = 600.0


class Scheduler:
    """The scheduling loop: pending pods from the queue, a decision on the cache's snapshot, a bind.

    Cluster state lives in the `SchedulerCache`; this class keeps only the pods waiting to be scheduled
    (`pending`, the objects behind the queue's keys). Both are keyed by pod UID.
    """

    def __init__(
        self,
        client: lightkube.AsyncClient,
        config: SchedulerConfig,
        *,
        cache: SchedulerCache | None = None,
        queue: SchedulingQueue | None = None,
        clock: Callable[[], float] = time.monotonic,
        leading: bool = True,
    ) -> None:
        self.client = client
        self.config = config
        self.metrics = SchedulerMetrics(
            lambda: self.cache.snapshot(),
            leader=lambda: self.leading,
            misfits=lambda: sum(len(held) for held in self.cache.misfits.values()),
            queues=(lambda: (self.tenants.shares, self.tenants.usage)) if config.queues else None,
        )
        self.problems = Problems(
            on_new=lambda problem: self.metrics.invalid_objects.labels(problem.kind, problem.reason).inc()
        )
        if cache is None:
            cache = SchedulerCache(
                node_selector=config.node_selector,
                report=self.problems.report,
                require_ready=config.require_ready,
                heartbeat_timeout=config.agent_heartbeat_timeout,
                reservation_namespace=config.namespace,
            )
        self.cache = cache
        self.queue = SchedulingQueue(clock=clock) if queue is None else queue
        self.clock = clock
        self.pending: dict[str, dict[str, Any]] = {}  # uid -> latest version of our unbound pods
        self._told: dict[str, tuple[str, float]] = {}  # uid -> why it waits, as last told, and when
        self._member_counts: Counter[str] | None = None  # pod group -> its pods, this round (`_members`)
        self._regroup = False  # Queues or PodGroups changed since the last round (`_queues_changed`)
        # Pod group -> its pending members waiting for more to exist, in the order they were tried: they are
        # queued again in that order, as a set's would make their ties (pods created in one second) a toss.
        self._short_of: dict[str, dict[str, None]] = {}
        self.synced = {"nodes": False, "pods": False, "namespaces": False}
        self.gangs = Gangs(
            on_bad=lambda item, error: self.problems.report(
                Problem.about("PodGroup", item, INVALID, f"ignored: {error}")
            )
        )
        if config.gangs:
            self.synced["podgroups"] = False
        self.tenants = Tenants(
            report=self.problems.report,
            clock=clock,
            pod_groups=self.gangs.index if config.gangs else None,
            in_flight=lambda: self.mover.in_flight(),
            protected_priority=config.protected_priority if config.preemption else None,
        )
        if config.queues:
            self.synced["queues"] = False
        self.is_leader = leading  # a standby (False) keeps its cache warm and binds nothing until `lead()`
        self._holds: Callable[[], bool] = lambda: True  # the elector's word that the Lease is still ours
        self._binds: set[asyncio.Task[None]] = set()
        self.misbound: dict[str, dict[str, Any]] = {}  # uid -> bound pod holding another pod's contract
        self._unbinds = retrying.Backoffs(first=1.0, ceiling=60.0)  # their deletions refused lately
        self._slots = asyncio.Semaphore(config.max_concurrent_binds)
        self._wakeup = asyncio.Event()
        self.policy = self._policy(Workload.from_pods([]))
        self._workload_at: float | None = None
        self.keeper = ReservationKeeper(idle_seconds=config.reservation_idle_seconds)
        self.mover = Mover(
            client,
            self.cache,
            component=config.name,
            min_runtime=config.min_runtime,
            max_moves=config.max_moves,
            evictions=self.metrics.evictions,
            clock=clock,
        )
        self.evictions = Evictions(
            cache=self.cache,
            tenants=self.tenants,
            gangs=self.gangs,
            mover=self.mover,
            pending=self.pending,
            settings=config,
            fault_domain=self.fault_domain,
            clock=clock,
        )

    # ---- events -------------------------------------------------------------------------------------------

    def on_nodes_listed(self, nodes: list[dict[str, Any]]) -> None:
        self.cache.sync_nodes(nodes)
        self.synced["nodes"] = True
        self._cluster_changed()

    def on_node_event(self, event: str, node: dict[str, Any]) -> None:
        if event == "DELETED":
            self.cache.remove_node(objects.name_of(node))
        elif not self.cache.add_node(node):
            return  # a heartbeat: nothing placement depends on has changed
        self._cluster_changed()

    def on_pods_listed(self, pods: list[dict[str, Any]]) -> None:
        """Rebuild every pod-derived fact from a full list: what is bound where, what waits."""
        self.cache.sync_pods(pods)
        self.cache.nominated.clear()  # the unbound pods listed nominate again below
        listed = {objects.pod_uid(pod) for pod in pods}
        # Deleted while the watch was broken: gone as a DELETED event would have said, so that no gang counts
        # a member that is gone and no plan waits for an evicted pod that went.
        tracked = {*self.pending, *self.misbound, *self.gangs.held_uids(), *self.mover.in_flight()[1]}
        for uid in tracked - listed:
            self._gone(uid)
        for pod in pods:
            if not objects.node_name(pod):
                self.on_pod_event("ADDED", pod)
            else:  # bound, maybe by another replica while this one's watch was broken
                self._forget_pending(objects.pod_uid(pod))
                self._check_binding(pod)
        self.synced["pods"] = True
        self._cluster_changed()

    def on_pod_event(self, event: str, pod: dict[str, Any]) -> None:
        uid = objects.pod_uid(pod)
        if reservations.is_reservation(pod, self.config.namespace):
            if event == "DELETED":
                self.keeper.deleted(uid)
            elif objects.is_done(pod):
                self.keeper.finished(pod)
        if event == "DELETED" or objects.is_done(pod):
            self.cache.nominated.pop(uid, None)
            self._gone(uid)
            return
        self.cache.nominate(pod)
        if objects.node_name(pod):
            self._forget_pending(uid)
            self._check_binding(pod)
            if event == "MODIFIED":
                self.cache.update_pod(pod)
            else:
                self.cache.add_pod(pod)
            return
        if objects.terminating(pod):  # being deleted before it was bound: nothing to place
            self._forget_pending(uid)
            return
        if objects.scheduler_name(pod) == self.config.name and uid not in self.cache.assumed:
            try:
                objects.check_pod(pod)
            except contract.ContractError as error:
                self._forget_pending(uid)
                self.problems.report(Problem.about("Pod", pod, INVALID, f"cannot be scheduled: {error}"))
                return
            if objects.gated(pod):  # not ready to be scheduled: the update that removes its gates brings it
                self._forget_pending(uid)
                return
            previous = self.pending.get(uid)
            self.pending[uid] = pod
            if previous is None:
                self._member_counts = None
                # A member the group was short of: those waiting for it are tried again now.
                for member in self._short_of.pop(group_of(pod) or "", ()):
                    if member in self.pending:
                        self.queue.add(member, **self._order(self.pending[member]))
            if previous is None or _spec_changed(previous, pod):
                self.queue.add(uid, **self._order(pod))
                self._wakeup.set()

    def on_queues_listed(self, items: list[dict[str, Any]]) -> None:
        self.tenants.on_listed(items)
        self.synced["queues"] = True
        self._queues_changed()

    def on_queue_event(self, event: str, item: dict[str, Any]) -> None:
        self.tenants.on_event(event, item)
        self._queues_changed()

    def on_pod_groups_listed(self, items: list[dict[str, Any]]) -> None:
        self.gangs.index.listed(items)
        self.synced["podgroups"] = True
        self._queues_changed()

    def on_pod_group_event(self, event: str, item: dict[str, Any]) -> None:
        self.gangs.index.changed(event, item)
        self._queues_changed()

    def _queues_changed(self) -> None:
        """Queue or PodGroup objects changed, and with them the tenant queue pods wait in: pods queued before
        their Queue was listed waited among those of queues nobody made, out of fair-share order. Regrouped
        once at the next round, not at each event: a tenant may make PodGroups by the thousand."""
        self._regroup = True
        self._cluster_changed()

    def on_namespaces_listed(self, namespaces: list[dict[str, Any]]) -> None:
        self.cache.namespace_labels = {objects.name_of(ns): objects.node_labels_of(ns) for ns in namespaces}
        self.synced["namespaces"] = True

    def on_namespace_event(self, event: str, namespace: dict[str, Any]) -> None:
        if event == "DELETED":
            self.cache.namespace_labels.pop(objects.name_of(namespace), None)
        else:
            self.cache.namespace_labels[objects.name_of(namespace)] = objects.node_labels_of(namespace)

    def fault_domain(self, pod: Mapping[str, Any]) -> str:
        """The group `pod`'s sm-sharing shares may share GPUs with: its namespace, or `label=value` for the
        namespaces an admin grouped with `fault_domain_label`."""
        namespace = objects.text_field(pod, "metadata", "namespace")
        label = self.config.fault_domain_label
        value = self.cache.namespace_labels.get(namespace, {}).get(label) if label else None
        return f"{label}={value}" if isinstance(value, str) and value else namespace

    def _gone(self, uid: str) -> None:
        """The pod was deleted or finished: nothing waits for it or on it any more; what it held is freed."""
        self._forget_pending(uid)
        self.misbound.pop(uid, None)
        self._unbinds.forget(uid)
        if (held := self.gangs.drop(uid)) is not None:  # held for its gang: its room is freed now
            self.cache.forget(held[1])
        freed = self.cache.remove_pod(uid)
        if self.mover.gone(uid) or freed:
            self._cluster_changed()

    def _check_binding(self, pod: dict[str, Any]) -> None:
        """A bound pod whose contract was granted to another UID is deleted by the leader (`binder`)."""
        if objects.misbound(pod) and not (objects.is_done(pod) or objects.terminating(pod)):
            self.misbound[objects.pod_uid(pod)] = pod
            self._wakeup.set()

    def _cluster_changed(self) -> None:
        """Pods parked for want of room may fit now, or room be made for them."""
        self.queue.cluster_changed()
        self.evictions.cluster_changed()
        self._wakeup.set()

    def _forget_pending(self, uid: str) -> None:
        self._member_counts = None
        pod = self.pending.pop(uid, None)
        if pod is not None and (short := self._short_of.get(group_of(pod) or "")) is not None:
            short.pop(uid, None)
        self.queue.forget(uid)
        self.keeper.forget_pod(uid)
        self.mover.forget(uid)

    # ---- scheduling ---------------------------------------------------------------------------------------

    def _policy(self, workload: Workload) -> Policy:
        policy = POLICIES[self.config.policy](PolicyContext(rng=np.random.default_rng(), workload=workload))
        if self.config.whole_gpu_reserve:
            return replace(policy, reserve=WholeGpuReserve(self.config.whole_gpu_reserve))
        return policy

    def _reserve_counted(self, policy: Policy, demand: PodDemand) -> Policy:
        """`policy`, its whole-GPU reserve counting empty GPUs as whole-GPU pods see them. Beside a device
        plugin a share is decided seeing only the GPUs gpufrac reserved, so counted there the reserve would
        see too few empty GPUs, refuse the share, and have more GPUs reserved from the plugin for it: the
        free ones are counted too. Only for a pod with a share, the only kind the reserve judges."""
        if policy.reserve is None or not demand.shares or not self.cache.devices:
            return policy
        with self.cache.device_view(Hold.FREE, Hold.RESERVED):
            counted = policy.reserve.count(self.cache.snapshot())
        return replace(policy, reserve=replace(policy.reserve, counted=counted))

    def refresh_workload(self, *, every: float = WORKLOAD_REFRESH_SECONDS) -> None:
        """Rebuild the policy with the target workload of the pods now known, bound and pending.

        Only a policy that declares `needs_workload` reads it (its scores measure fragmentation against the
        shapes the cluster expects); a live cluster has no trace, so its own pods stand for one, refreshed
        every `every` seconds.
        """
        now = self.clock()
        if self._workload_at is not None and now - self._workload_at < every:
            return
        demands = []
        for pod in [*self.cache.bound.values(), *self.pending.values()]:
            with contextlib.suppress(contract.ContractError):
                demands.append(objects.pod_demand(pod))
        state = self.cache.snapshot()
        memory = state.gpu_mem[state.gpu_mem > 0]
        reference = int(np.median(memory)) if memory.size else 16384  # for shapes asked in MiB
        workload = Workload.from_pods(demands, reference_gpu_mib=reference, max_shapes=MAX_WORKLOAD_SHAPES)
        self.policy = self._policy(workload)
        self._workload_at = now

    async def schedule_pending(self) -> int:
        """Decide every pod that is ready to be tried, starting their binds; returns how many were tried."""
        if POLICIES[self.config.policy].needs_workload:
            self.refresh_workload()
        self._unbind_misbound()
        if self.leading and (self.cache.devices or self.keeper.failed) and self.keeper.due(self.clock()):
            await self._tend_reservations()
        if self._regroup:
            self._regroup = False
            self.queue.regroup(lambda uid: self.tenants.heap(self.pending.get(uid, {})))
        if self.config.gangs:
            await self._give_back_gangs()
            counted = self._members_bound(self.gangs.gangs.keys()) if self.gangs.gangs else Counter[str]()
            for together in self.gangs.ready(counted.__getitem__):
                for member, body, held_placement in together:
                    await self._start_bind(member, body, held_placement)
        tried = 0
        self._member_counts = None
        self.evictions.new_round()
        while self.leading and (uid := self.queue.pop(self._tenant_rank())) is not None:
            pod = self.pending.get(uid)
            if pod is None:
                continue
            tried += 1
            await self._schedule(uid, pod)
        self.metrics.pending.set(len(self.pending))
        return tried

    def _order(self, pod: Mapping[str, Any]) -> dict[str, Any]:
        """Where the pod goes in the scheduling queue: its tenant queue, priority and age."""
        return {
            "priority": _priority(pod),
            "created": objects.created(pod),
            "tenant": self.tenants.heap(pod),
        }

    def _tenant_rank(self) -> Callable[[str], float] | None:
        """The order of the tenant queues, when there are queues and more than one has pods to try."""
        if not self.config.queues or len(self.queue.tenants()) < 2:
            return None
        return self.tenants.rank(self.cache, self.pending)

    async def _schedule(self, uid: str, pod: dict[str, Any]) -> None:
        started = time.perf_counter()
        try:
            demand = objects.pod_demand(pod, fault_domain=self.fault_domain(pod))
        except contract.ContractError as error:
            self.metrics.attempts.labels("invalid").inc()
            self.queue.park(uid, **self._order(pod))
            await self._report_failure(pod, f"invalid GPU request: {error}")
            return
        if (why := constraints.refusal(pod)) or (self.config.queues and (why := self.tenants.refusal(pod))):
            self.metrics.attempts.labels("invalid").inc()
            self.queue.park(uid, **self._order(pod))
            await self._report_failure(pod, why)
            return
        group = group_of(pod) if self.config.gangs else None
        if group is not None and (spec := self.gangs.spec(group)) is None:
            self.metrics.attempts.labels("invalid").inc()
            self.queue.park(uid, **self._order(pod))
            await self._report_failure(pod, f"pod group {group} does not exist: create the PodGroup")
            return
        if group is not None and spec is not None and (members := self._members(group)) < spec.min_member:
            # As KAI Scheduler: a gang that could not reach minMember with every pod it has holds no room
            # (a PodGroup of minMember 10,000 held GPUs from everyone for its whole timeout).
            self.metrics.attempts.labels("unschedulable").inc()
            self.queue.park(uid, **self._order(pod))
            self._short_of.setdefault(group, {})[uid] = None
            await self._report_failure(
                pod,
                f"pod group {group}: {members} of its {spec.min_member} members exist; its pods hold no room "
                "until the rest are created",
            )
            return
        if self.keeper.waits(self.cache, uid) or self.mover.waits(uid):
            # The node agent has not published which GPU its reservation got (a Node update wakes it), or
            # pods moved to make room for it are still going (their deletion wakes it).
            self.queue.park(uid, **self._order(pod))
            return
        needs = await volumes.read(self.client, pod, self.cache)
        if self.pending.get(uid) is not pod:
            # Deleted, bound or changed while its volumes were read: decided as it is now, if still pending.
            if uid in self.pending:
                self.queue.add(uid, **self._order(self.pending[uid]))
            return
        if needs.waits is not None:
            self.metrics.attempts.labels("unschedulable").inc()
            self.queue.park(uid, **self._order(pod))
            await self._report_failure(pod, needs.waits)
            return
        open_rows, excluded = self.cache.open_rows(
            pod, gpus=bool(demand.shares or demand.whole), volumes=needs.constraints
        )
        if demand.shares and demand.whole and self.cache.devices:
            open_rows, excluded = self._off_device_plugin_nodes(open_rows, excluded)
        allowed, refused = self.cache.neighbours_allow(pod, open_rows)
        rows, excluded = open_rows[allowed], excluded + refused
        # A pod that would take its queue past a limit is never placed: only its queue's lower priorities
        # going may bring it within. A kept room was within the limits when its pods were evicted.
        past = None
        judged, past_as_placed = self.config.queues and uid not in self.cache.kept_rooms, None
        if judged:
            self.tenants.rank(self.cache, self.pending)  # use at most a second old, and each placement since
            past = self.tenants.past_limit(self.tenants.tenant(pod), demand)
        kept = self.mover.take_room(uid)
        freed: list[tuple[str, list[Held]]] = []
        # Shares only on GPUs gpufrac reserved, whole GPUs only on GPUs the device plugin still has free.
        usable = (Hold.RESERVED,) if demand.shares else (Hold.FREE,) if demand.whole else ()
        policy = self._reserve_counted(self.policy, demand)
        try:
            nominated = functools.partial(self.cache.nominated_view, uid, _priority(pod))
            with self.cache.device_view(*usable), nominated(device_gpus=Hold.FREE in usable) as theirs:
                if theirs.size:
                    kept_for = np.isin(rows, theirs)
                    reason = "node(s) kept for a pod of no lower priority nominated there"
                    rows, excluded = rows[~kept_for], excluded + Counter({reason: int(kept_for.sum())})
                outcome: Placement | Unschedulable = Unschedulable(uid, {})
                if kept is not None and past is None:  # the room pods were moved out of, first
                    room = rows[rows == self.cache.state.index.get(kept.node, -1)]
                    outcome = decide(self.cache.snapshot(), demand, policy, rows=room)
                if isinstance(outcome, Unschedulable) and past is None:
                    outcome = decide(self.cache.snapshot(), demand, policy, rows=rows)
                if (
                    isinstance(outcome, Unschedulable)
                    and past is None
                    and (freed := self._held_room(pod, demand, rows, policy))
                ):
                    outcome = decide(self.cache.snapshot(), demand, policy, rows=rows)
            for key, given in freed:
                why = f"the room held for them went to queue {self.tenants.tenant(pod)}, below its share"
                await self._gave_back(key, given, why)
            if self.config.queues and isinstance(outcome, Placement) and not judged and _moved(outcome, kept):
                # Its kept room gone, it goes elsewhere: judged as any pod is, on its queue's use without it.
                judged = True
                self.tenants.outdated()
                self.tenants.rank(self.cache, self.pending)
            if judged and isinstance(outcome, Placement):
                # Judged again as placed: a portion counts on the median GPU until its GPU is chosen. Its
                # queue's pods going would free what it was judged by, not what it takes: none are evicted.
                past_as_placed = self.tenants.past_limit(self.tenants.tenant(pod), demand, placed=[outcome])
                if past_as_placed is not None:
                    past, outcome = past_as_placed, Unschedulable(uid, {})
            if isinstance(outcome, Unschedulable) and demand.shares and self.cache.devices and past is None:
                # Would it fit with more GPUs reserved? Then reserve them, and decide again once they are.
                # The GPUs a nominated pod asks the kubelet for are among those a reservation would take.
                reserving = self.cache.device_view(Hold.RESERVED, Hold.PENDING, Hold.FREE)
                with reserving, nominated(device_gpus=True) as theirs:
                    left = rows[~np.isin(rows, theirs)]
                    trial = decide(self.cache.snapshot(), demand, policy, rows=left)
                if not isinstance(trial, Unschedulable) and await self._reserve_for(uid, pod, trial):
                    self.queue.park(uid, **self._order(pod))
                    return
            if (
                isinstance(outcome, Unschedulable)
                and past_as_placed is None
                and self.config.max_moves
                and await self.evictions.make_room(
                    uid, pod, demand, rows, open_rows, policy, capped=past is not None
                )
            ):
                self.tenants.outdated()  # the queues' use, counting these evictions, before the next decision
                self.queue.park(uid, **self._order(pod))
                if not self.mover.waits(uid):  # the moved pods went while their evictions were sent
                    self._cluster_changed()
                return
        except Exception:  # a bug, or a demand the contract let through that the engine cannot weigh
            log.exception("pod %s: the placement engine failed on it", objects.pod_key(pod))
            self.metrics.attempts.labels("error").inc()
            self.queue.park(uid, **self._order(pod))
            await self._report_failure(pod, "the placement engine failed on it; see the scheduler's log")
            return
        self.metrics.decision_seconds.observe(time.perf_counter() - started)
        if isinstance(outcome, Unschedulable):
            self.metrics.attempts.labels("unschedulable").inc()
            self.queue.park(uid, **self._order(pod))
            reasons = Counter(outcome.reasons) + excluded
            message = past or Unschedulable(uid, dict(reasons)).message
            log.info("pod %s unschedulable: %s", objects.pod_key(pod), message)
            await self._report_failure(pod, message)
            return
        if outcome.node in self.cache.devices:
            # The kubelet's device plugin picks a whole GPU, not gpufrac: the pod counts as a claim on the
            # node (`SchedulerCache._claim`) until the agent publishes which GPU it got.
            outcome = replace(
                outcome, assignments=tuple(a for a in outcome.assignments if a.mode is not None)
            )
        try:
            self.cache.assume(pod, outcome)
            self.tenants.placed(self.tenants.tenant(pod), outcome, objects.priority(pod))
        except PlacementRefused as error:  # the cache holds it already: a bind or the watch got there first
            log.warning("pod %s: not bound, already accounted: %s", objects.pod_key(pod), error)
            self._forget_pending(uid)
            return
        del self.pending[uid]
        if group is None:
            await self._start_bind(uid, pod, outcome)
        else:
            await self._hold_or_bind(group, uid, pod, outcome)

    def _members(self, group: str) -> int:
        """The pods of `group` there are, bound, held or pending: counted once a round for every group (a
        pass over the bound and pending pods), since each member placed asks."""
        if self._member_counts is None:
            counts: Counter[str] = Counter()
            for body in (
                *self.cache.bound.values(),
                *self.cache.assumed_pods.values(),
                *self.pending.values(),
            ):
                if (key := group_of(body)) is not None:
                    counts[key] += 1
            self._member_counts = counts
        return self._member_counts[group]

    async def _hold_or_bind(self, group: str, uid: str, pod: dict[str, Any], placement: Placement) -> None:
        """A gang member placed (and assumed): held until its group can run, then bound with the others.
        Members whose room went with their node (deleted, or changed under them) wait again instead: they
        count toward the group no more, and are not bound to a node that is not there."""
        for lost in self.gangs.held_uids() - self.cache.state.placements.keys():
            if (dropped := self.gangs.drop(lost)) is not None:
                self._retry(lost, dropped[1])
        bound = self._members_bound({group}, placing=uid)[group]
        together = self.gangs.hold(group, (uid, pod, placement), bound=bound, now=self.clock())
        if together is None:
            spec = self.gangs.spec(group)
            held = len(self.gangs.gangs[group].held)
            await self._report_failure(
                pod,
                f"pod group {group}: {bound + held} of {spec.min_member if spec else '?'} members can run "
                "now; held until the rest can",
            )
            return
        log.info("pod group %s: binding %d member(s) together", group, len(together))
        for member, body, held_placement in together:
            await self._start_bind(member, body, held_placement)

    def _members_bound(self, groups: Collection[str], *, placing: str = "") -> Counter[str]:
        """Per group of `groups`, its members bound or being bound (their binds in flight, not held;
        `placing`, assumed but about to be held, is not one): a member placed while the others' binds run
        joins a gang that already runs. One pass over the bound pods, however many groups ask."""
        held = self.gangs.held_uids() | {placing}
        binding = (body for uid, body in self.cache.assumed_pods.items() if uid not in held)
        return members_of(groups, (*self.cache.bound.values(), *binding))

    async def _start_bind(self, uid: str, pod: dict[str, Any], placement: Placement) -> None:
        """Start the bind of a placement assumed in the cache, within the binds allowed in flight."""
        await self._slots.acquire()
        # While it waited for a bind slot, the Lease may have run out (not ours to bind), or its node gone.
        if not self.leading or uid not in self.cache.state.placements:
            self._slots.release()
            self._retry(uid, pod)
            return
        self._track(self._bind(uid, pod, placement))

    def _retry(self, uid: str, pod: dict[str, Any]) -> None:
        """Give up a placement assumed for `pod` before its bind started, and queue it to try again."""
        if self.cache.forget(pod):
            self.pending[uid] = pod
            self.queue.add(uid, **self._order(pod))

    async def _give_back_gangs(self) -> None:
        """Groups held past their timeout give their room back, and their pods wait again."""
        for spec, key, members in self.gangs.expired(self.clock()):
            self._unhold(members)
            await self._gave_back(
                key,
                members,
                f"{spec.min_member} members could not run together within {spec.timeout_seconds:g}s; the "
                f"room held for {len(members)} is given back"
                if spec
                else "the PodGroup is gone; the room held for its pods is given back",
            )
            self._cluster_changed()

    def _unhold(self, members: list[Held]) -> None:
        """Members no longer held wait again, their room freed."""
        for uid, pod, _ in members:
            if self.cache.forget(pod):  # else deleted meanwhile
                self.pending[uid] = pod
                self.queue.park(uid, **self._order(pod))

    async def _gave_back(self, key: str, members: list[Held], why: str) -> None:
        for uid, pod, _ in members:
            if uid in self.pending:
                await self._report_failure(pod, f"pod group {key}: {why}")

    def _held_room(
        self, pod: Mapping[str, Any], demand: PodDemand, rows: np.ndarray, policy: Policy
    ) -> list[tuple[str, list[Held]]]:
        """Gangs held for queues over their fair share give their room to a pod that fits nowhere else, where
        its queue may reclaim (as it would take running pods of those queues): held members run nothing, so
        nothing is evicted, and a gang that can never complete (a member no node can take) does not keep
        another queue's quota for its whole `scheduleTimeoutSeconds`, which is the tenant's to set. Only the
        gangs holding room on the node the pod would take, and only where their queue keeps its fair share
        without it, and where its queue stays within its quota with the pod where it would go (a portion asked
        within it on the median GPU may take far more on a larger one). Returns the gangs given back; the
        caller decides again."""
        if not (self.config.queues and self.gangs.gangs):
            return []
        tenant = self.tenants.tenant(pod)
        contested = self.tenants.reclaiming(tenant, demand)
        over = self.tenants.over_share() - {tenant} if contested else set()
        yielding = {
            key: members
            for key, gang in self.gangs.gangs.items()
            if (members := list(gang.held.values()))
            and self.tenants.tenant(members[0][1]) in over
            and self.tenants.surplus_covers(
                self.tenants.tenant(members[0][1]), [placement for _, _, placement in members], contested
            )
        }
        held = [uid for members in yielding.values() for uid, _, _ in members]
        trial = decide(self.cache.snapshot().without(held), demand, policy, rows=rows) if held else None
        if not isinstance(trial, Placement) or not self.tenants.reclaiming(tenant, demand, placed=[trial]):
            return []
        freed = []
        for key, members in yielding.items():
            if any(placement.node == trial.node for _, _, placement in members):
                freed.append((key, self.gangs.give_back(key)))
                self._unhold(freed[-1][1])
        return freed

    async def _bind(self, uid: str, pod: dict[str, Any], placement: Placement) -> None:
        """Bind, then settle the reservation: kept when bound, released otherwise (waking the pods parked for
        want of the room it held), and the pod retried unless it is gone or another bind bound it."""
        started = time.perf_counter()
        try:
            plan = objects.bind_plan(
                pod,
                placement,
                self.cache.snapshot().node_spec(placement.node),
                mps_pipe_directory=self.config.mps_pipe_directory,
                env_delivery=self.config.env_delivery,
                kubelet_gpus=placement.node in self.cache.devices,
                queue=self.tenants.tenant(pod) if self.config.queues else None,
            )

            def gone() -> bool:
                return uid in self.cache.gone_assumed

            if volumes.claim_names(pod):
                await self._provision(pod, placement.node, gone)
            await bind(self.client, pod, placement.node, plan, gone=gone)
        except PodGone as error:
            self.metrics.attempts.labels("error").inc()
            log.info("pod %s: not bound to %s: %s", objects.pod_key(pod), placement.node, error)
            self.cache.forget(pod)
            self._cluster_changed()
        except BoundElsewhere as error:
            self.metrics.attempts.labels("error").inc()
            log.warning("pod %s: not bound to %s: %s", objects.pod_key(pod), placement.node, error)
            if self.cache.forget(pod):  # the watch has not reported it bound yet: account it as read back
                self.cache.add_pod(error.pod)
            self._cluster_changed()
        except Exception as error:  # BindError, or a bug: the pod must not stay reserved for ever
            self.metrics.attempts.labels("error").inc()
            log.warning(
                "pod %s: bind to %s failed, will retry: %s",
                objects.pod_key(pod),
                placement.node,
                error,
                exc_info=not isinstance(error, BindError),
            )
            if self.cache.forget(pod):  # still there: try again after the backoff
                self.pending[uid] = pod
                self.queue.backoff(uid, **self._order(pod))
            self._cluster_changed()
        else:
            self.metrics.attempts.labels("scheduled").inc()
            self.metrics.binding_seconds.observe(time.perf_counter() - started)
            log.info("pod %s bound to %s", objects.pod_key(pod), placement.node)
            if not self.cache.finish_binding(pod):  # deleted meanwhile: its memory is free again
                self._cluster_changed()
        finally:
            self._slots.release()

    async def _provision(self, pod: dict[str, Any], node: str, gone: Callable[[], bool]) -> None:
        """Name `node` on the pod's delayed claims and wait for their volumes (`volumes.provision`), without
        holding a bind slot meanwhile: a provisioner that takes minutes, or a tenant's claims that are never
        provisioned, must not keep every other pod from binding. `BindError` when the volumes do not come."""
        self._slots.release()
        try:
            timeout = self.config.volume_bind_timeout
            await volumes.provision(self.client, pod, node, timeout=timeout, gone=gone)
        except volumes.NotProvisioned as error:
            raise BindError(str(error)) from None
        except READ_ERRORS as error:
            raise BindError(f"cannot read or name {node} on the pod's claims: {error}") from None
        finally:
            await self._slots.acquire()

    def _off_device_plugin_nodes(
        self, rows: np.ndarray, excluded: Counter[str]
    ) -> tuple[np.ndarray, Counter[str]]:
        """A pod asking for a share and whole GPUs at once is kept off device-plugin nodes: its whole GPUs
        would be the kubelet's pick, its share gpufrac's, and nothing would keep the two apart."""
        off = np.isin(rows, self.cache.hold_matrix()[0])
        if off.any():
            excluded = excluded + Counter(
                {"node(s) where a device plugin runs (a share and whole GPUs in one pod)": int(off.sum())}
            )
        return rows[~off], excluded

    async def _reserve_for(self, uid: str, pod: dict[str, Any], trial: Placement) -> bool:
        """Make the pod wait for the reservations `trial` needs on its node: the ones not yet published there
        (whichever GPU each gets, they are alike), and new ones for the free GPUs its shares would use.
        False when it needs none, or none could be made."""
        view = self.cache.devices.get(trial.node)
        if view is None:
            return False
        used = [view.holds[gpu] for a in trial.assignments for gpu in set(a.gpus)]
        if used.count(Hold.FREE) >= self.cache.state.pods_free[self.cache.state.index[trial.node]]:
            return False  # each reservation is a pod: with them the node would have no slot left for this one
        waits = set()
        if Hold.PENDING in used:
            waits |= {
                reservation
                for reservation, body in self.cache.reservations.items()
                if objects.node_name(body) == trial.node
                and objects.pod_key(body) not in view.reservations.values()
            }
        for _ in range(used.count(Hold.FREE)):
            reservation = await self._create_reservation(trial.node)
            if reservation is None:
                break
            waits.add(objects.pod_uid(reservation))
        if waits:
            self.keeper.awaiting[uid] = waits
            log.info(
                "pod %s waits for %d GPU reservation(s) on %s", objects.pod_key(pod), len(waits), trial.node
            )
        return bool(waits)

    async def _create_reservation(self, node: str) -> dict[str, Any] | None:
        manifest = reservations.manifest(
            node, namespace=self.config.namespace, image=self.config.reservation_image
        )
        try:
            created = await self.client.create(build(Pod, manifest))
        except READ_ERRORS as error:
            log.error("cannot create a GPU reservation on %s in %s: %s", node, self.config.namespace, error)
            self.keeper.created(node, ok=False, now=self.clock())
            return None
        self.keeper.created(node, ok=True, now=self.clock())
        body = created.to_dict()
        self.cache.add_pod(body)  # counted at once, so the next decision sees the GPU claimed
        log.info("reserving a GPU on %s with pod %s", node, objects.pod_key(body))
        return body

    async def _tend_reservations(self) -> None:
        actions = self.keeper.tend(self.cache, self.clock())
        for node, count in actions.create.items():
            log.warning(
                "GPU(s) on %s hold shares but no reservation: reserving its %d free GPU(s)", node, count
            )
            for _ in range(count):
                if await self._create_reservation(node) is None:
                    break  # refused: the rest would be too
        for pod in actions.delete:
            self.cache.release_reservation(objects.pod_uid(pod))
        for pod, why in [*((pod, "") for pod in actions.delete), *actions.evict]:
            self._track(self._delete(pod, why))

    async def _delete(self, pod: Mapping[str, Any], why: str) -> None:
        """Delete a reservation (its GPU goes back to the device plugin), or, with `why`, a share pod that
        lost its GPU; one not settled is asked again at the next tending."""
        reason = "GPUReservationLost" if why else ""
        if not await delete_pod(self.client, pod, component=self.config.name, reason=reason, message=why):
            log.error("cannot delete pod %s; trying again", objects.pod_key(pod))
            self.cache.release_reservation(objects.pod_uid(pod), asked=False)
            self.keeper.retry(objects.pod_uid(pod), now=self.clock())
        elif why:
            log.warning("deleted pod %s: %s", objects.pod_key(pod), why)
        else:
            log.info("released GPU reservation %s", objects.pod_key(pod))

    def _unbind_misbound(self) -> None:
        """Start deleting each pod bound with another pod's contract; one whose deletion was not settled is
        tried again after a backoff, not at every round (a burst of events runs many a second)."""
        if not self.leading:
            return
        now = self.clock()
        for uid in [uid for uid in self.misbound if not self._unbinds.waiting(uid, now=now)]:
            pod = self.misbound.pop(uid)
            log.warning(
                "pod %s is bound with the contract of pod UID %s: deleting it",
                objects.pod_key(pod),
                objects.bound_for(pod),
            )
            self._track(self._unbind(uid, pod))

    def _track(self, write: Coroutine[Any, Any, None]) -> None:
        """Run an API write beside the loop, held in `_binds` so that stopping and losing the Lease wait for
        it (`wait_for_binds`, `step_down`)."""
        task = asyncio.create_task(write)
        self._binds.add(task)
        task.add_done_callback(self._binds.discard)

    async def _unbind(self, uid: str, pod: dict[str, Any]) -> None:
        if await unbind_misbound(self.client, pod, component=self.config.name):
            self._unbinds.forget(uid)
        else:
            log.error("cannot delete pod %s; trying again", objects.pod_key(pod))
            self._unbinds.refused(uid, now=self.clock())
            self.misbound.setdefault(uid, pod)

    async def wait_for_binds(self) -> None:
        while self._binds:
            await asyncio.gather(*list(self._binds), return_exceptions=True)

    async def _report_failure(self, pod: dict[str, Any], message: str) -> None:
        """An Event and a PodScheduled=False condition, so `kubectl describe` says why: when the reason
        changes, and again every `RETELL_SECONDS` while it holds."""
        uid, now = objects.pod_uid(pod), self.clock()
        told = self._told.get(uid)
        if told is not None and told[0] == message and now - told[1] < RETELL_SECONDS:
            return
        if len(self._told) >= 2 * len(self.pending) + 64:  # those no longer pending, now and then
            self._told = {known: said for known, said in self._told.items() if known in self.pending}
        namespace, name = objects.meta(pod)["namespace"], objects.meta(pod)["name"]
        condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
        try:
            await self.client.patch(
                Pod.Status,
                name,
                {"status": {"conditions": [condition]}},
                namespace=namespace,
                patch_type=PatchType.STRATEGIC,
            )
        except READ_ERRORS as error:
            log.warning("pod %s/%s: could not record why it is unschedulable: %s", namespace, name, error)
            return  # the API server refuses this scheduler's writes: an Event would fare no better
        self._told[uid] = (message, now)
        involved = {"kind": "Pod", "name": name, "namespace": namespace, "uid": objects.meta(pod).get("uid")}
        await events.record(
            self.client,
            events.warning(
                involved=involved, reason="FailedScheduling", message=message, component=self.config.name
            ),
        )

    # ---- running ------------------------------------------------------------------------------------------

    def lead(self, holds: Callable[[], bool] = lambda: True) -> None:
        """Start binding, for as long as `holds()` (the elector's renew deadline) says the Lease is ours: it
        is asked before each bind starts, so binding stops at the deadline, not when the elector notices."""
        self.is_leader = True
        self._holds = holds
        self._wakeup.set()

    @property
    def leading(self) -> bool:
        return self.is_leader and self._holds()

    async def step_down(self, *, grace: float) -> None:
        """Leadership is lost: bind nothing more, and resolve the binds in flight before another replica may
        start binding (`grace` seconds, the lease duration less the renew deadline).

        Binds get the grace to finish. Any still running are then cancelled, so that none sends its next
        write, and each pod is read back: what the log and the cache say is what the API server holds, not
        a guess. A write already on the wire when cancelled may still land; the API server refuses a second
        Binding of a bound pod, and the new leader's watch counts whatever landed.
        """
        self.is_leader = False
        pending = list(self._binds)
        if pending:
            _, late = await asyncio.wait(pending, timeout=max(grace, 0.0))
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        for uid in list(self.cache.assumed):
            await self._read_back(uid)

    async def _read_back(self, uid: str) -> None:
        namespace, _, name = self.cache.names.get(uid, "/").partition("/")
        pod = {"metadata": {"uid": uid, "namespace": namespace, "name": name}}
        try:
            body = await asyncio.wait_for(read_back(self.client, pod, delays=(0.0,)), timeout=5.0) or {}
        except (TimeoutError, BindError) as error:
            log.error(
                "pod %s/%s: bind cut short at loss of leadership, outcome unknown: %s", namespace, name, error
            )
            self.cache.forget(pod)
            return
        if objects.pod_uid(body) == uid and objects.node_name(body):
            log.info(
                "pod %s/%s: bound to %s before leadership was lost", namespace, name, objects.node_name(body)
            )
            self.cache.finish_binding(body)
        else:
            log.warning(
                "pod %s/%s: not bound at loss of leadership; the next leader schedules it", namespace, name
            )
            self.cache.forget(pod)

    @property
    def ready(self) -> bool:
        return all(self.synced.values())

    async def run(self) -> None:
        """Watch nodes and pods, and schedule while leader, until cancelled."""
        # Namespaces for fault domains and the namespace selectors of pod affinity terms, Queues with tenant
        # queues, PodGroups with gangs.
        optional = (
            (Namespace, self.on_namespaces_listed, self.on_namespace_event, True),
            (QUEUE_RESOURCE, self.on_queues_listed, self.on_queue_event, self.config.queues),
            (POD_GROUP_RESOURCE, self.on_pod_groups_listed, self.on_pod_group_event, self.config.gangs),
        )
        await asyncio.gather(
            *(
                reflect(
                    self.client, kind, on_list=listed, on_event=changed, namespaced=kind is POD_GROUP_RESOURCE
                )
                for kind, listed, changed, wanted in optional
                if wanted
            ),
            reflect(
                self.client, Node, on_list=self.on_nodes_listed, on_event=self.on_node_event, namespaced=False
            ),
            reflect(
                self.client, Pod, on_list=self.on_pods_listed, on_event=self.on_pod_event, namespaced=True
            ),
            self.scheduling_loop(),
            self.reporting_loop(),
        )

    async def reporting_loop(self) -> None:
        """Write the Warning Events for the objects skipped, apart from the handlers that skip them."""
        while True:
            await self.problems.waiting.wait()
            await self.problems.send(self.client, component=self.config.name)

    async def scheduling_loop(self) -> None:
        while True:
            if self.ready:
                try:
                    await self.schedule_pending()
                except Exception:  # a bug must not stop every other pod from being scheduled
                    log.exception("scheduling round failed; continuing")
            delay = self.queue.next_ready_in()
            self._wakeup.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._wakeup.wait(), timeout=1.0 if delay is None else max(delay, 0.01)
                )


def _moved(placement: Placement, room: Placement | None) -> bool:
    """Whether `placement` takes other GPUs, or another node, than the `room` kept for its pod."""

    def taken(where: Placement) -> tuple[str, list[tuple[int, ...]]]:
        return where.node, [assignment.gpus for assignment in where.assignments]

    return room is None or taken(placement) != taken(room)


def _priority(pod: Mapping[str, Any]) -> int:
    return objects.priority(pod)


def _spec_changed(before: Mapping[str, Any], after: Mapping[str, Any]) -> bool:
    """A pending pod whose annotations or resources changed may fit now; a status update alone changes
    nothing for placement."""
    return objects.meta(before).get("annotations") != objects.meta(after).get("annotations") or before.get(
        "spec"
    ) != after.get("spec")
