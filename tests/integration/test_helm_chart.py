"""The Helm chart renders (`helm template`) and every object it renders is accepted by a real apiserver
(server-side dry run). Its RBAC needs no test of its own here: the control plane runs the scheduler's and
the agent's identities under it (see chart.py)."""

from __future__ import annotations

import lightkube
from lightkube import codecs

from . import controlplane
from .chart import helm_template


async def test_every_rendered_object_passes_a_server_side_dry_run(
    admin_client: lightkube.AsyncClient,
) -> None:
    documents = helm_template()
    kinds = {doc["kind"] for doc in documents}
    assert {
        "Deployment",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
    } <= kinds
    for document in documents:
        # Server-side apply, so objects the test cluster already has (its RBAC) are validated too.
        obj = codecs.from_dict(document)
        await admin_client.apply(obj, field_manager="chart-test", force=True, dry_run=True)  # type: ignore[call-overload]


def test_the_scheduler_deployment_runs_two_leader_elected_replicas() -> None:
    (deployment,) = [
        d for d in helm_template() if d["kind"] == "Deployment" and "scheduler" in d["metadata"]["name"]
    ]
    assert deployment["spec"]["replicas"] == 2
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[0] == "scheduler" and "--leader-elect" in args
    assert f"--namespace={controlplane.SCHEDULER_NAMESPACE}" in args
    single = [
        d
        for d in helm_template("scheduler.replicas=1")
        if d["kind"] == "Deployment" and "scheduler" in d["metadata"]["name"]
    ]
    assert "--leader-elect" not in single[0]["spec"]["template"]["spec"]["containers"][0]["args"]
