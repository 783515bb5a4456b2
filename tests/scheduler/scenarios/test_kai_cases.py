"""Scenarios: cases of KAI Scheduler's own scenario tests (reclaim, gang reclaim, GPU-memory reclaim,
fractional allocation), replayed against gpufrac. Only the facts of each case are kept (queues, quotas,
priorities, pods, GPUs, and which pods bind or are evicted), in gpufrac's units: a GPU is `GPU_MIB` (10,000
MiB), so KAI's fraction f of a GPU is a share of f × 10,000 MiB. KAI's priority classes are kept as numbers:
train 50, interactive-preemptible 75, build 100 (non-preemptible, gpufrac's protected priority).

Cases where gpufrac documents another rule are not here (README, "Preemption and reclaim": reclaim only
while the reclaiming queue stays within its quota, and never below the victim queue's fair share; only pods
that opted in are moved, never whole-GPU pods)."""

from __future__ import annotations

import pytest

from .driver import ANY, MOVED, PREEMPTED, RECLAIMED, Ask, Node, Run, Scenario, cases, check, pods

TRAIN, INTERACTIVE, BUILD = 50, 75, 100
A_B_QUOTA_1 = {"a": {"gpus": {"quota": 1}}, "b": {"gpus": {"quota": 1}}}
NO_QUOTA_AND_QUOTA_2 = {
    "a": {"gpus": {"overQuotaWeight": 0}},
    "b": {"gpus": {"quota": 2, "overQuotaWeight": 2}},
}
TWO_GPU_NODE = {"n1": Node(gpus=2)}
TWO_ONE_GPU_NODES = {"n1": Node(), "n2": Node()}
GANG_OF_2 = {"job": {"minMember": 2}}

RECLAIM = [
    Scenario(
        "KAI reclaim: one of two borrowed GPUs goes back; the reclaimer's second pod waits at its quota",
        nodes=TWO_GPU_NODE,
        queues=A_B_QUOTA_1,
        running={"a1": Run("n1:0", queue="a", priority=TRAIN), "a2": Run("n1:1", queue="a", priority=TRAIN)},
        pending=pods("b", 2, gpus=1, queue="b", priority=TRAIN),
        binds={"b1": "n1"},
        evicted={"a1": RECLAIMED},
        waiting={"b2": ""},
    ),
    Scenario(
        "KAI reclaim: queues that each hold their quota reclaim nothing from each other",
        nodes=TWO_GPU_NODE,
        queues=A_B_QUOTA_1,
        running={"a1": Run("n1:0", queue="a", priority=TRAIN), "b1": Run("n1:1", queue="b", priority=TRAIN)},
        pending={"a2": Ask(gpus=1, queue="a", priority=TRAIN), "b2": Ask(gpus=1, queue="b", priority=TRAIN)},
        waiting={"a2": "", "b2": ""},
    ),
    Scenario(
        "KAI reclaim: of a borrowing queue's pods the preemptible one goes, the build (protected) one stays",
        nodes=TWO_GPU_NODE,
        queues=A_B_QUOTA_1,
        running={
            "train": Run("n1:0", queue="a", priority=TRAIN),
            "build": Run("n1:1", queue="a", priority=BUILD),
        },
        pending=pods("b", 2, gpus=1, queue="b", priority=TRAIN),
        binds={"b1": "n1:0"},
        evicted={"train": RECLAIMED},
        waiting={"b2": ""},
    ),
    Scenario(
        "KAI reclaim: of a borrowing queue's pods the lower priority goes (train before interactive)",
        nodes=TWO_GPU_NODE,
        queues=A_B_QUOTA_1,
        running={
            "train": Run("n1:0", queue="a", priority=TRAIN),
            "interactive": Run("n1:1", queue="a", priority=INTERACTIVE),
        },
        pending={"b1": Ask(gpus=1, queue="b", priority=TRAIN)},
        binds={"b1": "n1:0"},
        evicted={"train": RECLAIMED},
    ),
    Scenario(
        "KAI reclaim: a pod that would take its queue past its quota reclaims nothing, whatever its priority",
        nodes=TWO_GPU_NODE,
        queues=A_B_QUOTA_1,
        running={"a1": Run("n1:0,1", queue="a", priority=TRAIN)},
        pending={"b1": Ask(gpus=2, queue="b", priority=BUILD)},
        waiting={"b1": ""},
    ),
    Scenario(
        "KAI reclaim: a non-preemptible pod beyond its queue's quota is never reclaimed",
        nodes={"n1": Node()},
        queues={"a": {"gpus": {"overQuotaWeight": 0}}, "b": {"gpus": {"quota": 1}}},
        running={"a1": Run("n1:0", queue="a", priority=BUILD)},
        pending={"b1": Ask(gpus=1, queue="b", priority=BUILD)},
        waiting={"b1": ""},
    ),
    Scenario(
        "KAI reclaim: a queue at its quota gets no more for a non-preemptible pod, though another borrows",
        nodes={"n1": Node(gpus=4)},
        queues=A_B_QUOTA_1,
        running={
            "a1": Run("n1:0", queue="a", priority=BUILD),
            "b1": Run("n1:1,2,3", queue="b", priority=TRAIN),
        },
        pending={"a2": Ask(gpus=1, queue="a", priority=BUILD)},
        waiting={"a2": ""},
    ),
    Scenario(
        "KAI reclaim: nothing is reclaimed for a pod bigger than its queue's quota",
        nodes={"n1": Node(gpus=10)},
        queues={"a": {"gpus": {"quota": 2}}, "b": {"gpus": {"quota": 2, "overQuotaWeight": 2}}},
        running={"a1": Run("n1:0,1,2,3", queue="a", priority=TRAIN)},
        pending={"b1": Ask(gpus=7, queue="b", priority=TRAIN)},
        waiting={"b1": ""},
    ),
    Scenario(
        "KAI reclaim: a queue with no quota gives up a 0.7 share so that a whole GPU fits",
        nodes=TWO_ONE_GPU_NODES,
        queues={
            "a": {"gpus": {"overQuotaWeight": 0}},
            "b": {"gpus": {"overQuotaWeight": 0}},
            "c": {"gpus": {"quota": 2, "overQuotaWeight": 0}},
        },
        running={"a1": Run("n1:0", mib=7000, queue="a"), "b1": Run("n2:0", mib=7000, queue="b")},
        pending={"c1": Ask(gpus=1, queue="c")},
        binds={"c1": "n1"},
        evicted={"a1": RECLAIMED},
    ),
    Scenario(
        "KAI reclaim: a tree's gang reclaims the lowest priority of each sibling over its share",
        nodes={"n1": Node(gpus=6)},
        queues={
            "dept": {"gpus": {"quota": 4}},
            "a": {"parentQueue": "dept", "gpus": {"quota": 1}},
            "b": {"parentQueue": "dept", "gpus": {"quota": 1}},
            "r": {"parentQueue": "dept", "gpus": {"quota": 2, "overQuotaWeight": 0}},
        },
        groups={"job": {"minMember": 2, "queue": "r"}},
        running={
            "a1": Run("n1:0", queue="a", priority=TRAIN),
            "a2": Run("n1:1", queue="a", priority=TRAIN),
            "a3": Run("n1:2", queue="a", priority=TRAIN - 1),
            "b1": Run("n1:3", queue="b", priority=TRAIN),
            "b2": Run("n1:4", queue="b", priority=TRAIN),
            "b3": Run("n1:5", queue="b", priority=TRAIN - 1),
        },
        pending=pods("r", 2, gpus=1, group="job", priority=TRAIN),
        binds={"r1": "n1", "r2": "n1"},
        evicted={"a3": RECLAIMED, "b3": RECLAIMED},
    ),
]

GPU_MEMORY = [
    Scenario(
        "KAI GPU-memory reclaim: the lowest priorities go until the share fits, the highest stays",
        nodes={"n1": Node()},
        queues={"a": {"gpuMemory": {"quota": "2000Mi"}}, "b": {"gpuMemory": {"quota": "8000Mi"}}},
        running={
            "a1": Run("n1:0", mib=2000, queue="a", priority=TRAIN),
            "a2": Run("n1:0", mib=3000, queue="a", priority=TRAIN - 1),
            "a3": Run("n1:0", mib=4000, queue="a", priority=TRAIN - 2),
        },
        pending={"b1": Ask(mib=8000, queue="b", priority=TRAIN)},
        binds={"b1": "n1:0"},
        evicted={"a2": RECLAIMED, "a3": RECLAIMED},
    ),
    Scenario(
        "KAI fraction reclaim: shares adding up to exactly the GPU quota are within it, and reclaim",
        nodes=TWO_ONE_GPU_NODES,
        queues={"a": {"gpus": {"overQuotaWeight": 0}}, "b": {"gpus": {"quota": 1}}},
        running={
            "b1": Run("n1:0", mib=2000, queue="b"),
            "b2": Run("n1:0", mib=4000, queue="b"),
            "b3": Run("n1:0", mib=3000, queue="b"),
            "a1": Run("n1:0", mib=1000, queue="a"),
            "a2": Run("n2:0", queue="a"),
        },
        pending={"b4": Ask(mib=1000, queue="b")},
        binds={"b4": "n1:0"},
        evicted={"a1": RECLAIMED},
    ),
    Scenario(
        "KAI GPU-memory reclaim: none past the reclaiming queue's quota",
        nodes={"n1": Node()},
        queues={"a": {"gpuMemory": {"quota": "5000Mi"}}, "b": {"gpuMemory": {"quota": "5000Mi"}}},
        running={"a1": Run("n1:0", mib=5000, queue="a", priority=TRAIN)},
        pending={"b1": Ask(mib=6000, queue="b", priority=TRAIN)},
        waiting={"b1": ""},
    ),
]

GANGS = [
    Scenario(
        "KAI gang reclaim: a borrower goes so that both members of a gang run",
        nodes=TWO_GPU_NODE,
        queues=NO_QUOTA_AND_QUOTA_2,
        groups={"job": {"minMember": 2, "queue": "b"}},
        running={"a1": Run("n1:0", queue="a", priority=TRAIN)},
        pending=pods("w", 2, gpus=1, group="job", priority=BUILD),
        binds={"w1": "n1", "w2": "n1"},
        evicted={"a1": RECLAIMED},
    ),
    Scenario(
        "KAI gang reclaim: nothing is reclaimed for a gang that could not all run even then",
        nodes={"n1": Node()},
        queues=NO_QUOTA_AND_QUOTA_2,
        groups={"job": {"minMember": 2, "queue": "b"}},
        running={"a1": Run("n1:0", queue="a", priority=TRAIN)},
        pending=pods("w", 2, gpus=1, group="job", priority=BUILD),
        waiting={"w1": "", "w2": ""},
    ),
    Scenario(
        "KAI gang reclaim: nothing is reclaimed for a gang that would take its queue past its quota",
        nodes={"n1": Node(gpus=10)},
        queues=NO_QUOTA_AND_QUOTA_2,
        groups={"job": {"minMember": 2, "queue": "b"}},
        running={"a1": Run("n1:" + ",".join(map(str, range(10))), queue="a", priority=TRAIN)},
        pending=pods("w", 2, gpus=2, group="job", priority=BUILD),
        waiting={"w1": "", "w2": ""},
    ),
    Scenario(
        "KAI gang reclaim: a running gang is reclaimed whole for one pod",
        nodes=TWO_GPU_NODE,
        queues=NO_QUOTA_AND_QUOTA_2,
        groups={"mpi": {"minMember": 2, "queue": "a"}},
        running={
            "m1": Run("n1:0", group="mpi", priority=TRAIN),
            "m2": Run("n1:1", group="mpi", priority=TRAIN),
        },
        pending={"b1": Ask(gpus=2, queue="b", priority=BUILD)},
        binds={"b1": "n1:0,1"},
        evicted={"m1": RECLAIMED, "m2": RECLAIMED},
    ),
    Scenario(
        "KAI gang reclaim: a gang takes an idle GPU and reclaims a borrowed share for its other member",
        nodes=TWO_ONE_GPU_NODES,
        queues=NO_QUOTA_AND_QUOTA_2,
        groups={"job": {"minMember": 2, "queue": "b"}},
        running={"a1": Run("n1:0", mib=7000, queue="a", priority=TRAIN)},
        pending=pods("w", 2, gpus=1, group="job", priority=TRAIN),
        binds={"w1": ANY, "w2": ANY},
        evicted={"a1": RECLAIMED},
    ),
    Scenario(
        "KAI gang reclaim: gang shares of 0.7 fill a GPU its queue shares and one a borrower gave back",
        nodes=TWO_ONE_GPU_NODES,
        queues=NO_QUOTA_AND_QUOTA_2,
        groups={"job": {"minMember": 2, "queue": "b"}},
        running={
            "a1": Run("n1:0", mib=7000, queue="a", priority=TRAIN),
            "b1": Run("n2:0", mib=3000, queue="b"),
        },
        pending=pods("w", 2, mib=7000, group="job", priority=TRAIN),
        binds={"w1": "n2:0", "w2": "n1:0"},
        evicted={"a1": RECLAIMED},
    ),
    Scenario(
        "KAI gang reclaim: a gang short of minMember evicts nothing",
        nodes={f"n{i}": Node() for i in range(1, 5)},
        queues={"a": {"gpus": {"overQuotaWeight": 0}}, "b": {"gpus": {"quota": 2}}},
        groups={"job": {"minMember": 4, "queue": "b"}},
        running={f"a{i}": Run(f"n{i}:0", queue="a", priority=TRAIN) for i in range(1, 5)},
        pending=pods("w", 3, gpus=1, group="job", priority=TRAIN),
        waiting={"w1": "", "w2": "", "w3": ""},
    ),
    Scenario(
        "KAI consolidation: a share that opted in is moved, not reclaimed, so a whole GPU fits",
        nodes={"n1": Node(gpus=2)},
        queues={
            "a": {"gpus": {"overQuotaWeight": 0}},
            "b": {"gpus": {"overQuotaWeight": 0}},
            "c": {"gpus": {"quota": 2, "overQuotaWeight": 0}},
        },
        running={
            "a1": Run("n1:0", mib=5000, queue="a", movable=True),
            "b1": Run("n1:1", mib=5000, queue="b", movable=True),
        },
        pending={"c1": Ask(gpus=1, queue="c")},
        binds={"c1": ANY},
        evicted={"a1": MOVED},
    ),
    # actions/reclaim/reclaim_test.go, "reclaim from multiple queues running on multiple nodes for a job with
    # multiple tasks" (ages as KAI makes them: job0 the oldest)
    Scenario(
        "KAI gang reclaim: a gang of three reclaims from two queues, leaving the one with a quota its GPU",
        nodes={"n1": Node(gpus=2), "n2": Node(gpus=2)},
        queues={
            "q0": {"gpus": {"overQuotaWeight": 0}},
            "q1": {"gpus": {"quota": 1, "overQuotaWeight": 0}},
            "q2": {"gpus": {"quota": 3, "overQuotaWeight": 0}},
        },
        groups={"job": {"minMember": 3, "queue": "q2"}},
        running={
            "job0": Run("n1:0", queue="q0", priority=TRAIN, age=4000),
            "job1": Run("n1:1", queue="q1", priority=TRAIN, age=3900),
            "job2": Run("n2:0", queue="q0", priority=TRAIN, age=3800),
            "job3": Run("n2:1", queue="q1", priority=TRAIN, age=3700),
        },
        pending=pods("w", 3, gpus=1, group="job", priority=TRAIN),
        binds={"w1": ANY, "w2": ANY, "w3": ANY},
        evicted={"job0": RECLAIMED, "job2": RECLAIMED, "job3": RECLAIMED},
    ),
]

FRACTIONS = [
    Scenario(
        "KAI fractions: a half share joins the GPU another half share is on",
        nodes=TWO_GPU_NODE,
        queues={"a": {"gpus": {"quota": 2}}},
        running={"s1": Run("n1:1", mib=5000, queue="a", priority=BUILD)},
        pending={"s2": Ask(mib=5000, queue="a", priority=BUILD)},
        binds={"s2": "n1:1"},
    ),
    Scenario(
        "KAI fractions: a half share joins the shared GPU on another node, not an empty node",
        nodes={"n1": Node(gpus=2), "n2": Node(gpus=2)},
        queues={"a": {"gpus": {"quota": 2}}},
        running={"s1": Run("n2:1", mib=5000, queue="a", priority=BUILD)},
        pending={"s2": Ask(mib=5000, queue="a", priority=BUILD)},
        binds={"s2": "n2:1"},
    ),
    Scenario(
        "KAI fractions: a half share that does not fit beside 0.6 goes to an empty GPU",
        nodes=TWO_GPU_NODE,
        queues={"a": {"gpus": {"quota": 2}}},
        running={"s1": Run("n1:0", mib=6000, queue="a", priority=BUILD)},
        pending={"s2": Ask(mib=5000, queue="a", priority=BUILD)},
        binds={"s2": "n1:1"},
    ),
    Scenario(
        "KAI fractions: a whole GPU goes beside a shared one, on the empty GPU",
        nodes=TWO_GPU_NODE,
        queues={"a": {"gpus": {"quota": 2}}},
        running={"s1": Run("n1:1", mib=5000, queue="a", priority=BUILD)},
        pending={"w1": Ask(gpus=1, queue="a", priority=TRAIN)},
        binds={"w1": "n1:0"},
    ),
    Scenario(
        "KAI fractions: a share beyond its queue's quota still takes an idle GPU",
        nodes=TWO_GPU_NODE,
        queues={"a": {"gpus": {"quota": 1}}},
        running={"w1": Run("n1:0", queue="a", priority=BUILD)},
        pending={"s1": Ask(mib=5000, queue="a", priority=TRAIN)},
        binds={"s1": "n1:1"},
    ),
    Scenario(
        "KAI fractions: 0.6, 0.5, 0.5 and 0.3 beside a 0.5 on two GPUs: the second 0.5 waits (and, never "
        "evicted, it would pass its queue's quota)",
        nodes=TWO_GPU_NODE,
        queues={"a": {"gpus": {"quota": 2}}},
        running={"s0": Run("n1:0", mib=5000, queue="a", priority=BUILD)},
        pending={
            "s1": Ask(mib=6000, queue="a", priority=BUILD),
            "s2": Ask(mib=5000, queue="a", priority=BUILD),
            "s3": Ask(mib=5000, queue="a", priority=BUILD),
            "s4": Ask(mib=3000, queue="a", priority=BUILD),
        },
        binds={"s1": "n1:1", "s2": "n1:0", "s4": "n1:1"},
        waiting={"s3": "queue a would pass its gpus quota (2) with a pod of priority 100"},
    ),
    Scenario(
        "KAI fractions: a gang of three half shares past its parent queue's GPU limit binds none",
        nodes={"n1": Node(gpus=4)},
        queues={
            "dept": {"gpus": {"quota": 1, "limit": 1}},
            "a": {"parentQueue": "dept", "gpus": {"quota": 1}},
        },
        groups={"job": {"minMember": 3, "queue": "a"}},
        pending=pods("s", 3, mib=5000, group="job", priority=TRAIN),
        waiting={"s1": "", "s2": "", "s3": "queue dept would pass its gpus limit (1)"},
    ),
]


PREEMPTION = [
    # actions/integration_tests/preempt/preemptGang_test.go, "preempt gang job"
    Scenario(
        "KAI preemption: a build pod past its queue's quota preempts a gang whole, which brings it within",
        nodes={"n1": Node(gpus=2)},
        queues={"q0": {"gpus": {"quota": 1}}},
        groups={"gang": {"minMember": 2, "queue": "q0"}},
        running={
            "g1": Run("n1:0", group="gang", priority=TRAIN),
            "g2": Run("n1:1", group="gang", priority=TRAIN),
        },
        pending={"build": Ask(gpus=1, queue="q0", priority=BUILD)},
        binds={"build": "n1"},
        evicted={"g1": PREEMPTED, "g2": PREEMPTED},
    ),
]


@pytest.mark.parametrize("scenario", cases(RECLAIM + GPU_MEMORY + GANGS + FRACTIONS + PREEMPTION))
async def test_scenario(scenario: Scenario) -> None:
    await check(scenario)
