"""The plugin seams of the engine: a policy is a node scorer plus a GPU picker, registered by name.

Filters are not pluggable per policy: every policy must honour the same invariants, so they all share
`fit.find_fit`. What differs between policies is only which feasible node wins and which GPUs on it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from gpufrac.cluster.state import ClusterState
from gpufrac.placement.cache import NodeMemo
from gpufrac.placement.fit import Fit, fit_memo, verdict_memo
from gpufrac.placement.reserve import WholeGpuReserve
from gpufrac.placement.workload import Workload
from gpufrac.registry import Registry


class Scorer(Protocol):
    def score(self, state: ClusterState, fit: Fit) -> np.ndarray:
        """One score per feasible node (`fit.rows`); the highest wins, ties go to the lowest tie rank."""
        ...


class GpuPicker(Protocol):
    def pick(self, state: ClusterState, fit: Fit, at: int) -> tuple[int, ...]:
        """The GPUs for the pod on node `fit.rows[at]`: its share's devices, or its whole GPUs."""
        ...


@dataclass(frozen=True, slots=True)
class PerNode:
    """A scorer whose score for a node depends on nothing but that node and the pod's shape, with its scores
    kept per node: only the nodes that changed since the last pod of the same shape are scored again, since
    a placement changes one node while every decision reads all of them."""

    scorer: Scorer
    memo: NodeMemo = field(default_factory=lambda: NodeMemo("score", dtypes={"score": np.int64}))

    def score(self, state: ClusterState, fit: Fit) -> np.ndarray:
        entry = self.memo.refreshed(
            state, fit.shape, fit.rows, lambda stale: (self.scorer.score(state, fit.subset(stale)),)
        )
        return entry["score"][fit.rows]


@dataclass(frozen=True, slots=True)
class Policy:
    """One run's scorer and picker: they may keep state across a run's decisions (a memo, a random stream).
    `fits` is the filters' memo (`fit.find_fit`), kept here because a policy lives as long as a run.
    `reserve`: the operator's whole-GPU reserve, which every decision honours whatever the policy."""

    scorer: Scorer
    picker: GpuPicker
    fits: NodeMemo = field(default_factory=fit_memo)
    reserve: WholeGpuReserve | None = None
    verdicts: NodeMemo = field(default_factory=verdict_memo)  # why nodes refused a pod (`Fit.rejected`)


@dataclass(frozen=True, slots=True)
class PolicyContext:
    """What a policy may need to be built: randomness, and the target workload (see `PolicyKind`)."""

    rng: np.random.Generator
    workload: Workload


@dataclass(frozen=True, slots=True)
class PolicyKind:
    """A registered policy: its name, what it needs, and how to build a fresh `Policy` for a run.

    Its needs are declared here so that callers ask them instead of naming policies. `needs_workload`: its
    scores measure fragmentation against the target workload, so a caller without a trace (the live
    scheduler) must gather one. `deterministic`: it draws nothing from `context.rng`, so the same cluster
    and pod always get the same placement, which the planner's search relies on. `scores_alone`: a node's
    score reads that node and the pod only, nothing of the whole cluster, so nodes no pod was put on can be
    dropped without changing a decision (the planner's search then trims a passing cluster unprobed).
    """

    name: str
    build: Callable[[PolicyContext], Policy]
    needs_workload: bool = False
    deterministic: bool = True
    scores_alone: bool = True

    def __call__(self, context: PolicyContext) -> Policy:
        """`POLICIES[name](context)`: callers build a policy without knowing how it is made."""
        return self.build(context)


POLICIES: Registry[PolicyKind] = Registry()
