"""The target workload: the pod shapes a cluster expects, with how often each arrives.

Fragmentation is only meaningful against a workload (a half-free GPU is free space for a 0.5 task and
waste for a whole-GPU task), so the FGD policy and the fragmentation measure both take one. Following
Weng et al., it is the most common shapes of a trace, taken until they cover 95% of its pods, with their
frequencies renormalised.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from gpufrac.cluster.model import PodDemand, milli_of


@dataclass(frozen=True, slots=True)
class Shape:
    cpu_milli: int
    gpus: int  # GPUs asked for: 1 for a share, N for N whole GPUs, 0 for CPU-only
    milli: int  # per-GPU demand in thousandths (1000 for whole GPUs, 0 for CPU-only)
    models: frozenset[str] | None = None


@dataclass(frozen=True, slots=True)
class Workload:
    shapes: tuple[Shape, ...]
    weights: np.ndarray  # sums to 1
    # Per shape, as arrays: built once, since the fragmentation measure reads them for every FGD decision.
    cpu: np.ndarray = field(init=False, repr=False, compare=False)
    milli: np.ndarray = field(init=False, repr=False, compare=False)
    gpus: np.ndarray = field(init=False, repr=False, compare=False)
    _model_ok: dict[tuple[str, ...], np.ndarray] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        for name, attribute in (("cpu", "cpu_milli"), ("milli", "milli"), ("gpus", "gpus")):
            column = np.array([getattr(shape, attribute) for shape in self.shapes], np.int64)
            object.__setattr__(self, name, column)

    @classmethod
    def from_pods(
        cls,
        pods: Iterable[PodDemand],
        *,
        coverage: float = 0.95,
        reference_gpu_mib: int = 16384,
        max_shapes: int | None = None,
    ) -> Workload:
        """The most common shapes of `pods`, at most `max_shapes` of them; an absolute MiB request counts as a
        portion of a `reference_gpu_mib` GPU, since a workload of shapes has no particular GPU in mind."""
        counts = Counter(shape_of(pod, reference_gpu_mib=reference_gpu_mib) for pod in pods)
        total = sum(counts.values())
        chosen: list[tuple[Shape, int]] = []
        covered = 0
        # Most common first; among equally common shapes the larger one first, as the paper's simulator.
        for shape, count in sorted(counts.items(), key=lambda item: (item[1], _order(item[0])), reverse=True):
            if (total and covered >= coverage * total) or len(chosen) == max_shapes:
                break
            chosen.append((shape, count))
            covered += count
        weights = np.array([count for _, count in chosen], float)
        return cls(tuple(shape for shape, _ in chosen), weights / max(weights.sum(), 1.0))

    def model_ok(self, models: list[str]) -> np.ndarray:
        """(number of known models, shapes): whether a node of each model can host each shape. Kept per list
        of models, since FGD asks on every decision and a cluster's models rarely change."""
        key = tuple(models)
        known = self._model_ok.get(key)
        if known is None:
            known = self._model_ok[key] = np.array(
                [[shape.models is None or model in shape.models for shape in self.shapes] for model in key],
                bool,
            ).reshape(len(key), len(self.shapes))
        return known


def shape_of(pod: PodDemand, *, reference_gpu_mib: int) -> Shape:
    if pod.whole_gpus:
        return Shape(pod.cpu_milli, pod.whole_gpus, 1000, pod.models)
    if pod.shares:
        share = pod.shares[0]
        milli = milli_of(share.request, reference_gpu_mib)
        return Shape(pod.cpu_milli, share.num_devices, min(milli, 1000), pod.models)
    return Shape(pod.cpu_milli, 0, 0, pod.models)


def _order(shape: Shape) -> tuple[int, int, int, str]:
    return (shape.cpu_milli, shape.milli, shape.gpus, ",".join(sorted(shape.models or ())))
