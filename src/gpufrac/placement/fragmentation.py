"""The fragmentation measure of Weng et al. (ATC '23), in thousandths of a GPU.

F_n(m), node n's fragmentation as seen by a task shape m, is every unallocated GPU share on n when m cannot
run there at all (CPU, GPU model, GPU share) or asks for no GPU; otherwise it is the unallocated share of
the GPUs too empty-handed to take m's per-GPU demand. F_n(M) weighs that over the target workload M.
Functions here take the free share of hypothetical nodes as arrays so that FGD can ask "what if" for every
candidate GPU at once.
"""

from __future__ import annotations

import numpy as np

from gpufrac.cluster.state import ClusterState, take_rows
from gpufrac.placement.cache import NodeMemo
from gpufrac.placement.workload import Workload

# `ndarray.sum` without the Python function numpy wraps it in: FGD sums a handful of small arrays per node
# it scores, and that wrapper cost more than some of the sums.
_sum = np.add.reduce


def usable_free_milli(state: ClusterState, rows: np.ndarray | slice = slice(None)) -> np.ndarray:
    """Free share per GPU in thousandths, zero where no new task could land (unhealthy, held whole)."""
    return state.usable_free_milli(rows)


def node_fragmentation(
    free: np.ndarray, cpu_free: np.ndarray, model_ok: np.ndarray, workload: Workload
) -> np.ndarray:
    """F_n(M) for nodes given as `free` (..., GPUs), `cpu_free` (...) and `model_ok` (..., shapes).

    Leading dimensions are free: the measure is the same for any batch of hypothetical nodes.
    """
    below = free[..., :, None] < workload.milli  # (..., GPUs, shapes)
    stranded = _sum(free[..., :, None] * below, axis=-2)  # free share on GPUs too small for each shape
    roomy = _sum(~below, axis=-2)  # GPUs with room for each shape's per-GPU demand
    return _weighed(_sum(free, axis=-1), stranded, roomy, cpu_free, model_ok, workload)


def fragmentation_after_share(
    free: np.ndarray, cpu_free: np.ndarray, model_ok: np.ndarray, need: np.ndarray, workload: Workload
) -> np.ndarray:
    """(nodes, GPUs): F_n(M) once a share of `need` (per node, milli) lands on each GPU in turn, for nodes
    given as `node_fragmentation` takes them (one leading dimension) and `cpu_free` already net of the pod.

    Equal to `node_fragmentation` of every such hypothetical node, but built from the node's own sums by
    taking out the one GPU that changes, so FGD scores all candidate GPUs at the cost of one node each.
    """
    _, after = _sums_around_share(free, need, workload)
    return _weighed(*after, cpu_free[:, None], model_ok[:, None, :], workload)


def growth_after_share(
    free: np.ndarray,
    cpu_free: np.ndarray,
    cpu_after: np.ndarray,
    model_ok: np.ndarray,
    need: np.ndarray,
    workload: Workload,
) -> np.ndarray:
    """(nodes, GPUs): `fragmentation_after_share` (with `cpu_after` free) less the nodes' own F_n(M) as
    `node_fragmentation` measures them (with `cpu_free`), to the last bit. The node's own sums, which the
    hypothetical nodes are built from, give the latter without measuring the nodes again."""
    now, after = _sums_around_share(free, need, workload)
    before = _weighed(*now, cpu_free, model_ok, workload)
    return _weighed(*after, cpu_after[:, None], model_ok[:, None, :], workload) - before[:, None]


Sums = tuple[np.ndarray, np.ndarray, np.ndarray]  # `_weighed`'s free share, stranded share, GPUs with room


def _sums_around_share(free: np.ndarray, need: np.ndarray, workload: Workload) -> tuple[Sums, Sums]:
    """The sums `_weighed` takes of the nodes as they are (as `node_fragmentation` makes them), and of the
    nodes once a share of `need` lands on each GPU in turn (nodes, GPU, shapes)."""
    milli = workload.milli
    now = free[:, :, None]  # (nodes, GPU that takes the share, shapes)
    then = now - need[:, None, None]
    roomy_on, roomy_on_after = now >= milli, then >= milli
    stranded_on = np.where(roomy_on, 0, now)  # per GPU, its free share if too small for the shape
    stranded, roomy, total = _sum(stranded_on, axis=1), _sum(roomy_on, axis=1), _sum(free, axis=1)
    stranded_after = stranded[:, None, :] - stranded_on + np.where(roomy_on_after, 0, then)
    roomy_after = roomy[:, None, :] - roomy_on + roomy_on_after
    return (total, stranded, roomy), ((total - need)[:, None], stranded_after, roomy_after)


def _weighed(
    total: np.ndarray,
    stranded: np.ndarray,
    roomy: np.ndarray,
    cpu_free: np.ndarray,
    model_ok: np.ndarray,
    workload: Workload,
) -> np.ndarray:
    """F_n(M) from a node's free share, and per shape its stranded share and its GPUs with room."""
    gpus = workload.gpus
    # What does not depend on the GPU that takes a share first: `model_ok` and `cpu_free` may lack that
    # axis, so only one `&` is as large as `roomy`.
    fits = (roomy >= gpus) & ((cpu_free[..., None] >= workload.cpu) & model_ok & (gpus > 0))
    per_shape = np.where(fits, stranded, total[..., None])
    # Summed along the shapes for each node on its own (not a matrix product, whose rounding depends on how
    # many nodes are measured at once), so that a node measures the same however it is batched.
    return _sum(per_shape * workload.weights, axis=-1)


def cluster_fragmentation(
    state: ClusterState, workload: Workload, memo: NodeMemo | None = None
) -> np.ndarray:
    """F_n(M) for every active node; their sum is the cluster's fragmentation."""
    return fragmentation_of(state, workload, np.flatnonzero(state.active), memo)


def fragmentation_of(
    state: ClusterState, workload: Workload, rows: np.ndarray, memo: NodeMemo | None = None
) -> np.ndarray:
    """F_n(M) for the nodes at `rows`. With a `memo` (one per workload, from `fragmentation_memo`) only the
    nodes that changed since they were last measured are measured again."""
    if memo is None:
        return _measured(state, rows, workload)
    entry = memo.refreshed(state, None, rows, lambda stale: (_measured(state, rows[stale], workload),))
    return entry["fragmentation"][rows]


def fragmentation_memo() -> NodeMemo:
    return NodeMemo("fragmentation")


def model_ok_of(state: ClusterState, workload: Workload, rows: np.ndarray) -> np.ndarray:
    """(nodes at `rows`, shapes): whether each node's GPU model can host each of the workload's shapes."""
    return take_rows(workload.model_ok(state.models), state.model_id[rows])


def _measured(state: ClusterState, rows: np.ndarray, workload: Workload) -> np.ndarray:
    model_ok = model_ok_of(state, workload, rows)
    return node_fragmentation(usable_free_milli(state, rows), state.cpu_free[rows], model_ok, workload)
