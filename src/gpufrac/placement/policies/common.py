"""Node aggregates the paper's scorers share, in its units (milli-CPU, milli-GPU)."""

from __future__ import annotations

import numpy as np

from gpufrac.cluster.state import ClusterState
from gpufrac.placement.fit import Fit
from gpufrac.placement.fragmentation import usable_free_milli

# The paper's simulator scales CPU and GPU by a 128-core, 8-GPU node whatever the node's real size.
CPU_SCALE = 128_000
GPU_SCALE = 8_000


def free_gpu_milli(state: ClusterState, fit: Fit) -> np.ndarray:
    return usable_free_milli(state, fit.rows).sum(axis=1)


def truncate(values: np.ndarray) -> np.ndarray:
    """Scores are whole numbers, truncated toward zero, as Go's int64() conversion does; the resulting
    ties are part of each policy's behaviour."""
    return np.trunc(values).astype(np.int64)
