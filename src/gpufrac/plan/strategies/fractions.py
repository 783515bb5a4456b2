"""`fractions-time-slicing` and `fractions-sm-sharing`: gpufrac's own engine, every share in one mode.

A share takes exactly the memory it asks for; one compute mode per GPU holds either way. The two differ in
what sharing costs: time-sliced pods keep separate fault domains, sm-sharing (MPS) pods on a GPU share one
and split its SMs.
"""

from __future__ import annotations

import dataclasses

from gpufrac.cluster.model import PodDemand
from gpufrac.contract.model import ComputeMode
from gpufrac.plan.strategies.base import EngineStrategy, Options, register


class Fractions(EngineStrategy):
    def __init__(self, options: Options, *, mode: ComputeMode) -> None:
        super().__init__(options)
        self.mode = mode
        self.name = f"fractions-{mode}"
        self.about = (
            f"gpufrac fractions: each share takes the memory it asks for, every share in {mode} mode."
        )

    def demand(self, pod: PodDemand) -> PodDemand:
        shares = tuple(dataclasses.replace(share, mode=self.mode) for share in pod.shares)
        return dataclasses.replace(pod, shares=shares)


@register("fractions-time-slicing")
def fractions_time_slicing(options: Options) -> Fractions:
    return Fractions(options, mode=ComputeMode.TIME_SLICING)


@register("fractions-sm-sharing")
def fractions_sm_sharing(options: Options) -> Fractions:
    return Fractions(options, mode=ComputeMode.SM_SHARING)
