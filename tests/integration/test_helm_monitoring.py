"""The chart's Grafana dashboard and Prometheus alerts query only metrics gpufrac exports: the exported names
are read from the components' own registries, so renaming a metric without its queries fails here, not on
an operator's empty panel or silent alert."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry

from gpufrac.admission.server import Metrics as WebhookMetrics
from gpufrac.cluster.state import ClusterState
from gpufrac.contract.node_inventory import Enforcement
from gpufrac.node.exporter import Exporter
from gpufrac.scheduler.metrics import SchedulerMetrics

from .chart import helm_template

MONITORING = "monitoring.coreos.com/v1"
ENABLED = ("monitoring.dashboards.enabled=true", "monitoring.alerts.enabled=true")
# The compute caps change adds these agent metrics in parallel; until it is merged they may be missing here.
# Once merged they are exported, and so checked like the others.
COMPUTE_CAPS = {"gpufrac_share_compute_used_percent", "gpufrac_share_compute_cap_percent"}
# The series names the client writes for each family type (a counter `x` is exposed as `x_total`).
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
METRIC = re.compile(r"(?<![\w:])gpufrac_[\w:]*")


def exported() -> set[str]:
    registries = [
        Exporter().registry,
        SchedulerMetrics(ClusterState).registry,
        WebhookMetrics(CollectorRegistry()).registry,
    ]
    families = [family for registry in registries for family in registry.collect()]
    names = {family.name + s for family in families for s in SUFFIXES.get(family.type, ("",))}
    names |= {sample.name for family in families for sample in family.samples}
    return names | {name for name in COMPUTE_CAPS if not any(f.name == name for f in families)}


def unknown_metrics(queries: list[str]) -> dict[str, set[str]]:
    names = exported()
    return {q: missing for q in queries if (missing := set(METRIC.findall(q)) - names)}


def _exprs(node: Any) -> Iterator[str]:
    """Every PromQL string in a dashboard: panel targets' `expr` and the query variables' `query`."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "expr" or (key == "query" and node.get("type") == "query"):
                yield value["query"] if isinstance(value, dict) else value
            else:
                yield from _exprs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _exprs(item)


def _balanced(query: str) -> bool:
    """No PromQL parser is a dependency; unbalanced brackets are the edit slip this catches."""
    stack: list[str] = []
    for char in re.sub(r'"[^"]*"', "", query):
        if char in "([{":
            stack.append(")]}"["([{".index(char)])
        elif char in ")]}" and (not stack or stack.pop() != char):
            return False
    return not stack


def _rendered(*values: str) -> dict[str, dict[str, Any]]:
    return {doc["kind"]: doc for doc in helm_template(*values, api_versions=(MONITORING,))}


def test_every_dashboard_and_alert_query_names_an_exported_metric() -> None:
    objects = _rendered(*ENABLED)
    configmap = objects["ConfigMap"]
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(configmap["data"]["gpufrac.json"])
    rules = [rule for group in objects["PrometheusRule"]["spec"]["groups"] for rule in group["rules"]]
    queries = [*_exprs(dashboard), *(rule["expr"] for rule in rules)]
    assert len(queries) > 30 and all(METRIC.search(q) for q in queries), "a query names no gpufrac metric"
    assert unknown_metrics(queries) == {}
    assert [q for q in queries if not _balanced(q)] == []
    # The agent encodes the node's level as one series per Enforcement value, 1 for the node's.
    levels = {level for q in queries for level in re.findall(r'level="(\w+)"', q)}
    assert levels and all(level in set(Enforcement) for level in levels)
    for rule in rules:
        assert rule["for"] and rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]
    assert {
        "GPUNodeWithoutEnforcement",
        "MPSDaemonDown",
        "RepeatedMemoryBreaches",
        "SharesPendingOnFragmentation",
        "SchedulerNotLeading",
        "WebhookDenialsSpike",
    } <= {rule["alert"] for rule in rules}


def test_a_query_naming_no_exported_metric_fails() -> None:
    queries = [
        "rate(gpufrac_scheduler_attempts_total[5m])",
        "gpufrac_share_memory_used_bytes_total",  # a gauge has no _total
        "histogram_quantile(0.99, rate(gpufrac_scheduler_decision_second_bucket[5m]))",
    ]
    assert unknown_metrics(queries) == {
        queries[1]: {"gpufrac_share_memory_used_bytes_total"},
        queries[2]: {"gpufrac_scheduler_decision_second_bucket"},
    }


def test_monitoring_is_opt_in_and_needs_the_operator_for_rules_and_monitors() -> None:
    monitoring = {"ConfigMap", "PrometheusRule", "ServiceMonitor", "PodMonitor"}
    assert not monitoring & {d["kind"] for d in helm_template(api_versions=(MONITORING,))}
    everything = (*ENABLED, "monitoring.serviceMonitors.enabled=true")
    assert {d["kind"] for d in helm_template(*everything)} & monitoring == {"ConfigMap"}


def test_the_monitors_scrape_each_components_metrics_port() -> None:
    documents = helm_template(
        "monitoring.serviceMonitors.enabled=true", "monitoring.labels.release=kps", api_versions=(MONITORING,)
    )
    monitors = {d["metadata"]["name"]: d for d in documents if d["kind"] in {"ServiceMonitor", "PodMonitor"}}
    assert set(monitors) == {"gpufrac-scheduler", "gpufrac-webhook", "gpufrac-agent"}
    assert all(m["metadata"]["labels"]["release"] == "kps" for m in monitors.values())
    services = {d["metadata"]["name"]: d for d in documents if d["kind"] == "Service"}
    (agent,) = [d for d in documents if d["kind"] == "DaemonSet"]
    ports = {
        "gpufrac-scheduler": {p["name"] for p in services["gpufrac-scheduler-metrics"]["spec"]["ports"]},
        "gpufrac-webhook": {p["name"] for p in services["gpufrac-webhook"]["spec"]["ports"]},
        "gpufrac-agent": {p["name"] for p in agent["spec"]["template"]["spec"]["containers"][0]["ports"]},
    }
    for name, monitor in monitors.items():
        endpoints = monitor["spec"].get("endpoints") or monitor["spec"]["podMetricsEndpoints"]
        assert {e["port"] for e in endpoints} <= ports[name], name
    relabel = monitors["gpufrac-agent"]["spec"]["podMetricsEndpoints"][0]["relabelings"]
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"} in relabel
    (webhook,) = monitors["gpufrac-webhook"]["spec"]["endpoints"]
    assert webhook["scheme"] == "https"
    assert webhook["tlsConfig"]["ca"]["secret"] == {"name": "gpufrac-webhook-tls", "key": "ca.crt"}
