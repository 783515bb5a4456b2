"""The chart's admission webhook: configurations that fail closed outside the exempt namespaces, a
Deployment whose flags are `gpufrac webhook`'s, and TLS from cert-manager or from the one-shot Job.
(test_helm_chart.py dry-runs every rendered object against the apiserver; test_webhook.py registers
these very configurations and runs the acceptance tests through them.)"""

from __future__ import annotations

from typing import Any

import typer

from gpufrac import cli, contract
from gpufrac.admission import certs, settings

from . import controlplane
from .chart import helm_refusal, helm_template

NAMESPACE = controlplane.SCHEDULER_NAMESPACE
EXEMPT = ["gpufrac-system", "kube-system", "kube-public", "kube-node-lease", "gpu-operator"]


def webhook_objects(
    *values: str, api_versions: tuple[str, ...] = ()
) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (d["kind"], d["metadata"]["name"]): d
        for d in helm_template(*values, api_versions=api_versions)
        if d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "webhook"
    }


def webhook_flags() -> set[str]:
    command = typer.main.get_command(cli.app).commands["webhook"]  # type: ignore[attr-defined]
    return {option for param in command.params for option in param.opts}


def args_of(workload: dict[str, Any]) -> dict[str, str]:
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    assert container["args"][0] == "webhook"
    flags = {}
    for arg in container["args"][1:]:
        flag, _, value = arg.partition("=")
        assert flag in webhook_flags(), f"{flag} is not a flag of gpufrac webhook"
        flags[flag] = value
    return flags


def test_every_webhook_fails_closed_outside_the_exempt_namespaces() -> None:
    objects = webhook_objects()
    mutating = objects["MutatingWebhookConfiguration", "gpufrac-webhook"]["webhooks"]
    validating = objects["ValidatingWebhookConfiguration", "gpufrac-webhook"]["webhooks"]
    exempt = {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": EXEMPT}
    for hook in mutating + validating:
        assert hook["failurePolicy"] == "Fail" and hook["sideEffects"] == "None"
        assert hook["admissionReviewVersions"] == ["v1"]
        tier = hook["name"].split(".")[0].rpartition("-")[2]
        if tier in ("trusted", "untrusted"):
            operator = "In" if tier == "trusted" else "NotIn"
            term = {"key": settings.TRUST_LABEL, "operator": operator, "values": [settings.TRUSTED]}
            assert hook["namespaceSelector"] == {"matchExpressions": [term, exempt]}
        else:
            assert hook["namespaceSelector"] == {"matchExpressions": [exempt]}
        assert hook["clientConfig"]["service"]["name"] == "gpufrac-webhook"
        assert "caBundle" not in hook["clientConfig"]  # no cluster to look the Job's Secret up in
    rules = {
        hook["name"]: (hook["clientConfig"]["service"]["path"], hook["rules"])
        for hook in mutating + validating
    }
    assert rules["queues.validate.gpufrac.io"] == (
        "/validate",
        [
            {
                "apiGroups": ["gpufrac.io"],
                "apiVersions": ["v1alpha1"],
                "operations": ["CREATE", "UPDATE", "DELETE"],
                "resources": ["queues"],
                "scope": "Cluster",
            }
        ],
    )
    # One entry per trust tier: the plain paths are the untrusted tier's.
    assert rules["pods-trusted.mutate.gpufrac.io"][0] == "/mutate/trusted"
    assert rules["pods-untrusted.mutate.gpufrac.io"] == (
        "/mutate",
        [
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "operations": ["CREATE"],
                "resources": ["pods"],
                "scope": "Namespaced",
            }
        ],
    )
    assert rules["pods-trusted.validate.gpufrac.io"][0] == "/validate/trusted"
    path, [pods, bindings] = rules["pods-untrusted.validate.gpufrac.io"]
    assert path == "/validate" and pods["operations"] == ["CREATE", "UPDATE"]
    assert pods["resources"] == ["pods", "pods/ephemeralcontainers", "pods/status"]
    assert bindings["operations"] == ["CREATE"] and bindings["resources"] == ["bindings", "pods/binding"]
    path, [configmaps] = rules["configmaps.validate.gpufrac.io"]
    assert path == "/validate" and configmaps["operations"] == ["CREATE", "UPDATE", "DELETE"]
    assert "objectSelector" not in next(h for h in validating if h["name"].startswith("configmaps"))


def test_no_value_makes_a_webhook_fail_open() -> None:
    """failurePolicy Ignore would let what the webhooks guard through whenever the webhook is down, busy
    (an answer without a uid), slow, or serving an expired certificate: the chart refuses it by name."""
    assert "- webhook.failurePolicy: " in helm_refusal("webhook.failurePolicy=Ignore")


def test_labelled_mode_narrows_the_mutation_only() -> None:
    objects = webhook_objects("webhook.schedulePods=labelled")
    for mutating in objects["MutatingWebhookConfiguration", "gpufrac-webhook"]["webhooks"]:
        assert mutating["namespaceSelector"]["matchLabels"] == {"gpufrac.io/scheduling": "enabled"}
    for hook in objects["ValidatingWebhookConfiguration", "gpufrac-webhook"]["webhooks"]:
        assert "matchLabels" not in hook["namespaceSelector"]


def test_the_deployment_runs_gpufrac_webhook_with_the_charts_settings() -> None:
    objects = webhook_objects()
    deployment = objects["Deployment", "gpufrac-webhook"]
    assert deployment["spec"]["replicas"] == 2
    flags = args_of(deployment)
    assert flags["--scheduler-identity"] == controlplane.SCHEDULER_USER == settings.DEFAULT_SCHEDULER_IDENTITY
    assert flags["--exempt-namespaces"].split(",") == EXEMPT
    assert flags["--mps-host-directory"] == contract.DEFAULT_MPS_PIPE_DIRECTORY
    assert (flags["--scheduler-name"], flags["--env-delivery"]) == ("gpufrac", "configmap")
    assert (flags["--tls-cert"], flags["--tls-key"]) == ("/tls/tls.crt", "/tls/tls.key")
    assert flags["--untrusted-sm-sharing"] == "deny"
    pod = deployment["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["volumes"] == [{"name": "tls", "secret": {"secretName": "gpufrac-webhook-tls"}}]
    # Drains evict the replicas of a webhook that fails closed one at a time.
    budget = objects["PodDisruptionBudget", "gpufrac-webhook"]["spec"]
    assert budget == {"maxUnavailable": 1, "selector": deployment["spec"]["selector"]}
    service = objects["Service", "gpufrac-webhook"]
    assert service["spec"]["ports"] == [
        {"name": "https", "port": 443, "targetPort": "https", "protocol": "TCP"}
    ]


def test_without_cert_manager_a_job_makes_the_certificate_before_and_sets_the_ca_after() -> None:
    objects = webhook_objects()
    assert ("Certificate", "gpufrac-webhook") not in objects
    pre, post = objects["Job", "gpufrac-webhook-certs-pre"], objects["Job", "gpufrac-webhook-certs-post"]
    assert pre["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert post["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    hosts = ",".join(certs.service_hosts("gpufrac-webhook", NAMESPACE))
    common = {"--generate-certs": "", "--secret": f"{NAMESPACE}/gpufrac-webhook-tls", "--hosts": hosts}
    assert args_of(pre) == common
    assert args_of(post) == {**common, "--webhook-configurations": "gpufrac-webhook"}
    # The rights the Job's command needs, and no more.
    role = objects["Role", "gpufrac-webhook-certs"]["rules"]
    assert {
        "apiGroups": [""],
        "resources": ["secrets"],
        "resourceNames": ["gpufrac-webhook-tls"],
        "verbs": ["get", "patch"],
    } in role
    (cluster_rule,) = objects["ClusterRole", "gpufrac-webhook-certs"]["rules"]
    assert cluster_rule["resourceNames"] == ["gpufrac-webhook"] and cluster_rule["verbs"] == ["get", "patch"]
    for kind in ("ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"):
        hooks = objects[kind, "gpufrac-webhook-certs"]["metadata"]["annotations"]["helm.sh/hook"]
        assert hooks == "pre-install,pre-upgrade,post-install,post-upgrade"


def test_with_cert_manager_it_issues_and_injects_the_certificate() -> None:
    objects = webhook_objects(api_versions=("cert-manager.io/v1",))
    assert not [name for kind, name in objects if kind == "Job"]
    certificate = objects["Certificate", "gpufrac-webhook"]["spec"]
    assert certificate["secretName"] == "gpufrac-webhook-tls"
    assert certificate["dnsNames"] == certs.service_hosts("gpufrac-webhook", NAMESPACE)
    assert objects["Issuer", "gpufrac-webhook"]["spec"] == {"selfSigned": {}}
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        annotations = objects[kind, "gpufrac-webhook"]["metadata"]["annotations"]
        assert annotations == {"cert-manager.io/inject-ca-from": f"{NAMESPACE}/gpufrac-webhook"}
    forced = webhook_objects("webhook.tls=job", api_versions=("cert-manager.io/v1",))
    assert ("Job", "gpufrac-webhook-certs-post") in forced and (
        "Certificate",
        "gpufrac-webhook",
    ) not in forced


def test_the_webhook_can_be_left_out() -> None:
    assert webhook_objects("webhook.enabled=false") == {}


def test_a_network_policy_admits_only_the_apiserver_to_the_webhook_port() -> None:
    policy = webhook_objects()["NetworkPolicy", "gpufrac-webhook"]
    spec = policy["spec"]
    assert policy["metadata"]["namespace"] == NAMESPACE
    assert spec["podSelector"]["matchLabels"] == {
        "app.kubernetes.io/instance": "gpufrac",
        "app.kubernetes.io/component": "webhook",
    }
    assert spec["policyTypes"] == ["Ingress"]
    (rule,) = spec["ingress"]
    assert rule["ports"] == [{"port": 8443, "protocol": "TCP"}]
    assert rule["from"] == [{"ipBlock": {"cidr": "0.0.0.0/0"}}]
    narrowed = webhook_objects(
        "webhook.networkPolicy.apiserverCIDRs={10.0.0.0/8}",
        "webhook.networkPolicy.podCIDRs={10.244.0.0/16,10.96.0.0/12}",
        "webhook.port=9443",
    )["NetworkPolicy", "gpufrac-webhook"]
    (rule,) = narrowed["spec"]["ingress"]
    assert rule["ports"] == [{"port": 9443, "protocol": "TCP"}]
    assert rule["from"] == [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.244.0.0/16", "10.96.0.0/12"]}}]
    assert ("NetworkPolicy", "gpufrac-webhook") not in webhook_objects("webhook.networkPolicy.enabled=false")


def test_a_network_policy_that_names_no_source_is_refused() -> None:
    """An ingress rule whose `from` is empty admits every source: emptying apiserverCIDRs must not open the
    webhook's port to every pod. extraFrom alone is a policy, of its peers only."""
    cidrs = "webhook.networkPolicy.apiserverCIDRs"
    assert "webhook.networkPolicy admits no source" in helm_refusal(f"{cidrs}=null")
    # `--set ...={}` is a list of one empty string, a peer with no address.
    assert f"- {cidrs}.0: " in helm_refusal(f"{cidrs}={{}}")
    prometheus = webhook_objects(
        f"{cidrs}=null", "webhook.networkPolicy.extraFrom[0].podSelector.matchLabels.app=prom"
    )
    (rule,) = prometheus["NetworkPolicy", "gpufrac-webhook"]["spec"]["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": {"app": "prom"}}}]
