"""`fgd-stranding`: FGD that also counts the GPUs a placement strands behind a node's CPU.

FGD's fragmentation sees a GPU as usable whenever some shape of the target workload fits on it, but on the
openb cluster most GPUs sit on nodes with about as many cores per GPU as a typical pod asks for, so CPU runs
out first: at the end of an FGD replay most fully free GPUs are on nodes with almost no cores left. A
node's *stranded* capacity is its free GPU share beyond what its free CPU can still feed at the workload's
median CPU per GPU (cores per 1000 milli-GPU, weighted over the GPU shapes of the target workload), and
this policy adds `STRANDING_WEIGHT` × the growth of that stranded share to FGD's Δ before FGD's
whole-number scoring.

Where the workload asks more CPU than the cluster has once its GPUs are all requested (`cpu_pressure` over
1), its CPU-only pods must take cores beside GPUs wherever they land, so a GPU is fed only by the CPU the
whole workload asks per GPU, times the pressure (`feed_rate`).

Steering by CPU has a cost where pods may run only on some GPU models: nodes with many cores per GPU never
strand, and the term would send pods that may run anywhere onto the models the restricted pods need. So
taking a GPU of model m also costs `MODEL_NEED_WEIGHT` × the pod's milli-GPU × `model_need`: how much of
m's GPUs the workload's model-restricted pods need, relative to m's share of the cluster.

FGD's fragmentation measure counts a partly used GPU's free share h as lost to each shape larger than h,
weighted by how often the shape arrives, so it sees no difference between a hole some common share will
fill later and one nothing but a rare small share ever fills. So a share also costs `HOLE_WEIGHT` × the
growth of its GPU's `expected_waste`: the share of that GPU expected to stay unused, if pods keep arriving
in the workload's proportions and each share that fits is put there.

FGD's integer rounding and its ties are kept on purpose (finer scores lose about 0.4 points); among equal
scores the pod takes the GPU it leaves the least free share on (best fit), then the fixed node order, as
FGD. The constants are frozen, chosen on the default openb trace, seeds 42-51 (the CPU-pressure rule on the
cpu traces, the same seeds), never per trace: the README ("Beyond FGD") gives what each term gains and the
alternatives measured.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpufrac.cluster.state import ClusterState
from gpufrac.placement.fit import Fit
from gpufrac.placement.framework import POLICIES, Policy, PolicyContext, PolicyKind
from gpufrac.placement.policies.fgd import Fgd, fgd_score
from gpufrac.placement.workload import Workload

STRANDING_WEIGHT = 4.0
CPU_PERCENTILE = 50.0
MODEL_NEED_WEIGHT = 4.0
HOLE_WEIGHT = 1.0
HOLE_END_RATE = 0.02
# A GPU's leftover share is 0 to 1000 milli; scaling the FGD score past that range makes the leftover a
# pure tie-break.
_LEFTOVER_SPAN = 1001


def cpu_per_gpu(workload: Workload, percentile: float = CPU_PERCENTILE) -> float:
    """Milli-CPU per 1000 milli-GPU at `percentile` of the workload's GPU shapes, weighted by frequency;
    0 (GPUs need no CPU, so nothing strands) for a workload without GPU shapes."""
    gpu = workload.gpus * workload.milli > 0
    if not gpu.any():
        return 0.0
    ratio = workload.cpu[gpu] * 1000 / (workload.gpus[gpu] * workload.milli[gpu])
    order = np.argsort(ratio, kind="stable")
    cumulative = np.cumsum(workload.weights[gpu][order])
    at = np.searchsorted(cumulative, percentile / 100 * cumulative[-1])
    return float(ratio[order][min(at, len(order) - 1)])


def cpu_pressure(workload: Workload, state: ClusterState) -> float:
    """The CPU the workload asks once the cluster's GPUs are all requested, over the cluster's CPU: the
    workload's milli-CPU per milli-GPU (CPU-only pods included) times the active nodes' GPUs. 0 for a
    workload without GPU shapes or a cluster without CPU."""
    gpu_milli = float(workload.weights @ (workload.gpus * workload.milli))
    active = state.active
    cpu = float(state.cpu_cap[active].sum())
    if gpu_milli <= 0 or cpu <= 0:
        return 0.0
    return (
        float(workload.weights @ workload.cpu) / gpu_milli * 1000 * float(state.gpu_count[active].sum()) / cpu
    )


def feed_rate(workload: Workload, state: ClusterState) -> float:
    """The milli-CPU a free GPU needs beside it not to count as stranded: `cpu_per_gpu`, and where the
    workload asks more CPU than the cluster has (`cpu_pressure` above 1), that times the CPU all its pods ask
    over what its GPU pods ask, times the pressure. There the CPU-only pods must take cores beside GPUs
    whatever the placement, so a GPU is fed only if its node keeps cores for them too, and the more the
    cores are oversubscribed, the more a free GPU needs beside it."""
    rate = cpu_per_gpu(workload)
    pressure = cpu_pressure(workload, state)
    if rate <= 0 or pressure <= 1:  # GPU pods that ask no CPU strand nothing
        return rate
    gpu = workload.gpus * workload.milli > 0
    everyone = float(workload.weights @ workload.cpu) / float(workload.weights[gpu] @ workload.cpu[gpu])
    return rate * everyone * pressure


def stranded_milli(free_milli: np.ndarray, cpu_free: np.ndarray, cpu_per_gpu: float) -> np.ndarray:
    """Free GPU share (milli) beyond what `cpu_free` milli-CPU can feed at `cpu_per_gpu` per GPU."""
    if cpu_per_gpu <= 0:
        return np.zeros(np.broadcast_shapes(free_milli.shape, cpu_free.shape))
    return np.maximum(free_milli - 1000 * np.maximum(cpu_free, 0) / cpu_per_gpu, 0)


def expected_waste(workload: Workload, end_rate: float = HOLE_END_RATE) -> np.ndarray:
    """(1001,): for a GPU with h milli free, the milli expected never to be used. Per arriving pod, a
    one-GPU share shape that fits (at most h) arrives as often as the workload says and leaves h minus its
    share, or, at `end_rate`, the cluster fills up first and h is lost. So a hole only rare shapes fit counts
    as nearly lost, and one a common share fits counts as what that share would leave. A free GPU is no
    hole (any shape, whole GPUs too, can take it): 0."""
    share = (workload.gpus == 1) & (workload.milli > 0) & (workload.milli < 1000)
    milli, weights = workload.milli[share], workload.weights[share]
    waste = np.zeros(1001)
    for h in range(1, 1000):
        fits = milli <= h
        filled = float(weights[fits] @ waste[h - milli[fits]])
        waste[h] = (end_rate * h + filled) / (end_rate + float(weights[fits].sum()))
    return waste


def model_need(workload: Workload, state: ClusterState) -> np.ndarray:
    """Per GPU model (by `state`'s model ids): the share of the workload's GPU demand that may run only on
    some models, split evenly over the models each such shape allows, over the model's share of the
    cluster's GPUs. About 1 for a model its restricted pods alone would fill; 0 for one no restricted pod
    needs (on a trace without restricted pods, every model)."""
    gpu = workload.gpus * workload.milli > 0
    demand = workload.weights * workload.gpus * workload.milli
    total = float(demand[gpu].sum())
    ok = workload.model_ok(state.models)  # (models, shapes)
    needed = np.zeros(len(state.models))
    restricted = np.array([shape.models is not None for shape in workload.shapes], bool)
    for shape in np.flatnonzero(gpu & restricted):
        allowed = np.flatnonzero(ok[:, shape])
        if allowed.size and total > 0:
            needed[allowed] += demand[shape] / total / allowed.size
    active = state.active
    supply = np.bincount(
        state.model_id[active], weights=state.gpu_count[active], minlength=len(state.models)
    ).astype(float)
    supply /= max(float(supply.sum()), 1.0)
    return np.where(supply > 0, needed / np.maximum(supply, 1e-12), 0.0)


@dataclass
class FgdStranding(Fgd):
    _waste: np.ndarray | None = None  # `_weighed_waste`
    # The state and node changes the terms read of the whole cluster were made for, and the terms:
    # `feed_rate`, `model_need`, and `model_need` again where it is not 0 everywhere (else None).
    _cluster: tuple[tuple[int, int], float, np.ndarray, np.ndarray | None] | None = None

    def score(self, state: ClusterState, fit: Fit) -> np.ndarray:
        self._cluster_terms(state)  # before the memo is read: it is emptied if they changed
        return super().score(state, fit)

    def _cluster_terms(self, state: ClusterState) -> tuple[float, np.ndarray | None]:
        """`feed_rate` and `model_need` (None where it is 0 for every model, as where no pod of the workload
        is restricted to some), made again when nodes join, change or leave. Every node's score reads them,
        so the scores kept are thrown away when they change."""
        key = (state.serial, state.node_changes)
        if self._cluster is None or self._cluster[0] != key:
            rate, needs = feed_rate(self.workload, state), model_need(self.workload, state)
            if self._cluster is not None and (
                self._cluster[1] != rate or not np.array_equal(self._cluster[2], needs)
            ):
                self.memo.clear()
            self._cluster = (key, rate, needs, needs if needs.any() else None)
        return self._cluster[1], self._cluster[3]

    def _share_scores(
        self, state: ClusterState, fit: Fit, rows: np.ndarray, free: np.ndarray, need: np.ndarray
    ) -> np.ndarray:
        """FGD's Δ per candidate GPU, plus the stranding and model terms, which see only the node's total (the
        same whichever GPU takes the share), and the growth of the candidate GPU's expected waste; among equal
        scores, the GPU left with the least free share."""
        total = free.sum(axis=-1)
        leftover = free - need[:, None]
        waste = self._weighed_waste()
        # Free shares are 0 to 1000 (`usable_free_milli`), so only a leftover below 0 (a GPU too full, scored
        # -1 anyway) needs bringing into the table.
        hole = waste.take(np.maximum(leftover, 0)) - waste.take(free)
        growth = (
            self._share_growth(state, fit, rows, free, need)
            + self._penalty(state, fit, rows, total, total - need)[:, None]
            + hole
        )
        return fgd_score(growth) * _LEFTOVER_SPAN + (1000 - leftover)

    def _node_score(
        self, state: ClusterState, fit: Fit, rows: np.ndarray, free: np.ndarray, after_free: np.ndarray
    ) -> np.ndarray:
        growth = self._growth(state, fit, rows, free, after_free)
        return fgd_score(growth + self._penalty(state, fit, rows, free.sum(axis=-1), after_free.sum(axis=-1)))

    def _penalty(
        self, state: ClusterState, fit: Fit, rows: np.ndarray, total: np.ndarray, after_total: np.ndarray
    ) -> np.ndarray:
        """What this policy adds to Δ, per node, for the pod taking its `total` free milli-GPU to
        `after_total`: the growth of the GPU share stranded behind the node's CPU, and the pod's milli-GPU
        times its model's need."""
        cpu = state.cpu_free[rows]
        rate, needs = self._cluster_terms(state)
        before = stranded_milli(total, cpu, rate)
        stranding = STRANDING_WEIGHT * (stranded_milli(after_total, cpu - fit.pod.cpu_milli, rate) - before)
        if needs is None:  # the model term is 0 on every node
            return stranding
        return stranding + MODEL_NEED_WEIGHT * needs[state.model_id[rows]] * (total - after_total)

    def _weighed_waste(self) -> np.ndarray:
        """`HOLE_WEIGHT` × `expected_waste` of the workload, made on first use."""
        if self._waste is None:
            self._waste = HOLE_WEIGHT * expected_waste(self.workload)
        return self._waste


def _build(context: PolicyContext) -> Policy:
    policy = FgdStranding(context.workload)
    return Policy(policy, policy)


# `feed_rate` and `model_need` read the whole cluster's CPU and GPUs.
POLICIES.register(PolicyKind("fgd-stranding", _build, needs_workload=True, scores_alone=False))
