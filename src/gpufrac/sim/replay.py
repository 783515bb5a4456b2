"""The arrival sweep of Weng et al. (ATC '23), run through the same engine the scheduler uses.

Pods only arrive, in an order shuffled by the seed, followed by pods sampled with replacement until the
requested GPU share reaches `inflation` × the cluster's GPUs; a pod that does not fit is dropped. After each
pod it logs arrived and allocated GPU share. The curve's value at x% arrival is the mean allocation over
the pods whose arrival rounds to x, which is how the authors' analysis scripts turn the log into a point.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpufrac.cluster.model import Placement, PodDemand
from gpufrac.cluster.state import ClusterState
from gpufrac.errors import UserError
from gpufrac.placement import defrag
from gpufrac.placement.cache import Hashed, shape_key
from gpufrac.placement.engine import decide
from gpufrac.placement.fragmentation import cluster_fragmentation, fragmentation_memo
from gpufrac.placement.framework import POLICIES, Policy, PolicyContext
from gpufrac.placement.reserve import KEPT_WHOLE, WholeGpuReserve
from gpufrac.placement.workload import Workload
from gpufrac.sim.trace import Trace, TracePod

# A pod may move at most this many others to get in: past a few, a plan disrupts more than it gains.
MAX_MOVES_PER_POD = 3
# Arrivals between two looks for moves that lower fragmentation (`placement.defrag.tidy`).
TIDY_EVERY = 20
# The most pods one replay lets arrive. The paper's 17 traces need at most 16,655 at inflation 1.3
# (gpushare100) and 128,116 at `--inflation 10`, the most allowed; a trace of tiny GPU requests (one pod of
# 1 milli-GPU) would need millions, each a decision of a fraction of a millisecond and a few hundred bytes
# held for the whole replay. 60 times the paper's largest: a replay that still ends, in minutes.
MAX_ARRIVALS = 1_000_000


@dataclass(frozen=True, slots=True)
class MoveTally:
    """Moves by some point of a run: pods arrived, pods moved, and the GPUs the moved pods held (a share of
    0.5 counts 0.5), which is what they lose while they restart."""

    arrivals: int
    moves: int
    moved_gpus: float


@dataclass(frozen=True, slots=True)
class RunResult:
    policy: str
    seed: int
    inflation: float
    allocation: dict[int, float]  # arrival % -> GPU allocation %
    fragmentation: dict[int, float]  # arrival % -> fragmentation, % of the cluster's GPUs
    failures: dict[int, dict[str, int]]  # arrival % -> pods dropped so far, by main reason
    failed_pods: int
    pods: int
    seconds: float
    decision_ms_p50: float  # engine time per pod (decide only, not apply or measurement)
    decision_ms_p99: float
    move_budget: float = 0.0  # moves allowed per 100 arrivals (`placement.defrag`); 0: none
    moves: dict[int, MoveTally] = dataclasses.field(default_factory=dict)  # arrival % -> moves so far
    reserve: float = 0.0  # % of GPUs kept empty for whole-GPU pods (`placement.reserve`); 0: none

    @property
    def label(self) -> str:
        """How tables name the run's variant: the policy, with its move budget and reserve if it has them."""
        moves = f" +moves {self.move_budget:g}" if self.move_budget else ""
        return f"{self.policy}{moves}" + (f" +reserve {self.reserve:g}%" if self.reserve else "")


def target_workload(trace: Trace) -> Workload:
    """The paper's target workload: the trace's own pods, before shuffling or inflation."""
    return Workload.from_pods(pod.demand() for pod in trace.pods)


def arrival_order(trace: Trace, rng: np.random.Generator, *, inflation: float) -> list[TracePod]:
    """The shuffled trace, then pods drawn with replacement until the next draw would overshoot.

    Never more than `MAX_ARRIVALS` pods: `check_arrivals` refuses such a run before it starts, and a run
    whose draws still go past it (its expected count just under the bound) stops with the same error."""
    by_name = sorted(trace.pods, key=lambda pod: pod.name)
    order = [by_name[i] for i in rng.permutation(len(by_name))]
    total = sum(pod.gpu_demand_milli for pod in by_name)
    target = inflation * trace.gpus * 1000
    if not any(pod.gpu_demand_milli for pod in by_name):
        return order
    while True:
        pod = by_name[int(rng.integers(len(by_name)))]
        if total + pod.gpu_milli > target:  # the authors' stop rule compares the per-GPU share
            return order
        if len(order) >= MAX_ARRIVALS:
            raise _too_many(trace, inflation, f"more than {MAX_ARRIVALS:,}")
        total += pod.gpu_demand_milli
        order.append(dataclasses.replace(pod, name=f"{pod.name}-tuned-{len(order)}"))


def expected_arrivals(trace: Trace, *, inflation: float) -> float:
    """About how many pods `arrival_order` yields: the trace's own, then as many draws as the GPU share left
    to the target takes at the trace's mean GPU request per pod (CPU-only pods count, asking 0)."""
    demand = sum(pod.gpu_demand_milli for pod in trace.pods)
    if not demand:
        return float(len(trace.pods))
    left = max(0.0, inflation * trace.gpus * 1000 - demand)
    return len(trace.pods) + left * len(trace.pods) / demand


def check_arrivals(trace: Trace, *, inflation: float) -> None:
    """Refuse, before any replay starts, a run of `trace` that would expect more than `MAX_ARRIVALS` pods."""
    expected = expected_arrivals(trace, inflation=inflation)
    if expected > MAX_ARRIVALS:
        raise _too_many(trace, inflation, f"about {expected:,.0f}")


def _too_many(trace: Trace, inflation: float, count: str) -> UserError:
    demand = sum(pod.gpu_demand_milli for pod in trace.pods)
    return UserError(
        f"{trace.name} at --inflation {inflation:g}: {count} pods would arrive before their GPU requests "
        f"reach {inflation:g} x {trace.gpus:,} GPUs (its {len(trace.pods):,} pod(s) ask "
        f"{demand / len(trace.pods):.3g} milli-GPU each on average); a replay takes at most "
        f"{MAX_ARRIVALS:,}: use a pod list (--pods) that asks more GPU, a lower --inflation, or fewer GPUs "
        "(--nodes)"
    )


@dataclass(frozen=True, slots=True)
class Arrivals:
    """A seed's pods in the order they arrive, and the rest of what a replay draws before its first
    decision. The same for every policy, so a sweep draws them once per seed (`experiment`), not per
    replay: a few percent of a replay's time. Holds `Hashed` keys, so it never leaves its process."""

    pods: list[TracePod]
    shapes: list[Hashed]  # `_shape_keys(pods)`
    tie_rank: np.ndarray  # `ClusterState.tie_rank` for the trace's nodes
    rng_state: Mapping[str, Any]  # the seed's stream once both were drawn: the policy's draws go on from it


def draw_arrivals(trace: Trace, *, seed: int, inflation: float) -> Arrivals:
    """What a replay of `trace` draws from `seed` before its policy draws anything, in the same order."""
    rng = np.random.default_rng(seed)
    pods = arrival_order(trace, rng, inflation=inflation)
    # Ties go to the first node in a fixed random order drawn once per run, as the authors' simulator
    # ends up doing by prefixing node names with a seeded permutation.
    tie_rank = np.empty(len(trace.nodes), np.int64)
    tie_rank[np.argsort([spec.name for spec in trace.nodes], kind="stable")] = rng.permutation(
        len(trace.nodes)
    )
    return Arrivals(pods, _shape_keys(pods), tie_rank, rng.bit_generator.state)


def replay(
    trace: Trace,
    *,
    policy: str,
    seed: int,
    inflation: float = 1.3,
    workload: Workload | None = None,
    move_budget: float = 0.0,
    reserve: float = 0.0,
    arrivals: Arrivals | None = None,
    on_pod: Callable[[int, int], None] | None = None,
) -> RunResult:
    """One run. With a `move_budget`, a pod that fits nowhere may move movable pods (every pod without whole
    GPUs: shares and CPU-only pods) to make room, and every `TIDY_EVERY` arrivals pods are moved where that
    lowers fragmentation, as long as the moves so far stay within `move_budget` per 100 arrivals and no pod
    moves more than `MAX_MOVES_PER_POD` others. With a `reserve`, a large share that would leave fewer than
    `reserve`% of the GPUs empty goes to a GPU in use or is dropped (`placement.reserve`). `arrivals`:
    `draw_arrivals` of the same trace, seed and inflation, from a caller that replays them with several
    policies."""
    started = time.perf_counter()
    drawn = arrivals or draw_arrivals(trace, seed=seed, inflation=inflation)
    rng = np.random.default_rng(seed)
    rng.bit_generator.state = drawn.rng_state
    workload = workload or target_workload(trace)
    pods, shapes = drawn.pods, drawn.shapes
    state = ClusterState(trace.nodes)
    state.tie_rank[:] = drawn.tie_rank
    chosen = POLICIES[policy](PolicyContext(rng=rng, workload=workload))
    if reserve:
        chosen = dataclasses.replace(chosen, reserve=WholeGpuReserve(reserve))
    capacity = trace.gpus * 1000
    fragmentation: dict[int, float] = {}
    failures: dict[int, dict[str, int]] = {}
    dropped: Counter[str] = Counter()
    arrived = np.cumsum([pod.gpu_demand_milli for pod in pods], dtype=np.int64)
    percents = percent_buckets(arrived, capacity)
    # The pods whose arrival enters a new whole percent: the cluster is measured once there.
    first_of_percent = np.diff(percents, prepend=-1) != 0
    placed_milli = np.zeros(len(pods), np.int64)
    decision_seconds: list[float] = []
    measured = fragmentation_memo()
    mover = _Mover(state, chosen, move_budget, workload)
    moves: dict[int, MoveTally] = {}
    # Without moves nothing leaves, so room only shrinks: a pod shape that fit nowhere fits nowhere again,
    # and its later pods are dropped without a decision (a third of the pods past 100% arrival), counted
    # under the reason the shape first failed for (a decision might name another as nodes fill: the first
    # filter to reject a node can change; reports read only the count). Not a shape the reserve turned
    # away: a share opening an empty GPU may make room for it.
    fits_nowhere: dict[Hashed, str] = {}
    walk = zip(pods, shapes, first_of_percent.tolist(), strict=True)
    for i, (pod, shape, measure) in enumerate(walk):
        reason = fits_nowhere.get(shape)
        if reason is None:
            demand = pod.demand()
            tick = time.perf_counter()
            outcome = decide(state, demand, chosen, shape=shape)
            decision_seconds.append(time.perf_counter() - tick)
            if not isinstance(outcome, Placement):
                outcome = mover.make_room(demand, arrivals=i + 1) or outcome
            if isinstance(outcome, Placement):
                state.apply(outcome)
                mover.placed(demand, arrivals=i + 1)
                placed_milli[i] = pod.gpu_demand_milli
            else:
                reason = main_reason(outcome.reasons)
                if not move_budget and reason != KEPT_WHOLE:
                    fits_nowhere[shape] = reason
        if reason is not None:
            dropped[reason] += 1
        if measure:
            now = int(percents[i])
            measure_milli = float(cluster_fragmentation(state, workload, measured).sum())
            fragmentation[now] = 100 * measure_milli / capacity
            failures[now] = dict(dropped)
            moves[now] = MoveTally(i + 1, mover.moves, round(mover.moved_gpus, 3))
        if on_pod is not None:
            on_pod(i + 1, len(pods))
    return RunResult(
        policy=policy,
        seed=seed,
        inflation=inflation,
        allocation=allocation_curve(arrived, np.cumsum(placed_milli), capacity),
        fragmentation=fragmentation,
        failures=failures,
        failed_pods=sum(dropped.values()),
        pods=len(pods),
        seconds=time.perf_counter() - started,
        decision_ms_p50=1000 * float(np.percentile(decision_seconds, 50)),
        decision_ms_p99=1000 * float(np.percentile(decision_seconds, 99)),
        move_budget=move_budget,
        moves=moves,
        reserve=reserve,
    )


class _Mover:
    """Carries out `defrag.plan_room` and `defrag.tidy` within the run's move budget, and counts what moving
    cost.

    Pods only arrive in this replay, so room only shrinks: a pod shape no plan was found for is not looked
    at again until a move changes the cluster."""

    def __init__(self, state: ClusterState, policy: Policy, budget: float, workload: Workload) -> None:
        self.state, self.budget, self.policy, self.workload = state, budget, policy, workload
        self.planner = defrag.Planner(policy)
        self.movable: dict[str, PodDemand] = {}
        self.hopeless: set[PodDemand] = set()
        self.moves = 0
        self.moved_gpus = 0.0

    def placed(self, demand: PodDemand, *, arrivals: int) -> None:
        if not self.budget:
            return
        if not demand.whole:
            self.movable[demand.name] = demand
        if arrivals % TIDY_EVERY == 0:
            self.tidy(arrivals)

    def tidy(self, arrivals: int) -> None:
        """Moves that lower fragmentation, leaving `MAX_MOVES_PER_POD` of the budget for a pod that fails."""
        spare = int(self.budget * arrivals / 100) - self.moves - MAX_MOVES_PER_POD
        if spare < 1:
            return
        moves = defrag.tidy(self.state, self.policy, self.workload, movable=self.movable, max_moves=spare)
        for move in moves:
            self.state.release(move.source.pod)
            self.state.apply(move.target)
        self._count(moves)

    def make_room(self, demand: PodDemand, *, arrivals: int) -> Placement | None:
        allowed = min(int(self.budget * arrivals / 100) - self.moves, MAX_MOVES_PER_POD)
        if allowed < 1:  # before the shape key, which costs more than a decision's memo lookups
            return None
        shape = shape_key(demand)
        if shape in self.hopeless:
            return None
        room = self.planner.plan_room(self.state, demand, movable=self.movable, max_moves=allowed)
        if room is None:
            self.hopeless.add(shape)
            return None
        for move in room.moves:
            self.state.release(move.source.pod)
        for move in room.moves:
            self.state.apply(move.target)
        self._count(room.moves)
        return room.placement

    def _count(self, moves: tuple[defrag.Move, ...]) -> None:
        for move in moves:
            row = self.state.index[move.source.node]
            self.moved_gpus += sum(
                a.request_mib * len(a.gpus) / int(self.state.gpu_mem[row, a.gpus[0]])
                for a in move.source.assignments
            )
        self.moves += len(moves)
        if moves:
            self.hopeless.clear()


def _shape_keys(pods: list[TracePod]) -> list[Hashed]:
    """Each pod's `Hashed(shape_key(pod.demand()))`, one object for all pods of a trace shape (the drawn
    copies repeat the trace's pods): the memos then find the key they hold by identity, see `find_fit`.
    Interned by the trace pod's own fields, which are cheaper to look up than a demand's."""
    interned: dict[tuple[int, int, int, int, frozenset[str] | None], Hashed] = {}
    keys = []
    for pod in pods:
        seen = (pod.cpu_milli, pod.memory_mib, pod.num_gpu, pod.gpu_milli, pod.gpu_spec)
        key = interned.get(seen)
        if key is None:
            key = interned[seen] = Hashed(shape_key(pod.demand()))
        keys.append(key)
    return keys


def main_reason(reasons: dict[str, int]) -> str:
    """The reason that rejected the most nodes: what would have to change for the pod to fit. A pod the
    whole-GPU reserve turned away fit somewhere, so the reserve is that reason however few nodes it names."""
    if KEPT_WHOLE in reasons:
        return KEPT_WHOLE
    return max(sorted(reasons), key=lambda reason: reasons[reason]) if reasons else "no nodes"


def nearest_point(points: Iterable[int], x: int) -> int:
    """The arrival point nearest x% (the lower of two as near): where a curve that never reached x% (a small
    trace) is read instead."""
    return min(points, key=lambda point: (abs(point - x), point))


def percent_buckets(arrived: np.ndarray, capacity: int) -> np.ndarray:
    """The whole percent of the cluster's GPUs that each cumulative arrival rounds to (half to even): the
    points of a replay's curves."""
    return np.round(100 * arrived / capacity).astype(np.int64)


def allocation_curve(arrived: np.ndarray, used: np.ndarray, capacity: int) -> dict[int, float]:
    """Per whole percent of arrival, the mean allocation % over the pods whose arrival rounds to it."""
    buckets = percent_buckets(arrived, capacity)
    allocation = np.round(100 * used / capacity, 2)
    sums = np.bincount(buckets, weights=allocation)
    counts = np.bincount(buckets)
    return {int(x): round(float(sums[x] / counts[x]), 2) for x in np.flatnonzero(counts)}
