"""The per-node memos (`placement.cache.NodeMemo`) keep at most their bound of arrays: pods of endless
distinct shapes (a tenant's) cannot grow the scheduler without end, and a key dropped is computed again."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from gpufrac.cluster.state import ClusterState
from gpufrac.placement.cache import Hashed, NodeMemo
from gpufrac.placement.engine import decide
from gpufrac.placement.fit import find_fit, fit_memo, verdict_memo

from ..cluster.builders import node, share_at, share_pod
from .builders import policy


def test_the_keys_looked_up_longest_ago_go_first_once_the_bound_is_passed() -> None:
    state = ClusterState([node(f"n{i}", 2) for i in range(100)])
    rows = np.flatnonzero(state.active)
    one_key = 2 * 8 * state.version.shape[0]  # a version and a value per row (some kept spare)
    memo = NodeMemo("value", most_bytes=3 * one_key)
    for key in ("a", "b", "c"):
        entry, stale = memo.lookup(state, key, rows)
        assert stale.size == 100
        memo.stamp(state, entry, rows)
    memo.lookup(state, "a", rows)  # now the last looked up
    memo.lookup(state, "d", rows)  # one too many: b goes
    assert memo.lookup(state, "a", rows)[1].size == 0 and memo.lookup(state, "c", rows)[1].size == 0
    assert memo.lookup(state, "b", rows)[1].size == 100  # computed again; d, not looked up since, goes
    assert memo.lookup(state, "a", rows)[1].size == 0 and memo.lookup(state, "c", rows)[1].size == 0
    assert memo.lookup(state, "d", rows)[1].size == 100


def test_refreshed_computes_only_the_nodes_that_changed_among_the_rows_asked() -> None:
    state = ClusterState([node(f"n{i}", 2) for i in range(6)])
    memo = NodeMemo("value")
    asked: list[list[int]] = []

    def compute(rows: np.ndarray) -> Callable[[np.ndarray], tuple[np.ndarray]]:
        def fill(stale: np.ndarray) -> tuple[np.ndarray]:
            asked.append(rows[stale].tolist())
            return (state.cpu_free[rows[stale]] / 1000,)

        return fill

    everyone, some = np.arange(6), np.array([1, 3, 4])
    assert memo.refreshed(state, "k", everyone, compute(everyone))["value"].tolist() == [64.0] * 6
    state.apply(share_at("a", "n3", (0,), 1_000, cpu=4_000))
    state.apply(share_at("b", "n5", (0,), 1_000, cpu=8_000))
    assert memo.refreshed(state, "k", some, compute(some))["value"][some].tolist() == [64.0, 60.0, 64.0]
    assert memo.refreshed(state, "k", everyone, compute(everyone))["value"].tolist()[5] == 56.0
    memo.refreshed(state, "k", everyone, compute(everyone))  # nothing changed since: not called
    assert asked == [[0, 1, 2, 3, 4, 5], [3], [5]]


def test_a_policy_deciding_endless_shapes_keeps_its_memos_within_their_bound_and_decides_alike() -> None:
    state = ClusterState([node(f"n{i}", 2) for i in range(50)])
    bounded, free = policy("fgd"), policy("fgd")
    small = fit_memo()
    small._most_bytes = 10 * state.version.shape[0] * (8 + 1 + state.width)  # ten shapes' entries
    bounded = type(bounded)(bounded.scorer, bounded.picker, small)
    for i in range(60):
        pod = share_pod(f"p{i}", 100 + i)
        assert decide(state, pod, bounded) == decide(state, pod, free)
        assert small._bytes <= small._most_bytes
    assert find_fit(state, share_pod("q", 500), memo=small).rows.size == 50


def test_the_verdict_memo_judges_again_only_the_nodes_that_changed_and_counts_as_judging_afresh() -> None:
    state = ClusterState([node(f"n{i}", 1) for i in range(6)])
    for i in range(6):
        state.apply(decide(state, share_pod(f"held{i}", 900), policy("bestfit")))  # type: ignore[arg-type]
    verdicts = verdict_memo()
    pod = share_pod("late", 500)
    assert find_fit(state, pod, verdicts=verdicts).rejected == {"not enough GPU memory": 6}
    assert verdicts.lookup(state, find_fit(state, pod).shape, state.active_rows())[1].size == 0
    state.release("held0")  # one node changes: only it is judged again, and the pod now fits there
    fit = find_fit(state, pod, verdicts=verdicts)
    assert list(fit.rows) == [0] and fit.rejected == find_fit(state, pod).rejected == {
        "not enough GPU memory": 5
    }


def test_a_fit_narrowed_to_some_gpus_counts_the_refusals_of_the_fit_it_came_from() -> None:
    state = ClusterState([node("a", 2), node("b", 0)])
    fit = find_fit(state, share_pod("p", 100))
    narrowed = fit.narrowed(state.gpu_tenants > 0, Hashed(("in use", fit.shape.value)))
    assert len(narrowed.rows) == 0 and narrowed.rejected == fit.rejected == {"too few GPUs": 1}


def test_endless_shapes_that_fit_nowhere_keep_the_verdict_memo_within_its_bound() -> None:
    state = ClusterState([node(f"n{i}", 1, cpu=1_000) for i in range(20)])
    bounded, free = policy("bestfit"), policy("bestfit")
    small = verdict_memo()
    small._most_bytes = 5 * state.version.shape[0] * (8 + 1)  # five shapes' verdicts
    bounded = dataclasses.replace(bounded, verdicts=small)
    for i in range(40):
        pod = dataclasses.replace(share_pod(f"p{i}", 100), cpu_milli=2_000 + i)  # each its own shape
        assert decide(state, pod, bounded) == decide(state, pod, free)
        assert 0 < small._bytes <= small._most_bytes
