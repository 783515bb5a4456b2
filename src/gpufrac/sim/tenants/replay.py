"""The tenant replay: pods of several queues arrive, wait, run, are evicted and leave, in simulated time.

Each pod arrives at its creation time and waits in its queue until it can run; it runs for its duration
(`tenants.deal`) and leaves. After each instant at which something happened (arrivals, departures, the end
of an eviction's grace, a gang's timeout, a pod growing old enough to be evicted) the replay runs one
scheduling round with the scheduler's engine and rules (`scheduler/loop.py`, `scheduler/tenants.py`):

1. Fair shares (`placement.fairshare`) of the replayed cluster, from each queue's demand: what its pods hold
   plus what its waiting pods ask (shares resolved on the cluster's median GPU, as the scheduler does).
2. Placing: waiting pods are taken from the queue furthest below its fair share (`fairshare.starvation`),
   then by priority, then by age; a placement counts against its queue at once. A pod shape that found no
   room is not tried again until room comes back (a pod leaving, an eviction, a gang giving its room back),
   and a round tries at most `MAX_TRIES` pods, so a long backlog costs little per event.
3. Reclaim: the oldest waiting pod of each shape that found no room, most starved queue first, may evict
   when its queue, with it, stays within its quota (`tenancy.reclaiming`): the pods offered are those of
   other queues over their fair share whose going leaves their queue at its fair share at least
   (`tenancy.surplus_covers`) and that have run `min_runtime` at least; `placement.preemption.plan_eviction`
   picks at most `max_victims` of them (a gang's other members go too). Victims keep counting against their
   queue for `grace` seconds while they terminate, then re-enter their queue to run their whole duration
   again: the GPU-seconds they had run (grace included) are wasted. The reclaiming pod's room is taken in
   the cluster at once, so nothing else takes it, and the pod starts when its victims are gone. At most
   `MAX_RECLAIMS` plans a round.
4. Gangs: when a member's turn comes, every waiting member of its gang that fits is held (room taken, not
   running); once all are held they start together. If they are not all held `timeout` seconds after the
   first was, the held members give their room back and wait again, and the gang is not tried again until
   other room comes back (or nothing else is left to happen), so that two gangs holding halves of what each
   needs take turns rather than hold on for ever.

What the replay leaves out: priorities (the trace has none, so preemption within a queue never arises),
reclaim for gang members (the scheduler decides each member alone; here members only wait for room),
moves of pods that opted in, and node failures. A pod that fits nowhere even on the empty cluster (a gang:
all its members together) is counted and never queued.
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum, auto

import numpy as np

from gpufrac.cluster.model import Placement, PodDemand
from gpufrac.cluster.state import ClusterState
from gpufrac.contract.queues import Resource
from gpufrac.placement import fairshare, tenancy
from gpufrac.placement.cache import shape_key
from gpufrac.placement.engine import decide
from gpufrac.placement.framework import POLICIES, PolicyContext
from gpufrac.placement.preemption import plan_eviction
from gpufrac.placement.workload import Workload
from gpufrac.sim.tenants.config import TenantsConfig
from gpufrac.sim.tenants.deal import Dealt, TenantPod

# Pods one round may try to place: enough for a burst, bounded so that a long backlog stays cheap.
MAX_TRIES = 64
# Eviction plans one round may make (each a search over the cluster for the fewest victims).
MAX_RECLAIMS = 4
RESOURCES = tuple(Resource)  # the order of the last axis of the series

# What happens at one instant, in this order: room comes back first, arrivals queue before the round.
GONE, DEPART, TIMEOUT, START, ARRIVE, WAKE = range(6)


class Status(Enum):
    WAITING = auto()
    HELD = auto()  # a gang member holding its room until the whole gang can run
    RESERVED = auto()  # a reclaiming pod whose room is kept while its victims terminate
    RUNNING = auto()
    LEAVING = auto()  # evicted, terminating: still holds what it held, for `grace` seconds
    DONE = auto()
    NEVER = auto()  # fits nowhere even on the empty cluster


@dataclass(slots=True)
class _Pod:
    index: int
    spec: TenantPod
    shape: PodDemand
    asks: tenancy.Amounts
    status: Status = Status.WAITING
    key: tuple[float, float, int] = (0.0, 0.0, 0)  # its place in its queue: priority, then age
    started: float = 0.0
    run: int = 0  # counts its runs: a departure planned for an earlier run is void
    entitled_at: float | None = None  # when it first found no room while its queue could reclaim
    holds: tenancy.Amounts = field(default_factory=dict)

    @property
    def gpus(self) -> float:
        """GPUs its placement holds (a share of half a GPU: 0.5), as its queue counts them."""
        return self.holds.get(Resource.GPUS, 0.0)

    @property
    def name(self) -> str:
        return self.spec.demand.name

    @property
    def queue(self) -> str:
        return self.spec.queue


@dataclass(slots=True)
class _Gang:
    index: int  # its number in events
    members: list[int]
    since: float = 0.0  # when it last began to wait
    held: int = 0
    epoch: int = 0  # bumped whenever a timeout planned before would be void
    backoff: bool = False
    started: bool = False


@dataclass(slots=True)
class QueueTally:
    """What happened to one queue's pods; seconds and GPU-seconds of simulated time."""

    pods: int = 0  # gang members counted one by one
    gangs: int = 0
    never_fit: int = 0
    never_ran: int = 0  # still waiting when the replay ended
    waits: list[float] = field(default_factory=list)  # per start: seconds since it (re-)entered the queue
    reclaims: list[float] = field(
        default_factory=list
    )  # per pod run on reclaimed room: seconds since entitled
    entitled_waits: list[float] = field(default_factory=list)  # per entitled pod, however it got room
    gang_waits: list[float] = field(default_factory=list)  # per gang start: seconds since it began to wait
    gang_timeouts: int = 0
    evicted: int = 0
    wasted_gpu_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class TenantRun:
    queues: tuple[str, ...]  # the leaf queues, in the config's order
    nodes: int
    gpus: int
    times: np.ndarray  # (steps,) seconds: the instants after which a round ran
    usage: np.ndarray  # (steps, queues, resources): held from that instant to the next
    share: np.ndarray  # fair shares, the same shape
    demand: np.ndarray
    end: float
    tallies: dict[str, QueueTally]
    rounds: int


def replay(
    dealt: Dealt,
    config: TenantsConfig,
    *,
    policy: str,
    seed: int,
    on_arrival: Callable[[int, int], None] | None = None,
) -> TenantRun:
    return _Replay(dealt, config, policy, seed).run(on_arrival)


class _Replay:
    def __init__(self, dealt: Dealt, config: TenantsConfig, policy: str, seed: int) -> None:
        self.config = config
        self.leaves = config.leaves
        workload = Workload.from_pods(pod.demand for pod in dealt.pods)
        self.policy = POLICIES[policy](PolicyContext(rng=np.random.default_rng(seed), workload=workload))
        # Its own policy for the empty cluster, so that the checks there never reset the replay's memos.
        self.trial_policy = POLICIES[policy](
            PolicyContext(rng=np.random.default_rng(seed), workload=workload)
        )
        self.state = ClusterState(dealt.nodes)
        self.empty = ClusterState(dealt.nodes)
        self.capacity = tenancy.capacity(self.state)
        memory = self.state.gpu_mem[self.state.gpu_mem > 0]
        reference = int(np.median(memory)) if memory.size else 0
        self.pods = [
            _Pod(i, pod, shape_key(pod.demand), tenancy.asked(pod.demand, reference))
            for i, pod in enumerate(dealt.pods)
        ]
        self.by_name = {pod.name: pod for pod in self.pods}
        self.gangs: dict[str, _Gang] = {}
        for pod in self.pods:
            if pod.spec.gang is not None:
                gang = self.gangs.setdefault(pod.spec.gang, _Gang(len(self.gangs), []))
                gang.members.append(pod.index)
        self.gang_list = list(self.gangs.values())
        self.tallies = {queue: QueueTally() for queue in self.leaves}
        self.usage: dict[str, dict[Resource, float]] = {queue: {} for queue in self.leaves}
        self.asked: dict[str, dict[Resource, float]] = {queue: {} for queue in self.leaves}
        self.waiting: dict[str, dict[PodDemand, list[tuple[tuple[float, float, int], int]]]] = {
            queue: {} for queue in self.leaves
        }
        self.running: dict[str, set[int]] = {queue: set() for queue in self.leaves}
        self.blocked: set[PodDemand] = set()  # shapes that found no room since room last came back
        self.hopeless: set[tuple[PodDemand, frozenset[str]]] = set()  # eviction plans found impossible
        self.fits_empty: dict[tuple[PodDemand, int], bool] = {}
        self.events: list[tuple[float, int, int, int, int]] = []  # (time, kind, order, subject, epoch)
        self.wakes: set[float] = set()
        self.order = 0
        self.rows: list[tuple[float, np.ndarray]] = []
        self.rounds = 0

    # ---- the clock --------------------------------------------------------------------------------------

    def run(self, on_arrival: Callable[[int, int], None] | None) -> TenantRun:
        for pod in self.pods:
            self._push(pod.spec.arrival, ARRIVE, pod.index)
        arrived = reported = 0
        now = 0.0
        while True:
            if self.events:
                at = self.events[0][0]
                happened = False
                while self.events and self.events[0][0] == at:
                    _, kind, _, subject, epoch = heapq.heappop(self.events)
                    arrived += kind == ARRIVE
                    happened |= self._handle(kind, subject, epoch, at)
                if not happened:  # only void events (a timeout after its gang started): no instant at all
                    continue
                now = at
                self._round(now)
            elif not self._waiting_any() or not self._unstick(now):
                break
            self._record(now)
            if on_arrival is not None and arrived > reported:
                reported = arrived
                on_arrival(arrived, len(self.pods))
        for pod in self.pods:
            if pod.status is Status.WAITING:
                self.tallies[pod.queue].never_ran += 1
        times = np.array([time for time, _ in self.rows])
        shape = (len(self.rows), 3, len(self.leaves), len(RESOURCES))
        series = np.array([row for _, row in self.rows]).reshape(shape)
        return TenantRun(
            queues=tuple(self.leaves),
            nodes=len(self.state.names),
            gpus=int(self.capacity[Resource.GPUS]),
            times=times,
            usage=series[:, 0],
            share=series[:, 1],
            demand=series[:, 2],
            end=now,
            tallies=self.tallies,
            rounds=self.rounds,
        )

    def _push(self, time: float, kind: int, subject: int, epoch: int = 0) -> None:
        self.order += 1
        heapq.heappush(self.events, (time, kind, self.order, subject, epoch))

    def _handle(self, kind: int, subject: int, epoch: int, now: float) -> bool:
        """Carry out one event; False when it was void (planned for a run or a hold since ended)."""
        if kind == ARRIVE:
            self._arrive(self.pods[subject], now)
        elif kind == DEPART:
            pod = self.pods[subject]
            if pod.run != epoch or pod.status is not Status.RUNNING:
                return False
            self._unplace(pod, Status.DONE)
            self._room_back()
        elif kind == GONE:
            pod = self.pods[subject]
            tenancy.add(self.usage[pod.queue], pod.holds, -1)
            self._enqueue(pod, now)
            if pod.spec.gang is not None:
                self.gangs[pod.spec.gang].since = now
        elif kind == START:
            pod = self.pods[subject]
            assert pod.entitled_at is not None
            self.tallies[pod.queue].reclaims.append(now - pod.entitled_at)
            self._start(pod, now)
        elif kind == TIMEOUT:
            return self._give_back(subject, epoch)
        else:
            self.wakes.discard(now)
            return self._waiting_any()
        return True

    def _unstick(self, now: float) -> bool:
        """Nothing is left to happen but pods wait: gangs that gave their room back may try again, and pods
        a round had no time for get one. False when that round changed nothing: the replay is over."""
        for gang in self.gangs.values():
            gang.backoff = False
        return self._round(now)

    def _waiting_any(self) -> bool:
        return any(lines for lines in self.waiting.values())

    # ---- pods coming and going ---------------------------------------------------------------------------

    def _arrive(self, pod: _Pod, now: float) -> None:
        tally = self.tallies[pod.queue]
        tally.pods += 1
        gang = self.gangs.get(pod.spec.gang) if pod.spec.gang is not None else None
        size = len(gang.members) if gang is not None else 1
        if gang is not None and pod.index == gang.members[0]:
            tally.gangs += 1
            gang.since = now
        if not self._fits_empty(pod.shape, size):
            pod.status = Status.NEVER
            tally.never_fit += 1
            return
        self._enqueue(pod, now)

    def _enqueue(self, pod: _Pod, now: float, *, key: tuple[float, float, int] | None = None) -> None:
        """Into its queue's waiting line: at the back (it arrived, or was evicted and recreated now), or at
        `key` (its old place, when a gang gives its room back)."""
        pod.status = Status.WAITING
        pod.key = key or (-pod.spec.demand.priority, now, pod.index)
        bisect.insort(self.waiting[pod.queue].setdefault(pod.shape, []), (pod.key, pod.index))
        tenancy.add(self.asked[pod.queue], pod.asks)

    def _take(self, pod: _Pod, placement: Placement, status: Status) -> None:
        """Out of the waiting line, into the cluster: its room counts against its queue from now on."""
        line = self.waiting[pod.queue][pod.shape]
        del line[bisect.bisect_left(line, (pod.key, pod.index))]
        if not line:
            del self.waiting[pod.queue][pod.shape]
        tenancy.add(self.asked[pod.queue], pod.asks, -1)
        self.state.apply(placement)
        pod.status = status
        pod.holds = tenancy.held(placement, self.state)
        tenancy.add(self.usage[pod.queue], pod.holds)

    def _unplace(self, pod: _Pod, status: Status) -> None:
        """Out of the cluster (it left, or gives its held room back); its queue no longer counts it."""
        self.state.release(pod.name)
        self.running[pod.queue].discard(pod.index)
        tenancy.add(self.usage[pod.queue], pod.holds, -1)
        pod.status = status

    def _start(self, pod: _Pod, now: float) -> None:
        pod.status, pod.started = Status.RUNNING, now
        pod.run += 1
        self.running[pod.queue].add(pod.index)
        tally = self.tallies[pod.queue]
        tally.waits.append(now - pod.key[1])
        if pod.entitled_at is not None:
            tally.entitled_waits.append(now - pod.entitled_at)
            pod.entitled_at = None
        self._push(now + pod.spec.duration, DEPART, pod.index, pod.run)

    def _room_back(self, *, by_a_gang: bool = False) -> None:
        """Room came back: every shape may fit again, every eviction plan may work; and gangs that gave
        theirs back may try again, unless it is a gang's room (else two gangs could take turns holding it
        for ever)."""
        self.blocked.clear()
        self.hopeless.clear()
        if not by_a_gang:
            for gang in self.gangs.values():
                gang.backoff = False

    def _fits_empty(self, shape: PodDemand, size: int) -> bool:
        """Whether `size` pods of this shape fit the empty cluster together (a gang: all its members)."""
        known = self.fits_empty.get((shape, size))
        if known is None:
            placed = []
            for i in range(size):
                outcome = decide(self.empty, dataclasses.replace(shape, name=f"trial-{i}"), self.trial_policy)
                if not isinstance(outcome, Placement):
                    break
                self.empty.apply(outcome)
                placed.append(outcome.pod)
            for name in placed:
                self.empty.release(name)
            known = self.fits_empty[(shape, size)] = len(placed) == size
        return known

    # ---- gangs -------------------------------------------------------------------------------------------

    def _give_back(self, gang_index: int, epoch: int) -> bool:
        """A gang's timeout: if it is still not whole, its held members give their room back and wait in
        their old places; the gang waits for other room to come back before it tries again."""
        gang = self.gang_list[gang_index]
        if gang.epoch != epoch or gang.started:
            return False
        gang.epoch += 1
        for index in gang.members:
            pod = self.pods[index]
            if pod.status is Status.HELD:
                self._unplace(pod, Status.WAITING)
                self._enqueue(pod, gang.since, key=pod.key)
        gang.held = 0
        self.tallies[self.pods[gang.members[0]].queue].gang_timeouts += 1
        self._room_back(by_a_gang=True)
        gang.backoff = True
        return True

    # ---- a round -----------------------------------------------------------------------------------------

    def _round(self, now: float) -> bool:
        """Place what fits in fair-share order, then reclaim; whether anything was placed or evicted."""
        self.rounds += 1
        shares = self._shares()
        ranks = {queue: fairshare.starvation(self.usage[queue], shares[queue]) for queue in self.leaves}
        changed = False
        tries = 0
        while tries < MAX_TRIES:
            pod = self._next(ranks)
            if pod is None:
                break
            gang = self.gangs.get(pod.spec.gang) if pod.spec.gang is not None else None
            for member in self._turn(pod, gang):
                tries += 1
                outcome = decide(self.state, member.spec.demand, self.policy)
                if not isinstance(outcome, Placement):
                    self.blocked.add(member.shape)
                    break
                changed = True
                if gang is None:
                    self._take(member, outcome, Status.RUNNING)
                    self._start(member, now)
                else:
                    self._take(member, outcome, Status.HELD)
                    self._held(gang, now)
            ranks[pod.queue] = fairshare.starvation(self.usage[pod.queue], shares[pod.queue])
        return self._reclaim(shares, now) or changed

    def _turn(self, pod: _Pod, gang: _Gang | None) -> list[_Pod]:
        """Who tries now: the pod, or every waiting member of its gang."""
        if gang is None:
            return [pod]
        return [self.pods[i] for i in gang.members if self.pods[i].status is Status.WAITING]

    def _held(self, gang: _Gang, now: float) -> None:
        gang.held += 1
        if gang.held == 1:
            self._push(now + self.config.gangs.timeout, TIMEOUT, gang.index, gang.epoch)
        if gang.held == len(gang.members):
            gang.started = True
            gang.epoch += 1
            first = self.pods[gang.members[0]]
            self.tallies[first.queue].gang_waits.append(now - gang.since)
            for index in gang.members:
                self._start(self.pods[index], now)

    def _next(self, ranks: dict[str, float]) -> _Pod | None:
        """The next pod to try: the most starved queue's, then the highest priority, then the oldest, among
        shapes that may fit."""
        best: tuple[float, tuple[float, float, int], int] | None = None
        for queue, lines in self.waiting.items():
            for shape, line in lines.items():
                if shape in self.blocked:
                    continue
                for key, index in line:
                    gang = self.pods[index].spec.gang
                    if gang is None or not self.gangs[gang].backoff:
                        if best is None or (ranks[queue], key) < best[:2]:
                            best = (ranks[queue], key, index)
                        break
        return None if best is None else self.pods[best[2]]

    # ---- reclaim -----------------------------------------------------------------------------------------

    def _reclaim(self, shares: dict[str, dict[Resource, float]], now: float) -> bool:
        plans = 0
        changed = False
        order = sorted(self.leaves, key=lambda q: fairshare.starvation(self.usage[q], shares[q]))
        scarce = tenancy.contested(self.capacity, self._demand())
        for queue in order:
            spec = self.config.queues[queue]
            for pod in self._stuck(queue):
                contested = tenancy.reclaiming(spec, self.usage[queue], pod.asks, scarce)
                if not contested:
                    continue
                if pod.entitled_at is None:
                    pod.entitled_at = now
                victims = self._victims(queue, shares, contested, now)
                key = (pod.shape, frozenset(victims))
                if not victims or key in self.hopeless or plans >= MAX_RECLAIMS:
                    continue
                plans += 1
                plan = plan_eviction(
                    self.state,
                    pod.spec.demand,
                    self.policy,
                    victims=victims,
                    max_victims=self.config.eviction.max_victims,
                    lost={name: self._lost(name, now) for name in victims},
                )
                if plan is None:
                    self.hopeless.add(key)
                    continue
                self._evict(pod, plan.placement, plan.victims, now)
                changed = True
        return changed

    def _stuck(self, queue: str) -> list[_Pod]:
        """The oldest waiting pod (not a gang member) of each of the queue's shapes that found no room."""
        heads = []
        for shape, line in self.waiting[queue].items():
            if shape in self.blocked:
                head = next((i for _, i in line if self.pods[i].spec.gang is None), None)
                if head is not None:
                    heads.append(self.pods[head])
        return sorted(heads, key=lambda pod: pod.key)

    def _victims(
        self, queue: str, shares: dict[str, dict[Resource, float]], contested: set[Resource], now: float
    ) -> dict[str, int]:
        """The running pods `queue` may reclaim from other queues, with their priorities. A pod too young
        to evict that would otherwise be offered asks for a round when it comes of age."""
        victims: dict[str, int] = {}
        ripe = now - self.config.eviction.min_runtime
        for other in self.leaves:
            usage, share = self.usage[other], shares[other]
            if other == queue or not tenancy.over_share(usage, share):
                continue
            for index in self.running[other]:
                pod = self.pods[index]
                if not tenancy.surplus_covers(usage, share, pod.holds, contested):
                    continue
                if pod.started <= ripe:
                    victims[pod.name] = pod.spec.demand.priority
                else:
                    self._wake(pod.started + self.config.eviction.min_runtime)
        return victims

    def _lost(self, name: str, now: float) -> float:
        """The GPU-seconds a running pod has run, which evicting it would throw away."""
        pod = self.by_name[name]
        return pod.gpus * (now - pod.started)

    def _wake(self, time: float) -> None:
        if time not in self.wakes:
            self.wakes.add(time)
            self._push(time, WAKE, -1)

    def _evict(self, pod: _Pod, placement: Placement, chosen: Sequence[str], now: float) -> None:
        """Evict `chosen` (and their gangs' other members) and keep their room for `pod`, which starts when
        they are gone."""
        gone = now + self.config.eviction.grace
        leaving = [self.by_name[name] for name in chosen]
        for gang in {victim.spec.gang for victim in leaving} - {None}:
            assert gang is not None
            leaving += [self.pods[i] for i in self.gangs[gang].members if self.pods[i].name not in chosen]
            self.gangs[gang].started = False
        for victim in leaving:
            self.state.release(victim.name)
            self.running[victim.queue].discard(victim.index)
            victim.status = Status.LEAVING
            tally = self.tallies[victim.queue]
            tally.evicted += 1
            tally.wasted_gpu_seconds += victim.gpus * (gone - victim.started)
            self._push(gone, GONE, victim.index)
        for gang in {victim.spec.gang for victim in leaving} - {None}:
            assert gang is not None
            self.gangs[gang].held = 0
        self._take(pod, placement, Status.RESERVED)
        self._push(gone, START, pod.index)
        self._room_back()

    # ---- books -------------------------------------------------------------------------------------------

    def _demand(self) -> dict[str, dict[Resource, float]]:
        """Each queue's demand: what its pods hold plus what its waiting pods ask."""
        demand = {queue: dict(self.usage[queue]) for queue in self.leaves}
        for queue in self.leaves:
            tenancy.add(demand[queue], self.asked[queue])
        return demand

    def _shares(self) -> dict[str, dict[Resource, float]]:
        return fairshare.fair_shares(self.config.queues, self.capacity, self._demand())

    def _record(self, now: float) -> None:
        demand = self._demand()
        shares = fairshare.fair_shares(self.config.queues, self.capacity, demand)
        row = np.array(
            [
                [[book[queue].get(resource, 0.0) for resource in RESOURCES] for queue in self.leaves]
                for book in (self.usage, shares, demand)
            ]
        )
        if self.rows and self.rows[-1][0] == now:
            self.rows[-1] = (now, row)
        else:
            self.rows.append((now, row))
