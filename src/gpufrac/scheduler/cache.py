"""The scheduler's cache: the cluster as the scheduler believes it, one lifecycle per pod, keyed by UID.

Modelled on kube-scheduler's `internal/cache`. The watches *add*, *update* and *remove* nodes and bound
pods; the scheduling loop *assumes* a placement before its bind starts, so the next decision already sees
that memory taken, and then either *finishes* the binding or *forgets* the placement when the bind fails.
Pods are keyed by UID, never by namespace/name: a pod deleted and recreated under the same name is another
pod, and must neither inherit nor erase the first one's memory. The engine reads `snapshot()`.

Pure bookkeeping, no I/O: the loop and `gpufrac top` feed it API objects, and tests drive it directly.
"""

from __future__ import annotations

import contextlib
import gc
import logging
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from gpufrac import contract
from gpufrac.cluster.model import NodeSpec, Placement
from gpufrac.cluster.state import ClusterState, PlacementRefused
from gpufrac.contract import node_inventory
from gpufrac.scheduler import affinity, neighbours, objects, problems, reservations
from gpufrac.scheduler.devices import Hold, NodeDevices, node_devices
from gpufrac.scheduler.eligibility import Eligibility
from gpufrac.scheduler.pod_index import PodIndex
from gpufrac.scheduler.problems import NOT_ACCOUNTED, Problem

log = logging.getLogger("gpufrac.scheduler")

Obj = Mapping[str, Any]


class Nominated(NamedTuple):
    """An unbound pod another scheduler nominated a node for: what it would hold there."""

    priority: int
    placement: Placement  # its CPU, memory, pod slot and other resources on the node
    gpus: int  # the `nvidia.com/gpu` it asks the kubelet for


class SchedulerCache:
    def __init__(
        self,
        *,
        node_selector: Mapping[str, str] | None = None,
        report: Callable[[Problem], None] = problems.log_problem,
        require_ready: bool = True,
        heartbeat_timeout: float = node_inventory.HEARTBEAT_TIMEOUT_SECONDS,
        reservation_namespace: str = "gpufrac-system",
    ) -> None:
        self.state = ClusterState()
        self.eligibility = Eligibility(
            node_selector or {}, require_ready=require_ready, heartbeat_timeout=heartbeat_timeout
        )
        self.reservation_namespace = reservation_namespace
        self.report = report  # told of every object skipped (`problems`); called often, it deduplicates
        self.nodes: dict[str, Obj] = {}  # name -> latest readable Node object
        self.bound: dict[str, Obj] = {}  # uid -> latest object of a pod accounted as bound
        self.unplaced: dict[
            str, dict[str, Obj]
        ] = {}  # node not seen (or unreadable) -> uid -> its bound pods
        self.misfits: dict[str, dict[str, Obj]] = {}  # node -> uid -> bound pods it cannot hold as written
        self.assumed: dict[str, Placement] = {}  # uid -> placement reserved for a bind in flight
        self.assumed_pods: dict[str, Obj] = {}  # uid -> the object of a pod whose bind is in flight
        self.assumed_gpus: dict[str, tuple[str | None, ...]] = {}  # uid -> its placement's GPUs, by UUID
        self.pods = PodIndex()  # the placed pods (bound or assumed), as pod affinity and spreads read them
        self.namespace_labels: dict[str, Mapping[str, str]] = {}  # for terms that select namespaces
        self.seen_bound: dict[str, Obj] = {}  # uid -> bound object the watch reported during its bind
        self.gone_assumed: set[str] = set()  # assumed pods deleted while their bind runs
        self.names: dict[str, str] = {}  # uid -> namespace/name, for people: logs and `gpufrac top`
        self._node_views: dict[str, tuple[Any, ...]] = {}  # what placement reads of each node
        # Device-plugin nodes (`devices`): their published GPUs with holders, the pods on them asking the
        # kubelet for `nvidia.com/gpu` (node -> uid -> (namespace/name, GPUs not placed by index)), and the
        # live reservation pods (uid -> object).
        self.device_gpus: dict[str, tuple[Any, ...]] = {}
        self.devices: dict[str, NodeDevices] = {}
        self._devices_serial = 0  # moves with every change to `devices`, for `hold_matrix`
        self._holds_key: tuple[Any, ...] | None = None
        self._holds: tuple[np.ndarray, np.ndarray] = (np.zeros(0, np.int64), np.zeros((0, 0), np.int8))
        self.claims: dict[str, dict[str, tuple[str, int]]] = {}
        self._claimed_on: dict[str, str] = {}  # uid -> the node of its claim, so a release finds it at once
        self.reservations: dict[str, Obj] = {}
        self.releasing: set[str] = set()  # reservations whose deletion this scheduler asked for
        self.kept_rooms: dict[str, Placement] = {}  # pending pod uid -> room its moved pods left
        # Unbound pods a scheduler nominated a node for (kube-scheduler, once it preempted for them): uid ->
        # their priority and what they would hold there (`nominated_view`).
        self.nominated: dict[str, Nominated] = {}

    def snapshot(self) -> ClusterState:
        """The state the engine decides on. Not a copy: decisions run on the event loop between awaits, so
        nothing changes it during one, and copying 1,213 nodes' arrays per pod would cost more than the
        decision itself."""
        return self.state

    def eligible_rows(
        self, pod: Obj, *, gpus: bool = True, volumes: Sequence[tuple[affinity.Term, ...]] = ()
    ) -> tuple[np.ndarray, Counter[str]]:
        """The state rows `pod` may land on, and the other nodes counted by reason: those of the
        eligibility filters (`open_rows`), then those the pods placed rule out (`neighbours_allow`)."""
        rows, excluded = self.open_rows(pod, gpus=gpus, volumes=volumes)
        keep, refused = self.neighbours_allow(pod, rows)
        return rows[keep], excluded + refused

    def open_rows(
        self, pod: Obj, *, gpus: bool = True, volumes: Sequence[tuple[affinity.Term, ...]] = ()
    ) -> tuple[np.ndarray, Counter[str]]:
        """The rows the eligibility filters leave `pod` (the node's own rules: selectors, taints, readiness,
        volumes), whatever the pods there: where a preemption may look."""
        return self.eligibility.rows_for(pod, self.state, gpus=gpus, volumes=volumes)

    def neighbours_allow(
        self, pod: Obj, rows: np.ndarray, gone: Collection[str] = ()
    ) -> tuple[np.ndarray, Counter[str]]:
        """Per row, whether the pods placed let `pod` there (host ports, inter-pod (anti-)affinity, topology
        spread), and the rows they rule out counted by reason; the pods `gone` are not counted, as a
        preemption weighs its victims, nor the pod itself, as a bound pod asked where it could be moved."""
        return neighbours.allowed(self, pod, rows, {objects.pod_uid(pod), *gone})

    def placed_pod(self, uid: str) -> Obj | None:
        """The object of a placed pod: bound, or whose bind is in flight."""
        return self.bound.get(uid) or self.assumed_pods.get(uid)

    def row_of(self, uid: str) -> int | None:
        """The row of a placed pod's node; None for a pod not placed."""
        placement = self.state.placements.get(uid)
        return None if placement is None else self.state.index[placement.node]

    # ---- nodes --------------------------------------------------------------------------------------------

    def sync_nodes(self, nodes: Iterable[Obj]) -> None:
        """A full list: nodes missing from it are gone."""
        with _collector_paused():
            self._sync_nodes(list(nodes))

    def _sync_nodes(self, listed: list[Obj]) -> None:
        seen = {objects.name_of(node) for node in listed}
        for name in [name for name in self.nodes if name not in seen]:
            self.remove_node(name)
        for node in listed:
            self.add_node(node)

    def add_node(self, node: Obj) -> bool:
        """Add or update a node; False when nothing placement reads has changed (a heartbeat, unless it
        brings back a node whose agent had gone silent).

        A node that cannot be read is reported and taken out as if deleted: nothing new lands on it, and
        its pods wait, in `unplaced`, for a version that reads.
        """
        name = objects.name_of(node)
        try:
            view = (
                objects.node_spec(node),
                objects.node_ready(node),
                objects.node_labels_of(node),
                objects.node_taints(node),
                objects.device_plugin_gpus(node),
                objects.gpu_ready(node),
            )
        except contract.ContractError as error:
            message = f"cannot be read, so no pod is placed on it: {error}"
            self.report(Problem.about("Node", node, problems.INVALID, message))
            known = name in self.nodes
            if known:
                self.remove_node(name)
            return known
        if self._node_views.get(name) == view:
            row = self.state.index.get(name)
            return row is not None and self.eligibility.heartbeat(row, node)
        if (ignored := objects.inventory_problem(node)) is not None:
            self.report(Problem.about("Node", node, problems.INVALID, ignored))
        self.nodes[name] = node
        self._node_views[name] = view
        self._upsert_node(view[0])
        self.eligibility.update(self.state.index[name], node)
        for uid, placement in self.assumed.items():
            # Binds in flight to a node that was gone (deleted, unreadable or missing from a relist) keep
            # their reservations: the Binding may yet go through.
            if (
                placement.node == name
                and uid not in self.state.placements
                and uid not in self.misfits.get(name, {})
            ):
                self._reapply_assumed(placement)
        waiting = self.unplaced.pop(name, {}) | self.misfits.pop(name, {})
        for uid, pod in waiting.items():
            self._account_bound(uid, pod, name)
        self._hold_if_misfits(name)
        if view[4] is None:
            self.device_gpus.pop(name, None)
            self.devices.pop(name, None)
            self._devices_serial += 1
        else:
            self.device_gpus[name] = view[4]
            self._refresh_devices(name)
        return True

    def remove_node(self, name: str) -> None:
        self.nodes.pop(name, None)
        self._node_views.pop(name, None)
        self.device_gpus.pop(name, None)
        self.devices.pop(name, None)
        self._devices_serial += 1
        held = self.misfits.pop(name, {})
        if name in self.state.index and self.state.active[self.state.index[name]]:
            for placement in self.state.remove_node(name):
                # Kubernetes deletes these pods soon; should the node come back first, they count again.
                pod = self.bound.pop(placement.pod, None)
                if pod is not None:
                    held[placement.pod] = pod
        if held:
            self.unplaced.setdefault(name, {}).update(held)

    def _upsert_node(self, spec: NodeSpec) -> None:
        row = self.state.index.get(spec.name)
        if row is not None and self.state.active[row] and self.state.node_spec(spec.name) == spec:
            return
        if row is not None and self.state.active[row]:
            current = self.state.node_spec(spec.name)
            if _same_shape(current, spec):
                for gpu in spec.gpus:
                    self.state.set_gpu_health(spec.name, gpu.index, healthy=gpu.healthy)
                return
            released = self.state.remove_node(spec.name)
        else:
            released = []
        self.state.add_node(spec)
        for placement in released:
            if placement.pod in self.assumed:
                self._reapply_assumed(placement)
            elif (pod := self.bound.pop(placement.pod, None)) is not None:
                # Read again from its annotations by `add_node`, against the node as it is now.
                self.misfits.setdefault(spec.name, {})[placement.pod] = pod

    def _reapply_assumed(self, placement: Placement) -> None:
        """A bind in flight keeps its GPUs if the node still has them, under the same indices (an agent
        restarted after a driver reload may list the same GPUs in another order: counted by index, the pod
        would hold one GPU in the cache while its Binding names another, left free to the next pod). If not,
        the node is held until the bound pod's own annotations are read (`add_pod` after
        `finish_binding`)."""
        try:
            if self._gpu_uuids(placement) != self.assumed_gpus.get(placement.pod):
                raise PlacementRefused("its GPUs now have other indices or are gone")
            self.state.apply(placement)
        except PlacementRefused as error:
            log.error(
                "node %s changed under the bind of %s: %s", placement.node, self._name(placement.pod), error
            )
            self.misfits.setdefault(placement.node, {})[placement.pod] = {}

    def _gpu_uuids(self, placement: Placement) -> tuple[str | None, ...]:
        """The UUIDs of the GPUs `placement` names by index on its node as it is now (None past its GPUs)."""
        uuids = self.state.uuids[self.state.index[placement.node]]
        return tuple(
            uuids[gpu] if gpu < len(uuids) else None
            for assignment in placement.assignments
            for gpu in assignment.gpus
        )

    def _hold_if_misfits(self, name: str) -> None:
        """A node with a bound pod it cannot account takes no new pod: that pod's GPUs are not known, so any
        placement there could double-book them."""
        if name not in self.state.index:
            return
        held = len(self.misfits.get(name, {}))
        reason = f"{held} bound pod(s) on it cannot be accounted (see its Events)" if held else None
        self.eligibility.hold(self.state.index[name], reason)

    # ---- pods the watches report --------------------------------------------------------------------------

    def sync_pods(self, pods: Iterable[Obj]) -> None:
        """A full list: accounted pods missing from it or finished are gone; bound ones are added."""
        with _collector_paused():
            self._sync_pods(list(pods))

    def _sync_pods(self, listed: list[Obj]) -> None:
        uids = {objects.pod_uid(pod) for pod in listed}
        waiting = [uid for held in (*self.unplaced.values(), *self.misfits.values()) for uid in held]
        for uid in [*self.state.placements, *waiting]:
            if uid not in uids:
                self.remove_pod(uid)
        for pod in listed:
            if objects.is_done(pod):
                self.remove_pod(objects.pod_uid(pod))
            elif objects.node_name(pod):
                self.add_pod(pod)

    def add_pod(self, pod: Obj) -> None:
        """A pod the watch reports bound to a node. Idempotent, since a relist adds every pod again."""
        uid = objects.pod_uid(pod)
        if uid in self.assumed:
            self.seen_bound[uid] = pod  # counted from this object once its bind settles
            return  # its bind is in flight: `finish_binding` or `forget` settles it
        if uid in self.state.placements:
            self.update_pod(pod)
        else:
            self._account_bound(uid, pod, objects.node_name(pod))

    def update_pod(self, pod: Obj) -> None:
        """A newer version of a bound pod. Its placement stands: the webhook keeps a bound pod's contract
        annotations from changing, so only the object (read for the target workload) is replaced. One whose
        bind is in flight is noted as `add_pod` notes it: the watch's first word that it is bound may well
        come as MODIFIED."""
        uid = objects.pod_uid(pod)
        if uid in self.assumed or uid not in self.state.placements:
            self.add_pod(pod)
        else:
            self.bound[uid] = pod
            self.pods.know(uid, pod)

    def remove_pod(self, uid: str) -> bool:
        """The pod was deleted or finished; True when that freed anything.

        An assumed pod stays held until its bind settles: the Binding may yet go through.
        """
        if uid in self.assumed:
            self.gone_assumed.add(uid)
            return False
        waiting = (*self.unplaced.values(), *self.misfits.values())
        if uid in self.state.placements or any(uid in held for held in waiting):
            self._release(uid)
            return True
        return False

    def _account_bound(self, uid: str, pod: Obj, node: str) -> None:
        """Count a bound pod on its node. One that cannot be counted as its annotations say (unreadable, GPUs
        the node lacks, more than the node has left) is a misfit: reported, and its node held."""
        if objects.name_of(pod):  # not the stand-in for a bind lost to a node change (`_reapply_assumed`)
            self.names[uid] = objects.pod_key(pod)
        if node not in self.nodes:
            self.unplaced.setdefault(node, {})[uid] = pod
            return
        held = self.misfits.get(node, {})
        try:
            if not objects.node_name(pod):
                # The pending version a bind started from: the bound one, with its annotations, is to come.
                raise PlacementRefused("its bind has not been read back yet")
            # The node as last read (its spec is the first item of its view): rebuilding it from the state
            # for each of its pods would cost a relist a GPU list per pod.
            spec = self._node_views[node][0] if node in self._node_views else self.state.node_spec(node)
            # Restored, not applied: a pod running on a GPU that went unhealthy under it still holds it.
            self.state.restore(objects.bound_placement(pod, spec))
        except (contract.ContractError, PlacementRefused) as error:
            known = uid in held  # a misfit read again as room freed: reported once, not at every release
            self.misfits.setdefault(node, {})[uid] = pod
            self._hold_if_misfits(node)
            if objects.node_name(pod) and not known:
                message = f"bound to {node} but not counted there, so {node} takes no new pod: {error}"
                self.report(Problem.about("Pod", pod, NOT_ACCOUNTED, message))
            return
        self.bound[uid] = pod
        self.pods.know(uid, pod)
        self._claim(uid, pod, node)
        if held.pop(uid, None) is not None:
            if not held:
                self.misfits.pop(node, None)
            self._hold_if_misfits(node)

    # ---- pods this scheduler binds ------------------------------------------------------------------------

    def assume(self, pod: Obj, placement: Placement) -> None:
        """Reserve `placement` for a bind about to start, so the next decision sees the memory taken."""
        uid = objects.pod_uid(pod)
        self.state.apply(placement)
        self.assumed[uid] = placement
        self.assumed_pods[uid] = pod
        self.assumed_gpus[uid] = self._gpu_uuids(placement)
        self.pods.know(uid, pod)
        self.names[uid] = objects.pod_key(pod)
        self._claim(uid, pod, placement.node)

    def finish_binding(self, pod: Obj) -> bool:
        """The bind went through; False when the pod was deleted meanwhile (its memory is then freed)."""
        uid = objects.pod_uid(pod)
        placement = self.assumed.pop(uid, None)
        self.assumed_pods.pop(uid, None)
        self.assumed_gpus.pop(uid, None)
        latest = self.seen_bound.pop(uid, None) or pod
        if placement is not None and uid not in self.state.placements and uid not in self.gone_assumed:
            # Its reservation went with its node (removed, or reshaped so that the GPUs were gone): count the
            # pod from its bound object, or hold the node until that object is read.
            self._release(uid)
            self._account_bound(uid, latest, placement.node)
        elif uid in self.state.placements:
            self.bound[uid] = latest
            self.pods.know(uid, latest)
        return self._settle(uid)

    def forget(self, pod: Obj) -> bool:
        """The bind failed: free its reservation. False when the pod no longer waits to be scheduled: it was
        deleted meanwhile, or the watch reported it bound meanwhile (another bind won, or this one landed and
        its answer was lost). A bind failing says nothing of a bound pod's GPUs, so such a pod is counted from
        the object the watch reported, as any bound pod; retried instead, its memory would be free to the
        next decision while the pod holds it."""
        uid = objects.pod_uid(pod)
        self.assumed.pop(uid, None)
        self.assumed_pods.pop(uid, None)
        self.assumed_gpus.pop(uid, None)
        seen = self.seen_bound.pop(uid, None)
        self._release(uid)
        if not self._settle(uid):
            return False
        if seen is not None:
            self._account_bound(uid, seen, objects.node_name(seen))
            return False
        return True

    def _settle(self, uid: str) -> bool:
        if uid not in self.gone_assumed:
            return True
        self.gone_assumed.discard(uid)
        self._release(uid)
        return False

    def _release(self, uid: str) -> None:
        for waiting in self.unplaced.values():
            waiting.pop(uid, None)
        for node, held in list(self.misfits.items()):
            if held.pop(uid, None) is not None:
                if not held:
                    del self.misfits[node]
                self._hold_if_misfits(node)
        self.bound.pop(uid, None)
        self.pods.forget(uid)
        self.names.pop(uid, None)
        self.reservations.pop(uid, None)
        self.releasing.discard(uid)
        if uid in self.state.placements:
            self._free(uid)
        self._unclaim(uid)

    def _free(self, uid: str) -> None:
        """Release the pod's placement, then count again the misfits of its node that fit now: a pod that
        raced another scheduler's for CPU is a misfit until the kubelet rejects one of the two, and its node
        must take pods again once that settles, not only at the next relist."""
        node = self.state.placements[uid].node
        self.state.release(uid)
        for waiting, pod in list(self.misfits.get(node, {}).items()):
            if objects.name_of(pod):  # not a bind lost to a node change, which waits for its bound object
                self._account_bound(waiting, pod, node)

    # ---- rooms kept for pending pods (defragmentation) ----------------------------------------------------

    def keep_room(self, uid: str, placement: Placement) -> bool:
        """Count `placement` as taken until its pending pod is decided, so that no other pod takes the room
        pods were moved out of for it (`scheduler/mover.py`); False when the room is no longer free."""
        try:
            self.state.apply(placement)
        except PlacementRefused:
            return False
        self.kept_rooms[uid] = placement
        return True

    def give_room(self, uid: str) -> Placement | None:
        """Stop keeping the pod's room (to decide for the pod itself, or because it went); the placement it
        was kept as, if any."""
        placement = self.kept_rooms.pop(uid, None)
        if placement is not None and self.state.placements.get(uid) is placement:
            self._free(uid)
        return placement

    def _name(self, uid: str) -> str:
        return self.names.get(uid, uid)

    # ---- pods nominated to nodes (kube-scheduler's preemption) --------------------------------------------

    def nominate(self, pod: Obj) -> None:
        """Note the node an unbound pod is nominated to (`status.nominatedNodeName`), or that it is none."""
        uid, node = objects.pod_uid(pod), objects.text_field(pod, "status", "nominatedNodeName")
        self.nominated.pop(uid, None)
        if not node or objects.node_name(pod) or objects.terminating(pod):
            return
        try:
            demand = objects.pod_demand(pod)
        except contract.ContractError:
            return  # nothing it holds can be told; its own scheduler will not place it either
        placement = Placement(
            f"nominated:{uid}", node, demand.cpu_milli, demand.memory_mib, scalars=demand.scalars
        )
        self.nominated[uid] = Nominated(objects.priority(pod), placement, objects.gpu_resource_count(pod))

    @contextlib.contextmanager
    def nominated_view(self, uid: str, priority: int, *, device_gpus: bool = False) -> Iterator[np.ndarray]:
        """Within the block, the pods nominated to a node with `priority` or more hold their CPU, memory, pod
        slot and other resources there, as kube-scheduler counts them for a pod of lower or equal priority:
        the room it freed by preemption is theirs, and taken, it would preempt again. Yields the rows of
        nodes where they do not fit even now (their victims still going), which such a pod must not take
        either.

        With `device_gpus` (the decision may take GPUs a device plugin has free: a whole-GPU pod, or a
        reservation for shares) they also hold the `nvidia.com/gpu` they ask for among the free GPUs of a
        device-plugin node, since the kubelet hands any free GPU to whichever pod comes first; a node with
        fewer free than they ask for is kept from such a decision. Shares on GPUs already reserved take
        nothing the device plugin has, so they are not kept off for it."""
        state = self.state
        applied: list[str] = []
        full: list[int] = []
        taken: dict[int, list[int]] = {}  # row -> the free GPUs the nominated pods there hold, by index
        for other, nominated in self.nominated.items():
            row = state.index.get(nominated.placement.node)
            if other == uid or nominated.priority < priority or row is None or not state.active[row]:
                continue
            try:
                state.apply(nominated.placement)
                applied.append(nominated.placement.pod)
            except PlacementRefused:
                full.append(row)
                continue
            view = self.devices.get(nominated.placement.node)
            if device_gpus and nominated.gpus and view is not None:
                held = taken.setdefault(row, [])
                holds = enumerate(view.holds[: state.width])
                free = [gpu for gpu, hold in holds if hold is Hold.FREE and gpu not in held]
                if len(free) < nominated.gpus:
                    full.append(row)
                held.extend(free[: nominated.gpus])
        saved = {row: state.gpu_healthy[row].copy() for row, held in taken.items() if held}
        try:
            for row in saved:
                state.gpu_healthy[row, taken[row]] = False
                state.version[row] += 1
            yield np.array(full, np.int64)
        finally:
            for pod in applied:
                state.release(pod)
            for row, healthy in saved.items():
                state.gpu_healthy[row] = healthy
                state.version[row] += 1

    # ---- device-plugin nodes ------------------------------------------------------------------------------

    def _claim(self, uid: str, pod: Obj, node: str) -> None:
        """Note a pod on `node` that asks the kubelet for `nvidia.com/gpu`: its GPUs are the device plugin's
        to choose, so they count as taken until published (`devices`). GPUs its placement names by index (a
        whole-GPU pod gpufrac bound before the node had a device plugin) are counted there already."""
        asked = objects.gpu_resource_count(pod)
        if not asked:
            return
        placement = self.state.placements.get(uid)
        placed = sum(len(a.gpus) for a in (placement.assignments if placement else ()) if a.mode is None)
        if reservations.is_reservation(pod, self.reservation_namespace):
            self.reservations[uid] = pod
        if asked > placed:
            if self._claimed_on.get(uid, node) != node:
                self._unclaim(uid)
            self.claims.setdefault(node, {})[uid] = (objects.pod_key(pod), asked - placed)
            self._claimed_on[uid] = node
            self._refresh_devices(node)

    def claimed_gpus(self, uid: str) -> int:
        """The whole GPUs a pod asked the kubelet's device plugin for that its placement does not name (its
        GPUs on a device-plugin node, `_claim`): what it holds beyond its placement. None for a reservation,
        whose GPU holds shares that count themselves."""
        node = self._claimed_on.get(uid)
        return 0 if node is None or uid in self.reservations else self.claims[node][uid][1]

    def _unclaim(self, uid: str) -> None:
        node = self._claimed_on.pop(uid, None)
        if node is None:
            return
        claimed = self.claims[node]
        del claimed[uid]
        if not claimed:
            del self.claims[node]
        self._refresh_devices(node)

    def _refresh_devices(self, node: str) -> None:
        gpus = self.device_gpus.get(node)
        if gpus is None:
            return
        claimed = self.claims.get(node, {})
        live = {key: 1 for uid, (key, _) in claimed.items() if self._live_reservation(uid)}
        self._devices_serial += 1
        self.devices[node] = node_devices(
            gpus,
            reservations=live,
            claims=dict(claimed.values()),
            ours=lambda holder: reservations.named_as_reservation(holder, self.reservation_namespace),
        )

    def _live_reservation(self, uid: str) -> bool:
        """A reservation whose GPU takes shares: not one being deleted, by this scheduler (its keeper, in the
        round it found it idle) or anyone, whose GPU goes back to the device plugin, and so to any pod."""
        pod = self.reservations.get(uid)
        return pod is not None and uid not in self.releasing and not objects.terminating(pod)

    def release_reservation(self, uid: str, *, asked: bool = True) -> None:
        """Its deletion is asked for (or, not `asked`, was not done after all): no share goes on its GPU
        from now on, not from when the watch tells of its going."""
        if asked and uid not in self.reservations:
            return  # gone from the cache already (a Failed one): no shares to keep off, nothing to forget
        (self.releasing.add if asked else self.releasing.discard)(uid)
        if (node := self._claimed_on.get(uid)) is not None:
            self._refresh_devices(node)

    @contextlib.contextmanager
    def device_view(self, *usable: Hold) -> Iterator[None]:
        """Within the block, the engine sees on device-plugin nodes only the GPUs whose hold is one of
        `usable` (shares: reserved ones; whole GPUs: free ones); the health NVML reports is back after it.
        The rows' versions move both ways, so per-node memos recompute them. One numpy pass over the
        device-plugin rows: a decision pays no Python loop over nodes."""
        if not usable or not self.devices:
            yield
            return
        state = self.state
        rows, holds = self.hold_matrix()
        saved = state.gpu_healthy[rows].copy()
        try:
            # A GPU the agent did not publish (GPUs read from labels, say) has no hold (-1): unusable.
            state.gpu_healthy[rows] &= np.isin(holds, [_HOLD_CODES[hold] for hold in usable])
            state.version[rows] += 1
            yield
        finally:
            state.gpu_healthy[rows] = saved
            state.version[rows] += 1

    def hold_matrix(self) -> tuple[np.ndarray, np.ndarray]:
        """The active device-plugin rows and their GPUs' hold codes (-1: none), rebuilt only when a node's
        holds or the state's shape changed since the last decision."""
        state = self.state
        key = (self._devices_serial, state.gpu_healthy.shape, state.serial)
        if self._holds_key != key:
            found = [
                (row, view)
                for node, view in self.devices.items()
                if (row := state.index.get(node)) is not None and state.active[row]
            ]
            width = state.gpu_healthy.shape[1]
            holds = np.full((len(found), width), -1, np.int8)
            for position, (_, view) in enumerate(found):
                codes = [_HOLD_CODES[hold] for hold in view.holds[:width]]
                holds[position, : len(codes)] = codes
            self._holds = (np.array([row for row, _ in found], np.int64), holds)
            self._holds_key = key
        return self._holds


_HOLD_CODES = {hold: code for code, hold in enumerate(Hold)}


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """A full list brings hundreds of thousands of long-lived objects (the listed objects, their placements),
    and while they arrive Python's cycle collector walks the whole heap again and again: a fifth of a
    10,000-node relist (`benchmarks/scale.py`). They hold no reference cycles, so the collector can wait
    until the list is in; it runs as usual after. Left as it was if something else paused it."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _same_shape(current: NodeSpec, new: NodeSpec) -> bool:
    """Only GPU health differs: no need to rebuild the node's allocations. A changed UUID is a different
    GPU, so the pods placed by the old one are read again (and held if it is gone); so is a changed compute
    guarantee, so that a pool newly guaranteed is held while its GPUs' caps add past 100%."""
    return (
        current.cpu_milli == new.cpu_milli
        and current.memory_mib == new.memory_mib
        and current.max_pods == new.max_pods
        and current.compute_guarantee == new.compute_guarantee
        and current.scalars == new.scalars
        and [(g.index, g.uuid, g.model, g.memory_mib) for g in current.gpus]
        == [(g.index, g.uuid, g.model, g.memory_mib) for g in new.gpus]
    )
