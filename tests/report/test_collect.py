"""Reading usage: an agent's /metrics text, a Prometheus API, and sources that fail."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable
from typing import BinaryIO
from urllib.parse import quote_plus

import pytest
from rich.console import Console

from gpufrac.report import analysis, collect, render
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


def dripping(head: bytes) -> Callable[[BinaryIO], None]:
    """An answer that writes `head`, then a byte every 50 ms for 20 s: each read is quick, so only a deadline
    on the whole answer ends it."""

    def answer(stream: BinaryIO) -> None:
        for piece in (head, *(b"#" for _ in range(400))):
            try:
                stream.write(piece)
                stream.flush()
            except OSError:
                return  # the reader gave up
            time.sleep(0.05)

    return answer


@pytest.mark.parametrize(
    "head", [b"HTTP/1.0 200 OK\r\n\r\n", b"HTTP/1.0 200 OK\r\nX-Slow: "], ids=["body", "headers"]
)
def test_an_answer_that_drips_for_ever_is_given_up(monkeypatch: pytest.MonkeyPatch, head: bytes) -> None:
    monkeypatch.setattr(collect, "DEADLINE_SECONDS", 0.5)
    with serving({"/metrics": dripping(head)}) as base, collect.http_client() as http:
        usage = collect.scrape(base + "/metrics", http)
    assert "not complete after 0.5 s" in usage.sources[0].problem  # the 20 s answer was given up


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-1"])
def test_a_reading_that_is_no_size_makes_the_source_unread(value: str) -> None:
    """NaN passed for a share within its limit (it compares false) and wrote NaN into report.json."""
    text = agent_body(share_line("a", 0).replace(" 0", f" {value}"))
    with pytest.raises(ValueError, match="not a size or a count"):
        collect.parse_metrics(text, "u")
    counters = agent_body().replace("} 2.0", "} NaN", 1)
    with pytest.raises(ValueError, match="not a size or a count"):
        collect.parse_metrics(counters, "u")


def test_text_an_agent_wrote_is_shown_not_obeyed() -> None:
    """A reason label reached the terminal table as markup ('[/b]' aborted the run with a traceback) and
    as escape sequences; the warning line too, from the error a server wrote."""
    text = agent_body().replace("GPUMemoryLimitExceeded", "[/b]\x1b]0;owned\x07")
    usage = collect.parse_metrics(text, "u")
    assert list(usage.breaches) == ["[/b]\\x1b]0;owned\\x07"]
    screen = io.StringIO()
    Console(file=screen, width=160).print(render.summary_table(analysis.figures([], [], usage)))
    assert "watchdog findings: [/b]\\x1b]0;owned\\x07" in screen.getvalue()
    assert collect.printable("a\x1b[31mb\nc") == "a\\x1b[31mb\\nc"


def test_an_unreachable_agent_is_a_problem_too() -> None:
    with serving({}) as base:
        pass  # closed: nothing listens there any more
    with collect.http_client() as http:
        usage = collect.scrape(f"{base}/metrics", http)
    assert usage.sources[0].problem


def redirect_to(location: str) -> Callable[[BinaryIO], None]:
    def answer(stream: BinaryIO) -> None:
        stream.write(f"HTTP/1.0 302 Found\r\nLocation: {location}\r\nContent-Length: 0\r\n\r\n".encode())

    return answer


def test_a_redirect_is_a_problem_not_followed() -> None:
    """A source, or anything on its path, could send the report to any other host or scheme (a cloud
    metadata address, an internal service): the report reads only what it was given, and the warning names
    where the redirect pointed."""
    asked: list[str] = []

    def elsewhere(stream: BinaryIO) -> None:
        asked.append("elsewhere")
        stream.write(f"HTTP/1.0 200 OK\r\n\r\n{agent_body(share_line('a', 1))}".encode())

    with serving({"/metrics": elsewhere}) as other:
        target = f"{other}/metrics"
        redirects = {"/metrics": redirect_to(target), "/api/v1/query": redirect_to(target)}
        with serving(redirects) as base, collect.http_client() as http:
            usages = [collect.scrape(f"{base}/metrics", http), collect.query_prometheus(base, http)]
    assert not asked
    for usage in usages:
        assert usage.samples == () and not usage.counters_read
        assert usage.sources[0].problem == (
            f"redirected (302) to {target}, not followed: point the flag at the final address"
        )


def vector(*results: tuple[dict[str, str], str]) -> str:
    return vector_of([{"metric": metric, "value": [0, value]} for metric, value in results])


def vector_of(items: list[object]) -> str:
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


NOT_PROMETHEUS = {
    "a list": "[]",
    "a string": '"up"',
    "nested for ever": "[" * 100_000,
    "data not a map": json.dumps({"status": "success", "data": []}),
    "results not a list": json.dumps({"status": "success", "data": {"resultType": "vector", "result": 1}}),
    "a result not a map": vector_of(["x"]),
    "labels not a map": vector_of([{"metric": [1], "value": [0, "1"]}]),
    "a label not text": vector_of([{"metric": {"reason": {"a": 1}}, "value": [0, "1"]}]),
    "a value not a pair": vector_of([{"metric": {}, "value": 1}]),
    "a value of NaN": vector_of([{"metric": {}, "value": [0, "NaN"]}]),
}


@pytest.mark.parametrize("body", NOT_PROMETHEUS.values(), ids=NOT_PROMETHEUS.keys())
def test_an_answer_of_the_wrong_shape_is_a_problem_not_a_traceback(body: str) -> None:
    with serving(prometheus_paths(body, body, body)) as base, collect.http_client() as http:
        usage = collect.query_prometheus(base, http)
    assert usage.samples == () and usage.sources[0].problem
    assert "\n" not in usage.sources[0].problem


def test_a_prometheus_error_is_a_problem() -> None:
    failed = json.dumps({"status": "error", "error": "parse error"})
    with serving(prometheus_paths(failed, failed, failed)) as base, collect.http_client() as http:
        usage = collect.query_prometheus(base, http)
    assert "parse error" in usage.sources[0].problem
