"""Fair shares worked out by hand: quotas first, idle capacity by weight, limits and demand as ceilings,
down a tree; and a property: shares never pass capacity, demand or limits, and a quota asked for is met."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufrac.contract.queues import Entitlement, QueueSpec, Resource
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
    name: str, quota: int = 0, weight: float = 1.0, limit: int | None = None, parent: str | None = None
) -> QueueSpec:
    return QueueSpec(name, parent, {GPU: Entitlement(quota, weight, limit)})


def gpu_shares(queues: list[QueueSpec], capacity: int, demand: dict[str, int]) -> dict[str, float]:
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
