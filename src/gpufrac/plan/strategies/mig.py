"""`mig`: each request rounded up to the smallest MIG profile that holds it, placed on allowed slots.

On a model without MIG (everything in the bundled openb trace) a request takes a whole GPU, so there `mig`
equals `whole-gpu`; `--gpu-model` retargets the cluster to a MIG model to ask what MIG would do.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpufrac.cluster.model import NodeSpec, PodDemand
from gpufrac.plan.mig_packer import MigPacker
from gpufrac.plan.packer import Packer
from gpufrac.plan.strategies.base import STRATEGIES, Options


@STRATEGIES.register
class Mig:
    name = "mig"
    summary = (
        "MIG: each share rounded up to the smallest MIG profile of its GPU's model that holds its memory, "
        "on the profile's allowed slots; whole-GPU requests and models without MIG take whole GPUs."
    )

    def __init__(self, options: Options) -> None:
        self.options = options

    def demand(self, pod: PodDemand) -> PodDemand:
        """Unchanged: the profile depends on the GPU model, so the packer rounds per candidate GPU."""
        return pod

    def packer(self, nodes: Sequence[NodeSpec]) -> Packer:
        return MigPacker(nodes)
