"""sm-sharing shares of different fault domains (namespaces, or groups an admin's namespace label names)
never share a GPU; the domain a share was placed in is written at bind and read back after a restart."""

from __future__ import annotations

import copy
from typing import Any

from gpufrac.contract import keys
from gpufrac.scheduler import objects

from ..kubeapi.apiobjects import inventory, key, node, pod
from ..kubeapi.fakeapi import FakeApi, FakeClock
from .schedulers import pod_nodes, scheduler

SM = {"gpu-fraction": "0.25", keys.container_key("main", keys.COMPUTE_MODE): "sm-sharing"}


def sm_pod(name: str, namespace: str) -> dict[str, Any]:
    made = pod(name, annotations=SM)
    made["metadata"]["namespace"] = namespace
    made["metadata"]["uid"] = key(name)
    return made


def namespace(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}}


async def run(pods: list[dict[str, Any]], *, gpus: int = 1, **settings: Any) -> tuple[Any, FakeApi]:
    client = FakeApi()
    for item in pods:
        client.put(item)
    made = scheduler(client, FakeClock(), **settings)
    made.on_namespaces_listed([namespace("a", team="x"), namespace("b", team="x"), namespace("c")])
    made.on_nodes_listed([node("n1", agent=inventory("n1", gpus))])
    made.on_pods_listed(pods)
    await made.schedule_pending()
    await made.wait_for_binds()
    return made, client


def devices(client: FakeApi, name: str, namespace: str) -> str | None:
    stored = client.stored("Pod", name, namespace)
    assert stored is not None
    return stored["metadata"]["annotations"].get(keys.container_key("main", keys.DEVICES))


async def test_each_namespace_is_its_own_fault_domain_by_default() -> None:
    made, client = await run([sm_pod("p", "a"), sm_pod("q", "b")], gpus=2)
    assert devices(client, "p", "a") != devices(client, "q", "b")
    assert client.stored("Pod", "p", "a")["metadata"]["annotations"][keys.FAULT_DOMAIN_ANNOTATION] == "a"
    made, client = await run([sm_pod("p", "a"), sm_pod("q", "b")], gpus=1)
    assert sorted(pod_nodes(made)) == [key("p")]


async def test_an_admins_namespace_label_groups_namespaces_into_one_domain() -> None:
    _, client = await run([sm_pod("p", "a"), sm_pod("q", "b"), sm_pod("r", "c")], fault_domain_label="team")
    assert devices(client, "p", "a") == devices(client, "q", "b") is not None
    assert devices(client, "r", "c") is None  # namespace c is its own domain, and the one GPU is taken
    written = client.stored("Pod", "q", "b")["metadata"]["annotations"][keys.FAULT_DOMAIN_ANNOTATION]
    assert written == "team=x"


async def test_a_bound_share_keeps_the_domain_written_at_bind() -> None:
    made, client = await run([sm_pod("p", "a")], fault_domain_label="team")
    bound = copy.deepcopy(client.stored("Pod", "p", "a"))
    placement = objects.bound_placement(bound, made.cache.state.node_spec("n1"))
    assert placement.fault_domain == "team=x"
    # Without the annotation (bound before gpufrac wrote it), a share is its namespace's.
    del bound["metadata"]["annotations"][keys.FAULT_DOMAIN_ANNOTATION]
    assert objects.bound_placement(bound, made.cache.state.node_spec("n1")).fault_domain == "a"
