"""`whole-gpu`: no sharing; every GPU request is rounded up to whole GPUs."""

from __future__ import annotations

from gpufrac.cluster.model import PodDemand
from gpufrac.plan.strategies.base import STRATEGIES, EngineStrategy


@STRATEGIES.register
class WholeGpu(EngineStrategy):
    name = "whole-gpu"
    about = "Every GPU request takes whole GPUs: a share of any size on N devices takes N GPUs of its own."

    def demand(self, pod: PodDemand) -> PodDemand:
        return pod.without_sharing()
