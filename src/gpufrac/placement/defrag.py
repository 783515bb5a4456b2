"""Room for a pod that fits nowhere, made by moving pods that opted in (defragmentation).

Late in a busy cluster the memory a pod needs is often free, only split across GPUs, or its GPU is free but
stranded beside other pods' CPU. Moving (evicting for rescheduling) a few movable pods opens it. The plan
with the fewest moves is found in three steps, each narrowing the next:

1. the nodes where the pod would fit were every movable pod on them gone (one `find_fit` on a copy of the
   state without them);
2. on each such node, the fewest of its movable pods whose going makes the room (per GPU, the biggest
   shares first; then CPU and memory);
3. a trial on the state itself, best candidates first: the pod placed on that node, then each moved pod
   placed again by the same policy, anywhere. The first whole success is the plan.

Pure: the state is left as it was found (every trial is undone); the caller carries out the moves.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from gpufrac.cluster.model import Placement, PodDemand
from gpufrac.cluster.state import ClusterState
from gpufrac.placement.cache import shape_key
from gpufrac.placement.engine import decide
from gpufrac.placement.filters import gpus_wanted
from gpufrac.placement.fit import Fit, find_fit
from gpufrac.placement.framework import Policy

# Trials per pending pod: each costs a decision per moved pod; the best candidates come first, and past a
# few the ones left are no better.
TRIALS = 8


@dataclass(frozen=True, slots=True)
class Move:
    """One pod evicted from `source` and placed again at `target`."""

    source: Placement
    target: Placement


@dataclass(frozen=True, slots=True)
class Room:
    """Where the pending pod goes once `moves` are carried out, in order."""

    placement: Placement
    moves: tuple[Move, ...]


def plan_room(
    state: ClusterState,
    pod: PodDemand,
    policy: Policy,
    *,
    movable: Mapping[str, PodDemand],
    max_moves: int,
    rows: np.ndarray | None = None,
) -> Room | None:
    """The plan of at most `max_moves` moves of `movable` pods (name -> the demand it is placed again with)
    that lets `pod` in among `rows`, fewest moves first; None when there is none."""
    placed = [name for name in movable if name in state.placements]
    if max_moves < 1 or not placed:
        return None
    fit, _ = find_fit(state.without(placed), pod, rows=rows)
    fits_now: dict[PodDemand, bool] = {}

    def could_move(name: str) -> bool:
        """Whether the pod fits anywhere as the cluster stands: if not, moving it cannot succeed (the
        commonest case late in a run, when CPU-heavy pods have nowhere else to go)."""
        shape = shape_key(movable[name])
        if shape not in fits_now:
            fits_now[shape] = len(find_fit(state, movable[name], memo=policy.fits)[0].rows) > 0
        return fits_now[shape]

    candidates = []
    for at, row in enumerate(fit.rows):
        victims = _fewest_victims(state, fit, at, [n for n in state.pods_on[row] if n in movable], could_move)
        if victims is not None and 0 < len(victims) <= max_moves:
            moved = sum(gpu_mib(state.placements[name]) for name in victims)
            candidates.append((len(victims), moved, int(state.tie_rank[row]), int(row), victims))
    candidates.sort(key=lambda candidate: candidate[:4])
    for *_, row, victims in candidates[:TRIALS]:
        room = _trial(state, pod, policy, row, victims, movable)
        if room is not None:
            return room
    return None


def _fewest_victims(
    state: ClusterState, fit: Fit, at: int, movable: list[str], could_move: Callable[[str], bool]
) -> list[str] | None:
    """The fewest of the `movable` pods on node `fit.rows[at]` whose going lets the pod in, by a count of
    what each frees (the trial confirms it): the GPUs needing the fewest evictions, then CPU and memory.
    Pods that `could_move` denies are never chosen."""
    row = int(fit.rows[at])
    pod = fit.pod
    here = sorted(name for name in movable if could_move(name))
    per_gpu: dict[int, list[tuple[int, str]]] = {}
    for name in here:
        for assignment in state.placements[name].assignments:
            for gpu in assignment.gpus:
                per_gpu.setdefault(gpu, []).append((assignment.request_mib, name))
    chosen: list[str] = []
    wanted = gpus_wanted(pod)
    if wanted:
        if pod.shares:
            usable = np.flatnonzero(fit.share_ok[at])
            need = {int(g): int(fit.request_mib[at, g]) - int(state.gpu_free[row, g]) for g in usable}
        else:  # whole GPUs: every tenant goes
            usable = np.flatnonzero(fit.empty[at])
            need = {int(g): int(state.gpu_mem[row, g] - state.gpu_free[row, g]) for g in usable}
        freeing = {g: _freeing(per_gpu.get(g, []), short) for g, short in need.items()}
        options = sorted(
            ((names, g) for g, names in freeing.items() if names is not None),
            key=lambda option: (len(option[0]), option[1]),
        )
        if len(options) < wanted:
            return None
        for names, _ in options[:wanted]:
            chosen.extend(name for name in names if name not in chosen)
    others = sorted(
        (name for name in here if name not in chosen),
        key=lambda name: -state.placements[name].cpu_milli,
    )
    cpu_short = pod.cpu_milli - int(state.cpu_free[row])
    mem_short = pod.memory_mib - int(state.mem_free[row])
    cpu_short -= sum(state.placements[name].cpu_milli for name in chosen)
    mem_short -= sum(state.placements[name].memory_mib for name in chosen)
    for name in others:
        if cpu_short <= 0 and mem_short <= 0:
            break
        chosen.append(name)
        cpu_short -= state.placements[name].cpu_milli
        mem_short -= state.placements[name].memory_mib
    return chosen if cpu_short <= 0 and mem_short <= 0 else None


def _freeing(tenants: list[tuple[int, str]], short: int) -> list[str] | None:
    """The fewest of a GPU's tenants (request MiB, name) that free `short` MiB, biggest first; None when
    all of them together do not."""
    names: list[str] = []
    for request, name in sorted(tenants, reverse=True):
        if short <= 0:
            break
        names.append(name)
        short -= request
    return names if short <= 0 else None


def _trial(
    state: ClusterState,
    pod: PodDemand,
    policy: Policy,
    row: int,
    victims: list[str],
    movable: Mapping[str, PodDemand],
) -> Room | None:
    """Move `victims` off `row`, place the pod there and the victims again anywhere; undone before
    returning, so the state is as it was whatever happens."""
    sources = [state.release(name) for name in victims]
    applied: list[Placement] = []
    try:
        outcome = decide(state, pod, policy, rows=np.array([row]))
        if not isinstance(outcome, Placement):
            return None
        state.apply(outcome)
        applied.append(outcome)
        moves = []
        # The biggest moved pod first, while the most room is left for it.
        for source in sorted(sources, key=lambda placement: -gpu_mib(placement)):
            target = decide(state, movable[source.pod], policy)
            if not isinstance(target, Placement):
                return None
            state.apply(target)
            applied.append(target)
            moves.append(Move(source, target))
        return Room(outcome, tuple(moves))
    finally:
        for placement in reversed(applied):
            state.release(placement.pod)
        for placement in sources:
            state.apply(placement)


def gpu_mib(placement: Placement) -> int:
    """GPU memory a placement holds: what moving it costs, counted the same way for every plan."""
    return sum(assignment.request_mib * len(assignment.gpus) for assignment in placement.assignments)
