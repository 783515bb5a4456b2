"""The node agent's loop: one `tick()` per interval, which tests call one at a time.

Each tick samples NVML, lets the MPS supervisor check its daemons, brings the Node's inventory labels up to
date, maps every GPU process to its pod, and handles what the watchdog finds according to the mode.

Nothing is acted on twice within a run: what was done is remembered in the agent's own memory, keyed by
what was acted on (the pod's UID, the container, the GPU and the processes by pid and start time), and
forgotten once the finding is gone. Nothing a tenant can write decides whether the agent acts: its Events
get names the API server generates, and no Event is looked up (a tenant who may create Events in its
namespace could otherwise create the one a kill would be recorded under, and so never be killed). After a
restart the agent acts again on what is still found: a process still running over its limit is killed
again (which it should be), an eviction is not repeated for a pod already being deleted, and a report is
recorded once more.

A kill hits only the process the watchdog judged (see `SignalKiller`): the pid is pinned with a pidfd and
the process's start time and container checked, before and after NVML is asked again whether it still
holds the GPU (`recheck`). An eviction waits for the same second look at each of the finding's processes.

A tick says what it could not do (`TickReport.problems`): NVML unreadable, the Node or the pods not read,
the kubelet's PodResources API unreadable. `gpufrac agent --once` exits non-zero on any, and when the node
is not Ready.

Who hands out `nvidia.com/gpu` (`Settings.device_plugin`, see `node_inventory.DevicePluginMode`): where a
device plugin runs, each tick reads the kubelet's PodResources API to publish which pod holds each GPU, and
gives the watchdog those grants as contracts. In managed mode the agent serves `nvidia.com/gpu` itself,
and refuses to while another device plugin advertises it. Each tick ends by setting the Node's
`gpufrac.io/Ready` condition (`inventory.readiness`), written when it changes and refreshed at least every
`HEARTBEAT_SECONDS`, so that the scheduler can tell a dead agent's condition from a live one's.

A process without a contract in no pod on the node is handled only once its container (or, for one in no
container, the host) is seen running one, on any GPU, in two of the last three intervals (`suspects`): a
container that just started may run before the kubelet reports its ID in the pod's status.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import logging
import os
import signal
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import lightkube
from lightkube.resources.core_v1 import Node, Pod
from lightkube.types import PatchType

from gpufrac.contract import memory_resource, node_inventory
from gpufrac.contract.node_inventory import DevicePluginMode, Enforcement
from gpufrac.kubeapi import events, eviction
from gpufrac.kubeapi.client import API_ERRORS, READ_ERRORS
from gpufrac.node import bursts, inventory, nvidia_resources, procfs, recheck, suspects, watchdog
from gpufrac.node.exporter import Exporter, GpuView, Observation
from gpufrac.node.kubelet.device_plugin import DevicePluginError
from gpufrac.node.kubelet.podresources import PodResourcesError
from gpufrac.node.mps import Supervisor
from gpufrac.node.nvml import MIB, Backend, Snapshot
from gpufrac.node.watchdog import Finding, Mode

log = logging.getLogger(__name__)

COMPONENT = "gpufrac-agent"
SM_SHARING_DAEMON = "sm-sharing"
PLUGIN_ENDPOINT = "gpufrac-gpu.sock"  # managed mode: gpufrac's device plugin socket in the kubelet's folder


class NotKilled(Exception):
    """The killer neither signalled the process nor saw it gone, and it may still hold the GPU: nothing
    happened, so the finding is not remembered as done and is acted on again next interval."""


class Killer(Protocol):
    def kill(self, process: watchdog.Process) -> str:
        """Send SIGKILL to `process` if its pid still names it; say what happened in a few words. Raise
        NotKilled, saying why, when it could not tell whether to."""
        ...


class SignalKiller:
    """The real killer: SIGKILL through a pidfd to the very process the watchdog judged, never to a later
    one that reused its pid. Needs the host's pid namespace (`hostPID`).

    The pidfd pins one process while `recheck.SecondLook` makes sure it is the judged one, still on its
    GPU; only a process killed or gone is done with. One the second look cannot confirm is not signalled
    (NotKilled), and judged again next interval."""

    def __init__(self, proc: procfs.ProcFS, nvml: Backend) -> None:
        self._look = recheck.SecondLook(proc, nvml)

    def kill(self, process: watchdog.Process) -> str:
        try:
            return self._kill(process)
        except recheck.Unconfirmed as why:
            raise NotKilled(str(why)) from None
        except ProcessLookupError:
            return "already gone"
        except OSError as error:  # ENOSYS (a kernel before 5.3), EMFILE, EPERM: try again next interval
            raise NotKilled(error.strerror or str(error)) from None

    def _kill(self, process: watchdog.Process) -> str:
        fd = os.pidfd_open(process.pid)
        try:
            gone = self._look.gone(process)
            if gone:
                return gone
            signal.pidfd_send_signal(fd, signal.SIGKILL)
            return "killed"
        finally:
            os.close(fd)


class DryRunKiller:
    """For a fake NVML, whose pids are made up: never signals anything, only says it would have."""

    def kill(self, process: watchdog.Process) -> str:
        return "not signalled (fake NVML)"


class PodResources(Protocol):
    """The kubelet's PodResources API (`kubelet.podresources.PodResourcesClient`)."""

    def list(self) -> Sequence[inventory.Granted]: ...

    def allocatable(self) -> Mapping[str, Sequence[str]] | None: ...

    def close(self) -> None: ...


class PluginServer(Protocol):
    """gpufrac's own `nvidia.com/gpu` device plugin (`kubelet.device_plugin.DevicePluginServer`)."""

    @property
    def registered(self) -> bool: ...

    def start(self) -> None: ...

    def set_health(self, healthy: Mapping[str, bool]) -> None: ...

    def stop(self) -> None: ...


@dataclass(frozen=True)
class Settings:
    """`device_plugin`: a `DevicePluginMode` value or `auto` (resolved from the Node's labels at the first
    tick that reads it). `native_label`: the label (key, value) that shows NVIDIA's operator holds limits
    on the node. `cuda_context_mib`: taken from each GPU's allocatable memory for a CUDA context."""

    node_name: str
    mode: Mode = Mode.KILL
    interval: float = 10.0
    proc_root: Path = Path("/proc")
    device_plugin: str = DevicePluginMode.NONE.value
    native_label: tuple[str, str] = (node_inventory.NATIVE_LABEL, node_inventory.NATIVE_LABEL_VALUE)
    cuda_context_mib: int = inventory.DEFAULT_CUDA_CONTEXT_MIB
    fraction_reference_mib: int = memory_resource.DEFAULT_FRACTION_REFERENCE_MIB


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
    problems: list[str] = field(default_factory=list)  # what this tick could not do, one line each
    mode: DevicePluginMode | None = None  # None until the Node was read once (for `auto`)
    ready: inventory.Readiness | None = None  # None when the Node could not be read
    # Device IDs the kubelet's device plugins advertise under NVIDIA's names for GPUs (`nvidia_resources`);
    # None where the kubelet cannot say (before Kubernetes 1.23's GetAllocatableResources) or nothing was
    # asked.
    advertised: tuple[str, ...] | None = None


def _untrusted(report: TickReport, error: str) -> tuple[None, str]:
    """The device grants of a PodResources answer that could not be read or trusted: none this tick."""
    report.problems.append(f"{error}; holders stay as published and the watchdog did not judge")
    log.error("%s this interval", report.problems[-1])
    return None, error


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
        pod_resources: PodResources | None = None,
        plugin_server: Callable[[Sequence[str]], PluginServer] | None = None,
        wall_clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
    ) -> None:
        """`pod_resources`: needed in modes coexist and managed; `plugin_server` makes gpufrac's device
        plugin for the GPUs' UUIDs, in managed mode."""
        self.settings = settings
        self.client = client
        self.nvml = nvml
        self.killer = killer
        self.supervisor = supervisor
        self.exporter = exporter or Exporter()
        self.proc = procfs.ProcFS(settings.proc_root)
        self._second_look = recheck.SecondLook(self.proc, nvml)  # before an eviction, as before a kill
        self._own_container = own_container
        self._clock = clock
        self._done: set[str] = set()
        self._suspects = suspects.Suspects()
        self._health: dict[int, bool] = {}
        self._nvml_error = ""
        self._broken_pods: set[str] = set()
        self._pod_resources = pod_resources
        self._make_plugin = plugin_server
        self._plugin: PluginServer | None = None
        self._plugin_devices: tuple[str, ...] = ()
        self._wall_clock = wall_clock
        self._mode: DevicePluginMode | None = None
        self._registered_once = False  # gpufrac's device plugin registered in this process
        if settings.device_plugin != DevicePluginMode.NONE and pod_resources is None:
            raise ValueError(f"--device-plugin {settings.device_plugin} needs the kubelet's PodResources API")
        self._condition: Mapping[str, Any] | None = None  # gpufrac.io/Ready as last read or written
        self._conflict = ""  # the device plugin conflict last logged
        # --mode, or the node's `gpufrac.io/watchdog` label once the Node was read
        # (`inventory.watchdog_mode`), but report while a device-plugin prerequisite fails
        # (`_only_report_while`)
        self.watchdog_mode = settings.mode
        self._reporting_only = ""  # the device-plugin reason the watchdog last only reported for

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

    async def close(self, *, stopping: bool = True) -> None:
        """A clean stop: the node stops being Ready (nothing will keep its inventory true), then gpufrac's
        device plugin, the MPS daemons and NVML stop. `stopping` False (a one-off check beside the node's
        running agent) leaves the condition as the check found it."""
        if stopping:
            stopped = inventory.Readiness(False, "AgentStopped", "the gpufrac agent on this node stopped")
            await self._set_condition(stopped, self._condition, [])
        if self._plugin is not None:
            await asyncio.to_thread(self._plugin.stop)
        if self._pod_resources is not None:
            self._pod_resources.close()
        if self.supervisor is not None:
            await asyncio.to_thread(self.supervisor.stop)
        self.nvml.close()

    async def tick(self) -> TickReport:
        snapshot = await asyncio.to_thread(self.nvml.sample)
        self._log_health(snapshot)
        if self.supervisor is not None:
            await asyncio.to_thread(self.supervisor.step, self._clock())
        mps_up = self.supervisor is not None and self.supervisor.healthy(SM_SHARING_DAEMON)
        report = TickReport(snapshot)
        if snapshot.error:
            report.problems.append(snapshot.error)
        node = await self._node(report.problems)
        metadata: dict[str, Any] = (node.get("metadata") or {}) if node else {}
        status: dict[str, Any] = (node.get("status") or {}) if node else {}
        labels: dict[str, str] = metadata.get("labels") or {}
        if node is not None and self._mode is None:
            self._mode = inventory.resolve_mode(self.settings.device_plugin, labels)
            log.info(
                "device plugin mode %s (--device-plugin %s)", self._mode.value, self.settings.device_plugin
            )
        report.mode = self._mode
        if node is not None:
            self.watchdog_mode = inventory.watchdog_mode(self.settings.mode, labels)
        pods = await self._pods(report.problems)
        allocatable = None if node is None else status.get("allocatable") or {}
        grants, grants_error = await self._grants(report, pods, allocatable)
        facts = None
        if node is not None and self._mode is not None:
            kubelet_gpus = inventory.kubelet_gpus(status.get("allocatable"))
            conflict, plugin_error = "", ""
            if self._mode is DevicePluginMode.MANAGED:
                conflict, plugin_error = await self._serve_gpus(snapshot, labels, kubelet_gpus, report)
            facts = inventory.Facts(
                mode=self._mode,
                nvml_error=snapshot.error,
                gpu_count=len(snapshot.gpus),
                mps_supervised=self.supervisor is not None,
                mps_healthy=mps_up,
                pod_resources_error=grants_error,
                plugin_conflict=conflict,
                plugin_error=plugin_error,
                plugin_registered=self._plugin is not None and self._plugin.registered,
                kubelet_gpus=kubelet_gpus,
                plugin_shares=inventory.plugin_shares(
                    report.advertised or (), status.get("allocatable"), len(snapshot.gpus)
                ),
            )
            # Settled before the level is worked out and published: a node whose watchdog only reports
            # this tick must not claim, on its label and metrics, a watchdog that acts.
            self._only_report_while(inventory.device_plugin_failure(facts))
        report.level = inventory.enforcement(
            native=inventory.native(labels, self.settings.native_label),
            nvml_ok=not snapshot.error and bool(snapshot.gpus),
            mps_healthy=mps_up,
            acting=self.watchdog_mode is not Mode.REPORT,
        )
        if facts is not None:
            holders = None if grants is None else inventory.holders(grants, snapshot)
            report.gpus, published = await self._publish(metadata, snapshot, report, holders)
            published = await self._advertise(status, report.gpus, report.problems) and published
            report.ready = inventory.readiness(dataclasses.replace(facts, published=published))
            current = inventory.find_condition(status.get("conditions"))
            await self._set_condition(report.ready, current, report.problems)
        if pods is None or grants_error:
            # No pods or no device grants, no judgement: acting blind could kill a process that has a
            # contract.
            self._observe(snapshot, (), (), report.level)
            return report
        containers = watchdog.containers_on_node(pods, device_plugin=grants)
        self._log_broken_contracts(containers)
        # A GPU NVML cannot read lists no process: its shares' use is unknown, not zero.
        gpus = [watchdog.Gpu(gpu.index, gpu.uuid) for gpu in snapshot.gpus if gpu.healthy]
        processes = self._processes(snapshot)
        assessment = watchdog.assess(processes, containers, gpus=gpus)
        assessment = bursts.reclaim(assessment, processes, self._memory(snapshot))
        report.findings, report.usages = assessment.findings, assessment.usages
        # Forget what is no longer found: memory stays bounded, and should it come back, its Event says.
        self._done &= {self._key(finding) for finding in assessment.findings}
        waited = self._suspects.ready(
            suspects.key(finding) for finding in assessment.findings if suspects.waits(finding)
        )
        for finding in assessment.findings:
            if suspects.waits(finding) and suspects.key(finding) not in waited:
                continue  # its container may be too new for the kubelet to have reported it
            try:
                handled = await self._handle(finding)
            except Exception as error:  # one finding's failure must not leave the others, or /metrics, undone
                report.problems.append(f"cannot handle {finding.detail}: {type(error).__name__}: {error}")
                log.error("%s; trying again next interval", report.problems[-1])
                continue
            if handled is not None:
                report.handled.append(handled)
        self._observe(snapshot, assessment.usages, containers.values(), report.level)
        return report

    # --- inventory -----------------------------------------------------------------------------------

    async def _node(self, problems: list[str]) -> dict[str, Any] | None:
        name = self.settings.node_name
        try:
            return (await self.client.get(Node, name)).to_dict()
        except READ_ERRORS as error:
            problems.append(f"cannot read Node {name} ({error}); inventory and readiness not published")
            log.error("%s this interval", problems[-1])
            return None

    async def _publish(
        self,
        metadata: Mapping[str, Any],
        snapshot: Snapshot,
        report: TickReport,
        holders: Mapping[int, str] | None,
    ) -> tuple[tuple[node_inventory.GpuInfo, ...], bool]:
        """The GPUs published, and whether the Node now says what it should."""
        assert self._mode is not None
        name = self.settings.node_name
        gpus = inventory.gpus(
            snapshot,
            inventory.published_gpus(metadata.get("annotations") or {}),
            holders=holders,
            context_mib=self.settings.cuda_context_mib,
        )
        patch = inventory.node_patch(
            metadata, gpus=gpus, driver_version=snapshot.driver_version, level=report.level, mode=self._mode
        )
        if patch is not None:
            try:
                await self.client.patch(Node, name, patch, patch_type=PatchType.MERGE)
                log.info("Node %s: published %s", name, patch["metadata"])
            except API_ERRORS as error:
                report.problems.append(f"cannot patch Node {name} ({error})")
                log.error("%s; will try again next interval", report.problems[-1])
                return gpus, False
        return gpus, True

    async def _advertise(
        self, status: Mapping[str, Any], gpus: Sequence[node_inventory.GpuInfo], problems: list[str]
    ) -> bool:
        """Advertise the node's `gpufrac.io/gpu-memory`; whether the Node now does."""
        reference = self.settings.fraction_reference_mib
        patch = inventory.capacity_patch(status, gpus=gpus, reference_mib=reference)
        if patch is None:
            return True
        name = self.settings.node_name
        try:
            await self.client.patch(Node.Status, name, patch, patch_type=PatchType.MERGE)
        except API_ERRORS as error:
            resource = memory_resource.GPU_MEMORY_RESOURCE
            problems.append(f"cannot advertise {resource} on Node {name} ({error})")
            log.error("%s; will try again next interval", problems[-1])
            return False
        log.info("Node %s: advertised %s", name, patch["status"]["capacity"])
        return True

    async def _set_condition(
        self, want: inventory.Readiness, current: Mapping[str, Any] | None, problems: list[str]
    ) -> None:
        """Write `gpufrac.io/Ready` on the Node's status where it changed."""
        self._condition = current
        patch = inventory.condition_patch(current, want, self._wall_clock())
        if patch is None:
            return
        name = self.settings.node_name
        try:
            await self.client.patch(Node.Status, name, patch, patch_type=PatchType.STRATEGIC)
        except API_ERRORS as error:
            problems.append(
                f"cannot set the {node_inventory.READY_CONDITION} condition on Node {name} ({error})"
            )
            log.error("%s; will try again next interval", problems[-1])
            return
        self._condition = patch["status"]["conditions"][0]
        say = log.info if want.ready else log.warning
        say(
            "Node %s: %s=%s (%s: %s)",
            name,
            node_inventory.READY_CONDITION,
            want.ready,
            want.reason,
            want.message,
        )

    # --- the kubelet ---------------------------------------------------------------------------------

    async def _grants(
        self, report: TickReport, pods: list[dict[str, Any]] | None, allocatable: Mapping[str, Any] | None
    ) -> tuple[dict[inventory.ContainerKey, tuple[str, ...]] | None, str]:
        """The `nvidia.com/gpu` devices the kubelet gave each container, and why they could not be read
        (empty when they were), or could not be trusted: an answer that leaves out a running container of
        the node's `pods` asking for them among the Node's `allocatable` resources (`inventory.ungranted`;
        None: the Node was not read). ({}, "") where no device plugin runs (mode none)."""
        if self._mode is DevicePluginMode.NONE or self.settings.device_plugin == DevicePluginMode.NONE:
            return {}, ""
        assert self._pod_resources is not None  # checked in __init__
        try:
            listing = await asyncio.to_thread(self._pod_resources.list)
            advertised = await asyncio.to_thread(self._pod_resources.allocatable)
        except PodResourcesError as error:
            return _untrusted(report, str(error))
        if advertised is not None:
            report.advertised = tuple(
                device
                for resource, devices in advertised.items()
                if nvidia_resources.names_gpus(resource)
                for device in devices
            )
        grants = inventory.gpu_grants(listing)
        missing = inventory.ungranted(pods or (), grants, allocatable)
        if missing:
            return _untrusted(
                report,
                f"the kubelet's PodResources lists no {node_inventory.GPU_RESOURCE} device for running "
                f"{', '.join(missing[:3])}{' and more' if len(missing) > 3 else ''} (a kubelet still syncing "
                "after a restart?)",
            )
        return grants, ""

    async def _serve_gpus(
        self, snapshot: Snapshot, labels: Mapping[str, str], kubelet_gpus: int, report: TickReport
    ) -> tuple[str, str]:
        """Managed mode: serve `nvidia.com/gpu` from gpufrac's device plugin, unless another device plugin
        advertises it; (the conflict, why it could not start), each empty when there is none."""
        registered_before = self._registered_once
        conflict = inventory.plugin_conflict(
            labels,
            0 if registered_before else kubelet_gpus,  # once gpufrac registered, the count is its own
            None if registered_before else report.advertised,
        )
        if conflict:
            if conflict != self._conflict:
                log.warning("not serving %s: %s", node_inventory.GPU_RESOURCE, conflict)
            self._conflict = conflict
            return conflict, ""
        self._conflict = ""
        # Every GPU served so far stays (one unreadable now is served unhealthy); one NVML names for the first
        # time (unreadable at start, or added) needs a plugin made anew: a plugin's device list is fixed.
        known = () if snapshot.error else tuple(gpu.uuid for gpu in snapshot.gpus if gpu.uuid)
        devices = tuple(dict.fromkeys(self._plugin_devices + known))
        if not devices:
            return "", f"not serving {node_inventory.GPU_RESOURCE}: NVML lists no GPU to serve"
        if self._plugin is None or devices != self._plugin_devices:
            if self._plugin is not None:
                log.info("serving %s anew, for GPUs NVML names now", node_inventory.GPU_RESOURCE)
                await asyncio.to_thread(self._plugin.stop)
            assert self._make_plugin is not None, "managed mode needs a device plugin server"
            self._plugin, self._plugin_devices = self._make_plugin(devices), devices
        if not self._plugin.registered:
            try:
                await asyncio.to_thread(self._plugin.start)
                self._registered_once = True
                log.info("serving %s for %s", node_inventory.GPU_RESOURCE, ", ".join(self._plugin_devices))
            except DevicePluginError as error:
                report.problems.append(str(error))
                log.error("%s; will try again next interval", error)
                return "", str(error)
        healthy = {gpu.uuid: gpu.healthy and not snapshot.error for gpu in snapshot.gpus}
        self._plugin.set_health({device: healthy.get(device, False) for device in self._plugin_devices})
        return "", ""

    def _only_report_while(self, failure: tuple[str, str] | None) -> None:
        """Report only, this tick, while a device-plugin prerequisite fails
        (`inventory.device_plugin_failure`): grants the agent cannot read or understand would make a device
        plugin's own pods look contract-less. Logged once per reason."""
        if failure is None or self.watchdog_mode is Mode.REPORT:
            self._reporting_only = ""
            return
        reason, message = failure
        if reason != self._reporting_only:
            log.warning(
                "the watchdog only reports, not %s, until this is mended: %s: %s",
                self.watchdog_mode.value,
                reason,
                message,
            )
        self._reporting_only = reason
        self.watchdog_mode = Mode.REPORT

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

    async def _pods(self, problems: list[str]) -> list[dict[str, Any]] | None:
        try:
            fields: dict[str, Any] = {"spec.nodeName": self.settings.node_name}
            return [pod.to_dict() async for pod in self.client.list(Pod, namespace="*", fields=fields)]
        except READ_ERRORS as error:
            problems.append(f"cannot list the pods on this node ({error}); the watchdog did not judge")
            log.error("%s this interval", problems[-1])
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
                if info.container_id == self._own_container and (
                    self._own_container is not None or info.pid in own or info.ppid in own
                ):
                    # The agent's own: its container's processes, or (an agent outside any container, or
                    # in one it cannot name) the MPS daemons and the servers they started. Their pids come
                    # from the pipe directory, which sm-sharing tenants mount and can write, so a pid
                    # there never exempts a process in another container.
                    continue
                found.append(
                    watchdog.Process(
                        pid=process.pid,
                        start_time=info.start_time,
                        gpu=watchdog.Gpu(gpu.index, gpu.uuid),
                        used_bytes=process.used_bytes,
                        container_id=info.container_id,
                        sm_percent=process.sm_percent,
                    )
                )
        return found

    def _memory(self, snapshot: Snapshot) -> dict[watchdog.Gpu, int]:
        """Bytes the shares of each GPU may use together: its allocatable memory, as published (requests
        are portions of it). A GPU whose memory NVML could not read is left out, and not judged for
        bursts."""
        context = self.settings.cuda_context_mib
        return {
            watchdog.Gpu(g.index, g.uuid): inventory.allocatable_mib(g.memory_mib, g.reserved_mib, context)
            * MIB
            for g in snapshot.gpus
            if g.memory_mib
        }

    def _log_broken_contracts(self, containers: dict[str, watchdog.Container]) -> None:
        """Once per pod while its contract stays broken; pods gone or mended are forgotten, so a tenant who
        keeps creating broken pods does not grow this set."""
        self._broken_pods &= {container.pod.uid for container in containers.values() if container.problem}
        for container in containers.values():
            key = container.pod.uid
            if container.problem and key not in self._broken_pods:
                self._broken_pods.add(key)
                log.warning("pod %s/%s: %s", container.pod.namespace, container.pod.name, container.problem)

    def _action(self, finding: Finding) -> str:
        mode = self.watchdog_mode
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
        if action == Mode.EVICT and pod is not None and pod.deleting and pod.eviction_grace is None:
            self._done.add(key)  # going, within `watchdog.BREACH_GRACE_SECONDS`; else evicted to shorten it
            return None
        done, acted, outcome = await self._act(action, finding)
        if done:
            self._done.add(key)
        if not acted:
            log.error("%s: %s failed: %s; trying again next interval", finding.detail, action, outcome)
            return Handled(finding, action, outcome)
        message = f"{outcome}: {finding.detail} (mode {self.watchdog_mode.value})"
        log.warning("%s: %s%s", finding.kind.value, message, "" if done else "; the rest next interval")
        event = events.warning(
            involved=self._involved(finding),
            reason=finding.kind.value,
            message=message,
            component=COMPONENT,
            host=self.settings.node_name,
        )
        await events.record(self.client, event)
        self.exporter.breaches.labels(finding.kind.value).inc()
        self.exporter.actions.labels(action).inc()
        return Handled(finding, action, outcome)

    async def _act(self, action: str, finding: Finding) -> tuple[bool, bool, str]:
        """(done: nothing is left to do about the finding; acted: something happened, worth an Event; what
        happened). A kill is done once each process is killed or gone, and acted once any one is: a process
        not signalled (`NotKilled`) leaves the finding to the next interval."""
        if action == Mode.KILL:
            said, waiting = [], 0
            for process in finding.processes:
                try:
                    said.append(f"{process.pid} {self.killer.kill(process)}")
                except NotKilled as why:
                    said.append(f"{process.pid} not signalled: {why}")
                    waiting += 1
            outcome = "Killed processes (pid, outcome): " + "; ".join(said)
            return not waiting, waiting < len(finding.processes), outcome
        if action == Mode.EVICT:
            assert finding.container is not None
            pod = finding.container.pod
            unconfirmed = self._unconfirmed(finding)
            if unconfirmed:
                return False, False, f"not evicted (pid, why): {'; '.join(unconfirmed)}"
            try:
                await eviction.evict(
                    self.client,
                    pod.name,
                    namespace=pod.namespace,
                    uid=pod.uid,
                    grace_seconds=pod.eviction_grace,
                )
            except API_ERRORS as error:
                return False, False, f"eviction of {pod.namespace}/{pod.name} refused: {error}"
            return True, True, f"Evicted pod {pod.namespace}/{pod.name}"
        return True, True, "Reported"

    def _unconfirmed(self, finding: Finding) -> list[str]:
        """`pid why` for each process of `finding` the second look (`recheck`) does not find still the one
        judged, on its GPU: its pid may now name a process of an innocent pod, charged with memory it never
        held, so the pod is not evicted for it."""
        said = []
        for process in finding.processes:
            try:
                why = self._second_look.gone(process)
            except recheck.Unconfirmed as error:
                why = str(error)
            if why:
                said.append(f"{process.pid} {why}")
        return said

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
        acting = self.watchdog_mode is not Mode.REPORT
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
