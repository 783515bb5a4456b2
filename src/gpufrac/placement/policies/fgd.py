"""`fgd`: Fragmentation Gradient Descent (Weng et al., ATC '23): place where fragmentation grows least.

For each node, and for a share each GPU on it, the pod is placed hypothetically and the growth of the
node's fragmentation against the target workload, Δ in milli-GPU, is turned into a whole-number score
trunc(100 / (1 + e^(Δ/1000))). The whole-number score matters: near Δ = 0 one point spans about 40 milli-GPU,
so many nodes tie and the tie order decides, as in the authors' simulator. Within the chosen node a share
takes the lowest-index GPU that reaches the node's score; whole GPUs are the lowest-index empty ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gpufrac.cluster.state import ClusterState
from gpufrac.placement.cache import NodeMemo
from gpufrac.placement.fit import Fit
from gpufrac.placement.fragmentation import (
    growth_after_share,
    model_ok_of,
    node_fragmentation,
    usable_free_milli,
)
from gpufrac.placement.framework import POLICIES, Policy, PolicyContext, PolicyKind
from gpufrac.placement.pickers import lowest_empty
from gpufrac.placement.workload import Workload


def fgd_score(delta: np.ndarray) -> np.ndarray:
    # Capped above so that e^x stays finite; far below, e^x is 0 and the score 100 either way.
    return np.trunc(100 / (1 + np.exp(np.minimum(delta, 1e6) / 1000)))


# From this many nodes to score at once, nodes alike are scored once (`Fgd._evaluate_alike`): below it,
# finding them costs more than it saves.
ALIKE_FROM = 64
# The most nodes scored in one pass: its arrays are nodes x GPUs x workload shapes, which for a large
# cluster's first decision would take gigabytes at once.
CHUNK = 1024


def alike_rows(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For an integer table, the first of each group of rows that hash alike, and each row's group: rows
    are hashed to one number each (sorting whole rows is far slower), so the caller checks the groups."""
    weights = np.random.default_rng(0).integers(1, 2**62, size=table.shape[1], dtype=np.int64)
    with np.errstate(over="ignore"):
        keys = (table.astype(np.int64) * weights).sum(axis=1)  # wraps around: a hash, not a sum
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    return first, inverse.reshape(-1)


@dataclass
class Fgd:
    """Both the node scorer and the GPU picker: scoring already finds each node's best GPU."""

    workload: Workload
    # Scores are whole numbers (`fgd_score`), kept as such so that a decision reads them without a cast.
    memo: NodeMemo = field(
        default_factory=lambda: NodeMemo("score", "gpu", dtypes={"score": np.int64, "gpu": np.int64})
    )

    def score(self, state: ClusterState, fit: Fit) -> np.ndarray:
        entry = self.memo.refreshed(
            state, fit.shape, fit.rows, lambda stale: self._evaluate_alike(state, fit, stale)
        )
        return entry["score"][fit.rows]

    def _evaluate_alike(
        self, state: ClusterState, fit: Fit, positions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """`_evaluate`, once per distinct node among many. A shape's first pod scores every node, which
        was most of a replay's scoring; most nodes are then still as they joined, alike within each type."""
        if len(positions) >= ALIKE_FROM:
            inputs = self._inputs(state, fit, positions)
            first, inverse = alike_rows(inputs)
            if np.array_equal(inputs[first][inverse], inputs):  # else two different nodes hashed alike
                scores, gpus = self._evaluate_in_chunks(state, fit, positions[first])
                return scores[inverse], gpus[inverse]
        return self._evaluate_in_chunks(state, fit, positions)

    def _evaluate_in_chunks(
        self, state: ClusterState, fit: Fit, positions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """`_evaluate`, `CHUNK` nodes at a time: a node's score does not depend on the others scored with
        it."""
        if len(positions) <= CHUNK:
            return self._evaluate(state, fit, positions)
        parts = [
            self._evaluate(state, fit, positions[at : at + CHUNK]) for at in range(0, len(positions), CHUNK)
        ]
        return np.concatenate([scores for scores, _ in parts]), np.concatenate([gpus for _, gpus in parts])

    def _inputs(self, state: ClusterState, fit: Fit, positions: np.ndarray) -> np.ndarray:
        """Everything `_evaluate` reads of the feasible nodes at `positions`, a row per node: nodes with equal
        rows get equal scores. A subclass that reads more of a node must add it here."""
        rows = fit.rows[positions]
        per_gpu = (
            state.gpu_mem[rows],
            state.gpu_free[rows],
            usable_free_milli(state, rows),
            fit.usable(positions),
        )
        return np.column_stack((state.model_id[rows], state.cpu_free[rows], *per_gpu))

    def pick(self, state: ClusterState, fit: Fit, at: int) -> tuple[int, ...]:
        if not fit.pod.shares:
            return lowest_empty(fit, at)
        if fit.pod.shares[0].num_devices > 1:
            return tuple(
                int(g) for g in np.flatnonzero(self._multi_device_choice(state, fit, np.array([at]))[0])
            )
        return (int(self.memo.held(fit.shape)["gpu"][fit.rows[at]]),)  # what `score` found just now

    def _evaluate(
        self, state: ClusterState, fit: Fit, positions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Scores and best GPUs for the feasible nodes at `positions`."""
        rows = fit.rows[positions]
        free = usable_free_milli(state, rows)
        need = fit.per_gpu_milli(positions)
        if fit.pod.shares and fit.pod.shares[0].num_devices == 1:
            # Every candidate GPU at once: (nodes, candidate GPU).
            share_ok = fit.usable(positions)
            scores = np.where(share_ok, self._share_scores(state, fit, rows, free, need), -1)
            return scores.max(axis=1), scores.argmax(axis=1)  # the lowest-index GPU of the best score
        if fit.pod.shares:
            taken = self._multi_device_choice(state, fit, positions)
        elif fit.pod.whole_gpus:
            empty = fit.usable(positions)
            taken = empty & (np.cumsum(empty, axis=1) <= fit.pod.whole_gpus)
        else:
            taken = np.zeros_like(free, dtype=bool)
        return self._node_score(state, fit, rows, free, free - taken * need[:, None]), np.zeros(len(rows))

    def _share_scores(
        self, state: ClusterState, fit: Fit, rows: np.ndarray, free: np.ndarray, need: np.ndarray
    ) -> np.ndarray:
        """(nodes, candidate GPU): the score of a one-GPU share on each GPU of `rows`: a subclass may rank
        differently."""
        return fgd_score(self._share_growth(state, fit, rows, free, need))

    def _share_growth(
        self, state: ClusterState, fit: Fit, rows: np.ndarray, free: np.ndarray, need: np.ndarray
    ) -> np.ndarray:
        """(nodes, candidate GPU): Δ for a one-GPU share on each GPU of `rows`. FGD's own shortcut changes
        one GPU's sums per candidate instead of measuring nodes x GPUs x GPUs."""
        model_ok = model_ok_of(state, self.workload, rows)
        cpu = state.cpu_free[rows]
        return growth_after_share(free, cpu, cpu - fit.pod.cpu_milli, model_ok, need, self.workload)

    def _node_score(
        self, state: ClusterState, fit: Fit, rows: np.ndarray, free: np.ndarray, after_free: np.ndarray
    ) -> np.ndarray:
        """The score of placing the pod on `rows` so that their free shares go from `free` to `after_free`
        (nodes, GPUs): a subclass may rank differently."""
        return fgd_score(self._growth(state, fit, rows, free, after_free))

    def _growth(
        self, state: ClusterState, fit: Fit, rows: np.ndarray, free: np.ndarray, after_free: np.ndarray
    ) -> np.ndarray:
        """Δ per node: the growth of F_n(M) in milli-GPU as free shares go from `free` to `after_free`.

        Both sides are measured in one batch (a node measures the same in any batch). Measuring the nodes
        as they are afresh costs less than keeping their measure: nearly every node scored has changed
        since it was last measured."""
        model_ok = model_ok_of(state, self.workload, rows)
        cpu = state.cpu_free[rows]
        before, after = node_fragmentation(
            np.array((free, after_free)), np.array((cpu, cpu - fit.pod.cpu_milli)), model_ok, self.workload
        )
        return after - before

    @staticmethod
    def _multi_device_choice(state: ClusterState, fit: Fit, positions: np.ndarray) -> np.ndarray:
        """A multi-device share takes the fitting GPUs with the least free memory (best fit)."""
        free = np.where(fit.usable(positions), state.gpu_free[fit.rows[positions]], np.iinfo(np.int64).max)
        order = np.argsort(free, axis=1, kind="stable")[:, : fit.pod.shares[0].num_devices]
        taken = np.zeros_like(free, dtype=bool)
        np.put_along_axis(taken, order, True, axis=1)
        return taken


def _build(context: PolicyContext) -> Policy:
    fgd = Fgd(context.workload)
    return Policy(fgd, fgd)


POLICIES.register(PolicyKind("fgd", _build, needs_workload=True))
