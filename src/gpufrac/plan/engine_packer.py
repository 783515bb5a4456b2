"""A packer that is gpufrac's own engine: `decide` then `ClusterState.apply`, with a registered policy."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from gpufrac.cluster.model import NodeSpec, Placement, PodDemand, Unschedulable
from gpufrac.cluster.state import ClusterState
from gpufrac.contract.model import ComputeMode
from gpufrac.placement.engine import decide
from gpufrac.placement.framework import POLICIES, PolicyContext
from gpufrac.placement.workload import Workload
from gpufrac.plan.packer import PodUse


class EnginePacker:
    """Nodes tie in the order given, so a cluster that is a prefix of a longer node list fills front first."""

    def __init__(
        self,
        nodes: Sequence[NodeSpec],
        *,
        policy: str,
        workload: Workload,
        seed: int,
        demand: Callable[[PodDemand], PodDemand],
    ) -> None:
        self.state = ClusterState(nodes)
        self.policy = POLICIES[policy](PolicyContext(rng=np.random.default_rng(seed), workload=workload))
        self.demand = demand

    def place(self, pod: PodDemand) -> str | Unschedulable:
        outcome = decide(self.state, self.demand(pod), self.policy)
        if isinstance(outcome, Placement):
            self.state.apply(outcome)
            return outcome.node
        return outcome

    def release(self, pod: str) -> None:
        self.state.release(pod)

    def busy_gpus(self) -> int:
        return int((self.state.gpu_tenants > 0).sum())

    def uses(self) -> list[PodUse]:
        return [
            PodUse(
                pod=placement.pod,
                container=assignment.container,
                node=placement.node,
                gpus=assignment.gpus,
                allocated_mib=assignment.request_mib,
                sm_sharing=assignment.mode is ComputeMode.SM_SHARING,
            )
            for placement in self.state.placements.values()
            for assignment in placement.assignments
        ]
