"""The whole-GPU reserve: an admission rule beside every policy that keeps empty GPUs for whole-GPU pods.

A share of most of a GPU (openb's 810-milli pods) leaves a hole that few pods can use. While empty GPUs are
plentiful that costs nothing; once they run short, each such share that opens one takes the GPU a later
whole-GPU pod needed, and strands the rest of it. No placement of every share that arrives allocates more
than 96.16-96.19% of the default trace's GPUs at 100% arrival (`benchmarks/share_packing_cap.py`), however
many pods it moves: past that, a scheduler must leave some shares that fit waiting. The reserve does so
only for large shares, and only while fewer empty GPUs than it keeps would be left.

Off unless an operator sets it (`--whole-gpu-reserve`): a share it turns away stays pending while a GPU it
fits on is empty, which is a trade of one tenant's wait for the cluster's allocation that the operator
should choose.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gpufrac.cluster.model import Placement, milli_up
from gpufrac.cluster.state import ClusterState, take_rows

# A share of at least this much of its GPU leaves under 300 milli, a hole that only the smallest shares can
# fill: only these are turned away. Chosen on seeds 42-51 of the default trace (600 allocated less, 800 the
# same: the trace has no shares between 700 and 810 milli) and frozen.
LARGE_SHARE_MILLI = 700
KEPT_WHOLE = "empty GPUs kept for whole-GPU pods"


@dataclass(frozen=True, slots=True)
class WholeGpuReserve:
    """Keep `percent` of the cluster's GPUs empty against large shares (`LARGE_SHARE_MILLI`)."""

    percent: float
    # (empty GPUs, all GPUs), counted by a caller whose decisions see only some of the GPUs (the scheduler
    # beside a device plugin hides all but the GPUs it reserved from a share): None counts them on the state
    # decided on.
    counted: tuple[int, int] | None = None

    @staticmethod
    def count(state: ClusterState) -> tuple[int, int]:
        """The empty GPUs a whole-GPU pod could take (healthy, open, no tenant), and all GPUs, of the nodes
        in `state`."""
        rows = state.active_rows()
        gpus = take_rows(state.gpu_mem, rows) > 0
        empty = state.open_gpus(rows) & (take_rows(state.gpu_tenants, rows) == 0) & gpus
        return int(np.count_nonzero(empty)), int(np.count_nonzero(gpus))

    def refuses(self, state: ClusterState, placement: Placement) -> bool:
        """Whether `placement` opens an empty GPU with a large share and leaves fewer empty GPUs than kept.

        A pod whose shares open no empty GPU, or ask less than `LARGE_SHARE_MILLI` of each they open, passes,
        as does a pod of whole GPUs only. A pod of several containers counts their shares together, so that
        a second, small container does not carry a large share past the reserve. Shares are judged by their
        request, what they take from the GPU: a limit above it is burst room that other shares' requests
        may still take, so a small request leaves no hole. A share refused here is decided again among the
        GPUs already in use (`engine.decide`)."""
        row = state.index[placement.node]
        opened: dict[int, int] = {}  # empty GPU -> MiB the pod's shares ask of it (0: taken whole)
        for assignment in placement.assignments:
            for gpu in assignment.gpus:
                if state.gpu_tenants[row, gpu] == 0:
                    shared = assignment.mode is not None
                    opened[gpu] = opened.get(gpu, 0) + (assignment.request_mib if shared else 0)
        memory = state.gpu_mem[row]
        # In thousandths rounded up, as the request was rounded down from its portion: 0.7 of 16384 MiB is
        # 11,468 MiB, which is 700 milli here.
        if not any(milli_up(mib, int(memory[gpu])) >= LARGE_SHARE_MILLI for gpu, mib in opened.items()):
            return False
        empty, gpus = self.counted or self.count(state)
        return empty - len(opened) < math.ceil(self.percent * gpus / 100)
