"""`gpufrac scheduler`: watch nodes and pods, place pods with the engine, bind them.

The scheduler keeps no state of its own: `ClusterState` is rebuilt from the API on every (re)list, and bound
pods are read back from the annotations bind wrote, so a restart never double-books a GPU. A placement is
reserved in the state before its bind starts, so binds run concurrently without two pods counting the same
memory; a failed bind releases the reservation and the pod is retried.

The class is driven by events (`on_node_*`, `on_pod_*`) and by `schedule_pending()`, so tests can step it;
`run()` wires those to reflectors, leader election and the HTTP endpoints.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import lightkube
import numpy as np
from lightkube.resources.core_v1 import Event, Node, Pod
from lightkube.types import PatchType

from gpufrac import contract
from gpufrac.cluster.model import NodeSpec, Placement, Unschedulable
from gpufrac.cluster.state import ClusterState, PlacementRefused
from gpufrac.kubeapi.client import API_ERRORS, build
from gpufrac.kubeapi.reflector import reflect
from gpufrac.placement.engine import decide
from gpufrac.placement.framework import POLICIES, Policy, PolicyContext
from gpufrac.placement.workload import Workload
from gpufrac.scheduler import objects
from gpufrac.scheduler.binder import BindError, bind
from gpufrac.scheduler.eligibility import Eligibility
from gpufrac.scheduler.metrics import SchedulerMetrics
from gpufrac.scheduler.queue import SchedulingQueue

log = logging.getLogger("gpufrac.scheduler")
WORKLOAD_REFRESH_SECONDS = 600.0


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    name: str = "gpufrac"
    policy: str = "binpack"
    node_selector: Mapping[str, str] = field(default_factory=dict)
    env_delivery: contract.EnvDelivery = contract.EnvDelivery.CONFIGMAP
    mps_pipe_directory: str = contract.DEFAULT_MPS_PIPE_DIRECTORY
    # A bind holds one HTTP connection for its 2-3 writes. httpcore's pool walks every connection on every
    # request (probing idle sockets) and keeps only 20 alive: at 64 binds, that walk took 17% of the
    # scheduler's CPU and connections were closed and TLS-handshaken again after each burst
    # (benchmarks/scheduler.py --profile); at 16, 9% and no new handshakes, with binds still far from the
    # limit (a bind takes 3 round trips, so 16 in flight allow hundreds a second).
    max_concurrent_binds: int = 16


class Scheduler:
    def __init__(self, client: lightkube.AsyncClient, config: SchedulerConfig) -> None:
        self.client = client
        self.config = config
        self.state = ClusterState()
        self.eligibility = Eligibility(config.node_selector)
        self.queue = SchedulingQueue()
        self.metrics = SchedulerMetrics(lambda: self.state, leader=lambda: self.is_leader)
        self.pending: dict[str, dict[str, Any]] = {}  # our unbound pods, latest version
        self.in_flight: dict[str, Placement] = {}
        self.gone_in_flight: set[str] = set()  # deleted or finished while their bind was running
        self.node_objects: dict[str, dict[str, Any]] = {}
        self.unplaced: dict[str, dict[str, dict[str, Any]]] = {}  # node not seen yet -> its bound pods
        self.bound_objects: dict[str, dict[str, Any]] = {}  # pods accounted as bound -> their latest version
        self._node_views: dict[str, tuple[Any, ...]] = {}  # what placement reads of each node
        self.synced = {"nodes": False, "pods": False}
        self.is_leader = True
        self._binds: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(config.max_concurrent_binds)
        self._wakeup = asyncio.Event()
        self.policy = self._policy(Workload.from_pods([]))
        self._workload_at: float | None = None

    # ---- events -------------------------------------------------------------------------------------------

    def on_nodes_listed(self, nodes: list[dict[str, Any]]) -> None:
        seen = {objects.meta(node)["name"] for node in nodes}
        for name in list(self.node_objects):
            if name not in seen:
                self.on_node_event("DELETED", self.node_objects[name])
        for node in nodes:
            self.on_node_event("ADDED", node)
        self.synced["nodes"] = True

    def on_node_event(self, event: str, node: dict[str, Any]) -> None:
        name = objects.meta(node)["name"]
        if event == "DELETED":
            self.node_objects.pop(name, None)
            self._node_views.pop(name, None)
            if name in self.state.index and self.state.active[self.state.index[name]]:
                for placement in self.state.remove_node(name):
                    # Kubernetes deletes these pods soon; should the node come back first, they count again.
                    pod = self.bound_objects.pop(placement.pod, None)
                    if pod is not None:
                        self.unplaced.setdefault(name, {})[placement.pod] = pod
        else:
            self.node_objects[name] = node
            view = (
                objects.node_spec(node),
                objects.node_ready(node),
                objects.node_labels_of(node),
                objects.node_taints(node),
            )
            if self._node_views.get(name) == view:
                return  # a heartbeat: nothing placement depends on has changed
            self._node_views[name] = view
            self._upsert_node(view[0])
            self.eligibility.update(self.state.index[name], node)
            for key, pod in self.unplaced.pop(name, {}).items():
                self._account_bound(key, pod, name)
        self.queue.cluster_changed()
        self._wakeup.set()

    def _upsert_node(self, spec: NodeSpec) -> None:
        row = self.state.index.get(spec.name)
        if row is not None and self.state.active[row] and self.state.node_spec(spec.name) == spec:
            return
        if row is not None and self.state.active[row]:
            current = self.state.node_spec(spec.name)
            if _same_shape(current, spec):
                for gpu in spec.gpus:
                    self.state.set_gpu_health(spec.name, gpu.index, healthy=gpu.healthy)
                self.state.uuids[row] = [gpu.uuid for gpu in spec.gpus]
                return
            released = self.state.remove_node(spec.name)
        else:
            released = []
        self.state.add_node(spec)
        for placement in released:
            try:
                self.state.apply(placement)
            except PlacementRefused as error:
                log.error("node %s changed under pod %s: %s", spec.name, placement.pod, error)
                self.bound_objects.pop(placement.pod, None)

    def on_pods_listed(self, pods: list[dict[str, Any]]) -> None:
        """Rebuild every pod-derived fact from a full list: what is bound where, what waits."""
        listed = {objects.pod_key(pod) for pod in pods}
        waiting = [key for held in self.unplaced.values() for key in held]  # bound to nodes not seen yet
        for key in [*self.state.placements, *waiting]:
            if key in listed:
                continue
            if key in self.in_flight:
                self.gone_in_flight.add(key)  # released when its bind finishes
            else:
                self._release(key)
        for key in list(self.pending):
            if key not in listed:
                self._forget_pending(key)
        for pod in pods:
            self.on_pod_event("ADDED", pod)
        self.synced["pods"] = True

    def on_pod_event(self, event: str, pod: dict[str, Any]) -> None:
        key = objects.pod_key(pod)
        node = objects.node_name(pod)
        if event == "DELETED" or objects.is_done(pod):
            self._forget_pending(key)
            if key in self.in_flight:
                self.gone_in_flight.add(key)  # released when its bind finishes
            elif key in self.state.placements or any(key in pods for pods in self.unplaced.values()):
                self._release(key)
                self.queue.cluster_changed()
                self._wakeup.set()
            return
        if node:
            self._forget_pending(key)
            if key in self.state.placements and key not in self.in_flight:
                self.bound_objects[key] = pod
            elif key not in self.in_flight:
                self._account_bound(key, pod, node)
            return
        if objects.scheduler_name(pod) == self.config.name and key not in self.in_flight:
            previous = self.pending.get(key)
            self.pending[key] = pod
            if previous is None or _spec_changed(previous, pod):
                self.queue.add(key, priority=_priority(pod), created=_created(pod))
                self._wakeup.set()

    def _account_bound(self, key: str, pod: dict[str, Any], node: str) -> None:
        if node not in self.node_objects:
            self.unplaced.setdefault(node, {})[key] = pod
            return
        try:
            placement = objects.bound_placement(pod, self.state.node_spec(node))
            self.state.apply(placement)
        except (contract.ContractError, PlacementRefused) as error:
            log.error("bound pod %s on %s does not add up: %s", key, node, error)
            return
        self.bound_objects[key] = pod

    def _release(self, key: str) -> None:
        for waiting in self.unplaced.values():
            waiting.pop(key, None)
        self.bound_objects.pop(key, None)
        if key in self.state.placements:
            self.state.release(key)

    def _forget_pending(self, key: str) -> None:
        self.pending.pop(key, None)
        self.queue.forget(key)

    # ---- scheduling ---------------------------------------------------------------------------------------

    def _policy(self, workload: Workload) -> Policy:
        return POLICIES[self.config.policy](PolicyContext(rng=np.random.default_rng(), workload=workload))

    def refresh_workload(self, *, every: float = WORKLOAD_REFRESH_SECONDS) -> None:
        """Rebuild the policy with the target workload of the pods now known, bound and pending.

        Only `fgd` reads it (fragmentation is measured against the shapes the cluster expects); a live
        cluster has no trace, so its own pods stand for one, refreshed every `every` seconds.
        """
        now = time.monotonic()
        if self._workload_at is not None and now - self._workload_at < every:
            return
        demands = []
        for pod in [*self.bound_objects.values(), *self.pending.values()]:
            with contextlib.suppress(contract.ContractError):
                demands.append(objects.pod_demand(pod))
        memory = self.state.gpu_mem[self.state.gpu_mem > 0]
        reference = int(np.median(memory)) if memory.size else 16384  # for shapes asked in MiB
        self.policy = self._policy(Workload.from_pods(demands, reference_gpu_mib=reference))
        self._workload_at = now

    async def schedule_pending(self) -> int:
        """Decide every pod that is ready to be tried, starting their binds; returns how many were tried."""
        if self.config.policy == "fgd":
            self.refresh_workload()
        tried = 0
        while self.is_leader and (key := self.queue.pop()) is not None:
            pod = self.pending.get(key)
            if pod is None:
                continue
            tried += 1
            await self._schedule(key, pod)
        self.metrics.pending.set(len(self.pending))
        return tried

    async def _schedule(self, key: str, pod: dict[str, Any]) -> None:
        started = time.perf_counter()
        try:
            demand = objects.pod_demand(pod)
        except contract.ContractError as error:
            self.metrics.attempts.labels("invalid").inc()
            self.queue.park(key, priority=_priority(pod), created=_created(pod))
            await self._report_failure(pod, f"invalid GPU request: {error}")
            return
        rows, excluded = self.eligibility.rows_for(pod, self.state)
        outcome = decide(self.state, demand, self.policy, rows=rows)
        self.metrics.decision_seconds.observe(time.perf_counter() - started)
        if isinstance(outcome, Unschedulable):
            self.metrics.attempts.labels("unschedulable").inc()
            self.queue.park(key, priority=_priority(pod), created=_created(pod))
            reasons = Counter(outcome.reasons) + excluded
            message = Unschedulable(key, dict(reasons)).message
            log.info("pod %s unschedulable: %s", key, message)
            await self._report_failure(pod, message)
            return
        self.state.apply(outcome)
        self.in_flight[key] = outcome
        del self.pending[key]
        await self._slots.acquire()
        task = asyncio.create_task(self._bind(key, pod, outcome))
        self._binds.add(task)
        task.add_done_callback(self._binds.discard)

    async def _bind(self, key: str, pod: dict[str, Any], placement: Placement) -> None:
        started = time.perf_counter()
        try:
            plan = objects.bind_plan(
                pod,
                placement,
                self.state.node_spec(placement.node),
                mps_pipe_directory=self.config.mps_pipe_directory,
                env_delivery=self.config.env_delivery,
            )
            await bind(self.client, pod, placement.node, plan)
        except BindError as error:
            self.metrics.attempts.labels("error").inc()
            log.warning("pod %s: bind to %s failed, will retry: %s", key, placement.node, error)
            self.in_flight.pop(key, None)
            self._release(key)
            self.pending[key] = pod
            self.queue.backoff(key, priority=_priority(pod), created=_created(pod))
            self._wakeup.set()
        else:
            self.metrics.attempts.labels("scheduled").inc()
            self.metrics.binding_seconds.observe(time.perf_counter() - started)
            log.info("pod %s bound to %s", key, placement.node)
            self.in_flight.pop(key, None)
        finally:
            self._slots.release()
            if key in self.gone_in_flight:
                self.gone_in_flight.discard(key)
                self._forget_pending(key)
                self._release(key)

    async def wait_for_binds(self) -> None:
        while self._binds:
            await asyncio.gather(*list(self._binds), return_exceptions=True)

    async def _report_failure(self, pod: dict[str, Any], message: str) -> None:
        """An Event and a PodScheduled=False condition, so `kubectl describe` says why."""
        namespace, name = objects.meta(pod)["namespace"], objects.meta(pod)["name"]
        condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
        event = {
            "metadata": {"generateName": f"{name}.", "namespace": namespace},
            "involvedObject": {
                "kind": "Pod",
                "name": name,
                "namespace": namespace,
                "uid": objects.meta(pod).get("uid"),
                "apiVersion": "v1",
            },
            "reason": "FailedScheduling",
            "message": message,
            "type": "Warning",
            "source": {"component": self.config.name},
            "reportingComponent": self.config.name,
        }
        try:
            await self.client.patch(
                Pod.Status,
                name,
                {"status": {"conditions": [condition]}},
                namespace=namespace,
                patch_type=PatchType.STRATEGIC,
            )
            await self.client.create(build(Event, event))
        except API_ERRORS as error:
            log.warning("pod %s/%s: could not record why it is unschedulable: %s", namespace, name, error)

    # ---- running ------------------------------------------------------------------------------------------

    @property
    def pod_nodes(self) -> dict[str, str]:
        """Pods accounted in the state (bound, or reserved for a bind) and their nodes."""
        return {key: placement.node for key, placement in self.state.placements.items()}

    def lead(self) -> None:
        self.is_leader = True
        self._wakeup.set()

    @property
    def ready(self) -> bool:
        return all(self.synced.values())

    async def run(self) -> None:
        """Watch nodes and pods, and schedule while leader, until cancelled."""
        await asyncio.gather(
            reflect(
                self.client, Node, on_list=self.on_nodes_listed, on_event=self.on_node_event, namespaced=False
            ),
            reflect(
                self.client, Pod, on_list=self.on_pods_listed, on_event=self.on_pod_event, namespaced=True
            ),
            self.scheduling_loop(),
        )

    async def scheduling_loop(self) -> None:
        while True:
            if self.ready:
                try:
                    await self.schedule_pending()
                except Exception:  # a bug must not stop every other pod from being scheduled
                    log.exception("scheduling round failed; continuing")
            delay = self.queue.next_ready_in()
            self._wakeup.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._wakeup.wait(), timeout=1.0 if delay is None else max(delay, 0.01)
                )


def _same_shape(current: NodeSpec, new: NodeSpec) -> bool:
    """Only GPU health or UUIDs differ: no need to rebuild the node's allocations."""
    return (
        current.cpu_milli == new.cpu_milli
        and current.memory_mib == new.memory_mib
        and [(g.index, g.model, g.memory_mib) for g in current.gpus]
        == [(g.index, g.model, g.memory_mib) for g in new.gpus]
    )


def _priority(pod: Mapping[str, Any]) -> int:
    return int((pod.get("spec") or {}).get("priority") or 0)


def _created(pod: Mapping[str, Any]) -> float:
    stamp = objects.meta(pod).get("creationTimestamp") or ""
    return (
        time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")) if isinstance(stamp, str) and stamp else 0.0
    )


def _spec_changed(before: Mapping[str, Any], after: Mapping[str, Any]) -> bool:
    """A pending pod whose annotations or resources changed may fit now; a status update alone changes
    nothing for placement."""
    return objects.meta(before).get("annotations") != objects.meta(after).get("annotations") or before.get(
        "spec"
    ) != after.get("spec")
