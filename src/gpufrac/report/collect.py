"""`gpufrac report`'s reading: the cluster's nodes and pods, and the agents' per-share usage, either from
each agent's /metrics or from a Prometheus that scrapes them.

A source that cannot be read is a warning, not a failure: the report is still written, and the shares it
would have measured say "not measured". Bodies are read within a bound of size and of time, and checked for
shape and sense (a count or a size is a finite number, 0 or more), since a URL may point anywhere; text a
source wrote reaches the terminal only as printable characters. No redirect is followed: a source, or
anything between, could send the report to another host or scheme (a cloud metadata address, an internal
service).
"""

from __future__ import annotations

import asyncio
import json
import math
import queue
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx2
from prometheus_client.parser import text_string_to_metric_families

from gpufrac.errors import UserError
from gpufrac.kubeapi import client as kube_client
from gpufrac.report.analysis import ShareSample, Source, Usage

USED = "gpufrac_share_memory_used_bytes"
BREACHES = "gpufrac_watchdog_breaches"  # counters: the samples are named <family>_total
ACTIONS = "gpufrac_watchdog_actions"
MAX_BODY_BYTES = 32 * 1024 * 1024  # an agent with thousands of shares writes a few MiB
TIMEOUT_SECONDS = 10.0  # for each step (connect, each read): a server that drips bytes never reaches it
DEADLINE_SECONDS = 60.0  # for a whole answer, so that one that drips is given up too
EXAMPLE_URLS = {"--metrics": "http://node-1:9400/metrics", "--prometheus": "http://prometheus:9090"}


def check_url(url: str, *, option: str) -> None:
    """Refuse, before anything is read, a source that no request could reach: an unreachable agent is a
    warning (the report is still worth having), but a typo in a flag would be the same warning every time."""
    try:
        parsed = httpx2.URL(url)
    except httpx2.InvalidURL:
        parsed = None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.host:
        raise UserError(
            f"{option} {url}: not an http:// or https:// URL; pass one such as {EXAMPLE_URLS[option]}"
        )


def read_cluster(kubeconfig: Path | None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    return asyncio.run(kube_client.list_nodes_and_pods(kubeconfig))


def scrape(url: str, http: httpx2.Client) -> Usage:
    """One agent's /metrics, as usage; a problem reading it is recorded on its `Source`."""
    try:
        return parse_metrics(_get(http, url), url)
    except (httpx2.HTTPError, ValueError) as error:
        return Usage(sources=(Source(url, _problem(error)),))


def parse_metrics(text: str, url: str) -> Usage:
    """The samples and watchdog counters of one Prometheus text exposition; ValueError if it is not one."""
    samples: list[ShareSample] = []
    counters: dict[str, dict[str, float]] = {BREACHES: {}, ACTIONS: {}}
    label = {BREACHES: "reason", ACTIONS: "action"}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == USED:
                samples.append(_share_sample(sample.labels, _reading(sample.name, sample.value)))
            elif family.name in counters and sample.name == f"{family.name}_total":
                key = printable(sample.labels.get(label[family.name], ""))
                value = _reading(sample.name, sample.value)
                counters[family.name][key] = counters[family.name].get(key, 0.0) + value
    return Usage(tuple(samples), counters[BREACHES], counters[ACTIONS], (Source(url),))


def query_prometheus(base: str, http: httpx2.Client) -> Usage:
    """The same figures from a Prometheus HTTP API (`/api/v1/query`): the latest samples, counters summed
    over the agents."""
    url = f"{base.rstrip('/')}/api/v1/query"
    try:
        used = _vector(http, url, USED)
        breaches = _vector(http, url, f"sum by (reason) ({BREACHES}_total)")
        actions = _vector(http, url, f"sum by (action) ({ACTIONS}_total)")
    except (httpx2.HTTPError, ValueError) as error:
        return Usage(sources=(Source(base, _problem(error)),))
    return Usage(
        tuple(_share_sample(labels, value) for labels, value in used),
        {printable(labels.get("reason", "")): value for labels, value in breaches},
        {printable(labels.get("action", "")): value for labels, value in actions},
        (Source(base),),
    )


def _vector(http: httpx2.Client, url: str, query: str) -> list[tuple[Mapping[str, str], float]]:
    """The query's instant vector; ValueError for an answer of any other shape, so that a server that is
    not Prometheus is a warning, not a traceback."""
    try:
        body = json.loads(_get(http, url, params={"query": query}))
    except RecursionError:
        raise ValueError("answer nested too deeply to be Prometheus's") from None
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, dict) or body.get("status") != "success" or data.get("resultType") != "vector":
        error = body.get("error") if isinstance(body, dict) else None
        raise ValueError(f"query {query!r}: {error or 'not an instant vector'}")
    results = data.get("result")
    if not isinstance(results, list):
        raise ValueError(f"query {query!r}: an instant vector without a list of results")
    return [_result(item, query) for item in results]


def _result(item: object, query: str) -> tuple[Mapping[str, str], float]:
    """One result of an instant vector: `{"metric": {label: text}, "value": [time, "number"]}`."""
    metric = item.get("metric") if isinstance(item, dict) else None
    value = item.get("value") if isinstance(item, dict) else None
    if (
        not isinstance(metric, dict)
        or not all(isinstance(text, str) for text in metric.values())
        or not isinstance(value, list)
        or len(value) != 2
        or not isinstance(value[1], str)
    ):
        raise ValueError(
            f"query {query!r}: a result that is not {{metric: {{labels}}, value: [time, number]}}"
        )
    return metric, _reading(query, float(value[1]))


def _reading(name: str, value: float) -> float:
    """A size in bytes or a count, as read: NaN, an infinity or a negative number is no reading, and would
    pass for a share within its limit (NaN compares false) or make report.json invalid JSON."""
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} = {value}: not a size or a count (a finite number, 0 or more)")
    return value


def _share_sample(labels: Mapping[str, str], value: float) -> ShareSample:
    return ShareSample(
        pod=f"{labels.get('namespace', '')}/{labels.get('pod', '')}",
        container=labels.get("container", ""),
        uuid=labels.get("uuid", ""),
        index=labels.get("gpu", ""),
        used_bytes=value,
    )


def _get(http: httpx2.Client, url: str, **options: Any) -> str:
    """The answer's body, within `MAX_BODY_BYTES` and `DEADLINE_SECONDS` in all. The client's timeout bounds
    each step (connect, each read), which a server sending a byte now and then, in its headers or its body,
    never reaches; so the answer is read in a thread that is given up on at the deadline (a daemon thread:
    the command's exit does not wait for it)."""
    answers: queue.Queue[tuple[str, BaseException | None]] = queue.Queue(maxsize=1)

    def read() -> None:
        try:
            answers.put((_read(http, url, **options), None))
        except BaseException as error:  # handed to the caller, which raises it
            answers.put(("", error))

    threading.Thread(target=read, name=f"read {url}", daemon=True).start()
    try:
        body, error = answers.get(timeout=DEADLINE_SECONDS)
    except queue.Empty:
        raise ValueError(f"answer not complete after {DEADLINE_SECONDS:g} s") from None
    if error is not None:
        raise error
    return body


def _read(http: httpx2.Client, url: str, **options: Any) -> str:
    with http.stream("GET", url, **options) as response:
        if response.has_redirect_location:
            raise ValueError(_redirect(response))
        response.raise_for_status()
        body = bytearray()
        for chunk in response.iter_bytes():
            body += chunk
            if len(body) > MAX_BODY_BYTES:
                raise ValueError(f"answer larger than {MAX_BODY_BYTES // (1024 * 1024)} MiB")
    return body.decode("utf-8", errors="replace")


def _redirect(response: httpx2.Response) -> str:
    """The warning names where the redirect pointed, for the operator to pass that address if it is meant."""
    target = response.next_request.url if response.next_request else response.headers["location"]
    return (
        f"redirected ({response.status_code}) to {target}, not followed: point the flag at the final address"
    )


def _problem(error: Exception) -> str:
    """The error's first line: httpx adds a second (a link to MDN) that would break the warning's one."""
    return printable(str(error).strip().split("\n", 1)[0] or type(error).__name__)


def printable(text: str) -> str:
    """`text` with each character a terminal would act on (an escape sequence, a newline) written as its
    escape (`\\x1b`): a source's words are shown, never obeyed."""
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)


def http_client() -> httpx2.Client:
    """No redirect is followed (`_redirect`): one followed would also be read whole, outside
    `MAX_BODY_BYTES`."""
    return httpx2.Client(timeout=TIMEOUT_SECONDS, follow_redirects=False)
