"""The plugin seam of the planner: a strategy turns what a pod asks for into what the cluster must allocate.

Most strategies only rewrite a pod's demand and let gpufrac's own engine place it (`EngineStrategy`); MIG
needs its own packer, since a MIG instance must sit on allowed slots, not merely fit in free memory. Every
packer answers the same four calls, so the search, the timed replay and the measures treat all alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Protocol

from gpufrac.cluster.model import NodeSpec, PodDemand
from gpufrac.placement.workload import Workload
from gpufrac.plan.engine_packer import EnginePacker
from gpufrac.plan.packer import Packer
from gpufrac.registry import Registry


@dataclass(frozen=True, slots=True)
class Options:
    """What a strategy may need: the workload as the trace asks for it, and the planner's settings (whose
    defaults are `planner.Settings`')."""

    pods: tuple[PodDemand, ...]
    seed: int
    policy: str
    replicas: int
    trusted_share: float
    fault_domains: int = 1


class Strategy(Protocol):
    name: str

    @property
    def summary(self) -> str:
        """One sentence for the report: what the cluster allocates for a pod under this strategy."""
        ...

    def demand(self, pod: PodDemand) -> PodDemand: ...

    def packer(self, nodes: Sequence[NodeSpec]) -> Packer: ...


class StrategyClass(Protocol):
    """What STRATEGIES holds: a strategy's class, which carries its name and is built from the options."""

    @property
    def name(self) -> str: ...

    def __call__(self, options: Options) -> Strategy: ...


STRATEGIES: Registry[StrategyClass] = Registry()


class EngineStrategy:
    """A strategy that rewrites each pod's demand and lets gpufrac's engine place it with `options.policy`."""

    name: str
    # What the cluster allocates for a pod, for the report; may name the options: {replicas}, {trusted_share},
    # {fault_domains}.
    about = ""

    def __init__(self, options: Options) -> None:
        self.options = options

    @property
    def summary(self) -> str:
        options = self.options
        return self.about.format(
            replicas=options.replicas,
            trusted_share=options.trusted_share,
            fault_domains=options.fault_domains,
        )

    def demand(self, pod: PodDemand) -> PodDemand:
        return pod

    @cached_property
    def workload(self) -> Workload:
        """The target workload (for a policy that needs one) is the rewritten one: what this strategy will
        really place."""
        return Workload.from_pods(self.demand(pod) for pod in self.options.pods)

    def packer(self, nodes: Sequence[NodeSpec]) -> Packer:
        return EnginePacker(
            nodes,
            policy=self.options.policy,
            workload=self.workload,
            seed=self.options.seed,
            demand=self.demand,
        )
