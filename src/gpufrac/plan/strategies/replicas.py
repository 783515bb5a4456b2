"""`time-slicing-replicas`: the NVIDIA device plugin's time-slicing, N equal replicas per GPU.

A fractional pod takes one replica on each GPU it asks for, whatever its size: the device plugin advertises
replicas, not memory, and enforces no memory limit, so a pod that asks for more than memory/N may take
memory its neighbours count on; the measures count those pods as oversubscribing. Whole-GPU requests keep
whole GPUs: the device plugin's sharing configuration is set per node, so a cluster that time-slices its
small pods keeps whole-GPU jobs on nodes with sharing off; the planner lets both kinds share a node, which
is the optimistic side of that split.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction

from gpufrac.cluster.model import PodDemand
from gpufrac.contract.model import ComputeMode, Portion
from gpufrac.plan.strategies.base import STRATEGIES, EngineStrategy


@STRATEGIES.register
class Replicas(EngineStrategy):
    name = "time-slicing-replicas"
    about = (
        "Each GPU is {replicas} equal replicas; a fractional pod takes one replica (1/{replicas} of the GPU) "
        "per device whatever it asks for, and nothing enforces memory; whole-GPU requests keep whole GPUs."
    )

    def demand(self, pod: PodDemand) -> PodDemand:
        replica = Portion(Fraction(1, self.options.replicas))
        shares = tuple(
            dataclasses.replace(share, request=replica, limit=replica, mode=ComputeMode.TIME_SLICING)
            for share in pod.shares
        )
        return dataclasses.replace(pod, shares=shares)
