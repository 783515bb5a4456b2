"""One bind against a fake API server that answers as kube-apiserver v1.20.2: the atomic Binding, replies
lost after or before a write, ConfigMap conflicts, and a pod replaced under its name."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import numpy as np
import pytest

from gpufrac import contract
from gpufrac.cluster.model import GpuSpec, NodeSpec, Placement
from gpufrac.cluster.state import ClusterState
from gpufrac.contract import keys
from gpufrac.placement.engine import decide
from gpufrac.placement.framework import POLICIES, PolicyContext
from gpufrac.placement.workload import Workload
from gpufrac.scheduler import objects
from gpufrac.scheduler.binder import BindError, BoundElsewhere, PodGone, bind, unbind_misbound
from gpufrac.scheduler.objects import BindPlan

from ..kubeapi.apiobjects import GPU_MIB, pod
from ..kubeapi.fakeapi import FakeApi, api_error

ENV_BASE = "gpufrac-env-abc"
NODE = NodeSpec("n1", 16000, 65536, tuple(GpuSpec(i, f"GPU-n1-{i}", "A100", GPU_MIB) for i in range(2)))
TENANT_KEYS = {
    keys.container_key("main", keys.MEMORY_REQUEST): "4Gi",
    keys.container_key("main", keys.MEMORY_LIMIT): "6Gi",
    keys.container_key("main", keys.COMPUTE_MODE): "sm-sharing",
}


def share_pod(name: str = "p", **annotations: str) -> dict[str, Any]:
    return pod(
        name, annotations={"gpu-fraction": "0.5", keys.ENV_CONFIGMAP_ANNOTATION: ENV_BASE, **annotations}
    )


def plan_for(pending: dict[str, Any], gpu: int = 0) -> BindPlan:
    """What a bind of `pending` on GPU `gpu` of node n1 writes."""
    context = PolicyContext(rng=np.random.default_rng(0), workload=Workload.from_pods([]))
    placed = decide(ClusterState([NODE]), objects.pod_demand(pending), POLICIES["bestfit"](context))
    assert isinstance(placed, Placement)
    moved = tuple(dataclasses.replace(share, gpus=(gpu,)) for share in placed.assignments)
    return objects.bind_plan(
        pending,
        dataclasses.replace(placed, assignments=moved),
        NODE,
        mps_pipe_directory=contract.DEFAULT_MPS_PIPE_DIRECTORY,
        env_delivery=contract.EnvDelivery.CONFIGMAP,
    )


def api_with(*pods: dict[str, Any]) -> FakeApi:
    api = FakeApi()
    for item in pods:
        api.put(item)
    return api


def steps(api: FakeApi) -> list[str]:
    return [f"{call.verb} {call.kind}" for call in api.calls]


def stored_pod(api: FakeApi, name: str = "p") -> dict[str, Any]:
    found = api.stored("Pod", name)
    assert found is not None
    return found


def configmap_name() -> str:
    return keys.env_configmap_name(ENV_BASE, "main")


# ---- the atomic Binding -----------------------------------------------------------------------------------


async def test_one_binding_binds_the_pod_with_its_contract_and_the_uid_it_is_granted_to() -> None:
    pending = share_pod()
    api, plan = api_with(pending), plan_for(pending)
    await bind(api, pending, "n1", plan)
    assert steps(api) == ["create ConfigMap", "create Binding"]
    bound = stored_pod(api)
    assert bound["spec"]["nodeName"] == "n1"
    assert plan.annotations.items() <= bound["metadata"]["annotations"].items()
    assert bound["metadata"]["annotations"][keys.BOUND_UID_ANNOTATION] == "uid-p"
    assert objects.holds_binding(bound, uid="uid-p", node="n1", plan=plan) and not objects.misbound(bound)


async def test_a_refused_binding_writes_nothing_on_the_pod_and_keeps_the_tenants_own_keys() -> None:
    pending = share_pod(**TENANT_KEYS)
    del pending["metadata"]["annotations"]["gpu-fraction"]
    before = copy.deepcopy(pending)
    api, plan = api_with(pending), plan_for(pending)
    api.fail["create Binding"] = api_error(403, "Forbidden")
    with pytest.raises(BindError, match="Binding refused: 403") as raised:
        await bind(api, pending, "n1", plan)
    assert type(raised.value) is BindError  # may be retried
    assert stored_pod(api) == before  # no annotation removed, none added
    assert steps(api) == ["create ConfigMap", "create Binding"]
    # The retry binds it with its GPU: the tenant's request is still there to be read.
    api.fail.clear()
    retry = plan_for(stored_pod(api))
    assert retry.annotations[keys.container_key("main", keys.MEMORY_REQUEST)] == "4096Mi"
    await bind(api, stored_pod(api), "n1", retry)
    annotations = stored_pod(api)["metadata"]["annotations"]
    assert annotations[keys.container_key("main", keys.DEVICES)] == "GPU-n1-0"
    assert annotations[keys.container_key("main", keys.MEMORY_LIMIT)] == "6144Mi"
    assert annotations[keys.container_key("main", keys.COMPUTE_MODE)] == "sm-sharing"


# ---- lost replies -----------------------------------------------------------------------------------------


async def test_a_binding_applied_whose_reply_is_lost_is_read_back_as_bound() -> None:
    pending = share_pod()
    api, plan = api_with(pending), plan_for(pending)
    api.lose.append(("create Binding", "reply"))
    await bind(api, pending, "n1", plan)
    assert steps(api) == ["create ConfigMap", "create Binding", "get Pod"]
    assert stored_pod(api)["spec"]["nodeName"] == "n1"


async def test_a_binding_lost_before_it_arrived_is_read_back_as_unbound_and_sent_again() -> None:
    pending = share_pod()
    api, plan = api_with(pending), plan_for(pending)
    api.lose.append(("create Binding", "request"))
    await bind(api, pending, "n1", plan)
    assert steps(api) == ["create ConfigMap", "create Binding", "get Pod", "create Binding"]
    assert stored_pod(api)["spec"]["nodeName"] == "n1"


async def test_a_late_first_binding_makes_the_second_conflict_and_is_read_back_as_ours() -> None:
    """The first Binding's reply is lost, and the read-back is answered before it lands: the second meets
    409 Conflict (already assigned) and the next read-back finds the pod bound as ours."""
    pending = share_pod()
    api, plan = api_with(pending), plan_for(pending)
    api.lose.append(("create Binding", "request"))

    async def first_lands() -> None:
        stored = stored_pod(api)
        stored["spec"]["nodeName"] = "n1"
        stored["metadata"]["annotations"].update(plan.annotations)

    async def after_the_first_read_back() -> None:
        api.before["create Binding"] = first_lands

    api.before["get Pod"] = after_the_first_read_back
    await bind(api, pending, "n1", plan)
    assert steps(api) == ["create ConfigMap", "create Binding", "get Pod", "create Binding", "get Pod"]
    assert stored_pod(api)["spec"]["nodeName"] == "n1"


async def test_a_binding_that_fails_with_5xx_each_time_gives_up_with_the_pod_unbound_and_untouched() -> None:
    pending = share_pod()
    api, plan = api_with(pending), plan_for(pending)
    api.fail["create Binding"] = api_error(500, "InternalError")
    with pytest.raises(BindError, match="3 times") as raised:
        await bind(api, pending, "n1", plan)
    assert type(raised.value) is BindError
    assert steps(api) == ["create ConfigMap"] + ["create Binding", "get Pod"] * 3
    assert stored_pod(api) == pending
    assert api.stored("ConfigMap", configmap_name()) is not None  # the pod's own: a late Binding needs it


async def test_a_pod_bound_by_another_bind_is_reported_with_the_pod_read_back() -> None:
    pending = share_pod()
    api, plan = api_with(pending), plan_for(pending)
    other = plan_for(pending, gpu=1)
    stored = stored_pod(api)
    stored["spec"]["nodeName"] = "n1"
    stored["metadata"]["annotations"].update(other.annotations)
    with pytest.raises(BoundElsewhere) as raised:
        await bind(api, pending, "n1", plan)
    assert raised.value.pod["metadata"]["annotations"][keys.container_key("main", keys.DEVICES)] == "GPU-n1-1"


async def test_a_pod_deleted_before_its_binding_is_gone() -> None:
    pending = share_pod()
    api = FakeApi()
    with pytest.raises(PodGone):
        await bind(api, pending, "n1", plan_for(pending))
    assert steps(api) == ["create ConfigMap", "create Binding", "get Pod"]


@pytest.mark.parametrize(
    "answer",
    [api_error(503, "ServiceUnavailable"), ValueError("JSON cut short")],
    ids=["5xx", "unreadable"],
)
async def test_a_read_back_that_cannot_be_answered_is_retried_then_given_up(
    monkeypatch: Any, answer: Exception
) -> None:
    monkeypatch.setattr("gpufrac.scheduler.binder.READ_BACK_DELAYS", (0.0, 0.0, 0.0))
    pending = share_pod()
    api, plan = api_with(pending), plan_for(pending)
    api.lose.append(("create Binding", "reply"))
    api.fail["get Pod"] = answer
    with pytest.raises(BindError, match="cannot be read back"):
        await bind(api, pending, "n1", plan)
    assert steps(api).count("get Pod") == 3


# ---- the UID: a pod deleted and recreated under its name ---------------------------------------------------


async def test_the_bind_is_not_sent_once_the_watch_has_reported_the_pod_deleted() -> None:
    pending = share_pod()
    api = api_with(pending)
    with pytest.raises(PodGone):
        await bind(api, pending, "n1", plan_for(pending), gone=lambda: True)
    assert "create Binding" not in steps(api)


async def test_a_successor_bound_by_the_predecessors_binding_is_marked_and_deleted_exactly() -> None:
    """v1.20 ignores the Binding's UID: the successor is bound. The marker says so, and only it is deleted."""
    pending = share_pod()
    api, plan = api_with(pending), plan_for(pending)
    successor = copy.deepcopy(pending)
    successor["metadata"]["uid"] = "uid-p-2"

    async def replace() -> None:
        api.put(successor)

    api.before["create Binding"] = replace
    await bind(api, pending, "n1", plan)  # the API answered 201: the bind cannot tell
    bound = stored_pod(api)
    assert bound["metadata"]["uid"] == "uid-p-2" and bound["spec"]["nodeName"] == "n1"
    assert objects.misbound(bound) and objects.bound_for(bound) == "uid-p"
    assert await unbind_misbound(api, bound, component="gpufrac")
    assert api.stored("Pod", "p") is None
    assert api.made("delete", "Pod")[0].body == {"uid": "uid-p-2"}
    (event,) = [call.body for call in api.made("create", "Event")]
    assert event.reason == "BoundToAnotherPod" and event.involvedObject.uid == "uid-p-2"
    assert "uid-p" in event.message


async def test_a_misbound_pod_replaced_again_meanwhile_is_not_deleted() -> None:
    misbound = share_pod()
    misbound["metadata"]["uid"] = "uid-p-2"
    misbound["spec"]["nodeName"] = "n1"
    misbound["metadata"]["annotations"][keys.BOUND_UID_ANNOTATION] = "uid-p"
    third = copy.deepcopy(share_pod())
    third["metadata"]["uid"] = "uid-p-3"
    api = api_with(third)
    assert await unbind_misbound(api, misbound, component="gpufrac")  # settled: the pod is gone already
    assert stored_pod(api)["metadata"]["uid"] == "uid-p-3"
    assert api.made("create", "Event") == []


async def test_a_misbound_pod_is_tried_again_when_the_api_does_not_answer() -> None:
    misbound = share_pod()
    api = api_with(misbound)
    api.lose.append(("delete Pod", "request"))
    assert not await unbind_misbound(api, misbound, component="gpufrac")
    assert api.stored("Pod", "p") is not None


async def test_a_read_back_finding_another_pod_under_the_name_is_gone() -> None:
    pending = share_pod()
    successor = copy.deepcopy(pending)
    successor["metadata"]["uid"] = "uid-p-2"
    api = api_with(successor)
    api.lose.append(("create Binding", "request"))
    with pytest.raises(PodGone):
        await bind(api, pending, "n1", plan_for(pending))
    assert stored_pod(api)["spec"].get("nodeName") is None


# ---- env ConfigMaps ---------------------------------------------------------------------------------------


async def test_a_configmap_whose_create_reply_was_lost_is_found_and_reused() -> None:
    pending = share_pod()
    api, plan = api_with(pending), plan_for(pending)
    api.lose.append(("create ConfigMap", "reply"))
    await bind(api, pending, "n1", plan)
    assert steps(api) == ["create ConfigMap", "create ConfigMap", "get ConfigMap", "create Binding"]
    assert "delete ConfigMap" not in steps(api)
    assert api.stored("ConfigMap", configmap_name())["metadata"]["uid"] == "cm-uid-1"  # type: ignore[index]


async def test_a_configmap_of_another_owner_is_left_alone_and_nothing_is_bound() -> None:
    pending = share_pod()
    squatter = {
        "kind": "ConfigMap",
        "metadata": {"name": configmap_name(), "namespace": "team", "uid": "cm-x"},
        "data": {keys.ENV_VISIBLE_DEVICES: "all"},
    }
    api = api_with(pending, squatter)
    with pytest.raises(BindError, match="does not belong to this pod"):
        await bind(api, pending, "n1", plan_for(pending))
    assert api.stored("ConfigMap", configmap_name()) == squatter
    assert steps(api) == ["create ConfigMap", "get ConfigMap"]


def earlier_configmap(pending: dict[str, Any], gpu: int) -> dict[str, Any]:
    """The env ConfigMap an earlier bind of `pending` made for GPU `gpu`."""
    body = copy.deepcopy(
        {
            "kind": "ConfigMap",
            "metadata": {
                "name": configmap_name(),
                "namespace": "team",
                "uid": "cm-earlier",
                "ownerReferences": [{"kind": "Pod", "name": "p", "uid": pending["metadata"]["uid"]}],
            },
            "data": plan_for(pending, gpu).configmaps[configmap_name()],
            "immutable": True,
        }
    )
    return body


async def test_a_configmap_of_an_earlier_bind_of_this_pod_that_landed_is_never_deleted() -> None:
    pending = share_pod()
    api = api_with(pending, earlier_configmap(pending, gpu=1))
    earlier = plan_for(pending, gpu=1)
    stored = stored_pod(api)
    stored["spec"]["nodeName"] = "n1"
    stored["metadata"]["annotations"].update(earlier.annotations)
    with pytest.raises(BoundElsewhere):
        await bind(api, pending, "n1", plan_for(pending, gpu=0))
    assert api.stored("ConfigMap", configmap_name())["metadata"]["uid"] == "cm-earlier"  # type: ignore[index]
    assert "delete ConfigMap" not in steps(api) and "create Binding" not in steps(api)


async def test_a_configmap_of_an_earlier_bind_of_this_pod_that_never_landed_is_replaced_exactly() -> None:
    pending = share_pod()
    api, plan = api_with(pending, earlier_configmap(pending, gpu=1)), plan_for(pending, gpu=0)
    await bind(api, pending, "n1", plan)
    (deleted,) = api.made("delete", "ConfigMap")
    assert deleted.body == {"uid": "cm-earlier"}
    assert api.stored("ConfigMap", configmap_name())["data"] == plan.configmaps[configmap_name()]  # type: ignore[index]
    assert stored_pod(api)["spec"]["nodeName"] == "n1"


async def test_a_configmap_replaced_by_another_bind_since_it_was_read_is_not_deleted() -> None:
    pending = share_pod()
    api, plan = api_with(pending, earlier_configmap(pending, gpu=1)), plan_for(pending, gpu=0)
    newer = earlier_configmap(pending, gpu=0) | {}
    newer["metadata"]["uid"] = "cm-newer"

    async def replaced() -> None:
        api.put(newer)

    api.before["delete ConfigMap"] = replaced
    await bind(api, pending, "n1", plan)
    assert api.stored("ConfigMap", configmap_name())["metadata"]["uid"] == "cm-newer"  # type: ignore[index]
    assert stored_pod(api)["spec"]["nodeName"] == "n1"
