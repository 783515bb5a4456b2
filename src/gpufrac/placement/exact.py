"""Pods with several share containers, or whole GPUs beside a share: a complete search per node, on a budget.

Such pods are rare (no trace has them), and no paper policy defines a score for them, so they take the
first node in tie order where every container fits. On each node the greedy pick is tried first, as these
pods were always placed: whole GPUs from the highest-index empty GPUs, then each share, largest first, on
the best-fitting GPUs that keep one compute mode per GPU, one fault domain per sm-sharing GPU and, on a node
that guarantees compute, compute claims within 100%. Where it fails (one container's pick took the only GPUs
another could use) a depth-first search tries the other picks, so that a node is refused only when no
assignment of the containers to its GPUs fits.

The pod spec is the tenant's (a hundred share containers, shares of many devices on a 16-GPU node) and the
scheduler decides one pod at a time, so the search is bounded by `BUDGET` picks per node, and kept small by
trying one pick per set of interchangeable GPUs (same size and state), and a state, reached again through
identical containers placed in another order, once. A node where the budget runs out is refused for that,
under its own reason, so the operator sees that the pod was too large to decide rather than too large to fit.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np

from gpufrac.cluster.model import (
    FULL_COMPUTE,
    Assignment,
    Placement,
    PodDemand,
    Unschedulable,
    compute_claim,
    resolve_mib,
    whole_assignments,
)
from gpufrac.cluster.state import DOMAIN_NONE, MODE_CODE, MODE_NONE, ClusterState
from gpufrac.contract.model import ComputeMode, ShareRequest
from gpufrac.placement.fit import Fit

NO_COMBINATION = "no combination of GPUs fits every container"
TOO_MANY_COMBINATIONS = "too many combinations of GPUs to search"

# Picks the search may try on one node once the greedy pick failed. A pick costs 15-30 µs on a 2-core
# machine, so a node costs the single-threaded scheduler some 30 ms at most, whatever the pod. Measured on
# random pods against busy nodes: 2-6 containers (some on 4 devices) on 4-16 GPUs took 300 picks at most;
# 4-8 containers on 8-16 GPUs passed 1000 in 2 cases of 600, which are then refused for it.
BUDGET = 1_000
# Picks the searches of one decision may take together, on all nodes: a pod that no node takes would
# otherwise cost `BUDGET` on each node in a state of its own, a thousand nodes half a minute. Past it the
# other nodes get the greedy pass only, as before the search.
DECISION_BUDGET = 10 * BUDGET

# A GPU's state as the search sees it: memory, whether its sm-sharing shares are another fault domain's,
# whether it holds nothing (so that it can be taken whole), unrequested MiB, compute mode and compute claims;
# None where it takes nothing more. GPUs in one state are interchangeable for every container still to place.
_Gpu = tuple[int, bool, bool, int, int, int] | None
_Gpus = tuple[_Gpu, ...]
_Signature = tuple[bool, tuple[_Gpu, ...]]


@dataclass(frozen=True, slots=True)
class _Item:
    """One pick of the search: `devices` GPUs for a share (`share`), or for all the pod's whole GPUs."""

    share: ShareRequest | None
    devices: int
    request: tuple[int, ...] = ()  # per GPU of the node, as the share resolves there
    limit: tuple[int, ...] = ()
    fits: tuple[bool, ...] = ()  # per GPU: room for the limit, a request of 1 MiB at least, domain allows it
    mode: int = MODE_NONE
    claim: int = 0


def decide(state: ClusterState, fit: Fit) -> Placement | Unschedulable:
    pod = fit.pod
    searched: Counter[str] = Counter()  # nodes the filters passed, by why no search placed the pod there
    # A node in the same state as one refused before is refused alike: in a cluster of identical nodes a
    # pod that fits none costs one search, not one per node. Where the budget ran out the greedy pass still
    # runs (budget 0): with the GPUs in another order its ties fall elsewhere, and it ran on every node.
    refused: dict[_Signature, str] = {}
    left = DECISION_BUDGET
    for row in fit.rows[np.argsort(state.tie_rank[fit.rows], kind="stable")]:
        search = Search(state, int(row), pod)
        reason = refused.get(search.signature)
        if reason != NO_COMBINATION:
            assignments = search.run(min(BUDGET, left) if reason is None else 0)
            left -= search.searched
            if assignments is not None:
                return Placement(
                    pod.name,
                    state.names[row],
                    pod.cpu_milli,
                    pod.memory_mib,
                    assignments,
                    pod.fault_domain,
                    pod.scalars,
                )
            reason = TOO_MANY_COMBINATIONS if search.exhausted else NO_COMBINATION
            refused[search.signature] = reason
        searched[reason] += 1
    return Unschedulable(pod.name, dict(fit.rejected + searched))


class Search:
    """The assignments of one pod's containers to one node's GPUs, and the picks it took to find them."""

    def __init__(self, state: ClusterState, row: int, pod: PodDemand) -> None:
        self.pod = pod
        count = int(state.gpu_count[row])
        self.memory: list[int] = state.gpu_mem[row, :count].tolist()
        domains = (DOMAIN_NONE, state.domains.get(pod.fault_domain, -1))
        foreign = [domain not in domains for domain in state.gpu_domain[row, :count].tolist()]
        open_gpus = state.open_gpus(row)[:count].tolist()
        empty = (state.gpu_tenants[row, :count] == 0).tolist()
        self.guaranteed = bool(state.compute_guarantee[row])
        self.start: _Gpus = tuple(
            (memory, foreign[g], empty[g], free, mode, compute) if open_gpus[g] else None
            for g, (memory, free, mode, compute) in enumerate(
                zip(
                    self.memory,
                    state.gpu_free[row, :count].tolist(),
                    state.gpu_mode[row, :count].tolist(),
                    state.gpu_compute[row, :count].tolist(),
                    strict=True,
                )
            )
        )
        self.steps = 0  # picks tried, the greedy one's included
        self.searched = 0  # picks tried past the greedy ones: what `run`'s budget bounds
        self.exhausted = False

    @property
    def signature(self) -> _Signature:
        """The node's state up to the order of its GPUs: nodes of one signature take the pod alike."""
        return self.guaranteed, _canonical(self.start)

    def run(self, budget: int = BUDGET) -> tuple[Assignment, ...] | None:
        """The pod's assignments, or None where nothing fits or (`exhausted`) `budget` picks beyond the
        greedy ones found nothing.

        The greedy pass goes first, unbounded and in its own order, so that a pod it places lands where it
        always did, a pod of any size included. The search orders identical shares next to each other, so
        that placing them in another order reaches a state it has seen.
        """
        if not self._room_enough():
            return None
        whole = [_Item(None, self.pod.whole_gpus)] if self.pod.whole_gpus else []
        largest = sorted(
            self.pod.shares, key=lambda share: -_resolved(share.request, max(self.memory, default=0))
        )
        items = {id(share): self._item(share) for share in largest}
        order = whole + [items[id(share)] for share in largest]
        picks = self._greedy(order)
        if picks is None:
            if not all(len(self._candidates(item, self.start)) >= item.devices for item in order):
                return None  # taking the others first only leaves an item fewer GPUs: nothing to search
            first = {_kind(share): i for i, share in reversed(list(enumerate(largest)))}
            grouped = sorted(largest, key=lambda share: first[_kind(share)])  # stable: still largest first
            order = whole + [items[id(share)] for share in grouped]
            greedy = self.steps
            picks = self._search(order, greedy + budget)
            self.searched = self.steps - greedy
        return None if picks is None else self._assignments(order, picks)

    def _room_enough(self) -> bool:
        """A bound that needs no search, for a pod that fits no node of a large cluster: the whole GPUs
        within the empty ones, and the least memory the shares ask in all (each on the GPU size that makes it
        smallest) within what the open GPUs have free."""
        open_gpus = [gpu for gpu in self.start if gpu is not None]
        if self.pod.whole_gpus > sum(1 for gpu in open_gpus if gpu[2]):
            return False
        sizes = set(self.memory)
        least = sum(
            share.num_devices * min((_resolved(share.request, size) for size in sizes), default=0)
            for share in self.pod.shares
        )
        return least <= sum(gpu[3] for gpu in open_gpus)

    def _item(self, share: ShareRequest) -> _Item:
        request = tuple(_resolved(share.request, memory) for memory in self.memory)
        limit = tuple(_resolved(share.limit, memory) for memory in self.memory)
        sm = share.mode is ComputeMode.SM_SHARING
        fits = tuple(
            r >= 1 and memory >= lim and not (sm and gpu is not None and gpu[1])
            for r, lim, memory, gpu in zip(request, limit, self.memory, self.start, strict=True)
        )
        claim = compute_claim(share.mode, share.compute_percent)
        return _Item(share, share.num_devices, request, limit, fits, MODE_CODE[share.mode], claim)

    def _greedy(self, order: Sequence[_Item]) -> list[tuple[int, ...]] | None:
        gpus = self.start
        picks = []
        for item in order:
            pick = next(self._picks(item, gpus), None)
            if pick is None:
                return None
            self.steps += 1
            picks.append(pick)
            gpus = self._take(item, pick, gpus)
        return picks

    def _search(self, order: Sequence[_Item], limit: int) -> list[tuple[int, ...]] | None:
        """Depth-first over `order`, each item's picks greedy first (`_picks`), until `steps` reaches
        `limit`. A state known to leave no way on is not entered again: with the same items left and GPUs in
        the same states, only the GPUs' order differs."""
        states = [self.start]
        picks: list[tuple[int, ...]] = []
        frames = [self._picks(order[0], self.start)]
        failed: set[tuple[int, tuple[_Gpu, ...]]] = set()
        while frames:
            depth = len(frames) - 1
            pick = next(frames[-1], None)
            if pick is None:
                failed.add((depth, _canonical(states.pop())))
                frames.pop()
                if depth:
                    picks.pop()
                continue
            if self.steps >= limit:
                self.exhausted = True
                return None
            self.steps += 1
            after = self._take(order[depth], pick, states[depth])
            if depth + 1 == len(order):
                return [*picks, pick]
            if (depth + 1, _canonical(after)) not in failed:
                picks.append(pick)
                states.append(after)
                frames.append(self._picks(order[depth + 1], after))
        return None

    def _candidates(self, item: _Item, gpus: _Gpus) -> list[int]:
        """The GPUs that could take the item now, in the greedy's order of preference: for whole GPUs the
        highest index first, for a share the least memory left after it (then the lowest index)."""
        if item.share is None:
            return [g for g in reversed(range(len(gpus))) if (gpu := gpus[g]) is not None and gpu[2]]
        left = [
            (gpu[3] - item.request[g], g)
            for g, gpu in enumerate(gpus)
            if gpu is not None
            and item.fits[g]
            and gpu[3] >= item.request[g]
            and gpu[4] in (MODE_NONE, item.mode)
            and not (self.guaranteed and gpu[5] + item.claim > FULL_COMPUTE)
        ]
        return [g for _, g in sorted(left)]

    def _picks(self, item: _Item, gpus: _Gpus) -> Iterator[tuple[int, ...]]:
        """The item's picks: one per way of taking so many GPUs of each state, since GPUs in one state are
        interchangeable; the greedy pick first, then from the preferred states first. Within a state the
        greedy's preferred GPUs are taken, so that its pick is among these."""
        ranked = self._candidates(item, gpus)
        if len(ranked) < item.devices:
            return
        classes: dict[_Gpu, list[int]] = {}
        for g in ranked:
            classes.setdefault(gpus[g], []).append(g)
        members = list(classes.values())
        index = {g: i for i, gpus_of in enumerate(members) for g in gpus_of}
        greedy = [0] * len(members)
        for g in ranked[: item.devices]:
            greedy[index[g]] += 1
        rest = (counts for counts in _counts([len(m) for m in members], item.devices) if counts != greedy)
        for counts in chain([greedy], rest):
            yield tuple(
                sorted(g for taken, gpus_of in zip(counts, members, strict=True) for g in gpus_of[:taken])
            )

    def _take(self, item: _Item, pick: tuple[int, ...], gpus: _Gpus) -> _Gpus:
        after = list(gpus)
        for g in pick:
            gpu = gpus[g]
            assert gpu is not None
            if item.share is None:
                after[g] = None
            else:
                memory, foreign, _, free, _, compute = gpu
                after[g] = (memory, foreign, False, free - item.request[g], item.mode, compute + item.claim)
        return tuple(after)

    def _assignments(
        self, order: Sequence[_Item], picks: Sequence[tuple[int, ...]]
    ) -> tuple[Assignment, ...]:
        assignments: list[Assignment] = []
        for item, pick in zip(order, picks, strict=True):
            share = item.share
            if share is None:
                assignments += whole_assignments(self.pod, pick, self.memory)
                continue
            request = min(item.request[g] for g in pick)
            limit = min(item.limit[g] for g in pick)
            assignments.append(
                Assignment(share.container, pick, request, limit, share.mode, share.compute_percent)
            )
        return tuple(assignments)


# A share resolves alike on every GPU of a size, on every node: resolved once per amount and size, which was
# most of the search's cost on a cluster of many nodes.
_resolved = functools.lru_cache(maxsize=4096)(resolve_mib)


def _canonical(gpus: _Gpus) -> tuple[_Gpu, ...]:
    """The GPUs that can still take something, in a fixed order: states that differ only in GPU order are
    one state to the search."""
    return tuple(sorted(gpu for gpu in gpus if gpu is not None))


def _kind(share: ShareRequest) -> tuple[object, ...]:
    """A share but for its container's name: containers of one kind are interchangeable."""
    return (share.request, share.limit, share.mode, share.num_devices, share.compute_percent)


def _counts(sizes: Sequence[int], wanted: int) -> Iterator[list[int]]:
    """Every way of taking `wanted` from groups of `sizes`, the most from the first groups first."""
    if not sizes:
        if wanted == 0:
            yield []
        return
    later = sum(sizes[1:])
    for taken in range(min(sizes[0], wanted), max(0, wanted - later) - 1, -1):
        for rest in _counts(sizes[1:], wanted - taken):
            yield [taken, *rest]
