"""Which nodes can take a pod, and why the others cannot: every filter as one vectorized pass.

Filters run in a fixed order and a node is counted under the first reason that rejects it, the way
kube-scheduler reports "0/N nodes are available". The result also carries, per feasible node, which GPUs
can take the pod's share and which are empty, so that scorers and GPU pickers need not recompute them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from gpufrac.cluster.model import PodDemand
from gpufrac.cluster.state import MODE_CODE, MODE_NONE, MODE_OF_CODE, ClusterState
from gpufrac.contract.model import Mebibytes, MemoryAmount


@dataclass(frozen=True, slots=True)
class Fit:
    """Where a pod fits. Arrays are indexed by position in `rows`, the feasible node rows."""

    pod: PodDemand
    rows: np.ndarray
    share_ok: np.ndarray  # (len(rows), width) GPUs that can take the pod's (single) share
    empty: np.ndarray  # (len(rows), width) healthy GPUs with no tenant, for whole-GPU use
    request_mib: np.ndarray  # (len(rows), width) the share's request resolved on each GPU
    limit_mib: np.ndarray

    gpu_mem: np.ndarray

    def per_gpu_milli(self) -> np.ndarray:
        """Per feasible node, the pod's per-GPU demand in thousandths of that node's GPUs (the paper's
        unit): 1000 for whole GPUs, 0 for CPU-only pods."""
        if not self.pod.shares:
            return np.full(len(self.rows), 1000 if self.pod.whole_gpus else 0, np.int64)
        memory = np.maximum(self.gpu_mem[:, 0], 1)
        return -(-self.request_mib[:, 0] * 1000 // memory)

    def gpu_total_milli(self) -> np.ndarray:
        """Per feasible node, the pod's whole GPU demand in thousandths."""
        return self.per_gpu_milli() * (self.pod.whole_gpus + sum(s.num_devices for s in self.pod.shares))


def gpus_wanted(pod: PodDemand) -> int:
    """The fewest GPUs a node must have: whole GPUs are exclusive, but a pod's shares may stack on the same
    GPUs, so only its widest share adds to them."""
    return pod.whole_gpus + max((share.num_devices for share in pod.shares), default=0)


def is_simple(pod: PodDemand) -> bool:
    """One share, or only whole GPUs: the shapes the vectorized path decides exactly.

    Anything else (several share containers, or whole GPUs beside a share) is rare and goes through the
    exact per-node search in `engine`.
    """
    return len(pod.shares) + (pod.whole_gpus > 0) <= 1


def resolve(amount: MemoryAmount, gpu_mem: np.ndarray) -> np.ndarray:
    """`resolve_mib` for every GPU of every node at once."""
    if isinstance(amount, Mebibytes):
        return np.full_like(gpu_mem, amount.value)
    return amount.value.numerator * gpu_mem // amount.value.denominator


def find_fit(
    state: ClusterState, pod: PodDemand, *, rows: np.ndarray | None = None
) -> tuple[Fit, Counter[str]]:
    """Feasible nodes for `pod` among `rows` (default: all active nodes), and rejections by reason."""
    if rows is None:
        rows = np.flatnonzero(state.active)
    rejected: Counter[str] = Counter()
    alive = np.ones(len(rows), bool)

    def reject(failing: np.ndarray, reason: str) -> None:
        newly = alive & failing
        if newly.any():
            rejected[reason] += int(newly.sum())
            alive[newly] = False

    reject(state.cpu_free[rows] < pod.cpu_milli, "not enough CPU")
    reject(state.mem_free[rows] < pod.memory_mib, "not enough memory")
    gpu_mem = state.gpu_mem[rows]
    empty = state.gpu_healthy[rows] & (state.gpu_tenants[rows] == 0) & (gpu_mem > 0)
    share_ok = np.zeros_like(empty)
    request = limit = np.zeros_like(gpu_mem)
    if pod.wants_gpu:
        reject(state.gpu_count[rows] < gpus_wanted(pod), "too few GPUs")
        if pod.models is not None:
            allowed = [i for i, model in enumerate(state.models) if model in pod.models]
            reject(~np.isin(state.model_id[rows], allowed), "GPU model not allowed")
        open_gpus = state.gpu_healthy[rows] & ~state.gpu_whole[rows]
        reject(~np.any(open_gpus, axis=1), "no healthy free GPU")
        if pod.whole_gpus:
            reject(empty.sum(axis=1) < pod.whole_gpus, "not enough free GPUs")
        if pod.shares and is_simple(pod):
            share = pod.shares[0]
            request, limit = resolve(share.request, gpu_mem), resolve(share.limit, gpu_mem)
            usable = state.gpu_healthy[rows] & ~state.gpu_whole[rows] & (request >= 1)
            memory_ok = usable & (state.gpu_free[rows] >= request) & (gpu_mem >= limit)
            reject(memory_ok.sum(axis=1) < share.num_devices, "not enough GPU memory")
            modes = state.gpu_mode[rows]
            code = MODE_CODE[share.mode]
            share_ok = memory_ok & ((modes == MODE_NONE) | (modes == code))
            other = MODE_OF_CODE[3 - code]
            reject(share_ok.sum(axis=1) < share.num_devices, f"GPU mode is {other}")
    keep = np.flatnonzero(alive)
    fit = Fit(
        pod=pod,
        rows=rows[keep],
        share_ok=share_ok[keep],
        empty=empty[keep],
        request_mib=request[keep],
        limit_mib=limit[keep],
        gpu_mem=gpu_mem[keep],
    )
    return fit, rejected
