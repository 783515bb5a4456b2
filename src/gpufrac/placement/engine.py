"""`decide(state, pod, policy)`: filter, score, break ties, pick GPUs. No I/O, no mutation.

The scheduler and the simulator both call this, then `ClusterState.apply` the result, so the simulator's
numbers are the scheduler's behaviour.
"""

from __future__ import annotations

import numpy as np

from gpufrac.cluster.model import Assignment, Placement, PodDemand, Unschedulable, whole_assignments
from gpufrac.cluster.state import ClusterState
from gpufrac.placement import exact
from gpufrac.placement.cache import Hashed
from gpufrac.placement.filters import is_simple
from gpufrac.placement.fit import Fit, find_fit
from gpufrac.placement.framework import Policy
from gpufrac.placement.reserve import KEPT_WHOLE


def decide(
    state: ClusterState,
    pod: PodDemand,
    policy: Policy,
    *,
    rows: np.ndarray | None = None,
    shape: Hashed | None = None,
) -> Placement | Unschedulable:
    """Where `pod` goes among `rows` (default: every active node). The caller applies the result. `shape`:
    the pod's `Hashed(shape_key(pod))`, from a caller that keeps one per kind of pod (`find_fit`)."""
    fit = find_fit(state, pod, rows=rows, memo=policy.fits, shape=shape, verdicts=policy.verdicts)
    outcome: Placement | Unschedulable
    if not is_simple(pod):
        outcome = exact.decide(state, fit)
    elif len(fit.rows) == 0:
        return Unschedulable(pod.name, dict(fit.rejected))
    else:
        outcome = _chosen(state, fit, policy)
    reserve = policy.reserve
    if reserve is not None and isinstance(outcome, Placement) and reserve.refuses(state, outcome):
        # The policy opened an empty GPU the reserve keeps: its choice among the GPUs already in use, if any
        # has room (a policy that spreads opens one where a used GPU would do).
        used = fit.narrowed(state.gpu_tenants > 0, Hashed((KEPT_WHOLE, fit.shape.value)))
        if not is_simple(pod) or len(used.rows) == 0:
            return Unschedulable(pod.name, dict(fit.rejected) | {KEPT_WHOLE: len(fit.rows)})
        return _chosen(state, used, policy)
    return outcome


def _chosen(state: ClusterState, fit: Fit, policy: Policy) -> Placement:
    """The policy's node among the feasible ones, and its GPUs there."""
    at = best(state, fit, policy.scorer.score(state, fit))
    return placement_for(state, fit, at, policy.picker.pick(state, fit, at))


def best(state: ClusterState, fit: Fit, scores: np.ndarray) -> int:
    """The position of the highest score; among equals, the node with the lowest tie rank."""
    tied = (scores == scores.max()).nonzero()[0]
    if tied.size == 1:  # most decisions of the paper's scorers: no ranks to read
        return int(tied[0])
    return int(tied[state.tie_rank[fit.rows[tied]].argmin()])


def placement_for(state: ClusterState, fit: Fit, at: int, gpus: tuple[int, ...]) -> Placement:
    pod = fit.pod
    row = int(fit.rows[at])
    assignments: tuple[Assignment, ...] = ()
    if pod.shares:
        share = pod.shares[0]
        on_node = fit.on(at)
        # On a node whose GPUs differ in size a portion resolves differently per GPU; the smallest
        # resolution is the one every chosen GPU can guarantee.
        assignments = (
            Assignment(
                container=share.container,
                gpus=gpus,
                request_mib=min(int(on_node.request_mib[gpu]) for gpu in gpus),
                limit_mib=min(int(on_node.limit_mib[gpu]) for gpu in gpus),
                mode=share.mode,
                compute_percent=share.compute_percent,
            ),
        )
    elif pod.whole_gpus:
        assignments = whole_assignments(pod, gpus, state.gpu_mem[row])
    return Placement(
        pod=pod.name,
        node=state.names[row],
        cpu_milli=pod.cpu_milli,
        memory_mib=pod.memory_mib,
        assignments=assignments,
        fault_domain=pod.fault_domain,
        scalars=pod.scalars,
    )
