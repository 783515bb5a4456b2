"""Scenarios: cases of KAI Scheduler's own scenario tests (reclaim, between departments too, of CPU and
memory, for gangs, of GPU memory; fractional allocation; consolidation; preemption), replayed against
gpufrac. Only the facts of each case are kept (queues, quotas, priorities, pods, GPUs, and which pods bind or
are evicted), in gpufrac's units: a GPU is `GPU_MIB` (10,000 MiB), so KAI's fraction f of a GPU is a share of
f × 10,000 MiB. KAI's priority classes are kept as numbers: train 50, interactive-preemptible 75, build 100
(non-preemptible, gpufrac's protected priority). A case's KAI test is named by its path under KAI's
pkg/scheduler and its name.

Cases where gpufrac documents another rule are not here (README, "Preemption and reclaim": reclaim only
while the reclaiming queue stays within its quota, and never below the victim queue's fair share; only pods
that opted in are moved, never whole-GPU pods; the room reclaimed is kept for the pod it was reclaimed for.
"Queues and fair share": quotas past the capacity shrink in proportion)."""

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
Q0_QUOTA_1 = {"q0": {"gpus": {"quota": 1}}}
Q0_QUOTA_2 = {"q0": {"gpus": {"quota": 2}}}
Q0_Q1_QUOTA_1 = {"q0": {"gpus": {"quota": 1}}, "q1": {"gpus": {"quota": 1}}}
EQUAL_QUOTAS_2 = {
    "q0": {"gpus": {"quota": 2, "overQuotaWeight": 2}},
    "q1": {"gpus": {"quota": 2, "overQuotaWeight": 2}},
}
DEPARTMENTS_OF_ONE = {  # a queue of a GPU's quota in each of two departments of as much
    "d1": {"gpus": {"quota": 1, "overQuotaWeight": 1}},
    "d2": {"gpus": {"quota": 1, "overQuotaWeight": 1}},
    "q0": {"parentQueue": "d1", "gpus": {"quota": 1, "overQuotaWeight": 1}},
    "q1": {"parentQueue": "d2", "gpus": {"quota": 1, "overQuotaWeight": 1}},
}

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
    # The cases below are of actions/integration_tests/reclaim/reclaim_test.go (its name given), unless said.
    # "(This is used by the demo) 2 jobs running for queue0 on 3 GPUs, 1 job running for queue1 on 1 GPU, 1
    # pending job for queue1 - reclaim"
    Scenario(
        "KAI reclaim: of a borrower's pods the one whose going leaves it its share goes, not its 2-GPU pod",
        nodes={"n0": Node(gpus=2), "n1": Node(gpus=2)},
        queues=EQUAL_QUOTAS_2,
        running={
            "q0-1": Run("n0:0", queue="q0", priority=TRAIN),
            "q1-2": Run("n1:0,1", queue="q1", priority=TRAIN),
            "q1-1": Run("n0:1", queue="q1", priority=TRAIN),
        },
        pending={"q0-p": Ask(gpus=1, queue="q0", priority=TRAIN)},
        binds={"q0-p": "n0"},
        evicted={"q1-1": RECLAIMED},
    ),
    # "2 jobs running for queue0 on 3 GPUs, 1 job running for queue1 on 1 GPU, 1 pending job for queue1,
    # deserved of queue1 is 1 - don't reclaim"
    Scenario(
        "KAI reclaim: a queue at its quota of 1 reclaims nothing from one holding 3 of its 2",
        nodes={"n0": Node(gpus=2), "n1": Node(gpus=2)},
        queues={
            "q0": {"gpus": {"quota": 2, "overQuotaWeight": 2}},
            "q1": {"gpus": {"quota": 1, "overQuotaWeight": 1}},
        },
        running={
            "q0-1": Run("n1:0", queue="q0", priority=TRAIN),
            "q0-2": Run("n0:0,1", queue="q0", priority=TRAIN),
            "q1-1": Run("n1:1", queue="q1", priority=TRAIN),
        },
        pending={"q1-p": Ask(gpus=1, queue="q1", priority=TRAIN)},
        waiting={"q1-p": ""},
    ),
    # "2 train job for overquota project 1, 1 job for overquota project with deserved of 0, 1 job recalim from
    # different project - reclaim the job with quota of 0"
    Scenario(
        "KAI reclaim: of two queues past their quotas, the one with no quota gives its GPU back",
        nodes={"n0": Node(gpus=4)},
        queues={
            "q0": {"gpus": {"quota": 1, "overQuotaWeight": 1}},
            "q1": {"gpus": {"quota": 1, "overQuotaWeight": 1}},
            "q2": {"gpus": {"overQuotaWeight": 0}},
        },
        running={
            "q0-2": Run("n0:0,1", queue="q0", priority=TRAIN),
            "q0-1": Run("n0:2", queue="q0", priority=TRAIN),
            "q2-1": Run("n0:3", queue="q2", priority=TRAIN),
        },
        pending={"q1-p": Ask(gpus=1, queue="q1", priority=TRAIN)},
        binds={"q1-p": "n0:3"},
        evicted={"q2-1": RECLAIMED},
    ),
    # "1 queue with big quota will be satisfied with 1 gpu, give the rest of the gpus according to the last
    # test"
    Scenario(
        "KAI reclaim: a queue asking less than its big quota leaves the rest to another, which reclaims it",
        nodes={"n0": Node(gpus=9)},
        queues={
            "q0": {"gpus": {"quota": 4, "overQuotaWeight": 4}},
            "q1": {"gpus": {"quota": 4, "overQuotaWeight": 4}},
            "q2": {"gpus": {"quota": 10, "overQuotaWeight": 10}},
        },
        running={
            "q0-5": Run("n0:0,1,2,3,4", queue="q0", priority=TRAIN),
            "q0-2": Run("n0:5,6", queue="q0", priority=TRAIN),
            "q0-1": Run("n0:7", queue="q0", priority=TRAIN),
        },
        pending={
            "q2-p": Ask(gpus=1, queue="q2", priority=TRAIN),
            "q1-p": Ask(gpus=3, queue="q1", priority=TRAIN),
        },
        binds={"q2-p": "n0", "q1-p": "n0"},
        evicted={"q0-2": RECLAIMED, "q0-1": RECLAIMED},
    ),
    # "Verify we do only 1 round of GPU allocation for whole GPUs jobs - this is a bug we had"
    Scenario(
        "KAI reclaim: a 2-GPU pod past its queue's quota of 1 reclaims nothing",
        nodes={"n0": Node(gpus=4)},
        queues={
            "q0": {"gpus": {"quota": 2, "overQuotaWeight": 2}},
            "q1": {"gpus": {"quota": 1, "overQuotaWeight": 1}},
        },
        running={"q0-3": Run("n0:0,1,2", queue="q0", priority=TRAIN)},
        pending={"q1-p": Ask(gpus=2, queue="q1", priority=TRAIN)},
        waiting={"q1-p": ""},
    ),
    # "queue0 is over quota, queue1 is under quota, yet we don't reclaim because allocate will case a loop
    # (this is a bug in allocate)": KAI's case expects nothing reclaimed and calls that its bug; gpufrac does
    # what the name says should happen: q1's 1-GPU pod, within q1's quota, takes back what q0 holds past its
    # share.
    Scenario(
        "KAI reclaim: a queue under its quota takes back a GPU from one past its share (KAI: not, a bug)",
        nodes={"n0": Node(gpus=4)},
        queues=EQUAL_QUOTAS_2,
        running={
            "q0-2": Run("n0:0,1", queue="q0", priority=TRAIN),
            "q0-1": Run("n0:2", queue="q0", priority=TRAIN),
            "q1-1": Run("n0:3", queue="q1", priority=TRAIN),
        },
        pending={
            "q1-3": Ask(gpus=3, queue="q1", priority=TRAIN),
            "q1-p": Ask(gpus=1, queue="q1", priority=TRAIN),
            "q0-p": Ask(gpus=1, queue="q0", priority=TRAIN),
        },
        binds={"q1-p": "n0:2"},
        evicted={"q0-1": RECLAIMED},
        waiting={"q1-3": "", "q0-p": ""},
    ),
    # reclaim_steady_fair_share_test.go, "steady fair-share reclaim disabled: a queue below its weighted share
    # waits while free GPUs are fragmented" (KAI's default; gpufrac has no steady fair-share reclaim)
    Scenario(
        "KAI reclaim: queues of weights alone reclaim nothing, though one is below its weighted share",
        nodes={f"n{i}": Node(gpus=5) for i in range(3)},
        queues={"a": {}, "b": {}, "c": {}},
        running={
            "a-low": Run("n0:0,1", queue="a", priority=TRAIN - 10),
            "a-1": Run("n0:2,3", queue="a", priority=TRAIN),
            "a-2": Run("n1:0,1", queue="a", priority=TRAIN),
            "c-1": Run("n1:2,3", queue="c", priority=TRAIN),
            "a-3": Run("n2:0,1", queue="a", priority=TRAIN),
            "a-4": Run("n2:2,3", queue="a", priority=TRAIN),
        },
        pending={"c-p": Ask(gpus=2, queue="c", priority=TRAIN)},
        waiting={"c-p": ""},
    ),
]

# Departments (KAI's two-level trees) of actions/integration_tests/reclaim/reclaim_test.go. A department's
# overQuotaWeight is its quota, as KAI's test builder makes it.
TREES = [
    # "Classic reclaim for train jobs between departments"
    Scenario(
        "KAI reclaim between departments: the train pod of the borrowing department goes, its build stays",
        nodes=TWO_GPU_NODE,
        queues=DEPARTMENTS_OF_ONE,
        running={
            "q0-train": Run("n1:0", queue="q0", priority=TRAIN),
            "q0-build": Run("n1:1", queue="q0", priority=BUILD),
        },
        pending={"q1-p": Ask(gpus=1, queue="q1", priority=TRAIN)},
        binds={"q1-p": "n1:0"},
        evicted={"q0-train": RECLAIMED},
    ),
    # "Classic interactive job reclaim train job from different department"
    Scenario(
        "KAI reclaim between departments: a build pod within its quota reclaims a train pod",
        nodes=TWO_GPU_NODE,
        queues=DEPARTMENTS_OF_ONE,
        running={
            "q0-train": Run("n1:0", queue="q0", priority=TRAIN),
            "q0-build": Run("n1:1", queue="q0", priority=BUILD),
        },
        pending={"q1-p": Ask(gpus=1, queue="q1", priority=BUILD)},
        binds={"q1-p": "n1:0"},
        evicted={"q0-train": RECLAIMED},
    ),
    # "Don't reclaim if department will be overquota"
    Scenario(
        "KAI reclaim between departments: none for a pod past its queue's quota",
        nodes={"n1": Node(gpus=4)},
        queues={
            "d1": {"gpus": {"quota": 2, "overQuotaWeight": 2}},
            "d2": {"gpus": {"quota": 2, "overQuotaWeight": 2}},
            "q0": {"parentQueue": "d1", "gpus": {"quota": 1, "overQuotaWeight": 1}},
            "q1": {"parentQueue": "d2", "gpus": {"quota": 1, "overQuotaWeight": 1}},
            "q2": {"parentQueue": "d2", "gpus": {"quota": 1, "overQuotaWeight": 1}},
        },
        running={
            "q0-3": Run("n1:0,1,2", queue="q0", priority=TRAIN),
            "q1-build": Run("n1:3", queue="q1", priority=BUILD),
        },
        pending={"q1-p": Ask(gpus=2, queue="q1", priority=TRAIN)},
        waiting={"q1-p": ""},
    ),
    # "Reclaim from different department and same department" (KAI gives q0 a quota of 1 under d1's 0, a tree
    # the webhook refuses: cut to its parent's 0, which its share is anyway)
    Scenario(
        "KAI reclaim between departments: a queue with its department's quota takes from the other department"
        " and from its sibling",
        nodes={"n1": Node(gpus=4)},
        queues={
            "d1": {"gpus": {"overQuotaWeight": 0}},
            "d2": {"gpus": {"quota": 4, "overQuotaWeight": 4}},
            "q0": {"parentQueue": "d1", "gpus": {"overQuotaWeight": 1}},
            "q1": {"parentQueue": "d2", "gpus": {"overQuotaWeight": 0}},
            "q2": {"parentQueue": "d2", "gpus": {"quota": 4, "overQuotaWeight": 4}},
        },
        running={
            "q0-2": Run("n1:0,1", queue="q0", priority=TRAIN),
            "q1-2": Run("n1:2,3", queue="q1", priority=TRAIN),
        },
        pending={"q2-p": Ask(gpus=4, queue="q2", priority=TRAIN)},
        binds={"q2-p": "n1"},
        evicted={"q0-2": RECLAIMED, "q1-2": RECLAIMED},
    ),
    # "both departments got deserved quota, a queue within d2 is under quota - reclaim from another queue"
    Scenario(
        "KAI reclaim within a department: a queue under its quota takes back what its sibling holds past it",
        nodes={"n0": Node(gpus=3), "n1": Node(gpus=3)},
        queues={
            "d1": {"gpus": {"quota": 3, "overQuotaWeight": 3}},
            "d2": {"gpus": {"quota": 3, "overQuotaWeight": 3}},
            "q0": {"parentQueue": "d1", "gpus": {"quota": 3, "overQuotaWeight": 0}},
            "q1": {"parentQueue": "d2", "gpus": {"quota": 2, "overQuotaWeight": 0}},
            "q2": {"parentQueue": "d2", "gpus": {"quota": 1, "overQuotaWeight": 0}},
        },
        running={
            "q0-2": Run("n0:0,1", queue="q0", priority=TRAIN),
            "q0-build": Run("n1:0", queue="q0", priority=BUILD),
            "q1-2": Run("n1:1,2", queue="q1", priority=TRAIN),
            "q1-1": Run("n0:2", queue="q1", priority=TRAIN),
        },
        pending={"q2-p": Ask(gpus=1, queue="q2", priority=TRAIN)},
        binds={"q2-p": "n0:2"},
        evicted={"q1-1": RECLAIMED},
    ),
    # "departments and queues are over deserved quota and within fair share - should not reclaim"
    Scenario(
        "KAI reclaim between departments: none for a queue already past its quota",
        nodes={"n0": Node(gpus=3), "n1": Node(gpus=3)},
        queues=DEPARTMENTS_OF_ONE,
        running={
            "q0-2": Run("n0:0,1", queue="q0", priority=TRAIN),
            "q0-build": Run("n1:0", queue="q0", priority=BUILD),
            "q1-2": Run("n1:1,2", queue="q1", priority=TRAIN),
            "q1-1": Run("n0:2", queue="q1", priority=TRAIN),
        },
        pending={"q1-p": Ask(gpus=1, queue="q1", priority=TRAIN)},
        waiting={"q1-p": ""},
    ),
    # "both departments are under deserved quota - should not reclaim"
    Scenario(
        "KAI reclaim between departments: none for a queue at its quota, its department under its own",
        nodes=TWO_ONE_GPU_NODES,
        queues={
            "d1": {"gpus": {"quota": 2, "overQuotaWeight": 2}},
            "d2": {"gpus": {"quota": 2, "overQuotaWeight": 2}},
            "q0": {"parentQueue": "d1", "gpus": {"quota": 1, "overQuotaWeight": 0}},
            "q1": {"parentQueue": "d2", "gpus": {"quota": 1, "overQuotaWeight": 0}},
        },
        running={
            "q0-1": Run("n1:0", queue="q0", priority=TRAIN),
            "q1-build": Run("n2:0", queue="q1", priority=BUILD),
        },
        pending={"q1-p": Ask(gpus=1, queue="q1", priority=TRAIN)},
        waiting={"q1-p": ""},
    ),
]

# CPU and memory, of actions/reclaim/reclaim_test.go and actions/integration_tests/reclaim/reclaim_test.go:
# KAI's millicores as millicores, its memory figures as MiB.
RESOURCES = [
    # actions/reclaim/reclaim_test.go, "DRF - queue cannot reclaim if one of its resources is over fair share"
    Scenario(
        "KAI CPU and memory reclaim: none for a queue past its CPU limit, nor from one within its shares",
        nodes={"n1": Node(gpus=0, cpu="4", mem="4000Mi")},
        queues={
            "q0": {"cpu": {"quota": "2", "limit": "3"}, "memory": {"quota": "2000Mi", "limit": "3000Mi"}},
            "q1": {"cpu": {"quota": "2", "limit": "3"}, "memory": {"quota": "2000Mi", "limit": "3000Mi"}},
        },
        running={
            "q0-a": Run("n1", queue="q0", priority=TRAIN, cpu="2500m", mem="1000Mi"),
            "q0-b": Run("n1", queue="q0", priority=TRAIN, cpu="500m", mem="2000Mi"),
            "q1-b": Run("n1", queue="q1", priority=TRAIN, cpu="500m", mem="1000Mi"),
        },
        pending={
            "q0-p": Ask(queue="q0", priority=TRAIN, cpu="400m", mem="400Mi"),
            "q1-p": Ask(queue="q1", priority=TRAIN, cpu="1", mem="1000Mi"),
        },
        waiting={"q0-p": "queue q0 would pass its cpu limit", "q1-p": ""},
    ),
    # actions/integration_tests/reclaim/reclaim_test.go, "[useOnlyFreeResources OFF sanity] q0 allocated only
    # cpu tasks, has 0 deserved GPUs and useOnlyFreeResources=false (implicit). q1 requires cpu only tasks of
    # same priority to be allocated and does not reclaim from q0 jobs"
    Scenario(
        "KAI CPU and memory reclaim: a GPU quota reclaims nothing for pods without GPUs",
        nodes={"n1": Node(mem="100Mi")},
        queues={"q0": {"gpus": {"overQuotaWeight": 0}}, "q1": {"gpus": {"quota": 1, "overQuotaWeight": 1}}},
        running={
            "q0-1": Run("n1", queue="q0", priority=TRAIN, cpu="2", mem="50Mi"),
            "q0-2": Run("n1", queue="q0", priority=TRAIN, cpu="2", mem="50Mi"),
        },
        pending={
            "q1-1": Ask(queue="q1", priority=TRAIN, cpu="2", mem="50Mi"),
            "q1-2": Ask(queue="q1", priority=TRAIN, cpu="2", mem="50Mi"),
        },
        waiting={"q1-1": "", "q1-2": ""},
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
        waiting={"s3": "queue a's pods never evicted would pass its gpus quota (2)"},
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
    # actions/integration_tests/reclaim/reclaimFractional_test.go, "reclaim fractional train by whole GPU job"
    Scenario(
        "KAI fraction reclaim: a whole-GPU pod reclaims the half share past its queue's share, not the GPU",
        nodes=TWO_GPU_NODE,
        queues=Q0_Q1_QUOTA_1,
        running={
            "q0-whole": Run("n1:0", queue="q0", priority=TRAIN),
            "q0-half": Run("n1:1", mib=5000, queue="q0", priority=TRAIN),
        },
        pending={"q1-whole": Ask(gpus=1, queue="q1", priority=TRAIN)},
        binds={"q1-whole": "n1:1"},
        evicted={"q0-half": RECLAIMED},
    ),
    # reclaimFractional_test.go, "reclaim fractional train by fractional GPU job will go over quota - don't
    # reclaim"
    Scenario(
        "KAI fraction reclaim: a 0.8 share that would take its queue past its quota reclaims nothing",
        nodes=TWO_GPU_NODE,
        queues=Q0_Q1_QUOTA_1,
        running={
            "q0-whole": Run("n1:0", queue="q0", priority=TRAIN),
            "q0-half": Run("n1:1", mib=5000, queue="q0", priority=TRAIN),
            "q1-half": Run("n1:1", mib=5000, queue="q1", priority=TRAIN),
        },
        pending={"q1-share": Ask(mib=8000, queue="q1", priority=TRAIN)},
        waiting={"q1-share": ""},
    ),
]

# Consolidation, of actions/reclaim/reclaim_test.go and
# actions/integration_tests/consolidation/consolidationFractional_test.go: the shares KAI moves are here pods
# that opted in to moves.
CONSOLIDATION = [
    # reclaim_test.go, "Reclaim based on releasing resources with consolidation" (KAI moves the other share;
    # the two are alike)
    Scenario(
        "KAI consolidation: of two half shares on two nodes one joins the other, so a whole GPU fits",
        nodes=TWO_ONE_GPU_NODES,
        queues={
            "q0": {"gpus": {"overQuotaWeight": 0}},
            "q1": {"gpus": {"overQuotaWeight": 0}},
            "q2": {"gpus": {"quota": 2, "overQuotaWeight": 0}},
        },
        running={
            "q0-half": Run("n1:0", mib=5000, queue="q0", priority=TRAIN, movable=True),
            "q1-half": Run("n2:0", mib=5000, queue="q1", priority=TRAIN, movable=True),
        },
        pending={"q2-whole": Ask(gpus=1, queue="q2", priority=TRAIN)},
        binds={"q2-whole": "n1"},
        evicted={"q0-half": MOVED},
    ),
    # consolidationFractional_test.go, "consolidate job that requested memory and insert another job that
    # required memory" (gpu-memory of 100 per GPU: 20 and 90 are 2,000 and 9,000 MiB; KAI moves the other)
    Scenario(
        "KAI consolidation: a 2,000 MiB share joins the other's GPU, so 9,000 MiB fit",
        nodes=TWO_GPU_NODE,
        queues=Q0_QUOTA_1,
        running={
            "s1": Run("n1:0", mib=2000, queue="q0", priority=TRAIN, movable=True),
            "s2": Run("n1:1", mib=2000, queue="q0", priority=TRAIN, movable=True),
        },
        pending={"big": Ask(mib=9000, queue="q0", priority=TRAIN)},
        binds={"big": "n1:0"},
        evicted={"s1": MOVED},
    ),
    # consolidationFractional_test.go, "can't consolidate fractional GPUs and insert a whole train job"
    Scenario(
        "KAI consolidation: shares of 0.5 and 0.6 cannot share a GPU, so a whole-GPU pod waits",
        nodes=TWO_GPU_NODE,
        queues=Q0_QUOTA_1,
        running={
            "s1": Run("n1:0", mib=5000, queue="q0", priority=TRAIN, movable=True),
            "s2": Run("n1:1", mib=6000, queue="q0", priority=TRAIN, movable=True),
        },
        pending={"whole": Ask(gpus=1, queue="q0", priority=TRAIN)},
        waiting={"whole": ""},
    ),
    # consolidationFractional_test.go, "can't consolidate fractional GPUs and insert a fractional train job"
    Scenario(
        "KAI consolidation: nor a 0.8 share",
        nodes=TWO_GPU_NODE,
        queues=Q0_QUOTA_1,
        running={
            "s1": Run("n1:0", mib=5000, queue="q0", priority=TRAIN, movable=True),
            "s2": Run("n1:1", mib=6000, queue="q0", priority=TRAIN, movable=True),
        },
        pending={"share": Ask(mib=8000, queue="q0", priority=TRAIN)},
        waiting={"share": ""},
    ),
]


PREEMPTION = [
    # actions/integration_tests/preempt/preemptGang_test.go, "preempt gang job"
    Scenario(
        "KAI preemption: a build pod past its queue's quota preempts a gang whole, which brings it within",
        nodes={"n1": Node(gpus=2)},
        queues=Q0_QUOTA_1,
        groups={"gang": {"minMember": 2, "queue": "q0"}},
        running={
            "g1": Run("n1:0", group="gang", priority=TRAIN),
            "g2": Run("n1:1", group="gang", priority=TRAIN),
        },
        pending={"build": Ask(gpus=1, queue="q0", priority=BUILD)},
        binds={"build": "n1"},
        evicted={"g1": PREEMPTED, "g2": PREEMPTED},
    ),
    # actions/integration_tests/preempt/preemptGang_test.go, "Classic gang preempt"
    Scenario(
        "KAI preemption: a gang of two build pods preempts a 2-GPU train pod of its queue",
        nodes=TWO_GPU_NODE,
        queues=Q0_QUOTA_2,
        groups={"gang": {"minMember": 2, "queue": "q0"}},
        running={"train": Run("n1:0,1", queue="q0", priority=TRAIN)},
        pending=pods("b", 2, gpus=1, group="gang", priority=BUILD),
        binds={"b1": "n1", "b2": "n1"},
        evicted={"train": PREEMPTED},
    ),
    # actions/preempt/preempt_test.go, "3 train job running, 1 build job pending for the same queue - no need
    # to preempt both"
    Scenario(
        "KAI preemption: a whole-GPU build pod preempts the whole-GPU train pod, not the two half shares",
        nodes=TWO_GPU_NODE,
        queues=Q0_QUOTA_2,
        running={
            "half1": Run("n1:0", mib=5000, queue="q0", priority=TRAIN),
            "whole": Run("n1:1", queue="q0", priority=TRAIN),
            "half2": Run("n1:0", mib=5000, queue="q0", priority=TRAIN),
        },
        pending={"build": Ask(gpus=1, queue="q0", priority=BUILD)},
        binds={"build": "n1:1"},
        evicted={"whole": PREEMPTED},
    ),
    # preempt_test.go, "2 train jobs running require 2 GPUs, 1 build job with 2 GPUs pending - preempt"
    Scenario(
        "KAI preemption: a 2-GPU build pod preempts its own queue's 2-GPU train pod, not another queue's",
        nodes={"n1": Node(gpus=4)},
        queues=EQUAL_QUOTAS_2,
        running={
            "q0-train": Run("n1:0,1", queue="q0", priority=TRAIN),
            "q1-train": Run("n1:2,3", queue="q1", priority=TRAIN),
        },
        pending={"q0-build": Ask(gpus=2, queue="q0", priority=BUILD)},
        binds={"q0-build": "n1:0,1"},
        evicted={"q0-train": PREEMPTED},
    ),
    # preempt_test.go, "1 train requires 1 GPU for queue0, 1 train that requires 2 GPU for queue1, 1 build job
    # with 2 GPUs pending - preempt"
    Scenario(
        "KAI preemption: a 2-GPU build pod takes the idle GPU and its queue's 1-GPU train pod's",
        nodes={"n1": Node(gpus=4)},
        queues=EQUAL_QUOTAS_2,
        running={
            "q0-train": Run("n1:0", queue="q0", priority=TRAIN),
            "q1-train": Run("n1:1,2", queue="q1", priority=TRAIN),
        },
        pending={"q0-build": Ask(gpus=2, queue="q0", priority=BUILD)},
        binds={"q0-build": "n1:0,3"},
        evicted={"q0-train": PREEMPTED},
    ),
    # actions/integration_tests/preempt/preemptFractional_test.go, "Preempt fractional train by fractional
    # interactive GPU memory request job" (gpu-memory 50 and 60 of 100: 5,000 and 6,000 MiB) and "... by
    # fractional interactive GPU job" (fractions 0.5 and 0.6: the same shares here)
    Scenario(
        "KAI preemption: a 0.6 build share preempts the 0.5 train share it cannot sit beside",
        nodes=TWO_GPU_NODE,
        queues=Q0_QUOTA_2,
        running={
            "whole": Run("n1:0", queue="q0", priority=TRAIN),
            "half": Run("n1:1", mib=5000, queue="q0", priority=TRAIN),
        },
        pending={"build": Ask(mib=6000, queue="q0", priority=BUILD)},
        binds={"build": "n1:1"},
        evicted={"half": PREEMPTED},
    ),
    # preemptFractional_test.go, "Preempt fractional train by whole GPU job"
    Scenario(
        "KAI preemption: a whole-GPU build pod preempts a half share, the whole-GPU train pod stays",
        nodes=TWO_GPU_NODE,
        queues=Q0_QUOTA_2,
        running={
            "whole": Run("n1:1", queue="q0", priority=TRAIN),
            "half": Run("n1:0", mib=5000, queue="q0", priority=TRAIN),
        },
        pending={"build": Ask(gpus=1, queue="q0", priority=BUILD)},
        binds={"build": "n1:0"},
        evicted={"half": PREEMPTED},
    ),
]


@pytest.mark.parametrize(
    "scenario",
    cases(RECLAIM + TREES + RESOURCES + GPU_MEMORY + GANGS + FRACTIONS + CONSOLIDATION + PREEMPTION),
)
async def test_scenario(scenario: Scenario) -> None:
    await check(scenario)
