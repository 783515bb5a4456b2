"""Dealing a trace to tenants: each pod's queue, which pods are gangs, and the part of the cluster replayed.

The trace names no teams, so the replay deals its pods out by a seeded rule, in three independent random
streams spawned from the seed (`numpy.random.SeedSequence(seed).spawn(3)`), so that changing one rule's
settings never reshuffles another's draws:

- queues: the pods, in creation order (then name), are cut into as many equal runs as `traffic` lists
  weights (phases); each pod of phase k joins leaf queue q with probability traffic[q][k] / Σ traffic[·][k].
  Phases let queues burst at different times, which is what makes borrowing and reclaim happen;
- gangs: each pod with GPUs becomes, with probability `gangs.fraction`, a gang of `gangs.size` identical
  members (`<name>-m0`, `-m1`, ...) that arrive together, leave together and must all run at once;
- nodes: with `cluster.gpus`, whole nodes are taken in a seeded random order until they hold that many GPUs
  (at least): at its busiest the bundled trace asks for about 66 of its 6,212 GPUs at once, so on the whole
  cluster no pod would ever wait.

A pod runs for its deletion time minus its creation time, however late it starts; one without a deletion
time would have run to the end of the trace (its last creation or deletion), and so runs that long.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpufrac.cluster.model import NodeSpec, PodDemand
from gpufrac.errors import UserError
from gpufrac.sim.tenants.config import TenantsConfig
from gpufrac.sim.trace import Trace, require_times


@dataclass(frozen=True, slots=True)
class TenantPod:
    demand: PodDemand
    queue: str
    arrival: float
    duration: float
    gang: str | None = None  # members of one gang share its name


@dataclass(frozen=True, slots=True)
class Dealt:
    nodes: tuple[NodeSpec, ...]
    pods: tuple[TenantPod, ...]  # in arrival order


def deal(trace: Trace, config: TenantsConfig, seed: int) -> Dealt:
    queues, gangs, nodes = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3))
    require_times(trace.pods, replay="the tenant replay")
    ordered = sorted(trace.pods, key=lambda pod: (pod.creation_time or 0.0, pod.name))
    end = max(max(pod.creation_time or 0.0, pod.deletion_time or 0.0) for pod in ordered)
    chosen = assign_queues(len(ordered), config, queues)
    ganged = gangs.random(len(ordered)) < config.gangs.fraction
    pods: list[TenantPod] = []
    for pod, queue, gang in zip(ordered, chosen, ganged, strict=True):
        assert pod.creation_time is not None
        deletion = end if pod.deletion_time is None else pod.deletion_time
        base = TenantPod(pod.demand(), queue, pod.creation_time, deletion - pod.creation_time)
        if gang and pod.num_gpu:
            pods.extend(
                dataclasses.replace(
                    base, demand=dataclasses.replace(base.demand, name=f"{pod.name}-m{i}"), gang=pod.name
                )
                for i in range(config.gangs.size)
            )
        else:
            pods.append(base)
    return Dealt(part_of(trace.nodes, config.cluster_gpus, nodes), tuple(pods))


def assign_queues(count: int, config: TenantsConfig, rng: np.random.Generator) -> list[str]:
    """The queue of each of `count` pods in creation order: drawn per phase by the traffic weights."""
    leaves = config.leaves
    weights = np.array([config.traffic[name] for name in leaves])  # queues × phases
    phases = weights.shape[1]
    phase_of = np.arange(count) * phases // max(count, 1)
    chosen = np.empty(count, np.int64)
    for phase in range(phases):
        members = np.flatnonzero(phase_of == phase)
        column = weights[:, phase]
        chosen[members] = rng.choice(len(leaves), size=members.size, p=column / column.sum())
    return [leaves[i] for i in chosen]


def part_of(nodes: Sequence[NodeSpec], gpus: int | None, rng: np.random.Generator) -> tuple[NodeSpec, ...]:
    """Whole nodes with GPUs, in a seeded order, until they hold `gpus`; every node when `gpus` is None."""
    if gpus is None:
        return tuple(nodes)
    total = sum(len(node.gpus) for node in nodes)
    if gpus > total:
        raise UserError(f"cluster.gpus = {gpus}: the trace's cluster has {total} GPUs; ask for at most that")
    with_gpus = [node for node in nodes if node.gpus]
    taken: list[NodeSpec] = []
    held = 0
    for i in rng.permutation(len(with_gpus)):
        if held >= gpus:
            break
        taken.append(with_gpus[i])
        held += len(with_gpus[i].gpus)
    return tuple(taken)
