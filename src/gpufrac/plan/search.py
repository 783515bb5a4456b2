"""GPUs needed: the shortest prefix of the node sequence on which every pod of the workload places.

A probe builds a fresh cluster of the first n nodes and places every pod in the seed's order, stopping at
the first that fits nowhere. The search brackets the answer and then bisects it:
- it starts at the fewest nodes whose total GPUs, CPU and memory reach the pods' totals, since no shorter
  prefix can pass; a pod's GPUs are what the strategy allocates to it when placed alone on an empty
  cluster (whole GPUs for `whole-gpu`, the profile for `mig`, and so on);
- after a failed probe it grows n in proportion to the part of the workload left over, plus a margin of
  1% that doubles with every failure in a row; after a passing one, with `trim`, it shrinks n to the last
  node that received a pod: a packer whose nodes' scores read each node alone (`PolicyKind.scores_alone`)
  and that breaks ties by position makes the same decisions without the nodes never chosen, so that
  shorter prefix passes too; without `trim` (a policy that reads the whole cluster: fewer nodes change
  every score) the probed n is the passing count;
- bisection then narrows (failing n, passing n) down to adjacent counts.
One node fewer than the answer fails, probed; the answer passes, probed or as the used prefix of a
passing probe. The planner admits only `deterministic` policies. Greedy placement is not perfectly
monotone in n (a larger cluster can lead a heuristic astray), so a yet shorter prefix may exist; the
search reports the frontier it found, and the probes it made.

What ran out at one node fewer says whether the workload is GPU- or CPU-bound there.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpufrac.cluster.model import NodeSpec, PodDemand, Unschedulable
from gpufrac.errors import UserError
from gpufrac.placement import filters
from gpufrac.plan.inputs import NodeSequence
from gpufrac.plan.packer import Packer
from gpufrac.plan.strategies.base import Strategy
from gpufrac.sim.replay import main_reason

HOST_BOUNDS = {filters.NOT_ENOUGH_CPU: "CPU", filters.NOT_ENOUGH_MEMORY: "memory"}


@dataclass(frozen=True, slots=True)
class Probe:
    nodes: int
    placed: int  # pods placed before the first that did not fit; all of them when it passed
    reason: str  # why that pod fit nowhere (the reason rejecting most nodes); "" when every pod placed

    @property
    def passed(self) -> bool:
        return not self.reason


@dataclass(frozen=True, slots=True)
class Needed:
    nodes: int
    gpus: int
    bound: str  # what ran out with one node fewer: "GPU", "CPU" or "memory"; "" if one node suffices
    reason: str
    probes: tuple[Probe, ...]


def probe(
    strategy: Strategy, nodes: Sequence[NodeSpec], pods: Sequence[PodDemand]
) -> tuple[Probe, Packer, int]:
    """Place every pod on a fresh cluster of `nodes`; also return the packer and how many leading nodes
    received pods."""
    position = {node.name: i for i, node in enumerate(nodes)}
    packer = strategy.packer(nodes)
    used = 0
    for i, pod in enumerate(pods):
        outcome = packer.place(pod)
        if isinstance(outcome, Unschedulable):
            return Probe(len(nodes), i, main_reason(outcome.reasons)), packer, 0
        used = max(used, position[outcome] + 1)
    return Probe(len(nodes), len(pods), ""), packer, used


def gpus_needed(
    strategy: Strategy,
    sequence: NodeSequence,
    pods: Sequence[PodDemand],
    *,
    trim: bool = True,
    on_probe: Callable[[Probe], None] | None = None,
) -> tuple[Needed, Packer]:
    """The search above; returns the answer and the packer holding the workload on that cluster."""
    footprint = allocated_per_shape(strategy, sequence.base, pods)
    need = [
        [footprint[_shape(pod)] for pod in pods],
        [float(pod.cpu_milli) for pod in pods],
        [float(pod.memory_mib) for pod in pods],
    ]
    totals = [sum(column) for column in need]
    n = sequence.smallest_holding(gpus=totals[0], cpu=int(totals[1]), memory=int(totals[2]))
    limit = 16 * max(n, len(sequence.base))
    probes: dict[int, Probe] = {}
    lo = hi = 0  # lo fails (no nodes always do) and hi passes (0: none found yet)
    grow = down = 0  # failures in a row while growing; the last step down
    best: Packer | None = None
    while True:
        result, packer, used = probe(strategy, sequence.prefix(n), pods)
        probes[n] = result
        if on_probe is not None:
            on_probe(result)
        if result.passed:
            hi, best = (used if trim else n), packer
        else:
            lo = max(lo, n)
        if hi and hi - lo <= 1:
            break
        if not hi:  # nothing passed yet: grow by the part of the workload left over, plus a margin
            margin = max(1, n // 100) << grow  # that doubles on every failure in a row
            grow += 1
            n += _shortfall(n, result.placed, need, totals) + margin
            if n > limit:
                raise UserError(f"{strategy.name}: the pods still do not all fit on {n} nodes; giving up")
        elif lo in probes:  # bracketed
            n = (lo + hi) // 2
        else:  # nothing failed yet: step down, doubling the step
            down = max(1, 2 * down)
            n = max(hi - down, 1)
    assert best is not None
    failing = probes.get(lo)
    reason = failing.reason if failing else ""
    needed = Needed(
        nodes=hi,
        gpus=sum(len(node.gpus) for node in sequence.prefix(hi)),
        bound=HOST_BOUNDS.get(reason, "GPU") if reason else "",
        reason=reason,
        probes=tuple(probes.values()),
    )
    return needed, best


def _shortfall(n: int, placed: int, need: list[list[float]], totals: list[float]) -> int:
    """Nodes to add so that capacity scales with the part of the workload that did not fit."""
    ratios = [
        total / max(sum(column[:placed]), 1e-9) for column, total in zip(need, totals, strict=True) if total
    ]
    return math.ceil(n * max(ratios, default=2.0)) - n


def _shape(pod: PodDemand) -> PodDemand:
    return dataclasses.replace(pod, name="")


def allocated_per_shape(
    strategy: Strategy, nodes: Sequence[NodeSpec], pods: Sequence[PodDemand]
) -> dict[PodDemand, float]:
    """GPUs the strategy allocates to each distinct pod shape (a pod without its name), found by placing it
    alone on an empty cluster of one node of each kind. A shape that fits nowhere there fits in no cluster
    of these nodes, which is refused here before any search."""
    kinds: dict[tuple[object, ...], NodeSpec] = {}
    for node in nodes:
        key = (node.cpu_milli, node.memory_mib, tuple((g.model, g.memory_mib, g.healthy) for g in node.gpus))
        kinds.setdefault(key, node)
    memory = {(node.name, gpu.index): gpu.memory_mib for node in kinds.values() for gpu in node.gpus}
    packer = strategy.packer(list(kinds.values()))
    allocated: dict[PodDemand, float] = {}
    for pod in pods:
        shape = _shape(pod)
        if shape in allocated:
            continue
        outcome = packer.place(pod)
        if isinstance(outcome, Unschedulable):
            raise UserError(
                f"{strategy.name}: pod {pod.name} fits on no node even in an empty cluster "
                f"({main_reason(outcome.reasons)}); drop it from the trace or choose another --gpu-model"
            )
        allocated[shape] = sum(
            use.allocated_mib / memory[use.node, gpu] for use in packer.uses() for gpu in use.gpus
        )
        packer.release(pod.name)
    return allocated
