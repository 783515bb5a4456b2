"""The planner's inputs: which GPUs, which node order, and the pods as the strategies will see them.

GPU memory follows the simulator's convention of MiB per nominal GB (`sim.trace.MIB_PER_GB`), so that a
portion in thousandths resolves to whole MiB exactly. The trace's own models keep the simulator's sizes;
the MIG models take theirs from the MIG table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from fractions import Fraction

import numpy as np

from gpufrac.cluster.model import GpuSpec, NodeSpec, PodDemand
from gpufrac.contract import portion_mib
from gpufrac.contract.model import Mebibytes, MemoryAmount, Portion
from gpufrac.errors import UserError
from gpufrac.plan import mig
from gpufrac.sim.trace import MIB_PER_GB, MODEL_MEMORY_GB

GPU_MEMORY_GB = MODEL_MEMORY_GB | {model: gb for model, (gb, _) in mig.MIG_MODELS.items()}

NODE_ORDER_STREAM = 2  # the seed's random streams, kept apart so that one use never shifts another
POD_ORDER_STREAM = 3
# The largest GPU sold holds 141 GB; far past that, a portion's MiB outgrow the engine's int64 arrays.
MAX_REFERENCE_GB = 10_000


def retarget(nodes: Sequence[NodeSpec], model: str | None) -> list[NodeSpec]:
    """Every node's GPUs replaced by `model` (same count, CPU and memory); without a model, nodes whose
    model is in the MIG table get that model's memory, which the trace loader does not know."""
    if model is not None and model not in GPU_MEMORY_GB:
        raise UserError(f'--gpu-model "{model}": unknown; known: {", ".join(sorted(GPU_MEMORY_GB))}')
    retargeted = []
    for node in nodes:
        target = model or node.model
        if target not in mig.MIG_MODELS and model is None:
            retargeted.append(node)
            continue
        memory = MIB_PER_GB * GPU_MEMORY_GB[target]
        gpus = tuple(dataclasses.replace(gpu, model=target, memory_mib=memory) for gpu in node.gpus)
        retargeted.append(dataclasses.replace(node, gpus=gpus))
    return retargeted


def prepare_pods(
    pods: Sequence[PodDemand], *, reference_gb: float | None, drop_models: bool
) -> list[PodDemand]:
    """The pods as every strategy receives them.

    With `reference_gb`, a portion becomes the MiB it means on a GPU of that many nominal GB (at least 1):
    the same memory on any GPU, so that a larger GPU holds more of it. Without, a portion stays a portion of
    whichever GPU the pod lands on. `drop_models` drops GPU-model constraints, which a retargeted cluster
    could never satisfy.
    """
    if reference_gb is not None and not 0 < reference_gb <= MAX_REFERENCE_GB:  # NaN fails both
        raise UserError(
            f"--reference-gb {reference_gb}: must be a positive number of GB, at most {MAX_REFERENCE_GB:g}, "
            "such as 16"
        )
    prepared = []
    for pod in pods:
        if reference_gb is not None and pod.shares:
            shares = tuple(
                dataclasses.replace(
                    share,
                    request=_absolute(share.request, reference_gb),
                    limit=_absolute(share.limit, reference_gb),
                )
                for share in pod.shares
            )
            pod = dataclasses.replace(pod, shares=shares)
        if drop_models and pod.models is not None:
            pod = dataclasses.replace(pod, models=None)
        prepared.append(pod)
    return prepared


def _absolute(amount: MemoryAmount, reference_gb: float) -> MemoryAmount:
    if not isinstance(amount, Portion):
        return amount
    return Mebibytes(max(1, portion_mib(amount.value, Fraction(reference_gb) * MIB_PER_GB)))


def pod_order(pods: Sequence[PodDemand], seed: int) -> list[PodDemand]:
    """All pods at once, in an order shuffled by the seed (the trace read as a snapshot, as in the FGD
    paper); every strategy sees the same order for a seed."""
    by_name = sorted(pods, key=lambda pod: pod.name)
    rng = np.random.default_rng([seed, POD_ORDER_STREAM])
    return [by_name[i] for i in rng.permutation(len(by_name))]


class NodeSequence:
    """The trace's nodes in an order shuffled by the seed, repeated without end: the candidate clusters
    are its prefixes, so a cluster of n nodes keeps roughly the trace's mix of node types at any size, and
    can grow past the trace's own cluster when a strategy needs more. Copies are named `<node>~<k>`."""

    def __init__(self, nodes: Sequence[NodeSpec], seed: int) -> None:
        if not nodes:
            raise UserError("the node list is empty")
        by_name = sorted(nodes, key=lambda node: node.name)
        rng = np.random.default_rng([seed, NODE_ORDER_STREAM])
        self.base = [by_name[i] for i in rng.permutation(len(by_name))]

    def node(self, position: int) -> NodeSpec:
        spec = self.base[position % len(self.base)]
        copy = position // len(self.base)
        if copy == 0:
            return spec
        name = f"{spec.name}~{copy}"
        gpus = tuple(
            GpuSpec(gpu.index, f"{name}-gpu{gpu.index}", gpu.model, gpu.memory_mib, gpu.healthy)
            for gpu in spec.gpus
        )
        return dataclasses.replace(spec, name=name, gpus=gpus)

    def prefix(self, count: int) -> list[NodeSpec]:
        return [self.node(i) for i in range(count)]

    def smallest_holding(self, *, gpus: float, cpu: int, memory: int) -> int:
        """The fewest nodes whose totals reach these sums: no shorter prefix can place every pod."""
        per_round = (
            sum(len(node.gpus) for node in self.base),
            sum(node.cpu_milli for node in self.base),
            sum(node.memory_mib for node in self.base),
        )
        if any(need > 0 and have == 0 for need, have in zip((gpus, cpu, memory), per_round, strict=True)):
            raise UserError("the pods need GPUs, CPU or memory that no node in the node list has")
        have = [0, 0, 0]
        count = 0
        while have[0] < gpus or have[1] < cpu or have[2] < memory:
            node = self.base[count % len(self.base)]
            have = [have[0] + len(node.gpus), have[1] + node.cpu_milli, have[2] + node.memory_mib]
            count += 1
        return max(count, 1)
