"""`ClusterState`: the cluster as numpy arrays, so that every plugin scores all nodes in one pass.

Node i's GPUs are row i of the (nodes × widest node) GPU arrays; columns past a node's GPU count have zero
memory and are never free. Every mutation goes through `apply`, `release`, `restore` or a node change, each
of which checks the placement invariants (docs/architecture.md) first and refuses (raising
`PlacementRefused`) rather than break one, and bumps the node's `version` so that plugins can cache per-node
work.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

import numpy as np

from gpufrac.cluster.model import FULL_COMPUTE, Assignment, GpuSpec, NodeSpec, Placement
from gpufrac.contract.model import ComputeMode

MODE_NONE = 0
MODE_CODE = {ComputeMode.TIME_SLICING: 1, ComputeMode.SM_SHARING: 2}
MODE_OF_CODE = {code: mode for mode, code in MODE_CODE.items()}
DOMAIN_NONE = 0  # `gpu_domain` of a GPU without sm-sharing shares
NO_POD_BOUND = 2**62  # `pods_free` of a node without a bound on its pods: more than any cluster holds
_serials = itertools.count()


def take_rows(array: np.ndarray, rows: np.ndarray | slice | int) -> np.ndarray:
    """`array[rows]` (a view for a slice, else a copy), by `take` for an index: for the few rows a decision
    reads, numpy's fancy indexing of a 2-D array costs several times what `take` does."""
    return array[rows] if isinstance(rows, slice) else array.take(rows, axis=0)


class PlacementRefused(ValueError):
    """An operation would break a placement invariant; nothing was changed."""


class ClusterState:
    def __init__(self, nodes: Iterable[NodeSpec] = ()) -> None:
        self.serial = next(_serials)  # with `version`, identifies a node's state for plugin caches
        self.node_changes = 0  # counts nodes added, redefined or removed: what the cluster's capacity is
        self._active_rows = (-1, np.zeros(0, np.int64))  # `active_rows`, and the node_changes it was made at
        self.names: list[str] = []
        self.index: dict[str, int] = {}
        self.models: list[str] = [""]
        self.uuids: list[list[str]] = []
        self.placements: dict[str, Placement] = {}
        self.domains: dict[str, int] = {}  # fault domain -> its code in `gpu_domain` (from 1)
        self.pods_on: list[set[str]] = []
        # Per other resource a node may offer (`NodeSpec.scalars`), by row: allocatable, and what is left.
        self.scalar_cap: dict[str, np.ndarray] = {}
        self.scalar_free: dict[str, np.ndarray] = {}
        nodes = list(nodes)
        # Sized to the nodes given, not grown by doubling: every decision compares per-node versions, and
        # arrays with no spare rows let it compare them whole instead of gathering the active rows first.
        self._alloc(len(nodes), max((len(node.gpus) for node in nodes), default=0))
        # Ties between equally scored nodes go to the lowest rank: insertion order unless the caller
        # (the simulator, with a seeded permutation) sets another.
        self.tie_rank = np.arange(len(nodes), dtype=np.int64)
        for node in nodes:
            self.add_node(node)

    def _alloc(self, rows: int, width: int) -> None:
        self.active = np.zeros(rows, bool)
        self.cpu_free = np.zeros(rows, np.int64)
        self.mem_free = np.zeros(rows, np.int64)
        self.cpu_cap = np.zeros(rows, np.int64)
        self.pods_free = np.zeros(rows, np.int64)  # pods the kubelet still takes there (`NodeSpec.max_pods`)
        self.pods_cap = np.zeros(rows, np.int64)  # -1: no bound
        self.mem_cap = np.zeros(rows, np.int64)
        self.model_id = np.zeros(rows, np.int32)
        self.gpu_count = np.zeros(rows, np.int64)
        self.compute_guarantee = np.zeros(rows, bool)
        self.version = np.zeros(rows, np.int64)
        self.gpu_mem = np.zeros((rows, width), np.int64)
        self.gpu_free = np.zeros((rows, width), np.int64)
        self.gpu_mode = np.zeros((rows, width), np.int8)
        self.gpu_tenants = np.zeros((rows, width), np.int32)
        self.gpu_compute = np.zeros((rows, width), np.int32)  # compute claims on the GPU, in percent
        self.gpu_whole = np.zeros((rows, width), bool)
        self.gpu_healthy = np.zeros((rows, width), bool)
        self.gpu_domain = np.zeros((rows, width), np.int32)  # the fault domain of its sm-sharing shares
        # `usable_free_milli`'s memo, and the node versions it was computed at (-1: never).
        self._usable = np.zeros((rows, width), np.int64)
        self._usable_version = np.full(rows, -1, np.int64)

    _ROW_ARRAYS = (
        "active",
        "cpu_free",
        "mem_free",
        "cpu_cap",
        "pods_free",
        "pods_cap",
        "mem_cap",
        "model_id",
        "gpu_count",
        "compute_guarantee",
        "version",
    )
    _GPU_ARRAYS = (
        "gpu_mem",
        "gpu_free",
        "gpu_mode",
        "gpu_tenants",
        "gpu_compute",
        "gpu_whole",
        "gpu_healthy",
        "gpu_domain",
    )

    def _grow(self, rows: int, width: int) -> None:
        old = {name: getattr(self, name) for name in self._ROW_ARRAYS + self._GPU_ARRAYS}
        self._alloc(rows, width)
        known = self.tie_rank.shape[0]
        self.tie_rank = np.concatenate([self.tie_rank, np.arange(known, rows, dtype=np.int64)])
        for name, array in old.items():
            target = getattr(self, name)
            if array.ndim == 1:
                target[: array.shape[0]] = array
            else:
                target[: array.shape[0], : array.shape[1]] = array
        for scalars in (self.scalar_cap, self.scalar_free):
            for name, array in scalars.items():
                scalars[name] = np.concatenate([array, np.zeros(rows - array.shape[0], np.int64)])

    @property
    def width(self) -> int:
        return int(self.gpu_mem.shape[1])

    # ---- node changes -------------------------------------------------------------------------------------

    def add_node(self, spec: NodeSpec) -> int:
        """Add a node, or replace a node of that name that holds no pods."""
        row = self.index.get(spec.name)
        if row is not None and self.pods_on[row]:
            raise PlacementRefused(f"node {spec.name} holds pods; remove it before redefining it")
        if sorted(gpu.index for gpu in spec.gpus) != list(range(len(spec.gpus))):
            raise PlacementRefused(f"node {spec.name}: GPU indices must be 0..{len(spec.gpus) - 1}")
        if row is None:
            row = len(self.names)
            self.names.append(spec.name)
            self.index[spec.name] = row
            self.uuids.append([])
            self.pods_on.append(set())
        if row >= self.active.shape[0] or len(spec.gpus) > self.width:
            self._grow(max(row + 1, 2 * self.active.shape[0]), max(len(spec.gpus), self.width))
        self._write_node(row, spec)
        return row

    def _add_scalar(self, name: str) -> None:
        """Start counting a resource no node offered so far (every node: none)."""
        self.scalar_cap[name] = np.zeros(self.active.shape[0], np.int64)
        self.scalar_free[name] = np.zeros(self.active.shape[0], np.int64)

    def _write_node(self, row: int, spec: NodeSpec) -> None:
        if spec.model not in self.models:
            self.models.append(spec.model)
        gpus = sorted(spec.gpus, key=lambda gpu: gpu.index)
        self.active[row] = True
        self.cpu_cap[row] = self.cpu_free[row] = spec.cpu_milli
        self.pods_cap[row] = -1 if spec.max_pods is None else spec.max_pods
        self.pods_free[row] = NO_POD_BOUND if spec.max_pods is None else spec.max_pods
        self.mem_cap[row] = self.mem_free[row] = spec.memory_mib
        self.model_id[row] = self.models.index(spec.model)
        self.gpu_count[row] = len(gpus)
        self.compute_guarantee[row] = spec.compute_guarantee
        for name, _ in spec.scalars:
            if name not in self.scalar_cap:
                self._add_scalar(name)
        offered = dict(spec.scalars)
        for name, cap in self.scalar_cap.items():
            cap[row] = self.scalar_free[name][row] = offered.get(name, 0)
        for array in (
            self.gpu_mem,
            self.gpu_free,
            self.gpu_mode,
            self.gpu_tenants,
            self.gpu_compute,
            self.gpu_domain,
        ):
            array[row] = 0
        self.gpu_whole[row] = False
        self.gpu_healthy[row] = False
        for gpu in gpus:
            self.gpu_mem[row, gpu.index] = self.gpu_free[row, gpu.index] = gpu.memory_mib
            self.gpu_healthy[row, gpu.index] = gpu.healthy
        self.uuids[row] = [gpu.uuid for gpu in gpus]
        self.version[row] += 1
        self.node_changes += 1

    def remove_node(self, name: str) -> list[Placement]:
        """Take a node out; its pods are released and returned, since they no longer run anywhere."""
        row = self.index[name]
        released = [self.release(pod) for pod in sorted(self.pods_on[row])]
        self.active[row] = False
        self.version[row] += 1
        self.node_changes += 1
        return released

    def set_gpu_health(self, name: str, gpu: int, *, healthy: bool) -> None:
        """Mark a GPU (un)healthy. Shares already on it stay; no new share lands on an unhealthy GPU."""
        row = self.index[name]
        if not 0 <= gpu < self.gpu_count[row]:
            raise PlacementRefused(f"node {name} has no GPU {gpu}")
        self.gpu_healthy[row, gpu] = healthy
        self.version[row] += 1

    # ---- pods ---------------------------------------------------------------------------------------------

    def apply(self, placement: Placement) -> None:
        self._put(self._check(placement), placement)

    def restore(self, placement: Placement) -> None:
        """Put back a placement released from this state, to undo a trial (`placement.defrag`,
        `placement.preemption`), or count one that already runs (the scheduler's cache reading a bound pod).
        Checked as `apply` checks a new one, except for GPU health: a GPU that went unhealthy keeps the shares
        it already had (`set_gpu_health`), so such a pod must be counted there rather than refused, and lost
        from the state."""
        self._put(self._check(placement, returning=True), placement)

    def _put(self, row: int, placement: Placement) -> None:
        self.cpu_free[row] -= placement.cpu_milli
        self.pods_free[row] -= 1
        self.mem_free[row] -= placement.memory_mib
        for name, amount in placement.scalars:
            self.scalar_free[name][row] -= amount
        for assignment in placement.assignments:
            for gpu in assignment.gpus:
                self.gpu_tenants[row, gpu] += 1
                if assignment.mode is None:
                    self.gpu_whole[row, gpu] = True
                    self.gpu_free[row, gpu] = 0
                else:
                    self.gpu_free[row, gpu] -= assignment.request_mib
                    self.gpu_mode[row, gpu] = MODE_CODE[assignment.mode]
                    self.gpu_compute[row, gpu] += assignment.compute_claim
                    if assignment.mode is ComputeMode.SM_SHARING:
                        self.gpu_domain[row, gpu] = self.domain_code(placement.fault_domain)
        self.placements[placement.pod] = placement
        self.pods_on[row].add(placement.pod)
        self._changed_gpus(row, placement)

    def release(self, pod: str) -> Placement:
        placement = self.placements.pop(pod)
        row = self.index[placement.node]
        self.pods_on[row].discard(pod)
        self._give_back(row, placement)
        self._changed_gpus(row, placement)
        return placement

    def _changed_gpus(self, row: int, placement: Placement) -> None:
        """Bump the node's version once `placement` was put on it or taken off. Where `usable_free_milli`
        was up to date for the node, only the placement's GPUs changed: they are brought up to date here,
        a few scalar writes, rather than the whole node again by the next decision's numpy calls."""
        fresh = self._usable_version[row] == self.version[row]
        self.version[row] += 1
        if not fresh:
            return
        for assignment in placement.assignments:
            for gpu in assignment.gpus:
                memory = int(self.gpu_mem[row, gpu])
                usable = memory > 0 and self.gpu_healthy[row, gpu] and not self.gpu_whole[row, gpu]
                self._usable[row, gpu] = int(self.gpu_free[row, gpu]) * 1000 // memory if usable else 0
        self._usable_version[row] = self.version[row]

    def without(self, pods: Iterable[str]) -> ClusterState:
        """A copy of the state in which `pods` (those placed) are released; this one is left untouched. For
        asking where a pod would fit were some pods moved (`placement.defrag`): one pass over the pods, no
        invariant checks or node versions, since nothing is added."""
        copy = object.__new__(ClusterState)
        vars(copy).update(vars(self))
        copy.serial = next(_serials)  # plugin caches must not take the copy's nodes for this state's
        for name in (*self._ROW_ARRAYS, *self._GPU_ARRAYS):
            setattr(copy, name, getattr(self, name).copy())
        copy.scalar_cap = dict(self.scalar_cap)
        copy.scalar_free = {name: array.copy() for name, array in self.scalar_free.items()}
        copy._usable = np.zeros_like(self._usable)
        copy._usable_version = np.full_like(self._usable_version, -1)
        copy.placements = dict(self.placements)
        copy.pods_on = [set(names) for names in self.pods_on]
        for pod in pods:
            placement = copy.placements.pop(pod, None)
            if placement is not None:
                row = copy.index[placement.node]
                copy.pods_on[row].discard(pod)
                copy._give_back(row, placement)
        return copy

    def _give_back(self, row: int, placement: Placement) -> None:
        self.cpu_free[row] += placement.cpu_milli
        self.pods_free[row] += 1
        self.mem_free[row] += placement.memory_mib
        for name, amount in placement.scalars:
            self.scalar_free[name][row] += amount
        for assignment in placement.assignments:
            for gpu in assignment.gpus:
                self.gpu_tenants[row, gpu] -= 1
                if assignment.mode is None:
                    self.gpu_whole[row, gpu] = False
                    self.gpu_free[row, gpu] = self.gpu_mem[row, gpu]
                else:
                    self.gpu_free[row, gpu] += assignment.request_mib
                    self.gpu_compute[row, gpu] -= assignment.compute_claim
                if self.gpu_tenants[row, gpu] == 0:
                    self.gpu_mode[row, gpu] = MODE_NONE
                    self.gpu_domain[row, gpu] = DOMAIN_NONE

    def _check(self, placement: Placement, *, returning: bool = False) -> int:
        """The row the placement lands on, once every invariant it could break is known to hold. `returning`:
        the pod was on these GPUs before (`restore`), so their health does not matter."""
        if placement.pod in self.placements:
            raise PlacementRefused(f"pod {placement.pod} is already placed")
        row = self.index.get(placement.node)
        if row is None or not self.active[row]:
            raise PlacementRefused(f"pod {placement.pod}: node {placement.node} is not in the cluster")
        if self.pods_free[row] < 1:
            raise PlacementRefused(f"pod {placement.pod}: {placement.node} runs as many pods as it may")
        if placement.cpu_milli > self.cpu_free[row] or placement.memory_mib > self.mem_free[row]:
            raise PlacementRefused(f"pod {placement.pod}: not enough CPU or memory on {placement.node}")
        for name, amount in placement.scalars:
            # A pod already there keeps what it holds: a device plugin that restarts reports none of its
            # resource until it registers again, and that must not make every pod holding some a misfit.
            if name not in self.scalar_free:
                self._add_scalar(name)
            if not returning and amount > self.scalar_free[name][row]:
                raise PlacementRefused(f"pod {placement.pod}: not enough {name} on {placement.node}")
        taken: dict[int, int] = {}
        modes: dict[int, int] = {}
        compute: dict[int, int] = {}
        whole: set[int] = set()
        for assignment in placement.assignments:
            self._check_assignment(
                placement,
                row,
                assignment,
                taken=taken,
                modes=modes,
                compute=compute,
                whole=whole,
                returning=returning,
            )
        return row

    def _check_assignment(
        self,
        placement: Placement,
        row: int,
        assignment: Assignment,
        *,
        taken: dict[int, int],
        modes: dict[int, int],
        compute: dict[int, int],
        whole: set[int],
        returning: bool,
    ) -> None:
        where = f"pod {placement.pod} container {assignment.container} on {placement.node}"
        if len(set(assignment.gpus)) != len(assignment.gpus) or not assignment.gpus:
            raise PlacementRefused(f"{where}: a share needs distinct GPUs, at least one")
        for gpu in assignment.gpus:
            if not 0 <= gpu < self.gpu_count[row]:
                raise PlacementRefused(f"{where}: no GPU {gpu}")
            if not (returning or self.gpu_healthy[row, gpu]):
                raise PlacementRefused(f"{where}: GPU {gpu} is unhealthy")
            if self.gpu_whole[row, gpu] or gpu in whole:
                raise PlacementRefused(f"{where}: GPU {gpu} is held whole by another container")
            if assignment.mode is None:
                if self.gpu_tenants[row, gpu] or gpu in taken:
                    raise PlacementRefused(f"{where}: a whole GPU must be empty, GPU {gpu} is not")
                whole.add(gpu)
                continue
            memory = int(self.gpu_mem[row, gpu])
            if not 1 <= assignment.request_mib <= assignment.limit_mib <= memory:
                raise PlacementRefused(
                    f"{where}: need 1 <= request ({assignment.request_mib} MiB) <= limit "
                    f"({assignment.limit_mib} MiB) <= GPU {gpu} memory ({memory} MiB)"
                )
            mode = MODE_CODE[assignment.mode]
            current = modes.get(gpu, int(self.gpu_mode[row, gpu]))
            if current not in (MODE_NONE, mode):
                raise PlacementRefused(f"{where}: GPU {gpu} is in {MODE_OF_CODE[current]} mode")
            domain = self.domains.get(placement.fault_domain, -1)
            if assignment.mode is ComputeMode.SM_SHARING and self.gpu_domain[row, gpu] not in (
                DOMAIN_NONE,
                domain,
            ):
                raise PlacementRefused(f"{where}: GPU {gpu} holds sm-sharing shares of another fault domain")
            modes[gpu] = mode
            taken[gpu] = taken.get(gpu, 0) + assignment.request_mib
            if taken[gpu] > self.gpu_free[row, gpu]:
                raise PlacementRefused(f"{where}: GPU {gpu} has {self.gpu_free[row, gpu]} MiB unrequested")
            compute[gpu] = compute.get(gpu, int(self.gpu_compute[row, gpu])) + assignment.compute_claim
            if self.compute_guarantee[row] and compute[gpu] > FULL_COMPUTE:
                raise PlacementRefused(
                    f"{where}: compute caps on GPU {gpu} would add up to {compute[gpu]}%, on a node that "
                    "guarantees compute"
                )

    def domain_code(self, domain: str) -> int:
        """The code of a fault domain in `gpu_domain`, given on first use."""
        return self.domains.setdefault(domain, len(self.domains) + 1)

    # ---- views --------------------------------------------------------------------------------------------

    def node_spec(self, name: str) -> NodeSpec:
        row = self.index[name]
        model = self.models[self.model_id[row]]
        gpus = tuple(
            GpuSpec(
                index=i,
                uuid=self.uuids[row][i],
                model=model,
                memory_mib=int(self.gpu_mem[row, i]),
                healthy=bool(self.gpu_healthy[row, i]),
            )
            for i in range(int(self.gpu_count[row]))
        )
        return NodeSpec(
            name=name,
            cpu_milli=int(self.cpu_cap[row]),
            memory_mib=int(self.mem_cap[row]),
            gpus=gpus,
            compute_guarantee=bool(self.compute_guarantee[row]),
            max_pods=None if self.pods_cap[row] < 0 else int(self.pods_cap[row]),
            scalars=tuple((name, int(cap[row])) for name, cap in sorted(self.scalar_cap.items()) if cap[row]),
        )

    def active_rows(self) -> np.ndarray:
        """The rows of the nodes in the cluster, ascending (read-only). Kept until a node joins, changes or
        leaves, since every decision starts from them."""
        made_at, rows = self._active_rows
        if made_at != self.node_changes:
            rows = self.active.nonzero()[0]
            rows.flags.writeable = False
            self._active_rows = (self.node_changes, rows)
        return rows

    def open_gpus(self, rows: np.ndarray | slice | int = slice(None)) -> np.ndarray:
        """Healthy GPUs not held whole: where a new tenant could go (all False past a node's GPU count)."""
        return take_rows(self.gpu_healthy, rows) & ~take_rows(self.gpu_whole, rows)

    def free_milli(self, rows: np.ndarray | slice = slice(None)) -> np.ndarray:
        """Unrequested share of each GPU in thousandths (0 for missing GPUs), for fragmentation and scores."""
        memory = take_rows(self.gpu_mem, rows)
        return np.where(memory > 0, take_rows(self.gpu_free, rows) * 1000 // np.maximum(memory, 1), 0)

    def usable_free_milli(self, rows: np.ndarray | slice = slice(None)) -> np.ndarray:
        """`free_milli` on `open_gpus`, 0 elsewhere: what every scorer and the fragmentation measure read.

        Kept per node and recomputed only for nodes whose `version` moved, since one placement changes one
        node while every decision reads all of them.
        """
        stale = (self._usable_version != self.version).nonzero()[0]
        if stale.size:
            self._usable[stale] = np.where(self.open_gpus(stale), self.free_milli(stale), 0)
            self._usable_version[stale] = self.version[stale]
        usable = take_rows(self._usable, rows)
        return usable.copy() if isinstance(rows, slice) else usable  # a view would let callers edit the memo
