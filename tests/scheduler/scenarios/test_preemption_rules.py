"""Scenarios: preemption for the rules of the pods placed, as kube-scheduler's: a pod kept off a node by
inter-pod anti-affinity (its own, or that of the pods there) or by a topology spread has lower priorities
on that node preempted until the rules let it in, beside those that free its room, and no more; a victim
its own affinity needs stays; pods on other nodes that keep it off are not preempted. README, "Preemption
and reclaim"."""

from __future__ import annotations

import pytest

from .driver import PREEMPTED, Ask, Neighbourly, Node, Run, Scenario, cases, check

ONE_GPU = {"n1": Node()}
WEB = Neighbourly(labels="app=web")
SHUNS_WEB = Neighbourly(labels="app=batch", anti="app=web")
BATCH = Neighbourly(labels="app=batch")

SCENARIOS = [
    Scenario(
        "a lower priority whose anti-affinity keeps the pod off a node with room is preempted",
        nodes=ONE_GPU,
        running={"low": Run("n1:0", mib=3000, priority=1, rules=SHUNS_WEB)},
        pending={"high": Ask(mib=3000, priority=10, rules=WEB)},
        binds={"high": "n1:0"},
        evicted={"low": PREEMPTED},
    ),
    Scenario(
        "a lower priority the pod's own anti-affinity shuns is preempted",
        nodes=ONE_GPU,
        running={"low": Run("n1:0", mib=3000, priority=1, rules=BATCH)},
        pending={"high": Ask(mib=3000, priority=10, rules=Neighbourly(anti="app=batch"))},
        binds={"high": "n1:0"},
        evicted={"low": PREEMPTED},
    ),
    Scenario(
        "an equal priority whose anti-affinity keeps the pod off is not preempted",
        nodes=ONE_GPU,
        running={"peer": Run("n1:0", mib=3000, priority=10, rules=SHUNS_WEB)},
        pending={"p": Ask(mib=3000, priority=10, rules=WEB)},
        waiting={"p": "existing pods anti-affinity"},
    ),
    Scenario(
        "the pods that free its room and the one that keeps it off go, and no other",
        nodes=ONE_GPU,
        running={
            "hog": Run("n1:0", mib=8000, priority=1),
            "shy": Run("n1", priority=1, rules=SHUNS_WEB),
            "bystander": Run("n1", priority=1),
        },
        pending={"high": Ask(mib=5000, priority=10, rules=WEB)},
        binds={"high": "n1:0"},
        evicted={"hog": PREEMPTED, "shy": PREEMPTED},
    ),
    Scenario(
        "more victims than a pod may take (3) to get past the rules: none is taken",
        nodes=ONE_GPU,
        running={
            "hog": Run("n1:0", mib=8000, priority=1),
            **{f"shy{i}": Run("n1", priority=1, rules=SHUNS_WEB) for i in range(1, 4)},
        },
        pending={"high": Ask(mib=5000, priority=10, rules=WEB)},
        waiting={"high": "existing pods anti-affinity"},
    ),
    Scenario(
        "a pod kept off its zone by a pod on another node, where it has no room, is not helped",
        nodes={"n1": Node(zone="a"), "n2": Node(zone="a")},
        running={
            "shy": Run("n2", priority=1, rules=Neighbourly(labels="app=batch", anti="app=web", by_zone=True)),
            "owner": Run("n2:0", priority=20),
        },
        pending={"high": Ask(gpus=1, priority=10, rules=WEB)},
        waiting={"high": "existing pods anti-affinity"},
    ),
    Scenario(
        "a pod kept off its zone by a pod on the node it goes to is helped",
        nodes={"n1": Node(zone="a"), "n2": Node(zone="a")},
        running={
            "shy": Run("n2", priority=1, rules=Neighbourly(labels="app=batch", anti="app=web", by_zone=True)),
            "owner": Run("n1:0", priority=20),
        },
        pending={"high": Ask(gpus=1, priority=10, rules=WEB)},
        binds={"high": "n2"},
        evicted={"shy": PREEMPTED},
    ),
    Scenario(
        "a lower priority that skews the pod's spread is preempted",
        nodes={"n1": Node(), "n2": Node()},
        running={
            "web1": Run("n1:0", mib=2000, priority=1, rules=WEB),
            "owner": Run("n2:0", priority=20),
        },
        pending={"high": Ask(mib=2000, priority=10, rules=Neighbourly(labels="app=web", spread="app=web"))},
        binds={"high": "n1:0"},
        evicted={"web1": PREEMPTED},
    ),
    Scenario(
        "a victim elsewhere whose going would skew the spread does not hide a node one victim opens",
        nodes={"n1": Node(), "n2": Node()},
        running={
            "web-a": Run("n1", priority=20, rules=WEB),
            "batch": Run("n1", priority=1, rules=BATCH),
            "web-b": Run("n2", priority=1, rules=WEB),
            "owner": Run("n2:0", priority=20),
        },
        pending={
            "high": Ask(
                gpus=1, priority=10, rules=Neighbourly(labels="app=web", anti="app=batch", spread="app=web")
            )
        },
        binds={"high": "n1"},
        evicted={"batch": PREEMPTED},
    ),
    Scenario(
        "a victim whose gang mate (evicted with it) the pod's affinity needs is not preempted",
        nodes=ONE_GPU,
        groups={"g": {"minMember": 2}},
        running={
            "filler": Run("n1:0", priority=1, group="g"),
            "db": Run("n1", priority=1, group="g", rules=Neighbourly(labels="app=db")),
        },
        pending={"high": Ask(gpus=1, priority=10, rules=Neighbourly(affinity="app=db"))},
        waiting={"high": "no healthy free GPU"},
    ),
    Scenario(
        "the one pod the pod's affinity needs stays; the other lower priority goes",
        nodes=ONE_GPU,
        running={
            "db": Run("n1:0", mib=5000, priority=0, rules=Neighbourly(labels="app=db")),
            "other": Run("n1:0", mib=5000, priority=1),
        },
        pending={"high": Ask(mib=5000, priority=10, rules=Neighbourly(affinity="app=db"))},
        binds={"high": "n1:0"},
        evicted={"other": PREEMPTED},
    ),
]


@pytest.mark.parametrize("scenario", cases(SCENARIOS))
async def test_scenario(scenario: Scenario) -> None:
    await check(scenario)
