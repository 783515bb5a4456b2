"""A pod's persistent volumes decide where it may go (`scheduler.volumes`): a bound volume's node affinity,
a delayed-binding claim named the chosen node before the bind, a ReadWriteOncePod claim mounted by one pod
at a time, and a pod waiting, saying why, on claims it cannot be placed with yet."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from gpufrac.scheduler.volumes import (
    MAX_CLAIMS,
    NO_PROVISIONER,
    READ_WRITE_ONCE_POD,
    READS_AT_ONCE,
    SELECTED_NODE_ANNOTATION,
    WAIT_FOR_FIRST_CONSUMER,
)

from ..kubeapi.apiobjects import bound, key, pod
from ..kubeapi.fakeapi import FakeApi, api_error, until
from .schedulers import pod_nodes
from .test_scheduler_binds import MANAGED, gpu_node, setup, share_pod

ZONE = "topology.kubernetes.io/zone"


def zoned(name: str, zone: str) -> dict[str, Any]:
    made = gpu_node(name)
    made["metadata"]["labels"] = {**MANAGED, ZONE: zone}
    return made


def mounting(body: dict[str, Any], *claims: str, ephemeral: str = "") -> dict[str, Any]:
    volumes: list[dict[str, Any]] = [
        {"name": f"v{i}", "persistentVolumeClaim": {"claimName": claim}} for i, claim in enumerate(claims)
    ]
    if ephemeral:
        volumes.append({"name": ephemeral, "ephemeral": {"volumeClaimTemplate": {"spec": {}}}})
    body["spec"]["volumes"] = volumes
    return body


def claim(name: str, *, volume: str = "", storage_class: str = "", **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"storageClassName": storage_class} if storage_class else {}
    if volume:
        spec["volumeName"] = volume
    meta: dict[str, Any] = {"name": name, "namespace": "team", **extra}
    return {"kind": "PersistentVolumeClaim", "metadata": meta, "spec": spec, "status": {}}


def zonal_volume(name: str, zone: str) -> dict[str, Any]:
    required = {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": ZONE, "operator": "In", "values": [zone]}]}]
    }
    return {
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {"nodeAffinity": {"required": required}},
    }


def volume_on(name: str, node: str) -> dict[str, Any]:
    """A volume that only `node` can attach, as a provisioner makes it for a claim of delayed binding."""
    only = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    return {
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [only]}}},
    }


def asking(mode: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Claim `model`, asking for access `mode`, bound to a volume of zone-b; and that volume."""
    made = claim("model", volume="pv-model")
    made["spec"]["accessModes"] = [mode]
    return made, zonal_volume("pv-model", "zone-b")


def storage_class(name: str, mode: str = WAIT_FOR_FIRST_CONSUMER, **extra: Any) -> dict[str, Any]:
    body = {"kind": "StorageClass", "metadata": {"name": name}, "provisioner": "ebs.csi.aws.com"}
    return {**body, "volumeBindingMode": mode, **extra}


NODES = [zoned("a1", "zone-a"), zoned("b1", "zone-b")]


def provisioning(client: FakeApi, *, succeeds: bool = True) -> None:
    """A provisioner: a claim that names a node is bound to a new volume when next read, or (`succeeds`
    false) has the node taken off again, as a provisioner that cannot make the volume there does."""
    read = client.get

    async def get(resource: type[Any], name: str, *, namespace: str | None = None, **more: Any) -> Any:
        stored = client.stored(resource.__name__, name, namespace or "")
        notes = stored["metadata"].get("annotations", {}) if stored else {}
        if resource.__name__ == "PersistentVolumeClaim" and stored and SELECTED_NODE_ANNOTATION in notes:
            if succeeds:
                stored["spec"]["volumeName"] = f"pv-{name}"
                client.put(volume_on(f"pv-{name}", notes[SELECTED_NODE_ANNOTATION]))
            else:
                del notes[SELECTED_NODE_ANNOTATION]
        return await read(resource, name, namespace=namespace, **more)

    client.get = get  # type: ignore[method-assign]


async def decided(
    *objects: dict[str, Any], provisions: bool | None = True, **settings: Any
) -> tuple[Any, Any]:
    """A scheduler over `NODES` and the API objects given (pods are listed, the rest only stored), after
    one round; with a provisioner that `provisions` (None: none)."""
    pods = [body for body in objects if body.get("kind", "Pod") == "Pod"]
    made, client, _ = setup(NODES, pods, **settings)
    for body in objects:
        if body not in pods:
            client.put(body)
    if provisions is not None:
        provisioning(client, succeeds=provisions)
    await made.schedule_pending()
    await made.wait_for_binds()
    return made, client


async def test_a_pod_goes_where_its_bound_volume_is() -> None:
    made, _ = await decided(
        mounting(share_pod("p"), "home"), claim("home", volume="pv-home"), zonal_volume("pv-home", "zone-b")
    )
    assert pod_nodes(made) == {key("p"): "b1"}


async def test_a_claim_of_delayed_binding_is_given_the_node_before_the_pod_is_bound() -> None:
    pod = mounting(share_pod("p"), ephemeral="scratch")
    zone_a = {"allowedTopologies": [{"matchLabelExpressions": [{"key": ZONE, "values": ["zone-a"]}]}]}
    made, client = await decided(pod, claim("p-scratch", storage_class="gp3"), storage_class("gp3", **zone_a))
    assert pod_nodes(made) == {key("p"): "a1"}  # the class's topologies
    patches = client.made("patch", "PersistentVolumeClaim")
    assert [(call.name, call.body) for call in patches] == [
        ("p-scratch", {"metadata": {"annotations": {SELECTED_NODE_ANNOTATION: "a1"}}})
    ]
    kinds = [call.kind for call in client.calls if call.verb in ("patch", "create")]
    assert kinds.index("PersistentVolumeClaim") < kinds.index("Binding")


@pytest.mark.parametrize("provisions", [False, None], ids=["provisioner-gives-up", "never-provisioned"])
async def test_a_pod_whose_volume_is_not_provisioned_is_not_bound_and_is_placed_again(
    provisions: bool | None,
) -> None:
    pod = mounting(share_pod("p"), "cache")
    made, client = await decided(
        pod,
        claim("cache", storage_class="gp3"),
        storage_class("gp3"),
        provisions=provisions,
        volume_bind_timeout=0.3,
    )
    assert client.made("create", "Binding") == [] and made.cache.state.placements == {}
    assert key("p") in made.pending  # tried again after its backoff


async def test_a_claim_already_given_a_node_keeps_the_pod_to_it_and_is_not_written_again() -> None:
    given = claim("cache", storage_class="gp3", annotations={SELECTED_NODE_ANNOTATION: "b1"})
    made, client = await decided(mounting(share_pod("p"), "cache"), given, storage_class("gp3"))
    assert pod_nodes(made) == {key("p"): "b1"} and client.made("patch", "PersistentVolumeClaim") == []


@pytest.mark.parametrize(
    ("objects", "why"),
    [
        ((), "persistentvolumeclaim team/home not found"),
        ((claim("home", deletionTimestamp="2024-05-01T13:00:00Z"),), "team/home is being deleted"),
        ((claim("home", storage_class="fast"), storage_class("fast", "Immediate")), "not bound to a volume"),
        ((claim("home", storage_class="missing"),), "team/home is not bound to a volume yet"),
        ((claim("home", volume="pv-gone"),), "persistentvolume pv-gone of persistentvolumeclaim team/home"),
        (
            (claim("home", storage_class="local"), storage_class("local", provisioner=NO_PROVISIONER)),
            "gpufrac does not bind pre-made volumes of StorageClass local",
        ),
        (
            (claim("home", volume="pv"), zonal_volume("pv", "zone-c")),
            "2 node(s) had volume node affinity conflict",
        ),
    ],
    ids=["missing", "deleted", "immediate", "no-class", "volume-gone", "local", "other-zone"],
)
async def test_a_pod_whose_claims_cannot_be_placed_waits_saying_why(
    objects: tuple[Any, ...], why: str
) -> None:
    made, client = await decided(mounting(share_pod("p"), "home"), *objects)
    assert pod_nodes(made) == {} and client.made("create", "Binding") == []
    messages = [call.body["status"]["conditions"][0]["message"] for call in client.made("patch", "PodStatus")]
    assert any(why in message for message in messages), messages


async def test_a_claim_that_cannot_be_given_its_node_leaves_the_pod_unbound_to_try_again() -> None:
    pod = mounting(share_pod("p"), "cache")
    made, client, _ = setup(NODES, [pod])
    client.put(claim("cache", storage_class="gp3"))
    client.put(storage_class("gp3"))
    client.fail["patch PersistentVolumeClaim"] = api_error(403, "Forbidden", "no patch on claims")
    await made.schedule_pending()
    await made.wait_for_binds()
    assert client.made("create", "Binding") == [] and key("p") in made.pending
    assert made.cache.state.placements == {}


async def test_a_pod_deleted_while_its_volumes_are_read_is_not_placed_nor_left_reserved() -> None:
    pod = mounting(share_pod("p"), "home")
    made, client, _ = setup(NODES, [pod])
    client.put(claim("home", volume="pv-home"))
    client.put(zonal_volume("pv-home", "zone-b"))

    async def deleted() -> None:
        made.on_pod_event("DELETED", pod)

    client.before["get PersistentVolumeClaim"] = deleted
    await made.schedule_pending()
    await made.wait_for_binds()
    assert made.cache.state.placements == {} and made.cache.assumed == {} and made.pending == {}
    assert client.made("create", "Binding") == []


async def test_a_bind_waiting_for_its_volume_holds_no_bind_slot() -> None:
    """One bind at a time: the pod whose volume is still being made does not keep the next pod from
    binding, and binds itself once its volume comes."""
    slow = mounting(share_pod("slow", created="2024-05-01T11:00:00Z"), "cache")
    made, client, _ = setup(NODES, [slow, share_pod("quick")], max_concurrent_binds=1, volume_bind_timeout=5)
    client.put(claim("cache", storage_class="gp3"))
    client.put(storage_class("gp3"))
    await made.schedule_pending()
    await until(lambda: bool(client.made("create", "Binding")))
    provisioning(client)
    await made.wait_for_binds()
    assert [call.name for call in client.made("create", "Binding")] == ["quick", "slow"]


async def test_a_pods_claims_are_read_a_few_at_once_and_each_class_once() -> None:
    """A tenant's pod of many claims costs the scheduler (deciding one pod at a time) a few round trips,
    not one per claim; where several make it wait, it is told of the first it names."""
    names = [f"c{i:03}" for i in range(MAX_CLAIMS)]
    pod = mounting(share_pod("p"), *names)
    made, client, _ = setup(NODES, [pod])
    client.put(storage_class("gp3"))
    for name in names[:-2]:
        client.put(claim(name, storage_class="gp3"))
    client.put(claim(names[-1], storage_class="gp3", deletionTimestamp="2024-05-01T12:00:00Z"))
    read, flying, most = client.get, [0], [0]

    async def get(resource: type[Any], name: str, **more: Any) -> Any:
        flying[0] += 1
        most[0] = max(most[0], flying[0])
        await asyncio.sleep(0.001)
        try:
            return await read(resource, name, **more)
        finally:
            flying[0] -= 1

    client.get = get  # type: ignore[method-assign]
    await made.schedule_pending()
    assert 1 < most[0] <= READS_AT_ONCE
    assert len(client.made("get", "StorageClass")) == 1
    messages = [call.body["status"]["conditions"][0]["message"] for call in client.made("patch", "PodStatus")]
    assert any(f"persistentvolumeclaim team/{names[-2]} not found" in message for message in messages)


async def test_a_claim_name_that_is_no_object_name_is_never_read_or_written() -> None:
    """A claim's name goes into the path of the API request: `../` would reach another namespace's claim
    (the scheduler may read and patch every claim), which the API server took in a pod's volume."""
    traversal = "../../victims/persistentvolumeclaims/data"
    made, client = await decided(mounting(share_pod("p"), "home", traversal), claim("home", volume=""))
    assert pod_nodes(made) == {}
    assert all(call.name != traversal for call in client.calls)
    assert client.made("patch", "PersistentVolumeClaim") == []
    messages = [call.body["status"]["conditions"][0]["message"] for call in client.made("patch", "PodStatus")]
    assert any("is not a valid object name" in message for message in messages), messages


def running_user() -> dict[str, Any]:
    """Another scheduler's pod, running on b1 with claim `model`."""
    return bound(mounting(pod("first", scheduler="default-scheduler"), "model"), "b1", {})


def placed_user() -> dict[str, Any]:
    """A pod of gpufrac's with the claim, placed in the same round just before the one that wants it too."""
    return mounting(share_pod("first", created="2024-05-01T11:00:00Z"), "model")


@pytest.mark.parametrize("user", [running_user, placed_user], ids=["running", "placed-first"])
async def test_a_pod_waits_while_another_pod_mounts_its_read_write_once_pod_claim(
    user: Callable[[], dict[str, Any]],
) -> None:
    """As kube-scheduler's VolumeRestrictions: bound, the second pod's mount would fail, and it would hold its
    GPU share in ContainerCreating."""
    second = mounting(share_pod("second"), "model")
    made, client = await decided(user(), second, *asking(READ_WRITE_ONCE_POD))
    assert pod_nodes(made) == {key("first"): "b1"}
    messages = [call.body["status"]["conditions"][0]["message"] for call in client.made("patch", "PodStatus")]
    why = "persistentvolumeclaim team/model has access mode ReadWriteOncePod and pod team/first uses it"
    assert why in messages, messages


async def test_a_pod_waiting_for_a_read_write_once_pod_claim_is_placed_once_its_user_is_gone() -> None:
    first = running_user()
    made, client, clock = setup(NODES, [first, mounting(share_pod("second"), "model")])
    for body in asking(READ_WRITE_ONCE_POD):
        client.put(body)
    await made.schedule_pending()
    assert key("second") not in pod_nodes(made)
    made.on_pod_event("DELETED", first)
    clock.advance(31)  # past its backoff
    await made.schedule_pending()
    await made.wait_for_binds()
    assert pod_nodes(made) == {key("second"): "b1"}
    assert [call.name for call in client.made("create", "Binding")] == ["second"]


async def test_a_read_write_once_claim_is_mounted_by_several_pods() -> None:
    """ReadWriteOnce restricts the claim to one node, not to one pod: its volume's node affinity keeps the
    pods together."""
    second = mounting(share_pod("second"), "model")
    made, _ = await decided(running_user(), second, *asking("ReadWriteOnce"))
    assert pod_nodes(made) == {key("first"): "b1", key("second"): "b1"}
