"""`fractions-mixed`: a trusted portion of the pods may use sm-sharing, the rest must time-slice.

Which pods are trusted is drawn with the seed: round(P × fractional pods) of them. A GPU runs one mode at
a time, so trusted and untrusted pods never share a GPU; and sm-sharing puts a GPU's clients in one fault
domain, so trusted pods of different tenants never share one either: each trusted pod belongs to one of
`fault_domains` tenants, also drawn with the seed. What those separations cost is what this strategy
measures against the two pure ones (`--fault-domains 1` leaves out the second).
"""

from __future__ import annotations

import dataclasses
from functools import cached_property

import numpy as np

from gpufrac.cluster.model import PodDemand
from gpufrac.contract.model import ComputeMode
from gpufrac.plan.strategies.base import STRATEGIES, EngineStrategy

TRUSTED_STREAM = 1  # the seed's random stream for choosing trusted pods, apart from the planner's others
TENANT_STREAM = 2  # and the one for drawing their tenants


@STRATEGIES.register
class FractionsMixed(EngineStrategy):
    name = "fractions-mixed"
    about = (
        "gpufrac fractions with {trusted_share:.0%} of the fractional pods trusted (sm-sharing, among "
        "{fault_domains} tenants who never share a GPU) and the rest time-slicing; a GPU runs one mode at a "
        "time."
    )

    @cached_property
    def trusted(self) -> frozenset[str]:
        names = sorted(pod.name for pod in self.options.pods if pod.shares)
        count = round(self.options.trusted_share * len(names))
        rng = np.random.default_rng([self.options.seed, TRUSTED_STREAM])
        return frozenset(names[i] for i in rng.choice(len(names), size=count, replace=False))

    @cached_property
    def tenants(self) -> dict[str, str]:
        """Trusted pod -> its tenant (fault domain), drawn with the seed."""
        names = sorted(self.trusted)
        rng = np.random.default_rng([self.options.seed, TENANT_STREAM])
        drawn = rng.integers(self.options.fault_domains, size=len(names))
        return {name: f"tenant-{int(tenant)}" for name, tenant in zip(names, drawn, strict=True)}

    def demand(self, pod: PodDemand) -> PodDemand:
        trusted = pod.name in self.trusted
        mode = ComputeMode.SM_SHARING if trusted else ComputeMode.TIME_SLICING
        shares = tuple(dataclasses.replace(share, mode=mode) for share in pod.shares)
        return dataclasses.replace(pod, shares=shares, fault_domain=self.tenants.get(pod.name, ""))
