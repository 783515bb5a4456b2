"""Leader election on a `coordination.k8s.io/v1` Lease, so that of several replicas only one binds.

The protocol is client-go's, with its three durations (`LeaseTiming`):

- `lease_seconds` (15): how long a standby waits, after it last saw the Lease change, before it takes over;
- `renew_deadline` (10): how long the leader goes on leading without a successful renewal. It is shorter
  than the lease, so a leader cut off from the API server stops binding before any standby can take over;
- `retry_seconds` (2): how often each replica tries.

No replica trusts another's clock. A standby never compares the holder's `renewTime` with its own time
(a skewed clock on either side would make it take over a live leader, or wait for ever); it notes, on its
own monotonic clock, when it last saw the Lease's record (holder, renewTime, resourceVersion) change, and
takes over once `leaseDurationSeconds` have passed since without a change. The leader counts its
deadline from when it *sent* its last successful renewal, which is no later than when any standby can have
seen that renewal; so the leader's `holds()` turns False at least `lease - renew_deadline` seconds before
a standby may write. `renewTime` is still written, in UTC, for people reading the Lease.

Every write carries the Lease's resourceVersion, so two replicas racing for an expired Lease cannot both
win.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import lightkube
from lightkube import ApiError
from lightkube.resources.coordination_v1 import Lease

from gpufrac.kubeapi.client import API_ERRORS, build

log = logging.getLogger("gpufrac.leader")

# client-go's JitterFactor: a renewal must fit at least one retry, with room for jitter, in the deadline.
_RETRIES_PER_DEADLINE = 1.2


@dataclass(frozen=True, slots=True)
class LeaseTiming:
    """The three durations, in seconds; client-go's defaults, as kube-scheduler uses them."""

    lease_seconds: float = 15.0
    renew_deadline: float = 10.0
    retry_seconds: float = 2.0

    def __post_init__(self) -> None:
        if not self.lease_seconds > self.renew_deadline > _RETRIES_PER_DEADLINE * self.retry_seconds:
            raise ValueError(
                f"leader election needs lease ({self.lease_seconds}s) > renew deadline "
                f"({self.renew_deadline}s) > {_RETRIES_PER_DEADLINE} x retry ({self.retry_seconds}s)"
            )


DEFAULT_TIMING = LeaseTiming()


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _stamp(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _record(lease: Lease) -> tuple[Any, ...]:
    """What a standby watches for change: any write changes the resourceVersion."""
    spec, meta = lease.spec, lease.metadata
    return (
        spec.holderIdentity if spec else None,
        spec.renewTime if spec else None,
        meta.resourceVersion if meta else None,
    )


class LeaderElector:
    def __init__(
        self,
        client: lightkube.AsyncClient,
        *,
        name: str,
        namespace: str,
        identity: str,
        timing: LeaseTiming = DEFAULT_TIMING,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], dt.datetime] = _now,
    ) -> None:
        self._client = client
        self._name = name
        self._namespace = namespace
        self.identity = identity
        self.timing = timing
        self._monotonic = monotonic
        self._wall = wall
        self._observed: tuple[Any, ...] | None = None  # the Lease's record as last seen
        self._observed_at = 0.0  # monotonic time at which it was first seen so
        self._leading_until: float | None = None  # monotonic: leader until then, unless renewed
        self.became_leader = asyncio.Event()

    def holds(self) -> bool:
        """True while this replica may act as the leader: its last renewal is younger than the deadline."""
        return self._leading_until is not None and self._monotonic() < self._leading_until

    @property
    def is_leader(self) -> bool:
        return self.holds()

    async def try_acquire_or_renew(self) -> bool:
        """One round of the protocol; True when this replica wrote the Lease (it holds it until the renew
        deadline), False when another replica holds it or won a race for it."""
        sent = self._monotonic()
        try:
            lease = await self._client.get(Lease, self._name, namespace=self._namespace)
        except ApiError as error:
            if error.status.code != 404:
                raise
            return await self._write(None, sent, transitions=0)
        record = _record(lease)
        if record != self._observed:
            self._observed, self._observed_at = record, self._monotonic()
        spec = lease.spec
        holder = spec.holderIdentity if spec else None
        duration = (spec.leaseDurationSeconds if spec else None) or self.timing.lease_seconds
        transitions = (spec.leaseTransitions if spec else None) or 0
        if holder == self.identity:
            acquired = spec.acquireTime if spec else None
            return await self._write(lease, sent, transitions=transitions, acquire_time=acquired)
        if holder and self._monotonic() < self._observed_at + duration:
            self._leading_until = None  # another replica holds it: whatever this one held is gone
            return False
        log.info("lease %s/%s: taking over from %s", self._namespace, self._name, holder or "nobody")
        return await self._write(lease, sent, transitions=transitions + 1)

    async def _write(
        self,
        lease: Lease | None,
        sent: float,
        *,
        transitions: int,
        acquire_time: dt.datetime | None = None,
    ) -> bool:
        now = self._wall()
        spec = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.timing.lease_seconds)),
            "acquireTime": _stamp(acquire_time or now),
            "renewTime": _stamp(now),
            "leaseTransitions": transitions,
        }
        try:
            written = await self._put(lease, spec)
        except ApiError as error:
            if error.status.code in (409, 422):  # another replica wrote first
                return False
            raise
        self._leading_until = sent + self.timing.renew_deadline
        if isinstance(written, Lease):
            self._observed, self._observed_at = _record(written), self._monotonic()
        return True

    async def _put(self, lease: Lease | None, spec: dict[str, Any]) -> object:
        """Create the Lease, or replace `lease` on condition that it has not changed since it was read."""
        metadata: dict[str, str | None] = {"name": self._name, "namespace": self._namespace}
        if lease is None:
            return await self._client.create(build(Lease, {"metadata": metadata, "spec": spec}))
        metadata["resourceVersion"] = lease.metadata.resourceVersion if lease.metadata else None
        return await self._client.replace(build(Lease, {"metadata": metadata, "spec": spec}))

    async def release(self) -> None:
        """Give the Lease up, once this replica has nothing left in flight (a clean shutdown), so that a
        standby takes over at its next try instead of a lease duration later. Best effort: a Lease that
        cannot be written simply expires."""
        if not self.holds():
            return
        self._leading_until = None
        try:
            async with asyncio.timeout(self.timing.renew_deadline):
                lease = await self._client.get(Lease, self._name, namespace=self._namespace)
                if lease.spec is None or lease.spec.holderIdentity != self.identity:
                    return
                now = _stamp(self._wall())
                transitions = lease.spec.leaseTransitions or 0
                spec = {"holderIdentity": "", "leaseDurationSeconds": 1, "acquireTime": now, "renewTime": now}
                await self._put(lease, spec | {"leaseTransitions": transitions})
        except (TimeoutError, *API_ERRORS) as error:
            log.warning(
                "lease %s/%s: not released (%s); it expires instead", self._namespace, self._name, error
            )
            return
        log.info("lease %s/%s: released", self._namespace, self._name)

    async def run(self, *, on_lost: Callable[[], None]) -> None:
        """Hold or wait for the Lease until cancelled; call `on_lost` (and return) once this replica led and
        then could not renew within the deadline, or found another holder.

        Each round is cut off at the deadline, so a request hanging on a dead connection cannot keep a
        leader believing it leads; `holds()` turns False at the deadline whatever the round is doing.
        """
        led = False
        while True:
            budget = self._leading_until - self._monotonic() if led and self._leading_until else None
            try:
                async with asyncio.timeout(budget if budget is not None else self.timing.renew_deadline):
                    await self.try_acquire_or_renew()
            except (TimeoutError, *API_ERRORS) as error:
                log.warning("lease %s/%s: %s", self._namespace, self._name, error or "no answer in time")
            if self.holds() and not led:
                log.info("lease %s/%s: %s is now the leader", self._namespace, self._name, self.identity)
                self.became_leader.set()
                led = True
            elif led and not self.holds():
                log.error("lease %s/%s: leadership lost (not renewed in time)", self._namespace, self._name)
                self._leading_until = None
                on_lost()
                return
            pause = self.timing.retry_seconds
            if self._leading_until is not None:
                pause = max(0.0, min(pause, self._leading_until - self._monotonic()))
            await asyncio.sleep(pause)
