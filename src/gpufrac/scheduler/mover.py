"""Evictions that let a pod in that fits nowhere: moves, preemption and reclaim, carried out the same way.

A pending pod the engine finds no room for asks `placement.defrag.plan_room` for the fewest moves of pods
that opted in (`gpufrac.io/movable: "true"`, owned by a controller: their controller recreates them and the
scheduler places them again like any other), and, failing that, `placement.preemption.plan_eviction` for
the pods it may preempt or reclaim (the loop says which). Each eviction goes through the `pods/eviction`
subresource, so PodDisruptionBudgets hold (the API server refuses with 429 and the plan stops there), and is
told on both sides with an Event. No pod running for less than `min_runtime` seconds is evicted; so a pod
moved once is not moved again before that.

While the evicted pods terminate the pending pod waits for them (`waits`); once they are all gone, their
room is kept for it in the cache (`SchedulerCache.keep_room`) until it is decided, so that no other pod
takes it meanwhile. A plan whose pods do not go within `timeout` seconds is given up, and the pod is
decided as any other.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import lightkube
import numpy as np
from prometheus_client import Counter as PromCounter

from gpufrac import contract
from gpufrac.cluster.model import Placement, PodDemand
from gpufrac.kubeapi import events
from gpufrac.kubeapi.client import API_ERRORS, NOT_SENT
from gpufrac.kubeapi.eviction import evict, grace_within
from gpufrac.placement.defrag import Planner
from gpufrac.placement.framework import Policy
from gpufrac.placement.preemption import Allows, placement_without, plan_gang_eviction
from gpufrac.scheduler import constraints, objects, volumes
from gpufrac.scheduler.cache import SchedulerCache

log = logging.getLogger("gpufrac.scheduler")
# The longest grace period a pod evicted to make room gets (its own, if shorter): a day of it kept a
# reclaimed GPU a day, while the plans of others gave up waiting and evicted more.
LONGEST_GRACE_SECONDS = 600


@dataclass(frozen=True, slots=True)
class Why:
    """Why pods are evicted: the Events' reason, the verb for metrics and messages, what a victim hears."""

    reason: str
    verb: str
    done: str


MOVE = Why("GPUDefragmentation", "move", "moved to make room")
PREEMPT = Why("GPUPreemption", "preempt", "preempted by a pod of higher priority in its queue")
RECLAIM = Why(
    "GPUReclaim", "reclaim", "reclaimed by a queue below its quota, from a queue over its fair share"
)


@dataclass
class _Plan:
    """A pending pod's room, and the moved pods it still waits for (uids)."""

    placement: Placement
    leaving: set[str]
    deadline: float


class Allow(Protocol):
    """Whether a plan may evict `victims` (uids) for a pod, or a gang's members, which will take `placed`
    (None: not known yet, while a plan is sought; a fraction is then judged on the median GPU)."""

    def __call__(self, victims: Sequence[str], placed: Sequence[Placement] | None = None) -> bool: ...


def allow_any(victims: Sequence[str], placed: Sequence[Placement] | None = None) -> bool:
    return True


class Mover:
    def __init__(
        self,
        client: lightkube.AsyncClient,
        cache: SchedulerCache,
        *,
        component: str,
        min_runtime: float,
        max_moves: int,
        evictions: PromCounter,
        timeout: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.client, self.cache, self.component = client, cache, component
        self.min_runtime, self.max_moves, self.timeout = min_runtime, max_moves, timeout
        self.clock, self.wall_clock = clock, wall_clock
        self.evictions = evictions  # the scheduler's metric, by why and outcome
        self.plans: dict[str, _Plan] = {}  # pending pod uid -> its plan
        # Pods whose eviction was refused, and until when no plan counts on them: the next plan finds others.
        self.refused: dict[str, float] = {}
        self._movable_at: tuple[float, dict[str, PodDemand]] | None = None
        # Kept between plans, as the scheduler plans again and again: it remembers movable pods' shapes.
        self._planner: Planner | None = None

    def movable(self) -> dict[str, PodDemand]:
        """The bound pods that may be moved now, by uid, with the demand they are placed again with. A pass
        over every bound pod, so kept a second: a burst of pods that fit nowhere must not each pay it."""
        now = self.clock()
        if self._movable_at is None or now - self._movable_at[0] >= 1.0:
            self._movable_at = (now, self._gather())
        placed, leaving = self.cache.state.placements, self._leaving()
        return {
            uid: demand
            for uid, demand in self._movable_at[1].items()
            if not self._refused(uid) and uid in placed and uid not in leaving
        }

    def in_flight(self) -> tuple[dict[str, Placement], set[str]]:
        """The rooms promised to pending pods whose evicted pods have not all gone yet, and those pods."""
        return {uid: plan.placement for uid, plan in self.plans.items() if plan.leaving}, self._leaving()

    def _leaving(self) -> set[str]:
        """Pods evicted for a plan, not gone yet: their room is promised, so no other plan counts on them."""
        return {uid for plan in self.plans.values() for uid in plan.leaving}

    def _offered(self, victims: Iterable[str]) -> list[str]:
        """The victims a plan may count on: none whose eviction was refused lately, or already going."""
        leaving = self._leaving()
        return [victim for victim in victims if not self._refused(victim) and victim not in leaving]

    def _refused(self, uid: str) -> bool:
        """Whether the pod's eviction was refused lately (a PodDisruptionBudget), so no plan counts on it."""
        until = self.refused.get(uid)
        if until is not None and until <= self.clock():
            del self.refused[uid]
            return False
        return until is not None

    def _gather(self) -> dict[str, PodDemand]:
        found: dict[str, PodDemand] = {}
        oldest = self.wall_clock() - self.min_runtime
        for uid, pod in self.cache.bound.items():
            since = objects.movable_since(pod)
            placement = self.cache.state.placements.get(uid)
            # A pod whose constraints gpufrac cannot read would not come back; where one with persistent
            # volumes may go is known only by reading them, so it is not moved; nor is another scheduler's,
            # which that scheduler places again, not the plan.
            if (
                since is None
                or objects.scheduler_name(pod) != self.component
                or since > oldest
                or placement is None
                or constraints.refusal(pod)
                or volumes.claim_names(pod)
            ):
                continue
            try:  # placed again within the fault domain its sm-sharing shares were placed in
                demand = objects.pod_demand(pod, fault_domain=placement.fault_domain)
            except contract.ContractError:
                continue
            if not demand.whole:  # whole-GPU pods are where the room goes, never what is moved
                found[uid] = demand
        return found

    def waits(self, uid: str) -> bool:
        """Whether the pod still waits for pods moved for it; a plan past its time is given up."""
        plan = self.plans.get(uid)
        if plan is None or not plan.leaving:
            return False
        if self.clock() < plan.deadline:
            return True
        log.warning("pod %s: the pods moved for it did not go in %.0fs; deciding it anew", uid, self.timeout)
        self.forget(uid)
        return False

    def take_room(self, uid: str) -> Placement | None:
        """The room kept for the pod, no longer kept: the caller decides the pod there first."""
        plan = self.plans.pop(uid, None)
        kept = self.cache.give_room(uid)
        return kept or (plan.placement if plan is not None and not plan.leaving else None)

    def forget(self, uid: str) -> None:
        """The pod was decided, deleted or gave up waiting."""
        self.plans.pop(uid, None)
        self.cache.give_room(uid)

    def gone(self, uid: str) -> bool:
        """A pod left the cluster: if it was the last a plan waited for, keep that plan's room; True when a
        room is kept (the pending pod should be decided now)."""
        kept = False
        for pending, plan in list(self.plans.items()):
            if uid in plan.leaving:
                plan.leaving.discard(uid)
                if not plan.leaving:
                    kept = self.cache.keep_room(pending, plan.placement) or kept
        return kept

    async def make_room(
        self,
        uid: str,
        pod: Mapping[str, Any],
        demand: PodDemand,
        policy: Policy,
        rows: np.ndarray,
        allow: Allow = allow_any,
    ) -> bool:
        """Plan and start the moves that let `pod` in among `rows`, if `allow` accepts the room they open;
        True when pods are on their way out and the pod should wait for them."""
        movable = self.movable()
        if uid in self.plans or not movable:
            return False
        if self._planner is None or self._planner.policy is not policy:  # a new policy: new shapes
            self._planner = Planner(policy)
        room = self._planner.plan_room(
            self.cache.snapshot(),
            demand,
            movable=movable,
            max_moves=self.max_moves,
            rows=rows,
            where=lambda moved: self._where(moved, movable[moved]),
        )
        if room is None:
            return False
        victims = [move.source.pod for move in room.moves]
        return allow(victims, [room.placement]) and await self._start(
            [(uid, pod, room.placement)], victims, MOVE
        )

    def _where(self, uid: str, demand: PodDemand) -> np.ndarray | None:
        """The nodes a moved pod may be placed again on: those its controller's new pod may go to (the pod's
        node selector, affinity, tolerations, host ports, the pods placed), else the move would leave it
        pending; None when that is every node, so that the plan judges it by its shape like its likes."""
        rows = self.cache.eligible_rows(self.cache.bound[uid], gpus=bool(demand.shares))[0]
        return None if len(rows) == int(self.cache.state.active.sum()) else rows

    async def preempt(
        self,
        members: Sequence[tuple[str, Mapping[str, Any], PodDemand, np.ndarray]],
        policy: Policy,
        victims: Mapping[str, int],
        why: Why,
        allow: Allow = allow_any,
        lost: Mapping[str, float] | None = None,
        going: Callable[[Sequence[str]], list[str]] = list,
    ) -> bool:
        """Plan and start evicting some of `victims` (uid -> priority), never to be placed again by this
        plan, so that every one of `members` (uid, pod, demand, rows: one pod, or the members a gang still
        needs; rows the pods placed may rule out as things are, where victims' going may let it in) fits at
        once, with at most `max_moves` evicted for each, and only sets of victims that
        `allow` accepts, losing the least work (`lost`) among sets otherwise alike; True when pods are on
        their way out. `going`: victims with the pods that go with them (their gangs' other members), which
        are evicted too and which the rules of the pods placed are judged without."""
        offered = {victim: victims[victim] for victim in self._offered(victims)}
        if not offered or any(uid in self.plans for uid, *_ in members):
            return False
        plan = plan_gang_eviction(
            self.cache.snapshot(),
            [(demand, rows, self._allows(pod, going)) for _, pod, demand, rows in members],
            policy,
            victims=offered,
            max_victims=self.max_moves * len(members),
            allow=allow,
            lost=lost,
        )
        if plan is None:
            return False
        rooms = [(uid, pod, plan.placements[demand.name]) for uid, pod, demand, _ in members]
        if not allow(list(plan.victims), [placement for *_, placement in rooms]):
            return False  # judged as placed, the rooms would not let them in: none evicted for nothing
        # A gang is evicted whole: its other members could not run without the one evicted.
        evicted = going(list(plan.victims))
        return await self._start(rooms, evicted, why)

    async def preempt_to_limit(
        self,
        member: tuple[str, Mapping[str, Any], PodDemand, np.ndarray],
        policy: Policy,
        victims: Mapping[str, int],
        allow: Allow,
        lost: Mapping[str, float],
        going: Callable[[Sequence[str]], list[str]],
    ) -> bool:
        """For a pod that fits as things are (among `member`'s rows: where the rules of the pods placed let
        it in now) but would take its queue past a limit: evict the fewest of `victims` (its queue's lower
        priorities, wherever they run; the lowest first, then those that lose least work) whose going `allow`
        accepts with the pod where it goes (the queue back within, as placed), at most `max_moves`; the pod
        keeps the room it fits in now. The room plans of `preempt` look for is not what is short here, so
        they found no victim to take. True when pods are on their way out."""
        uid, pod, demand, rows = member
        offered = self._offered(victims)
        if not offered or uid in self.plans:
            return False
        placement = placement_without(self.cache.snapshot(), demand, policy, rows, ())
        if placement is None:
            return False
        offered.sort(key=lambda victim: (victims[victim], lost.get(victim, 0.0), victim))
        for count in range(1, min(self.max_moves, len(offered)) + 1):
            if allow(offered[:count], [placement]):
                return await self._start([(uid, pod, placement)], going(offered[:count]), PREEMPT)
        return False

    def _allows(self, pod: Mapping[str, Any], going: Callable[[Sequence[str]], list[str]]) -> Allows:
        """What the pods placed rule out for `pod` (`SchedulerCache.neighbours_allow`), as a plan asks it:
        with the victims named gone, and those `going` with them."""
        return lambda rows, gone: self.cache.neighbours_allow(pod, rows, going(list(gone)))[0]

    async def _start(
        self, rooms: list[tuple[str, Mapping[str, Any], Placement]], victims: list[str], why: Why
    ) -> bool:
        """Evict `victims` for the pending pods of `rooms` (uid, pod, where it goes), and keep each its room
        once they are gone."""
        leaving = await self._evict([pod for _, pod, _ in rooms], [p.node for *_, p in rooms], victims, why)
        if not leaving:
            return False
        # The watch may have told of some going while the evictions were sent.
        leaving &= self.cache.bound.keys()
        for uid, _, placement in rooms:
            self.plans[uid] = _Plan(placement, set(leaving), self.clock() + self.timeout)
            if not leaving:
                self.cache.keep_room(uid, placement)
        return True

    async def _evict(
        self, pending: list[Mapping[str, Any]], nodes: list[str], victims: list[str], why: Why
    ) -> set[str]:
        """Evict `victims` for the `pending` pods (going to `nodes`); the uids of those evicted.

        Every eviction is first asked as a dry run, which a PodDisruptionBudget refuses as it would the real
        one: the pods need every victim gone, so one refused must leave the others running, not evicted for
        nothing. The real evictions still stop at the first refused (victims under one budget pass one at a
        time, not together)."""
        if not await self._evict_each(pending, victims, why, dry_run=True):
            return set()
        target = f"pod{'s' if len(pending) > 1 else ''} {', '.join(objects.pod_key(pod) for pod in pending)}"
        where = ", ".join(sorted(set(nodes)))
        leaving = await self._evict_each(pending, victims, why, where=where)
        if leaving:
            message = f"evicting {len(leaving)} pod(s) to make room on {where} ({why.verb})"
            log.info("%s: %s", target, message)
            for pod in pending:
                await self._tell(pod, why, message)
        return leaving

    async def _evict_each(
        self,
        pending: list[Mapping[str, Any]],
        victims: list[str],
        why: Why,
        *,
        dry_run: bool = False,
        where: str = "",
    ) -> set[str]:
        """Evict `victims` in order (only asking, with `dry_run`), stopping at the first refused or gone from
        the cache; those evicted, or with `dry_run` all of them if none was refused (else none). Each evicted
        pod is told why, for which pods, on which nodes (`where`)."""
        leaving: set[str] = set()
        for name in victims:
            victim = self.cache.bound.get(name)
            if victim is None:
                break
            meta = objects.meta(victim)
            try:
                await evict(
                    self.client,
                    meta["name"],
                    namespace=meta["namespace"],
                    uid=meta.get("uid"),
                    grace_seconds=grace_within(objects.termination_grace(victim), LONGEST_GRACE_SECONDS),
                    dry_run=dry_run,
                )
            except lightkube.ApiError as error:
                if error.status.code == 404:
                    leaving.add(name)
                    continue
                refused = error.status.code == 429
                self.evictions.labels(why.verb, "refused" if refused else "failed").inc()
                self.refused[name] = self.clock() + self.timeout
                reason = "a PodDisruptionBudget forbids it" if refused else error.status.message
                for pod in pending:
                    await self._tell(pod, why, f"cannot {why.verb} {_named([victim], pod)}: {reason}")
                break
            except API_ERRORS as error:
                self.evictions.labels(why.verb, "failed").inc()
                log.error("cannot evict pod %s: %s", objects.pod_key(victim), error)
                if not dry_run and not isinstance(error, NOT_SENT):
                    # Maybe evicted, the answer lost: counted as leaving, so that the plan waits for it (up
                    # to its timeout) rather than evicting another in its place.
                    leaving.add(name)
                break
            leaving.add(name)
            if not dry_run:
                self.evictions.labels(why.verb, "evicted").inc()
                await self._tell(victim, why, f"{why.done} for {_named(pending, victim)} on {where}")
        else:
            return leaving
        return set() if dry_run else leaving

    async def _tell(self, pod: Mapping[str, Any], why: Why, message: str) -> None:
        meta = objects.meta(pod)
        involved = {"kind": "Pod", "name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"]}
        await events.record(
            self.client,
            events.warning(involved=involved, reason=why.reason, message=message, component=self.component),
        )


def _named(pods: Sequence[Mapping[str, Any]], told: Mapping[str, Any]) -> str:
    """`pods` as the tenant of `told` hears of them in its Events: by name in its own namespace, by UID in
    another, as kube-scheduler names a preemptor to its victims: no tenant learns the names of pods in a
    namespace it may not read."""
    namespace = objects.meta(told)["namespace"]
    names = [
        objects.pod_key(pod) if objects.meta(pod)["namespace"] == namespace else objects.pod_uid(pod)
        for pod in pods
    ]
    return f"pod{'s' if len(names) > 1 else ''} {', '.join(names)}"
