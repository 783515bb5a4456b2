"""The Helm chart renders (`helm template`) and every object it renders is accepted by a real apiserver
(server-side dry run). Its RBAC needs no test of its own here: the control plane runs the scheduler's and
the agent's identities under it (see chart.py)."""

from __future__ import annotations

import inspect
import json
import typing

import lightkube
import pytest
from lightkube import codecs
from lightkube.generic_resource import create_namespaced_resource

from gpufrac import cli, contract
from gpufrac.admission import settings
from gpufrac.errors import UserError
from gpufrac.placement.framework import POLICIES

from . import controlplane
from .chart import CHART, helm_refusal, helm_template

# kube-apiserver v1.20 serves PodDisruptionBudgets as policy/v1beta1 only; the chart needs 1.21 (policy/v1).
POD_DISRUPTION_BUDGET_V1BETA1 = "policy/v1beta1"
create_namespaced_resource("policy", "v1beta1", "PodDisruptionBudget", "poddisruptionbudgets")


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
        if document["kind"] == "PodDisruptionBudget":  # the fields the chart sets are the same in both
            document = {**document, "apiVersion": POD_DISRUPTION_BUDGET_V1BETA1}
        # Server-side apply, so objects the test cluster already has (its RBAC) are validated too.
        obj = codecs.from_dict(document)
        await admin_client.apply(obj, field_manager="chart-test", force=True, dry_run=True)  # type: ignore[call-overload]


def test_the_scheduler_deployment_runs_leader_elected_replicas() -> None:
    (deployment,) = [
        d for d in helm_template() if d["kind"] == "Deployment" and "scheduler" in d["metadata"]["name"]
    ]
    assert deployment["spec"]["replicas"] == 2
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[0] == "scheduler" and "--leader-elect" in args
    assert f"--namespace={controlplane.SCHEDULER_NAMESPACE}" in args
    # One replica elects too: a rolling update runs the new pod beside the old one for a while.
    (single,) = [
        d
        for d in helm_template("scheduler.replicas=1")
        if d["kind"] == "Deployment" and "scheduler" in d["metadata"]["name"]
    ]
    assert single["spec"]["replicas"] == 1
    assert "--leader-elect" in single["spec"]["template"]["spec"]["containers"][0]["args"]


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("agent.mode=kil", "agent.mode"),
        ("agent.devicePlugin=managd", "agent.devicePlugin"),
        ("agent.interval=-5", "agent.interval"),
        ("agent.interval=0", "agent.interval"),
        ("agent.mps.activeThreadPercentage=0", "agent.mps.activeThreadPercentage"),
        ("scheduler.policy=bin-pack", "scheduler.policy"),
        ("scheduler.envDelivery=annotations", "scheduler.envDelivery"),
        ("scheduler.replicas=-1", "scheduler.replicas"),
        ("scheduler.evictions.maxMoves=11", "scheduler.evictions.maxMoves"),
        ("scheduler.evictions.minRuntimeSeconds=-1", "scheduler.evictions.minRuntimeSeconds"),
        ("scheduler.wholeGpuReserve=101", "scheduler.wholeGpuReserve"),
        ("scheduler.wholeGpuReserve=100.5", "scheduler.wholeGpuReserve"),
        ("scheduler.faultDomainLabel=team name", "scheduler.faultDomainLabel"),
        ("webhook.untrustedSmSharing=allow", "webhook.untrustedSmSharing"),
        ("webhook.failurePolicy=fail", "webhook.failurePolicy"),
        ("webhook.timeoutSeconds=31", "webhook.timeoutSeconds"),
        ("webhook.replicas=0", "webhook.replicas"),
        ("gpuMemoryResource.fractionReferenceMiB=0", "gpuMemoryResource.fractionReferenceMiB"),
        ("gpuMemoryResource.fractionReferenceMiB=1073741825", "gpuMemoryResource.fractionReferenceMiB"),
        ("agent.cudaContextMiB=16385", "agent.cudaContextMiB"),
    ],
)
def test_a_bad_value_stops_the_release_with_its_name(value: str, named: str) -> None:
    """Not a release whose containers refuse their flags and restart forever on every GPU node."""
    assert f"- {named}: " in helm_refusal(value)


def test_good_values_that_helm_set_passes_as_strings_are_accepted() -> None:
    # `--set agent.interval=2.5` is the string "2.5": the schema takes it, the command checks its range.
    (daemonset,) = [d for d in helm_template("agent.interval=2.5") if d["kind"] == "DaemonSet"]
    assert "--interval=2.5" in daemonset["spec"]["template"]["spec"]["containers"][0]["args"]
    (deployment,) = [
        d
        for d in helm_template("scheduler.wholeGpuReserve=17.5")
        if d["kind"] == "Deployment" and "scheduler" in d["metadata"]["name"]
    ]
    assert "--whole-gpu-reserve=17.5" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]


def _node_selector(selector: str) -> str:
    return "scheduler.nodeSelector=" + selector.replace(",", "\\,")  # `--set` splits on a bare comma


@pytest.mark.parametrize("selector", ["gpufrac.io/enabled", "=true", "gpufrac.io/enabled=true,pool"])
def test_a_node_selector_the_scheduler_refuses_stops_the_release(selector: str) -> None:
    with pytest.raises(UserError):  # the scheduler would exit 2 at start, again and again
        cli.parse_labels(selector, option="--node-selector")
    assert "- scheduler.nodeSelector: " in helm_refusal(_node_selector(selector))


@pytest.mark.parametrize("selector", ["gpufrac.io/enabled=true", "pool=a100, example.com/tier="])
def test_a_node_selector_of_labels_reaches_the_scheduler(selector: str) -> None:
    cli.parse_labels(selector, option="--node-selector")  # which the scheduler takes
    (deployment,) = [
        d
        for d in helm_template(_node_selector(selector))
        if d["kind"] == "Deployment" and "scheduler" in d["metadata"]["name"]
    ]
    assert f"--node-selector={selector}" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]


def test_the_schemas_choices_are_the_commands() -> None:
    properties = json.loads((CHART / "values.schema.json").read_text())["properties"]
    scheduler, agent, webhook = (properties[part]["properties"] for part in ("scheduler", "agent", "webhook"))

    def choices(command: typing.Callable[..., object], option: str) -> list[str]:
        hint = typing.get_type_hints(inspect.unwrap(command), include_extras=True)[option]
        return list(typing.get_args(typing.get_args(hint)[0]))

    assert scheduler["policy"]["enum"] == list(POLICIES)
    assert scheduler["envDelivery"]["enum"] == [str(e) for e in contract.EnvDelivery]
    assert agent["mode"]["enum"] == choices(cli.agent, "mode")
    assert agent["devicePlugin"]["enum"] == choices(cli.agent, "device_plugin")
    assert webhook["untrustedSmSharing"]["enum"] == [str(e) for e in settings.UntrustedSmSharing]


def test_a_cluster_without_the_namespace_name_label_is_refused() -> None:
    """Before 1.21 no namespace carries kubernetes.io/metadata.name, so the webhooks' NotIn selector would
    match kube-system and the release's own namespace: with the webhook down, its pods could not come back."""
    assert "requires kubeVersion: >=1.21.0-0" in helm_refusal(kube_version="1.20.2")
    assert helm_template(kube_version="1.21.0")
