"""Leader election on one in-memory Lease with resourceVersion conflicts, and a clock the test moves."""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
from collections.abc import Awaitable, Callable
from typing import Any, cast

import pytest
from lightkube import ApiError
from lightkube.resources.coordination_v1 import Lease

from gpufrac.scheduler.leader import LeaderElector

from ..kubeapi.fakeapi import api_error, transport_error, until

START = dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.UTC)


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> dt.datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += dt.timedelta(seconds=seconds)


class LeaseApi:
    """One Lease, as the apiserver keeps it: create fails if it exists, replace fails on a stale
    resourceVersion. `between` runs once, after the next get has read the Lease: a rival's write."""

    def __init__(self) -> None:
        self.body: dict[str, Any] | None = None
        self.version = 0
        self.fail: Exception | None = None
        self.between: Callable[[], Awaitable[None]] | None = None

    async def get(self, resource: type[Any], name: str, *, namespace: str | None = None) -> Lease:
        assert (resource, name, namespace) == (Lease, "gpufrac", "gpufrac-system")
        if self.fail is not None:
            raise self.fail
        if self.body is None:
            raise api_error(404, "NotFound")
        lease = cast(Lease, Lease.from_dict(copy.deepcopy(self.body)))
        rival, self.between = self.between, None
        if rival is not None:
            await rival()
        return lease

    async def create(self, lease: Lease) -> None:
        if self.body is not None:
            raise api_error(409, "AlreadyExists")
        self._store(lease)

    async def replace(self, lease: Lease) -> None:
        assert self.body is not None and lease.metadata is not None
        if lease.metadata.resourceVersion != self.body["metadata"]["resourceVersion"]:
            raise api_error(409, "Conflict")
        self._store(lease)

    def _store(self, lease: Lease) -> None:
        self.version += 1
        body = lease.to_dict()
        body["metadata"]["resourceVersion"] = str(self.version)
        self.body = body

    @property
    def spec(self) -> dict[str, Any]:
        assert self.body is not None
        return dict(self.body["spec"])


@pytest.fixture
def api() -> LeaseApi:
    return LeaseApi()


@pytest.fixture
def clock() -> Clock:
    return Clock()


def replica(api: LeaseApi, clock: Clock, identity: str) -> LeaderElector:
    return LeaderElector(
        api,
        name="gpufrac",
        namespace="gpufrac-system",
        identity=identity,
        lease_seconds=15,
        retry_seconds=0,
        clock=clock,
    )


def stamp(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


async def test_the_first_replica_creates_the_lease_and_leads(api: LeaseApi, clock: Clock) -> None:
    assert await replica(api, clock, "a").try_acquire_or_renew()
    assert api.spec == {
        "holderIdentity": "a",
        "leaseDurationSeconds": 15,
        "acquireTime": stamp(START),
        "renewTime": stamp(START),
        "leaseTransitions": 0,
    }


async def test_renewing_moves_only_the_renew_time(api: LeaseApi, clock: Clock) -> None:
    a = replica(api, clock, "a")
    await a.try_acquire_or_renew()
    clock.advance(5)
    assert await a.try_acquire_or_renew()
    assert (api.spec["acquireTime"], api.spec["renewTime"]) == (stamp(START), stamp(clock.now))
    assert api.spec["leaseTransitions"] == 0


async def test_a_second_replica_waits_while_the_lease_is_fresh(api: LeaseApi, clock: Clock) -> None:
    a, b = replica(api, clock, "a"), replica(api, clock, "b")
    await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew()
    for _ in range(3):  # renewed every 10 s: never 15 s old
        clock.advance(10)
        assert await a.try_acquire_or_renew()
        assert not await b.try_acquire_or_renew()
    assert api.spec["holderIdentity"] == "a"


async def test_a_second_replica_takes_over_an_expired_lease(api: LeaseApi, clock: Clock) -> None:
    a, b = replica(api, clock, "a"), replica(api, clock, "b")
    await a.try_acquire_or_renew()
    clock.advance(14.9)
    assert not await b.try_acquire_or_renew()
    clock.advance(0.1)
    assert await b.try_acquire_or_renew()
    assert api.spec["holderIdentity"] == "b"
    assert api.spec["leaseTransitions"] == 1
    assert api.spec["acquireTime"] == stamp(clock.now)
    assert not await a.try_acquire_or_renew()  # the old leader finds b's fresh Lease


async def test_losing_a_race_for_an_expired_lease_means_not_leader(api: LeaseApi, clock: Clock) -> None:
    a, b, c = (replica(api, clock, name) for name in "abc")
    await a.try_acquire_or_renew()
    clock.advance(20)

    async def b_wins() -> None:
        assert await b.try_acquire_or_renew()

    api.between = b_wins  # c reads the expired Lease, then b writes first
    assert not await c.try_acquire_or_renew()
    assert api.spec["holderIdentity"] == "b"


async def test_losing_a_race_to_create_the_lease_means_not_leader(api: LeaseApi, clock: Clock) -> None:
    a, b = replica(api, clock, "a"), replica(api, clock, "b")
    real_get = api.get

    async def get_then_rival_creates(*args: Any, **kwargs: Any) -> Lease:
        try:
            return await real_get(*args, **kwargs)
        finally:
            api.get = real_get  # type: ignore[method-assign]
            assert await b.try_acquire_or_renew()

    api.get = get_then_rival_creates  # type: ignore[method-assign]
    assert not await a.try_acquire_or_renew()
    assert api.spec["holderIdentity"] == "b"


async def test_other_api_errors_are_raised_to_run(api: LeaseApi, clock: Clock) -> None:
    api.fail = api_error(403, "Forbidden")
    with pytest.raises(ApiError):
        await replica(api, clock, "a").try_acquire_or_renew()


async def spin(rounds: int = 20) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)


async def test_run_steps_down_once_renewal_fails_for_the_lease_duration(api: LeaseApi, clock: Clock) -> None:
    a = replica(api, clock, "a")
    lost: list[dt.datetime] = []
    task = asyncio.create_task(a.run(on_lost=lambda: lost.append(clock.now)))
    await asyncio.wait_for(a.became_leader.wait(), 5)
    assert a.is_leader
    api.fail = transport_error()
    await spin()
    clock.advance(10)
    api.fail = api_error(500, "InternalError")
    await spin()
    assert a.is_leader and not lost  # the Lease it last renewed is still its own
    clock.advance(5)
    await asyncio.wait_for(task, 5)  # run returns once leadership is lost
    assert lost == [START + dt.timedelta(seconds=15)]
    assert not a.is_leader


async def test_run_steps_down_when_another_replica_holds_the_lease(api: LeaseApi, clock: Clock) -> None:
    a = replica(api, clock, "a")
    lost: list[bool] = []
    task = asyncio.create_task(a.run(on_lost=lambda: lost.append(True)))
    await asyncio.wait_for(a.became_leader.wait(), 5)
    assert api.body is not None
    api.body["spec"]["holderIdentity"] = "b"  # e.g. a's renewals were lost and b took over
    await asyncio.wait_for(task, 5)
    assert lost == [True] and not a.is_leader


async def test_a_standby_leads_once_the_leader_stops_renewing(api: LeaseApi, clock: Clock) -> None:
    await replica(api, clock, "a").try_acquire_or_renew()
    b = replica(api, clock, "b")
    task = asyncio.create_task(b.run(on_lost=lambda: None))
    await spin()
    assert not b.became_leader.is_set()
    clock.advance(15)
    await asyncio.wait_for(b.became_leader.wait(), 5)
    await until(lambda: b.is_leader)
    assert api.spec["holderIdentity"] == "b"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
