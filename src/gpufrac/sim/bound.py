"""An upper bound on the GPU share any placement could allocate: a linear program over node types and pod
shapes, so that a policy's result can be read against what was possible, not only against other policies.

The pods are those that arrived by a given point of the replay; each may be placed or dropped (fractionally,
in the LP), and the objective is the GPU-milli placed. Nodes are grouped into types (same CPU, memory, GPU
count and model) and pods into shapes (same CPU, memory, GPU count, per-GPU milli and allowed models), so the
LP has one variable per (shape, type) where one pod of the shape fits an empty node of the type, plus one per
type: `p_t`, the number of the type's GPUs that hold at least one share.

Every constraint holds for every integral placement the engine can make, which is what makes the optimum an
upper bound; for each, the reason is in `_type_rows`. Beyond CPU, memory and GPU-milli totals per type (the
naive relaxation, which splits a share across GPUs and reaches about 99.99% on the default trace), it counts
what a share does to the GPU it lands on: whole GPUs and partly used GPUs are disjoint, and the shares on one
GPU pass every dual-feasible function of Fekete and Schepers (so an 810-milli share leaves its GPU's 190 milli
to shares under 190 only). CPU-only pods allocate no GPU and only take room, so dropping them loses nothing
from the optimum; they are left out.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_array

from gpufrac.cluster.model import NodeSpec
from gpufrac.sim.replay import arrival_order, nearest_point, percent_buckets
from gpufrac.sim.trace import Trace, TracePod

MILLI = 1000  # one GPU, in the trace's per-GPU thousandths
# Shares above 1000/(k+1) milli: at most k on one GPU. k = 1 is the ε = 500 dual-feasible row already.
COUNT_LIMITS = (2, 3, 4)


@dataclass(frozen=True, slots=True)
class Bound:
    milli: float  # the LP optimum: GPU-milli placed
    arrived_milli: int  # GPU-milli the pods asked for: the bound never exceeds it
    pods: int
    variables: int
    constraints: int
    seconds: float


@dataclass(frozen=True, slots=True)
class _Type:
    count: int
    cpu: int
    memory: int
    gpus: int
    model: str


@dataclass(frozen=True, slots=True)
class _Shape:
    cpu: int
    memory: int
    gpus: int
    milli: int  # per GPU
    models: frozenset[str] | None

    @property
    def whole(self) -> bool:
        return self.milli >= MILLI

    def fits(self, node: _Type) -> bool:
        """Whether one pod of this shape fits an empty node of this type: no LP variable where it cannot."""
        return (
            self.cpu <= node.cpu
            and self.memory <= node.memory
            and self.gpus <= node.gpus
            and (self.models is None or node.model in self.models)
        )


def at_report_point(trace: Trace, *, seed: int, inflation: float) -> Bound:
    """The bound for the pods of a replay (`seed`, `inflation`) whose arrival rounds to 100% or less, or to
    the point nearest 100% that a small trace reaches: where reports read each policy.

    A replay's allocation at x% is the mean over the pods whose arrival rounds to x; allocation only grows
    as pods arrive, so none of those exceeds what the whole prefix up to x's last pod could allocate. The
    points reached depend on the seed's arrivals alone, so the bound needs no replay."""
    pods = arrival_order(trace, np.random.default_rng(seed), inflation=inflation)
    arrived = np.cumsum([pod.gpu_demand_milli for pod in pods], dtype=np.int64)
    points = percent_buckets(arrived, trace.gpus * MILLI)
    point = nearest_point(set(points.tolist()) or {100}, 100)
    return upper_bound(trace.nodes, pods[: int(np.count_nonzero(points <= point))])


def node_types(nodes: Iterable[NodeSpec]) -> list[_Type]:
    counts = Counter(
        (node.cpu_milli, node.memory_mib, len(node.gpus), node.model) for node in nodes if node.gpus
    )
    return [_Type(count, *key) for key, count in sorted(counts.items())]


def upper_bound(nodes: Sequence[NodeSpec], pods: Sequence[TracePod]) -> Bound:
    """The most GPU-milli any placement of `pods` on `nodes` allocates, or more (never less)."""
    started = time.perf_counter()
    types = node_types(nodes)
    shapes = Counter(
        _Shape(pod.cpu_milli, pod.memory_mib, pod.num_gpu, pod.gpu_milli, pod.gpu_spec)
        for pod in pods
        if pod.num_gpu
    )
    arrived = sum(pod.gpu_demand_milli for pod in pods)
    # Columns: x[shape, type] for the pairs that fit, then p[type] for every type.
    pairs = [(s, t) for s in shapes for t, node in enumerate(types) if s.fits(node)]
    p_column = {t: len(pairs) + t for t in range(len(types))}
    columns = len(pairs) + len(types)
    rows: list[tuple[dict[int, float], float]] = []
    for shape in shapes:  # each pod placed at most once
        rows.append(({j: 1.0 for j, (s, _) in enumerate(pairs) if s == shape}, float(shapes[shape])))
    for t, node in enumerate(types):
        placed = [(j, s) for j, (s, u) in enumerate(pairs) if u == t]
        rows.extend(_type_rows(node, placed, p_column[t]))
    objective = np.zeros(columns)
    for j, (shape, _) in enumerate(pairs):
        objective[j] = -shape.gpus * shape.milli
    if not pairs:
        return Bound(0.0, arrived, len(pods), columns, len(rows), time.perf_counter() - started)
    coefficients = [(i, j, value) for i, (row, _) in enumerate(rows) for j, value in row.items() if value]
    row_index, column_index, value = zip(*coefficients, strict=True)
    solution = linprog(
        objective,
        A_ub=coo_array((value, (row_index, column_index)), shape=(len(rows), columns)).tocsr(),
        b_ub=[limit for _, limit in rows],
        bounds=(0, None),
        method="highs",
    )
    if solution.status != 0:  # x = 0 is always feasible and the optimum is at most `arrived`
        raise RuntimeError(f"the bound's LP did not solve: {solution.message}")
    # A hair above HiGHS's answer, so that its tolerances never push the bound below a real placement; never
    # above what arrived or the cluster's GPUs, which no placement passes (with more arrived than the
    # cluster holds, the hair made a full cluster 100.01%).
    capacity = MILLI * sum(node.count * node.gpus for node in types)
    return Bound(
        milli=min(float(-solution.fun) * (1 + 1e-9) + 1e-6, float(arrived), float(capacity)),
        arrived_milli=arrived,
        pods=len(pods),
        variables=columns,
        constraints=len(rows),
        seconds=time.perf_counter() - started,
    )


def _type_rows(
    node: _Type, placed: Sequence[tuple[int, _Shape]], p: int
) -> list[tuple[dict[int, float], float]]:
    """The constraints on what the `node.count` nodes of one type hold, each `({column: coefficient}, limit)`
    meaning Σ coefficient · column <= limit. Why each holds for any integral placement:

    - CPU and memory: the pods on a node fit its CPU and memory; sum over the type's nodes.
    - Whole GPUs: a pod asking g whole GPUs holds g GPUs that hold nothing else, and a GPU with a share on
      it is one of the p GPUs that hold a share; so whole-GPU holdings plus p fit the type's GPUs.
    - Dual-feasible rows: for 0 <= ε <= 500, f_ε(m) = 1000 for m > 1000 - ε, m for ε <= m <= 1000 - ε, 0
      for m < ε. On one GPU the shares sum to at most 1000; if one is above 1000 - ε, the rest sum below ε,
      so each counts 0 and the GPU's total is 1000; otherwise f_ε(m) <= m and the total is at most 1000.
      A GPU with no share counts 0. Summing over GPUs: Σ f_ε(share) <= 1000 p. A share pod over g GPUs puts
      one share on each of g distinct GPUs, so it counts g times. ε = 0 is the GPU-milli total.
    - Counts: k + 1 shares each above 1000/(k+1) would pass 1000, so one GPU holds at most k of them.
    - Per node: two pods that each take over half a node's CPU (or memory, or whole GPUs) never share a
      node, so at most `count` of them are on the type. (Not so for shares: they do not hold their GPUs.)
    """
    shares = [(j, s) for j, s in placed if not s.whole]
    rows: list[tuple[dict[int, float], float]] = [
        ({j: s.cpu for j, s in placed}, node.count * node.cpu),
        ({j: s.memory for j, s in placed}, node.count * node.memory),
        ({**{j: s.gpus for j, s in placed if s.whole}, p: 1.0}, node.count * node.gpus),
    ]
    milli = sorted({s.milli for _, s in shares})
    # f_ε only changes where ε passes a share size or 1000 minus one: those values of ε are all that count.
    epsilons = {0} | {m for m in milli if m <= MILLI // 2} | {MILLI + 1 - m for m in milli if m > MILLI // 2}
    for epsilon in sorted(epsilons):
        rows.append(({**{j: s.gpus * _dff(s.milli, epsilon) for j, s in shares}, p: -MILLI}, 0.0))
    for k in COUNT_LIMITS:
        big: dict[int, float] = {j: s.gpus for j, s in shares if s.milli * (k + 1) > MILLI}
        if big:
            rows.append(({**big, p: -k}, 0.0))
    halves: tuple[dict[int, float], ...] = (
        {j: 1.0 for j, s in placed if 2 * s.cpu > node.cpu},
        {j: 1.0 for j, s in placed if 2 * s.memory > node.memory},
        {j: 1.0 for j, s in placed if s.whole and 2 * s.gpus > node.gpus},
    )
    rows.extend((half, node.count) for half in halves if half)
    return rows


def _dff(milli: int, epsilon: int) -> float:
    """f_ε of Fekete and Schepers on a share of `milli`, in milli (see `_type_rows`)."""
    if milli > MILLI - epsilon:
        return MILLI
    return milli if milli >= epsilon else 0
