"""Making room for a pod that fits nowhere: whose pods may go (preemption within its queue, reclaim across
queues), for which pods (the pod, or the members its gang still needs, planned for at once), and with
what limits; the mover plans and carries out the evictions. Apart from the loop so that the loop keeps to
taking pods from the queue and binding them.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpufrac import contract
from gpufrac.cluster.model import Placement, PodDemand
from gpufrac.contract import queues
from gpufrac.contract.podgroups import group_of
from gpufrac.contract.queues import Resource
from gpufrac.placement import tenancy
from gpufrac.placement.cache import shape_key
from gpufrac.placement.framework import Policy
from gpufrac.placement.preemption import placement_without
from gpufrac.scheduler import constraints, objects
from gpufrac.scheduler.cache import SchedulerCache
from gpufrac.scheduler.config import SchedulerConfig
from gpufrac.scheduler.devices import Hold
from gpufrac.scheduler.gangs import Gangs, members_of
from gpufrac.scheduler.mover import LONGEST_GRACE_SECONDS, PREEMPT, RECLAIM, Allow, Mover
from gpufrac.scheduler.tenants import Tenants

log = logging.getLogger("gpufrac.scheduler")

# Per queue, the running pods any pod may evict, as (priority, when they started running): how long each
# must have run depends on who would evict it (`Evictions._preemptible`, `Evictions._reclaim_pool`).
Pool = dict[str, dict[str, tuple[int, float]]]
# How long past its grace period a pod being deleted still counts as room on its way (the kubelet stopping
# its containers and the API server hearing of it take seconds, not minutes). How far ahead its grace period
# may end is `LONGEST_GRACE_SECONDS`, which no pod evicted here passes: its own can be a year.
STUCK_AFTER_SECONDS = 60.0
# The most asks kept as fruitless at once: past it they are forgotten, and planned for again.
FRUITLESS_ASKS = 10_000
# The CPU seconds a scheduling round spends planning evictions; past them the round's other pods wait for the
# next round, whose first pods are again those of the queues furthest below their fair share. A tenant's
# thousands of pods that fit nowhere, each of its own spec (`_ask` takes replicas as one), beside thousands of
# preemptible pods of its queue, cost some 13 ms of plan each, and held every round for a minute.
PLANNING_SECONDS_PER_ROUND = 1.0


class Evictions:
    """The loop's evictions, on its cache, queues, gangs and pending pods (read live: `pending` is the loop's
    own dict)."""

    def __init__(
        self,
        *,
        cache: SchedulerCache,
        tenants: Tenants,
        gangs: Gangs,
        mover: Mover,
        pending: Mapping[str, dict[str, Any]],
        settings: SchedulerConfig,
        fault_domain: Callable[[Mapping[str, Any]], str],
        clock: Callable[[], float],
        cpu_clock: Callable[[], float] = time.process_time,
    ) -> None:
        self.cache, self.tenants, self.gangs, self.mover = cache, tenants, gangs, mover
        self.pending, self.config, self.fault_domain, self.clock = pending, settings, fault_domain, clock
        self._evictable_at: tuple[float, Pool, dict[str, BoundGang]] | None = None
        self._books: tuple[float, dict[str, list[str]], Counter[str]] | None = None  # `_gang_books`
        self._gathered: dict[str, float] = {}  # pod group -> when its members were last planned for
        # Asks no eviction could make room for (`_ask`), and the cluster as it was then (`_generation`).
        self._fruitless: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        self._changes = 0  # the cluster changes the loop told of (`cluster_changed`)
        self._cpu_clock, self._planned = cpu_clock, 0.0  # CPU seconds of planning this round (`new_round`)
        self._told_spent = False  # whether this round's log says its planning is spent

    def new_round(self) -> None:
        """A scheduling round begins: its planning has `PLANNING_SECONDS_PER_ROUND` to spend."""
        self._planned, self._told_spent = 0.0, False

    def cluster_changed(self) -> None:
        """Pods or nodes came, went or changed: room may be made now where none could."""
        self._changes += 1

    def _room_coming(
        self, pod: Mapping[str, Any], demand: PodDemand, rows: np.ndarray, policy: Policy
    ) -> bool:
        """Whether the pod would fit among `rows` once the pods being deleted there are gone (the room, and
        the rules of the pods placed, without them): evicted ones, maybe, whose room is on its way (kept for
        the pod they went for by a scheduler that may since have restarted and forgotten). Then nothing more
        is evicted until they are gone, as kube-scheduler preempts no more while its victims terminate:
        evicting by what they still hold would take twice what is needed. Pods deleted where they would not
        make room stop nothing, nor do pods still there `STUCK_AFTER_SECONDS` past their grace period (a
        finalizer no one removes, a node gone) or whose grace period ends over `LONGEST_GRACE_SECONDS` from
        now: a tenant could otherwise hold every eviction on its node back for ever."""
        bound, pods_on = self.cache.bound, self.cache.state.pods_on
        now = self.mover.wall_clock()
        going = [
            uid
            for row in rows.tolist()
            for uid in pods_on[row]
            if uid in bound
            and (due := objects.deletion_due(bound[uid])) is not None
            and due - LONGEST_GRACE_SECONDS < now < due + STUCK_AFTER_SECONDS
        ]
        if not going:
            return False
        rows = rows[self.cache.neighbours_allow(pod, rows, going)[0]]
        return placement_without(self.cache.state, demand, policy, rows, going) is not None

    async def make_room(
        self,
        uid: str,
        pod: dict[str, Any],
        demand: PodDemand,
        rows: np.ndarray,
        open_rows: np.ndarray,
        policy: Policy,
        *,
        capped: bool = False,
    ) -> bool:
        """Evict pods to let the pod in, off device-plugin nodes, whose GPUs are the kubelet's to give: first
        by moving pods that opted in (placed again as shares are, on reserved GPUs), else by reclaiming from
        queues over their fair share when its own is below its quota, or by preempting lower priorities of
        its queue. `capped`: its queue would pass a limit with it, so only preemption in its queue may help,
        and only if the pods preempted bring it within. A gang member is planned for with the members its
        gang still needs, all at once (moves make room for one pod: none for them). A pod of
        `preemptionPolicy: Never` preempts and reclaims nothing, as Kubernetes promises; pods that opted in
        may still be moved for it. `rows`: where it may go as things are; `open_rows`: where it may go by
        the nodes' own rules, which victims' going may open to it (the rules of the pods there). True when
        pods are on their way out.

        An ask no eviction could make room for is not planned for again until the cluster changes or a
        second passes (`_generation`): a Deployment's replicas that fit nowhere would each pay a plan over
        every victim, at every try. A round plans for at most `PLANNING_SECONDS_PER_ROUND` of CPU."""
        if uid in self.mover.plans:
            return False  # its room is on its way
        if self._planned >= PLANNING_SECONDS_PER_ROUND:
            if not self._told_spent:
                self._told_spent = True
                log.info(
                    "eviction planning spent its %gs of this round: the pods left wait for the next",
                    PLANNING_SECONDS_PER_ROUND,
                )
            return False
        ask, generation = self._ask(pod, demand, rows, open_rows, capped), self._generation()
        if ask is not None and self._fruitless.get(ask) == generation:
            return False
        started = self._cpu_clock()
        try:
            made = await self._make_room(uid, pod, demand, rows, open_rows, policy, capped=capped)
        finally:
            self._planned += self._cpu_clock() - started
        if made:
            return True
        if ask is not None:
            if len(self._fruitless) >= FRUITLESS_ASKS:
                self._fruitless.clear()
            self._fruitless[ask] = generation
        return False

    def _ask(
        self, pod: Mapping[str, Any], demand: PodDemand, rows: np.ndarray, open_rows: np.ndarray, capped: bool
    ) -> tuple[Any, ...] | None:
        """What a plan for the pod depends on besides the cluster: its demand, queue, priority, spec and
        labels (the rules it and the pods placed have for each other), and where it may go. None for a
        gang's member, whose plan takes in the members its gang still needs."""
        if self.config.gangs and group_of(pod) is not None:
            return None
        metadata = objects.meta(pod)
        return (
            shape_key(demand),
            demand.priority,
            self.tenants.tenant(pod),
            capped,
            metadata.get("namespace"),
            json.dumps([pod.get("spec"), metadata.get("labels")], sort_keys=True, default=str),
            rows.tobytes(),
            open_rows.tobytes(),
        )

    def _generation(self) -> tuple[Any, ...]:
        """The cluster as plans see it: the changes told of, the pods placed and the plans under way, and the
        second the evictable pods were read in (pods age into evictable ones, refusals expire)."""
        self._evictable()  # read again where over a second old
        assert self._evictable_at is not None
        return (self._changes, len(self.cache.state.placements), len(self.mover.plans), self._evictable_at[0])

    async def _make_room(
        self,
        uid: str,
        pod: dict[str, Any],
        demand: PodDemand,
        rows: np.ndarray,
        open_rows: np.ndarray,
        policy: Policy,
        *,
        capped: bool,
    ) -> bool:
        held = self.cache.hold_matrix()[0]
        rows, open_rows = rows[~np.isin(rows, held)], open_rows[~np.isin(open_rows, held)]
        # Room on its way is no help to a pod past its queue's limit: what it waits for is its queue's pods.
        if not capped and self._room_coming(pod, demand, open_rows, policy):
            return False
        members = self._still_needed(uid, pod, demand, open_rows)
        if not members:  # a gang whose members could not all run even then: nothing is evicted for it
            return False
        asked = together([wanted for *_, wanted, _ in members])
        # Pods moved or reclaimed free nothing of the pod's queue: only where it (or its gang) goes may take
        # it past a limit, which for a portion on a GPU larger than the median is more than it was judged by.
        as_placed = self._within_as_placed(pod, asked)
        if not capped and len(members) == 1:
            with self.cache.device_view(Hold.RESERVED):
                if await self.mover.make_room(uid, pod, demand, policy, rows, as_placed):
                    return True
        if not self.config.preemption or objects.never_preempts(pod):
            return False
        preemptible, reclaimable = self.victims(pod, asked)
        # As planned: a plan releases its victims from the state while it weighs them, and puts them back.
        placements = dict(self.cache.state.placements) if preemptible or reclaimable else {}
        tenant = self.tenants.tenant(pod)
        contested = self.tenants.reclaiming(tenant, asked) if reclaimable else set()
        pool, gangs = self._evictable()
        reclaimed_gangs = _staying_apart(gangs, self._reclaim_pool(pool, tenant, pool.keys() - {tenant}))

        def going_of(gangs: Mapping[str, BoundGang]) -> Callable[[Sequence[str]], list[str]]:
            """The victims with the members of their gangs that cannot run without them, which the mover
            evicts with them: what leaves is what a queue's limit and fair share are judged by."""
            return lambda victims: [m for m in leaving_with(victims, gangs) if m in placements]

        going, reclaimed_going = going_of(gangs), going_of(reclaimed_gangs)

        def within_limit(victims: Sequence[str], placed: Sequence[Placement] | None = None) -> bool:
            """Within its queue's limits with `victims` gone: as asked while the plan is sought (a pod within
            them so needs no victim for them), then as `placed`, which for a portion may be more."""
            if not capped and placed is None:
                return True
            freeing = [placements[v] for v in going(victims)]
            return self.tenants.past_limit(tenant, asked, freeing, placed=placed) is None

        def within_surplus(victims: Sequence[str], placed: Sequence[Placement] | None = None) -> bool:
            """Each victim was offered alone (`victims`): together they must leave every queue its share; and
            with the pod where the plan puts it, its queue must stay within its quota and limits."""
            taken: dict[str, list[Placement]] = {}
            for victim in reclaimed_going(victims):
                taken.setdefault(self.tenants.tenant(self.cache.bound.get(victim, {})), []).append(
                    placements[victim]
                )
            covered = all(
                self.tenants.surplus_covers(queue, held, contested) for queue, held in taken.items()
            )
            quota_kept = placed is None or bool(self.tenants.reclaiming(tenant, asked, placed=placed))
            return covered and quota_kept and as_placed(victims, placed)

        lost = _WorkLost(self.cache, placements, self.mover.wall_clock())
        # Reclaim first, as KAI Scheduler's actions run (reclaim, then preempt): a queue owed its quota takes
        # back what others borrowed before it evicts its own lower priorities.
        for victims, why, allow, goes in (
            ({} if capped else reclaimable, RECLAIM, within_surplus, reclaimed_going),
            (preemptible, PREEMPT, within_limit, going),
        ):
            if victims and await self.mover.preempt(
                members, policy, victims, why, _only_of(victims, goes, allow), lost, goes
            ):
                return True
        # Past a limit, the pod may fit where it is: room is not what its queue's own pods must give up.
        return bool(
            capped
            and len(members) == 1
            and preemptible
            and await self.mover.preempt_to_limit(
                (uid, pod, demand, rows),
                policy,
                preemptible,
                _only_of(preemptible, going, within_limit),
                lost,
                going,
            )
        )

    def _within_as_placed(self, pod: Mapping[str, Any], demand: PodDemand) -> Allow:
        """Whether a room other queues' pods leave (moved, or reclaimed) keeps the pod's queue within its
        limits with the pod (or its gang's members, which `demand` stands for) as placed (always, while a
        plan is sought: it was judged as asked)."""
        tenant = self.tenants.tenant(pod)

        def allowed(victims: Sequence[str], placed: Sequence[Placement] | None = None) -> bool:
            queued = self.config.queues and placed is not None
            return not queued or self.tenants.past_limit(tenant, demand, placed=placed) is None

        return allowed

    def _still_needed(
        self, uid: str, pod: dict[str, Any], demand: PodDemand, rows: np.ndarray
    ) -> list[tuple[str, dict[str, Any], PodDemand, np.ndarray]]:
        """The pods to make room for, each with the rows the nodes' own rules leave it among `rows`: the pod
        alone, or with the pending members of its gang that it takes to reach `minMember` (oldest first);
        none when its gang has too few pending to get there."""
        alone = [(uid, pod, demand, rows)]
        group = group_of(pod) if self.config.gangs else None
        spec = self.gangs.spec(group) if group is not None else None
        if group is None or spec is None:
            return alone
        gang = self.gangs.gangs.get(group)
        pending, bound = self._gang_books()
        needed = spec.min_member - bound[group] - (len(gang.held) if gang else 0)
        if needed <= 1:
            return alone
        now = self.clock()
        if now - self._gathered.get(group, -math.inf) < 1.0:
            return []  # another of its members was planned for within the second, with the same mates
        self._gathered[group] = now
        members = list(alone)
        for other in pending.get(group, ()):
            if len(members) >= needed:
                break
            body = self.pending.get(other)
            if other == uid or body is None or group_of(body) != group:  # bound, gone or moved since
                continue
            if constraints.refusal(body):  # it will not be placed as it is: nothing is evicted for it
                continue
            try:
                wanted = objects.pod_demand(body, fault_domain=self.fault_domain(body))
            except contract.ContractError:
                continue
            eligible, _ = self.cache.open_rows(body, gpus=True)
            members.append((other, body, wanted, eligible[np.isin(eligible, rows)]))
        return members if len(members) >= needed else []

    def _gang_books(self) -> tuple[dict[str, list[str]], Counter[str]]:
        """Per pod group, its pending members (uids, oldest first) and its members bound: one pass over the
        pending and bound pods a second for every group. A tenant's gang members that fit nowhere each ask
        for room; had each read every pod again, a PodGroup of thousands (or thousands of PodGroups) would
        hold the loop for hours a round. A member that arrived within the second is missed until the next."""
        now = self.clock()
        if self._books is None or now - self._books[0] >= 1.0:
            grouped = ((group_of(body), objects.created(body), uid) for uid, body in self.pending.items())
            pending: dict[str, list[str]] = {}
            for group, _, uid in sorted((g, created, uid) for g, created, uid in grouped if g is not None):
                pending.setdefault(group, []).append(uid)
            bound = members_of(self.gangs.index.specs.keys(), self.cache.bound.values())
            self._books = (now, pending, bound)
            self._gathered = {group: at for group, at in self._gathered.items() if now - at < 1.0}
        return self._books[1], self._books[2]

    def victims(self, pod: Mapping[str, Any], demand: PodDemand) -> tuple[dict[str, int], dict[str, int]]:
        """The running pods `pod` may preempt (its queue's, of lower priority) and reclaim (of queues over
        their fair share, when its queue's use with it stays within its quota; only pods whose going leaves
        their queue at its fair share at least), by uid, with priorities.
        Only pods this scheduler placed, below `protected_priority`, running long enough (`_preemptible`,
        `_reclaim_pool`); and a gang's member only if the members that would go with it (`BoundGang.leaving`)
        may go too, counted together."""
        tenant, priority = self._queue_of(pod), objects.priority(pod)
        over: set[str] = set()
        contested: set[Resource] = set()
        if self.config.queues:
            if not self.tenants.weighed(objects.pod_uid(pod)):  # shares that count the pod, to reclaim by
                self.tenants.outdated()
            self.tenants.rank(self.cache, self.pending)  # fresh use and shares, at most a second old
            contested = self.tenants.reclaiming(tenant, demand)
            if contested:
                over = self.tenants.over_share() - {tenant}
        pool, gangs = self._evictable()
        preemptible = {
            uid: theirs for uid, theirs in self._preemptible(pool, tenant).items() if theirs < priority
        }
        placements = self.cache.state.placements
        reclaim_pool = self._reclaim_pool(pool, tenant, over)
        reclaimed_gangs = _staying_apart(gangs, reclaim_pool)
        reclaimable = {
            uid: theirs
            for queue, candidates in reclaim_pool.items()
            for uid, theirs in candidates.items()
            if uid in placements
            and self.tenants.surplus_covers(
                queue,
                [placements[m] for m in leaving_with([uid], reclaimed_gangs) if m in placements],
                contested,
            )
        }
        return able_to_leave(preemptible, gangs), able_to_leave(reclaimable, reclaimed_gangs)

    def _preemptible(self, pool: Pool, tenant: str) -> dict[str, int]:
        """The pods of `pool` a pod of `tenant` may preempt (its own queue's) by how long they ran: the
        queue's `preemptMinRuntime` (`queues.preempt_min_runtime`), else `--min-runtime`."""
        runtime = queues.preempt_min_runtime(self._queue_specs(), tenant, self.config.min_runtime)
        return _running_for(pool.get(tenant, {}), self.mover.wall_clock() - runtime)

    def _reclaim_pool(self, pool: Pool, tenant: str, others: Iterable[str]) -> dict[str, dict[str, int]]:
        """Per queue of `others`, the pods of `pool` a pod of `tenant` may reclaim by how long they ran: the
        `reclaimMinRuntime` the two queues' places in the tree give (`queues.reclaim_min_runtime`), else
        `--min-runtime`."""
        specs, now, default = self._queue_specs(), self.mover.wall_clock(), self.config.min_runtime
        return {
            queue: _running_for(
                pool.get(queue, {}), now - queues.reclaim_min_runtime(specs, tenant, queue, default)
            )
            for queue in others
        }

    def _queue_specs(self) -> Mapping[str, queues.QueueSpec]:
        """The queues whose rules apply: none without `--queues`, where every pod is in one."""
        return self.tenants.specs if self.config.queues else {}

    def _evictable(self) -> tuple[Pool, dict[str, BoundGang]]:
        """The running pods any pod may evict at all (how long they ran aside), by queue, with priorities
        and when they started: this scheduler's, below `protected_priority`, not being deleted unless it
        would take longer than an eviction's grace; and each bound gang member's gang. A pass over every
        bound pod, so kept a second: a burst of pods that fit nowhere must not each pay it."""
        now = self.clock()
        if self._evictable_at is not None and now - self._evictable_at[0] < 1.0:
            return self._evictable_at[1], _without(self._evictable_at[2], self.mover.in_flight()[1])
        pool: Pool = {}
        by_group: dict[str, BoundGang] = {}
        gangs: dict[str, BoundGang] = {}
        slow_after = self.mover.wall_clock() + LONGEST_GRACE_SECONDS
        for uid, victim in self.cache.bound.items():
            # Only a gang gpufrac keeps together is one: a label alone, which a tenant may put on any pod,
            # would bind pods that may not go to one that may, and so shield them all.
            group = group_of(victim) if self.config.gangs else None
            if (
                group is not None
                and (spec := self.gangs.spec(group)) is not None
                and not objects.terminating(victim)
            ):
                gangs[uid] = by_group.setdefault(group, BoundGang([], spec.min_member))
                gangs[uid].members.append(uid)
            since = objects.running_since(victim)
            if (due := objects.deletion_due(victim)) is not None and due > slow_after:
                # Deleted with a longer grace period than an eviction gives, by its tenant: evicted, it goes
                # sooner, and costs no more than it already does.
                since = objects.running_since(victim, going=True)
            theirs = objects.priority(victim)
            if (
                objects.scheduler_name(victim) == self.config.name
                and theirs < self.config.protected_priority
                and since is not None
                and uid in self.cache.state.placements
            ):
                pool.setdefault(self._queue_of(victim), {})[uid] = (theirs, since)
        self._evictable_at = (now, pool, gangs)
        return pool, _without(gangs, self.mover.in_flight()[1])

    def _queue_of(self, pod: Mapping[str, Any]) -> str:
        """The queue a pod preempts within: its own with queues on; otherwise every pod is in one, as a
        queue label a tenant may put on any pod must not take its pods out of the others' reach."""
        return self.tenants.tenant(pod) if self.config.queues else queues.DEFAULT_QUEUE


@dataclass(frozen=True)
class BoundGang:
    """A gang's bound members and how many it needs running. Members past `min_member` may go alone, as in
    KAI Scheduler: the rest still run. One more, and the rest cannot run, so they all go: a victim's gang
    mates are never left running without it, and a gang that can spare members does not shield them."""

    members: list[str]  # running, not on their way out
    min_member: int
    staying: int = 0  # members running besides `members` that no eviction takes (`_staying_apart`)

    def leaving(self, chosen: Collection[str]) -> list[str]:
        """The members that go if `chosen` of them are evicted."""
        if len(self.members) + self.staying - len(chosen) >= self.min_member:
            return [member for member in self.members if member in chosen]
        return list(self.members)


def _running_for(candidates: Mapping[str, tuple[int, float]], since: float) -> dict[str, int]:
    """The candidates (priority, when they started) running since `since` at least, with their priorities."""
    return {uid: theirs for uid, (theirs, started) in candidates.items() if started <= since}


def leaving_with(victims: Sequence[str], gangs: Mapping[str, BoundGang]) -> list[str]:
    """The victims, and the members of their gangs that go with them (`BoundGang.leaving`)."""
    chosen: dict[int, set[str]] = {}
    for victim in victims:
        if victim in gangs:
            chosen.setdefault(id(gangs[victim]), set()).add(victim)
    going = (gangs[v].leaving(chosen[id(gangs[v])]) if v in gangs else [v] for v in victims)
    return list(dict.fromkeys(member for members in going for member in members))


def _without(gangs: dict[str, BoundGang], gone: Collection[str]) -> dict[str, BoundGang]:
    """The gangs less their members already evicted (by an earlier plan, not gone yet): a gang that spared
    one for that plan has one less to spare for the next."""
    if not any(uid in gangs for uid in gone):
        return gangs
    trimmed: dict[str, BoundGang] = {}
    for gang in {id(gang): gang for gang in gangs.values()}.values():
        kept = BoundGang([m for m in gang.members if m not in gone], gang.min_member, gang.staying)
        trimmed.update(dict.fromkeys(kept.members, kept))
    return trimmed


def _staying_apart(
    gangs: dict[str, BoundGang], pool: Mapping[str, Mapping[str, int]]
) -> dict[str, BoundGang]:
    """The gangs as reclaim sees them: members no eviction may take (protected, too young, another
    scheduler's) stay and count toward `min_member`, and the rest go without them. A gang's members are its
    tenant's to choose, so a pod without GPUs of the protected priority, or one recreated every few minutes,
    would otherwise shield a whole borrowed gang from the queue it is owed to. (Preemption, within the
    pod's own queue, keeps such a gang whole.)"""
    evictable = {uid for queue in pool.values() for uid in queue}
    if all(uid in evictable for uid in gangs):
        return gangs
    apart: dict[str, BoundGang] = {}
    for gang in {id(gang): gang for gang in gangs.values()}.values():
        going = [member for member in gang.members if member in evictable]
        split = BoundGang(going, gang.min_member, gang.staying + len(gang.members) - len(going))
        apart.update(dict.fromkeys(going, split))
    return apart


def able_to_leave(victims: Mapping[str, int], gangs: Mapping[str, BoundGang]) -> dict[str, int]:
    """The victims whose going alone takes only victims with it (their gangs' members that could not run
    without them)."""
    return {
        uid: theirs
        for uid, theirs in victims.items()
        if all(m in victims for m in leaving_with([uid], gangs))
    }


class _WorkLost(Mapping[str, float]):
    """The GPU-seconds each victim has run, which its eviction throws away: among victims otherwise alike, a
    plan takes those that lose least. Worked out for the victims a plan weighs, when it first weighs them:
    for every victim at every plan, it was half the cost of a plan that found nothing, paid again by each
    pending pod that fits nowhere."""

    def __init__(self, cache: SchedulerCache, placements: Mapping[str, Placement], now: float) -> None:
        self._cache, self._placements, self._now = cache, placements, now
        self._known: dict[str, float | None] = {}  # None: no work to tell (no start time, or not placed)

    def __getitem__(self, victim: str) -> float:
        if victim not in self._known:
            since = objects.running_since(self._cache.bound.get(victim, {}))
            placement = self._placements.get(victim)
            gpus = None if placement is None else tenancy.held(placement, self._cache.state)[Resource.GPUS]
            self._known[victim] = (
                None if since is None or gpus is None else max(0.0, self._now - since) * gpus
            )
        known = self._known[victim]
        if known is None:
            raise KeyError(victim)
        return known

    def __iter__(self) -> Iterator[str]:
        return (victim for victim in self._placements if victim in self)

    def __len__(self) -> int:
        return sum(1 for _ in self)


def _only_of(pool: Mapping[str, int], going: Callable[[Sequence[str]], list[str]], allow: Allow) -> Allow:
    """`allow`, for sets of victims whose going takes no pod that is not in `pool` (the victims offered):
    taking more of a gang than it can spare takes all of it, and some of its members may not be evictable."""

    def allowed(victims: Sequence[str], placed: Sequence[Placement] | None = None) -> bool:
        return all(member in pool for member in going(victims)) and allow(victims, placed)

    return allowed


def together(demands: list[PodDemand]) -> PodDemand:
    """Pods asking as one, for a queue's quota and limits: what a gang's members ask for in all."""
    if len(demands) == 1:
        return demands[0]
    return PodDemand(
        demands[0].name,
        cpu_milli=sum(demand.cpu_milli for demand in demands),
        memory_mib=sum(demand.memory_mib for demand in demands),
        whole=tuple(item for demand in demands for item in demand.whole),
        shares=tuple(share for demand in demands for share in demand.shares),
        priority=max(demand.priority for demand in demands),
    )
