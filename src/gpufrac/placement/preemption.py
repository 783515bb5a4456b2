"""Which running pods to evict so that a pending pod fits: preemption within a queue, reclaim across queues.
Pure.

The caller says which pods may go (`victims`, each with its priority); the plan frees exactly what the
pending pod needs on one node (memory on specific GPUs, a GPU's mode, CPU and memory: the engine's own
filters judge it), evicting pods of the lowest priorities only if that is enough, then the fewest, then the
lowest priorities in all, then the least work lost (the GPU-seconds the victims have run, which an eviction
throws away: a pod that ran for a month goes last). Unlike a move (`defrag`), an evicted pod is not placed
again: its controller recreates it and it waits its turn.

A gang is planned for at once (`plan_gang_eviction`): pods are evicted only if every member it still needs
then fits, so no pod is evicted for a gang that could not run anyway.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from gpufrac.cluster.model import Placement, PodDemand
from gpufrac.cluster.state import ClusterState
from gpufrac.placement.defrag import TRIALS, fewest_victims
from gpufrac.placement.engine import decide
from gpufrac.placement.fit import Fit, find_fit
from gpufrac.placement.framework import Policy


@dataclass(frozen=True, slots=True)
class Eviction:
    """Where the pending pod goes once `victims` are gone."""

    placement: Placement
    victims: tuple[str, ...]


def plan_eviction(
    state: ClusterState,
    pod: PodDemand,
    policy: Policy,
    *,
    victims: Mapping[str, int],
    max_victims: int,
    rows: np.ndarray | None = None,
    allow: Callable[[Sequence[str]], bool] = lambda _: True,
    lost: Mapping[str, float] | None = None,
) -> Eviction | None:
    """The pods among `victims` (name -> priority) whose going lets `pod` in among `rows`; None when no set
    of at most `max_victims` on one node (that `allow` accepts) does. `lost`: the work each victim would
    lose (its GPU-seconds run; absent: none). The state is left as it was found."""
    lost = lost or {}
    placed = {name: priority for name, priority in victims.items() if name in state.placements}

    def _cost(names: list[str]) -> tuple[float, float]:
        """The priorities a set of victims adds up to, then the work they would lose."""
        return sum(placed[name] for name in names), sum(lost.get(name, 0.0) for name in names)

    for ceiling in sorted(set(placed.values())):  # the lowest priorities first: only if they are not enough,
        allowed = {name for name, priority in placed.items() if priority <= ceiling}  # a higher one too
        fit = find_fit(state.without(allowed), pod, rows=rows)
        candidates = []
        for at, row in enumerate(fit.rows):
            here = [name for name in state.pods_on[row] if name in allowed]
            chosen = _allowed_victims(state, fit, at, here, allow, _cost)
            if chosen and len(chosen) <= max_victims:
                candidates.append((len(chosen), *_cost(chosen), int(state.tie_rank[row]), int(row), chosen))
        candidates.sort(key=lambda candidate: candidate[:5])
        for *_, row, chosen in candidates[:TRIALS]:
            placement = placement_without(state, pod, policy, np.array([row]), chosen)
            if placement is not None:
                return Eviction(placement, tuple(chosen))
    return None


def _allowed_victims(
    state: ClusterState,
    fit: Fit,
    at: int,
    here: list[str],
    allow: Callable[[Sequence[str]], bool],
    cost: Callable[[list[str]], tuple[float, float]],
) -> list[str] | None:
    """The victims on node `fit.rows[at]` to evict, among `here`: the cheapest set, if `allow` accepts it,
    else the cheapest of the sets found without one of its pods that `allow` accepts. `allow` judges sets
    (a queue's fair share with all of a plan's victims gone), so the cheapest pod of a node may be refused
    where another alike is not: two queues' pods on a node, one of whose queue may give up no more."""
    chosen = fewest_victims(state, fit, at, here, lambda _: True, cost=cost)
    if chosen is None or allow(chosen):
        return chosen
    others = []
    for name in chosen:
        other = fewest_victims(state, fit, at, [n for n in here if n != name], lambda _: True, cost=cost)
        if other is not None and allow(other):
            others.append((len(other), cost(other), sorted(other)))
    return min(others)[2] if others else None


@dataclass(frozen=True, slots=True)
class GangEviction:
    """Where each member goes (by name) once `victims` are gone."""

    placements: Mapping[str, Placement]
    victims: tuple[str, ...]


def plan_gang_eviction(
    state: ClusterState,
    members: Sequence[tuple[PodDemand, np.ndarray | None]],
    policy: Policy,
    *,
    victims: Mapping[str, int],
    max_victims: int,
    allow: Callable[[Sequence[str]], bool] = lambda _: True,
    lost: Mapping[str, float] | None = None,
) -> GangEviction | None:
    """Room for every one of `members` (each with the rows it may go on) at once, with at most `max_victims`
    of `victims` evicted in all, and only if `allow` accepts them all together; None when they do not all
    fit. Members are placed in order: the first (the pod that fits nowhere, or may not be placed as things
    are) by `plan_eviction`, each other where it fits as things are, else by `plan_eviction` among the
    victims not chosen yet. The state is left as it was found."""
    placements: dict[str, Placement] = {}
    chosen: list[str] = []
    released: list[Placement] = []
    try:
        for demand, rows in members:
            outcome = decide(state, demand, policy, rows=rows) if placements else None
            if not isinstance(outcome, Placement):
                left = {name: priority for name, priority in victims.items() if name not in chosen}
                so_far = tuple(chosen)

                def allow_with_earlier(more: Sequence[str], so_far: tuple[str, ...] = so_far) -> bool:
                    return allow([*so_far, *more])

                plan = plan_eviction(
                    state,
                    demand,
                    policy,
                    victims=left,
                    max_victims=max_victims - len(chosen),
                    rows=rows,
                    allow=allow_with_earlier,
                    lost=lost,
                )
                if plan is None:
                    return None
                released += [state.release(name) for name in plan.victims]
                chosen += plan.victims
                outcome = plan.placement
            state.apply(outcome)
            placements[demand.name] = outcome
        return GangEviction(placements, tuple(chosen))
    finally:
        for name in placements:
            state.release(name)
        for placement in released:
            state.restore(placement)


def placement_without(
    state: ClusterState, pod: PodDemand, policy: Policy, rows: np.ndarray, gone: Sequence[str]
) -> Placement | None:
    """Where the pod goes among `rows` with the placed pods `gone` released; the state is put back before
    returning. Tried on the state itself, not a copy (`ClusterState.without`): a copy is a state of its own
    to the policy's per-node memos, which would empty them for the next decision."""
    released = [state.release(name) for name in gone]
    try:
        outcome = decide(state, pod, policy, rows=rows)
        return outcome if isinstance(outcome, Placement) else None
    finally:
        for placement in released:
            state.restore(placement)
