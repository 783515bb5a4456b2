"""Burst rules, as a table of scenarios: who is reclaimed when shares above their request leave a neighbour
less than its guarantee."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from gpufrac.node import bursts, watchdog
from gpufrac.node.nvml import MIB
from gpufrac.node.watchdog import Kind

from .test_watchdog import GPU0, GPU1, bound_pod, proc, share


@dataclass(frozen=True)
class Tenant:
    """A share pod on GPU 0 with one process; MiB throughout."""

    pod: str
    request: int
    limit: int
    used: int
    priority: int = 0
    gpu: str = "GPU-0"


def judge(tenants: list[Tenant], *, memory_mib: int = 16000, foreign_mib: int = 0) -> list[watchdog.Finding]:
    """The burst findings on a GPU of `memory_mib` usable, with `foreign_mib` used by a process without a
    contract."""
    pods = []
    for n, t in enumerate(tenants, start=1):
        pod = bound_pod(t.pod, share("app", t.gpu, request=t.request, limit=t.limit), {"app": n})
        pod["spec"]["priority"] = t.priority
        pods.append(pod)
    containers = watchdog.containers_on_node(pods)
    processes = [proc(n, GPU0 if t.gpu == "GPU-0" else GPU1, t.used, n) for n, t in enumerate(tenants, 1)]
    if foreign_mib:
        processes.append(proc(99, GPU0, foreign_mib, None))
    assessment = watchdog.assess(processes, containers, gpus=[GPU0, GPU1])
    judged = bursts.reclaim(assessment, processes, {GPU0: memory_mib * MIB, GPU1: memory_mib * MIB})
    return [f for f in judged.findings if f.kind is Kind.BURST]


SCENARIOS = {
    # name: (tenants, foreign MiB, the pods reclaimed in order)
    "one bursts into the other's guarantee": (
        [Tenant("a", 8000, 16000, 12000), Tenant("b", 8000, 16000, 2000)],
        0,
        ["a"],
    ),
    "bursting with room left": ([Tenant("a", 4000, 16000, 10000), Tenant("b", 4000, 16000, 1000)], 0, []),
    "room left for exactly the guarantee": (
        [Tenant("a", 6000, 16000, 10000), Tenant("b", 6000, 6000, 2000)],
        0,
        [],
    ),
    "the lowest priority first, though another is further over": (
        [
            Tenant("a", 4000, 16000, 6000, 10),
            Tenant("b", 4000, 16000, 8000, 100),
            Tenant("c", 4000, 8000, 0, 1000),
        ],
        0,
        ["a"],
    ),
    "same priority: the furthest over its request": (
        [Tenant("a", 4000, 16000, 6000), Tenant("b", 4000, 16000, 8000), Tenant("c", 4000, 8000, 0)],
        0,
        ["b"],
    ),
    "as many as it takes": (
        [Tenant("a", 1000, 16000, 3000), Tenant("b", 1000, 16000, 3000), Tenant("c", 14000, 14000, 0)],
        0,
        ["a", "b"],
    ),
    "two under their request, each fitting alone but not both": (
        [Tenant("a", 4000, 16000, 7000), Tenant("b", 6000, 6000, 3000), Tenant("c", 6000, 6000, 3000)],
        0,
        ["a"],
    ),
    "a process without a contract counts as used": (
        [Tenant("a", 6000, 16000, 7000), Tenant("b", 8000, 8000, 0)],
        3000,
        ["a"],
    ),
    "a share over its limit is a breach, and its memory counts as given back": (
        [Tenant("a", 4000, 9000, 10000), Tenant("b", 4000, 9000, 4500), Tenant("c", 7000, 7000, 0)],
        0,
        [],
    ),
    "shares on another GPU are not neighbours": (
        [Tenant("a", 8000, 16000, 14000), Tenant("b", 8000, 16000, 0, gpu="GPU-1")],
        0,
        [],
    ),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_burst_scenarios(name: str) -> None:
    tenants, foreign, reclaimed = SCENARIOS[name]
    findings = judge(tenants, foreign_mib=foreign)
    assert [f.container.pod.name for f in findings if f.container] == reclaimed


def test_the_finding_names_the_guarantee_it_protects() -> None:
    (finding,) = judge([Tenant("a", 8000, 16000, 12000, priority=5), Tenant("b", 8192, 16000, 2000)])
    assert finding.detail == (
        "container app of pod ns/a (priority 5) uses 12000 MiB on GPU 0 (GPU-0), 4000 MiB over its request "
        "of 8000 MiB, with 2000 MiB free on the GPU: reclaimed to keep the 8192 MiB guaranteed to container "
        "app of pod ns/b"
    )
    assert [p.pid for p in finding.processes] == [1] and finding.used_bytes == 12000 * MIB
    assert finding.key == f"{Kind.BURST.value}/uid-a/app/GPU-0/1@1001"


def test_many_protected_shares_are_counted_past_a_few() -> None:
    small = [Tenant(f"s{n}", 1000, 1000, 0) for n in range(5)]
    (finding,) = judge([Tenant("big", 1000, 16000, 15000), *small])
    assert finding.detail.endswith("container app of pod ns/s2, those of 2 more shares")


def test_a_gpu_of_unknown_memory_is_not_judged() -> None:
    pods = [bound_pod("a", share("app", "GPU-0", request=1, limit=16000), {"app": 1})]
    processes = [proc(1, GPU0, 15000, 1)]
    assessment = watchdog.assess(processes, watchdog.containers_on_node(pods), gpus=[GPU0])
    assert bursts.reclaim(assessment, processes, {}) == assessment


@pytest.mark.parametrize("value", [None, "1000", True, 1.5])
def test_a_priority_that_is_not_a_whole_number_is_zero(value: object) -> None:
    pod = bound_pod("a", share("app", "GPU-0"), {"app": 1})
    pod["spec"]["priority"] = value
    assert [c.priority for c in watchdog.containers_on_node([pod]).values()] == [0]


def test_a_reclaimed_share_is_still_owed_its_request_so_nothing_cascades() -> None:
    """Once the lowest-priority share is gone, the GPU holds every request with the other one still above
    its own: the next tick reclaims nothing."""
    tenants = [
        Tenant("a", 4000, 16000, 6000, 10),
        Tenant("b", 4000, 16000, 8000, 100),
        Tenant("c", 4000, 8000, 0),
    ]
    assert [f.container.pod.name for f in judge(tenants) if f.container] == ["a"]
    tenants[0] = Tenant("a", 4000, 16000, 0, 10)
    assert judge(tenants) == []
