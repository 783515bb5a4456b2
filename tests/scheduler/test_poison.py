"""Poison objects: a pod or node the scheduler cannot read is reported (log, metric, Warning Event) and
skipped, and never stops a relist, readiness or the scheduling of other pods. A bound pod its node can no
longer hold as written stays held against that node, and is reported."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpufrac.cluster.invariants import violations
from gpufrac.contract import keys, node_inventory
from gpufrac.scheduler import objects
from gpufrac.scheduler.loop import Scheduler

from ..kubeapi.apiobjects import GPU_MIB, bound, inventory, key, node, pod
from ..kubeapi.fakeapi import RecordingClient, until
from .schedulers import gpu_free, scheduler, share_notes

HUGE = "9" * 5000  # past Python's 4300-digit limit for int()
INVENTORY = node_inventory.GPUS_ANNOTATION


def invalid_count(made: Scheduler, kind: str, reason: str = "InvalidObject") -> float:
    sample = made.metrics.registry.get_sample_value(
        "gpufrac_scheduler_invalid_objects_total", {"kind": kind, "reason": reason}
    )
    return sample or 0.0


def edit(obj: dict[str, Any], change: Callable[[dict[str, Any]], object]) -> dict[str, Any]:
    made = copy.deepcopy(obj)
    change(made)
    return made


def share(name: str, fraction: str = "0.5") -> dict[str, Any]:
    return pod(name, annotations={"gpu-fraction": fraction})


def first_container(obj: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = obj["spec"]["containers"][0]
    return container


POISON_PODS: dict[str, Callable[[dict[str, Any]], object]] = {
    "5000-digit cpu": lambda p: first_container(p)["resources"]["requests"].update(cpu=HUGE),
    "5000-digit memory": lambda p: first_container(p)["resources"]["requests"].update(memory=HUGE + "Mi"),
    "5000-digit gpu-fraction": lambda p: p["metadata"]["annotations"].update({"gpu-fraction": "0." + HUGE}),
    "5000-digit gpu-memory": lambda p: p["metadata"]["annotations"].update({"gpu-memory": HUGE}),
    "5000-digit num-devices": lambda p: p["metadata"]["annotations"].update({keys.NUM_DEVICES: HUGE}),
    "5000-digit nvidia.com/gpu": lambda p: first_container(p)["resources"]["limits"].update(
        {keys.GPU_RESOURCE: HUGE}
    ),
    "1e64Ei nvidia.com/gpu": lambda p: first_container(p)["resources"]["limits"].update(
        {keys.GPU_RESOURCE: "1e64"}
    ),
    "garbage annotation": lambda p: p["metadata"]["annotations"].update({"gpu-fraction": "half, please"}),
    "negative cpu": lambda p: first_container(p)["resources"]["requests"].update(cpu="-1"),
    "huge memory": lambda p: first_container(p)["resources"]["requests"].update(memory="1e64Ei"),
    "containers not a list": lambda p: p["spec"].update(containers="main"),
    "container not a map": lambda p: p["spec"].update(containers=[None]),
    "annotations not strings": lambda p: p["metadata"].update(annotations={"gpu-fraction": 0.5}),
    "priority a string": lambda p: p["spec"].update(priority="high"),
    "tolerations a string": lambda p: p["spec"].update(tolerations="all"),
    "a million containers asking 1e15 CPUs each": lambda p: p["spec"].update(
        containers=[first_container(p) | {"resources": {"requests": {"cpu": "1e15"}}}] * 10_000
    ),
}


@pytest.mark.parametrize("poison", list(POISON_PODS))
async def test_a_poison_pending_pod_is_reported_and_the_others_are_scheduled(poison: str) -> None:
    client = RecordingClient()
    made = scheduler(client)
    bad = edit(share("bad"), POISON_PODS[poison])
    made.on_nodes_listed([node("n1", agent=inventory("n1", 2))])
    made.on_pods_listed([bad, share("good")])
    assert made.ready
    await made.schedule_pending()
    await made.wait_for_binds()
    assert [call.name for call in client.made("create", "Binding")] == ["good"]
    assert key("bad") not in made.cache.state.placements
    reported = invalid_count(made, "Pod") + made.metrics.attempts.labels("invalid")._value.get()
    assert reported == 1, "reported once: as unreadable at the event, or as an invalid request when tried"


@pytest.mark.parametrize("poison", list(POISON_PODS))
def test_a_poison_bound_pod_holds_its_node_and_is_reported(poison: str) -> None:
    made = scheduler()
    bad = bound(edit(share("bad"), POISON_PODS[poison]), "n1", share_notes("main", "GPU-n1-0", "8000Mi"))
    made.on_nodes_listed([node("n1", agent=inventory("n1", 2)), node("n2", agent=inventory("n2", 2))])
    made.on_pods_listed([bad])
    assert made.ready
    assert made.cache.misfits == {"n1": {key("bad"): bad}}
    rows, excluded = made.cache.eligible_rows(share("next"))
    assert [made.cache.state.names[row] for row in rows] == ["n2"]
    assert list(excluded.elements()) == ["1 bound pod(s) on it cannot be accounted (see its Events)"]
    assert invalid_count(made, "Pod", "NotAccounted") == 1
    assert made.metrics.registry.get_sample_value("gpufrac_scheduler_unaccounted_pods") == 1
    made.on_pod_event("DELETED", bad)
    assert made.cache.misfits == {} and open_nodes(made) == 2


def gpus_json(count: int, memory: object = GPU_MIB) -> str:
    return json.dumps(
        [
            {"index": i, "uuid": f"GPU-x-{i}", "model": "A100", "memory_mib": memory, "healthy": True}
            for i in range(count)
        ]
    )


POISON_NODES: dict[str, Callable[[dict[str, Any]], object]] = {
    "5000-digit allocatable cpu": lambda n: n["status"]["allocatable"].update(cpu=HUGE),
    "negative allocatable memory": lambda n: n["status"]["allocatable"].update(memory="-64Gi"),
    "1e64Ei allocatable memory": lambda n: n["status"]["allocatable"].update(memory="1e64Ei"),
    "conditions a string": lambda n: n["status"].update(conditions="Ready"),
    "taints a map": lambda n: n["spec"].update(taints={"key": "x"}),
    "labels not strings": lambda n: n["metadata"].update(labels={"a": 1}),
    "no name": lambda n: n["metadata"].pop("name"),
}
# The agent's inventory annotation unreadable: the node falls back to the GPU labels, and says so.
POISON_INVENTORIES = {
    "not JSON": "[{index: 0",
    "a 5000-digit number": gpus_json(1, memory=int(HUGE[:4000])).replace(HUGE[:4000], HUGE),
    "deeply nested": "[" * 100_000 + "]" * 100_000,
    "100,000 GPUs": gpus_json(100_000),
    "negative memory": gpus_json(2, memory=-1),
    "memory past int64": gpus_json(2, memory=2**70),
    "not a list": '{"index": 0}',
}


@pytest.mark.parametrize("poison", list(POISON_NODES))
async def test_a_poison_node_is_reported_and_skipped_and_others_still_take_pods(poison: str) -> None:
    client = RecordingClient()
    made = scheduler(client)
    bad = edit(node("bad", agent=inventory("bad", 8)), POISON_NODES[poison])
    made.on_nodes_listed([bad, node("n1", agent=inventory("n1", 1))])
    made.on_pods_listed([share("good")])
    made.on_node_event("MODIFIED", bad)  # a heartbeat of the same poison: reported once
    assert made.ready and invalid_count(made, "Node") == 1
    assert [name for row, name in enumerate(made.cache.state.names) if made.cache.state.active[row]] == ["n1"]
    await made.schedule_pending()
    await made.wait_for_binds()
    assert [call.name for call in client.made("create", "Binding")] == ["good"]
    await made.problems.send(client, component="gpufrac")
    if poison == "no name":
        assert client.made("create", "Event") == []  # nothing to attach it to: the log and metric tell
        return
    (event,) = client.made("create", "Event")
    assert event.body.reason == "InvalidObject" and event.body.type == "Warning"
    assert event.body.involvedObject.kind == "Node"


@pytest.mark.parametrize("poison", list(POISON_INVENTORIES))
def test_an_unreadable_gpu_inventory_falls_back_to_the_labels_and_is_reported(poison: str) -> None:
    made = scheduler()
    made.on_nodes_listed([node("n1", gpus=2, annotations={INVENTORY: POISON_INVENTORIES[poison]})])
    assert [gpu.uuid for gpu in made.cache.state.node_spec("n1").gpus] == ["0", "1"]
    assert invalid_count(made, "Node") == 1


@pytest.mark.parametrize("count", ["99999999", HUGE[:60], "65"])
def test_a_gpu_count_label_past_any_real_node_means_no_gpus(count: str) -> None:
    made = scheduler()
    made.on_nodes_listed([node("n1", labels={node_inventory.GPU_COUNT_LABEL: count})])
    assert made.cache.state.node_spec("n1").gpus == ()


def test_a_node_that_turns_unreadable_keeps_no_pod_and_counts_them_again_once_readable() -> None:
    made = scheduler()
    n1 = node("n1", agent=inventory("n1", 2))
    holder = bound(share("holder"), "n1", share_notes("main", "GPU-n1-0", "8000Mi"))
    made.on_nodes_listed([n1])
    made.on_pods_listed([holder])
    made.on_node_event("MODIFIED", edit(n1, POISON_NODES["5000-digit allocatable cpu"]))
    assert not made.cache.state.active[made.cache.state.index["n1"]]  # nothing is placed on it
    assert set(made.cache.unplaced["n1"]) == {key("holder")}
    made.on_node_event("MODIFIED", n1)
    assert gpu_free(made, "n1") == [GPU_MIB - 8000, GPU_MIB] and made.cache.unplaced == {}


# ---- bound pods that no longer fit their node -------------------------------------------------------------


def holding(device: str) -> tuple[Scheduler, dict[str, Any]]:
    """n1 with two GPUs, and `holder` bound to it with 8000 MiB of `device`."""
    made = scheduler()
    holder = bound(share("holder"), "n1", share_notes("main", device, "8000Mi"))
    made.on_nodes_listed([node("n1", agent=inventory("n1", 2))])
    made.on_pods_listed([holder])
    return made, holder


def open_nodes(made: Scheduler) -> int:
    return len(made.cache.eligible_rows(share("next"))[0])


def test_a_bound_pod_whose_gpu_is_gone_holds_its_node_until_it_leaves() -> None:
    made, holder = holding("GPU-n1-1")
    made.on_node_event("MODIFIED", node("n1", agent=inventory("n1", 1)))  # GPU 1 fell off the bus
    assert made.cache.misfits == {"n1": {key("holder"): holder}}
    assert open_nodes(made) == 0
    made.on_node_event("MODIFIED", node("n1", agent=inventory("n1", 2)))  # it is back
    assert made.cache.misfits == {} and gpu_free(made, "n1") == [GPU_MIB, GPU_MIB - 8000]
    assert open_nodes(made) == 1


def test_a_bound_pod_whose_gpu_uuid_changed_is_reported_and_holds_its_node() -> None:
    made, holder = holding("GPU-n1-0")
    swapped = (inventory("n9", 1)[0], inventory("n1", 2)[1])  # GPU 0 replaced: a new UUID
    made.on_node_event("MODIFIED", node("n1", agent=swapped))
    made.on_pod_event("MODIFIED", holder)  # seen again: still held, reported once
    assert set(made.cache.misfits["n1"]) == {key("holder")}
    assert invalid_count(made, "Pod", "NotAccounted") == 1
    made.on_pod_event("DELETED", holder)
    assert made.cache.misfits == {} and open_nodes(made) == 1


def test_a_node_that_shrank_under_its_pods_holds_the_pods_that_no_longer_fit() -> None:
    made = scheduler()
    big = bound(pod("big", cpu="12"), "n1", {})
    made.on_nodes_listed([node("n1", agent=inventory("n1", 2), cpu="16")])
    made.on_pods_listed([big])
    made.on_node_event("MODIFIED", node("n1", agent=inventory("n1", 2), cpu="8"))
    assert set(made.cache.misfits["n1"]) == {key("big")}
    assert open_nodes(made) == 0


def test_an_unreadable_inventory_under_bound_pods_holds_the_node() -> None:
    """The labels have no UUIDs, so pods placed by UUID cannot be found: held, never double-booked."""
    made, _ = holding("GPU-n1-0")
    made.on_node_event("MODIFIED", node("n1", annotations={INVENTORY: "not json"}))
    assert set(made.cache.misfits["n1"]) == {key("holder")}
    assert open_nodes(made) == 0


async def test_a_node_reshaped_while_a_bind_to_it_runs_holds_it_until_the_bound_pod_is_read() -> None:
    client = RecordingClient(gate=asyncio.Event())
    made = scheduler(client)
    made.on_nodes_listed([node("n1", agent=inventory("n1", 1))])
    made.on_pods_listed([share("p")])
    await made.schedule_pending()
    await until(lambda: len(client.held) == 1)  # the Binding waits at the gate
    assert key("p") in made.cache.assumed
    made.on_node_event("MODIFIED", node("n1", agent=inventory("n1", 0)))  # its GPU is gone mid-bind
    assert set(made.cache.misfits["n1"]) == {key("p")}
    client.gate.set()
    await made.wait_for_binds()
    assert set(made.cache.misfits["n1"]) == {key("p")}  # the bound version is not read yet: still held
    made.on_node_event("MODIFIED", node("n1", agent=inventory("n1", 1)))
    written = client.made("create", "Binding")[0].body.metadata.annotations
    made.on_pod_event("MODIFIED", bound(share("p"), "n1", written))
    assert made.cache.misfits == {} and gpu_free(made, "n1") == [GPU_MIB // 2]


# ---- anything at all --------------------------------------------------------------------------------------

GARBAGE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.sampled_from([2**31, -(2**63), 10**30]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.sampled_from([HUGE, "-1", "1e64Ei", "0." + HUGE, "NaN", "\uff11", "8000Mi", "GPU-n1-0", "sm-sharing"]),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2),
)
POD_PATHS = [
    ("metadata",),
    ("metadata", "uid"),
    ("metadata", "name"),
    ("metadata", "namespace"),
    ("metadata", "annotations"),
    ("metadata", "annotations", "gpu-fraction"),
    ("metadata", "annotations", "gpu-memory"),
    ("metadata", "annotations", keys.NUM_DEVICES),
    ("metadata", "annotations", keys.container_key("main", keys.DEVICES)),
    ("metadata", "annotations", keys.container_key("main", keys.MEMORY_REQUEST)),
    ("metadata", "annotations", keys.container_key("main", keys.COMPUTE_MODE)),
    ("metadata", "deletionTimestamp"),
    ("metadata", "creationTimestamp"),
    ("spec",),
    ("spec", "nodeName"),
    ("spec", "schedulerName"),
    ("spec", "priority"),
    ("spec", "containers"),
    ("spec", "containers", 0),
    ("spec", "containers", 0, "name"),
    ("spec", "containers", 0, "resources"),
    ("spec", "containers", 0, "resources", "requests", "cpu"),
    ("spec", "containers", 0, "resources", "limits", keys.GPU_RESOURCE),
    ("spec", "initContainers"),
    ("spec", "nodeSelector"),
    ("spec", "tolerations"),
    ("status",),
    ("status", "phase"),
]
NODE_PATHS = [
    ("metadata",),
    ("metadata", "name"),
    ("metadata", "labels"),
    ("metadata", "labels", node_inventory.GPU_COUNT_LABEL),
    ("metadata", "annotations", INVENTORY),
    ("spec",),
    ("spec", "unschedulable"),
    ("spec", "taints"),
    ("status",),
    ("status", "allocatable"),
    ("status", "allocatable", "cpu"),
    ("status", "conditions"),
]


def put(obj: dict[str, Any], path: tuple[str | int, ...], value: object) -> None:
    """Set `path` in `obj` to `value`, if the objects on the way are still there to hold it."""
    target: Any = obj
    for step in path[:-1]:
        try:
            target = target[step]
        except (KeyError, IndexError, TypeError):
            return
    if isinstance(target, dict) or (isinstance(target, list) and isinstance(path[-1], int) and target):
        target[path[-1]] = value


def poisoned(
    template: dict[str, Any], paths: list[tuple[str | int, ...]]
) -> st.SearchStrategy[dict[str, Any]]:
    edits = st.lists(st.tuples(st.sampled_from(paths), GARBAGE), min_size=1, max_size=4)

    def apply(changes: list[tuple[tuple[str | int, ...], object]]) -> dict[str, Any]:
        made = copy.deepcopy(template)
        for path, value in changes:
            put(made, path, value)
        return made

    return edits.map(apply)


def bad_pod(index: int) -> dict[str, Any]:
    """A pod bound to a node that is not there (or pending), to be poisoned: it never holds a good node."""
    made = pod(f"bad-{index}", annotations={"gpu-fraction": "0.25"}, priority=0)
    if index % 2:
        made = bound(made, "ghost", share_notes("main", "GPU-ghost-0", "4000Mi"))
    return made


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    pods=st.lists(st.integers(0, 9).flatmap(lambda i: poisoned(bad_pod(i), POD_PATHS)), max_size=6),
    nodes=st.lists(st.integers(0, 9).flatmap(lambda i: poisoned(node(f"bad-{i}"), NODE_PATHS)), max_size=4),
)
@example(  # found by hand: no namespace to name in the FailedScheduling Event of an invalid request
    pods=[edit(pod("x", annotations={"gpu-fraction": "2"}), lambda p: p["metadata"].pop("namespace"))],
    nodes=[],
)
def test_garbage_never_raises_and_good_pods_are_still_placed(
    pods: list[dict[str, Any]], nodes: list[dict[str, Any]]
) -> None:
    client = RecordingClient()
    made = scheduler(client)
    good_nodes = [node(f"n{i}", agent=inventory(f"n{i}", 2)) for i in range(2)]
    good_pods = [pod(f"good-{i}", annotations={"gpu-fraction": "0.5"}, priority=100) for i in range(3)]
    made.on_nodes_listed([*nodes, *good_nodes])
    made.on_pods_listed([*pods, *good_pods])
    for event in ("ADDED", "MODIFIED"):
        for item in nodes:
            made.on_node_event(event, item)
        for item in pods:
            made.on_pod_event(event, item)
    assert made.ready

    async def schedule() -> None:
        await made.schedule_pending()
        await made.wait_for_binds()
        await made.problems.send(client, component="gpufrac")

    asyncio.run(schedule())
    bindings = {call.name for call in client.made("create", "Binding")}
    assert {f"good-{i}" for i in range(3)} <= bindings
    assert violations(made.cache.state) == []
    for item in nodes:
        made.on_node_event("DELETED", item)
    for item in pods:
        made.on_pod_event("DELETED", item)
    made.on_pods_listed(good_pods)
    made.on_nodes_listed(good_nodes)
    assert objects.name_of(good_nodes[0]) in made.cache.nodes
