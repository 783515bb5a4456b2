"""The fragmentation measure of Weng et al. (ATC '23), in thousandths of a GPU.

F_n(m), node n's fragmentation as seen by a task shape m, is every unallocated GPU share on n when m cannot
run there at all (CPU, GPU model, GPU share) or asks for no GPU; otherwise it is the unallocated share of
the GPUs too empty-handed to take m's per-GPU demand. F_n(M) weighs that over the target workload M.
Functions here take the free share of hypothetical nodes as arrays so that FGD can ask "what if" for every
candidate GPU at once.
"""

from __future__ import annotations

import numpy as np

from gpufrac.cluster.state import ClusterState
from gpufrac.placement.workload import Workload


def usable_free_milli(state: ClusterState, rows: np.ndarray | slice = slice(None)) -> np.ndarray:
    """Free share per GPU in thousandths, zero where no new task could land (unhealthy, held whole)."""
    return state.usable_free_milli(rows)


def node_fragmentation(
    free: np.ndarray, cpu_free: np.ndarray, model_ok: np.ndarray, workload: Workload
) -> np.ndarray:
    """F_n(M) for nodes given as `free` (..., GPUs), `cpu_free` (...) and `model_ok` (..., shapes).

    Leading dimensions are free: FGD passes (nodes, candidate GPUs) to score every candidate at once.
    """
    milli, gpus, cpu = workload.milli, workload.gpus, workload.cpu
    total = free.sum(axis=-1)
    below = free[..., :, None] < milli  # (..., GPUs, shapes)
    stranded = (free[..., :, None] * below).sum(axis=-2)  # free share on GPUs too small for each shape
    gpu_fits = (~below).sum(axis=-2) >= gpus  # enough GPUs with room for the per-GPU demand
    fits = gpu_fits & (cpu_free[..., None] >= cpu) & model_ok & (gpus > 0)
    per_shape = np.where(fits, stranded, total[..., None])
    return per_shape @ workload.weights


def cluster_fragmentation(state: ClusterState, workload: Workload) -> np.ndarray:
    """F_n(M) for every active node; their sum is the cluster's fragmentation."""
    rows = np.flatnonzero(state.active)
    model_ok = workload.model_ok(state.models)[state.model_id[rows]]
    return node_fragmentation(usable_free_milli(state, rows), state.cpu_free[rows], model_ok, workload)
