"""Defragmentation in the live cluster: pods that opted in are moved so that a pod that fits nowhere gets in.

A pending pod the engine finds no room for asks `placement.defrag.plan_room` for the fewest moves that open
some. A move is an eviction through the `pods/eviction` subresource, so PodDisruptionBudgets hold (the API
server refuses with 429 and the plan stops there); the evicted pod's controller recreates it and the
scheduler places it again like any other. Only pods with the tenant's `gpufrac.io/movable: "true"`, owned
by a controller, and running for at least `min_runtime` seconds are moved; so a pod moved once is not moved
again before that. Each eviction is told on both sides with an Event.

While the moved pods terminate the pending pod waits for them (`waits`); once they are all gone, their
room is kept for it in the cache (`SchedulerCache.keep_room`) until it is decided, so that no other pod
takes it meanwhile. A plan whose pods do not go within `timeout` seconds is given up, and the pod is
decided as any other.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import lightkube
import numpy as np
from prometheus_client import Counter as PromCounter

from gpufrac import contract
from gpufrac.cluster.model import Placement, PodDemand
from gpufrac.kubeapi import events
from gpufrac.kubeapi.client import API_ERRORS
from gpufrac.kubeapi.eviction import evict
from gpufrac.placement.defrag import Room, plan_room
from gpufrac.placement.framework import Policy
from gpufrac.scheduler import objects
from gpufrac.scheduler.cache import SchedulerCache

log = logging.getLogger("gpufrac.scheduler")
REASON = "GPUDefragmentation"


@dataclass
class _Plan:
    """A pending pod's room, and the moved pods it still waits for (uids)."""

    placement: Placement
    leaving: set[str]
    deadline: float


class Mover:
    def __init__(
        self,
        client: lightkube.AsyncClient,
        cache: SchedulerCache,
        *,
        component: str,
        min_runtime: float,
        max_moves: int,
        moves: PromCounter,
        timeout: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.client, self.cache, self.component = client, cache, component
        self.min_runtime, self.max_moves, self.timeout = min_runtime, max_moves, timeout
        self.clock, self.wall_clock = clock, wall_clock
        self.moves = moves  # the scheduler's metric, by outcome
        self.plans: dict[str, _Plan] = {}  # pending pod uid -> its plan
        # Pods whose eviction was refused, and until when no plan counts on them: the next plan finds others.
        self.refused: dict[str, float] = {}

    def movable(self) -> dict[str, PodDemand]:
        """The bound pods that may be moved now, by uid, with the demand they are placed again with."""
        found: dict[str, PodDemand] = {}
        oldest = self.wall_clock() - self.min_runtime
        now = self.clock()
        self.refused = {uid: until for uid, until in self.refused.items() if until > now}
        for uid, pod in self.cache.bound.items():
            since = objects.movable_since(pod)
            if (
                since is None
                or since > oldest
                or uid in self.refused
                or uid not in self.cache.state.placements
            ):
                continue
            try:  # placed again within the fault domain its sm-sharing shares were placed in
                demand = objects.pod_demand(pod, fault_domain=self.cache.state.placements[uid].fault_domain)
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
        self, uid: str, pod: Mapping[str, Any], demand: PodDemand, policy: Policy, rows: np.ndarray
    ) -> bool:
        """Plan and start the moves that let `pod` in among `rows`; True when pods are on their way out and
        the pod should wait for them."""
        movable = self.movable()
        if uid in self.plans or not movable:
            return False
        room = plan_room(
            self.cache.snapshot(), demand, policy, movable=movable, max_moves=self.max_moves, rows=rows
        )
        if room is None:
            return False
        leaving = await self._evict(pod, room)
        if not leaving:
            return False
        # The watch may have told of some going while the evictions were sent.
        leaving &= self.cache.bound.keys()
        self.plans[uid] = _Plan(room.placement, leaving, self.clock() + self.timeout)
        if not leaving:
            self.cache.keep_room(uid, room.placement)
        return True

    async def _evict(self, pending: Mapping[str, Any], room: Room) -> set[str]:
        """Evict the plan's pods in order, stopping at the first refused; the uids of those evicted."""
        leaving: set[str] = set()
        target = objects.pod_key(pending)
        for move in room.moves:
            victim = self.cache.bound.get(move.source.pod)
            if victim is None:
                break
            meta = objects.meta(victim)
            try:
                await evict(self.client, meta["name"], namespace=meta["namespace"])
            except lightkube.ApiError as error:
                if error.status.code == 404:
                    leaving.add(move.source.pod)
                    continue
                refused = error.status.code == 429
                self.moves.labels("refused" if refused else "failed").inc()
                self.refused[move.source.pod] = self.clock() + self.timeout
                why = "a PodDisruptionBudget forbids it" if refused else error.status.message
                await self._tell(pending, f"cannot move pod {objects.pod_key(victim)} to make room: {why}")
                break
            except API_ERRORS as error:
                self.moves.labels("failed").inc()
                log.error("cannot evict pod %s: %s", objects.pod_key(victim), error)
                break
            self.moves.labels("evicted").inc()
            leaving.add(move.source.pod)
            await self._tell(victim, f"moved to make room for pod {target} on {room.placement.node}")
        if leaving:
            message = f"moving {len(leaving)} pod(s) on the cluster to make room on {room.placement.node}"
            log.info("pod %s: %s", target, message)
            await self._tell(pending, message)
        return leaving

    async def _tell(self, pod: Mapping[str, Any], message: str) -> None:
        meta = objects.meta(pod)
        involved = {"kind": "Pod", "name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"]}
        await events.record(
            self.client,
            events.warning(involved=involved, reason=REASON, message=message, component=self.component),
        )
