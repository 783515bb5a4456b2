"""Room for a pod that fits nowhere, made by moving pods that opted in (defragmentation).

Late in a busy cluster the memory a pod needs is often free, only split across GPUs, or its GPU is free but
stranded beside other pods' CPU. Moving (evicting for rescheduling) a few movable pods opens it. The plan
with the fewest moves is found in three steps, each narrowing the next:

1. the nodes where the pod would fit were every movable pod on them gone (one `find_fit` on a copy of the
   state without them);
2. on each such node, the fewest of its movable pods whose going makes the room (per GPU, the smallest
   share that does it alone, else the biggest first; then CPU and memory);
3. a trial on the state itself, best candidates first: the pod placed on that node, then each moved pod
   placed again by the same policy, anywhere it may go (`where`: its own node selector, affinity, taints).
   The first whole success is the plan.

Late in a run the moved pod itself often fits nowhere: then, within the same number of moves, room is made
for it the same way (one hop: the pods it displaces must fit as the cluster stands).

By then the holes are mostly too small for anything that arrives, so `tidy` also moves pods before any
fails, where the policy would now put them elsewhere and that lowers fragmentation.

Pure: the state is left as it was found (every trial is undone); the caller carries out the moves.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from gpufrac.cluster.model import Placement, PodDemand
from gpufrac.cluster.state import DOMAIN_NONE, MODE_CODE, MODE_NONE, ClusterState
from gpufrac.contract.model import ComputeMode
from gpufrac.placement.cache import shape_key
from gpufrac.placement.engine import decide
from gpufrac.placement.filters import gpus_wanted
from gpufrac.placement.fit import Fit, find_fit
from gpufrac.placement.fragmentation import fragmentation_of
from gpufrac.placement.framework import Policy
from gpufrac.placement.workload import Workload

# Trials per pending pod: each costs a decision per moved pod; the best candidates come first, and past a
# few the ones left are no better.
TRIALS = 8
# How many times a moved pod may in turn displace others: each hop multiplies the trials.
HOPS = 1
# GPUs whose shares `tidy` looks at, those with the most free first: each share costs a decision.
LOOKS = 16


@dataclass(frozen=True, slots=True)
class Move:
    """One pod evicted from `source` and placed again at `target`."""

    source: Placement
    target: Placement


@dataclass(frozen=True, slots=True)
class Room:
    """Where the pending pod goes once `moves` are carried out: every source evicted first, then the targets
    placed in order, then the pod. (A target may take room that a later source frees.)"""

    placement: Placement
    moves: tuple[Move, ...]


Where = Callable[[str], np.ndarray | None]


def anywhere(name: str) -> None:
    """The `where` of pods that may go to any node (a trace's): no rows to keep to."""
    return None


def plan_room(
    state: ClusterState,
    pod: PodDemand,
    policy: Policy,
    *,
    movable: Mapping[str, PodDemand],
    max_moves: int,
    rows: np.ndarray | None = None,
    where: Where = anywhere,
) -> Room | None:
    """The plan of at most `max_moves` moves of `movable` pods (name -> the demand it is placed again with)
    that lets `pod` in among `rows`, fewest moves first; None when there is none. `where(name)`: the rows a
    moved pod may be placed again among (None: any), asked only of the pods a plan would move."""
    return Planner(policy).plan_room(state, pod, movable=movable, max_moves=max_moves, rows=rows, where=where)


class Planner:
    """`plan_room` for a caller that plans again and again with one policy (a run, a scheduler): it keeps
    each movable pod's shape as a number between calls, since it is asked for every pod on every candidate
    node and hashing a demand is slow."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._ids: dict[PodDemand, int] = {}
        self._shapes: dict[str, tuple[PodDemand, int]] = {}
        # Within one call, the kinds of pod a hop found no room for: the trials differ only by the node
        # vacated, so another try would fail too.
        self.stuck: set[int | str] = set()
        self._where: Where = anywhere
        self._rows: dict[str, np.ndarray | None] = {}

    def plan_room(
        self,
        state: ClusterState,
        pod: PodDemand,
        *,
        movable: Mapping[str, PodDemand],
        max_moves: int,
        rows: np.ndarray | None = None,
        where: Where = anywhere,
    ) -> Room | None:
        """As the module's `plan_room`."""
        self.stuck.clear()
        self._where, self._rows = where, {}
        return _plan(state, pod, self, movable, max_moves, rows, HOPS)

    def rows(self, name: str) -> np.ndarray | None:
        """Where the movable pod `name` may be placed again (None: anywhere), asked once per plan."""
        if name not in self._rows:
            self._rows[name] = self._where(name)
        return self._rows[name]

    def kind(self, name: str, demand: PodDemand) -> int | str:
        """What decides whether the pod can be placed again: its shape, or the pod itself when it may go
        only to some nodes (two pods of one shape kept to different nodes do not fit alike)."""
        return name if self.rows(name) is not None else self.shape(name, demand)

    def shape(self, name: str, demand: PodDemand) -> int:
        known = self._shapes.get(name)
        if known is None or known[0] is not demand:  # a pod of that name may come back asking otherwise
            known = (demand, self._ids.setdefault(shape_key(demand), len(self._ids)))
            self._shapes[name] = known
        return known[1]


def _plan(
    state: ClusterState,
    pod: PodDemand,
    planner: Planner,
    movable: Mapping[str, PodDemand],
    max_moves: int,
    rows: np.ndarray | None,
    hops: int,
) -> Room | None:
    """`plan_room`, with up to `hops` hops."""
    policy = planner.policy
    placed = [name for name in movable if name in state.placements]
    if max_moves < 1 or not placed:
        return None
    fit = find_fit(state.without(placed), pod, rows=rows)
    fits_now: dict[int | str, bool] = {}

    def fits(name: str) -> bool:
        kind = planner.kind(name, movable[name])
        if kind not in fits_now:
            fit = find_fit(state, movable[name], rows=planner.rows(name), memo=policy.fits)
            fits_now[kind] = len(fit.rows) > 0
        return fits_now[kind]

    def could_move(name: str) -> bool:
        """Whether the pod fits anywhere as the cluster stands: if not, moving it cannot succeed (the
        commonest case late in a run, when CPU-heavy pods have nowhere else to go) unless a hop is left to
        make room for it, and a move besides its own to do it with."""
        return fits(name) or (
            hops > 0 and max_moves > 1 and planner.kind(name, movable[name]) not in planner.stuck
        )

    candidates = []
    for at, row in enumerate(fit.rows):
        victims = fewest_victims(state, fit, at, [n for n in state.pods_on[row] if n in movable], could_move)
        if victims is not None and 0 < len(victims) <= max_moves:
            nowhere = sum(not fits(name) for name in victims)
            moved = sum(gpu_mib(state.placements[name]) for name in victims)
            candidates.append((len(victims), nowhere, moved, int(state.tie_rank[row]), int(row), victims))
    candidates.sort(key=lambda candidate: candidate[:5])
    for *_, row, victims in candidates[:TRIALS]:
        room = _trial(state, pod, planner, row, victims, movable, max_moves, hops)
        if room is not None:
            return room
    return None


def fewest_victims(
    state: ClusterState,
    fit: Fit,
    at: int,
    movable: list[str],
    could_move: Callable[[str], bool],
    cost: Callable[[list[str]], tuple[float, ...]] = lambda names: (),
) -> list[str] | None:
    """The fewest of the `movable` pods on node `fit.rows[at]` whose going lets the pod in, by a count of
    what each frees (the trial confirms it): the GPUs needing the fewest evictions (of those, the lowest
    `cost`), then CPU, memory, a pod slot and the other resources it asks for. Pods that `could_move`
    denies are never chosen; it is asked only about the pods looked at, since it is costly and most are
    not."""
    row = int(fit.rows[at])
    pod = fit.pod
    here = sorted(movable)
    per_gpu: dict[int, list[tuple[int, str]]] = {}
    for name in here:
        for assignment in state.placements[name].assignments:
            for gpu in assignment.gpus:
                # What its going frees on the GPU: a whole GPU all of its memory, where the request is that of
                # the smallest of its GPUs (`whole_assignments`), too little for a bigger one.
                freed = int(state.gpu_mem[row, gpu]) if assignment.mode is None else assignment.request_mib
                per_gpu.setdefault(gpu, []).append((freed, name))
    chosen: list[str] = []
    wanted = gpus_wanted(pod)
    if wanted:
        if pod.shares:
            usable = np.flatnonzero(fit.usable(at))
            need = {int(g): _short(state, fit, at, int(g)) for g in usable}
        else:  # whole GPUs: every tenant goes
            usable = np.flatnonzero(fit.usable(at))
            need = {int(g): int(state.gpu_mem[row, g] - state.gpu_free[row, g]) for g in usable}
        freeing = {g: _freeing(per_gpu.get(g, []), short, could_move) for g, short in need.items()}
        options = sorted(
            ((names, g) for g, names in freeing.items() if names is not None),
            key=lambda option: (len(option[0]), cost(option[0]), option[1]),
        )
        if len(options) < wanted:
            return None
        for names, _ in options[:wanted]:
            chosen.extend(name for name in names if name not in chosen)
    others = sorted(
        (name for name in here if name not in chosen),
        key=lambda name: -state.placements[name].cpu_milli,
    )
    short = _shortfall(state, row, pod)
    for name in chosen:
        _count_freed(short, state.placements[name])
    for name in others:
        if max(short.values()) <= 0:
            break
        frees = _frees(state.placements[name])
        if not any(short.get(what, 0) > 0 < amount for what, amount in frees) or not could_move(name):
            continue  # it frees nothing the node still lacks
        chosen.append(name)
        _count_freed(short, state.placements[name])
    return chosen if max(short.values()) <= 0 else None


def _shortfall(state: ClusterState, row: int, pod: PodDemand) -> dict[str, int]:
    """What the node lacks for the pod besides GPUs, by resource: CPU, memory, a pod slot (a node at its
    kubelet's pod limit) and each other resource it asks for (0 or less: nothing)."""
    short = {
        "cpu": pod.cpu_milli - int(state.cpu_free[row]),
        "memory": pod.memory_mib - int(state.mem_free[row]),
        "pods": 1 - int(state.pods_free[row]),
    }
    for name, amount in pod.scalars:
        free = state.scalar_free.get(name)
        short[name] = amount - (0 if free is None else int(free[row]))
    return short


def _frees(placement: Placement) -> tuple[tuple[str, int], ...]:
    """What a placement's going frees besides GPUs, keyed as `_shortfall` keys it."""
    return (("cpu", placement.cpu_milli), ("memory", placement.memory_mib), ("pods", 1), *placement.scalars)


def _count_freed(short: dict[str, int], placement: Placement) -> None:
    """Take what the placement's going frees off `short`."""
    for name, amount in _frees(placement):
        if name in short:
            short[name] -= amount


def _short(state: ClusterState, fit: Fit, at: int, gpu: int) -> int:
    """MiB to free on a GPU for the pod's share: what it lacks, or everything on it when its tenants are in
    another compute mode or another fault domain's sm-sharing (then every one of them must go)."""
    row = int(fit.rows[at])
    share = fit.pod.shares[0]
    mode, domain = int(state.gpu_mode[row, gpu]), int(state.gpu_domain[row, gpu])
    apart = mode not in (MODE_NONE, MODE_CODE[share.mode]) or (
        share.mode is ComputeMode.SM_SHARING
        and domain not in (DOMAIN_NONE, state.domains.get(fit.pod.fault_domain, -1))
    )
    if apart:
        return int(state.gpu_mem[row, gpu] - state.gpu_free[row, gpu])
    return int(fit.on(at).request_mib[gpu]) - int(state.gpu_free[row, gpu])


def _freeing(
    tenants: list[tuple[int, str]], short: int, could_move: Callable[[str], bool]
) -> list[str] | None:
    """The fewest of a GPU's tenants (request MiB, name) that `could_move` and free `short` MiB: the smallest
    that does it alone (the least to move, and the likeliest to fit elsewhere), else the biggest first; None
    when all of them together do not."""
    if short <= 0:
        return []
    ranked = sorted(tenants)
    alone = next((name for request, name in ranked if request >= short and could_move(name)), None)
    if alone is not None:
        return [alone]
    names: list[str] = []
    for request, name in reversed(ranked):
        if short <= 0:
            break
        if not could_move(name):
            continue
        names.append(name)
        short -= request
    return names if short <= 0 else None


def _trial(
    state: ClusterState,
    pod: PodDemand,
    planner: Planner,
    row: int,
    victims: list[str],
    movable: Mapping[str, PodDemand],
    max_moves: int,
    hops: int,
) -> Room | None:
    """Move `victims` off `row`, place the pod there and the victims again anywhere (a victim that fits
    nowhere gets room of its own, within `max_moves` in all and `hops` deep); undone before returning, so
    the state is as it was whatever happens."""
    policy = planner.policy
    sources = [state.release(name) for name in victims]
    released: list[Placement] = []
    applied: list[Placement] = []
    try:
        outcome = decide(state, pod, policy, rows=np.array([row]))
        if not isinstance(outcome, Placement):
            return None
        state.apply(outcome)
        applied.append(outcome)
        moves: list[Move] = []
        # The biggest moved pod first, while the most room is left for it.
        for left, source in enumerate(sorted(sources, key=lambda placement: -gpu_mib(placement)), start=1):
            demand = movable[source.pod]
            allowed = planner.rows(source.pod)
            target = decide(state, demand, policy, rows=allowed)
            if not isinstance(target, Placement):
                spare = max_moves - len(moves) - (len(victims) - left + 1)
                kind = planner.kind(source.pod, demand)
                if hops < 1 or spare < 1 or kind in planner.stuck:
                    return None
                untouched = {name: d for name, d in movable.items() if name not in victims}
                for move in moves:
                    untouched.pop(move.source.pod, None)
                room = _plan(state, demand, planner, untouched, spare, allowed, hops - 1)
                if room is None:
                    planner.stuck.add(kind)
                    return None
                for move in room.moves:
                    released.append(state.release(move.source.pod))
                for move in room.moves:
                    state.apply(move.target)
                    applied.append(move.target)
                moves.extend(room.moves)
                target = room.placement
            state.apply(target)
            applied.append(target)
            moves.append(Move(source, target))
        return Room(outcome, tuple(moves))
    finally:
        for placement in reversed(applied):
            state.release(placement.pod)
        for placement in (*sources, *released):
            state.restore(placement)


def gpu_mib(placement: Placement) -> int:
    """GPU memory a placement holds: what moving it costs, counted the same way for every plan."""
    return sum(assignment.request_mib * len(assignment.gpus) for assignment in placement.assignments)


def tidy(
    state: ClusterState,
    policy: Policy,
    workload: Workload,
    *,
    movable: Mapping[str, PodDemand],
    max_moves: int,
) -> tuple[Move, ...]:
    """Moves that lower the cluster's fragmentation before any pod fails: each of the shares on the `LOOKS`
    partly used GPUs with the most free is placed again by the policy as the cluster stands now, and moved
    where that lowers the fragmentation of its old and new node together. What the policy chose for a pod
    when the cluster was emptier is often not what it would choose now, and the holes it left add up.
    Carried out in order, each move as release then place; the state is left as it was found."""
    free = np.where(state.gpu_tenants > 0, state.gpu_free, 0)
    shared = np.flatnonzero(free.ravel() > 0)
    order = shared[np.argsort(-free.ravel()[shared], kind="stable")][:LOOKS]
    width = state.width
    names = sorted(
        {
            name
            for flat in order
            for name in state.pods_on[flat // width]
            if name in movable
            and any(flat % width in a.gpus for a in state.placements[name].assignments if a.mode is not None)
        }
    )
    moves: list[Move] = []
    try:
        for name in names:
            if len(moves) >= max_moves:
                break
            source = state.placements[name]
            state.release(name)
            target = decide(state, movable[name], policy)
            state.restore(source)
            if not isinstance(target, Placement) or target.node == source.node:
                continue
            before = _fragmentation(state, workload, source.node, target.node)
            state.release(name)
            state.apply(target)
            if _fragmentation(state, workload, source.node, target.node) < before:
                moves.append(Move(source, target))
            else:
                state.release(name)
                state.restore(source)
    finally:
        for move in reversed(moves):
            state.release(move.source.pod)
            state.restore(move.source)
    return tuple(moves)


def _fragmentation(state: ClusterState, workload: Workload, *nodes: str) -> float:
    return float(fragmentation_of(state, workload, np.array([state.index[node] for node in nodes])).sum())
