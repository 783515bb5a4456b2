"""Pure conversions between API objects and the engine's types."""

from __future__ import annotations

import json
from dataclasses import replace
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from gpufrac import contract
from gpufrac.cluster.model import Assignment, GpuSpec, NodeSpec, Placement
from gpufrac.cluster.state import ClusterState, PlacementRefused
from gpufrac.contract import keys, node_inventory
from gpufrac.contract.model import ComputeMode, Mebibytes, Portion, ShareRequest
from gpufrac.placement.engine import decide
from gpufrac.placement.framework import POLICIES, PolicyContext
from gpufrac.placement.workload import Workload
from gpufrac.scheduler import objects

from ..kubeapi.apiobjects import GPU_MIB, bound, container, inventory, key, node, pod

CONTEXT = PolicyContext(rng=np.random.default_rng(0), workload=Workload.from_pods([]))

TS, SM = ComputeMode.TIME_SLICING, ComputeMode.SM_SHARING
ENV_BASE = "gpufrac-env-0123456789"
PIPES = "/run/test/mps"


def nvidia(container_name: str, suffix: str) -> str:
    return keys.container_key(container_name, suffix)


# ---- nodes ------------------------------------------------------------------------------------------------


def test_node_spec_from_gpu_feature_discovery_labels_uses_indices_for_uuids() -> None:
    spec = objects.node_spec(node("n1", gpus=3, memory=24_000, product="Tesla-T4", cpu="8", mem="32Gi"))
    assert spec == NodeSpec(
        "n1",
        cpu_milli=8000,
        memory_mib=32 * 1024,
        gpus=tuple(GpuSpec(i, str(i), "Tesla-T4", 24_000) for i in range(3)),
        max_pods=110,  # the kubelet's allocatable pods
    )


def test_a_node_takes_no_more_pods_than_its_kubelet_runs() -> None:
    full = node("n1", gpus=1, memory=24_000)
    full["status"]["allocatable"]["pods"] = "2"
    state = ClusterState([objects.node_spec(full)])
    for name in ("a", "b"):
        state.apply(Placement(name, "n1", 100, 0))
    policy = POLICIES["bestfit"](CONTEXT)
    demand = objects.pod_demand(pod("p", cpu="100m"))
    outcome = decide(state, demand, policy)
    assert not isinstance(outcome, Placement) and outcome.reasons == {"too many pods": 1}
    state.release("a")
    assert isinstance(decide(state, demand, policy), Placement)
    full["status"]["allocatable"]["pods"] = "many"
    with pytest.raises(contract.ContractError, match=r"status\.allocatable\.pods"):
        objects.node_spec(full)


@pytest.mark.parametrize(
    "labels",
    [
        {},
        {node_inventory.GPU_COUNT_LABEL: "2"},  # a count without memory cannot be placed on
        {node_inventory.GPU_COUNT_LABEL: "two", node_inventory.GPU_MEMORY_LABEL: "16000"},
        {node_inventory.GPU_COUNT_LABEL: "-1", node_inventory.GPU_MEMORY_LABEL: "16000"},
    ],
)
def test_node_spec_without_usable_gpu_labels_has_no_gpus(labels: dict[str, str]) -> None:
    cpu_only = node("cpu")
    cpu_only["metadata"]["labels"] = labels
    assert objects.node_spec(cpu_only).gpus == ()


def test_node_spec_prefers_the_agent_annotation_with_uuids_and_health() -> None:
    agent = inventory("n1", 3, memory=81_920, model="NVIDIA A100-SXM4-80GB", unhealthy=[1])
    spec = objects.node_spec(node("n1", gpus=8, memory=1000, agent=agent))
    assert spec.gpus == (
        GpuSpec(0, "GPU-n1-0", "NVIDIA A100-SXM4-80GB", 81_920, healthy=True),
        GpuSpec(1, "GPU-n1-1", "NVIDIA A100-SXM4-80GB", 81_920, healthy=False),
        GpuSpec(2, "GPU-n1-2", "NVIDIA A100-SXM4-80GB", 81_920, healthy=True),
    )


def _gpu_json(index: int, **changes: Any) -> dict[str, Any]:
    return {
        "index": index,
        "uuid": f"GPU-{index}",
        "model": "A100",
        "memory_mib": 40_960,
        "healthy": True,
    } | changes


@pytest.mark.parametrize(
    "annotation",
    [
        "not json",
        '{"index": 0}',
        json.dumps([_gpu_json(0, memory_mib="40Gi")]),
        json.dumps([_gpu_json(0, healthy="yes")]),
        json.dumps([_gpu_json(1)]),  # indices must be 0..n-1, as the state requires
        json.dumps([_gpu_json(0), _gpu_json(0)]),
    ],
)
def test_a_malformed_agent_annotation_falls_back_to_the_labels(annotation: str) -> None:
    spec = objects.node_spec(
        node("n1", gpus=2, memory=16_000, annotations={node_inventory.GPUS_ANNOTATION: annotation})
    )
    assert [(gpu.index, gpu.uuid, gpu.memory_mib) for gpu in spec.gpus] == [
        (0, "0", 16_000),
        (1, "1", 16_000),
    ]


@pytest.mark.parametrize(
    ("cpu", "memory", "milli", "mib"),
    [
        ("64", "256Gi", 64_000, 262_144),
        ("500m", "512Mi", 500, 512),
        ("1.5", "1000M", 1500, 954),  # 10^9 bytes is 953.67 MiB: rounded up
        ("0.0001", "1", 1, 1),
    ],
)
def test_allocatable_quantities_become_milli_cpu_and_mib(cpu: str, memory: str, milli: int, mib: int) -> None:
    spec = objects.node_spec(node("n1", cpu=cpu, mem=memory))
    assert (spec.cpu_milli, spec.memory_mib) == (milli, mib)


def test_missing_allocatable_is_zero() -> None:
    bare = node("n1")
    del bare["status"]["allocatable"]
    assert (objects.node_spec(bare).cpu_milli, objects.node_spec(bare).memory_mib) == (0, 0)


@pytest.mark.parametrize(
    ("ready", "cordoned", "expected"),
    [(True, False, True), (True, True, False), (False, False, False), (None, False, False)],
)
def test_node_ready_needs_ready_true_and_no_cordon(
    ready: bool | None, cordoned: bool, expected: bool
) -> None:
    assert objects.node_ready(node("n1", ready=ready, cordoned=cordoned)) is expected


def test_node_ready_without_status() -> None:
    assert not objects.node_ready({"metadata": {"name": "n1"}})


def test_node_taints_keep_only_those_that_keep_pods_off() -> None:
    taints = [
        {"key": "a", "effect": "NoSchedule"},
        {"key": "b", "effect": "PreferNoSchedule"},
        {"key": "c", "value": "x", "effect": "NoExecute"},
    ]
    assert [t["key"] for t in objects.node_taints(node("n1", taints=taints))] == ["a", "c"]
    assert objects.node_taints(node("n1")) == []


# ---- pods -------------------------------------------------------------------------------------------------


def test_pod_resources_sum_the_containers() -> None:
    demo = pod(
        "p",
        containers=[container("a", cpu="250m", mem="1Gi"), container("b", cpu="1", mem="512Mi")],
    )
    assert objects.pod_resources(demo) == (1250, 1536)


def test_pod_resources_take_the_largest_init_container_when_it_is_more() -> None:
    running = [container("a", cpu="500m", mem="1Gi"), container("b", cpu="500m", mem="1Gi")]
    bigger_cpu = [container("i1", cpu="2", mem="100Mi"), container("i2", cpu="1500m", mem="1Gi")]
    # CPU from the largest init container, memory from the sum of the running ones (each resource alone).
    assert objects.pod_resources(pod("p", containers=running, init_containers=bigger_cpu)) == (2000, 2048)
    smaller = [container("i", cpu="100m", mem="4Gi")]
    assert objects.pod_resources(pod("p", containers=running, init_containers=smaller)) == (1000, 4096)


def sidecar(name: str, cpu: str, mem: str) -> dict[str, Any]:
    return {**container(name, cpu=cpu, mem=mem), "restartPolicy": "Always"}


def test_pod_resources_count_sidecars_beside_the_containers_and_before_later_init_containers() -> None:
    running = [container("a", cpu="1", mem="1Gi")]
    # A sidecar keeps running: it adds to the containers, and to every init container started after it.
    init = [sidecar("proxy", "500m", "256Mi"), container("migrate", cpu="1200m", mem="2Gi")]
    assert objects.pod_resources(pod("p", containers=running, init_containers=init)) == (1700, 2304)
    # An init container before the sidecar runs alone.
    init = [container("fetch", cpu="1200m", mem="128Mi"), sidecar("proxy", "500m", "256Mi")]
    assert objects.pod_resources(pod("p", containers=running, init_containers=init)) == (1500, 1280)


def test_pod_resources_add_the_runtime_class_overhead() -> None:
    demo = pod("p", containers=[container("a", cpu="1", mem="1Gi")])
    demo["spec"]["overhead"] = {"cpu": "250m", "memory": "120Mi"}
    assert objects.pod_resources(demo) == (1250, 1144)
    demo["spec"]["overhead"] = {"cpu": "lots"}
    with pytest.raises(contract.ContractError, match=r"spec\.overhead\.cpu"):
        objects.pod_resources(demo)


def test_pod_level_requests_stand_for_the_containers_where_set() -> None:
    demo = pod("p", containers=[container("a", cpu="1", mem="1Gi")])
    demo["spec"]["resources"] = {"requests": {"cpu": "4"}}
    assert objects.pod_resources(demo) == (4000, 1024)  # memory still the containers'
    demo["spec"]["resources"]["requests"]["memory"] = "8Gi"
    demo["spec"]["overhead"] = {"cpu": "100m"}
    assert objects.pod_resources(demo) == (4100, 8192)


def test_whole_gpus_of_a_sidecar_count_beside_the_containers() -> None:
    demo = pod("p", containers=[container("a", whole=1)])
    demo["spec"]["initContainers"] = [{**container("s", whole=1), "restartPolicy": "Always"}]
    assert objects.gpu_resource_count(demo) == 2
    demo["spec"]["initContainers"] = [container("i", whole=1)]
    assert objects.gpu_resource_count(demo) == 1


def with_requests(body: dict[str, Any], **requests: str) -> dict[str, Any]:
    body["resources"]["requests"].update(requests)
    return body


def test_pod_scalars_are_the_other_resources_kube_scheduler_weighs() -> None:
    """ephemeral-storage and hugepages in MiB, extended resources counted, added up as CPU is (a sidecar
    beside the containers, the largest init container); GPUs, gpufrac's mirror of shares and native
    kubernetes.io names are weighed otherwise or not at all."""
    main = with_requests(
        container("a"),
        **{
            "ephemeral-storage": "1Gi",
            "hugepages-2Mi": "64Mi",
            "example.com/fpga": "1",
            "nvidia.com/gpu": "1",
        },
    )
    others = {"gpufrac.io/gpu-memory": "8Gi", "kubernetes.io/thing": "3", "ephemeral-storage": "512Mi"}
    proxy = with_requests(sidecar("proxy", "100m", "64Mi"), **others)
    fetch = with_requests(container("fetch"), **{"example.com/fpga": "2"})
    demo = pod("p", containers=[main], init_containers=[proxy, fetch])
    assert objects.pod_scalars(demo) == (
        ("ephemeral-storage", 1536),
        ("example.com/fpga", 2),
        ("hugepages-2Mi", 64),
    )
    assert objects.pod_demand(demo).scalars == objects.pod_scalars(demo)
    assert objects.pod_scalars(pod("p")) == ()
    bad = pod("p", containers=[with_requests(container("a"), **{"example.com/fpga": "many"})])
    with pytest.raises(contract.ContractError, match=r"requests\.example\.com/fpga"):
        objects.pod_demand(bad)


def test_node_spec_reads_the_other_resources_it_offers_and_a_bound_pod_holds_them() -> None:
    offering = node("n1", gpus=1)
    offering["status"]["allocatable"].update(
        {
            "ephemeral-storage": "100Gi",
            "example.com/fpga": "2",
            "example.com/none": "0",
            "nvidia.com/gpu": "1",
        }
    )
    spec = objects.node_spec(offering)
    assert spec.scalars == (("ephemeral-storage", 102_400), ("example.com/fpga", 2))
    offering["status"]["allocatable"]["ephemeral-storage"] = "47092596736"  # 44911.3 MiB: rounded down
    assert dict(objects.node_spec(offering).scalars)["ephemeral-storage"] == 44_911
    state = ClusterState([spec])
    assert state.node_spec("n1") == spec
    asking = pod("p", containers=[with_requests(container("a"), **{"example.com/fpga": "2"})])
    held = objects.bound_placement(bound(asking, "n1", {}), spec)
    assert held.scalars == (("example.com/fpga", 2),)
    state.restore(held)
    outcome = decide(state, objects.pod_demand(asking), POLICIES["bestfit"](CONTEXT))
    assert not isinstance(outcome, Placement) and outcome.reasons == {"not enough example.com/fpga": 1}
    state.release(held.pod)
    outcome = decide(state, objects.pod_demand(asking), POLICIES["bestfit"](CONTEXT))
    assert isinstance(outcome, Placement) and outcome.scalars == held.scalars
    # Its device plugin restarting, the node offers none for a while: the pod there is still counted.
    state.remove_node("n1")
    state.add_node(replace(spec, scalars=()))
    state.restore(held)
    with pytest.raises(PlacementRefused, match=r"not enough example\.com/fpga"):
        state.apply(replace(held, pod="other"))


def test_pod_resources_without_requests_are_zero() -> None:
    assert objects.pod_resources(pod("p", containers=[container("a", cpu=None)])) == (0, 0)


def test_pod_demand_from_kai_annotations() -> None:
    demand = objects.pod_demand(
        pod(
            "p",
            annotations={
                "gpu-fraction": "0.25",
                "gpu-fraction.limit": "0.5",
                "gpu-fraction-num-devices": "2",
            },
            cpu="2",
            priority=100,
        )
    )
    assert demand.name == key("p")
    assert (demand.cpu_milli, demand.priority, demand.whole_gpus) == (2000, 100, 0)
    assert demand.shares == (
        ShareRequest("main", Portion(Fraction(1, 4)), Portion(Fraction(1, 2)), TS, num_devices=2),
    )


def test_pod_demand_from_kai_memory() -> None:
    demand = objects.pod_demand(pod("p", annotations={"gpu-memory": "20480", "gpu-memory.limit": "40Gi"}))
    assert demand.shares == (ShareRequest("main", Mebibytes(20_480), Mebibytes(40_960)),)


def test_pod_demand_from_nvidia_keys_on_several_containers() -> None:
    demand = objects.pod_demand(
        pod(
            "p",
            containers=[container("a"), container("b"), container("sidecar")],
            annotations={
                nvidia("a", "gpu-memory.request"): "8Gi",
                nvidia("a", "gpu-memory.limit"): "12Gi",
                nvidia("a", "gpu-compute.mode"): "sm-sharing",
                nvidia("b", "gpu-memory.limit"): "1000M",
            },
        )
    )
    assert demand.shares == (
        ShareRequest("a", Mebibytes(8192), Mebibytes(12_288), SM),
        ShareRequest("b", Mebibytes(954), Mebibytes(954), TS),
    )
    assert demand.cpu_milli == 300


def test_pod_demand_for_whole_gpus() -> None:
    demand = objects.pod_demand(pod("p", whole=2, cpu="1"))
    assert (demand.whole_gpus, demand.whole, demand.shares) == (2, (contract.WholeGpuRequest("main", 2),), ())
    assert demand.priority == 0


def test_pod_demand_of_a_cpu_only_pod_wants_no_gpu() -> None:
    assert not objects.pod_demand(pod("p")).wants_gpu


@pytest.mark.parametrize(
    ("annotations", "bad_key"),
    [
        ({"gpu-fraction": "1.5"}, "gpu-fraction"),
        ({"gpu-fraction": "0.5", "gpu-memory": "1Gi"}, "gpu-memory"),
        ({nvidia("main", "gpu-compute.mode"): " "}, nvidia("main", "gpu-compute.mode")),
        ({nvidia("ghost", "gpu-memory.request"): "1Gi"}, nvidia("ghost", "gpu-memory.request")),
    ],
)
def test_pod_demand_of_an_invalid_pod_raises_contract_error(
    annotations: dict[str, str], bad_key: str
) -> None:
    with pytest.raises(contract.ContractError) as raised:
        objects.pod_demand(pod("p", annotations=annotations))
    assert raised.value.key == bad_key


def test_pod_identity_helpers() -> None:
    finished = pod("p", node_name="n1", phase="Succeeded")
    assert objects.is_done(finished) and objects.is_done(pod("p", phase="Failed"))
    deleting = pod("p")
    deleting["metadata"]["deletionTimestamp"] = "2024-05-01T12:00:00Z"
    assert objects.terminating(deleting) and not objects.is_done(deleting) and not objects.is_done(pod("p"))
    assert objects.node_name(finished) == "n1" and objects.node_name(pod("p")) == ""
    assert objects.scheduler_name(pod("p", scheduler=None)) == objects.DEFAULT_SCHEDULER


# ---- bound pods and bind plans ----------------------------------------------------------------------------


def _node_spec(*, uuids: bool, count: int = 4, memory: int = GPU_MIB) -> NodeSpec:
    agent = inventory("n1", count, memory=memory) if uuids else None
    return objects.node_spec(node("n1", gpus=count, memory=memory, cpu="8", mem="32Gi", agent=agent))


def _round_trip(pending: dict[str, Any], placement: Placement, spec: NodeSpec) -> Placement:
    plan = objects.bind_plan(
        pending, placement, spec, mps_pipe_directory=PIPES, env_delivery=contract.EnvDelivery.CONFIGMAP
    )
    return objects.bound_placement(bound(pending, spec.name, plan.annotations), spec)


@pytest.mark.parametrize("uuids", [True, False], ids=["uuids", "indices"])
def test_bound_placement_reads_back_what_bind_wrote(uuids: bool) -> None:
    spec = _node_spec(uuids=uuids)
    pending = pod(
        "p",
        containers=[container("a", cpu="1", mem="1Gi"), container("b", cpu="500m"), container("c")],
        annotations={
            "gpu-fraction": "0.5",
            "gpu-fraction.limit": "0.75",
            "gpu-fraction-num-devices": "2",
            "gpu-fraction-container-name": "a",
            nvidia("b", "gpu-memory.request"): "2Gi",
            nvidia("b", "gpu-compute.mode"): "sm-sharing",
        },
    )
    placement = Placement(
        key("p"),
        "n1",
        cpu_milli=1600,
        memory_mib=1024,
        assignments=(
            Assignment("a", (0, 2), 8000, 12_000, TS),
            Assignment("b", (3,), 2048, 2048, SM),
        ),
    )
    assert _round_trip(pending, placement, spec) == placement


@pytest.mark.parametrize("uuids", [True, False], ids=["uuids", "indices"])
def test_bound_placement_reads_back_whole_gpus(uuids: bool) -> None:
    spec = _node_spec(uuids=uuids)
    pending = pod("p", whole=2, cpu="2")
    placement = Placement(
        key("p"), "n1", cpu_milli=2000, assignments=(Assignment("main", (1, 3), GPU_MIB, GPU_MIB, None),)
    )
    assert _round_trip(pending, placement, spec) == placement


def test_whole_gpus_of_several_containers_are_placed_written_and_read_back_per_container() -> None:
    """Each container gets its own devices, from the engine's decision to the annotations and back."""
    spec = _node_spec(uuids=True)
    pending = pod("p", containers=[container("a", whole=1), container("b", whole=2)])
    placement = decide(ClusterState([spec]), objects.pod_demand(pending), POLICIES["bestfit"](CONTEXT))
    assert isinstance(placement, Placement)
    assert placement.assignments == (
        Assignment("a", (0,), GPU_MIB, GPU_MIB, None),
        Assignment("b", (1, 2), GPU_MIB, GPU_MIB, None),
    )
    plan = objects.bind_plan(
        pending, placement, spec, mps_pipe_directory=PIPES, env_delivery=contract.EnvDelivery.CONFIGMAP
    )
    assert plan.annotations == {
        nvidia("a", "gpus.devices"): "GPU-n1-0",
        nvidia("b", "gpus.devices"): "GPU-n1-1,GPU-n1-2",
        keys.BOUND_UID_ANNOTATION: "uid-p",
    }
    read = objects.bound_placement(bound(pending, "n1", plan.annotations), spec)
    assert read.assignments == placement.assignments


def test_bound_placement_of_a_pod_gpufrac_did_not_place_holds_cpu_and_memory_only() -> None:
    foreign = pod("p", scheduler=None, node_name="n1", containers=[container("a", cpu="2", mem="1Gi")])
    assert objects.bound_placement(foreign, _node_spec(uuids=True)) == Placement(key("p"), "n1", 2000, 1024)


@pytest.mark.parametrize("device", ["GPU-other-0", "7"])
def test_bound_placement_rejects_devices_the_node_does_not_have(device: str) -> None:
    annotations = {
        "gpu-fraction": "0.5",
        nvidia("main", "gpu-memory.request"): "8000Mi",
        nvidia("main", "gpu-memory.limit"): "8000Mi",
        nvidia("main", "gpus.devices"): device,
    }
    stray = pod("p", node_name="n1", annotations=annotations)
    with pytest.raises(contract.ContractError) as raised:
        objects.bound_placement(stray, _node_spec(uuids=True))
    assert raised.value.key == nvidia("main", "gpus.devices")
    assert device in str(raised.value)


def test_bind_plan_gives_each_gpu_container_its_own_env_configmap() -> None:
    spec = _node_spec(uuids=True)
    pending = pod(
        "p",
        containers=[container("a"), container("b"), container("plain")],
        annotations={
            keys.ENV_CONFIGMAP_ANNOTATION: ENV_BASE,
            nvidia("a", "gpu-memory.request"): "4Gi",
            nvidia("a", "gpu-memory.limit"): "6Gi",
            nvidia("a", "gpu-compute.mode"): "sm-sharing",
            nvidia("b", "gpu-memory.request"): "2Gi",
        },
    )
    placement = Placement(
        key("p"),
        "n1",
        assignments=(Assignment("a", (0, 1), 4096, 6144, SM), Assignment("b", (2,), 2048, 2048, TS)),
        fault_domain="team",
    )
    plan = objects.bind_plan(
        pending, placement, spec, mps_pipe_directory=PIPES, env_delivery=contract.EnvDelivery.CONFIGMAP
    )
    assert plan.configmaps == {
        keys.env_configmap_name(ENV_BASE, "a"): {
            keys.ENV_VISIBLE_DEVICES: "GPU-n1-0,GPU-n1-1",
            keys.ENV_MEMORY_REQUEST: "4096",
            keys.ENV_MEMORY_LIMIT: "6144",
            keys.ENV_MPS_PIPE_DIRECTORY: PIPES,
            keys.ENV_MPS_MEMORY_LIMIT: "0=6144M,1=6144M",
        },
        keys.env_configmap_name(ENV_BASE, "b"): {
            keys.ENV_VISIBLE_DEVICES: "GPU-n1-2",
            keys.ENV_MEMORY_REQUEST: "2048",
            keys.ENV_MEMORY_LIMIT: "2048",
        },
    }
    assert plan.annotations == {
        nvidia("a", "gpu-memory.request"): "4096Mi",
        nvidia("a", "gpu-memory.limit"): "6144Mi",
        nvidia("a", "gpu-compute.mode"): "sm-sharing",
        nvidia("a", "gpus.devices"): "GPU-n1-0,GPU-n1-1",
        nvidia("b", "gpu-memory.request"): "2048Mi",
        nvidia("b", "gpu-memory.limit"): "2048Mi",
        nvidia("b", "gpu-compute.mode"): "time-slicing",
        nvidia("b", "gpus.devices"): "GPU-n1-2",
        keys.BOUND_UID_ANNOTATION: pending["metadata"]["uid"],
        keys.FAULT_DOMAIN_ANNOTATION: "team",  # with an sm-sharing share: whose MPS server it joins
    }


def test_bind_plan_writes_a_share_s_compute_cap_and_gives_mps_its_thread_percentage() -> None:
    cap = keys.container_key("a", keys.COMPUTE_PERCENTAGE)
    pending = pod(
        "p",
        containers=[container("a")],
        annotations={
            keys.ENV_CONFIGMAP_ANNOTATION: ENV_BASE,
            nvidia("a", "gpu-memory.request"): "4Gi",
            nvidia("a", "gpu-compute.mode"): "sm-sharing",
            cap: "30",
        },
    )
    spec = _node_spec(uuids=True)
    outcome = decide(ClusterState([spec]), objects.pod_demand(pending), POLICIES["bestfit"](CONTEXT))
    assert isinstance(outcome, Placement)
    plan = objects.bind_plan(
        pending, outcome, spec, mps_pipe_directory=PIPES, env_delivery=contract.EnvDelivery.CONFIGMAP
    )
    assert plan.annotations[cap] == "30"
    assert plan.configmaps[keys.env_configmap_name(ENV_BASE, "a")][keys.ENV_MPS_THREAD_PERCENTAGE] == "30"
    assert _round_trip(pending, outcome, spec).assignments[0].compute_percent == 30


@pytest.mark.parametrize(
    ("value", "guaranteed"), [("true", True), ("false", False), ("True", False), (None, False)]
)
def test_node_spec_reads_the_compute_guarantee_label(value: str | None, guaranteed: bool) -> None:
    labels = {} if value is None else {node_inventory.COMPUTE_GUARANTEE_LABEL: value}
    assert objects.node_spec(node("n1", labels=labels)).compute_guarantee is guaranteed


def test_a_foreign_pod_with_a_devices_key_under_gpufrac_s_family_holds_no_gpu() -> None:
    foreign = bound(pod("p", annotations={"gpufrac.io/container.main.gpus.devices": "GPU-n1-0"}), "n1", {})
    assert objects.bound_placement(foreign, _node_spec(uuids=True)).assignments == ()


def test_bind_plan_env_configmap_of_a_whole_gpu_container() -> None:
    pending = pod("p", whole=1, annotations={keys.ENV_CONFIGMAP_ANNOTATION: ENV_BASE})
    placement = Placement(key("p"), "n1", assignments=(Assignment("main", (3,), GPU_MIB, GPU_MIB, None),))
    plan = objects.bind_plan(
        pending,
        placement,
        _node_spec(uuids=True),
        mps_pipe_directory=PIPES,
        env_delivery=contract.EnvDelivery.CONFIGMAP,
    )
    assert plan.configmaps == {f"{ENV_BASE}-main": {keys.ENV_VISIBLE_DEVICES: "GPU-n1-3"}}


@pytest.mark.parametrize(
    ("annotated", "delivery"),
    [(False, contract.EnvDelivery.CONFIGMAP), (True, contract.EnvDelivery.ANNOTATIONS_ONLY)],
)
def test_bind_plan_writes_no_configmap_without_gpufrac_delivery(
    annotated: bool, delivery: contract.EnvDelivery
) -> None:
    notes = {"gpu-fraction": "0.5"} | ({keys.ENV_CONFIGMAP_ANNOTATION: ENV_BASE} if annotated else {})
    placement = Placement(key("p"), "n1", assignments=(Assignment("main", (0,), 8000, 8000, TS),))
    plan = objects.bind_plan(
        pod("p", annotations=notes),
        placement,
        _node_spec(uuids=True),
        mps_pipe_directory=PIPES,
        env_delivery=delivery,
    )
    assert plan.configmaps == {}
    assert plan.annotations[nvidia("main", "gpus.devices")] == "GPU-n1-0"


def test_bind_plan_of_a_cpu_only_placement_writes_nothing() -> None:
    plan = objects.bind_plan(
        pod("p", annotations={keys.ENV_CONFIGMAP_ANNOTATION: ENV_BASE}),
        Placement(key("p"), "n1", cpu_milli=100),
        _node_spec(uuids=True),
        mps_pipe_directory=PIPES,
        env_delivery=contract.EnvDelivery.CONFIGMAP,
    )
    assert plan == objects.BindPlan({}, {})


def test_portions_are_of_the_memory_a_process_can_allocate_where_the_agent_published_it() -> None:
    published = (replace(inventory("n1", 1)[0], memory_mib=81920, allocatable_mib=80000),)
    spec = objects.node_spec(node("n1", agent=published))
    assert [gpu.memory_mib for gpu in spec.gpus] == [80000]
    state = ClusterState()
    state.add_node(spec)
    half = pod("p", annotations={"gpu-fraction": "0.5"})
    placed = decide(state, objects.pod_demand(half), POLICIES["binpack"](CONTEXT), rows=np.array([0]))
    assert isinstance(placed, Placement)
    # Half of what can be allocated, not half of the total: two halves fit in practice.
    assert [a.request_mib for a in placed.assignments] == [40000]


# ---- movable pods -----------------------------------------------------------------------------------------

OWNER = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u", "controller": True}


def movable(**meta: Any) -> dict[str, Any]:
    body = pod("p", annotations={keys.MOVABLE_ANNOTATION: "true"})
    body["metadata"] |= {"ownerReferences": [OWNER], "creationTimestamp": "2026-01-01T00:00:00Z"} | meta
    return body


def test_a_movable_pod_counts_from_its_start_else_its_creation() -> None:
    assert objects.movable_since(movable()) == 1767225600.0
    started = movable()
    started["status"] = {"phase": "Running", "startTime": "2026-01-01T00:10:00Z"}
    assert objects.movable_since(started) == 1767226200.0


@pytest.mark.parametrize(
    "change",
    [
        {"annotations": {keys.MOVABLE_ANNOTATION: "yes"}},  # only "true" consents
        {"annotations": {}},
        {"ownerReferences": []},  # a bare pod: nothing would recreate it
        {"ownerReferences": [OWNER | {"controller": False}]},
        {"ownerReferences": [OWNER | {"controller": "true"}]},
        {"ownerReferences": "rs"},  # hostile shapes read as no owner, never raise
        {"ownerReferences": [7, None]},
        {"ownerReferences": {"controller": True}},
        {"deletionTimestamp": "2026-01-01T00:00:01Z"},  # already going
        {"creationTimestamp": "yesterday"},
        {"creationTimestamp": 5},
    ],
)
def test_pods_that_may_not_be_moved(change: dict[str, Any]) -> None:
    assert objects.movable_since(movable(**change)) is None


@pytest.mark.parametrize(
    "odd",
    [
        {"metadata": {"annotations": {"a": 1}}},
        {"metadata": {"annotations": {1: "a"}}},
        {"spec": {"containers": {"name": "app"}}},
        {"spec": {"containers": [None]}},
        {"spec": {"priority": True}},
        {"spec": {"priority": "1"}},
        {"status": []},
    ],
)
def test_the_quick_shape_walk_and_the_naming_one_agree(odd: dict[str, Any]) -> None:
    """`check` walks an object once without naming fields, and again to name the first wrong one: both
    walks must judge alike, or a malformed pod would pass (or a sound one be refused)."""
    body = pod("p")
    for part, fields in odd.items():
        body[part] = {**body[part], **fields} if isinstance(fields, dict) else fields
    with pytest.raises(contract.ContractError):
        objects.check_pod(body)
    objects.check_pod(pod("p"))


def test_host_ports_clash_on_the_same_protocol_port_and_address_or_on_every_address() -> None:
    any_tcp = {("0.0.0.0", "TCP", 8080)}
    assert objects.ports_clash(any_tcp, {("10.0.0.5", "TCP", 8080)})
    assert objects.ports_clash({("10.0.0.5", "TCP", 8080)}, {("10.0.0.5", "TCP", 8080)})
    assert not objects.ports_clash({("10.0.0.5", "TCP", 8080)}, {("10.0.0.6", "TCP", 8080)})
    assert not objects.ports_clash(any_tcp, {("0.0.0.0", "UDP", 8080)})
    assert not objects.ports_clash(any_tcp, {("0.0.0.0", "TCP", 8081)})
    sidecar = pod("p")
    sidecar["spec"]["initContainers"] = [
        {"name": "proxy", "restartPolicy": "Always", "ports": [{"containerPort": 15001, "hostPort": 15001}]},
        {"name": "init", "ports": [{"containerPort": 9, "hostPort": 9}]},  # gone before the pod runs
    ]
    assert objects.host_ports(sidecar) == {("0.0.0.0", "TCP", 15001)}
