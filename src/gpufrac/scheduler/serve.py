"""Running the scheduler as a process: reflectors, leader election, the scheduling loop, HTTP endpoints.

Only the leader schedules; a standby keeps its state warm from the same watches, so a takeover starts
binding at once. The leader binds only while the elector `holds()` the Lease, which it stops doing at the
renew deadline, before any standby may take over. A leader that loses its Lease resolves its binds in
flight (`Scheduler.step_down`) and exits (status 1), as kube-scheduler does: a fresh process rebuilds its
state from the API rather than trusting what it held while it was not sure to be alone. SIGTERM lets the
binds in flight finish (or roll back) before the process exits.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
from pathlib import Path

from aiohttp import web
from lightkube import ApiError
from lightkube.resources.core_v1 import Node

from gpufrac.errors import UserError
from gpufrac.kubeapi import client as kube_client
from gpufrac.scheduler.leader import DEFAULT_TIMING, LeaderElector, LeaseTiming
from gpufrac.scheduler.loop import Scheduler, SchedulerConfig
from gpufrac.scheduler.metrics import http_app
from gpufrac.stopping import stop_on_signals

log = logging.getLogger("gpufrac.scheduler")


async def serve(
    config: SchedulerConfig,
    *,
    kubeconfig: Path | None,
    metrics_port: int,
    leader_elect: bool,
    lease_namespace: str,
    lease: LeaseTiming = DEFAULT_TIMING,
) -> None:
    kube = kube_client.load_config(kubeconfig)
    client = kube_client.async_client(kube, field_manager=config.name)
    try:
        await client.get(Node, "gpufrac-connectivity-check")
    except ApiError:
        pass  # answered: reachable (404 or 403 both prove it)
    except kube_client.TRANSPORT_ERRORS as error:
        raise kube_client.unreachable(error, kube) from None
    scheduler = Scheduler(client, config, leading=not leader_elect)
    runner = web.AppRunner(http_app(scheduler.metrics, ready=lambda: scheduler.ready))
    await runner.setup()
    try:
        await web.TCPSite(runner, port=metrics_port).start()
    except OSError as error:
        raise UserError(
            f"--metrics-port {metrics_port}: cannot listen ({error.strerror}); pick a free port"
        ) from None
    tasks: list[asyncio.Task[object]] = [asyncio.create_task(scheduler.run())]
    lost = asyncio.Event()
    stop = stop_on_signals()
    stopper = asyncio.create_task(stop.wait())
    if leader_elect:
        identity = f"{socket.gethostname()}_{os.getpid()}"
        elector = LeaderElector(
            client,
            name=config.name,
            namespace=lease_namespace,
            identity=identity,
            timing=lease,
        )
        tasks.append(asyncio.create_task(elector.run(on_lost=lost.set)))
        log.info("waiting to lead (Lease %s/%s) as %s", lease_namespace, config.name, identity)
        leading = asyncio.create_task(elector.became_leader.wait())
        await asyncio.wait([leading, stopper], return_when=asyncio.FIRST_COMPLETED)
        if elector.became_leader.is_set():
            scheduler.lead(holds=elector.holds)
    log.info("scheduling pods with schedulerName=%s, policy %s", config.name, config.policy)
    waiter = asyncio.create_task(lost.wait())
    done, _ = await asyncio.wait([*tasks, waiter, stopper], return_when=asyncio.FIRST_COMPLETED)
    for task in [*tasks, waiter, stopper]:
        task.cancel()
    if lost.is_set():  # another replica may bind once the lease runs out: resolve ours before then
        await scheduler.step_down(grace=lease.lease_seconds - lease.renew_deadline)
    await scheduler.wait_for_binds()  # binds in flight finish (or roll back) before the process ends
    await runner.cleanup()
    for task in done:
        if task in tasks and not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
    if lost.is_set():
        log.error("lost the Lease; exiting so that a fresh process rebuilds its state")
        sys.exit(1)
