"""`whole-gpu`: no sharing; every GPU request is rounded up to whole GPUs."""

from __future__ import annotations

import dataclasses

from gpufrac.cluster.model import PodDemand
from gpufrac.contract.model import WholeGpuRequest
from gpufrac.plan.strategies.base import STRATEGIES, EngineStrategy


@STRATEGIES.register
class WholeGpu(EngineStrategy):
    name = "whole-gpu"
    about = "Every GPU request takes whole GPUs: a share of any size on N devices takes N GPUs of its own."

    def demand(self, pod: PodDemand) -> PodDemand:
        if not pod.shares:
            return pod
        return dataclasses.replace(
            pod,
            whole=pod.whole
            + tuple(WholeGpuRequest(share.container, share.num_devices) for share in pod.shares),
            shares=(),
        )
