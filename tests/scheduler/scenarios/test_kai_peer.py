"""Scenarios: KAI Scheduler's documented behaviours (docs/ and action tests of kai-scheduler/KAI-Scheduler,
NVIDIA/KAI-Scheduler), replayed against gpufrac as a peer project's suite would. Only the facts are kept
(queues, quotas, limits, weights, priorities, pods, GPUs and the outcome KAI documents), in gpufrac's units: a
GPU is `GPU_MIB` (10,000 MiB), so KAI's fraction f is a share of f x 10,000 MiB unless a case asks with
`gpu-fraction` itself. KAI's priority classes as numbers: train 50, build-preemptible 75, build 100 and
inference 125 (KAI docs/priority/README.md; 100 and above are non-preemptible).

Cases already in test_kai_cases.py are not repeated. Where gpufrac documents another rule (README: reclaim
only within the reclaimer's quota; only opted-in pods are moved; quotas past the capacity shrink; a running
gang that falls below its minMember is not evicted), no case rests on KAI's rule.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from gpufrac.contract import keys

from . import driver
from .driver import ANY, PREEMPTED, Ask, Node, Run, Scenario, cases, check, pods

TRAIN, BUILD_PREEMPTIBLE, BUILD, INFERENCE = 50, 75, 100, 125
TWO_GPU_NODE = {"n1": Node(gpus=2)}


def q(quota: float | None = None, weight: float | None = None, limit: float | None = None) -> dict[str, Any]:
    gpus: dict[str, Any] = {}
    if quota is not None:
        gpus["quota"] = quota
    if weight is not None:
        gpus["overQuotaWeight"] = weight
    if limit is not None:
        gpus["limit"] = limit
    return {"gpus": gpus}


# ---- GPU sharing: fractions, gpu-memory, multi-device ----------------------------------------------------
SHARING = [
    # KAI pkg/scheduler/actions/allocate/allocateFractionalGpu_test.go, "1 shared gpu job running, 1 pending
    # interactive shared gpu job - queue will be overused, don't allocate" (build 0.6 + build 0.5 > quota 1)
    Scenario(
        "KAI peer: a non-preemptible 0.5 share beside a non-preemptible 0.6 share waits at a quota of 1",
        nodes=TWO_GPU_NODE,
        queues={"q0": q(1)},
        running={"s0": Run("n1:0", mib=6000, queue="q0", priority=BUILD)},
        pending={"s1": Ask(mib=5000, queue="q0", priority=BUILD)},
        waiting={"s1": ""},
    ),
    # allocateFractionalGpu_test.go, "Verify allocated fractional GPU jobs are counted in the overall number
    # of GPUs the default department will have" (0.5 + 1 within quota 2)
    Scenario(
        "KAI peer: a whole build GPU binds beside a build half share within a quota of 2",
        nodes=TWO_GPU_NODE,
        queues={"q0": q(2)},
        running={"s0": Run("n1:1", mib=5000, queue="q0", priority=BUILD)},
        pending={"w": Ask(gpus=1, queue="q0", priority=BUILD)},
        binds={"w": "n1:0"},
    ),
    # allocateFractionalGpu_test.go, "Allow allocation of fractional training when over quota with fractional
    # jobs" (first case: two build halves fill quota 1, a train half goes over quota onto GPU 1)
    Scenario(
        "KAI peer: a train half share goes over quota beside two build half shares",
        nodes=TWO_GPU_NODE,
        queues={"q0": q(1)},
        running={
            "b1": Run("n1:0", mib=5000, queue="q0", priority=BUILD),
            "b2": Run("n1:0", mib=5000, queue="q0", priority=BUILD),
        },
        pending={"t": Ask(mib=5000, queue="q0", priority=TRAIN)},
        binds={"t": "n1:1"},
    ),
    # allocateFractionalGpu_test.go, same name, second case (a whole build GPU fills quota 1)
    Scenario(
        "KAI peer: a train half share goes over quota beside a whole build GPU",
        nodes=TWO_GPU_NODE,
        queues={"q0": q(1)},
        running={"b1": Run("n1:0", queue="q0", priority=BUILD)},
        pending={"t": Ask(mib=5000, queue="q0", priority=TRAIN)},
        binds={"t": "n1:1"},
    ),
    # allocateFractionalGpu_test.go, "Pack jobs on GPUs" (0.2 joins the 0.7, not the 0.5)
    Scenario(
        "KAI peer: a 0.2 share packs beside the 0.7 share, the fuller GPU",
        nodes=TWO_GPU_NODE,
        queues={"q0": q(2)},
        running={
            "h": Run("n1:1", mib=5000, queue="q0", priority=TRAIN),
            "s": Run("n1:0", mib=7000, queue="q0", priority=TRAIN),
        },
        pending={"p": Ask(mib=2000, queue="q0", priority=TRAIN)},
        binds={"p": "n1:0"},
    ),
    # allocateFractionalGpu_test.go, "Pack jobs on nodes" (KAI's default configuration: bin packing).
    # gpufrac's default policy is `fgd-stranding` (README, "Why it is the scheduler's default"), which puts
    # the 0.2 on the node's empty GPU instead; KAI's packing is gpufrac's `binpack`, so the case runs with it.
    Scenario(
        "KAI peer: a 0.2 share packs onto the node and GPU already shared (binpack)",
        nodes={"n0": Node(gpus=2), "n1": Node(gpus=2)},
        settings={"policy": "binpack"},
        queues={"q0": q(4)},
        running={"h": Run("n0:0", mib=5000, queue="q0", priority=TRAIN)},
        pending={"p": Ask(mib=2000, queue="q0", priority=TRAIN)},
        binds={"p": "n0:0"},
    ),
    # allocateFractionalGpu_test.go, "allocate job with multiple pods but does not allow it because project
    # goes over allowance" (leaf queue quota 1, limit 1; three 0.5 pods of one job)
    Scenario(
        "KAI peer: a gang of three half shares past its own queue's limit of 1 binds none",
        nodes={"n1": Node(gpus=4)},
        queues={"q0": q(1, 1, 1)},
        groups={"job": {"minMember": 3, "queue": "q0"}},
        pending=pods("s", 3, mib=5000, group="job", priority=TRAIN),
        waiting={"s1": "", "s2": "", "s3": ""},
    ),
    # KAI docs/gpu-sharing/README.md: a gpu-memory pod may use that many MiB, "the remaining GPU device memory
    # can be shared with other pods": five 2,000 MiB pods fill a 10,000 MiB GPU, a sixth does not fit
    Scenario(
        "KAI peer: five 2,000 MiB gpu-memory pods share one GPU, a sixth waits",
        nodes={"n1": Node()},
        queues={"q0": q(1)},
        pending=pods("m", 6, mib=2000, queue="q0", priority=TRAIN),
        binds={f"m{i}": "n1:0" for i in range(1, 6)},
        waiting={"m6": ""},
    ),
    # Run:ai/KAI annotation reference: gpu-fraction-num-devices is "the number of GPU devices to allocate
    # using the specified gpu-fraction or gpu-memory value"; KAI counts fraction x devices against the GPU
    # quota, so 0.5 x 2 is one GPU, within a non-preemptible quota of 1, and a further 0.5 is past it.
    Scenario(
        "KAI peer: a half share on each of two GPUs counts one GPU: a build pod of it fits a quota of 1",
        nodes=TWO_GPU_NODE,
        queues={"q0": q(1)},
        pending={
            "multi": Ask(mib=5000, devices=2, queue="q0", priority=BUILD),
            "more": Ask(mib=5000, queue="q0", priority=BUILD),
        },
        binds={"multi": "n1:0,1"},
        waiting={"more": ""},
    ),
    # KAI's gpusharingorder (allocateFractionalGpu_test.go, "... allocate to same gpu - even if multiple
    # nodes") for one device, here for two; under `fgd-stranding` gpufrac takes the empty node, so as above:
    # binpack.
    Scenario(
        "KAI peer: a two-device half share joins the two half-used GPUs (binpack)",
        nodes={"n1": Node(gpus=2), "n2": Node(gpus=2)},
        settings={"policy": "binpack"},
        queues={"q0": q(4)},
        running={
            "h0": Run("n2:0", mib=5000, queue="q0", priority=TRAIN),
            "h1": Run("n2:1", mib=5000, queue="q0", priority=TRAIN),
        },
        pending={"multi": Ask(mib=5000, devices=2, queue="q0", priority=TRAIN)},
        binds={"multi": "n2:0,1"},
    ),
]

# Pods asked with KAI's `gpu-fraction` itself (docs/gpu-sharing/README.md: gpu-fraction 0.5 "is allowed to
# consume up to half of a GPU device memory; other pods with total request of up to 0.5 GPU memory will be
# able to share this device as well"). Named pods have their gpu-memory annotation swapped for this fraction.
FRACTION_ASKS = {"f1": "0.5", "f2": "0.5", "f3": "0.5", "fq": "0.5", "fd": "0.5"}

FRACTION_ANNOTATION = [
    Scenario(
        "KAI peer: two gpu-fraction 0.5 pods share one GPU; a third 0.5 waits",
        nodes={"n1": Node()},
        queues={"q0": q(1)},
        pending={
            "f1": Ask(mib=5000, queue="q0", priority=TRAIN),
            "f2": Ask(mib=5000, queue="q0", priority=TRAIN),
            "f3": Ask(mib=5000, queue="q0", priority=TRAIN),
        },
        binds={"f1": "n1:0", "f2": "n1:0"},
        waiting={"f3": ""},
    ),
    Scenario(
        "KAI peer: a gpu-fraction 0.5 build pod beside a whole build GPU waits at a quota of 1",
        nodes=TWO_GPU_NODE,
        queues={"q0": q(1)},
        running={"w": Run("n1:0", queue="q0", priority=BUILD)},
        pending={"fq": Ask(mib=5000, queue="q0", priority=BUILD)},
        waiting={"fq": ""},
    ),
    Scenario(
        "KAI peer: gpu-fraction 0.5 on two devices takes half of each of two GPUs",
        nodes=TWO_GPU_NODE,
        queues={"q0": q(2)},
        running={"h": Run("n1:0", mib=5000, queue="q0", priority=TRAIN)},
        pending={"fd": Ask(mib=5000, devices=2, queue="q0", priority=TRAIN)},
        binds={"fd": "n1:0,1"},
    ),
]

# ---- queues: quota, limit, over-quota weight, fair share ------------------------------------------------
QUEUES = [
    # KAI docs/priority/README.md "Example": a queue `test` of gpu quota 1, limit 1; a train pod runs on 1
    # GPU; a build pod of 1 GPU comes: "only one of the pods will be able to run. The scheduler will preempt
    # lower priority train-pod and schedule higher priority build-pod instead." (an idle GPU does not help:
    # the limit)
    Scenario(
        "KAI peer: at its limit of 1, a queue's build pod preempts its train pod, though a GPU is idle",
        nodes=TWO_GPU_NODE,
        queues={"test": q(1, 1, 1)},
        running={"train": Run("n1:0", queue="test", priority=TRAIN)},
        pending={"build": Ask(gpus=1, queue="test", priority=BUILD)},
        binds={"build": "n1"},
        evicted={"train": PREEMPTED},
    ),
    # KAI docs/queues/README.md: Limit is a "hard cap on resource consumption"
    Scenario(
        "KAI peer: a queue of quota 1 and limit 2 holds no more than 2 of 4 idle GPUs",
        nodes={"n1": Node(gpus=4)},
        queues={"q0": q(1, 1, 2)},
        pending=pods("t", 4, gpus=1, queue="q0", priority=TRAIN),
        binds={"t1": "n1", "t2": "n1"},
        waiting={"t3": "would pass its gpus limit", "t4": "would pass its gpus limit"},
    ),
    # KAI docs/scheduling-deep-dive/README.md: "Non-preemptible workloads (priority >= 100) can only use
    # in-quota resources — they will never consume surplus capacity"
    Scenario(
        "KAI peer: a second build GPU past a quota of 1 waits beside an idle GPU",
        nodes=TWO_GPU_NODE,
        queues={"q0": q(1)},
        pending=pods("b", 2, gpus=1, queue="q0", priority=BUILD),
        binds={"b1": "n1"},
        waiting={"b2": ""},
    ),
    # docs/scheduling-deep-dive/README.md, queue priority: phase 1 gives every queue min(quota, requested),
    # phase 2 splits the surplus by OverQuotaWeight (the doc's 10-GPU example: 3 surplus GPUs split 2:1);
    # queues ordered furthest below their fair share first (docs/fairness/README.md, "Queue Order")
    Scenario(
        "KAI peer: 10 GPUs: quotas 3, 2, 2 first, then 3 surplus split 2:1:0 by weight",
        nodes={"n1": Node(gpus=5), "n2": Node(gpus=5)},
        queues={"vision": q(3, 2), "llm": q(2, 1), "other": q(2, 0)},
        pending={
            **pods("v", 6, gpus=1, queue="vision", priority=TRAIN),
            **pods("l", 6, gpus=1, queue="llm", priority=TRAIN),
            **pods("o", 6, gpus=1, queue="other", priority=TRAIN),
        },
        binds={
            **{f"v{i}": ANY for i in range(1, 6)},
            **{f"l{i}": ANY for i in range(1, 4)},
            **{f"o{i}": ANY for i in range(1, 3)},
        },
        waiting={"v6": "", "l4": "", "l5": "", "l6": "", "o3": "", "o4": "", "o5": "", "o6": ""},
    ),
    Scenario(
        "KAI peer: 4 GPUs, no quotas, weights 3:1: the queues get 3 and 1, whoever came first",
        nodes={"n1": Node(gpus=4)},
        queues={"b": q(0, 1), "a": q(0, 3)},
        pending={
            **pods("b", 4, gpus=1, queue="b", priority=TRAIN),
            **pods("a", 4, gpus=1, queue="a", priority=TRAIN),
        },
        binds={"a1": ANY, "a2": ANY, "a3": ANY, "b1": ANY},
        waiting={"a4": "", "b2": "", "b3": "", "b4": ""},
    ),
]

# ---- preemption within a queue --------------------------------------------------------------------------
PREEMPTION = [
    # docs/scheduling-deep-dive/README.md, "Workload Priority": train and build run on the queue's GPUs; two
    # train pods wait (cannot preempt equal or higher priority); an inference pod preempts the running train.
    Scenario(
        "KAI peer: inference preempts the queue's train pod, not its build pod; pending trains keep waiting",
        nodes=TWO_GPU_NODE,
        queues={"vision": q(2)},
        running={
            "train": Run("n1:0", queue="vision", priority=TRAIN),
            "build": Run("n1:1", queue="vision", priority=BUILD),
        },
        pending={
            "t1": Ask(gpus=1, queue="vision", priority=TRAIN),
            "t2": Ask(gpus=1, queue="vision", priority=TRAIN),
            "inf": Ask(gpus=1, queue="vision", priority=INFERENCE, arrives=1),
        },
        binds={"inf": "n1:0"},
        evicted={"train": PREEMPTED},
        waiting={"t1": "", "t2": ""},
    ),
    # deep dive, "Preemption Rules" 3: the victim has strictly lower priority
    Scenario(
        "KAI peer: a train pod does not preempt train pods of its queue",
        nodes=TWO_GPU_NODE,
        queues={"q0": q(2)},
        running={
            "r1": Run("n1:0", queue="q0", priority=TRAIN),
            "r2": Run("n1:1", queue="q0", priority=TRAIN),
        },
        pending={"p": Ask(gpus=1, queue="q0", priority=TRAIN)},
        waiting={"p": ""},
    ),
    Scenario(
        "KAI peer: a build-preemptible pod does not preempt one of the same priority",
        nodes={"n1": Node()},
        queues={"q0": q(1)},
        running={"r": Run("n1:0", queue="q0", priority=BUILD_PREEMPTIBLE)},
        pending={"p": Ask(gpus=1, queue="q0", priority=BUILD_PREEMPTIBLE)},
        waiting={"p": ""},
    ),
    # deep dive, "What Preemption Cannot Do": evict non-preemptible workloads (inference within quota 3)
    Scenario(
        "KAI peer: inference within its quota does not preempt the queue's build pods",
        nodes=TWO_GPU_NODE,
        queues={"q0": q(3)},
        running={
            "b1": Run("n1:0", queue="q0", priority=BUILD),
            "b2": Run("n1:1", queue="q0", priority=BUILD),
        },
        pending={"inf": Ask(gpus=1, queue="q0", priority=INFERENCE)},
        waiting={"inf": ""},
    ),
    # deep dive, "What Preemption Cannot Do": cross queue boundaries (queue a is within its quota, so no
    # reclaim)
    Scenario(
        "KAI peer: a higher priority pod does not take a GPU from another queue within its quota",
        nodes=TWO_GPU_NODE,
        queues={"a": q(2), "b": q(0, 1)},
        running={"a1": Run("n1:0", queue="a", priority=TRAIN), "a2": Run("n1:1", queue="a", priority=TRAIN)},
        pending={"b1": Ask(gpus=1, queue="b", priority=BUILD_PREEMPTIBLE)},
        waiting={"b1": ""},
    ),
    # deep dive FAQ, "What happens when a non-preemptible workload can't fit in-quota?": it can trigger
    # preemption of lower-priority preemptible workloads in its own queue to free in-quota capacity (another
    # queue's pod within its quota stays)
    Scenario(
        "KAI peer: a build pod preempts its own queue's train pod, not another queue's in-quota pod",
        nodes=TWO_GPU_NODE,
        queues={"a": q(1), "b": q(1)},
        running={"a1": Run("n1:0", queue="a", priority=TRAIN), "b1": Run("n1:1", queue="b", priority=TRAIN)},
        pending={"build": Ask(gpus=1, queue="a", priority=BUILD)},
        binds={"build": "n1:0"},
        evicted={"a1": PREEMPTED},
    ),
    # same FAQ: it will not go over quota (preempting the train would not make in-quota room for a second
    # build)
    Scenario(
        "KAI peer: a second build pod past its quota waits; the queue's train pod is not preempted for it",
        nodes=TWO_GPU_NODE,
        queues={"a": q(1)},
        running={"b1": Run("n1:0", queue="a", priority=BUILD), "t1": Run("n1:1", queue="a", priority=TRAIN)},
        pending={"b2": Ask(gpus=1, queue="a", priority=BUILD)},
        waiting={"b2": ""},
    ),
    # docs/priority/README.md, "Usability" 1: "The scheduler attempts to schedule higher priority workloads
    # first"
    Scenario(
        "KAI peer: of two pods for one GPU, the higher priority binds though it came second",
        nodes={"n1": Node()},
        queues={"q0": q(1)},
        pending={
            "train": Ask(gpus=1, queue="q0", priority=TRAIN),
            "interactive": Ask(gpus=1, queue="q0", priority=BUILD_PREEMPTIBLE),
        },
        binds={"interactive": "n1:0"},
        waiting={"train": ""},
    ),
]

# ---- gangs ----------------------------------------------------------------------------------------------
GANGS = [
    # docs/batch/README.md, "Gang Scheduling": all-or-nothing
    Scenario(
        "KAI peer: a gang of minMember 3 on 2 GPUs binds none",
        nodes=TWO_GPU_NODE,
        queues={"q0": q(3)},
        groups={"job": {"minMember": 3, "queue": "q0"}},
        pending=pods("w", 3, gpus=1, group="job", priority=TRAIN),
        waiting={"w1": "", "w2": "", "w3": ""},
    ),
    # docs/elastic/README.md: "schedules the required pods ... first and treats capacity above those
    # thresholds as elastic"
    Scenario(
        "KAI peer: an elastic gang of minMember 2 runs 2 of its 3 pods on 2 GPUs",
        nodes=TWO_GPU_NODE,
        queues={"q0": q(3)},
        groups={"job": {"minMember": 2, "queue": "q0"}},
        pending=pods("w", 3, gpus=1, group="job", priority=TRAIN),
        binds={"w1": "n1", "w2": "n1"},
        waiting={"w3": ""},
    ),
    # pkg/scheduler/actions/preempt/preempt_elastic_test.go, "Inference job preempts all tasks from elastic
    # train job"
    Scenario(
        "KAI peer: a 2-GPU inference pod preempts both pods of an elastic train gang",
        nodes=TWO_GPU_NODE,
        queues={"q0": q(4)},
        groups={"job": {"minMember": 1, "queue": "q0"}},
        running={
            "e1": Run("n1:0", group="job", priority=TRAIN),
            "e2": Run("n1:1", group="job", priority=TRAIN),
        },
        pending={"inf": Ask(gpus=2, queue="q0", priority=INFERENCE)},
        binds={"inf": "n1"},
        evicted={"e1": PREEMPTED, "e2": PREEMPTED},
    ),
]

# Elastic preemption where KAI's test names one victim of several alike: any of them may go (the count is the
# fact). preempt_elastic_test.go, "Inference job preempts single task from elastic train job" and "Inference
# job preempts several tasks from elastic train job".
ELASTIC_ANY = [
    (
        Scenario(
            "KAI peer: a 1-GPU inference pod preempts one pod of an elastic train gang, the other stays",
            nodes=TWO_GPU_NODE,
            queues={"q0": q(2)},
            groups={"job": {"minMember": 1, "queue": "q0"}},
            running={
                "e1": Run("n1:0", group="job", priority=TRAIN),
                "e2": Run("n1:1", group="job", priority=TRAIN),
            },
            pending={"inf": Ask(gpus=1, queue="q0", priority=INFERENCE)},
            binds={"inf": "n1"},
        ),
        [{"e1"}, {"e2"}],
    ),
    (
        Scenario(
            "KAI peer: a 2-GPU inference pod preempts two of four pods of an elastic train gang",
            nodes={"n1": Node(gpus=4)},
            queues={"q0": q(4)},
            groups={"job": {"minMember": 1, "queue": "q0"}},
            running={f"e{i}": Run(f"n1:{i - 1}", group="job", priority=TRAIN) for i in range(1, 5)},
            pending={"inf": Ask(gpus=2, queue="q0", priority=INFERENCE)},
            binds={"inf": "n1"},
        ),
        [{a, b} for a in ("e1", "e2", "e3", "e4") for b in ("e1", "e2", "e3", "e4") if a < b],
    ),
]


@pytest.fixture
def fractions(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pods named in FRACTION_ASKS ask with `gpu-fraction` instead of `gpu-memory`."""
    made = driver._pending

    def pending(name: str, ask: Ask, order: int) -> dict[str, Any]:
        body = made(name, ask, order)
        if name in FRACTION_ASKS:
            notes = body["metadata"]["annotations"]
            notes.pop(keys.GPU_MEMORY, None)
            notes[keys.GPU_FRACTION] = FRACTION_ASKS[name]
        return body

    monkeypatch.setattr(driver, "_pending", pending)


@pytest.mark.parametrize("scenario", cases(SHARING + QUEUES + PREEMPTION + GANGS))
async def test_scenario(scenario: Scenario) -> None:
    await check(scenario)


@pytest.mark.parametrize("scenario", cases(FRACTION_ANNOTATION))
async def test_fraction_annotation(scenario: Scenario, fractions: None) -> None:
    await check(scenario)


@pytest.mark.parametrize(("scenario", "victims"), [pytest.param(s, v, id=s.name) for s, v in ELASTIC_ANY])
async def test_elastic_any_victims(scenario: Scenario, victims: list[set[str]]) -> None:
    failures = []
    for chosen in victims:
        try:
            await check(dataclasses.replace(scenario, evicted={name: PREEMPTED for name in chosen}))
            return
        except AssertionError as error:
            failures.append(str(error))
    raise AssertionError("no allowed set of victims matched:\n" + "\n---\n".join(failures[:2]))
