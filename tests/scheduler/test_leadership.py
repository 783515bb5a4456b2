"""The scheduler binds only while the elector holds the Lease, and resolves its binds in flight when it
loses it: against a client that records every call and holds Bindings at a gate."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from gpufrac.contract import keys
from gpufrac.scheduler.leader import LeaseTiming
from gpufrac.scheduler.serve import run_replica

from ..kubeapi.apiobjects import bound, inventory, key, node, pod
from ..kubeapi.fakeapi import RecordingClient, until
from .schedulers import scheduler
from .test_leader import Clock, LeaseApi, replica


def share(name: str) -> dict[str, Any]:
    return pod(name, annotations={"gpu-fraction": "0.5", keys.ENV_CONFIGMAP_ANNOTATION: f"env-{name}"})


@dataclass
class Found:
    body: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return self.body


class ReadBackClient(RecordingClient):
    """`get` answers with the pod as the API server holds it (`holds`: name -> object)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.holds: dict[str, dict[str, Any]] = {}

    async def get(self, resource: type[Any], name: str, **_: Any) -> Any:
        await super().get(resource, name)
        return Found(self.holds[name])


async def test_nothing_is_bound_once_the_lease_is_no_longer_held() -> None:
    client = RecordingClient()
    made = scheduler(client)
    made.on_nodes_listed([node("n1", agent=inventory("n1", 2))])
    made.on_pods_listed([share("p")])
    lease = [False]
    made.lead(holds=lambda: lease[0])  # the elector's renew deadline has passed
    assert not made.leading
    assert await made.schedule_pending() == 0 and client.calls == []
    assert made.metrics.registry.get_sample_value("gpufrac_scheduler_leader") == 0
    lease[0] = True
    assert await made.schedule_pending() == 1
    await made.wait_for_binds()
    assert [call.name for call in client.made("create", "Binding")] == ["p"]


async def test_a_pod_waiting_for_a_bind_slot_when_the_lease_runs_out_is_not_bound() -> None:
    client = RecordingClient(gate=asyncio.Event())
    made = scheduler(client, max_concurrent_binds=1)
    made.on_nodes_listed([node("n1", agent=inventory("n1", 2))])
    made.on_pods_listed([share("first"), share("second")])
    lease = [True]
    made.lead(holds=lambda: lease[0])
    rounds = asyncio.create_task(made.schedule_pending())
    await until(lambda: len(client.held) == 1)  # first's Binding waits at the gate
    lease[0] = False  # ...while second, decided, waits for the one bind slot
    assert client.gate is not None
    client.gate.set()
    await rounds
    await made.wait_for_binds()
    assert [call.name for call in client.made("create", "Binding")] == ["first"]
    assert key("second") in made.pending and key("second") not in made.cache.assumed
    assert key("second") not in made.cache.state.placements  # its reservation is freed


async def test_at_loss_of_leadership_binds_get_the_grace_and_the_rest_are_cancelled_and_read_back() -> None:
    client = ReadBackClient(gate=asyncio.Event())
    made = scheduler(client)
    made.on_nodes_listed([node("n1", agent=inventory("n1", 4))])
    made.on_pods_listed([share("landed"), share("cut")])
    await made.schedule_pending()
    await until(lambda: len(client.held) == 2)  # both Bindings wait at the gate
    written = client.held[0].metadata.annotations
    # The API server holds "landed" bound (its Binding got through before the reply was lost), "cut" not.
    client.holds = {"landed": bound(share("landed"), "n1", written), "cut": share("cut")}
    await made.step_down(grace=0.01)
    assert not made.leading
    assert client.made("create", "Binding") == []  # neither sent its Binding: cancelled at the gate
    assert [call.name for call in client.made("get", "Pod")] == ["landed", "cut"]
    assert made.cache.assumed == {}
    assert key("landed") in made.cache.state.placements  # what the API server holds, counted
    assert key("cut") not in made.cache.state.placements


async def test_a_leader_stopped_mid_bind_keeps_renewing_its_lease_so_no_standby_binds_beside_it() -> None:
    """SIGTERM lets the binds in flight finish; the Lease must stay this replica's meanwhile. Left to run
    out, a standby takes over while the stopped leader still binds (a bind waits up to ten minutes for its
    volumes), and both write the same pod's ConfigMaps and Binding."""
    client = RecordingClient(gate=asyncio.Event())
    made = scheduler(client)
    made.on_nodes_listed([node("n1", agent=inventory("n1", 2))])
    made.on_pods_listed([share("p")])
    made.run = made.scheduling_loop  # type: ignore[method-assign]  # no watches against this client
    api, timing = LeaseApi(), LeaseTiming(lease_seconds=15, renew_deadline=10, retry_seconds=0)
    a_clock, b_clock = Clock(), Clock()
    a, b = replica(api, a_clock, "a", timing), replica(api, b_clock, "b", timing)
    stop = asyncio.Event()
    running = asyncio.create_task(run_replica(made, a, stop=stop))
    await until(lambda: len(client.held) == 1)  # p's Binding waits at the gate
    stop.set()  # SIGTERM
    for _ in range(50):  # run_replica stops watching and scheduling, and waits for p's bind
        await asyncio.sleep(0)
    assert not running.done()
    assert not await b.try_acquire_or_renew()  # b sees a's Lease
    for _ in range(50):  # a goes on renewing while p's bind is in flight
        await asyncio.sleep(0)
    b_clock.advance(16)
    assert not await b.try_acquire_or_renew(), "b took the Lease while a was still binding"
    assert client.gate is not None
    client.gate.set()
    assert await running is False
    assert [call.name for call in client.made("create", "Binding")] == ["p"]
    assert api.spec["holderIdentity"] == ""  # released once nothing was in flight
