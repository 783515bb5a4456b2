"""Scenarios: gangs (PodGroup minMember). None of a group binds until minMember can run at once; members that
fit are held with their room reserved; a group still short after its timeout gives that room back; a
PodGroup's queue is its members'; a gang is preempted or reclaimed only as far as it can spare members, else
whole, and never for a member that may not be evicted. README, "Gangs"."""

from __future__ import annotations

import pytest

from .driver import ANY, PREEMPTED, RECLAIMED, Ask, Node, Run, Scenario, cases, check, pods

TWO_GPUS = {"n1": Node(gpus=2)}
THREE = {"train": {"minMember": 3}}
MEMBER = Ask(gpus=1, group="train")
THREE_NODES = {"n1": Node(), "n2": Node(), "n3": Node()}
GANG_IN_B = {"train": {"minMember": 2, "queue": "b"}}
GANG_AND_ONE_MORE_IN_B = {
    "w0": Run("n1:0", group="train"),
    "w1": Run("n2:0", group="train"),
    "b1": Run("n3:0", queue="b"),
}
HELD = "2 of 3 members can run now; held until the rest can"

SCENARIOS = [
    Scenario(
        "a gang of three on two GPUs binds none: two are held, the third waits",
        nodes=TWO_GPUS,
        groups=THREE,
        pending={"w0": MEMBER, "w1": MEMBER, "w2": MEMBER},
        waiting={"w0": "1 of 3 members can run now", "w1": HELD, "w2": "0/1 nodes are available"},
    ),
    Scenario(
        "a gang binds all together once minMember fit",
        nodes={"n1": Node(gpus=2), "n2": Node()},
        groups=THREE,
        pending={"w0": MEMBER, "w1": MEMBER, "w2": MEMBER},
        binds={"w0": ANY, "w1": ANY, "w2": ANY},
    ),
    Scenario(
        "members already running count toward minMember",
        nodes={"n1": Node(gpus=3)},
        groups=THREE,
        running={"w0": Run("n1:0", group="train")},
        pending={"w1": MEMBER, "w2": MEMBER},
        binds={"w1": "n1", "w2": "n1"},
    ),
    Scenario(
        "members past minMember bind alone once the gang runs",
        nodes={"n1": Node(gpus=2)},
        groups={"train": {"minMember": 2}},
        pending={"w0": MEMBER, "w1": MEMBER, "w2": MEMBER},
        binds={"w0": "n1", "w1": "n1"},
        waiting={"w2": ""},
    ),
    Scenario(
        "the room held for a gang is not given to another pod",
        nodes=TWO_GPUS,
        groups=THREE,
        pending={"w0": MEMBER, "w1": MEMBER, "w2": MEMBER, "solo": Ask(gpus=1, arrives=1)},
        waiting={"w0": "", "w1": HELD, "w2": "", "solo": "0/1 nodes are available"},
    ),
    Scenario(
        "a gang's held members count for its queue: another queue is served first",
        nodes={"n1": Node(gpus=4)},
        queues={"a": {}, "b": {}},
        groups={"train": {"minMember": 4, "queue": "a"}},
        pending={
            **pods("w", 3, gpus=1, group="train"),
            "w4": Ask(gpus=2, group="train"),  # the fourth member, which the one GPU left cannot take
            "a4": Ask(gpus=1, queue="a", arrives=1),
            "b1": Ask(gpus=1, queue="b", arrives=1),
        },
        binds={"b1": "n1"},
        waiting={
            "w1": "1 of 4",
            "w2": "2 of 4",
            "w3": "3 of 4",
            "w4": "0/1 nodes are available",
            "a4": "0/1 nodes are available",
        },
    ),
    Scenario(
        "a gang that could not reach minMember with every pod it has holds no room",
        nodes=TWO_GPUS,
        groups={"train": {"minMember": 10_000}},
        pending={"w0": MEMBER, "w1": MEMBER, "solo": Ask(gpus=1, priority=50, arrives=1)},
        binds={"solo": "n1"},
        waiting={"w0": "2 of its 10000 members exist", "w1": "2 of its 10000 members exist"},
    ),
    Scenario(
        "a gang short past its timeout gives its room back, and another pod takes it",
        nodes=TWO_GPUS,
        groups={"train": {"minMember": 3, "scheduleTimeoutSeconds": 100}},
        pending={"w0": MEMBER, "w1": MEMBER, "w2": MEMBER, "solo": Ask(gpus=1, priority=10, arrives=3)},
        rounds=4,
        binds={"solo": "n1"},
        waiting={
            "w0": "could not run together within 100s",
            "w1": "the room held for 2 is given back",
            "w2": "",
        },
    ),
    Scenario(
        "a gang larger than its queue's limit never binds",
        nodes={"n1": Node(gpus=4)},
        queues={"a": {"gpus": {"limit": 2}}},
        groups={"train": {"minMember": 3, "queue": "a"}},
        pending={"w0": MEMBER, "w1": MEMBER, "w2": MEMBER},
        waiting={"w0": "", "w1": HELD, "w2": "queue a would pass its gpus limit (2)"},
    ),
    Scenario(
        "a pod of a PodGroup nobody made waits, and says so",
        nodes=TWO_GPUS,
        pending={"w0": Ask(gpus=1, group="ghost"), "solo": Ask(gpus=1)},
        binds={"solo": "n1"},
        waiting={"w0": "pod group team/ghost does not exist"},
    ),
    Scenario(
        "a gang whose PodGroup names a queue nobody made waits, and says so",
        nodes=TWO_GPUS,
        groups={"train": {"minMember": 1, "queue": "ghost"}},
        pending={"w0": MEMBER},
        waiting={"w0": "queue ghost does not exist"},
    ),
    Scenario(
        "without gangs a group's pods bind one by one",
        nodes=TWO_GPUS,
        settings={"gangs": False},
        groups=THREE,
        pending={"w0": MEMBER, "w1": MEMBER, "w2": MEMBER},
        binds={"w0": "n1", "w1": "n1"},
        waiting={"w2": ""},
    ),
    Scenario(
        "a gang's members may sit on different nodes",
        nodes={"n1": Node(), "n2": Node()},
        groups={"train": {"minMember": 2}},
        pending={"w0": MEMBER, "w1": MEMBER},
        binds={"w0": ANY, "w1": ANY},
    ),
    Scenario(
        "a gang member preempted takes its whole group with it",
        nodes={"n1": Node(), "n2": Node()},
        groups={"train": {"minMember": 2}},
        running={"w0": Run("n1:0", group="train", priority=1), "w1": Run("n2:0", group="train", priority=1)},
        pending={"p": Ask(gpus=1, priority=10)},
        binds={"p": ANY},
        evicted={"w0": PREEMPTED, "w1": PREEMPTED},
    ),
    Scenario(
        "members a gang can spare (past its minMember) are preempted alone, as in KAI Scheduler",
        nodes={"n1": Node(), "n2": Node()},
        groups={"elastic": {"minMember": 1}},
        running={
            "w0": Run("n1:0", group="elastic", priority=1, age=1000),
            "w1": Run("n2:0", group="elastic", priority=1, age=5000),
        },
        pending={"p": Ask(gpus=1, priority=10)},
        binds={"p": "n1"},
        evicted={"w0": PREEMPTED},
    ),
    Scenario(
        "a PodGroup that can spare members shields none of them from reclaim",
        nodes={"n1": Node(), "n2": Node()},
        queues={"a": {"gpus": {"quota": 1}}, "b": {"gpus": {"quota": 1}}},
        groups={"shield": {"minMember": 1}},
        running={"b1": Run("n1:0", queue="b", group="shield"), "b2": Run("n2:0", queue="b", group="shield")},
        pending={"a1": Ask(gpus=1, queue="a")},
        binds={"a1": "n1"},
        evicted={"b1": RECLAIMED},
    ),
    Scenario(
        "taking more of a gang than it can spare takes it all, and only where all of it may go",
        nodes={"n1": Node(gpus=2), "n2": Node(gpus=2)},
        groups={"train": {"minMember": 2}},
        running={
            "w0": Run("n1:0", group="train", priority=1),
            "w1": Run("n1:1", group="train", priority=1),
            "w2": Run("n2:0", group="train", priority=50),
            "l1": Run("n2:1", priority=1),
        },
        pending={"p": Ask(gpus=2, priority=10)},
        waiting={"p": ""},
    ),
    Scenario(
        "a member a gang spared for one plan is not spared again: the next takes the rest of the gang",
        nodes=THREE_NODES,
        groups={"train": {"minMember": 2}},
        running={
            "w0": Run("n1:0", group="train", priority=1, age=1000),
            "w1": Run("n2:0", group="train", priority=1, age=2000),
            "w2": Run("n3:0", group="train", priority=1, age=3000),
        },
        pending=pods("p", 2, gpus=1, priority=10),
        binds={"p1": ANY, "p2": ANY},
        evicted={"w0": PREEMPTED, "w1": PREEMPTED, "w2": PREEMPTED},
    ),
    Scenario(
        "a gang is reclaimed whole too",
        nodes=THREE_NODES,
        queues={"a": {"gpus": {"quota": 3}}, "b": {}},
        groups=GANG_IN_B,
        running={
            "w0": Run("n1:0", group="train"),
            "w1": Run("n2:0", group="train"),
            "a0": Run("n3:0", queue="a"),
        },
        pending=pods("a", 2, gpus=1, queue="a"),
        binds={"a1": ANY, "a2": ANY},
        evicted={"w0": RECLAIMED, "w1": RECLAIMED},
    ),
    Scenario(
        "a gang is reclaimed only if its queue keeps its fair share without all of it",
        nodes=THREE_NODES,
        queues={"a": {"gpus": {"quota": 1}}, "b": {"gpus": {"quota": 2}}},
        groups=GANG_IN_B,
        running=GANG_AND_ONE_MORE_IN_B,
        pending={"a1": Ask(gpus=1, queue="a")},
        binds={"a1": "n3"},
        evicted={"b1": RECLAIMED},
    ),
    Scenario(
        "gang members preempt one by one, and bind together",
        nodes={"n1": Node(), "n2": Node()},
        groups={"train": {"minMember": 2}},
        running={"l1": Run("n1:0", priority=1), "l2": Run("n2:0", priority=1)},
        pending={
            "w0": Ask(gpus=1, group="train", priority=10),
            "w1": Ask(gpus=1, group="train", priority=10),
        },
        binds={"w0": ANY, "w1": ANY},
        evicted={"l1": PREEMPTED, "l2": PREEMPTED},
    ),
    Scenario(
        "nothing is evicted for a gang one of whose members will not be placed as it is",
        nodes={"n1": Node(), "n2": Node()},
        groups={"train": {"minMember": 2}},
        running={"l1": Run("n1:0", priority=1), "l2": Run("n2:0", priority=1)},
        pending={
            "w0": Ask(gpus=1, group="train", priority=10),
            "w1": Ask(gpus=1, group="train", priority=10, unreadable=True),
        },
        waiting={
            "w0": "",
            "w1": "unreadable placement constraints: spec.topologySpreadConstraints[0].maxSkew",
        },
    ),
    Scenario(
        "a gang with a member of higher priority than the pending pod is not preempted",
        nodes={"n1": Node(), "n2": Node()},
        groups={"train": {"minMember": 2}},
        running={
            "w0": Run("n1:0", group="train", priority=1),
            "w1": Run("n2:0", group="train", priority=50),
        },
        pending={"p": Ask(gpus=1, priority=10)},
        waiting={"p": ""},
    ),
    Scenario(
        "a PodGroup's queue is its members' queue, for reclaim too",
        nodes={"n1": Node(), "n2": Node()},
        queues={"a": {"gpus": {"quota": 1}}, "b": {"gpus": {"quota": 1}}},
        groups={"job": {"minMember": 1, "queue": "a"}},
        running={"b1": Run("n1:0", queue="b"), "b2": Run("n2:0", queue="b")},
        pending={"w0": Ask(gpus=1, group="job", queue="b")},
        binds={"w0": "n1"},
        evicted={"b1": RECLAIMED},
    ),
    Scenario(
        "a victim's gang mates count against its queue's fair share: a node whose victims, with theirs, "
        "would take the queue below it is passed over",
        nodes=TWO_GPUS | {"n2": Node(gpus=2)},
        queues={
            "a": {"gpus": {"quota": 2}},
            "b": {"gpus": {"quota": 1, "overQuotaWeight": 0}},
            "c": {"gpus": {"overQuotaWeight": 0}},
        },
        groups=GANG_IN_B,
        running={  # on n1 the victims that lose least work: with w1 goes w2 too, and b keeps nothing
            "w1": Run("n1:0", group="train", age=1000),
            "b1": Run("n1:1", queue="b", age=1000),
            "w2": Run("n2:0", group="train", age=5000),
            "c1": Run("n2:1", queue="c", age=5000),
        },
        pending={"a1": Ask(gpus=2, queue="a")},
        binds={"a1": "n2"},
        evicted={"w1": RECLAIMED, "w2": RECLAIMED, "c1": RECLAIMED},
    ),
    Scenario(
        "a gang whose member is younger than the minimum runtime is not preempted",
        nodes={"n1": Node(), "n2": Node()},
        groups={"train": {"minMember": 2}},
        running={
            "w0": Run("n1:0", group="train", priority=1),
            "w1": Run("n2:0", group="train", priority=1, age=0),
        },
        pending={"p": Ask(gpus=1, priority=10)},
        waiting={"p": ""},
    ),
    Scenario(
        "a gang with a protected member is not preempted",
        nodes={"n1": Node(), "n2": Node()},
        groups={"train": {"minMember": 2}},
        running={
            "w0": Run("n1:0", group="train", priority=1),
            "w1": Run("n2:0", group="train", priority=100),
        },
        pending={"p": Ask(gpus=1, priority=10)},
        waiting={"p": ""},
    ),
]


@pytest.mark.parametrize("scenario", cases(SCENARIOS))
async def test_scenario(scenario: Scenario) -> None:
    await check(scenario)
