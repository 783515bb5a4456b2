"""Defragmentation rounds against a fake API server: a whole-GPU pod gets the GPU a movable share leaves,
whatever order the eviction's reply and the watch's news of the pod's going arrive in; the room is kept for
it; a refused eviction is not counted on again."""

from __future__ import annotations

from typing import Any

import httpx2
import pytest

from gpufrac.contract import keys
from gpufrac.scheduler.loop import Scheduler

from ..kubeapi.apiobjects import GPU_MIB, bound, inventory, key, node, pod, with_status
from ..kubeapi.fakeapi import FakeApi, FakeClock, api_error
from .schedulers import scheduler, share_notes
from .test_scheduler_binds import MANAGED, gpu_node, share_pod, with_host_port

OWNER = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "rs-uid", "controller": True}


def placed_share(
    name: str, node: str, fraction: float, *, movable: bool = True, gpu: int = 0, **settings: Any
) -> dict[str, Any]:
    notes = {keys.MOVABLE_ANNOTATION: "true"} if movable else {}
    body = bound(
        pod(name, annotations=notes, **settings),
        node,
        share_notes("main", f"GPU-{node}-{gpu}", f"{int(fraction * GPU_MIB)}Mi"),
    )
    body["metadata"]["ownerReferences"] = [OWNER]
    return body


def going(body: dict[str, Any]) -> dict[str, Any]:
    gone = with_status(body)
    gone["metadata"]["deletionTimestamp"] = "2024-05-01T13:00:00Z"
    return gone


class EvictingApi(FakeApi):
    """An eviction whose pod's going the watch reports (DELETED) before the eviction's reply (`early`), or
    after."""

    def __init__(self, early: bool) -> None:
        super().__init__()
        self.early = early
        self.scheduler: Scheduler | None = None
        self.evicted: list[str] = []

    async def create(
        self, obj: Any, name: str | None = None, *, namespace: str | None = None, dry_run: bool = False
    ) -> Any:
        if obj.kind == "Eviction" and not dry_run:
            self.evicted.append(name or "")
            if self.early and self.scheduler is not None:
                self.scheduler.on_pod_event("DELETED", self.stored("Pod", name or "") or {})
        return await super().create(obj, name, namespace=namespace, dry_run=dry_run)


def two_gpus(client: FakeApi, clock: FakeClock, *, a_movable: bool = True, **a_settings: Any) -> Scheduler:
    """n0's GPU holds A (0.3), n1's B (0.6); W asks for a whole GPU."""
    a = placed_share("a", "n0", 0.3, movable=a_movable, **a_settings)
    pods = [a, placed_share("b", "n1", 0.6, movable=False)]
    pods.append(pod("w", whole=1))
    for item in pods:
        client.put(item)
    made = scheduler(client, clock, min_runtime=0)
    made.on_nodes_listed([gpu_node("n0", gpus=1), gpu_node("n1", gpus=1)])
    made.on_pods_listed(pods)
    return made


@pytest.mark.parametrize("early", [True, False], ids=["watch-first", "reply-first"])
async def test_the_room_a_moved_share_leaves_goes_to_the_pod_it_was_moved_for(early: bool) -> None:
    client, clock = EvictingApi(early), FakeClock()
    made = two_gpus(client, clock)
    client.scheduler = made
    await made.schedule_pending()
    assert client.evicted == ["a"]
    if not early:
        assert made.mover.waits(key("w"))
        # Terminating, it still holds its GPU memory for its grace period: the room is not there yet.
        made.on_pod_event("MODIFIED", going(client.stored("Pod", "a") or {}))
        assert made.mover.waits(key("w"))
        made.on_pod_event("DELETED", client.stored("Pod", "a") or {})
    # The room is kept: a share that arrives first does not take it.
    assert key("w") in made.cache.kept_rooms
    client.put(share_pod("late", "0.5"))
    made.on_pod_event("ADDED", share_pod("late", "0.5"))
    for _ in range(3):
        clock.advance(60)
        await made.schedule_pending()
    await made.wait_for_binds()
    assert client.stored("Pod", "w")["spec"]["nodeName"] == "n0"  # type: ignore[index]
    assert client.stored("Pod", "late")["spec"].get("nodeName") is None  # type: ignore[index]
    assert made.cache.kept_rooms == {} and made.mover.plans == {}


async def test_a_moved_share_gone_while_the_watch_was_broken_leaves_its_room_at_the_relist() -> None:
    """Its DELETED event never came: the relist is the news, and the pod it was moved for must not wait out
    the plan's timeout for it."""
    client, clock = EvictingApi(early=False), FakeClock()
    made = two_gpus(client, clock)
    await made.schedule_pending()
    assert client.evicted == ["a"] and made.mover.waits(key("w"))
    made.on_pods_listed([client.stored("Pod", name) or {} for name in ("b", "w")])
    assert not made.mover.waits(key("w")) and key("w") in made.cache.kept_rooms
    clock.advance(1)  # its backoff
    await made.schedule_pending()
    await made.wait_for_binds()
    assert client.stored("Pod", "w")["spec"]["nodeName"] == "n0"  # type: ignore[index]


@pytest.mark.parametrize("lost", ["reply", "request"])
async def test_an_eviction_whose_answer_is_lost_is_counted_on_by_its_plan(lost: str) -> None:
    """Done or not, nobody can tell: the plan waits for the pod (the room then kept for the pod it was moved
    for) rather than leaving it to whoever comes first, or evicting another in its place; should it stay,
    the plan's timeout gives up on it."""
    client, clock = EvictingApi(early=False), FakeClock()
    client.lose.append(("create Eviction", lost))
    made = two_gpus(client, clock)
    await made.schedule_pending()
    assert made.mover.waits(key("w"))
    made.on_pod_event("DELETED", client.stored("Pod", "a") or {})
    assert key("w") in made.cache.kept_rooms


class UnreachableOnEviction(EvictingApi):
    """The dry run answered; the connection for the eviction itself is refused."""

    async def create(
        self, obj: Any, name: str | None = None, *, namespace: str | None = None, dry_run: bool = False
    ) -> Any:
        if obj.kind == "Eviction" and not dry_run:
            raise httpx2.ConnectError("connection refused")
        return await super().create(obj, name, namespace=namespace, dry_run=dry_run)


async def test_an_eviction_never_sent_is_not_counted_on() -> None:
    client, clock = UnreachableOnEviction(early=False), FakeClock()
    made = two_gpus(client, clock)
    await made.schedule_pending()
    assert not made.mover.waits(key("w")) and made.mover.plans == {}


async def test_a_refused_eviction_is_not_tried_again_while_it_would_be_refused() -> None:
    client, clock = EvictingApi(early=False), FakeClock()
    client.fail["create Eviction"] = api_error(429, "TooManyRequests", "disruption budget")
    made = two_gpus(client, clock)
    await made.schedule_pending()
    asked = [call.name for call in client.calls if call.kind == "Eviction"]
    assert asked == ["a"] and client.evicted == [] and key("a") in made.mover.refused  # refused as a dry run
    clock.advance(120)
    await made.schedule_pending()
    assert [call.name for call in client.calls if call.kind == "Eviction"] == asked  # not asked again yet
    assert client.stored("Pod", "w")["spec"].get("nodeName") is None  # type: ignore[index]


@pytest.mark.parametrize(
    "a", [{"a_movable": False}, {"scheduler": "default-scheduler"}], ids=["no consent", "another scheduler's"]
)
async def test_a_pod_without_consent_or_of_another_scheduler_is_never_moved(a: dict[str, Any]) -> None:
    """Another scheduler's pod would come back wherever that scheduler puts it, not where the plan counts on
    placing it, so its consent does not make it movable."""
    client = EvictingApi(early=True)
    made = two_gpus(client, FakeClock(), **a)
    client.scheduler = made
    await made.schedule_pending()
    assert client.evicted == [] and made.mover.plans == {}


REQUIRED_POD_AFFINITY = {
    "podAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "kubernetes.io/hostname"}
        ]
    }
}


def kept_to_n0(body: dict[str, Any]) -> dict[str, Any]:
    body["spec"]["nodeSelector"] = {"zone": "a"}
    return body


def binds_8080(body: dict[str, Any]) -> dict[str, Any]:
    return with_host_port(body, 8080)


def with_pod_affinity(body: dict[str, Any]) -> dict[str, Any]:
    body["spec"]["affinity"] = REQUIRED_POD_AFFINITY
    return body


def with_claim(body: dict[str, Any]) -> dict[str, Any]:
    body["spec"]["volumes"] = [{"name": "home", "persistentVolumeClaim": {"claimName": "home"}}]
    return body


@pytest.mark.parametrize(
    "constrain",
    [kept_to_n0, binds_8080, with_pod_affinity, with_claim],
    ids=["node-selector", "host-port-taken-on-n1", "pod-affinity-with-no-db", "volume"],
)
async def test_a_pod_is_not_moved_where_its_new_pod_could_not_go(constrain: Any) -> None:
    """A could make room for W by going to n1, but its controller's new pod could not be placed there (its
    node selector, a host port B binds there), nowhere at all (its pod affinity names a pod that does not
    run), or only where its volume is, which is not known without reading it: evicting A could leave it
    pending."""
    client = EvictingApi(early=True)
    a = constrain(placed_share("a", "n0", 0.3))
    b = with_host_port(placed_share("b", "n1", 0.6, movable=False), 8080)
    pods = [a, b, pod("w", whole=1)]
    for item in pods:
        client.put(item)
    made = scheduler(client, FakeClock(), min_runtime=0)
    client.scheduler = made
    zone_a = node("n0", gpus=1, labels={**MANAGED, "zone": "a"}, agent=inventory("n0", 1))
    made.on_nodes_listed([zone_a, gpu_node("n1", gpus=1)])
    made.on_pods_listed(pods)
    await made.schedule_pending()
    assert client.evicted == [] and made.mover.plans == {}


async def test_a_pod_may_move_to_another_gpu_of_its_node_though_it_binds_a_host_port() -> None:
    """A binds host port 9090 on n0; moving it to n0's other GPU opens GPU 0 for W: its own port is no
    clash, since its new pod arrives once it is gone."""
    client = EvictingApi(early=True)
    pods = [
        with_host_port(placed_share("a", "n0", 0.3), 9090),
        placed_share("b", "n0", 0.6, movable=False, gpu=1),
        pod("w", whole=1),
    ]
    for item in pods:
        client.put(item)
    made = scheduler(client, FakeClock(), min_runtime=0)
    client.scheduler = made
    made.on_nodes_listed([gpu_node("n0", gpus=2)])
    made.on_pods_listed(pods)
    await made.schedule_pending()
    assert client.evicted == ["a"]


async def test_an_eviction_names_its_pod_by_uid_so_a_pod_recreated_under_its_name_is_left_alone() -> None:
    """A StatefulSet recreates its pod under the same name; until the watch tells of it, the cache still
    holds the first. The API server refuses an eviction whose UID is not the pod's
    (tests/integration/test_eviction.py); by name alone, it evicted the second, which no plan chose."""
    client, clock = EvictingApi(early=False), FakeClock()
    made = two_gpus(client, clock)
    await made.schedule_pending()
    sent = [call.body.to_dict() for call in client.calls if call.kind == "Eviction"]
    assert len(sent) == 2  # asked (a dry run), then done
    assert all(body.get("deleteOptions") == {"preconditions": {"uid": key("a")}} for body in sent)


@pytest.mark.parametrize(("own", "sent"), [(86_400, 600), (600, None), (None, None)])
async def test_an_evicted_pod_gets_at_most_ten_minutes_of_grace(own: int | None, sent: int | None) -> None:
    """The grace period is the tenant's to set: a day of it kept the evicted pod's GPU a day, while plans
    stopped waiting for it after ten minutes and evicted more. A shorter one is the pod's own."""
    client, clock = EvictingApi(early=False), FakeClock()
    made = two_gpus(client, clock)
    if own is not None:
        moved = made.cache.bound[key("a")]
        moved["spec"]["terminationGracePeriodSeconds"] = own
    await made.schedule_pending()
    sent_options = [call.body.to_dict()["deleteOptions"] for call in client.calls if call.kind == "Eviction"]
    assert len(sent_options) == 2
    assert all(options.get("gracePeriodSeconds") == sent for options in sent_options)
