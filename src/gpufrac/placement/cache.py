"""Per-node memo for work that is costly per node (the filters, FGD, clustering).

A node's verdict or score for a given pod shape only changes when the node does, and one placement changes
one node; so a plugin recomputes only the nodes whose `ClusterState.version` moved since it last looked.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Mapping

import numpy as np
from numpy.typing import DTypeLike

from gpufrac.cluster.model import PodDemand
from gpufrac.cluster.state import ClusterState


def shape_key(pod: PodDemand) -> PodDemand:
    """Pods that differ only in name and priority are filtered and scored identically, so they share memo
    entries."""
    return PodDemand(
        "",
        cpu_milli=pod.cpu_milli,
        memory_mib=pod.memory_mib,
        whole=pod.whole,
        shares=pod.shares,
        models=pod.models,
        fault_domain=pod.fault_domain,
        scalars=pod.scalars,
    )


class Hashed:
    """A memo key whose hash is computed once: a pod's shape is looked up in several memos on every decision,
    and hashing its nested requests each time cost more than the lookups. Never pickled: string hashes
    differ between processes."""

    __slots__ = ("_hash", "value")

    def __init__(self, value: Hashable) -> None:
        self.value, self._hash = value, hash(value)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or (
            isinstance(other, Hashed) and self._hash == other._hash and self.value == other.value
        )


# The most bytes of arrays one memo keeps; past it, the keys looked up longest ago are dropped. Without a
# bound, pods of thousands of distinct shapes (a tenant's, each with its own CPU request) grew the
# scheduler's memos without end: at the openb cluster's size, 9,000 shapes took some 850 MiB. A key takes
# 30 KiB there (447 shapes, the most of the paper's traces: 13 MiB) and 240 KiB at 10,000 nodes (270 keys
# within the bound).
MEMO_BYTES = 64 * 2**20


class NodeMemo:
    """Arrays indexed by node row, one set per key: `fields` are one value per node (float unless `dtypes`
    says otherwise), `per_gpu` fields one value per GPU column. At most `most_bytes` of them, the keys
    looked up longest ago dropped first."""

    def __init__(
        self,
        *fields: str,
        dtypes: Mapping[str, DTypeLike] | None = None,
        per_gpu: Collection[str] = (),
        most_bytes: int = MEMO_BYTES,
    ) -> None:
        self._fields = fields
        self._dtypes = dtypes or {}
        self._per_gpu = per_gpu
        self._most_bytes = most_bytes
        self._serial = -1
        self._layout = (-1, -1)  # the state's rows and GPU columns the entries were made for
        self._entries: dict[Hashable, dict[str, np.ndarray]] = {}  # the last looked up last
        self._bytes = 0

    def lookup(
        self, state: ClusterState, key: Hashable, rows: np.ndarray
    ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """The arrays cached under `key` (indexed by node row) and the positions in `rows` to recompute.

        `rows` are distinct and ascending, as `np.flatnonzero` gives them. The caller writes fresh values for
        the positions returned, then calls `stamp` (`refreshed` does all three).
        """
        versions = state.version
        layout = (versions.shape[0], state.width)
        if self._serial != state.serial or self._layout != layout:
            # Another state, or one that grew (more nodes, or a node wider than any before): no entry fits.
            self.clear()
            self._serial, self._layout = state.serial, layout
        entry = self._entries.pop(key, None)
        if entry is None:
            entry = self._new_entry(*layout)
        self._entries[key] = entry
        if rows.size == layout[0]:  # every node, in order: no need to gather them
            return entry, (entry["version"] != versions).nonzero()[0]
        return entry, (entry["version"][rows] != versions[rows]).nonzero()[0]

    def refreshed(
        self,
        state: ClusterState,
        key: Hashable,
        rows: np.ndarray,
        compute: Callable[[np.ndarray], tuple[np.ndarray, ...]],
    ) -> dict[str, np.ndarray]:
        """The arrays cached under `key`, up to date for `rows`: for the nodes that changed since they were
        kept, `compute(positions)` gives the values at `rows[positions]` of the memo's fields, in their order
        (only the first ones where the others do not apply). Called only if some changed: a decision refreshes
        a few memos this way, and a tuple costs less than naming the fields."""
        entry, stale = self.lookup(state, key, rows)
        if stale.size:
            fresh = rows[stale]
            for name, values in zip(self._fields, compute(stale), strict=False):
                entry[name][fresh] = values
            self.stamp(state, entry, fresh)
        return entry

    def _new_entry(self, size: int, width: int) -> dict[str, np.ndarray]:
        """Arrays for a key not looked up yet, every node stale; the keys looked up longest ago make room."""
        entry = {"version": np.full(size, -1, np.int64)}
        for name in self._fields:
            shape = (size, width) if name in self._per_gpu else (size,)
            entry[name] = np.zeros(shape, self._dtypes.get(name, float))
        self._bytes += _nbytes(entry)
        while self._entries and self._bytes > self._most_bytes:
            self._bytes -= _nbytes(self._entries.pop(next(iter(self._entries))))
        return entry

    def held(self, key: Hashable) -> dict[str, np.ndarray]:
        """The arrays kept under `key` as its last `lookup` and `stamp` left them: for a reader within the
        same decision, which needs no staleness check."""
        return self._entries[key]

    def clear(self) -> None:
        """Forget every entry: for a plugin whose values also read something other than the node."""
        self._entries.clear()
        self._bytes = 0

    @staticmethod
    def stamp(state: ClusterState, entry: dict[str, np.ndarray], rows: np.ndarray) -> None:
        entry["version"][rows] = state.version[rows]


def _nbytes(entry: dict[str, np.ndarray]) -> int:
    return sum(array.nbytes for array in entry.values())
