"""Scenarios: how long a pod runs before it may be evicted, per queue, as KAI Scheduler's Queue says it
(`preemptMinRuntime`, `reclaimMinRuntime`), else the scheduler's `--min-runtime` (600 s here). Running pods
have run an hour. README, "Preemption and reclaim"."""

from __future__ import annotations

import pytest

from .driver import ANY, PREEMPTED, RECLAIMED, Ask, Node, Run, Scenario, cases, check

ONE_GPU = {"n1": Node()}
LOW_IN_A = {"lo": Run("n1:0", queue="a", priority=1)}
HIGH_IN_A = {"hi": Ask(gpus=1, queue="a", priority=10)}
B_BORROWED = {"b1": Run("n1:0", queue="b")}
A_OWED = {"a1": Ask(gpus=1, queue="a")}


def preempting(runtime: str) -> dict[str, dict[str, object]]:
    return {"a": {"preemptMinRuntime": runtime}}


def reclaiming(runtime: str, **b: object) -> dict[str, dict[str, object]]:
    return {"a": {"gpus": {"quota": 1}}, "b": {"reclaimMinRuntime": runtime, **b}}


SCENARIOS = [
    Scenario(
        "a queue's preemptMinRuntime longer than the hour its pod ran keeps it from the queue's own pods",
        nodes=ONE_GPU,
        queues=preempting("2h"),
        running=LOW_IN_A,
        pending=HIGH_IN_A,
        waiting={"hi": ""},
    ),
    Scenario(
        "a queue's preemptMinRuntime shorter than its pod ran lets the queue's higher priority preempt it",
        nodes=ONE_GPU,
        queues=preempting("30m"),
        running=LOW_IN_A,
        pending=HIGH_IN_A,
        binds={"hi": "n1"},
        evicted={"lo": PREEMPTED},
    ),
    Scenario(
        "a negative preemptMinRuntime is never: KAI Scheduler's -1",
        nodes=ONE_GPU,
        queues=preempting("-1s"),
        running=LOW_IN_A,
        pending=HIGH_IN_A,
        waiting={"hi": ""},
    ),
    Scenario(
        "a preemptMinRuntime of 0 lets a pod younger than --min-runtime be preempted",
        nodes=ONE_GPU,
        queues=preempting("0s"),
        running={"lo": Run("n1:0", queue="a", priority=1, age=60)},
        pending=HIGH_IN_A,
        binds={"hi": "n1"},
        evicted={"lo": PREEMPTED},
    ),
    Scenario(
        "the borrowing queue's reclaimMinRuntime longer than its pod ran keeps it from reclaim",
        nodes=ONE_GPU,
        queues=reclaiming("2h"),
        running=B_BORROWED,
        pending=A_OWED,
        waiting={"a1": ""},
    ),
    Scenario(
        "a reclaimMinRuntime of 0 lets a borrowed pod younger than --min-runtime be reclaimed",
        nodes=ONE_GPU,
        queues=reclaiming("0s"),
        running={"b1": Run("n1:0", queue="b", age=60)},
        pending=A_OWED,
        binds={"a1": ANY},
        evicted={"b1": RECLAIMED},
    ),
    Scenario(
        "reclaim reads the victim's side below the two queues' common ancestor: the parent's, if the "
        "victim's queue sets none",
        nodes=ONE_GPU,
        queues={
            "a": {"gpus": {"quota": 1}},
            "org": {"reclaimMinRuntime": "2h"},
            "b": {"parentQueue": "org"},
        },
        running=B_BORROWED,
        pending=A_OWED,
        waiting={"a1": ""},
    ),
    Scenario(
        "a setting below the common ancestor's child rules only inside that branch",
        nodes=ONE_GPU,
        queues={
            "a": {"gpus": {"quota": 1}},
            "org": {},
            "b": {"parentQueue": "org", "reclaimMinRuntime": "2h"},
        },
        running=B_BORROWED,
        pending=A_OWED,
        binds={"a1": ANY},
        evicted={"b1": RECLAIMED},
    ),
]


@pytest.mark.parametrize("scenario", cases(SCENARIOS))
async def test_scenario(scenario: Scenario) -> None:
    await check(scenario)
