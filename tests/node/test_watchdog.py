"""The watchdog's decisions: from GPU processes and pod contracts to usage, breaches and rogue processes."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufrac import contract
from gpufrac.contract import ComputeMode, PodPlacement, SharePlacement, WholeGpuPlacement
from gpufrac.node import watchdog
from gpufrac.node.nvidia_resources import ANY_GPU
from gpufrac.node.nvml import MIB
from gpufrac.node.watchdog import Gpu, Kind, Process
from gpufrac.testing.fakehost import container_id

GPU0 = Gpu(0, "GPU-0")
GPU1 = Gpu(1, "GPU-1")


def bound_pod(
    name: str,
    placement: PodPlacement | None,
    containers: dict[str, int],
    *,
    whole: dict[str, int] | None = None,
    annotations: dict[str, str] | None = None,
    deleting: bool = False,
) -> dict[str, Any]:
    """A pod bound to the node, running `containers` (name -> number for its container ID)."""
    specs = []
    for container in containers:
        count = (whole or {}).get(container)
        resources = {"limits": {"nvidia.com/gpu": str(count)}} if count else {}
        specs.append({"name": container, "image": "busybox", "resources": resources})
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": "ns",
        "uid": f"uid-{name}",
        "annotations": {
            **(contract.render_annotations(placement) if placement else {}),
            **(annotations or {}),
        },
    }
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    statuses = [{"name": c, "containerID": f"containerd://{container_id(n)}"} for c, n in containers.items()]
    return {"metadata": metadata, "spec": {"containers": specs}, "status": {"containerStatuses": statuses}}


def share(container: str, *devices: str, request: int = 1024, limit: int = 2048) -> PodPlacement:
    return PodPlacement((SharePlacement(container, devices, request, limit, ComputeMode.TIME_SLICING),))


def proc(pid: int, gpu: Gpu, used_mib: int | None, container: int | None) -> Process:
    used = None if used_mib is None else used_mib * MIB
    return Process(pid, 1000 + pid, gpu, used, None if container is None else container_id(container))


def test_containers_on_node_reads_contracts_and_statuses() -> None:
    sm = PodPlacement((SharePlacement("app", ("GPU-0",), 512, 1024, ComputeMode.SM_SHARING),))
    pods = [
        bound_pod("a", sm, {"app": 1, "sidecar": 2}),
        bound_pod(
            "w",
            PodPlacement(whole=(WholeGpuPlacement("train", ("GPU-1",)),)),
            {"train": 3},
            whole={"train": 1},
        ),
        bound_pod("plain", None, {"web": 4}, deleting=True),
        {"metadata": {"name": "pending", "namespace": "ns", "uid": "u"}, "spec": {"containers": []}},
    ]
    found = watchdog.containers_on_node(pods)
    app = found[container_id(1)]
    assert (app.name, app.devices, app.request_mib, app.limit_mib, app.sm_sharing) == (
        "app",
        ("GPU-0",),
        512,
        1024,
        True,
    )
    assert found[container_id(2)].devices == ()
    train = found[container_id(3)]
    assert (train.devices, train.limit_mib) == (("GPU-1",), None)
    assert found[container_id(4)].pod.deleting
    assert len(found) == 4


def test_a_broken_contract_is_a_problem_not_a_crash() -> None:
    pod = bound_pod("x", None, {"app": 1}, annotations={"nvidia.com/container.app.gpus.devices": "GPU-0"})
    (container,) = watchdog.containers_on_node([pod]).values()
    assert container.devices == () and "contract is broken" in container.problem
    (finding,) = watchdog.assess([proc(1, GPU0, 10, 1)], {container_id(1): container}).findings
    assert finding.kind is Kind.NO_CONTRACT and "contract is broken" in finding.detail


def test_a_contract_granted_to_another_pod_is_no_grant() -> None:
    """A pod bound by its same-name predecessor's Binding carries a contract meant for that UID."""
    pod = bound_pod(
        "x", share("app", "GPU-0"), {"app": 1}, annotations={contract.keys.BOUND_UID_ANNOTATION: "uid-before"}
    )
    (container,) = watchdog.containers_on_node([pod]).values()
    assert container.devices == () and "granted to another pod (UID uid-before)" in container.problem
    (finding,) = watchdog.assess([proc(1, GPU0, 10, 1)], {container_id(1): container}).findings
    assert finding.kind is Kind.NO_CONTRACT
    own = bound_pod(
        "x", share("app", "GPU-0"), {"app": 1}, annotations={contract.keys.BOUND_UID_ANNOTATION: "uid-x"}
    )
    assert watchdog.containers_on_node([own])[container_id(1)].devices == ("GPU-0",)


def test_usage_within_limit_is_no_finding() -> None:
    containers = watchdog.containers_on_node([bound_pod("a", share("app", "GPU-0"), {"app": 1})])
    result = watchdog.assess([proc(1, GPU0, 1500, 1), proc(2, GPU0, 548, 1)], containers)
    assert result.findings == ()
    (usage,) = result.usages
    assert (usage.container.name, usage.gpu, usage.used_bytes) == ("app", GPU0, 2048 * MIB)


def test_a_share_s_sm_use_is_summed_over_its_processes_against_its_cap_and_is_no_finding() -> None:
    capped = PodPlacement((SharePlacement("app", ("GPU-0",), 1024, 2048, ComputeMode.SM_SHARING, 30),))
    containers = watchdog.containers_on_node([bound_pod("a", capped, {"app": 1})])
    processes = [
        Process(1, 1001, GPU0, MIB, container_id(1), sm_percent=25),
        Process(2, 1002, GPU0, MIB, container_id(1), sm_percent=20),
        Process(3, 1003, GPU0, MIB, container_id(1)),  # no NVML sample this interval
    ]
    result = watchdog.assess(processes, containers)
    assert result.findings == ()  # 45% against a cap of 30%: MPS holds the cap, the agent only reports
    (usage,) = result.usages
    assert (usage.sm_percent, usage.container.compute_percent) == (45, 30)


def test_a_share_without_a_cap_or_samples_uses_no_sm_and_has_no_cap() -> None:
    containers = watchdog.containers_on_node([bound_pod("a", share("app", "GPU-0"), {"app": 1})])
    (usage,) = watchdog.assess([proc(1, GPU0, 10, 1)], containers).usages
    assert (usage.sm_percent, usage.container.compute_percent) == (0, None)


def test_processes_of_one_container_share_its_limit() -> None:
    containers = watchdog.containers_on_node([bound_pod("a", share("app", "GPU-0"), {"app": 1})])
    (finding,) = watchdog.assess([proc(1, GPU0, 1500, 1), proc(2, GPU0, 600, 1)], containers).findings
    assert finding.kind is Kind.BREACH
    assert [p.pid for p in finding.processes] == [1, 2]
    assert (finding.used_bytes, finding.limit_bytes) == (2100 * MIB, 2048 * MIB)
    assert finding.detail == (
        "container app of pod ns/a uses 2100 MiB on GPU 0 (GPU-0), over its limit of 2048 MiB"
    )


def test_a_multi_device_share_has_its_limit_on_each_gpu() -> None:
    kai = {"gpu-memory": "1024", "gpu-memory.limit": "2048", "gpu-fraction-num-devices": "2"}
    pod = bound_pod("a", share("app", "GPU-0", "1"), {"app": 1}, annotations=kai)
    containers = watchdog.containers_on_node([pod])
    result = watchdog.assess([proc(1, GPU0, 2000, 1), proc(2, GPU1, 2000, 1)], containers)
    assert result.findings == () and len(result.usages) == 2
    (finding,) = watchdog.assess([proc(1, GPU0, 100, 1), proc(2, GPU1, 3000, 1)], containers).findings
    assert finding.gpu == GPU1  # devices may name GPUs by index


def test_processes_without_a_contract() -> None:
    pods = [
        bound_pod("a", share("app", "GPU-0"), {"app": 1, "sidecar": 2}),
        bound_pod("w", PodPlacement(whole=(WholeGpuPlacement("t", ("GPU-1",)),)), {"t": 3}, whole={"t": 1}),
    ]
    containers = watchdog.containers_on_node(pods)
    processes = [
        proc(10, GPU0, 1, None),  # on the host
        proc(11, GPU0, 1, 99),  # in a container of no pod here
        proc(12, GPU0, 1, 2),  # in a container without a contract
        proc(13, GPU1, 1, 1),  # on a GPU its share is not on
        proc(14, GPU1, 70000, 3),  # whole GPU: no limit below the GPU
        proc(15, GPU0, None, 1),  # memory unknown: counts as nothing
    ]
    result = watchdog.assess(processes, containers)
    assert [(f.kind, f.processes[0].pid) for f in result.findings] == [
        (Kind.NO_CONTRACT, 10),
        (Kind.NO_CONTRACT, 11),
        (Kind.NO_CONTRACT, 12),
        (Kind.NO_CONTRACT, 13),
    ]
    details = [f.detail for f in result.findings]
    assert details[0] == "process 10 on GPU 0 (GPU-0) runs in no container"
    assert "which is in no pod on this node" in details[1]
    assert details[2].endswith(
        "runs in container sidecar of pod ns/a, which is not one of the pod's GPU containers"
    )
    assert details[3].endswith("whose contract grants GPUs GPU-0, not this one")
    assert [(u.container.name, u.used_bytes) for u in result.usages] == [("app", 0)]


def test_finding_keys_are_stable_and_name_the_processes() -> None:
    containers = watchdog.containers_on_node([bound_pod("a", share("app", "GPU-0"), {"app": 1})])
    first = watchdog.assess([proc(2, GPU0, 3000, 1), proc(1, GPU0, 1, 1)], containers).findings[0]
    again = watchdog.assess([proc(1, GPU0, 1, 1), proc(2, GPU0, 4000, 1)], containers).findings[0]
    assert first.key == again.key == f"{Kind.BREACH.value}/uid-a/app/GPU-0/1@1001,2@1002"
    restarted = Process(2, 5, GPU0, 4000 * MIB, container_id(1))
    assert watchdog.assess([restarted], containers).findings[0].key != first.key


def test_a_share_with_no_process_is_in_the_usage_at_zero() -> None:
    pods = [
        bound_pod("a", share("app", "GPU-0"), {"app": 1}),
        bound_pod("b", share("app", "1"), {"app": 2}),
        bound_pod("w", PodPlacement(whole=(WholeGpuPlacement("t", ("GPU-1",)),)), {"t": 3}, whole={"t": 1}),
    ]
    usages = watchdog.assess([], watchdog.containers_on_node(pods), gpus=[GPU0, GPU1]).usages
    assert [(u.container.pod.name, u.gpu, u.used_bytes) for u in usages] == [("a", GPU0, 0), ("b", GPU1, 0)]


def test_init_sidecar_and_ephemeral_containers_are_mapped_to_their_pod() -> None:
    pod = bound_pod("a", share("app", "GPU-0"), {"app": 1})
    pod["spec"]["initContainers"] = [
        {"name": "setup", "image": "busybox"},
        {"name": "proxy", "image": "busybox", "restartPolicy": "Always"},
    ]
    pod["status"]["initContainerStatuses"] = [
        {"name": "setup", "containerID": f"containerd://{container_id(2)}"},
        {"name": "proxy", "containerID": f"cri-o://{container_id(3)}"},
    ]
    pod["status"]["ephemeralContainerStatuses"] = [
        {"name": "debugger", "containerID": f"containerd://{container_id(4)}"},
        {"name": "waiting"},  # not started: no ID yet
    ]
    containers = watchdog.containers_on_node([pod])
    assert {c.name: c.kind for c in containers.values()} == {
        "app": "container",
        "setup": "init container",
        "proxy": "sidecar container",
        "debugger": "ephemeral container",
    }
    processes = [proc(20, GPU0, 10, 2), proc(21, GPU0, 10, 3), proc(22, GPU0, 10, 4), proc(23, GPU0, 10, 1)]
    findings = watchdog.assess(processes, containers).findings
    outside = "of pod ns/a, which is not one of the pod's GPU containers"
    assert sorted(f.detail for f in findings) == [
        f"process 20 on GPU 0 (GPU-0) runs in init container setup {outside}",
        f"process 21 on GPU 0 (GPU-0) runs in sidecar container proxy {outside}",
        f"process 22 on GPU 0 (GPU-0) runs in ephemeral container debugger {outside}",
    ]
    assert all(f.kind is Kind.NO_CONTRACT and f.container is not None for f in findings)


def test_a_poison_pod_is_a_bounded_problem_and_the_others_are_still_read() -> None:
    huge = "9" * 5000
    poison = bound_pod(
        "p",
        None,
        {"app": 1},
        annotations={
            "nvidia.com/container.app.gpu-memory.request": huge,
            "nvidia.com/container.app.gpus.devices": "GPU-0",
        },
    )
    odd = {"metadata": "not a map", "status": {"containerStatuses": ["x", {"containerID": 7}]}}
    good = bound_pod("g", share("app", "GPU-0"), {"app": 2})
    containers = watchdog.containers_on_node([poison, odd, good])
    assert containers[container_id(2)].devices == ("GPU-0",)
    broken = containers[container_id(1)]
    assert "contract is broken" in broken.problem and len(broken.problem) <= watchdog.MAX_PROBLEM + 40
    (finding,) = watchdog.assess([proc(1, GPU0, 10, 1)], containers).findings
    assert finding.kind is Kind.NO_CONTRACT and len(finding.detail) < 500


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12,
)
_pod_keys = st.sampled_from(
    [
        "metadata",
        "spec",
        "status",
        "annotations",
        "containerStatuses",
        "initContainerStatuses",
        "ephemeralContainerStatuses",
        "containerID",
        "name",
        "containers",
        "initContainers",
        "restartPolicy",
        "uid",
        "gpu-fraction",
    ]
)
_pods = st.recursive(
    _json,
    lambda inner: st.dictionaries(_pod_keys, inner, max_size=4) | st.lists(inner, max_size=3),
    max_leaves=20,
)


@settings(max_examples=300)
@given(st.lists(st.dictionaries(_pod_keys, _pods, max_size=4), max_size=3))
def test_any_pod_shape_is_read_without_raising(pods: list[dict[str, Any]]) -> None:
    containers = watchdog.containers_on_node(pods)
    watchdog.assess([proc(1, GPU0, 10, 1)], containers)


def test_a_device_plugin_grant_is_that_containers_whole_gpu_contract() -> None:
    """A container the device plugin gave a GPU to (no gpufrac annotation at all) may use all of it."""
    pods = [bound_pod("trainer", None, {"app": 1}, whole={"app": 1})]
    containers = watchdog.containers_on_node(pods, device_plugin={("ns", "trainer", "app"): ("GPU-0",)})
    assert containers[container_id(1)].plugin_devices == ("GPU-0",)
    on_its_gpu = watchdog.assess([proc(10, GPU0, 80000, 1)], containers, gpus=[GPU0, GPU1])
    assert on_its_gpu.findings == () and on_its_gpu.usages == ()
    # Only the GPU it was given: the other one is still outside its contract.
    (finding,) = watchdog.assess([proc(11, GPU1, 1, 1)], containers).findings
    assert finding.kind is Kind.NO_CONTRACT and "grants GPUs GPU-0, not this one" in finding.detail
    # Without the grant, the same process is a finding.
    (finding,) = watchdog.assess([proc(10, GPU0, 1, 1)], watchdog.containers_on_node(pods)).findings
    assert finding.kind is Kind.NO_CONTRACT


def test_device_plugin_grants_name_gpus_by_index_too() -> None:
    pods = [bound_pod("trainer", None, {"app": 1})]
    containers = watchdog.containers_on_node(pods, device_plugin={("ns", "trainer", "app"): ("1",)})
    assert watchdog.assess([proc(10, GPU1, 1, 1)], containers).findings == ()


def test_a_device_plugin_grant_merges_with_an_annotation_contract() -> None:
    """A share on GPU 0 keeps its limit there; the GPU the device plugin gave it is whole."""
    pods = [bound_pod("mixed", share("app", "GPU-0", limit=2048), {"app": 1})]
    containers = watchdog.containers_on_node(pods, device_plugin={("ns", "mixed", "app"): ("GPU-1",)})
    assessment = watchdog.assess([proc(10, GPU0, 4096, 1), proc(11, GPU1, 70000, 1)], containers)
    (breach,) = assessment.findings
    assert breach.kind is Kind.BREACH and breach.gpu == GPU0
    assert [(u.gpu, u.used_bytes) for u in assessment.usages] == [(GPU0, 4096 * MIB)]
    # Another pod's container is not covered by that grant.
    other = watchdog.containers_on_node(
        [*pods, bound_pod("other", None, {"app": 2})], device_plugin={("ns", "mixed", "app"): ("GPU-1",)}
    )
    (finding,) = watchdog.assess([proc(12, GPU1, 1, 2)], other).findings
    assert finding.kind is Kind.NO_CONTRACT


def test_a_mig_instance_holds_every_gpu_but_lifts_no_shares_limit() -> None:
    """A MIG instance's GPU is unknown to the agent (`nvidia_resources.ANY_GPU`): its container's processes
    are findings on no GPU, and a share it also holds keeps its limit."""
    pods = [bound_pod("mixed", share("app", "GPU-0", limit=2048), {"app": 1})]
    containers = watchdog.containers_on_node(pods, device_plugin={("ns", "mixed", "app"): (ANY_GPU,)})
    assessment = watchdog.assess([proc(10, GPU0, 4096, 1), proc(11, GPU1, 70000, 1)], containers)
    (breach,) = assessment.findings
    assert breach.kind is Kind.BREACH and breach.gpu == GPU0
