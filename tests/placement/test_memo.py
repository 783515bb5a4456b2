"""The per-node memos (`placement.cache.NodeMemo`) keep at most their bound of arrays: pods of endless
distinct shapes (a tenant's) cannot grow the scheduler without end, and a key dropped is computed again."""

from __future__ import annotations

import numpy as np

from gpufrac.cluster.state import ClusterState
from gpufrac.placement.cache import NodeMemo
from gpufrac.placement.engine import decide
from gpufrac.placement.fit import find_fit, fit_memo

from ..cluster.builders import node, share_pod
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


def test_a_policy_deciding_endless_shapes_keeps_its_memos_within_their_bound_and_decides_alike() -> None:
    state = ClusterState([node(f"n{i}", 2) for i in range(50)])
    bounded, free = policy("fgd"), policy("fgd")
    small = fit_memo()
    small._most_bytes = 10 * state.version.shape[0] * (8 + 8 + state.width)  # ten shapes' verdicts
    bounded = type(bounded)(bounded.scorer, bounded.picker, small)
    for i in range(60):
        pod = share_pod(f"p{i}", 100 + i)
        assert decide(state, pod, bounded) == decide(state, pod, free)
        assert small._bytes <= small._most_bytes
    assert find_fit(state, share_pod("q", 500), memo=small).rows.size == 50
