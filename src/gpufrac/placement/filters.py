"""The filter plugins: each decides, for every candidate node at once, whether the pod could go there.

A filter is a name, the reason a rejected node is counted under, and a vectorized predicate. They run in
the order of `FILTERS`, cheapest and most general first, so a node is reported under the most basic thing
it lacks. Every policy uses all of them: the invariants do not depend on the policy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from gpufrac.cluster.model import FULL_COMPUTE, PodDemand, compute_claim
from gpufrac.cluster.state import DOMAIN_NONE, MODE_CODE, MODE_NONE, MODE_OF_CODE, ClusterState, take_rows
from gpufrac.contract import portion_mib
from gpufrac.contract.model import ComputeMode, Mebibytes, MemoryAmount

# Reasons that other code names too: the MIG packer rejects nodes for them, the planner reads what ran out.
NOT_ENOUGH_CPU = "not enough CPU"
NOT_ENOUGH_MEMORY = "not enough memory"
TOO_MANY_PODS = "too many pods"
GPU_MODEL_NOT_ALLOWED = "GPU model not allowed"
NOT_ENOUGH_FREE_GPUS = "not enough free GPUs"
COMPUTE_CAPS_FULL = "GPU compute caps would pass 100%"


def gpus_wanted(pod: PodDemand) -> int:
    """The fewest GPUs a node must have, and the GPUs a simple pod (`is_simple`) takes: whole GPUs are
    exclusive, but a pod's shares may stack on the same GPUs, so only its widest share adds to them."""
    return pod.whole_gpus + max((share.num_devices for share in pod.shares), default=0)


def is_simple(pod: PodDemand) -> bool:
    """One share, or only whole GPUs: the shapes these filters decide exactly.

    Anything else (several share containers, or whole GPUs beside a share) is rare and goes through the
    exact per-node search in `exact`, after the filters that do not look at shares.
    """
    return len(pod.shares) + (pod.whole_gpus > 0) <= 1


def resolve(amount: MemoryAmount, gpu_mem: np.ndarray) -> np.ndarray:
    """`resolve_mib` for every GPU of every node at once."""
    if isinstance(amount, Mebibytes):
        return np.full_like(gpu_mem, amount.value)
    return portion_mib(amount.value, gpu_mem)


# Per share mode, by a GPU's mode code (`ClusterState.gpu_mode`), whether the share may join the GPU: one
# lookup per GPU rather than two comparisons and an `or`, for a filter every share decision runs.
_JOINS_MODE = {
    mode: np.array([code in (MODE_NONE, MODE_CODE[mode]) for code in range(len(MODE_CODE) + 1)])
    for mode in ComputeMode
}


class _lazy:
    """`functools.cached_property` without its lock (Python 3.11 takes one on every first read): a
    `Candidates` lives within one decision of one thread, and the filters read many of them per decision."""

    def __init__(self, compute: Callable[[Candidates], np.ndarray]) -> None:
        self._compute, self.__doc__ = compute, compute.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    def __get__(self, candidates: Candidates, owner: type | None = None) -> np.ndarray:
        value = candidates.__dict__[self._name] = self._compute(candidates)
        return value


class Candidates:
    """The arrays the filters share for one pod, over the candidate `rows`; computed once, on first use."""

    def __init__(self, state: ClusterState, pod: PodDemand, rows: np.ndarray) -> None:
        self.state, self.pod, self.rows = state, pod, rows
        self.gpu_mem = take_rows(state.gpu_mem, rows)

    @_lazy
    def open_gpus(self) -> np.ndarray:
        """Healthy GPUs not held whole: where a new tenant could go."""
        return self.state.open_gpus(self.rows)

    @_lazy
    def empty(self) -> np.ndarray:
        return self.open_gpus & (take_rows(self.state.gpu_tenants, self.rows) == 0) & (self.gpu_mem > 0)

    @_lazy
    def request_mib(self) -> np.ndarray:
        shares = self.pod.shares
        return resolve(shares[0].request, self.gpu_mem) if shares else np.zeros_like(self.gpu_mem)

    @_lazy
    def limit_mib(self) -> np.ndarray:
        shares = self.pod.shares
        if shares and shares[0].limit == shares[0].request:  # the commonest share: nothing to resolve twice
            return self.request_mib
        return resolve(shares[0].limit, self.gpu_mem) if shares else np.zeros_like(self.gpu_mem)

    @_lazy
    def memory_ok(self) -> np.ndarray:
        """GPUs with room for the share's request and enough memory for its limit."""
        room = take_rows(self.state.gpu_free, self.rows) >= self.request_mib
        return self.open_gpus & (self.request_mib >= 1) & room & (self.gpu_mem >= self.limit_mib)

    @_lazy
    def mode_ok(self) -> np.ndarray:
        """`memory_ok` GPUs whose compute mode is unset or the share's own."""
        if not _simple_share(self.pod):
            return np.zeros_like(self.empty)
        joins = _JOINS_MODE[self.pod.shares[0].mode]
        return self.memory_ok & joins.take(take_rows(self.state.gpu_mode, self.rows))

    @_lazy
    def share_ok(self) -> np.ndarray:
        """`domain_ok` GPUs where the share's compute claim still fits, on nodes that guarantee compute; on
        every other node, and for a share that claims none, just `domain_ok`."""
        claim = _claim(self.pod)
        if not claim:
            return self.domain_ok
        guaranteed = self.state.compute_guarantee[self.rows]
        if not guaranteed.any():
            return self.domain_ok
        room = take_rows(self.state.gpu_compute, self.rows) + claim <= FULL_COMPUTE
        return self.domain_ok & (room | ~guaranteed[..., None])

    @property
    def usable(self) -> np.ndarray:
        """The GPUs the pod could take: its share's (`share_ok`), empty ones for whole GPUs, none for a pod
        without GPUs."""
        if self.pod.shares:
            return self.share_ok
        return self.empty if self.pod.whole_gpus else np.zeros(self.gpu_mem.shape, bool)

    @_lazy
    def domain_ok(self) -> np.ndarray:
        """`mode_ok` GPUs, and for an sm-sharing share only those whose sm-sharing shares, if any, are of the
        pod's own fault domain."""
        if not (self.pod.shares and self.pod.shares[0].mode is ComputeMode.SM_SHARING):
            return self.mode_ok
        domain = self.state.domains.get(self.pod.fault_domain, -1)
        domains = take_rows(self.state.gpu_domain, self.rows)
        return self.mode_ok & ((domains == DOMAIN_NONE) | (domains == domain))


@dataclass(frozen=True, slots=True)
class Filter:
    """`on_gpus`: the filter counts a node's GPUs and rejects only nodes with fewer `Candidates.usable` GPUs
    than the pod takes (`gpus_wanted`), so for a simple pod (`is_simple`) a node with enough usable GPUs
    passes it: the engine then checks that count once instead of each such filter (`fit._passes`)."""

    name: str
    passes: Callable[[Candidates], np.ndarray]
    why: str | Callable[[PodDemand], str]
    applies: Callable[[PodDemand], bool] = lambda pod: pod.wants_gpu
    on_gpus: bool = False

    def reason(self, pod: PodDemand) -> str:
        return self.why if isinstance(self.why, str) else self.why(pod)


def _allowed_model(c: Candidates) -> np.ndarray:
    models = c.pod.models or frozenset()
    allowed = np.array([model in models for model in c.state.models])  # by model id
    return allowed[c.state.model_id[c.rows]]


def _scalars_left(c: Candidates) -> np.ndarray:
    """Nodes with enough of every other resource the pod requests; none where no node offers one of them."""
    enough = np.ones(len(c.rows), bool)
    for name, amount in c.pod.scalars:
        free = c.state.scalar_free.get(name)
        if free is None:
            return np.zeros(len(c.rows), bool)
        enough &= free[c.rows] >= amount
    return enough


def _devices(c: Candidates) -> int:
    return c.pod.shares[0].num_devices


def _simple_share(pod: PodDemand) -> bool:
    return bool(pod.shares) and is_simple(pod)


def _claim(pod: PodDemand) -> int:
    """The compute claim of a simple pod's share (0 for any other pod)."""
    share = pod.shares[0] if _simple_share(pod) else None
    return 0 if share is None else compute_claim(share.mode, share.compute_percent)


FILTERS: tuple[Filter, ...] = (
    Filter("cpu", lambda c: c.state.cpu_free[c.rows] >= c.pod.cpu_milli, NOT_ENOUGH_CPU, lambda pod: True),
    Filter(
        "memory",
        lambda c: c.state.mem_free[c.rows] >= c.pod.memory_mib,
        NOT_ENOUGH_MEMORY,
        lambda pod: True,
    ),
    Filter("pods", lambda c: c.state.pods_free[c.rows] >= 1, TOO_MANY_PODS, lambda pod: True),
    Filter(
        "scalars",
        _scalars_left,
        lambda pod: f"not enough {', '.join(name for name, _ in pod.scalars)}",
        lambda pod: bool(pod.scalars),
    ),
    Filter(
        "gpu-count", lambda c: c.state.gpu_count[c.rows] >= gpus_wanted(c.pod), "too few GPUs", on_gpus=True
    ),
    Filter(
        "gpu-model",
        _allowed_model,
        GPU_MODEL_NOT_ALLOWED,
        lambda pod: pod.wants_gpu and pod.models is not None,
    ),
    Filter(
        "gpu-health", lambda c: np.logical_or.reduce(c.open_gpus, axis=1), "no healthy free GPU", on_gpus=True
    ),
    Filter(
        "whole-gpus",
        lambda c: c.empty.sum(axis=1) >= c.pod.whole_gpus,
        NOT_ENOUGH_FREE_GPUS,
        lambda pod: pod.whole_gpus > 0,
        on_gpus=True,
    ),
    Filter(
        "gpu-memory",
        lambda c: c.memory_ok.sum(axis=1) >= _devices(c),
        "not enough GPU memory",
        _simple_share,
        on_gpus=True,
    ),
    Filter(
        "gpu-mode",
        lambda c: c.mode_ok.sum(axis=1) >= _devices(c),
        lambda pod: f"GPU mode is {MODE_OF_CODE[3 - MODE_CODE[pod.shares[0].mode]]}",
        _simple_share,
        on_gpus=True,
    ),
    Filter(
        "fault-domain",
        lambda c: c.domain_ok.sum(axis=1) >= _devices(c),
        "sm-sharing GPUs hold another fault domain's shares",
        lambda pod: _simple_share(pod) and pod.shares[0].mode is ComputeMode.SM_SHARING,
        on_gpus=True,
    ),
    Filter(
        "gpu-compute",
        lambda c: c.share_ok.sum(axis=1) >= _devices(c),
        COMPUTE_CAPS_FULL,
        lambda pod: _claim(pod) > 0,
        on_gpus=True,
    ),
)
