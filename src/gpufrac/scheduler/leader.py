"""Leader election on a `coordination.k8s.io/v1` Lease, so that of several replicas only one binds.

The usual protocol: the holder renews `renewTime` every `retry` seconds; another replica takes the Lease
over once `renewTime + leaseDurationSeconds` has passed. Every write carries the Lease's resourceVersion,
so two replicas racing for an expired Lease cannot both win. A leader that cannot renew within the lease
duration steps down: it must assume another replica has taken over.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Callable

import lightkube
from lightkube import ApiError
from lightkube.resources.coordination_v1 import Lease

from gpufrac.kubeapi.client import API_ERRORS, build

log = logging.getLogger("gpufrac.leader")


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _stamp(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(
        self,
        client: lightkube.AsyncClient,
        *,
        name: str,
        namespace: str,
        identity: str,
        lease_seconds: int = 15,
        retry_seconds: float = 2.0,
        clock: Callable[[], dt.datetime] = _now,
    ) -> None:
        self._client = client
        self._name = name
        self._namespace = namespace
        self.identity = identity
        self._lease_seconds = lease_seconds
        self._retry = retry_seconds
        self._clock = clock
        self.is_leader = False
        self._last_renewal: dt.datetime | None = None
        self.became_leader = asyncio.Event()

    async def try_acquire_or_renew(self) -> bool:
        """One round of the protocol; True while this replica holds the Lease."""
        now = self._clock()
        try:
            lease = await self._client.get(Lease, self._name, namespace=self._namespace)
        except ApiError as error:
            if error.status.code != 404:
                raise
            return await self._write(None, now, transitions=0)
        spec = lease.spec
        holder = spec.holderIdentity if spec else None
        renewed = spec.renewTime if spec else None
        duration = (spec.leaseDurationSeconds if spec else None) or self._lease_seconds
        transitions = (spec.leaseTransitions if spec else None) or 0
        if holder == self.identity:
            return await self._write(
                lease, now, transitions=transitions, acquire_time=spec.acquireTime if spec else None
            )
        if holder and renewed is not None and now < renewed + dt.timedelta(seconds=duration):
            return False
        log.info("lease %s/%s: taking over from %s", self._namespace, self._name, holder or "nobody")
        return await self._write(lease, now, transitions=transitions + 1)

    async def _write(
        self,
        lease: Lease | None,
        now: dt.datetime,
        *,
        transitions: int,
        acquire_time: dt.datetime | None = None,
    ) -> bool:
        spec = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self._lease_seconds,
            "acquireTime": _stamp(acquire_time or now),
            "renewTime": _stamp(now),
            "leaseTransitions": transitions,
        }
        metadata: dict[str, str | None] = {"name": self._name, "namespace": self._namespace}
        try:
            if lease is None:
                await self._client.create(build(Lease, {"metadata": metadata, "spec": spec}))
            else:
                metadata["resourceVersion"] = lease.metadata.resourceVersion if lease.metadata else None
                await self._client.replace(build(Lease, {"metadata": metadata, "spec": spec}))
        except ApiError as error:
            if error.status.code in (409, 422):  # another replica wrote first
                return False
            raise
        self._last_renewal = now
        return True

    async def run(self, *, on_lost: Callable[[], None]) -> None:
        """Hold or wait for the Lease until cancelled; call `on_lost` if leadership slips away."""
        while True:
            try:
                held = await self.try_acquire_or_renew()
            except API_ERRORS as error:
                log.warning("lease %s/%s: %s", self._namespace, self._name, error)
                held = self.is_leader and not self._expired()
            if held and not self.is_leader:
                log.info("lease %s/%s: %s is now the leader", self._namespace, self._name, self.identity)
                self.became_leader.set()
            if self.is_leader and not held:
                log.error("lease %s/%s: leadership lost", self._namespace, self._name)
                self.is_leader = False
                on_lost()
                return
            self.is_leader = held
            await asyncio.sleep(self._retry)

    def _expired(self) -> bool:
        last = self._last_renewal
        return last is None or self._clock() >= last + dt.timedelta(seconds=self._lease_seconds)
