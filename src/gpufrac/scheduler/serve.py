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
from collections.abc import Callable
from pathlib import Path

from aiohttp import web
from lightkube import ApiError
from lightkube.resources.core_v1 import Node

from gpufrac.errors import UserError
from gpufrac.kubeapi import client as kube_client
from gpufrac.kubeapi.probes import app_runner
from gpufrac.scheduler.config import SchedulerConfig
from gpufrac.scheduler.leader import DEFAULT_TIMING, LeaderElector, LeaseTiming
from gpufrac.scheduler.loop import Scheduler
from gpufrac.scheduler.metrics import http_app
from gpufrac.stopping import stop_on_signals

log = logging.getLogger("gpufrac.scheduler")


async def serve(
    config: SchedulerConfig,
    *,
    kubeconfig: Path | None,
    metrics_port: int,
    leader_elect: bool,
    lease: LeaseTiming = DEFAULT_TIMING,
) -> None:
    kube = kube_client.load_config(kubeconfig)
    client = kube_client.async_client(kube, field_manager=config.name)
    try:
        async with kube_client.answered_within(kube):
            await client.get(Node, "gpufrac-connectivity-check")
    except ApiError as error:
        # Answered: reachable (404 or 403 both prove it), but not with credentials it refuses.
        if error.status.code == 401:
            raise kube_client.refused(error, kube, "read nodes") from None
    except kube_client.NO_API_SERVER as error:
        raise kube_client.unreachable(error, kube) from None
    scheduler = Scheduler(client, config, leading=False)
    runner = app_runner(http_app(scheduler.metrics, ready=lambda: scheduler.ready))
    await runner.setup()
    try:
        await web.TCPSite(runner, port=metrics_port).start()
    except OSError as error:
        raise UserError(
            f"--metrics-port {metrics_port}: cannot listen ({error.strerror}); pick a free port"
        ) from None
    elector = None
    if leader_elect:
        identity = f"{socket.gethostname()}_{os.getpid()}"
        elector = LeaderElector(
            client, name=config.name, namespace=config.namespace, identity=identity, timing=lease
        )
        log.info("waiting to lead (Lease %s/%s) as %s", config.namespace, config.name, identity)
    try:
        lost = await run_replica(scheduler, elector, stop=stop_on_signals())
    finally:
        await runner.cleanup()
    if lost:
        log.error("lost the Lease; exiting so that a fresh process rebuilds its state")
        sys.exit(1)


async def run_replica(scheduler: Scheduler, elector: LeaderElector | None, *, stop: asyncio.Event) -> bool:
    """Watch, and schedule while leading, until `stop` is set or the Lease is lost; True if it was lost.

    Without an elector the replica leads at once. Binds in flight are resolved before this returns: at the
    loss of the Lease within the time left before another replica may bind (`Scheduler.step_down`),
    otherwise to their end.
    """
    tasks: list[asyncio.Task[object]] = [asyncio.create_task(scheduler.run())]
    lost = asyncio.Event()
    leading = None
    if elector is not None:
        tasks.append(asyncio.create_task(elector.run(on_lost=lost.set)))
        leading = asyncio.create_task(_lead_once_elected(scheduler, elector))
    else:
        _lead(scheduler, lambda: True)
    waiters = [asyncio.create_task(lost.wait()), asyncio.create_task(stop.wait())]
    done, _ = await asyncio.wait([*tasks, *waiters], return_when=asyncio.FIRST_COMPLETED)
    for task in [tasks[0], *waiters, *([leading] if leading else [])]:
        task.cancel()
    if elector is not None:
        await _renew_while_binding(scheduler, tasks[1])
    if lost.is_set() and elector is not None:  # another replica may bind once the lease runs out
        await scheduler.step_down(grace=elector.timing.lease_seconds - elector.timing.renew_deadline)
    await scheduler.wait_for_binds()  # binds in flight finish (or roll back) before the process ends
    if elector is not None and not lost.is_set():
        await elector.release()  # nothing of ours is in flight: a standby may take over at once
    for task in done:
        if task in tasks and not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
    return lost.is_set()


async def _renew_while_binding(scheduler: Scheduler, electing: asyncio.Task[object]) -> None:
    """Stopped while leading, the replica keeps renewing its Lease until its binds in flight settle: left to
    run out, a standby would take over and bind while this one still binds (a bind may wait ten minutes for
    its volumes), both writing the same pods' ConfigMaps and Bindings. Should the Lease be lost meanwhile,
    `step_down` resolves the binds in the time left."""
    if not electing.done():
        # Not cancelled if the Lease goes first: cancelling it would cancel the binds before their grace.
        binding = asyncio.create_task(scheduler.wait_for_binds())
        await asyncio.wait([binding, electing], return_when=asyncio.FIRST_COMPLETED)
    electing.cancel()
    await asyncio.gather(electing, return_exceptions=True)


async def _lead_once_elected(scheduler: Scheduler, elector: LeaderElector) -> None:
    await elector.became_leader.wait()
    _lead(scheduler, elector.holds)


def _lead(scheduler: Scheduler, holds: Callable[[], bool]) -> None:
    config = scheduler.config
    log.info("scheduling pods with schedulerName=%s, policy %s", config.name, config.policy)
    scheduler.lead(holds=holds)
