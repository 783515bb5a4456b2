"""Per-node memo for plugins whose per-node work is costly (FGD, clustering).

A node's score for a given pod shape only changes when the node does, and one placement changes one
node; so a plugin recomputes only the nodes whose `ClusterState.version` moved since it last looked.
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np

from gpufrac.cluster.state import ClusterState


class NodeMemo:
    def __init__(self, *fields: str) -> None:
        self._fields = fields
        self._serial = -1
        self._entries: dict[Hashable, dict[str, np.ndarray]] = {}

    def lookup(
        self, state: ClusterState, key: Hashable, rows: np.ndarray
    ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """The arrays cached under `key` (indexed by node row) and the positions in `rows` to recompute.

        The caller writes fresh values for those positions, then calls `stamp`.
        """
        if self._serial != state.serial:
            self._entries.clear()
            self._serial = state.serial
        size = state.version.shape[0]
        entry = self._entries.get(key)
        if entry is None or entry["version"].shape[0] != size:
            entry = {"version": np.full(size, -1, np.int64)} | {name: np.zeros(size) for name in self._fields}
            self._entries[key] = entry
        stale = np.flatnonzero(entry["version"][rows] != state.version[rows])
        return entry, stale

    @staticmethod
    def stamp(state: ClusterState, entry: dict[str, np.ndarray], rows: np.ndarray) -> None:
        entry["version"][rows] = state.version[rows]
