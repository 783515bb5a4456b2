"""Leader election on one in-memory Lease with resourceVersion conflicts, and clocks the test moves (each
replica its own monotonic clock, and a wall clock that may be skewed)."""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
from collections.abc import Awaitable, Callable
from typing import Any, cast

import pytest
from lightkube import ApiError
from lightkube.resources.coordination_v1 import Lease

from gpufrac.scheduler.leader import LeaderElector, LeaseTiming

from ..kubeapi.fakeapi import api_error, transport_error, until

START = dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.UTC)
TIMING = LeaseTiming(lease_seconds=15, renew_deadline=10, retry_seconds=0)


class Clock:
    """One replica's clocks: `monotonic`, which only the test moves, and a wall clock `skew` seconds off."""

    def __init__(self, skew: float = 0.0) -> None:
        self.now = 1000.0
        self.skew = skew

    def __call__(self) -> float:
        return self.now

    def wall(self) -> dt.datetime:
        return START + dt.timedelta(seconds=self.now - 1000.0 + self.skew)

    def advance(self, seconds: float) -> None:
        self.now += seconds


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

    async def create(self, lease: Lease) -> Lease:
        if self.fail is not None:
            raise self.fail
        if self.body is not None:
            raise api_error(409, "AlreadyExists")
        return self._store(lease)

    async def replace(self, lease: Lease) -> Lease:
        if self.fail is not None:
            raise self.fail
        assert self.body is not None and lease.metadata is not None
        if lease.metadata.resourceVersion != self.body["metadata"]["resourceVersion"]:
            raise api_error(409, "Conflict")
        return self._store(lease)

    def _store(self, lease: Lease) -> Lease:
        self.version += 1
        body = lease.to_dict()
        body["metadata"]["resourceVersion"] = str(self.version)
        self.body = body
        return cast(Lease, Lease.from_dict(copy.deepcopy(body)))

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


def replica(api: LeaseApi, clock: Clock, identity: str, timing: LeaseTiming = TIMING) -> LeaderElector:
    return LeaderElector(
        api,  # type: ignore[arg-type]
        name="gpufrac",
        namespace="gpufrac-system",
        identity=identity,
        timing=timing,
        monotonic=clock,
        wall=clock.wall,
    )


def stamp(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_the_durations_must_nest_as_client_go_requires() -> None:
    for lease, deadline, retry in [(10, 10, 2), (15, 20, 2), (15, 2, 2)]:
        with pytest.raises(ValueError, match=r"lease .* > renew deadline .* > 1\.2 x retry"):
            LeaseTiming(lease_seconds=lease, renew_deadline=deadline, retry_seconds=retry)


async def test_the_first_replica_creates_the_lease_and_leads(api: LeaseApi, clock: Clock) -> None:
    a = replica(api, clock, "a")
    assert await a.try_acquire_or_renew() and a.holds()
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
    assert (api.spec["acquireTime"], api.spec["renewTime"]) == (stamp(START), stamp(clock.wall()))
    assert api.spec["leaseTransitions"] == 0


async def test_the_leader_holds_until_the_renew_deadline_counted_from_when_it_sent_the_renewal(
    api: LeaseApi, clock: Clock
) -> None:
    a = replica(api, clock, "a")

    async def slow_answer() -> None:
        clock.advance(3)  # the reply took 3 s: the standbys may have seen the write 3 s ago

    api.between = slow_answer
    await a.try_acquire_or_renew()  # first the create (no get), then a renewal sent at 1000
    api.between = slow_answer
    assert await a.try_acquire_or_renew()
    clock.advance(10 - 3 - 0.001)
    assert a.holds()
    clock.advance(0.001)
    assert not a.holds()  # 10 s after it was sent, not after it was answered


async def test_a_standby_waits_while_the_lease_keeps_changing(api: LeaseApi, clock: Clock) -> None:
    a, b = replica(api, clock, "a"), replica(api, clock, "b")
    await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew()
    for _ in range(5):  # renewed every 10 s: b never sees it unchanged for 15 s
        clock.advance(10)
        assert await a.try_acquire_or_renew()
        assert not await b.try_acquire_or_renew()
    assert api.spec["holderIdentity"] == "a"


@pytest.mark.parametrize("skew", [-3600.0, 3600.0, 0.0])
async def test_a_standby_takes_over_a_lease_duration_after_it_last_saw_a_change_whatever_its_renew_time(
    api: LeaseApi, skew: float
) -> None:
    """The leader's wall clock is an hour slow (its Lease looks long expired), an hour fast (its Lease
    looks fresh for an hour) or right: only what the standby saw, and when by its own clock, counts."""
    a_clock, b_clock = Clock(skew=skew), Clock()
    a, b = replica(api, a_clock, "a"), replica(api, b_clock, "b")
    await a.try_acquire_or_renew()
    for _ in range(3):  # a renews: b never takes over, however old or young renewTime looks to b
        assert not await b.try_acquire_or_renew()
        a_clock.advance(5), b_clock.advance(5)
        assert await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew()  # b sees the last renewal now: its 15 s start here
    b_clock.advance(14.9)
    assert not await b.try_acquire_or_renew()
    b_clock.advance(0.1)
    assert await b.try_acquire_or_renew() and b.holds()
    assert api.spec["holderIdentity"] == "b" and api.spec["leaseTransitions"] == 1
    assert not await a.try_acquire_or_renew() and not a.holds()  # a finds b's Lease


async def test_a_replica_that_starts_late_waits_a_full_lease_duration_even_for_a_long_dead_holder(
    api: LeaseApi, clock: Clock
) -> None:
    await replica(api, Clock(skew=-86_400), "dead").try_acquire_or_renew()  # renewTime a day ago
    b = replica(api, clock, "b")
    assert not await b.try_acquire_or_renew()  # b cannot know how long ago that was: it waits
    clock.advance(15)
    assert await b.try_acquire_or_renew()


async def test_losing_a_race_for_an_expired_lease_means_not_leader(api: LeaseApi, clock: Clock) -> None:
    a, b, c = (replica(api, clock, name) for name in "abc")
    await a.try_acquire_or_renew()
    for standby in (b, c):
        assert not await standby.try_acquire_or_renew()  # both see a's Lease...
    clock.advance(20)  # ...which a then stops renewing

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


async def test_run_stops_leading_at_the_renew_deadline_before_a_standby_may_take_over(
    api: LeaseApi, clock: Clock
) -> None:
    a, b = replica(api, clock, "a"), replica(api, clock, "b")
    lost: list[float] = []
    task = asyncio.create_task(a.run(on_lost=lambda: lost.append(clock.now)))
    await asyncio.wait_for(a.became_leader.wait(), 5)
    assert not await b.try_acquire_or_renew()  # b sees a's last renewal, at 1000
    api.fail = transport_error()  # a is cut off from the API server
    await spin()
    clock.advance(9.9)
    api.fail = api_error(500, "InternalError")
    await spin()
    assert a.holds() and not lost
    clock.advance(0.1)
    await asyncio.wait_for(task, 5)  # run returns once leadership is lost
    assert lost == [1010.0] and not a.holds()
    api.fail = None
    clock.advance(4.9)
    assert not await b.try_acquire_or_renew()  # a stopped 5 s before b may take over
    clock.advance(0.1)
    assert await b.try_acquire_or_renew()


async def test_run_cuts_a_renewal_hanging_on_a_dead_connection_at_the_deadline(api: LeaseApi) -> None:
    """In real time, briefly: the round's own timeout is what ends it, not an answer."""
    a = LeaderElector(
        api,  # type: ignore[arg-type]
        name="gpufrac",
        namespace="gpufrac-system",
        identity="a",
        timing=LeaseTiming(lease_seconds=0.6, renew_deadline=0.3, retry_seconds=0.05),
    )
    lost: list[bool] = []
    task = asyncio.create_task(a.run(on_lost=lambda: lost.append(a.holds())))
    await asyncio.wait_for(a.became_leader.wait(), 5)

    async def never() -> None:
        await asyncio.Event().wait()

    api.between = never  # every get from now on hangs
    real_get = api.get

    async def hanging_get(*args: Any, **kwargs: Any) -> Lease:
        api.between = never
        return await real_get(*args, **kwargs)

    api.get = hanging_get  # type: ignore[method-assign]
    await asyncio.wait_for(task, 5)
    assert lost == [False]


async def test_run_steps_down_when_another_replica_holds_the_lease(api: LeaseApi, clock: Clock) -> None:
    a = replica(api, clock, "a")
    lost: list[bool] = []
    task = asyncio.create_task(a.run(on_lost=lambda: lost.append(True)))
    await asyncio.wait_for(a.became_leader.wait(), 5)
    assert api.body is not None
    api.body["spec"]["holderIdentity"] = "b"  # e.g. a's renewals were lost and b took over
    api.body["metadata"]["resourceVersion"] = "99"
    await asyncio.wait_for(task, 5)
    assert lost == [True] and not a.holds()


async def test_a_standby_leads_once_the_leader_stops_renewing(api: LeaseApi, clock: Clock) -> None:
    await replica(api, clock, "a").try_acquire_or_renew()
    b = replica(api, clock, "b")
    task = asyncio.create_task(b.run(on_lost=lambda: None))
    await spin()
    assert not b.became_leader.is_set()
    clock.advance(15)
    await asyncio.wait_for(b.became_leader.wait(), 5)
    await until(b.holds)
    assert api.spec["holderIdentity"] == "b"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_leader_that_stops_cleanly_releases_the_lease_and_a_standby_takes_over_at_once(
    api: LeaseApi, clock: Clock
) -> None:
    a, b = replica(api, clock, "a"), replica(api, clock, "b")
    await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew()
    await b.release()  # not the holder: changes nothing
    assert api.spec["holderIdentity"] == "a"
    await a.release()
    assert not a.holds() and api.spec["holderIdentity"] == "" and api.spec["leaseDurationSeconds"] == 1
    assert await b.try_acquire_or_renew()  # no lease duration to wait out
    assert api.spec["leaseTransitions"] == 1


async def test_a_release_the_api_server_refuses_leaves_the_lease_to_expire(
    api: LeaseApi, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    a = replica(api, clock, "a")
    await a.try_acquire_or_renew()
    api.fail = transport_error()
    await a.release()
    assert not a.holds() and api.spec["holderIdentity"] == "a"
    assert "not released" in caplog.text
