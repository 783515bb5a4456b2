"""Scenarios: a hostile tenant, who may create pods and PodGroups in their own namespace, uses the rules for
queues, gangs and priorities to keep what another queue is owed. Each row is an attack found in review; the
rule it breaks is the README's ("Queues and fair share", "Gangs")."""

from __future__ import annotations

from typing import Any

import pytest

from gpufrac.contract import keys
from gpufrac.scheduler import evictions

from . import driver
from .driver import ANY, RECLAIMED, Ask, Node, Run, Scenario, cases, check, play

THREE_NODES = {"n1": Node(), "n2": Node(), "n3": Node()}
# Queue a is owed two GPUs; queue b is guaranteed one, and runs it as a protected pod within that quota.
A_OWED_TWO = {"a": {"gpus": {"quota": 2}}, "b": {"gpus": {"quota": 1}}}
B_WITHIN_QUOTA = {"b0": Run("n3:0", queue="b", priority=100)}
A_ASKS_TWO = {"a1": Ask(gpus=1, queue="a"), "a2": Ask(gpus=1, queue="a")}


def shielded(what: str, shield: Run) -> Scenario:
    """A borrowed gang with a pod without GPUs that no eviction may take: it must not shield the rest."""
    return Scenario(
        f"a {what} pod without GPUs in a borrowed gang does not shield its members from reclaim",
        nodes=THREE_NODES,
        queues=A_OWED_TWO,
        groups={"train": {"minMember": 3, "queue": "b"}},
        running={
            **B_WITHIN_QUOTA,
            "w1": Run("n1:0", group="train"),
            "w2": Run("n2:0", group="train"),
            "shield": shield,
        },
        pending=A_ASKS_TWO,
        binds={"a1": ANY, "a2": ANY},
        evicted={"w1": RECLAIMED, "w2": RECLAIMED},
    )


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
    shielded("protected", Run("n1", group="train", priority=100)),
    shielded("young", Run("n1", group="train", age=0)),
    Scenario(
        "a gang one of whose members can never fit holds no room from another queue",
        nodes={"n1": Node()},
        queues={"a": {}, "b": {"gpus": {"quota": 1}}},
        groups={"hog": {"minMember": 2, "queue": "a", "scheduleTimeoutSeconds": 86400}},
        pending={
            "h1": Ask(gpus=1, group="hog"),
            "h2": Ask(gpus=8, group="hog"),  # no node has eight GPUs
            "b1": Ask(gpus=1, queue="b", arrives=1),
        },
        rounds=6,
        binds={"b1": "n1"},
        waiting={"h1": "went to queue b", "h2": ""},
    ),
    Scenario(
        "a gang held within its queue's quota keeps its room from a queue that may not reclaim",
        nodes={"n1": Node()},
        queues={"a": {"gpus": {"quota": 1}}, "b": {}},
        groups={"hog": {"minMember": 2, "queue": "a", "scheduleTimeoutSeconds": 86400}},
        pending={
            "h1": Ask(gpus=1, group="hog"),
            "h2": Ask(gpus=8, group="hog"),
            "b1": Ask(gpus=1, queue="b", arrives=1),
        },
        rounds=6,
        waiting={"h1": "held until the rest can", "h2": "", "b1": "0/1 nodes are available"},
    ),
]

# Pods named here ask with `gpu-fraction` instead of `gpu-memory`: a portion means nothing until a GPU is
# chosen, so a queue's limits and quotas judge it on the cluster's median GPU before it is placed.
FRACTIONS = {"big": "0.9", "g1": "0.9", "g2": "0.9"}
# Three small GPUs, full, and one eight times their size, free: the median GPU is a small one.
SMALL_AND_BIG = {"n1": Node(), "n2": Node(), "n3": Node(), "n4": Node(mib=80_000)}
SMALL_ONES_FULL = {f"b{i}": Run(f"n{i}:0", mib=10_000, queue="b") for i in (1, 2, 3)}


def reclaiming_past(bound: str) -> Scenario:
    """A portion below its queue's gpuMemory `bound` as asked, the only room reclaim could open an 80,000 MiB
    GPU: as placed there, it would pass the bound."""
    return Scenario(
        f"a portion reclaims no room where it would pass its queue's gpuMemory {bound}",
        nodes={"n1": Node(), "n2": Node(), "n3": Node(mib=80_000)},
        queues={"a": {"gpus": {"quota": 1}, "gpuMemory": {bound: "10000Mi"}}, "b": {"gpus": {"quota": 1}}},
        running={
            "b1": Run("n1:0", queue="b", age=0),  # too young to be reclaimed
            "b2": Run("n2:0", queue="b", age=0),
            "b3": Run("n3:0", queue="b"),
        },
        # a2 fits on no node, but asks: queue a's fair share, with it, leaves b over its own.
        pending={"big": Ask(mib=9000, queue="a"), "a2": Ask(gpus=2, queue="a")},
        waiting={"big": "", "a2": ""},
    )


AS_PLACED = [
    Scenario(
        "a portion that would take its queue past its gpuMemory limit on the GPU it gets waits",
        nodes=SMALL_AND_BIG,
        queues={"a": {"gpuMemory": {"limit": "10000Mi"}}, "b": {}},
        running=SMALL_ONES_FULL,
        pending={"big": Ask(mib=9000, queue="a")},
        waiting={"big": "queue a would pass its gpuMemory limit (10000 MiB)"},
    ),
    Scenario(
        "a protected portion that would pass its queue's gpuMemory quota on the GPU it gets waits",
        nodes=SMALL_AND_BIG,
        queues={"a": {"gpuMemory": {"quota": "10000Mi"}}, "b": {}},
        running=SMALL_ONES_FULL,
        pending={"big": Ask(mib=9000, queue="a", priority=100)},
        waiting={"big": "queue a's pods never evicted would pass its gpuMemory quota"},
    ),
    Scenario(
        "a portion still past its queue's gpuMemory limit as placed evicts none of its queue's pods",
        nodes=SMALL_AND_BIG,
        queues={"a": {"gpuMemory": {"limit": "10000Mi"}}, "b": {}},
        running={**SMALL_ONES_FULL, "a0": Run("n4:0", mib=5000, queue="a")},
        pending={"big": Ask(mib=9000, queue="a", priority=10)},
        waiting={"big": "queue a would pass its gpuMemory limit (10000 MiB)"},
    ),
    Scenario(
        "a portion that fits only where its queue's lower priority runs evicts it only if within the limit "
        "as placed",
        nodes=SMALL_AND_BIG,
        queues={"a": {"gpuMemory": {"limit": "10000Mi"}}, "b": {}},
        running={
            **SMALL_ONES_FULL,
            "a0": Run("n4:0", mib=1000, queue="a"),
            "b4": Run("n4:0", mib=7500, queue="b", priority=100),
        },
        pending={"big": Ask(mib=9000, queue="a", priority=10)},
        waiting={"big": ""},
    ),
    Scenario(
        "a portion is not given room by moves where it would pass its queue's gpuMemory limit",
        nodes=SMALL_AND_BIG,
        queues={"a": {"gpuMemory": {"limit": "10000Mi"}}, "b": {}},
        running={
            "b1": Run("n1:0", mib=5000, queue="b"),
            **{name: SMALL_ONES_FULL[name] for name in ("b2", "b3")},
            "m": Run("n4:0", mib=5000, queue="b", movable=True),
            "x": Run("n4:0", mib=4000, queue="b"),
        },
        pending={"big": Ask(mib=9000, queue="a")},
        waiting={"big": ""},
    ),
    reclaiming_past("limit"),
    reclaiming_past("quota"),
    Scenario(
        "a gang of portions preempts its queue's pods only if within its limit with its members as placed",
        nodes={**SMALL_AND_BIG, "n5": Node(mib=80_000)},
        queues={"a": {"gpuMemory": {"limit": "20000Mi"}}, "b": {}},
        groups={"pair": {"minMember": 2, "queue": "a"}},
        running={
            **SMALL_ONES_FULL,
            "a4": Run("n4:0", mib=9000, queue="a"),
            "a5": Run("n5:0", mib=1000, queue="a"),
            **{f"b{i}": Run(f"n{i}:0", mib=8000, queue="b", priority=100) for i in (4, 5)},
        },
        # Judged as asked (2 x 9,000 MiB, for the 10,000 a4 and a5 free), the pair took 144,000 MiB.
        pending=driver.pods("g", 2, mib=9000, group="pair", priority=10),
        waiting={"g1": "", "g2": ""},
    ),
    Scenario(
        "a portion takes no gang's held room where it would pass its queue's gpuMemory quota",
        nodes={**{f"n{i}": Node() for i in range(1, 6)}, "n6": Node(mib=80_000)},
        queues={"a": {"gpus": {"quota": 1}, "gpuMemory": {"quota": "10000Mi"}}, "c": {}},
        groups={"hog": {"minMember": 2, "queue": "c", "scheduleTimeoutSeconds": 86400}},
        # Queue c holds five small GPUs (too young to be reclaimed) and half the big one, held for its gang.
        running={f"c{i}": Run(f"n{i}:0", queue="c", age=0) for i in range(1, 6)},
        pending={
            "h1": Ask(mib=40_000, group="hog"),
            "h2": Ask(gpus=8, group="hog"),  # no node has eight GPUs
            # Below queue a's quota as asked (9,000 MiB); given the held room, it took 72,000 MiB.
            "big": Ask(mib=9000, queue="a", arrives=1),
            "a2": Ask(gpus=2, queue="a", arrives=1),  # fits nowhere, but lifts queue a's fair share
        },
        rounds=6,
        waiting={"h1": "held until the rest can", "h2": "", "big": "", "a2": ""},
    ),
]


@pytest.fixture
def fractions(monkeypatch: pytest.MonkeyPatch) -> None:
    made = driver._pending

    def pending(name: str, ask: Ask, order: int) -> dict[str, Any]:
        body = made(name, ask, order)
        if name in FRACTIONS:
            notes = body["metadata"]["annotations"]
            notes.pop(keys.GPU_MEMORY, None)
            notes[keys.GPU_FRACTION] = FRACTIONS[name]
        return body

    monkeypatch.setattr(driver, "_pending", pending)


@pytest.mark.parametrize("scenario", cases(SCENARIOS))
async def test_scenario(scenario: Scenario) -> None:
    await check(scenario)


@pytest.mark.parametrize("scenario", cases(AS_PLACED))
async def test_a_portion_is_held_to_its_queue_as_placed(scenario: Scenario, fractions: None) -> None:
    await check(scenario)


@pytest.mark.parametrize(
    ("groups", "members"),
    [(1, 60), (30, 2)],
    ids=["one PodGroup of 60 members", "30 PodGroups of 2 members"],
)
async def test_gang_members_that_fit_nowhere_cost_a_round_in_proportion_to_them(
    monkeypatch: pytest.MonkeyPatch, groups: int, members: int
) -> None:
    """Every member of a gang that fits nowhere asks for room to be made, with the members its gang still
    needs. Each used to read every pending pod, and each of those mates' demand and nodes, again: a tenant's
    PodGroup of 400 members that fit nowhere (all of them created) took 36 s of the loop a round, 10,000
    would take hours, and a PodGroup per pair of pods did the same through the pass over the pending pods.
    Counted in reads, not seconds."""
    reads = {"pod_demand": 0, "group_of": 0}
    pod_demand, group_of = evictions.objects.pod_demand, evictions.group_of

    def counted_demand(*args: Any, **kwargs: Any) -> Any:
        reads["pod_demand"] += 1
        return pod_demand(*args, **kwargs)

    def counted_group(pod: Any) -> Any:
        reads["group_of"] += 1
        return group_of(pod)

    monkeypatch.setattr(evictions.objects, "pod_demand", counted_demand)
    monkeypatch.setattr(evictions, "group_of", counted_group)
    names = {f"g{g}": {"minMember": members} for g in range(groups)}
    pending = {f"g{g}-{m}": Ask(gpus=2, group=f"g{g}") for g in range(groups) for m in range(members)}
    scenario = Scenario(
        "gang members that fit nowhere",
        nodes={"n1": Node(), "n2": Node()},
        groups=names,
        running={"low": Run("n1:0", priority=-1)},  # a victim there is, so that a plan is asked for
        pending=pending,
        waiting=dict.fromkeys(pending, ""),
        rounds=1,
    )
    await play(scenario)
    pods = groups * members
    assert reads["pod_demand"] <= 5 * pods and reads["group_of"] <= 5 * pods, reads  # were 60 x pods


async def test_a_victim_is_not_told_the_names_of_another_namespaces_pods(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The Events of an eviction go to both sides' namespaces. Each side used to be told the other's
    namespace and pod name ('reclaimed ... for pod web/secret-model on n1'), which a tenant may not list; as
    kube-scheduler tells a victim of its preemptor, a pod of another namespace is named by its UID."""
    made = driver._pending

    def in_web(name: str, ask: Ask, order: int) -> dict[str, Any]:
        body = made(name, ask, order)
        body["metadata"]["namespace"] = "web"
        return body

    monkeypatch.setattr(driver, "_pending", in_web)
    scenario = Scenario(
        "a reclaim across namespaces",
        nodes={"n1": Node(), "n2": Node()},
        queues={"a": {"gpus": {"quota": 1}}, "b": {"gpus": {"quota": 1}}},
        running={"b1": Run("n1:0", queue="b"), "b2": Run("n2:0", queue="b")},
        pending={"secret-model": Ask(gpus=1, queue="a")},
        binds={"secret-model": ANY},
        rounds=3,
    )
    api, _ = await play(scenario)
    told = {
        call.body.involvedObject.name: call.body.message
        for call in api.calls
        if call.kind == "Event" and call.body.reason == RECLAIMED
    }
    assert set(told) == {"b1", "secret-model"}
    assert told["b1"].endswith("for pod uid-secret-model on n1"), told["b1"]  # the fake API's UID
    assert "web/" not in told["b1"], told["b1"]
