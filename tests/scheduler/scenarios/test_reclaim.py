"""Scenarios: reclaim across queues. A queue whose use, with the pod, stays within its quota (in the resources
it has a quota of and the pod asks for) evicts pods of queues over their fair share, only those whose going
leaves their queue at its fair share at least, whatever their priority; never a protected or young pod.
README, "Preemption and reclaim"."""

from __future__ import annotations

import pytest

from .driver import ANY, RECLAIMED, Ask, Node, Run, Scenario, cases, check, pods

TWO_NODES = {"n1": Node(), "n2": Node()}
THREE_NODES = {"n1": Node(), "n2": Node(), "n3": Node()}
A_B_ONE_EACH = {"a": {"gpus": {"quota": 1}}, "b": {"gpus": {"quota": 1}}}
B_BORROWED_BOTH = {"b1": Run("n1:0", queue="b"), "b2": Run("n2:0", queue="b")}

SCENARIOS = [
    Scenario(
        "a PodGroup whose queue changes under its running pods does not move them out of their queue",
        nodes={f"n{i}": Node() for i in range(1, 5)},
        queues={"a": {"gpus": {"quota": 1}}, "b": {"gpus": {"quota": 1}}},
        groups={"g": {"minMember": 1, "queue": "default"}},  # was a when a1 was bound
        running={
            "a1": Run("n1:0", queue="a", group="g"),
            **{f"b{i}": Run(f"n{i + 1}:0", queue="b") for i in (1, 2, 3)},
        },
        pending={"a2": Ask(gpus=1, queue="a")},
        waiting={"a2": ""},
    ),
    Scenario(
        "a quota of CPU to spare blocks no reclaim: only what the queues ask more of than the cluster has "
        "is held to fair shares",
        nodes=TWO_NODES,
        queues={q: {"gpus": {"quota": 1}, "cpu": {"quota": 4}} for q in ("a", "b")},
        running=B_BORROWED_BOTH,
        pending={"a1": Ask(gpus=1, queue="a")},
        binds={"a1": ANY},
        evicted={"b1": RECLAIMED},
    ),
    Scenario(
        "a borrowed GPU its queue's pod holds while deleted with a day of grace is reclaimed to go sooner",
        nodes=TWO_NODES,
        queues=A_B_ONE_EACH,
        running={
            "b1": Run("n1:0", queue="b", terminating=True, overdue=-86400),
            "b2": Run("n2:0", queue="b"),
        },
        pending={"a1": Ask(gpus=1, queue="a")},
        binds={"a1": "n1"},
        evicted={"b1": RECLAIMED},
    ),
    Scenario(
        "a queue below its quota reclaims the GPU another queue borrowed",
        nodes=TWO_NODES,
        queues=A_B_ONE_EACH,
        running=B_BORROWED_BOTH,
        pending={"a1": Ask(gpus=1, queue="a")},
        binds={"a1": "n1"},
        evicted={"b1": RECLAIMED},
    ),
    Scenario(
        "reclaim takes from the queue over its fair share, not from one at its quota",
        nodes=THREE_NODES,
        queues={"a": {"gpus": {"quota": 1}}, "b": {"gpus": {"quota": 2}}, "c": {}},
        running={"b1": Run("n1:0", queue="b"), "b2": Run("n2:0", queue="b"), "c1": Run("n3:0", queue="c")},
        pending={"a1": Ask(gpus=1, queue="a")},
        binds={"a1": "n3"},
        evicted={"c1": RECLAIMED},
    ),
    Scenario(
        "the default queue's borrowed GPU is reclaimed",
        nodes=TWO_NODES,
        queues=A_B_ONE_EACH,
        running={"b1": Run("n1:0", queue="b"), "d1": Run("n2:0")},
        pending={"a1": Ask(gpus=1, queue="a")},
        binds={"a1": "n2"},
        evicted={"d1": RECLAIMED},
    ),
    Scenario(
        "a Queue named default gives unlabelled pods a quota to reclaim with",
        nodes=TWO_NODES,
        queues={"default": {"gpus": {"quota": 1}}, "b": {}},
        running=B_BORROWED_BOTH,
        pending={"d1": Ask(gpus=1)},
        binds={"d1": "n1"},
        evicted={"b1": RECLAIMED},
    ),
    Scenario(
        "a queue that would pass its quota does not reclaim, though the other is over its share",
        nodes=THREE_NODES,
        queues={"a": {"gpus": {"quota": 1}}, "b": {"gpus": {"quota": 1, "overQuotaWeight": 0}}},
        running={"a1": Run("n1:0", queue="a"), "b1": Run("n2:0", queue="b"), "b2": Run("n3:0", queue="b")},
        pending={"a2": Ask(gpus=1, queue="a")},
        waiting={"a2": ""},
    ),
    Scenario(
        "a queue without a quota does not reclaim",
        nodes=TWO_NODES,
        queues={"a": {}, "b": {"gpus": {"quota": 1}}},
        running=B_BORROWED_BOTH,
        pending={"a1": Ask(gpus=1, queue="a")},
        waiting={"a1": ""},
    ),
    Scenario(
        "a quota of GPUs does not reclaim GPU memory for a share",
        nodes=TWO_NODES,
        queues=A_B_ONE_EACH,
        running=B_BORROWED_BOTH,
        pending={"a1": Ask(mib=5000, queue="a")},
        waiting={"a1": ""},
    ),
    Scenario(
        "a gpuMemory quota reclaims memory for a share, one share's worth",
        nodes={"n1": Node()},
        queues={"a": {"gpuMemory": {"quota": "5000Mi"}}, "b": {}},
        running={"b1": Run("n1:0", mib=5000, queue="b"), "b2": Run("n1:0", mib=5000, queue="b")},
        pending={"a1": Ask(mib=5000, queue="a")},
        binds={"a1": "n1:0"},
        evicted={"b1": RECLAIMED},
    ),
    Scenario(
        "reclaim ignores priority: a higher priority that was borrowed goes back",
        nodes=TWO_NODES,
        queues=A_B_ONE_EACH,
        running={"b1": Run("n1:0", queue="b", priority=50), "b2": Run("n2:0", queue="b", priority=50)},
        pending={"a1": Ask(gpus=1, queue="a")},
        binds={"a1": "n1"},
        evicted={"b1": RECLAIMED},
    ),
    Scenario(
        "of a borrowing queue's pods, the lowest priority is reclaimed",
        nodes=TWO_NODES,
        queues=A_B_ONE_EACH,
        running={"b1": Run("n1:0", queue="b", priority=50), "b2": Run("n2:0", queue="b", priority=5)},
        pending={"a1": Ask(gpus=1, queue="a")},
        binds={"a1": "n2"},
        evicted={"b2": RECLAIMED},
    ),
    Scenario(
        "of two borrowing queues, the lower priority is reclaimed",
        nodes=THREE_NODES,
        queues={
            "a": {"gpus": {"quota": 1}},
            "b": {"gpus": {"quota": 1, "overQuotaWeight": 0}},
            "c": {"gpus": {"overQuotaWeight": 0}},
        },
        running={
            "b1": Run("n1:0", queue="b", priority=5),
            "b2": Run("n2:0", queue="b", priority=5),
            "c1": Run("n3:0", queue="c", priority=1),
        },
        pending={"a1": Ask(gpus=1, queue="a")},
        binds={"a1": "n3"},
        evicted={"c1": RECLAIMED},
    ),
    Scenario(
        "a queue owed its quota reclaims what another borrowed before it preempts its own (KAI's order)",
        nodes=TWO_NODES,
        queues={"a": {"gpus": {"quota": 2}}, "b": {}},
        running={"low": Run("n1:0", queue="a", priority=1), "b1": Run("n2:0", queue="b")},
        pending={"high": Ask(gpus=1, queue="a", priority=10)},
        binds={"high": "n2"},
        evicted={"b1": RECLAIMED},
    ),
    Scenario(
        "the room reclaimed is kept for the pod that reclaimed it: an idle queue's pod, served first, waits",
        nodes=TWO_NODES,
        queues={**A_B_ONE_EACH, "c": {}},
        running=B_BORROWED_BOTH,
        pending={"a1": Ask(gpus=1, queue="a"), "c1": Ask(gpus=1, queue="c", priority=10, arrives=1)},
        binds={"a1": "n1"},
        evicted={"b1": RECLAIMED},
        waiting={"c1": ""},
    ),
    Scenario(
        "the replacement of a reclaimed pod waits: its queue is at its quota, so it does not reclaim back",
        nodes=TWO_NODES,
        queues=A_B_ONE_EACH,
        running=B_BORROWED_BOTH,
        pending={"a1": Ask(gpus=1, queue="a"), "b1-again": Ask(gpus=1, queue="b", arrives=2)},
        binds={"a1": "n1"},
        evicted={"b1": RECLAIMED},
        waiting={"b1-again": "0/2 nodes are available"},
    ),
    Scenario(
        "reclaim never takes a protected pod",
        nodes=TWO_NODES,
        queues=A_B_ONE_EACH,
        running={"b1": Run("n1:0", queue="b", priority=100), "b2": Run("n2:0", queue="b", priority=100)},
        pending={"a1": Ask(gpus=1, queue="a")},
        waiting={"a1": ""},
    ),
    Scenario(
        "reclaim never takes a pod younger than the minimum runtime",
        nodes=TWO_NODES,
        queues=A_B_ONE_EACH,
        running={"b1": Run("n1:0", queue="b", age=0), "b2": Run("n2:0", queue="b", age=0)},
        pending={"a1": Ask(gpus=1, queue="a")},
        waiting={"a1": ""},
    ),
    Scenario(
        "reclaims stop at the reclaiming queue's quota, counting its pods whose binds are under way",
        nodes=THREE_NODES,
        queues={"a": {"gpus": {"quota": 2}}, "b": {"gpus": {"overQuotaWeight": 0}}},
        running={"b1": Run("n1:0", queue="b"), "b2": Run("n2:0", queue="b"), "b3": Run("n3:0", queue="b")},
        pending=pods("a", 3, gpus=1, queue="a"),
        binds={"a1": ANY, "a2": ANY},
        evicted={"b1": RECLAIMED, "b2": RECLAIMED},
        waiting={"a3": ""},
    ),
    Scenario(
        "reclaims in one round count each other: each victim queue keeps its fair share",
        nodes={f"n{i}": Node() for i in range(1, 6)},
        queues={"a": {"gpus": {"quota": 3}}, "b": {"gpus": {"quota": 2}}, "c": {}},
        running={
            **{f"b{i}": Run(f"n{i}:0", queue="b", priority=1) for i in range(1, 5)},
            "c1": Run("n5:0", queue="c", priority=5),
        },
        pending=pods("a", 3, gpus=1, queue="a"),
        binds={"a1": ANY, "a2": ANY, "a3": ANY},
        evicted={"b1": RECLAIMED, "b2": RECLAIMED, "c1": RECLAIMED},
    ),
    Scenario(
        "a queue is not reclaimed below its fair share, even when that leaves another below its quota",
        nodes={"n1": Node(gpus=3), "n2": Node(gpus=2)},
        queues={
            "a": {"gpus": {"quota": 1}},
            "b": {"gpus": {"quota": 1, "overQuotaWeight": 2}},
            "c": {"gpus": {"quota": 1}},
        },
        running={
            "b1": Run("n1:0", queue="b"),
            "b2": Run("n1:1", queue="b"),
            "b3": Run("n1:2", queue="b"),
            "c1": Run("n2:0", queue="c"),
            "c2": Run("n2:1", queue="c"),
        },
        pending={"a1": Ask(gpus=1, queue="a")},
        waiting={"a1": ""},
    ),
    Scenario(
        "between sibling queues, the one below its quota reclaims from the one that borrowed",
        nodes=TWO_NODES,
        queues={
            "team": {"gpus": {"quota": 2}},
            "x": {"parentQueue": "team", "gpus": {"quota": 1}},
            "y": {"parentQueue": "team", "gpus": {"quota": 1}},
        },
        running={"y1": Run("n1:0", queue="y"), "y2": Run("n2:0", queue="y")},
        pending={"x1": Ask(gpus=1, queue="x")},
        binds={"x1": "n1"},
        evicted={"y1": RECLAIMED},
    ),
    Scenario(
        "quotas past the cluster shrink in proportion: the queue holding both GPUs gives one back",
        nodes={"n1": Node(gpus=2)},
        queues={"a": {"gpus": {"quota": 2}}, "b": {"gpus": {"quota": 2}}},
        running={"a1": Run("n1:0", queue="a"), "a2": Run("n1:1", queue="a")},
        pending={"b1": Ask(gpus=1, queue="b"), "b2": Ask(gpus=1, queue="b")},
        binds={"b1": "n1"},
        evicted={"a1": RECLAIMED},
        waiting={"b2": ""},
    ),
    Scenario(
        "shares count as the part of a GPU they take: a whole-GPU quota reclaims from a queue of shares",
        nodes=TWO_NODES,
        queues={"a": {"gpus": {"quota": 1}}, "b": {}},
        running={
            "b1": Run("n1:0", mib=5000, queue="b"),
            "b2": Run("n1:0", mib=5000, queue="b"),
            "b3": Run("n2:0", mib=5000, queue="b"),
            "b4": Run("n2:0", mib=5000, queue="b"),
        },
        pending={"a1": Ask(gpus=1, queue="a")},
        binds={"a1": "n1"},
        evicted={"b1": RECLAIMED, "b2": RECLAIMED},
    ),
]


@pytest.mark.parametrize("scenario", cases(SCENARIOS))
async def test_scenario(scenario: Scenario) -> None:
    await check(scenario)
