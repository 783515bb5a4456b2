"""`fractions-time-slicing` and `fractions-sm-sharing`: gpufrac's own engine, every share in one mode.

A share takes exactly the memory it asks for; one compute mode per GPU holds either way. The two differ in
what sharing costs: time-sliced pods keep separate fault domains, sm-sharing (MPS) pods on a GPU share one
and split its SMs.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from gpufrac.cluster.model import PodDemand
from gpufrac.contract.model import ComputeMode
from gpufrac.plan.strategies.base import STRATEGIES, EngineStrategy


class Fractions(EngineStrategy):
    """Every share in `mode`; each mode is its own registered strategy below."""

    mode: ClassVar[ComputeMode]

    @property
    def summary(self) -> str:
        return f"gpufrac fractions: each share takes the memory it asks for, every share in {self.mode} mode."

    def demand(self, pod: PodDemand) -> PodDemand:
        shares = tuple(dataclasses.replace(share, mode=self.mode) for share in pod.shares)
        return dataclasses.replace(pod, shares=shares)


@STRATEGIES.register
class FractionsTimeSlicing(Fractions):
    name = "fractions-time-slicing"
    mode = ComputeMode.TIME_SLICING


@STRATEGIES.register
class FractionsSmSharing(Fractions):
    name = "fractions-sm-sharing"
    mode = ComputeMode.SM_SHARING
