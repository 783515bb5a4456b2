"""Leader election between two scheduler replicas on a real kube-apiserver, with short lease timings: one
replica's wall clock an hour off, and a leader that loses the API server (its connections freeze, as
behind a dead link). The replicas run in this process through `serve.run_replica`, each with its own
client, identity and clocks."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import lightkube
import yaml
from lightkube.resources.coordination_v1 import Lease

from gpufrac.scheduler.config import SchedulerConfig
from gpufrac.scheduler.leader import LeaderElector, LeaseTiming
from gpufrac.scheduler.loop import Scheduler
from gpufrac.scheduler.serve import run_replica

from . import controlplane, fakenodes
from .scheduling import gpu_pod, wait_bound

TIMING = LeaseTiming(lease_seconds=5, renew_deadline=3.5, retry_seconds=0.5)


class FreezableProxy:
    """A TCP proxy to the API server whose traffic can be frozen: bytes stop moving both ways and
    connections stay open, so requests hang rather than fail, as behind a dead link."""

    def __init__(self, target: str) -> None:
        parts = urlsplit(target)
        self._host, self._port = parts.hostname or "127.0.0.1", parts.port or 443
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server: asyncio.Server | None = None
        self.url = ""

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._connect, "127.0.0.1", 0)
        self.url = f"https://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    def freeze(self) -> None:
        self._flowing.clear()

    async def stop(self) -> None:
        self._flowing.set()
        if self._server is not None:
            self._server.close()

    async def _connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection(self._host, self._port)
        await asyncio.gather(
            self._pump(reader, upstream_writer), self._pump(upstream_reader, writer), return_exceptions=True
        )

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                await self._flowing.wait()
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()


def kubeconfig_via(plane: controlplane.ControlPlane, server: str, path: Path) -> Path:
    config = yaml.safe_load(plane.kubeconfig("scheduler").read_text())
    config["clusters"][0]["cluster"]["server"] = server
    path.write_text(yaml.safe_dump(config))
    return path


@dataclass
class Replica:
    scheduler: Scheduler
    elector: LeaderElector
    led_at: list[float] = field(default_factory=list)  # time.monotonic() when it began and stopped leading
    task: asyncio.Task[bool] | None = None

    @property
    def bound(self) -> float:
        return self.scheduler.metrics.attempts.labels("scheduled")._value.get()  # type: ignore[no-any-return]


@contextlib.asynccontextmanager
async def replica(
    client: lightkube.AsyncClient, name: str, identity: str, *, wall: Callable[[], dt.datetime]
) -> AsyncIterator[Replica]:
    scheduler = Scheduler(client, SchedulerConfig(name=name), leading=False)
    elector = LeaderElector(
        client,
        name=name,
        namespace=controlplane.SCHEDULER_NAMESPACE,
        identity=identity,
        timing=TIMING,
        wall=wall,
    )
    made = Replica(scheduler, elector)
    real_lead, real_step_down = scheduler.lead, scheduler.step_down

    def lead(holds: Callable[[], bool] = lambda: True) -> None:
        made.led_at.append(time.monotonic())
        real_lead(holds)

    async def step_down(*, grace: float) -> None:
        made.led_at.append(time.monotonic())
        await real_step_down(grace=grace)

    scheduler.lead = lead  # type: ignore[method-assign]
    scheduler.step_down = step_down  # type: ignore[method-assign]
    stop = asyncio.Event()
    made.task = asyncio.create_task(run_replica(scheduler, elector, stop=stop))
    try:
        yield made
    finally:
        stop.set()  # as SIGTERM does
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(made.task, 10)


async def holder(admin: lightkube.AsyncClient, name: str) -> str | None:
    lease = await admin.get(Lease, name, namespace=controlplane.SCHEDULER_NAMESPACE)
    return lease.spec.holderIdentity if lease.spec else None  # type: ignore[no-any-return]


async def wait_for(condition: Callable[[], bool], *, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


def utc() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


async def test_a_leader_whose_clock_is_an_hour_slow_keeps_leading_and_one_that_loses_the_api_stops_first(
    control_plane: controlplane.ControlPlane,
    admin_client: lightkube.AsyncClient,
    scheduler_client: lightkube.AsyncClient,
    namespace: str,
    gpu_nodes: fakenodes.GpuNodes,
    tmp_path: Path,
) -> None:
    await gpu_nodes.create(gpus=8)
    name = f"gpufrac-{uuid.uuid4().hex[:6]}"  # its own Lease and schedulerName
    proxy = FreezableProxy(control_plane.url)
    await proxy.start()
    slow_config = lightkube.KubeConfig.from_file(kubeconfig_via(control_plane, proxy.url, tmp_path / "a"))
    slow_client = lightkube.AsyncClient(slow_config, trust_env=False, field_manager=name)

    def an_hour_slow() -> dt.datetime:  # every renewTime a writes looks an hour stale to anyone else
        return utc() - dt.timedelta(hours=1)

    try:
        async with replica(slow_client, name, "a", wall=an_hour_slow) as a:
            await wait_for(lambda: bool(a.led_at))
            async with replica(scheduler_client, name, "b", wall=utc) as b:
                # Three lease durations with b watching: a's old-looking renewTime never lets b take over.
                for i in range(3):
                    await admin_client.create(
                        gpu_pod(f"first-{i}", namespace, annotations={"gpu-fraction": "0.5"}, scheduler=name)
                    )
                    await asyncio.sleep(TIMING.lease_seconds)
                    assert await holder(admin_client, name) == "a" and not b.led_at
                await wait_bound(admin_client, namespace, 3)
                assert (a.bound, b.bound) == (3, 0)
                proxy.freeze()  # a loses the API server, mid-lease
                await admin_client.create(
                    gpu_pod("after", namespace, annotations={"gpu-fraction": "0.5"}, scheduler=name)
                )
                await wait_bound(admin_client, namespace, 4, timeout=60)
                await wait_for(lambda: len(a.led_at) == 2)
                stopped, took_over = a.led_at[1], b.led_at[0]
                assert stopped < took_over, "a stops binding before b may start"
                assert not a.scheduler.leading
                assert (a.bound, b.bound) == (3, 1)
                assert await holder(admin_client, name) == "b"
            assert await holder(admin_client, name) == ""  # b stopped cleanly: it gave the Lease up
    finally:
        await proxy.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(slow_client.close(), 5)
