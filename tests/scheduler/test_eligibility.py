"""Which nodes a pod may be considered for, and why the others are not."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from gpufrac.cluster.state import ClusterState
from gpufrac.scheduler import objects
from gpufrac.scheduler.eligibility import Eligibility, tolerates

from ..kubeapi.apiobjects import node, pod

NO_SCHEDULE = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    ("toleration", "expected"),
    [
        ({"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}, True),
        ({"key": "dedicated", "value": "ml"}, True),  # operator defaults to Equal, any effect
        ({"key": "dedicated", "operator": "Equal", "value": "web"}, False),
        ({"key": "dedicated", "operator": "Exists"}, True),
        ({"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}, False),
        ({"key": "other", "operator": "Exists"}, False),
        ({"operator": "Exists"}, True),  # an empty key with Exists tolerates every taint
        ({"key": "", "operator": "Exists", "effect": "NoSchedule"}, True),
        ({"operator": "Exists", "effect": "NoExecute"}, False),
        ({"value": "ml"}, False),  # an empty key needs Exists
    ],
)
def test_tolerates(toleration: dict[str, str], expected: bool) -> None:
    assert tolerates([toleration], NO_SCHEDULE) is expected


def test_tolerates_needs_one_matching_toleration() -> None:
    assert not tolerates([], NO_SCHEDULE)
    assert tolerates([{"key": "x", "operator": "Exists"}, {"key": "dedicated", "value": "ml"}], NO_SCHEDULE)


def test_an_empty_value_matches_a_taint_without_value() -> None:
    assert tolerates([{"key": "gpu", "operator": "Equal"}], {"key": "gpu", "effect": "NoSchedule"})


def eligibility(
    nodes: Sequence[Mapping[str, Any]], selector: Mapping[str, str]
) -> tuple[Eligibility, ClusterState]:
    state = ClusterState()
    chooser = Eligibility(selector)
    for item in nodes:
        row = state.add_node(objects.node_spec(item))
        chooser.update(row, item)
    return chooser, state


def names(state: ClusterState, rows: Any) -> list[str]:
    return [state.names[int(row)] for row in rows]


MANAGED = {"gpufrac.io/managed": "true"}


def test_rows_for_counts_each_excluded_node_under_its_reason() -> None:
    nodes = [
        node("ok", labels=MANAGED | {"zone": "a"}),
        node("ok-other-zone", labels=MANAGED | {"zone": "b"}),
        node("not-ready", labels=MANAGED | {"zone": "a"}, ready=False),
        node("cordoned", labels=MANAGED | {"zone": "a"}, cordoned=True),
        node("unmanaged", labels={"zone": "a"}),
        node("tainted", labels=MANAGED | {"zone": "a"}, taints=[NO_SCHEDULE]),
        node(
            "soft-taint", labels=MANAGED | {"zone": "a"}, taints=[{"key": "k", "effect": "PreferNoSchedule"}]
        ),
    ]
    chooser, state = eligibility(nodes, MANAGED)
    rows, excluded = chooser.rows_for(pod("p", node_selector={"zone": "a"}), state)
    assert names(state, rows) == ["ok", "soft-taint"]
    assert excluded == {
        "node not ready or cordoned": 2,
        "not managed by gpufrac (node selector)": 1,
        "node(s) didn't match the pod's node selector": 1,
        "node(s) had a taint the pod does not tolerate": 1,
    }


def test_a_toleration_lets_the_pod_on_the_tainted_node() -> None:
    chooser, state = eligibility([node("plain"), node("tainted", taints=[NO_SCHEDULE])], {})
    tolerant = pod("p", tolerations=[{"key": "dedicated", "operator": "Exists"}])
    rows, excluded = chooser.rows_for(tolerant, state)
    assert names(state, rows) == ["plain", "tainted"] and not excluded
    rows, excluded = chooser.rows_for(pod("p"), state)
    assert names(state, rows) == ["plain"]
    assert excluded == {"node(s) had a taint the pod does not tolerate": 1}


def test_every_taint_must_be_tolerated() -> None:
    taints = [NO_SCHEDULE, {"key": "evict", "effect": "NoExecute"}]
    chooser, state = eligibility([node("tainted", taints=taints)], {})
    half = pod("p", tolerations=[{"key": "dedicated", "operator": "Exists"}])
    assert names(state, chooser.rows_for(half, state)[0]) == []
    both = pod(
        "p", tolerations=[{"key": "dedicated", "operator": "Exists"}, {"key": "evict", "operator": "Exists"}]
    )
    assert names(state, chooser.rows_for(both, state)[0]) == ["tainted"]


def test_an_update_moves_a_node_in_and_out() -> None:
    chooser, state = eligibility([node("n1", ready=False)], {})
    assert chooser.rows_for(pod("p"), state)[1] == {"node not ready or cordoned": 1}
    chooser.update(state.index["n1"], node("n1"))
    rows, excluded = chooser.rows_for(pod("p"), state)
    assert names(state, rows) == ["n1"] and not excluded
    chooser.update(state.index["n1"], node("n1", taints=[NO_SCHEDULE]))
    assert chooser.rows_for(pod("p"), state)[1] == {"node(s) had a taint the pod does not tolerate": 1}


def test_removed_nodes_are_neither_candidates_nor_counted() -> None:
    chooser, state = eligibility([node("gone"), node("kept", ready=False)], {})
    state.remove_node("gone")
    rows, excluded = chooser.rows_for(pod("p"), state)
    assert len(rows) == 0 and excluded == {"node not ready or cordoned": 1}


def test_a_label_column_follows_the_nodes_and_is_kept_only_for_keys_nodes_carry() -> None:
    nodes = [
        node(name, labels=MANAGED | {"zone": zone}) for name, zone in (("n0", "a"), ("n1", "b"), ("n2", "a"))
    ]
    chooser, state = eligibility(nodes, MANAGED)
    size = state.active.shape[0]
    codes = chooser.column("zone", size)
    assert codes[0] == codes[2] != codes[1] >= 0 and chooser.column("rack", size)[:3].tolist() == [-1, -1, -1]
    chooser.update(1, node("n1", labels=MANAGED | {"zone": "a"}))  # relabelled: the kept column follows
    assert chooser.column("zone", size)[1] == codes[0]
    # A tenant's topology keys that no node carries build and keep nothing, however many.
    for key in range(1000):
        assert chooser.column(f"key-{key}", size)[:3].tolist() == [-1, -1, -1]
    assert set(chooser._columns) == {"zone"}
