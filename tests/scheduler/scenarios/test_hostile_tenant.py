"""Scenarios: a hostile tenant, who may create pods and PodGroups in their own namespace, uses the rules for
queues, gangs and priorities to keep what another queue is owed. Each row is an attack found in review; the
rule it breaks is the README's ("Queues and fair share", "Gangs")."""

from __future__ import annotations

import pytest

from .driver import ANY, RECLAIMED, Ask, Node, Run, Scenario, cases, check

THREE_NODES = {"n1": Node(), "n2": Node(), "n3": Node()}
# Queue a is owed two GPUs; queue b is guaranteed one, and runs it as a protected pod within that quota.
A_OWED_TWO = {"a": {"gpus": {"quota": 2}}, "b": {"gpus": {"quota": 1}}}
B_WITHIN_QUOTA = {"b0": Run("n3:0", queue="b", priority=100)}
A_ASKS_TWO = {"a1": Ask(gpus=1, queue="a"), "a2": Ask(gpus=1, queue="a")}

SCENARIOS = [
    Scenario(
        "a borrowed gang is reclaimed whole (the control for the shields below)",
        nodes=THREE_NODES,
        queues=A_OWED_TWO,
        groups={"train": {"minMember": 2, "queue": "b"}},
        running={**B_WITHIN_QUOTA, "w1": Run("n1:0", group="train"), "w2": Run("n2:0", group="train")},
        pending=A_ASKS_TWO,
        binds={"a1": ANY, "a2": ANY},
        evicted={"w1": RECLAIMED, "w2": RECLAIMED},
    ),
    Scenario(
        "a protected pod without GPUs in a borrowed gang does not shield its members from reclaim",
        nodes=THREE_NODES,
        queues=A_OWED_TWO,
        groups={"train": {"minMember": 3, "queue": "b"}},
        running={
            **B_WITHIN_QUOTA,
            "w1": Run("n1:0", group="train"),
            "w2": Run("n2:0", group="train"),
            "shield": Run("n1", group="train", priority=100),
        },
        pending=A_ASKS_TWO,
        binds={"a1": ANY, "a2": ANY},
        evicted={"w1": RECLAIMED, "w2": RECLAIMED},
    ),
    Scenario(
        "a young pod without GPUs in a borrowed gang does not shield its members from reclaim",
        nodes=THREE_NODES,
        queues=A_OWED_TWO,
        groups={"train": {"minMember": 3, "queue": "b"}},
        running={
            **B_WITHIN_QUOTA,
            "w1": Run("n1:0", group="train"),
            "w2": Run("n2:0", group="train"),
            "shield": Run("n1", group="train", age=0),
        },
        pending=A_ASKS_TWO,
        binds={"a1": ANY, "a2": ANY},
        evicted={"w1": RECLAIMED, "w2": RECLAIMED},
    ),
]


@pytest.mark.parametrize("scenario", cases(SCENARIOS))
async def test_scenario(scenario: Scenario) -> None:
    await check(scenario)
