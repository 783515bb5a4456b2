"""`spread`: the emptiest node and the emptiest GPU win: fewer co-tenants, more burst headroom.

binpack's opposite, on binpack's own measure of how requested a node's GPU memory is.
"""

from __future__ import annotations

import numpy as np

from gpufrac.cluster.state import ClusterState
from gpufrac.placement.fit import Fit
from gpufrac.placement.framework import POLICIES, PerNode, Policy, PolicyKind
from gpufrac.placement.pickers import WorstFitGpu
from gpufrac.placement.policies.binpack import requested_after


class LeastRequested:
    def score(self, state: ClusterState, fit: Fit) -> np.ndarray:
        return np.trunc(100 * (1 - requested_after(state, fit))).astype(np.int64)


POLICIES.register(PolicyKind("spread", lambda context: Policy(PerNode(LeastRequested()), WorstFitGpu())))
