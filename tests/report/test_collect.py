"""Reading usage: an agent's /metrics text, a Prometheus API, and sources that fail."""

from __future__ import annotations

import json
from urllib.parse import quote_plus

import pytest

from gpufrac.report import collect
from gpufrac.report.analysis import ShareSample

from .fakemetrics import agent_body, serving, share_line


def test_an_agents_metrics_give_each_share_and_the_watchdog_counters() -> None:
    text = agent_body(share_line("a", 1024, gpu="1", uuid="GPU-b"), share_line("b", 0))
    usage = collect.parse_metrics(text, "http://n1:9400/metrics")
    assert usage.samples == (
        ShareSample("ml/a", "main", "GPU-b", "1", 1024.0),
        ShareSample("ml/b", "main", "0", "0", 0.0),
    )
    assert usage.breaches == {"GPUMemoryLimitExceeded": 2.0} and usage.actions == {"report": 2.0}
    assert usage.counters_read


@pytest.mark.parametrize(
    ("bodies", "path", "problem"),
    [
        ({}, "/metrics", "404"),
        ({"/metrics": "this is { not metrics"}, "/metrics", ""),
        ({"/metrics": b"x" * (collect.MAX_BODY_BYTES + 1)}, "/metrics", "larger than"),
    ],
)
def test_a_source_that_fails_is_recorded_not_raised(bodies: dict, path: str, problem: str) -> None:
    with serving(bodies) as base, collect.http_client() as http:
        usage = collect.scrape(base + path, http)
    assert usage.samples == () and not usage.counters_read
    assert problem in usage.sources[0].problem
    assert "\n" not in usage.sources[0].problem  # it ends a one-line warning (httpx adds a line on a 404)


def test_an_unreachable_agent_is_a_problem_too() -> None:
    with serving({}) as base:
        pass  # closed: nothing listens there any more
    with collect.http_client() as http:
        usage = collect.scrape(f"{base}/metrics", http)
    assert usage.sources[0].problem


def vector(*results: tuple[dict[str, str], str]) -> str:
    items = [{"metric": metric, "value": [0, value]} for metric, value in results]
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": items}})


def prometheus_paths(used: str, breaches: str, actions: str) -> dict[str, str]:
    queries = {
        collect.USED: used,
        f"sum by (reason) ({collect.BREACHES}_total)": breaches,
        f"sum by (action) ({collect.ACTIONS}_total)": actions,
    }
    return {f"/api/v1/query?query={quote_plus(query)}": body for query, body in queries.items()}


def test_prometheus_gives_the_same_figures() -> None:
    share = {
        "namespace": "ml",
        "pod": "a",
        "container": "main",
        "gpu": "0",
        "uuid": "GPU-a",
        "instance": "n1",
    }
    paths = prometheus_paths(
        vector((share, "2048")),
        vector(({"reason": "GPUMemoryLimitExceeded"}, "3")),
        vector(({"action": "kill"}, "3")),
    )
    with serving(paths) as base, collect.http_client() as http:
        usage = collect.query_prometheus(base + "/", http)
    assert usage.samples == (ShareSample("ml/a", "main", "GPU-a", "0", 2048.0),)
    assert usage.breaches == {"GPUMemoryLimitExceeded": 3.0} and usage.actions == {"kill": 3.0}


def test_a_prometheus_error_is_a_problem() -> None:
    failed = json.dumps({"status": "error", "error": "parse error"})
    with serving(prometheus_paths(failed, failed, failed)) as base, collect.http_client() as http:
        usage = collect.query_prometheus(base, http)
    assert "parse error" in usage.sources[0].problem
