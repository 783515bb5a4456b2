"""`gpufrac agent`: build the agent from its flags and run it until SIGTERM (or for one tick, `--once`).

`--once` prints the tick's JSON summary and exits 0 only when the tick did its whole job and the node is
Ready; NVML (or the fake scenario) unreadable, the Node, the pods or the kubelet not read, or the node not
Ready (its condition's reason and message), is one line on stderr and exit status 1.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import lightkube

from gpufrac import contract
from gpufrac.contract import node_inventory
from gpufrac.contract.node_inventory import DevicePluginMode
from gpufrac.errors import UserError
from gpufrac.kubeapi import client as kube_client
from gpufrac.node import agent as node_agent
from gpufrac.node import mps, nvml, procfs
from gpufrac.node.exporter import Exporter
from gpufrac.node.kubelet.device_plugin import DevicePluginServer
from gpufrac.node.kubelet.podresources import PodResourcesClient
from gpufrac.node.watchdog import Mode
from gpufrac.stopping import stop_on_signals

log = logging.getLogger("gpufrac.node")

MAX_INTERVAL = 3600.0  # a watchdog that looks less often than hourly guards nothing


def run(
    *,
    node_name: str,
    nvml_spec: str,
    mode: Mode,
    interval: float,
    metrics_port: int,
    once: bool,
    kubeconfig: Path | None,
    proc_root: Path,
    mps_control: str,
    mps_pipe_directory: Path | None,
    mps_log_directory: Path | None,
    mps_thread_percentage: int | None,
    mps_pinned_limit_mib: int | None,
    device_plugin: str,
    pod_resources_socket: Path,
    device_plugin_dir: Path,
    cuda_context_mib: int,
    native_label: str,
    fraction_reference_mib: int,
) -> int:
    if not node_name.strip():
        raise UserError(
            "--node-name is empty; pass the node's name (in a pod: the downward API's spec.nodeName)"
        )
    if not (math.isfinite(interval) and 0 < interval <= MAX_INTERVAL):
        raise UserError(f"--interval {interval}: must be more than 0 and at most {MAX_INTERVAL:g} seconds")
    if not proc_root.is_dir():
        # Not caught, every GPU process would be one /proc cannot see, and skipped: a watchdog that judges
        # nothing while looking healthy.
        raise UserError(f"--proc-root {proc_root}: no such folder; pass the host's /proc (with hostPID)")
    native = parse_label(native_label)
    # The directory the webhook mounts into sm-sharing containers and the scheduler names in their env.
    pipe_directory = mps_pipe_directory or Path(contract.DEFAULT_MPS_PIPE_DIRECTORY)
    contract.check_mps_directory(str(pipe_directory), flag="--mps-pipe-directory")
    try:
        backend = nvml.open_backend(nvml_spec)
    except ValueError as error:
        raise UserError(str(error)) from None
    config = kube_client.load_config(kubeconfig)
    fake = isinstance(backend, nvml.FakeBackend)
    killer: node_agent.Killer = (
        node_agent.DryRunKiller() if fake else node_agent.SignalKiller(procfs.ProcFS(proc_root), backend)
    )
    supervisor = _supervisor(
        backend,
        program=mps_control,
        pipe_directory=pipe_directory,
        log_directory=mps_log_directory or pipe_directory.with_name("mps-log"),
        thread_percentage=mps_thread_percentage,
        pinned_limit_mib=mps_pinned_limit_mib,
    )
    exporter = Exporter()
    if metrics_port and not once:
        try:
            exporter.serve(metrics_port)
        except OSError as error:
            raise UserError(f"--metrics-port {metrics_port}: cannot listen ({error.strerror})") from None
        log.info("serving /metrics on port %d", metrics_port)
    own = procfs.ProcFS().process(os.getpid())
    settings = node_agent.Settings(
        node_name=node_name,
        mode=mode,
        interval=interval,
        proc_root=proc_root,
        device_plugin=device_plugin,
        native_label=native,
        cuda_context_mib=cuda_context_mib,
        fraction_reference_mib=fraction_reference_mib,
    )
    kubelet = _Kubelet(
        PodResourcesClient(pod_resources_socket) if device_plugin != DevicePluginMode.NONE else None,
        device_plugin_dir,
    )
    return asyncio.run(
        _main(settings, config, backend, killer, supervisor, exporter, own, kubelet, once=once)
    )


def parse_label(text: str) -> tuple[str, str]:
    """`--native-label KEY=VALUE`."""
    key, equals, value = text.partition("=")
    if not key.strip() or not equals:
        raise UserError(f"--native-label {text!r}: give KEY=VALUE, e.g. {node_inventory.NATIVE_LABEL}=true")
    return key.strip(), value.strip()


class _Kubelet:
    """The kubelet's APIs the agent uses: PodResources, and (managed mode) its device-plugin folder."""

    def __init__(self, pod_resources: PodResourcesClient | None, plugin_dir: Path) -> None:
        self.pod_resources = pod_resources
        self.plugin_dir = plugin_dir

    def plugin_server(self, devices: Sequence[str]) -> DevicePluginServer:
        return DevicePluginServer(
            self.plugin_dir, node_inventory.GPU_RESOURCE, devices, endpoint=node_agent.PLUGIN_ENDPOINT
        )


async def _main(
    settings: node_agent.Settings,
    config: lightkube.KubeConfig,
    backend: nvml.Backend,
    killer: node_agent.Killer,
    supervisor: mps.Supervisor | None,
    exporter: Exporter,
    own: procfs.ProcessInfo | None,
    kubelet: _Kubelet,
    *,
    once: bool,
) -> int:
    async with kube_client.async_client(config, field_manager=node_agent.COMPONENT) as client:
        agent = node_agent.Agent(
            settings,
            client=client,
            nvml=backend,
            killer=killer,
            supervisor=supervisor,
            exporter=exporter,
            own_container=own.container_id if own else None,
            pod_resources=kubelet.pod_resources,
            plugin_server=kubelet.plugin_server,
        )
        try:
            if once:
                async with kube_client.answered_within(config):
                    report = await agent.tick()
                print(json.dumps(_summary(report), sort_keys=True))
                if report.problems:
                    raise UserError(
                        f"the check did not do its job: {'; '.join(report.problems)}", exit_code=1
                    )
                if report.ready is not None and not report.ready.ready:
                    raise UserError(
                        f"node not Ready: {report.ready.reason}: {report.ready.message}", exit_code=1
                    )
                return 0
            stop = stop_on_signals()
            log.info(
                "agent on node %s: mode %s, device plugin %s, every %gs",
                settings.node_name,
                settings.mode.value,
                settings.device_plugin,
                settings.interval,
            )
            await agent.run(stop)
            log.info("stopping")
            return 0
        finally:
            await agent.close(stopping=not once)


def _supervisor(
    backend: nvml.Backend,
    *,
    program: str,
    pipe_directory: Path,
    log_directory: Path,
    thread_percentage: int | None,
    pinned_limit_mib: int | None,
) -> mps.Supervisor | None:
    if not program:
        log.info("MPS disabled (--mps-control is empty)")
        return None
    found = shutil.which(program)
    if found is None:
        log.warning("MPS disabled: %s not found; sm-sharing shares are held by the watchdog alone", program)
        return None
    # The default pinned limit is set per device, so only then are the GPUs needed before the first tick.
    devices = [gpu.index for gpu in backend.sample().gpus] if pinned_limit_mib else []
    spec = mps.DaemonSpec(
        name=node_agent.SM_SHARING_DAEMON,
        pipe_directory=pipe_directory,
        log_directory=log_directory,
        active_thread_percentage=thread_percentage,
        pinned_limit_mib=pinned_limit_mib,
        devices=devices,
    )
    return mps.Supervisor([spec], program=found)


def _summary(report: node_agent.TickReport) -> dict[str, object]:
    return {
        "nvml_error": report.snapshot.error,
        "driver_version": report.snapshot.driver_version,
        "enforcement": report.level.value,
        "device_plugin": report.mode.value if report.mode else None,
        "ready": None if report.ready is None else report.ready.ready,
        "ready_reason": None if report.ready is None else report.ready.reason,
        "ready_message": None if report.ready is None else report.ready.message,
        "advertised": None if report.advertised is None else list(report.advertised),
        "gpus": [
            {"index": g.index, "uuid": g.uuid, "healthy": g.healthy, "holder": g.holder} for g in report.gpus
        ],
        "findings": [f.detail for f in report.findings],
        "handled": [f"{h.action}: {h.outcome}" for h in report.handled],
        "problems": report.problems,
    }
