"""Scenarios: the order queues are served in (fair share by quota and weight), borrowing idle capacity,
limits, the tree of queues, the default queue, and a queue nobody made. README, "Queues and fair share"."""

from __future__ import annotations

import pytest

from .driver import ANY, Ask, Node, Scenario, cases, check, pods

ONE_GPU_EACH = {"n1": Node(), "n2": Node()}
FOUR_GPUS = {"n1": Node(gpus=2), "n2": Node(gpus=2)}
A_B_ONE_EACH = {"a": {"gpus": {"quota": 1}}, "b": {"gpus": {"quota": 1}}}
TWO_ROOTS = {  # r1's quota is its children's; r2 has no children
    "r1": {"gpus": {"quota": 2}},
    "x": {"parentQueue": "r1", "gpus": {"quota": 1}},
    "y": {"parentQueue": "r1", "gpus": {"quota": 1}},
    "r2": {"gpus": {"quota": 2}},
}

SCENARIOS = [
    Scenario(
        "two queues with a GPU of quota each get one each, though one queue's pods came first",
        nodes=ONE_GPU_EACH,
        queues=A_B_ONE_EACH,
        pending={**pods("a", 2, gpus=1, queue="a"), "b1": Ask(gpus=1, queue="b")},
        binds={"a1": ANY, "b1": ANY},
        waiting={"a2": "0/2 nodes are available"},
    ),
    Scenario(
        "without queues the same pods go by age alone",
        nodes=ONE_GPU_EACH,
        settings={"queues": False},
        pending={**pods("a", 2, gpus=1, queue="a"), "b1": Ask(gpus=1, queue="b")},
        binds={"a1": ANY, "a2": ANY},
        waiting={"b1": ""},
    ),
    Scenario(
        "three queues with a GPU of quota each get one each",
        nodes={"n1": Node(gpus=3)},
        queues={"a": {"gpus": {"quota": 1}}, "b": {"gpus": {"quota": 1}}, "c": {"gpus": {"quota": 1}}},
        pending={
            **pods("a", 3, gpus=1, queue="a"),
            **pods("b", 2, gpus=1, queue="b"),
            "c1": Ask(gpus=1, queue="c"),
        },
        binds={"a1": "n1", "b1": "n1", "c1": "n1"},
        waiting={"a2": "", "a3": "", "b2": ""},
    ),
    Scenario(
        "a queue with twice the quota gets twice the GPUs",
        nodes={"n1": Node(gpus=3)},
        queues={"a": {"gpus": {"quota": 2}}, "b": {"gpus": {"quota": 1}}},
        pending={
            **pods("b", 3, gpus=1, queue="b"),
            **pods("a", 3, gpus=1, queue="a"),
        },
        binds={"b1": "n1", "a1": "n1", "a2": "n1"},
        waiting={"b2": "", "b3": "", "a3": ""},
    ),
    Scenario(
        "without quotas idle GPUs are split by overQuotaWeight (3 to 1)",
        nodes=FOUR_GPUS,
        queues={"a": {"gpus": {"overQuotaWeight": 3}}, "b": {"gpus": {"overQuotaWeight": 1}}},
        pending={
            **pods("b", 4, gpus=1, queue="b"),
            **pods("a", 4, gpus=1, queue="a"),
        },
        binds={"b1": ANY, "a1": ANY, "a2": ANY, "a3": ANY},
        waiting={"b2": "", "b3": "", "b4": "", "a4": ""},
    ),
    Scenario(
        "quotas first, then what is left by weight: 1+1 and 1+3 of six GPUs",
        nodes={"n1": Node(gpus=3), "n2": Node(gpus=3)},
        queues={"a": {"gpus": {"quota": 1}}, "b": {"gpus": {"quota": 1, "overQuotaWeight": 3}}},
        pending={
            **pods("a", 5, gpus=1, queue="a"),
            **pods("b", 5, gpus=1, queue="b"),
        },
        binds={"a1": ANY, "a2": ANY, "b1": ANY, "b2": ANY, "b3": ANY, "b4": ANY},
        waiting={"a3": "", "a4": "", "a5": "", "b5": ""},
    ),
    Scenario(
        "a queue alone borrows every idle GPU past its quota",
        nodes={"n1": Node(gpus=3)},
        queues=A_B_ONE_EACH,
        pending=pods("a", 3, gpus=1, queue="a"),
        binds={"a1": "n1", "a2": "n1", "a3": "n1"},
    ),
    Scenario(
        "a quota its queue does not ask for is lent to another queue",
        nodes={"n1": Node(gpus=3)},
        queues={"a": {"gpus": {"quota": 2}}, "b": {}},
        pending={
            **pods("b", 3, gpus=1, queue="b"),
            "a1": Ask(gpus=1, queue="a"),
        },
        binds={"b1": "n1", "b2": "n1", "a1": "n1"},
        waiting={"b3": ""},
    ),
    Scenario(
        "a limit is never passed, even with GPUs idle",
        nodes={"n1": Node(gpus=3)},
        queues={"a": {"gpus": {"quota": 1, "limit": 2}}},
        pending=pods("a", 3, gpus=1, queue="a"),
        binds={"a1": "n1", "a2": "n1"},
        waiting={"a3": "queue a would pass its gpus limit (2)"},
    ),
    Scenario(
        "a gpuMemory limit holds a queue's shares to it",
        nodes={"n1": Node(gpus=2)},
        queues={"a": {"gpuMemory": {"limit": "10000Mi"}}},
        pending=pods("a", 3, mib=4000, queue="a"),
        binds={"a1": "n1", "a2": "n1"},
        waiting={"a3": "queue a would pass its gpuMemory limit (10000 MiB)"},
    ),
    Scenario(
        "a CPU limit holds a queue's CPU to it",
        nodes={"n1": Node(gpus=0, cpu="8")},
        queues={"a": {"cpu": {"limit": "2"}}},
        pending=pods("a", 3, cpu="1", queue="a"),
        binds={"a1": "n1", "a2": "n1"},
        waiting={"a3": "queue a would pass its cpu limit (2000m)"},
    ),
    Scenario(
        "what a limited queue may not take goes to the others, whatever its weight",
        nodes={"n1": Node(gpus=3)},
        queues={"a": {"gpus": {"overQuotaWeight": 10, "limit": 1}}, "b": {}},
        pending={
            **pods("a", 2, gpus=1, queue="a"),
            **pods("b", 2, gpus=1, queue="b"),
        },
        binds={"a1": "n1", "b1": "n1", "b2": "n1"},
        waiting={"a2": "queue a would pass its gpus limit (1)"},
    ),
    Scenario(
        "a parent's limit holds its children together",
        nodes=FOUR_GPUS,
        queues={"p": {"gpus": {"limit": 2}}, "c1": {"parentQueue": "p"}, "c2": {"parentQueue": "p"}},
        pending={
            **pods("x", 2, gpus=1, queue="c1"),
            **pods("y", 2, gpus=1, queue="c2"),
        },
        binds={"x1": ANY, "y1": ANY},
        waiting={"x2": "queue p would pass its gpus limit", "y2": "queue p would pass its gpus limit"},
    ),
    Scenario(
        "children split their parent's share; the other root keeps its own",
        nodes=FOUR_GPUS,
        queues=TWO_ROOTS,
        pending={
            **pods("x", 3, gpus=1, queue="x"),
            "y1": Ask(gpus=1, queue="y"),
            **pods("z", 2, gpus=1, queue="r2"),
        },
        binds={"x1": ANY, "y1": ANY, "z1": ANY, "z2": ANY},
        waiting={"x2": "", "x3": ""},
    ),
    Scenario(
        "a child borrows its idle sibling's quota before the other root's",
        nodes=FOUR_GPUS,
        queues=TWO_ROOTS,
        pending={
            **pods("x", 3, gpus=1, queue="x"),
            **pods("z", 3, gpus=1, queue="r2"),
        },
        binds={"x1": ANY, "x2": ANY, "z1": ANY, "z2": ANY},
        waiting={"x3": "", "z3": ""},
    ),
    Scenario(
        "weights apply at each level of the tree: 1 to 3 between roots, then even between children",
        nodes=FOUR_GPUS,
        queues={
            "r1": {"gpus": {"overQuotaWeight": 1}},
            "r2": {"gpus": {"overQuotaWeight": 3}},
            "x": {"parentQueue": "r2"},
            "y": {"parentQueue": "r2"},
        },
        pending={
            **pods("w", 3, gpus=1, queue="r1"),
            **pods("x", 3, gpus=1, queue="x"),
            **pods("y", 3, gpus=1, queue="y"),
        },
        binds={"w1": ANY, "x1": ANY, "y1": ANY, "x2": ANY},
        waiting={"w2": "", "w3": "", "x3": "", "y2": "", "y3": ""},
    ),
    Scenario(
        "a pod without a queue label is in default: no quota, weight 1",
        nodes=ONE_GPU_EACH,
        queues={"a": {"gpus": {"quota": 1}}},
        pending={"d1": Ask(gpus=1), "d2": Ask(gpus=1), "a1": Ask(gpus=1, queue="a")},
        binds={"d1": ANY, "a1": ANY},
        waiting={"d2": ""},
    ),
    Scenario(
        "a pod of a queue nobody made waits, and says so; the others go on",
        nodes=ONE_GPU_EACH,
        queues={"a": {}},
        pending={"g1": Ask(gpus=1, queue="ghost"), "a1": Ask(gpus=1, queue="a")},
        binds={"a1": ANY},
        waiting={"g1": "queue ghost does not exist"},
    ),
    Scenario(
        "within a queue, the higher priority goes first",
        nodes={"n1": Node()},
        queues={"a": {"gpus": {"quota": 1}}},
        pending={"low": Ask(gpus=1, queue="a"), "high": Ask(gpus=1, queue="a", priority=5)},
        binds={"high": "n1"},
        waiting={"low": ""},
    ),
    Scenario(
        "across queues, fair share comes before priority",
        nodes=ONE_GPU_EACH,
        queues=A_B_ONE_EACH,
        pending={
            **pods("a", 2, gpus=1, queue="a", priority=50),
            "b1": Ask(gpus=1, queue="b"),
        },
        binds={"a1": ANY, "b1": ANY},
        waiting={"a2": ""},
    ),
    Scenario(
        "shares count under gpuMemory: quotas of half a GPU's memory each get half",
        nodes={"n1": Node(gpus=2)},
        queues={"a": {"gpuMemory": {"quota": "10000Mi"}}, "b": {"gpuMemory": {"quota": "10000Mi"}}},
        pending={
            **pods("a", 4, mib=5000, queue="a"),
            **pods("b", 2, mib=5000, queue="b"),
        },
        binds={"a1": "n1", "a2": "n1", "b1": "n1", "b2": "n1"},
        waiting={"a3": "", "a4": ""},
    ),
    Scenario(
        "CPU is shared by queues too",
        nodes={"n1": Node(gpus=0, cpu="4")},
        queues={"a": {"cpu": {"quota": "2"}}, "b": {"cpu": {"quota": "2"}}},
        pending={"a1": Ask(cpu="2", queue="a"), "a2": Ask(cpu="2", queue="a"), "b1": Ask(cpu="2", queue="b")},
        binds={"a1": "n1", "b1": "n1"},
        waiting={"a2": "0/1 nodes are available"},
    ),
]


@pytest.mark.parametrize("scenario", cases(SCENARIOS))
async def test_scenario(scenario: Scenario) -> None:
    await check(scenario)
