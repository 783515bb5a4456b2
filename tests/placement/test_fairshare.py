"""Fair shares worked out by hand: quotas first, idle capacity by weight, limits and demand as ceilings,
down a tree; and a property: shares never pass capacity, demand or limits, and a quota asked for is met."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufrac.contract.queues import DEFAULT_PRIORITY, Entitlement, QueueSpec, Resource
from gpufrac.placement.fairshare import (
    ancestry,
    fair_shares,
    held_under,
    past_limit,
    starvation,
    with_default,
)

GPU = Resource.GPU_MEMORY


def queue(
    name: str,
    quota: int = 0,
    weight: float = 1.0,
    limit: int | None = None,
    parent: str | None = None,
    priority: int = DEFAULT_PRIORITY,
) -> QueueSpec:
    return QueueSpec(name, parent, {GPU: Entitlement(quota, weight, limit)}, priority=priority)


def gpu_shares(queues: list[QueueSpec], capacity: float, demand: dict[str, float]) -> dict[str, float]:
    shares = fair_shares(
        {q.name: q for q in queues}, {GPU: capacity}, {k: {GPU: v} for k, v in demand.items()}
    )
    return {name: round(share.get(GPU, 0.0), 3) for name, share in shares.items()}


SCENARIOS = {
    # name: (queues, capacity, demand, expected shares)
    "each gets its quota when it asks for it": (
        [queue("a", 40), queue("b", 60)],
        100,
        {"a": 40, "b": 60},
        {"a": 40, "b": 60},
    ),
    "idle capacity goes to who wants it, by weight": (
        [queue("a", 20, weight=1), queue("b", 20, weight=3)],
        100,
        {"a": 100, "b": 100},
        {"a": 35, "b": 65},
    ),
    "a queue alone may use everything": (
        [queue("a", 10), queue("b", 50)],
        100,
        {"a": 100, "b": 0},
        {"a": 100, "b": 0},
    ),
    "an unused quota is lent, not kept": (
        [queue("a", 70), queue("b", 10)],
        100,
        {"a": 5, "b": 100},
        {"a": 5, "b": 95},
    ),
    "a limit caps the borrowing, the rest goes to others": (
        [queue("a", 10, limit=30), queue("b", 10)],
        100,
        {"a": 100, "b": 100},
        {"a": 30, "b": 70},
    ),
    "weight 0 gets its quota and nothing more": (
        [queue("a", 10, weight=0), queue("b", 10)],
        100,
        {"a": 100, "b": 100},
        {"a": 10, "b": 90},
    ),
    "water-filling: a small demand gives its part back": (
        [queue("a"), queue("b"), queue("c")],
        90,
        {"a": 10, "b": 100, "c": 100},
        {"a": 10, "b": 40, "c": 40},
    ),
    "over-promised quotas shrink in proportion": (
        [queue("a", 60), queue("b", 60)],
        60,
        {"a": 60, "b": 60},
        {"a": 30, "b": 30},
    ),
    "a tree: the parent's share is split among its children": (
        [queue("org", 60), queue("x", 40, parent="org"), queue("y", 20, parent="org"), queue("other", 40)],
        100,
        {"x": 100, "y": 100, "other": 10},
        {"org": 90, "x": 55, "y": 35, "other": 10},
    ),
    "the higher priority takes what quotas leave first, whatever the weights": (
        [queue("a", 10, priority=200), queue("b", 10, weight=9)],
        100,
        {"a": 100, "b": 100},
        {"a": 90, "b": 10},
    ),
    "what the higher priority does not want goes down, by weight": (
        [queue("a", 10, priority=200), queue("b", weight=1), queue("c", weight=3)],
        100,
        {"a": 30, "b": 100, "c": 100},
        {"a": 30, "b": 17.5, "c": 52.5},
    ),
    "a priority never takes another queue's quota": (
        [queue("a", priority=200), queue("b", 40)],
        100,
        {"a": 100, "b": 100},
        {"a": 60, "b": 40},
    ),
    "a limit caps the higher priority, the rest goes down": (
        [queue("a", limit=25, priority=200), queue("b")],
        100,
        {"a": 100, "b": 100},
        {"a": 25, "b": 75},
    ),
    "priority is among siblings: a child's does not lift its parent": (
        [queue("org"), queue("x", parent="org", priority=500), queue("y", parent="org"), queue("other")],
        100,
        {"x": 100, "y": 100, "other": 100},
        {"org": 50, "x": 50, "y": 0, "other": 50},
    ),
    "a parent's limit holds its whole subtree": (
        [queue("org", 0, limit=50), queue("x", parent="org"), queue("y", parent="org"), queue("other")],
        100,
        {"x": 100, "y": 100, "other": 100},
        {"org": 50, "x": 25, "y": 25, "other": 50},
    ),
}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_fair_shares_as_worked_out_by_hand(scenario: str) -> None:
    queues, capacity, demand, expected = SCENARIOS[scenario]
    assert gpu_shares(queues, capacity, demand) == expected


# Cases of KAI Scheduler's own fair-share division, its numbers kept (Deserved is the quota, Request the
# demand, MaxAllowed the limit, OverQuotaWeight the weight; KAI's weight is 0 where its case leaves it unset).
# Left out, each for a rule gpufrac has its own way: KAI gives what is left past the quotas in whole GPUs (the
# rest one at a time to the largest remainder, then the oldest queue; gpufrac splits it exactly), quotas past
# the capacity in full (gpufrac: in proportion, README "Queues and fair share"), a child more quota than its
# parent (refused by the webhook), and queue priorities (gpufrac has none).
KAI_DIVISION = {
    # resource_division_test.go, "two queues": "allocates many available gpus"
    "KAI: past their quotas two queues get their demand, the rest stays undivided": (
        [queue("q1", 2, weight=2), queue("q2", 2, weight=2)],
        15,
        {"q1": 6, "q2": 6},
        {"q1": 6, "q2": 6},
    ),
    # "allocates exact requested amount gpus"
    "KAI: capacity that is exactly the demand is all given": (
        [queue("q1", 2, weight=2), queue("q2", 2, weight=2)],
        12,
        {"q1": 6, "q2": 6},
        {"q1": 6, "q2": 6},
    ),
    # "allocates GPUs proportionally"
    "KAI: what is past the quotas goes 1 to 3 by weight": (
        [queue("q1", 2, weight=1), queue("q2", 2, weight=3)],
        8,
        {"q1": 6, "q2": 6},
        {"q1": 3, "q2": 5},
    ),
    # "doesn't allocate more than allowed"
    "KAI: a limit caps a share, the rest is left undivided when nobody else wants it": (
        [queue("q1", 2, weight=2, limit=5), queue("q2", 2, weight=2)],
        12,
        {"q1": 6, "q2": 6},
        {"q1": 5, "q2": 6},
    ),
    # "single queue over quota (sanity)": "doesn't give more GPUs than allowed"
    "KAI: one queue past its quota stops at its limit": (
        [queue("q1", 3, weight=1, limit=4)],
        5,
        {"q1": 5},
        {"q1": 4},
    ),
    # "single queue over quota (sanity)": "doesn't give when over quota weight is zero"
    "KAI: weight 0 gets its quota and no more, though all else is idle": (
        [queue("q1", 3, weight=0)],
        13,
        {"q1": 5},
        {"q1": 3},
    ),
    # "single queue within quota (sanity)": "doesn't give if deserved is zero" (weight 0)
    "KAI: no quota and weight 0 gets nothing": (
        [queue("q1", 0, weight=0)],
        2,
        {"q1": 2},
        {"q1": 0},
    ),
    # "setResourceShare - CPU", "three queues", "one queue request more than it deserves": "reclaims unneeded
    # resources from an allocated queue to fulfill the unallocated queue" (and the same with MaxAllowed 7000)
    "KAI: the quota two queues do not ask for goes to the third": (
        [queue("q1", 5000, weight=5000), queue("q2", 5000, weight=5000), queue("q3", 5000, weight=5000)],
        10000,
        {"q1": 7000, "q2": 2000, "q3": 2000},
        {"q1": 6000, "q2": 2000, "q3": 2000},
    ),
    "KAI: the same, with a limit past the share": (
        [
            queue("q1", 5000, weight=5000, limit=7000),
            queue("q2", 5000, weight=5000),
            queue("q3", 5000, weight=5000),
        ],
        10000,
        {"q1": 7000, "q2": 2000, "q3": 2000},
        {"q1": 6000, "q2": 2000, "q3": 2000},
    ),
    # "three queues", "q2 has no deserved CPU but is allowed OQ": "reclaims all resources of queue 2 and
    # allocates allowed resource in queue 3"
    "KAI: quotas that take the whole capacity leave a queue without one nothing": (
        [queue("q1", 5000, weight=5000), queue("q2", 0, weight=5000), queue("q3", 5000, weight=5000)],
        10000,
        {"q1": 5000, "q2": 5000, "q3": 5000},
        {"q1": 5000, "q2": 0, "q3": 5000},
    ),
    # "two queues", "queue 2 has no deserved CPU": "reclaims all resources of queue 2"
    "KAI: a queue with no quota and weight 0 gets nothing of what it holds": (
        [queue("q1", 5000, weight=5000), queue("q2", 0, weight=0)],
        10000,
        {"q1": 10000, "q2": 5000},
        {"q1": 10000, "q2": 0},
    ),
    # "SetResourcesShare", "two queues": "Request more than total with same Over Quota and deserved - divide
    # evenly"
    "KAI: equal quotas and weights divide the capacity evenly": (
        [queue("q1", 1, weight=1), queue("q2", 1, weight=1)],
        10,
        {"q1": 8, "q2": 8},
        {"q1": 5, "q2": 5},
    ),
    # "Request more than total with different Over Quota"
    "KAI: quotas 250 and 150, then the rest 1 to 2": (
        [queue("q1", 250, weight=1), queue("q2", 150, weight=2)],
        1000,
        {"q1": 5000, "q2": 5000},
        {"q1": 450, "q2": 550},
    ),
    # "Request more than total with different Over Quota and max allowed"
    "KAI: the part a limit holds back goes to the other queue": (
        [queue("q1", 250, weight=1), queue("q2", 150, weight=2, limit=400)],
        1000,
        {"q1": 5000, "q2": 5000},
        {"q1": 600, "q2": 400},
    ),
    # "three queues": "divide resource evenly queues"
    "KAI: three equal queues split 9999 into thirds": (
        [queue("q1", 1000, weight=1), queue("q2", 1000, weight=1), queue("q3", 1000, weight=1)],
        9999,
        {"q1": 10000, "q2": 10000, "q3": 10000},
        {"q1": 3333, "q2": 3333, "q3": 3333},
    ),
    # "three queues": "divide resource between queues with different over quota"
    "KAI: no quotas, weights 6, 2 and 1": (
        [queue("q1", 0, weight=6), queue("q2", 0, weight=2), queue("q3", 0, weight=1)],
        9999,
        {"q1": 10000, "q2": 10000, "q3": 10000},
        {"q1": 6666, "q2": 2222, "q3": 1111},
    ),
    # "advanced scenarios": "fractional fair share"
    "KAI: demands in parts of GPUs are met in full when there is room": (
        [queue("q1", 12, weight=12), queue("q2", 7, weight=7), queue("q3", 2, weight=2, limit=2)],
        45,
        {"q1": 32.55, "q2": 9.5, "q3": 1.65},
        {"q1": 32.55, "q2": 9.5, "q3": 1.65},
    ),
    # proportion_test.go, "Set fair share for multi hierarchy queues": "simple scenario with single top queue"
    "KAI: a chain of quotas down to two leaves": (
        [
            queue("top", 3, weight=0),
            queue("mid", 3, weight=0, parent="top"),
            queue("leaf1", 2, weight=0, parent="mid"),
            queue("leaf2", 1, weight=0, parent="mid"),
        ],
        3,
        {"leaf1": 2, "leaf2": 1},
        {"top": 3, "mid": 3, "leaf1": 2, "leaf2": 1},
    ),
    # "two top parent queues"
    "KAI: two roots; a child with no demand gets nothing, its sibling its parent's share": (
        [
            queue("top1", 2, weight=0),
            queue("c1", 1, weight=0, parent="top1"),
            queue("c2", 1, weight=0, parent="top1"),
            queue("top2", 2, weight=0),
            queue("c3", 0, weight=0, parent="top2"),
            queue("c4", 1, weight=1, parent="top2"),
        ],
        4,
        {"c1": 1, "c2": 1, "c3": 0, "c4": 2},
        {"top1": 2, "c1": 1, "c2": 1, "top2": 2, "c3": 0, "c4": 2},
    ),
    # "Set fair share for 2 hierarchy queues - simplified": "two top parent queues - sanity"
    "KAI: two departments of one queue each, quotas met": (
        [
            queue("d1", 2, weight=1),
            queue("q1", 2, weight=1, parent="d1"),
            queue("d2", 2, weight=1),
            queue("q2", 2, weight=1, parent="d2"),
        ],
        4,
        {"q1": 100, "q2": 100},
        {"d1": 2, "q1": 2, "d2": 2, "q2": 2},
    ),
    # "two top parent queues - over-quota" (KAI's q2 has a quota of 2 under d2's 1, which the webhook refuses:
    # cut to its parent's, which changes no share)
    "KAI: departments with quotas 3 and 1 split the rest evenly": (
        [
            queue("d1", 3, weight=1),
            queue("q1", 2, weight=1, parent="d1"),
            queue("d2", 1, weight=1),
            queue("q2", 1, weight=1, parent="d2"),
        ],
        12,
        {"q1": 100, "q2": 100},
        {"d1": 7, "q1": 7, "d2": 5, "q2": 5},
    ),
    # "two top parent queues - over-quota weight"
    "KAI: departments with quotas 3 and 1 split the rest 1 to 7": (
        [
            queue("d1", 3, weight=1),
            queue("q1", 2, weight=1, parent="d1"),
            queue("d2", 1, weight=7),
            queue("q2", 1, weight=1, parent="d2"),
        ],
        12,
        {"q1": 100, "q2": 100},
        {"d1": 4, "q1": 4, "d2": 8, "q2": 8},
    ),
    # "two top parent queues - over-quota weight - reversed"
    "KAI: departments with quotas 3 and 1 split the rest 7 to 1": (
        [
            queue("d1", 3, weight=7),
            queue("q1", 2, weight=1, parent="d1"),
            queue("d2", 1, weight=1),
            queue("q2", 1, weight=1, parent="d2"),
        ],
        12,
        {"q1": 100, "q2": 100},
        {"d1": 10, "q1": 10, "d2": 2, "q2": 2},
    ),
}


@pytest.mark.parametrize("scenario", KAI_DIVISION)
def test_fair_shares_as_kai_scheduler_divides(scenario: str) -> None:
    queues, capacity, demand, expected = KAI_DIVISION[scenario]
    assert gpu_shares(queues, capacity, demand) == expected


def test_the_default_queue_exists_unless_named() -> None:
    assert with_default({})["default"] == QueueSpec("default")
    own = queue("default", 10)
    assert with_default({"default": own})["default"] is own


def test_the_queue_furthest_below_its_share_goes_first() -> None:
    assert (
        starvation({GPU: 10}, {GPU: 40}) < starvation({GPU: 30}, {GPU: 40}) < starvation({GPU: 50}, {GPU: 40})
    )
    assert starvation({}, {GPU: 40}) == 0.0
    assert starvation({GPU: 1}, {}) == float("inf")
    # The worst resource counts: plenty of GPU share does not hide CPU used past its share.
    assert starvation({GPU: 1, Resource.CPU: 90}, {GPU: 100, Resource.CPU: 60}) == 1.5


@given(
    quotas=st.lists(st.integers(0, 100), min_size=1, max_size=5),
    weights=st.lists(st.sampled_from([0.0, 0.5, 1.0, 3.0]), min_size=5, max_size=5),
    limits=st.lists(st.one_of(st.none(), st.integers(0, 200)), min_size=5, max_size=5),
    demands=st.lists(st.integers(0, 200), min_size=5, max_size=5),
    capacity=st.integers(0, 300),
)
def test_shares_respect_capacity_demand_limits_and_quotas(
    quotas: list[int], weights: list[float], limits: list[int | None], demands: list[int], capacity: int
) -> None:
    queues = [
        queue(f"q{i}", quota, weights[i], None if limits[i] is None else max(limits[i], quota))
        for i, quota in enumerate(quotas)
    ]
    shares = gpu_shares(queues, capacity, {q.name: demands[i] for i, q in enumerate(queues)})
    assert sum(shares.values()) <= capacity + 0.01
    for i, q in enumerate(queues):
        wanted = demands[i] if q.resources[GPU].limit is None else min(demands[i], q.resources[GPU].limit)
        assert shares[q.name] <= wanted + 0.01
        if sum(min(x.resources[GPU].quota, demands[j]) for j, x in enumerate(queues)) <= capacity:
            assert shares[q.name] >= min(q.resources[GPU].quota, wanted) - 0.01
    # Work conserving: capacity is left over only when every queue has all it may take.
    if sum(shares.values()) < capacity - 0.01:
        for i, q in enumerate(queues):
            wanted = demands[i] if q.resources[GPU].limit is None else min(demands[i], q.resources[GPU].limit)
            assert shares[q.name] >= wanted - 0.01 or q.resources[GPU].over_quota_weight == 0


def test_a_tree_thousands_deep_is_shared_without_recursion() -> None:
    """A chain of queues made without the webhook must not stop the scheduler's rounds."""
    chain = [queue("q0", 10)] + [queue(f"q{i}", 0, parent=f"q{i - 1}") for i in range(1, 5000)]
    shares = gpu_shares(chain, 100, {"q4999": 50})
    assert shares["q0"] == shares["q4999"] == 50


def test_a_limit_holds_the_queue_and_every_queue_above_it() -> None:
    tree = {
        q.name: q
        for q in [queue("org", limit=50), queue("x", parent="org", limit=30), queue("y", parent="org")]
    }
    held = held_under(tree, {"x": {GPU: 20}, "y": {GPU: 20}})
    assert held == {"org": {GPU: 40}, "x": {GPU: 20}, "y": {GPU: 20}}
    assert past_limit(tree, held, "x", {GPU: 10}) is None  # x at 30, org at 50: both at their limits
    assert past_limit(tree, held, "x", {GPU: 11}) == ("x", GPU, 30)
    assert past_limit(tree, held, "y", {GPU: 11}) == ("org", GPU, 50)
    assert past_limit(tree, held, "y", {GPU: -5, Resource.CPU: 1}) is None  # what goes, and no CPU limit


def test_a_cycle_ends_a_queues_line_of_parents() -> None:
    cycle = {q.name: q for q in [queue("a", parent="b"), queue("b", parent="a"), queue("c", parent="gone")]}
    assert ancestry(cycle, "a") == ["a", "b"]
    assert ancestry(cycle, "c") == ["c"]
