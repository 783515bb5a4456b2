"""`gpufrac agent`: build the agent from its flags and run it until SIGTERM (or for one tick, `--once`).

`--once` prints the tick's JSON summary and exits 0 only when the tick did its whole job; NVML (or the fake
scenario) unreadable, or the Node or the pods not read, is one line on stderr and exit status 1.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import shutil
from pathlib import Path

import lightkube

from gpufrac import contract
from gpufrac.errors import UserError
from gpufrac.kubeapi import client as kube_client
from gpufrac.node import agent as node_agent
from gpufrac.node import mps, nvml, procfs
from gpufrac.node.exporter import Exporter
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
) -> int:
    if not node_name.strip():
        raise UserError(
            "--node-name is empty; pass the node's name (in a pod: the downward API's spec.nodeName)"
        )
    if not (math.isfinite(interval) and 0 < interval <= MAX_INTERVAL):
        raise UserError(f"--interval {interval}: must be more than 0 and at most {MAX_INTERVAL:g} seconds")
    try:
        backend = nvml.open_backend(nvml_spec)
    except ValueError as error:
        raise UserError(str(error)) from None
    config = kube_client.load_config(kubeconfig)
    fake = isinstance(backend, nvml.FakeBackend)
    killer: node_agent.Killer = (
        node_agent.DryRunKiller() if fake else node_agent.SignalKiller(procfs.ProcFS(proc_root), backend)
    )
    # The directory the webhook mounts into sm-sharing containers and the scheduler names in their env.
    pipe_directory = mps_pipe_directory or Path(contract.DEFAULT_MPS_PIPE_DIRECTORY)
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
    settings = node_agent.Settings(node_name=node_name, mode=mode, interval=interval, proc_root=proc_root)
    return asyncio.run(_main(settings, config, backend, killer, supervisor, exporter, own, once=once))


async def _main(
    settings: node_agent.Settings,
    config: lightkube.KubeConfig,
    backend: nvml.Backend,
    killer: node_agent.Killer,
    supervisor: mps.Supervisor | None,
    exporter: Exporter,
    own: procfs.ProcessInfo | None,
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
        )
        try:
            if once:
                report = await agent.tick()
                print(json.dumps(_summary(report), sort_keys=True))
                if report.problems:
                    raise UserError(
                        f"the check did not do its job: {'; '.join(report.problems)}", exit_code=1
                    )
                return 0
            stop = stop_on_signals()
            log.info(
                "agent on node %s: mode %s, every %gs",
                settings.node_name,
                settings.mode.value,
                settings.interval,
            )
            await agent.run(stop)
            log.info("stopping")
            return 0
        finally:
            await agent.close()


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
        "gpus": [{"index": g.index, "uuid": g.uuid, "healthy": g.healthy} for g in report.gpus],
        "findings": [f.detail for f in report.findings],
        "handled": [f"{h.action}: {h.outcome}" for h in report.handled],
        "problems": report.problems,
    }
