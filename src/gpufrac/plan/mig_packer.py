"""MIG's own packer: an instance needs free memory slices at an allowed start, not just free memory.

Each GPU is an 8-bit mask of occupied memory slices (`mig.py`); a GPU without MIG takes one tenant whole.
A share becomes, on each candidate GPU, the smallest profile of that GPU's model that holds its request;
whole-GPU requests take whole GPUs (7g on a MIG GPU). Node choice follows the engine's `bestfit` score,
so that MIG and the engine strategies are compared under the same packing rule: the node left with the
least CPU and GPU wins (a free slice counts as 1/8 GPU), ties go to the earlier node. On that node the
instances go where the fewest slices stay free, at the start slot `mig.start_table` picks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpufrac.cluster.model import NodeSpec, PodDemand, Unschedulable, resolve_mib
from gpufrac.placement import filters
from gpufrac.placement.policies import bestfit
from gpufrac.plan import mig
from gpufrac.plan.packer import PodUse


@dataclass(frozen=True, slots=True)
class _Held:
    row: int
    cpu_milli: int
    memory_mib: int
    container: str
    gpus: tuple[int, ...]
    masks: tuple[int, ...]
    allocated_mib: int


class MigPacker:
    def __init__(self, nodes: Sequence[NodeSpec]) -> None:
        self.names = [node.name for node in nodes]
        self.models = sorted({node.model for node in nodes})
        width = max((len(node.gpus) for node in nodes), default=0)
        self.model_id = np.array([self.models.index(node.model) for node in nodes], np.int64)
        self.cpu_free = np.array([node.cpu_milli for node in nodes], np.int64)
        self.mem_free = np.array([node.memory_mib for node in nodes], np.int64)
        self.gpu_mib = np.zeros((len(nodes), width), np.int64)
        self.mask = np.full((len(nodes), width), mig.FULL_MASK, np.int64)  # missing GPUs look full
        for row, node in enumerate(nodes):
            for gpu in node.gpus:
                self.gpu_mib[row, gpu.index] = gpu.memory_mib
                self.mask[row, gpu.index] = 0 if gpu.healthy else mig.FULL_MASK
        self.exists = self.gpu_mib > 0
        depth = max(len(mig.profiles(model)) for model in self.models) if nodes else 1
        # (model, profile, mask) -> start slot or -1, padded with -1 for models with fewer profiles.
        self.starts = np.full((len(self.models), depth, mig.FULL_MASK + 1), -1, np.int64)
        for index, model in enumerate(self.models):
            table = mig.start_table(model)
            self.starts[index, : table.shape[0]] = table
        self.held: dict[str, _Held] = {}

    def _profiles_for(self, pod: PodDemand) -> tuple[list[int], int, str]:
        """Per model, the index of the profile each of the pod's GPUs gets (-1: the GPU is too small);
        how many GPUs; which container."""
        if pod.whole_gpus:
            return (
                [len(mig.profiles(model)) - 1 for model in self.models],
                pod.whole_gpus,
                pod.whole[0].container,
            )
        share = pod.shares[0]
        chosen = []
        for index, model in enumerate(self.models):
            memory = int(self.gpu_mib[self.model_id == index].max(initial=0))
            fit = mig.smallest_fit(model, resolve_mib(share.request, memory), memory) if memory else None
            chosen.append(-1 if fit is None else fit)
        return chosen, share.num_devices, share.container

    def place(self, pod: PodDemand) -> str | Unschedulable:
        if not filters.is_simple(pod):
            raise ValueError(f"pod {pod.name}: the MIG packer takes whole GPUs or one share, not both")
        reasons: dict[str, int] = {}
        alive = np.ones(len(self.names), bool)

        def reject(failing: np.ndarray, reason: str) -> None:
            newly = alive & failing
            if newly.any():
                reasons[reason] = int(newly.sum())
                alive[newly] = False

        reject(self.cpu_free < pod.cpu_milli, filters.NOT_ENOUGH_CPU)
        reject(self.mem_free < pod.memory_mib, filters.NOT_ENOUGH_MEMORY)
        if pod.models is not None:
            allowed = [i for i, model in enumerate(self.models) if model in pod.models]
            reject(~np.isin(self.model_id, allowed), filters.GPU_MODEL_NOT_ALLOWED)
        free = (mig.MEMORY_SLICES - mig.POPCOUNT[self.mask]) * self.exists
        chosen: list[int] = []
        wanted, container = 0, ""
        size = np.zeros(len(self.models), np.int64)
        starts = np.full(self.mask.shape, -1, np.int64)
        if pod.wants_gpu:
            chosen, wanted, container = self._profiles_for(pod)
            size = np.array(
                [mig.profiles(m)[i].memory if i >= 0 else 0 for m, i in zip(self.models, chosen, strict=True)]
            )
            index = np.array(chosen, np.int64)[self.model_id]
            starts = np.where(
                index[:, None] >= 0, self.starts[self.model_id[:, None], index[:, None], self.mask], -1
            )
            short = (starts >= 0).sum(axis=1) < wanted
            reject(short, "no free GPU or MIG slot" if pod.shares else filters.NOT_ENOUGH_FREE_GPUS)
        rows = np.flatnonzero(alive)
        if len(rows) == 0:
            return Unschedulable(pod.name, reasons)
        # The engine's bestfit score, in its units: milli-CPU and milli-GPU left on the node afterwards.
        cpu_left = self.cpu_free[rows] - pod.cpu_milli
        gpu_left = 1000 * (free[rows].sum(axis=1) - wanted * size[self.model_id[rows]]) // mig.MEMORY_SLICES
        scores = bestfit.least_left(cpu_left, gpu_left)
        row = int(rows[np.argmax(scores)])  # the first of the best: the earliest node
        candidates = np.flatnonzero(starts[row] >= 0)
        gpus = tuple(
            sorted(int(g) for g in candidates[np.argsort(free[row, candidates], kind="stable")][:wanted])
        )
        allocated = 0
        masks = []
        if gpus:
            profile = mig.profiles(self.models[self.model_id[row]])[chosen[int(self.model_id[row])]]
            masks = [profile.mask(int(starts[row, gpu])) for gpu in gpus]
            allocated = profile.capacity_mib(int(self.gpu_mib[row, gpus[0]]))
            for gpu, mask in zip(gpus, masks, strict=True):
                self.mask[row, gpu] |= mask
        self.cpu_free[row] -= pod.cpu_milli
        self.mem_free[row] -= pod.memory_mib
        self.held[pod.name] = _Held(
            row, pod.cpu_milli, pod.memory_mib, container, gpus, tuple(masks), allocated
        )
        return self.names[row]

    def release(self, pod: str) -> None:
        held = self.held.pop(pod)
        self.cpu_free[held.row] += held.cpu_milli
        self.mem_free[held.row] += held.memory_mib
        for gpu, mask in zip(held.gpus, held.masks, strict=True):
            self.mask[held.row, gpu] &= ~mask

    def busy_gpus(self) -> int:
        return int(((self.mask != 0) & self.exists).sum())

    def uses(self) -> list[PodUse]:
        return [
            PodUse(pod, held.container, self.names[held.row], held.gpus, held.allocated_mib, sm_sharing=False)
            for pod, held in self.held.items()
            if held.gpus
        ]
