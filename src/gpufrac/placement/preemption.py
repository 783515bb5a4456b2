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

What the pods placed rule out beyond resources (the scheduler's host ports, inter-pod (anti-)affinity and
topology spread, which the engine does not know) comes as `Allows`. As kube-scheduler's preemption, victims
are taken on the one node the pod goes to: where those rules keep the pod off a node, more of the node's
victims go, the cheapest first, until they let it in (those not needed then stay); a pod kept off by pods
on other nodes (anti-affinity across a zone) is not helped. A plan never takes a pod the pod's own affinity
needs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from gpufrac.cluster.model import Placement, PodDemand
from gpufrac.cluster.state import ClusterState
from gpufrac.placement.defrag import TRIALS, fewest_victims
from gpufrac.placement.engine import decide
from gpufrac.placement.fit import Fit, find_fit
from gpufrac.placement.framework import Policy

Allows = Callable[[np.ndarray, Collection[str]], np.ndarray]
"""Per row of those given, whether the pods placed let the pod there with the pods named not counted."""


@dataclass(slots=True)
class Looks:
    """The checks of `Allows` on one node that a plan (a gang's, all members together) may still make while
    it looks for the victims those rules need: each costs up to milliseconds in a big cluster, and a pod
    kept off a whole zone would try every node of it."""

    left: int = 64

    def spend(self) -> bool:
        self.left -= 1
        return self.left >= 0


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
    allows: Allows | None = None,
    allow: Callable[[Sequence[str]], bool] = lambda _: True,
    lost: Mapping[str, float] | None = None,
    looks: Looks | None = None,
) -> Eviction | None:
    """The pods among `victims` (name -> priority) whose going lets `pod` in among `rows`; None when no set
    of at most `max_victims` on one node (that `allow` accepts) does. `allows`: what the pods placed rule
    out, where `rows` may hold nodes they rule out as things are (see the module), looked at within `looks`.
    `lost`: the work each victim would lose (its GPU-seconds run; absent: none). The state is left as it
    was found."""
    lost = {} if lost is None else lost
    looks = looks or Looks()
    placed = {name: priority for name, priority in victims.items() if name in state.placements}

    def _cost(names: list[str]) -> tuple[float, float]:
        """The priorities a set of victims adds up to, then the work they would lose."""
        return sum(placed[name] for name in names), sum(lost.get(name, 0.0) for name in names)

    def rank(names: list[str], row: int) -> tuple[int, float, float, int, int]:
        """How victims on a node compare: the fewest, then `_cost`, then the node's tie rank."""
        return (len(names), *_cost(names), int(state.tie_rank[row]), row)

    def lets_in(row: int, gone: Sequence[str]) -> bool:
        """`allows` on node `row` with `gone` not counted."""
        return allows is None or bool(allows(np.array([row]), gone)[0])

    def may_let_in(row: int, gone: Sequence[str]) -> bool:
        return looks.spend() and lets_in(row, gone)

    ruled_out = set[int]() if allows is None or rows is None else set(rows[~allows(rows, ())].tolist())
    for ceiling in sorted(set(placed.values())):  # the lowest priorities first: only if they are not enough,
        allowed = {name for name, priority in placed.items() if priority <= ceiling}  # a higher one too
        fit = find_fit(state.without(allowed), pod, rows=rows)
        rooms = []  # by the victims that free the pod's room alone, the cheapest first
        for at, row in enumerate(fit.rows.tolist()):
            here = [name for name in state.pods_on[row] if name in allowed]
            chosen = _allowed_victims(state, fit, at, here, allow, _cost)
            if chosen is not None and (chosen or row in ruled_out):
                rooms.append((rank(chosen, row), at, here, chosen))
        rooms.sort(key=lambda room: room[0])
        candidates: list[tuple[tuple[int, float, float, int, int], list[str]]] = []
        open_tried = 0
        for (*_, row), at, here, chosen in rooms:
            if len(candidates) == TRIALS:
                break
            if row in ruled_out:  # the rules of the pods placed keep it off: more of the node's victims?
                found = _neighbourly(chosen, here, functools.partial(may_let_in, row), allow, _cost)
            elif open_tried < TRIALS:
                open_tried += 1
                found = chosen
                if not lets_in(row, chosen):  # a victim the pod's own affinity needs
                    keeps = functools.partial(_both, allow, functools.partial(lets_in, row))
                    found = _allowed_victims(state, fit, at, here, keeps, _cost)
            else:
                continue
            if found and len(found) <= max_victims:
                candidates.append((rank(found, row), found))
        candidates.sort(key=lambda candidate: candidate[0])
        for (*_, row), chosen in candidates:
            placement = placement_without(state, pod, policy, np.array([row]), chosen)
            if placement is not None:
                return Eviction(placement, tuple(chosen))
    return None


def _also_gone(allows: Allows, earlier: Sequence[str]) -> Allows:
    """`allows` with the victims chosen for a gang's earlier members gone too."""
    return lambda rows, gone: allows(rows, [*earlier, *gone])


def _both(
    first: Callable[[Sequence[str]], bool], then: Callable[[Sequence[str]], bool], names: Sequence[str]
) -> bool:
    return first(names) and then(names)


def _neighbourly(
    chosen: list[str],
    here: list[str],
    lets_in: Callable[[list[str]], bool],
    allow: Callable[[Sequence[str]], bool],
    cost: Callable[[list[str]], tuple[float, float]],
) -> list[str] | None:
    """`chosen` (the victims that free the pod's room on a node) with those more of `here` whose going lets
    the pod in by the rules of the pods placed (`lets_in`): the cheapest added first until it does, then
    each added one kept back if it is not needed, the costliest first. None when all of `here` would not
    do, or `allow` refuses them."""
    extra = sorted((name for name in here if name not in chosen), key=lambda name: (cost([name]), name))
    need = list(chosen)
    while not lets_in(need):
        if not extra:
            return None
        need.append(extra.pop(0))
    for name in sorted(need[len(chosen) :], key=lambda name: (cost([name]), name), reverse=True):
        kept_back = [other for other in need if other != name]
        if lets_in(kept_back):
            need = kept_back
    return need if allow(need) else None


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
    members: Sequence[tuple[PodDemand, np.ndarray | None, Allows | None]],
    policy: Policy,
    *,
    victims: Mapping[str, int],
    max_victims: int,
    allow: Callable[[Sequence[str]], bool] = lambda _: True,
    lost: Mapping[str, float] | None = None,
) -> GangEviction | None:
    """Room for every one of `members` (each with the rows it may go on and what the pods placed rule out
    there, as `plan_eviction` takes them) at once, with at most `max_victims`
    of `victims` evicted in all, and only if `allow` accepts them all together; None when they do not all
    fit. Members are placed in order: the first (the pod that fits nowhere, or may not be placed as things
    are) by `plan_eviction`, each other where it fits as things are, else by `plan_eviction` among the
    victims not chosen yet. The state is left as it was found."""
    placements: dict[str, Placement] = {}
    chosen: list[str] = []
    released: list[Placement] = []
    looks = Looks()
    try:
        for demand, rows, allows in members:
            outcome = None
            if placements:
                where = rows if allows is None or rows is None else rows[allows(rows, chosen)]
                outcome = decide(state, demand, policy, rows=where)
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
                    allows=None if allows is None else _also_gone(allows, so_far),
                    allow=allow_with_earlier,
                    lost=lost,
                    looks=looks,
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
