"""Burst rules: a share may use memory up to its limit while its GPU has room, but the guaranteed requests
of its neighbours always win.

Per GPU, what is owed is what the shares below their request may still claim up to it, together: their
requests are promised at once, so two shares that would each fit alone but not both are at risk. When the
GPU's free memory (its usable memory, as the agent publishes it, less what every process on it uses,
processes without a contract included) is less than what is owed, memory is reclaimed from the shares
above their request: the lowest pod priority first, then the one furthest above its own request, then by
namespace, pod and container, so the choice is the same every tick; and only as many as it takes to cover
the difference. A reclaimed share gives back only what it uses above its request: killed, its container
restarts, and evicted, its pod is replaced, still owed that request; counting all it used would leave the
next tick to reclaim the next share, one tick at a time. A share over its limit is a breach, acted on
anyway: what it uses above its request counts as given back, and it is not picked a second time.

Pure: the agent hands in the watchdog's assessment, the processes and each GPU's usable memory, and gets the
assessment back with one `GPUBurstReclaimed` finding per share to act on.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from gpufrac.node.nvml import MIB
from gpufrac.node.watchdog import Assessment, Container, Finding, Gpu, Kind, Process, Usage

MAX_NAMED = 3  # protected shares named in one finding's detail; the rest are counted


def reclaim(assessment: Assessment, processes: Iterable[Process], memory: Mapping[Gpu, int]) -> Assessment:
    """`assessment` with a burst finding for each share to reclaim; `memory`: bytes usable per GPU (a GPU
    without an entry, its memory unknown, is not judged)."""
    used: dict[Gpu, int] = {}
    for process in processes:
        used[process.gpu] = used.get(process.gpu, 0) + (process.used_bytes or 0)
    breaching = {(f.container, f.gpu) for f in assessment.findings if f.kind is Kind.BREACH}
    found: list[Finding] = []
    for gpu in sorted(memory, key=lambda g: g.index):
        shares = [u for u in assessment.usages if u.gpu == gpu and u.container.request_mib is not None]
        free = memory[gpu] - used.get(gpu, 0)
        given_back = sum(_over(u) for u in shares if (u.container, gpu) in breaching)
        candidates = [u for u in shares if _over(u) > 0 and (u.container, gpu) not in breaching]
        protected = [u for u in shares if _over(u) < 0]
        owed = sum(-_over(u) for u in protected)
        if protected:
            found += [_finding(v, protected, free) for v in victims(candidates, owed - free - given_back)]
    return Assessment(assessment.usages, assessment.findings + tuple(found))


def victims(candidates: Sequence[Usage], shortfall: int) -> list[Usage]:
    """The first shares, in reclaim order, whose memory above their requests covers `shortfall` bytes
    (all of them if that does not; none if nothing is short)."""
    chosen: list[Usage] = []
    for usage in sorted(candidates, key=_reclaim_order):
        if shortfall <= 0:
            break
        chosen.append(usage)
        shortfall -= _over(usage)
    return chosen


def _reclaim_order(usage: Usage) -> tuple[int, int, str, str, str]:
    pod = usage.container.pod
    return (usage.container.priority, -_over(usage), pod.namespace, pod.name, usage.container.name)


def _over(usage: Usage) -> int:
    """Bytes above the share's request (negative: what it may still claim up to it)."""
    assert usage.container.request_mib is not None
    return usage.used_bytes - usage.container.request_mib * MIB


def _finding(victim: Usage, protected: Sequence[Usage], free: int) -> Finding:
    gpu, container = victim.gpu, victim.container
    named = [f"the {u.container.request_mib} MiB guaranteed to {_owner(u.container)}" for u in protected]
    if len(named) > MAX_NAMED:
        named[MAX_NAMED:] = [f"those of {len(named) - MAX_NAMED} more shares"]
    detail = (
        f"{_owner(container)} (priority {container.priority}) uses {victim.used_bytes // MIB} MiB on GPU "
        f"{gpu.index} ({gpu.uuid}), {_over(victim) // MIB} MiB over its request of "
        f"{container.request_mib} MiB, with {max(0, free) // MIB} MiB free on the GPU: reclaimed to keep "
        + ", ".join(named)
    )
    return Finding(Kind.BURST, gpu, victim.processes, detail, container, victim.used_bytes)


def _owner(container: Container) -> str:
    return f"container {container.name} of pod {container.pod.namespace}/{container.pod.name}"
