"""The node agent's loop: one `tick()` per interval, which tests call one at a time.

Each tick samples NVML, lets the MPS supervisor check its daemons, brings the Node's inventory labels up to
date, maps every GPU process to its pod, and handles what the watchdog finds according to the mode.

Nothing is acted on twice, across agent restarts too, and the agent keeps no state on disk: every action
leaves an Event whose name is derived from what was acted on (the pod or node, the container, the GPU and
the processes by pid and start time). Before acting, the agent looks that Event up; if it exists, an
earlier run did it. An eviction is also never repeated for a pod that is already being deleted. The Event is
written after the action, so a crash in between can repeat an action (a second SIGKILL to a process that
is already dying), never skip one.

A process without a contract is handled only once it is seen in two consecutive intervals: a container
that just started may run before the kubelet reports its ID in the pod's status.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import signal
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import lightkube
from lightkube.resources.core_v1 import Event, Node, Pod
from lightkube.types import PatchType

from gpufrac.contract import node_inventory
from gpufrac.contract.node_inventory import Enforcement
from gpufrac.kubeapi import events
from gpufrac.kubeapi.client import API_ERRORS, TRANSPORT_ERRORS
from gpufrac.node import eviction, inventory, procfs, watchdog
from gpufrac.node.exporter import Exporter, GpuView, Observation
from gpufrac.node.mps import Supervisor
from gpufrac.node.nvml import Backend, Snapshot
from gpufrac.node.watchdog import Finding, Kind, Mode

log = logging.getLogger(__name__)

COMPONENT = "gpufrac-agent"
SM_SHARING_DAEMON = "sm-sharing"


class Killer(Protocol):
    def kill(self, pid: int, start_time: int) -> str:
        """Send SIGKILL to the process `pid` if it is still the one that started at `start_time`; say what
        happened in a few words."""
        ...


class SignalKiller:
    """The real killer: SIGKILL through a pidfd, after checking the pid still names the same process, so
    a pid reused since the sample is never hit. Needs the host's pid namespace (`hostPID`)."""

    def __init__(self, proc: procfs.ProcFS) -> None:
        self._proc = proc

    def kill(self, pid: int, start_time: int) -> str:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return "already gone"
        try:
            info = self._proc.process(pid)
            if info is None or (start_time and info.start_time != start_time):
                return "already gone"
            signal.pidfd_send_signal(fd, signal.SIGKILL)
            return "killed"
        except ProcessLookupError:
            return "already gone"
        finally:
            os.close(fd)


class DryRunKiller:
    """For a fake NVML, whose pids are made up: never signals anything, only says it would have."""

    def kill(self, pid: int, start_time: int) -> str:
        return "not signalled (fake NVML)"


@dataclass(frozen=True)
class Settings:
    node_name: str
    mode: Mode = Mode.KILL
    interval: float = 10.0
    proc_root: Path = Path("/proc")


@dataclass
class Handled:
    """What one tick did about one finding, for logs and tests."""

    finding: Finding
    action: str
    outcome: str


@dataclass
class TickReport:
    snapshot: Snapshot
    gpus: tuple[node_inventory.GpuInfo, ...] = ()
    level: Enforcement = Enforcement.NONE
    findings: tuple[Finding, ...] = ()
    handled: list[Handled] = field(default_factory=list)
    usages: tuple[watchdog.Usage, ...] = ()


class Agent:
    def __init__(
        self,
        settings: Settings,
        *,
        client: lightkube.AsyncClient,
        nvml: Backend,
        killer: Killer,
        supervisor: Supervisor | None = None,
        exporter: Exporter | None = None,
        own_container: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.client = client
        self.nvml = nvml
        self.killer = killer
        self.supervisor = supervisor
        self.exporter = exporter or Exporter()
        self.proc = procfs.ProcFS(settings.proc_root)
        self._own_container = own_container
        self._clock = clock
        self._done: set[str] = set()
        self._suspects: set[str] = set()
        self._health: dict[int, bool] = {}
        self._nvml_error = ""
        self._broken_pods: set[str] = set()

    # --- the loop ------------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Tick every interval until `stop` is set; a tick that fails is logged, and the next one runs."""
        while not stop.is_set():
            started = self._clock()
            try:
                await self.tick()
            except Exception:
                log.exception("the agent's tick failed; trying again next interval")
            wait = max(0.0, self.settings.interval - (self._clock() - started))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=wait)

    async def close(self) -> None:
        if self.supervisor is not None:
            await asyncio.to_thread(self.supervisor.stop)
        self.nvml.close()

    async def tick(self) -> TickReport:
        snapshot = await asyncio.to_thread(self.nvml.sample)
        self._log_health(snapshot)
        if self.supervisor is not None:
            await asyncio.to_thread(self.supervisor.step, self._clock())
        mps_up = self.supervisor is not None and self.supervisor.healthy(SM_SHARING_DAEMON)
        level = inventory.enforcement(
            driver_version=snapshot.driver_version,
            nvml_ok=not snapshot.error,
            mps_healthy=mps_up,
            acting=self.settings.mode is not Mode.REPORT,
        )
        report = TickReport(snapshot, level=level)
        report.gpus = await self._publish(snapshot, level)
        pods = await self._pods()
        if pods is None:
            # No pods, no judgement: acting blind could kill a process that has a contract.
            self._observe(snapshot, (), (), level)
            return report
        containers = watchdog.containers_on_node(pods)
        self._log_broken_contracts(containers)
        gpus = [watchdog.Gpu(gpu.index, gpu.uuid) for gpu in snapshot.gpus]
        assessment = watchdog.assess(self._processes(snapshot), containers, gpus=gpus)
        report.findings, report.usages = assessment.findings, assessment.usages
        # Forget what is no longer found: memory stays bounded, and should it come back, its Event says.
        self._done &= {self._key(finding) for finding in assessment.findings}
        suspects, self._suspects = (
            self._suspects,
            {f.key for f in assessment.findings if f.kind is Kind.NO_CONTRACT},
        )
        for finding in assessment.findings:
            if finding.kind is Kind.NO_CONTRACT and finding.key not in suspects:
                continue  # seen for the first time: wait one interval
            handled = await self._handle(finding)
            if handled is not None:
                report.handled.append(handled)
        self._observe(snapshot, assessment.usages, containers.values(), level)
        return report

    # --- inventory -----------------------------------------------------------------------------------

    async def _publish(self, snapshot: Snapshot, level: Enforcement) -> tuple[node_inventory.GpuInfo, ...]:
        name = self.settings.node_name
        try:
            node = await self.client.get(Node, name)
        except API_ERRORS as error:
            log.error("cannot read Node %s (%s); inventory not published this interval", name, error)
            return ()
        metadata = node.metadata.to_dict() if node.metadata is not None else {}
        gpus = inventory.gpus(snapshot, inventory.published_gpus(metadata.get("annotations") or {}))
        patch = inventory.node_patch(metadata, gpus=gpus, driver_version=snapshot.driver_version, level=level)
        if patch is not None:
            try:
                await self.client.patch(Node, name, patch, patch_type=PatchType.MERGE)
                log.info("Node %s: published %s", name, patch["metadata"])
            except API_ERRORS as error:
                log.error("cannot patch Node %s (%s); will try again next interval", name, error)
        return gpus

    def _log_health(self, snapshot: Snapshot) -> None:
        if snapshot.error != self._nvml_error:
            if snapshot.error:
                log.error("%s; every GPU of this node is unhealthy until NVML answers again", snapshot.error)
            else:
                log.info("NVML answers again (driver %s)", snapshot.driver_version)
            self._nvml_error = snapshot.error
        for gpu in snapshot.gpus:
            if self._health.get(gpu.index, True) != gpu.healthy:
                if gpu.healthy:
                    log.info("GPU %d (%s) is healthy again", gpu.index, gpu.uuid)
                else:
                    log.error("GPU %d (%s) is unhealthy: NVML failed: %s", gpu.index, gpu.uuid, gpu.error)
            self._health[gpu.index] = gpu.healthy

    # --- the watchdog --------------------------------------------------------------------------------

    async def _pods(self) -> list[dict[str, Any]] | None:
        try:
            fields: dict[str, Any] = {"spec.nodeName": self.settings.node_name}
            return [pod.to_dict() async for pod in self.client.list(Pod, namespace="*", fields=fields)]
        except API_ERRORS as error:
            log.error("cannot list the pods on this node (%s); the watchdog skips this interval", error)
            return None

    def _processes(self, snapshot: Snapshot) -> list[watchdog.Process]:
        own = self.supervisor.pids() if self.supervisor is not None else set()
        found = []
        for gpu in snapshot.gpus:
            for process in gpu.processes:
                info = self.proc.process(process.pid)
                if info is None:
                    log.debug(
                        "GPU process %d is not in %s (ended, or no hostPID)", process.pid, self.proc.root
                    )
                    continue
                if info.pid in own or info.ppid in own:
                    continue  # an MPS control daemon or the MPS server it started
                if self._own_container is not None and info.container_id == self._own_container:
                    continue
                found.append(
                    watchdog.Process(
                        pid=process.pid,
                        start_time=info.start_time,
                        gpu=watchdog.Gpu(gpu.index, gpu.uuid),
                        used_bytes=process.used_bytes,
                        container_id=info.container_id,
                    )
                )
        return found

    def _log_broken_contracts(self, containers: dict[str, watchdog.Container]) -> None:
        for container in containers.values():
            key = container.pod.uid
            if container.problem and key not in self._broken_pods:
                self._broken_pods.add(key)
                log.warning("pod %s/%s: %s", container.pod.namespace, container.pod.name, container.problem)

    def _action(self, finding: Finding) -> str:
        mode = self.settings.mode
        if mode is Mode.EVICT and finding.container is None:
            return Mode.REPORT.value  # a process in no pod cannot be evicted
        return mode.value

    def _key(self, finding: Finding) -> str:
        """What an action is on: an eviction on the pod, anything else on the processes at fault."""
        action = self._action(finding)
        if action == Mode.EVICT and finding.container is not None:
            return f"evict/{finding.container.pod.uid}"
        return f"{action}/{finding.key}"

    async def _handle(self, finding: Finding) -> Handled | None:
        action = self._action(finding)
        pod = finding.container.pod if finding.container else None
        key = self._key(finding)
        if key in self._done:
            return None
        if action == Mode.EVICT and pod is not None and pod.deleting:
            self._done.add(key)
            return None
        involved = self._involved(finding)
        namespace = involved.get("namespace") or "default"
        name = event_name(involved["name"] or "", key)
        try:
            await self.client.get(Event, name, namespace=namespace)
            self._done.add(key)
            log.info("already handled before this agent started: %s", finding.detail)
            return None
        except lightkube.ApiError as error:
            if error.status.code != 404:
                log.error("cannot look up Event %s (%s); not acting this interval", name, error)
                return None
        except TRANSPORT_ERRORS as error:
            log.error("cannot reach the API (%s); not acting this interval", error)
            return None
        ok, outcome = await self._act(action, finding)
        if not ok:
            log.error("%s: %s failed: %s; trying again next interval", finding.detail, action, outcome)
            return Handled(finding, action, outcome)
        self._done.add(key)
        message = f"{outcome}: {finding.detail} (mode {self.settings.mode.value})"
        log.warning("%s: %s", finding.kind.value, message)
        event = events.warning(
            involved=involved,
            reason=finding.kind.value,
            message=message,
            component=COMPONENT,
            host=self.settings.node_name,
            name=name,
        )
        await events.record(self.client, event)
        self.exporter.breaches.labels(finding.kind.value).inc()
        self.exporter.actions.labels(action).inc()
        return Handled(finding, action, outcome)

    async def _act(self, action: str, finding: Finding) -> tuple[bool, str]:
        if action == Mode.KILL:
            said = [f"{p.pid} {self.killer.kill(p.pid, p.start_time)}" for p in finding.processes]
            return True, "Killed processes (pid, outcome): " + "; ".join(said)
        if action == Mode.EVICT:
            assert finding.container is not None
            pod = finding.container.pod
            try:
                await eviction.evict(self.client, pod.name, namespace=pod.namespace)
            except API_ERRORS as error:
                return False, f"eviction of {pod.namespace}/{pod.name} refused: {error}"
            return True, f"Evicted pod {pod.namespace}/{pod.name}"
        return True, "Reported"

    def _involved(self, finding: Finding) -> dict[str, str | None]:
        if finding.container is not None:
            pod = finding.container.pod
            return {"kind": "Pod", "namespace": pod.namespace, "name": pod.name, "uid": pod.uid}
        return {"kind": "Node", "name": self.settings.node_name}

    # --- metrics -------------------------------------------------------------------------------------

    def _observe(
        self,
        snapshot: Snapshot,
        usages: Sequence[watchdog.Usage],
        containers: Iterable[watchdog.Container],
        level: Enforcement,
    ) -> None:
        acting = self.settings.mode is not Mode.REPORT
        sm_devices = {device for c in containers if c.sm_sharing for device in c.devices}
        gpus = tuple(
            GpuView(
                gpu.index,
                gpu.uuid,
                gpu.healthy,
                inventory.gpu_enforcement(
                    level,
                    healthy=gpu.healthy,
                    sm_sharing=bool({gpu.uuid, str(gpu.index)} & sm_devices),
                    acting=acting,
                ),
                gpu.utilization,
            )
            for gpu in snapshot.gpus
        )
        mps = (
            {}
            if self.supervisor is None
            else {name: self.supervisor.healthy(name) for name in self.supervisor.daemons}
        )
        self.exporter.observe(Observation(tuple(usages), gpus, level, mps))


def event_name(involved: str, key: str) -> str:
    """A valid Event name that is the same for the same action, whichever agent run computes it."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:20]
    return f"{involved[:200]}.gpufrac-{digest}"
