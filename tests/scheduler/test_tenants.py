"""The fair-share book under a tenant's load: a pass over the pending pods is paid at most once a refresh
period, however long it takes; a pending pod is read once, not at every pass; and pods naming queues
nobody made neither take a share nor cost a pop more than pods of one queue."""

from __future__ import annotations

from typing import Any

import pytest

from gpufrac.contract import queues
from gpufrac.scheduler import objects, tenants
from gpufrac.scheduler.cache import SchedulerCache
from gpufrac.scheduler.tenants import Tenants

from ..kubeapi.apiobjects import inventory, node, pod
from ..kubeapi.fakeapi import FakeApi, FakeClock
from .schedulers import scheduler


def queued(name: str, queue: str) -> dict[str, Any]:
    body = pod(name, whole=1)
    body["metadata"]["labels"] = {queues.QUEUE_LABEL: queue}
    return body


def a_cache() -> SchedulerCache:
    cache = SchedulerCache()
    cache.add_node(node("n1", agent=inventory("n1", 2)))
    return cache


def test_a_pass_longer_than_the_refresh_period_is_not_paid_again_at_the_next_decision() -> None:
    """Measured from its start, a pass over thousands of pending pods that took seconds was due again at
    once: every decision paid one."""
    clock = FakeClock()
    book = Tenants(report=lambda _: None, clock=clock, refresh=1.0)
    passes = []
    recompute = book._recompute

    def slow(*args: Any) -> None:
        passes.append(clock())
        recompute(*args)
        clock.advance(3.0)

    book._recompute = slow  # type: ignore[method-assign]
    pending = {objects.pod_uid(p): p for p in (queued("a", "default"),)}
    for _ in range(3):
        book.rank(a_cache(), pending)
    assert len(passes) == 1
    clock.advance(1.0)
    book.rank(a_cache(), pending)
    assert len(passes) == 2


def test_a_pending_pod_is_read_once_not_at_every_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    read: list[str] = []
    asked = tenants._asked
    monkeypatch.setattr(
        tenants, "_asked", lambda body, mib: read.append(objects.name_of(body)) or asked(body, mib)
    )
    book = Tenants(report=lambda _: None)
    pending = {objects.pod_uid(p): p for p in (queued("a", "default"), queued("b", "default"))}
    book.rank(a_cache(), pending)
    book.outdated()
    book.rank(a_cache(), pending)
    assert sorted(read) == ["a", "b"]
    changed = queued("b", "default")  # its next version: another object, read again
    book.outdated()
    book.rank(a_cache(), pending | {objects.pod_uid(changed): changed})
    assert sorted(read) == ["a", "b", "b"]


async def test_pods_of_queues_nobody_made_wait_together_and_take_no_share() -> None:
    client = FakeApi()
    ghosts = [queued(f"g{i}", f"ghost-{i}") for i in range(3)]
    for item in ghosts:
        client.put(item)
    made = scheduler(client, queues=True)
    made.on_queues_listed([])
    made.on_nodes_listed([node("n1", agent=inventory("n1", 1))])
    made.on_pods_listed(ghosts)
    assert made.queue.tenants() == {tenants.NO_SUCH_QUEUE}
    await made.schedule_pending()
    made.tenants.outdated()
    made.tenants.rank(made.cache, made.pending)
    assert not any(name.startswith("ghost") for name in made.tenants.shares)


async def test_pods_queued_before_their_queue_was_listed_wait_in_it_once_it_is() -> None:
    """The watches list pods and Queues in no set order: queued among the pods of queues nobody made, a
    team's pods lost their fair-share order until they were queued again."""
    client = FakeApi()
    pods = [queued("a1", "team-a"), queued("b1", "team-b")]
    for item in pods:
        client.put(item)
    made = scheduler(client, queues=True)
    made.is_leader = False  # a standby: its rounds try no pod
    made.on_nodes_listed([node("n1", agent=inventory("n1", 1))])
    made.on_pods_listed(pods)
    assert made.queue.tenants() == {tenants.NO_SUCH_QUEUE}
    made.on_queues_listed(
        [{"kind": queues.KIND, "metadata": {"name": name}, "spec": {}} for name in ("team-a", "team-b")]
    )
    assert made.queue.tenants() == {tenants.NO_SUCH_QUEUE}  # once a round, not at each event
    await made.schedule_pending()
    assert made.queue.tenants() == {"team-a", "team-b"}
