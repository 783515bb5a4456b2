"""The HTTP server: routes, metrics, the denial log, answers to garbage, TLS, and a fuzzer that must never
get anything but a well-formed AdmissionReview back."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import gzip
import json
import logging
import ssl
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from gpufrac import admission
from gpufrac.admission import certs, exchange, server
from gpufrac.contract import keys, quantity
from gpufrac.kubeapi import probes

from .reviews import (
    NAME,
    POLICY,
    SCHEDULER,
    TENANT,
    apply_patch,
    configmap,
    container,
    pod,
    review,
    share_pods,
)

Client = TestClient[web.Request, web.Application]
CHART_VALUES = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "gpufrac" / "values.yaml"


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    app = server.build_app(POLICY, registry=CollectorRegistry(), configmap_name=lambda: NAME)
    async with TestClient(TestServer(app)) as test_client:
        yield test_client


async def post(client: Client, endpoint: str, body: bytes | dict[str, Any]) -> dict[str, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = await client.post(f"/{endpoint}", data=data, headers={"Content-Type": "application/json"})
    assert response.status == 200, await response.text()
    answer: dict[str, Any] = await response.json()
    return answer


async def metrics(client: Client) -> str:
    response = await client.get("/metrics")
    assert response.status == 200
    return await response.text()


async def test_mutate_answers_with_a_jsonpatch(client: Client) -> None:
    answer = await post(client, "mutate", review(pod({"gpu-fraction": "0.5"})))
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    response = answer["response"]
    assert response["uid"] == review(None)["request"]["uid"]
    assert response["allowed"] is True and response["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(response["patch"]))
    assert {"op": "add", "path": "/spec/schedulerName", "value": "gpufrac"} in patch
    assert 'gpufrac_webhook_reviews_total{endpoint="mutate",outcome="patched"} 1.0' in await metrics(client)


async def test_a_denial_is_answered_counted_and_logged(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    thief = pod({})
    container(thief)["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    with caplog.at_level(logging.WARNING, logger="gpufrac.webhook"):
        answer = await post(client, "validate", review(thief, user=TENANT))
    response = answer["response"]
    assert response["allowed"] is False
    assert response["status"]["code"] == 403 and response["status"]["reason"] == "Forbidden"
    assert response["status"]["message"].startswith('container "app" sets NVIDIA_VISIBLE_DEVICES')
    text = await metrics(client)
    assert 'gpufrac_webhook_denials_total{endpoint="validate",rule="env"} 1.0' in text
    assert 'gpufrac_webhook_reviews_total{endpoint="validate",outcome="denied"} 1.0' in text
    assert 'gpufrac_webhook_review_seconds_count{endpoint="validate"} 1.0' in text
    [record] = caplog.records
    assert record.getMessage() == (
        "validate denied CREATE pods team/p for user 'tenant' (rule env): " + response["status"]["message"]
    )


async def test_allowed_reviews_are_counted_and_not_logged(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="gpufrac.webhook"):
        answer = await post(client, "validate", review(pod({}), user=SCHEDULER))
    assert answer["response"] == {"uid": review(None)["request"]["uid"], "allowed": True}
    assert not caplog.records
    assert 'gpufrac_webhook_reviews_total{endpoint="validate",outcome="allowed"} 1.0' in await metrics(client)


async def test_healthz(client: Client) -> None:
    response = await client.get("/healthz")
    assert response.status == 200 and await response.text() == "ok\n"


@pytest.mark.parametrize(
    ("body", "uid", "message"),
    [
        (b"", "", "malformed AdmissionReview: not JSON (JSONDecodeError)"),
        (b"\xc3\x28", "", "malformed AdmissionReview: not JSON (UnicodeDecodeError)"),
        (b"[" * 100_000, "", "malformed AdmissionReview: not JSON (RecursionError)"),
        (b"[]", "", "malformed AdmissionReview: not a JSON object"),
        (
            b'{"request": {"uid": 7}}',
            "",
            'malformed AdmissionReview: "request.uid" is missing or not a string',
        ),
        (
            b'{"request": {"uid": "u1", "operation": "EAT"}}',
            "u1",
            "malformed AdmissionReview: \"request.operation\" is 'EAT'",
        ),
        (
            b'{"request": {"uid": "u2", "operation": "CREATE", "resource": {"resource": "pods"}, '
            b'"object": []}}',
            "u2",
            'malformed AdmissionReview: "request.object" is not an object',
        ),
    ],
)
async def test_garbage_gets_a_well_formed_denial(client: Client, body: bytes, uid: str, message: str) -> None:
    for endpoint in server.ENDPOINTS:
        response = (await post(client, endpoint, body))["response"]
        assert response == {
            "uid": uid,
            "allowed": False,
            "status": {"code": 400, "reason": "BadRequest", "message": message},
        }
    assert 'gpufrac_webhook_denials_total{endpoint="mutate",rule="malformed"} 1.0' in await metrics(client)


async def test_a_body_over_the_limit_is_denied_as_unreadable(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    big = json.dumps(review(pod({"filler": "x" * (server.MAX_BODY_BYTES + 10)}))).encode()
    response = (await post(client, "validate", big))["response"]
    assert response["allowed"] is False and response["status"]["code"] == 400


async def test_a_review_of_more_values_than_its_bound_is_denied_unparsed(client: Client) -> None:
    """Parsed, a body of tiny values takes 25 times its size: the webhook's memory is not left to them (the
    message is the count's, made before any parse)."""
    many = {"filler": [{}] * exchange.MAX_JSON_VALUES}
    response = (await post(client, "validate", json.dumps(review(pod(many))).encode()))["response"]
    assert response["allowed"] is False and response["status"]["code"] == 400
    assert "JSON values or more, over the 1,000,000 a review may hold" in response["status"]["message"]


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
async def test_a_body_that_will_not_inflate_is_denied_as_unreadable(client: Client, encoding: str) -> None:
    response = await client.post(
        "/validate", data=b"\x1f\x8b\x08\x00 not compressed", headers={"Content-Encoding": encoding}
    )
    assert response.status == 200
    answer = (await response.json())["response"]
    assert answer["allowed"] is False and answer["status"]["code"] == 400


async def stall_a_body(
    client: Client, length: int = 1000
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A client that stalls after the first byte of its body, its connection left open (the writer kept)."""
    reader, writer = await asyncio.open_connection(client.server.host, client.server.port)
    writer.write(b"POST /validate HTTP/1.1\r\nHost: webhook\r\nContent-Length: %d\r\n\r\n{" % length)
    await writer.drain()
    return reader, writer


async def test_a_small_review_is_answered_while_a_body_trickles_in(client: Client) -> None:
    _, writer = await stall_a_body(client)
    assert (await post(client, "validate", review(pod({}))))["response"]["allowed"] is True
    writer.close()


async def test_a_body_not_sent_in_time_is_denied_as_unreadable(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server, "BODY_READ_SECONDS", 0.05)
    reader, writer = await stall_a_body(client)
    status = await asyncio.wait_for(reader.readline(), 10)  # without a read timeout, never answered
    assert status.startswith(b"HTTP/1.1 200")
    while await reader.readline() != b"\r\n":
        pass
    answer = json.loads(await reader.readuntil(b"}}}"))["response"]
    assert answer["allowed"] is False and answer["status"]["code"] == 400
    writer.close()


async def test_large_reviews_past_the_slots_are_refused_unread(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slow clients each sending a large body held up to 8 MiB apiece, as many as came."""
    monkeypatch.setattr(server, "SLOT_WAIT_SECONDS", 0.01)
    reads: asyncio.Queue[None] = asyncio.Queue()
    read_body = server._read_body

    async def counted(http: web.Request) -> bytes:
        reads.put_nowait(None)
        return await read_body(http)

    monkeypatch.setattr(server, "_read_body", counted)
    large = pod({})
    container(large)["args"] = ["x" * server.INLINE_BYTES]
    stalled = [await stall_a_body(client, server.INLINE_BYTES + 1) for _ in range(server.LARGE_REVIEWS)]
    for _ in stalled:
        await asyncio.wait_for(reads.get(), 10)  # each is being read, and holds a slot

    refused = (await post(client, "validate", review(large)))["response"]
    assert reads.empty()  # refused unread
    assert refused["uid"] == "" and refused["allowed"] is False and refused["status"]["code"] == 429
    assert 'gpufrac_webhook_denials_total{endpoint="validate",rule="busy"} 1.0' in await metrics(client)
    assert (await post(client, "validate", review(pod({}))))["response"]["allowed"] is True  # small: no slot

    reader, writer = stalled[0]
    writer.write(b" " * server.INLINE_BYTES)  # its body complete (and not JSON), its slot is free again
    assert (await asyncio.wait_for(reader.readline(), 10)).startswith(b"HTTP/1.1 200")
    assert (await post(client, "validate", review(large)))["response"]["allowed"] is True
    for _, writer in stalled:
        writer.close()


def test_the_large_reviews_in_flight_take_a_quarter_of_the_charts_memory_limit_at_most() -> None:
    """The bound was chosen from the chart's limit: a smaller limit needs a smaller bound."""
    values = yaml.safe_load(CHART_VALUES.read_text())
    limit = quantity.parse_quantity(values["webhook"]["resources"]["limits"]["memory"])
    held = server.LARGE_REVIEWS * 2 * server.MAX_BODY_BYTES  # each body, and aiohttp's buffer of it
    assert held <= limit / 4


async def test_a_bug_in_a_rule_still_gets_an_answer(
    client: Client, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: object, **kwargs: object) -> exchange.Decision:
        raise KeyError("bug")

    monkeypatch.setattr(admission, "decide", broken)
    response = (await post(client, "validate", review(pod({}))))["response"]
    assert response["uid"] == review(None)["request"]["uid"]
    assert response["allowed"] is False and response["status"]["code"] == 500
    assert response["status"]["reason"] == "InternalError"
    assert "internal error in the gpufrac webhook" in response["status"]["message"]
    assert any(record.exc_info for record in caplog.records)


@contextlib.asynccontextmanager
async def serving(tmp_path: Path) -> AsyncIterator[tuple[str, ssl.SSLContext]]:
    """`server.serve` over TLS on a free port, as the CLI runs it: its URL and a context that trusts it."""
    bundle = certs.generate(["127.0.0.1", "localhost"])
    certs.write(bundle, cert=tmp_path / "tls.crt", key=tmp_path / "tls.key", ca=tmp_path / "ca.crt")
    stop = asyncio.Event()
    ports: list[int] = []
    task = asyncio.create_task(
        server.serve(
            POLICY,
            tls_cert=tmp_path / "tls.crt",
            tls_key=tmp_path / "tls.key",
            host="127.0.0.1",
            port=0,
            stop=stop,
            listening=lambda host, port: ports.append(port),
        )
    )
    try:
        while not ports:
            await asyncio.sleep(0.01)
        yield f"https://localhost:{ports[0]}", ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def test_serves_tls_and_stops(tmp_path: Path) -> None:
    async with serving(tmp_path) as (url, trust), aiohttp.ClientSession() as session:
        async with session.get(f"{url}/healthz", ssl=trust) as response:
            assert response.status == 200
        async with session.post(f"{url}/validate", json=review(pod({})), ssl=trust) as response:
            assert (await response.json())["response"]["allowed"] is True
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await session.get(f"{url}/healthz", ssl=ssl.create_default_context())


async def test_a_compressed_body_is_not_inflated_but_denied(tmp_path: Path) -> None:
    packed = gzip.compress(json.dumps(review(pod({}))).encode())
    async with serving(tmp_path) as (url, trust), aiohttp.ClientSession() as session:
        headers = {"Content-Encoding": "gzip"}
        async with session.post(f"{url}/validate", data=packed, headers=headers, ssl=trust) as response:
            answer = (await response.json())["response"]
    assert answer["allowed"] is False
    assert answer["status"]["message"] == "malformed AdmissionReview: not JSON (UnicodeDecodeError)"


MALFORMED_HTTP = {
    "a garbage request line": b"GARBAGE\r\n\r\n",
    "a header without a colon": b"POST /validate HTTP/1.1\r\nHost: webhook\r\nBad Header\r\n\r\n",
    "a header line over the limit": b"POST /validate HTTP/1.1\r\nX: " + b"a" * 9000 + b"\r\n\r\n",
    "a length that is no number": b"POST /validate HTTP/1.1\r\nHost: webhook\r\nContent-Length: x\r\n\r\n",
}


async def send_raw(url: str, trust: ssl.SSLContext, data: bytes) -> bytes:
    """The status line `serving`'s server answers to `data`, sent as it is over TLS."""
    port = int(url.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=trust, server_hostname="localhost")
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(reader.readline(), 10)
    finally:
        writer.close()


@pytest.mark.parametrize("data", MALFORMED_HTTP.values(), ids=MALFORMED_HTTP.keys())
async def test_malformed_http_is_answered_400_and_logged_on_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, data: bytes
) -> None:
    """aiohttp logged each as an error with a traceback, which reads as a bug of ours."""
    caplog.set_level(logging.DEBUG)
    async with serving(tmp_path) as (url, trust):
        status = await send_raw(url, trust, data)
    assert status.startswith(b"HTTP/1.0 400")
    told = [record for record in caplog.records if "answered 400" in record.getMessage()]
    assert len(told) == 1 and "\n" not in told[0].getMessage() and told[0].levelno <= logging.WARNING
    assert not [record for record in caplog.records if record.exc_info or record.exc_text]


@pytest.mark.parametrize(
    "data", [b"", b"POST /validate HTTP/1.1\r\nHost: webhook\r\n"], ids=["idle", "headers"]
)
async def test_a_connection_that_stalls_is_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data: bytes
) -> None:
    """aiohttp keeps such a connection an hour: thousands would hold the webhook's sockets and memory."""
    monkeypatch.setattr(probes, "IDLE_SECONDS", 0.2)
    async with serving(tmp_path) as (url, trust):
        assert await send_raw(url, trust, data) == b""  # closed, unanswered, well before send_raw gives up


async def test_a_bug_in_a_handler_keeps_its_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def broken(_: web.Request) -> bytes:
        raise KeyError("bug")

    monkeypatch.setattr(server, "_read_body", broken)
    async with serving(tmp_path) as (url, trust):
        status = await send_raw(url, trust, b"POST /validate HTTP/1.1\r\nHost: webhook\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 500")
    [record] = [record for record in caplog.records if record.exc_info]
    assert record.levelno == logging.ERROR and isinstance(record.exc_info[1], KeyError)


async def test_a_certificate_that_will_not_load_is_a_user_error(tmp_path: Path) -> None:
    (tmp_path / "tls.crt").write_text("not a certificate")
    with pytest.raises(server.UserError, match="cannot load them"):
        server.tls_context(tmp_path / "tls.crt", tmp_path / "missing.key")


# Fuzzing: whatever the body, an AdmissionReview comes back, with the uid where there is one to read.

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
junk = st.one_of(json_values, st.just(None))


def maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly the strategy, sometimes any JSON value instead."""
    return st.one_of(strategy, strategy, strategy, json_values)


annotation_keys = st.sampled_from(
    [
        *sorted(keys.POD_KEYS),
        keys.ENV_CONFIGMAP_ANNOTATION,
        *(f"{keys.CONTAINER_PREFIX}app.{suffix}" for suffix in keys.CONTAINER_SUFFIXES),
        "nvidia.com/container.side.gpu-memory.request",
        "nvidia.com/container.x.bogus",
        "team",
    ]
)
annotation_values = st.sampled_from(
    [
        "0.5",
        "1.5",
        "0",
        "8Gi",
        "9Gi",
        "512",
        "sm-sharing",
        "time-slicing",
        " ",
        "GPU-1",
        "GPU-1,GPU-2",
        "2",
        "app",
        "side",
        "gpufrac-env-abc",
        NAME,
        "",
    ]
)
env_names = st.sampled_from(
    ["A", "NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "CUDA_MPS_X", "NVIDIA_GPU_MEMORY_LIMIT"]
)
configmap_names = st.sampled_from(["settings", "gpufrac-env-abc-app", f"{NAME}-app", f"{NAME}-side"])
containers = st.fixed_dictionaries(
    {"name": maybe(st.sampled_from(["app", "side"]))},
    optional={
        "env": maybe(
            st.lists(
                st.fixed_dictionaries(
                    {"name": maybe(env_names)},
                    optional={
                        "valueFrom": maybe(
                            st.fixed_dictionaries(
                                {
                                    "configMapKeyRef": maybe(
                                        st.fixed_dictionaries({"name": maybe(configmap_names)})
                                    )
                                }
                            )
                        )
                    },
                ),
                max_size=2,
            )
        ),
        "envFrom": maybe(
            st.lists(
                st.fixed_dictionaries(
                    {"configMapRef": maybe(st.fixed_dictionaries({"name": maybe(configmap_names)}))}
                ),
                max_size=2,
            )
        ),
        "resources": maybe(
            st.fixed_dictionaries(
                {
                    "limits": maybe(
                        st.fixed_dictionaries({"nvidia.com/gpu": maybe(st.sampled_from(["1", "2", "0.5"]))})
                    )
                }
            )
        ),
        "securityContext": maybe(st.fixed_dictionaries({"privileged": maybe(st.booleans())})),
        "volumeMounts": maybe(
            st.lists(st.fixed_dictionaries({"name": st.just("m"), "mountPath": st.just("/m")}), max_size=1)
        ),
    },
)
pods = st.fixed_dictionaries(
    {
        "metadata": maybe(
            st.fixed_dictionaries(
                {"name": maybe(st.just("p"))},
                optional={
                    "annotations": maybe(
                        st.dictionaries(annotation_keys, maybe(annotation_values), max_size=5)
                    ),
                    "labels": maybe(
                        st.dictionaries(st.sampled_from([keys.ENV_CONFIGMAP_LABEL, "a"]), st.just("true"))
                    ),
                },
            )
        ),
        "spec": maybe(
            st.fixed_dictionaries(
                {"containers": maybe(st.lists(containers, max_size=3))},
                optional={
                    "schedulerName": maybe(
                        st.sampled_from(["default-scheduler", "gpufrac", "kai-scheduler"])
                    ),
                    "nodeName": maybe(st.just("node-1")),
                    "volumes": maybe(
                        st.lists(
                            st.fixed_dictionaries(
                                {
                                    "name": maybe(st.sampled_from(["gpufrac-mps", "v"])),
                                    "hostPath": maybe(
                                        st.fixed_dictionaries(
                                            {
                                                "path": maybe(
                                                    st.sampled_from(["/run/gpufrac/mps", "/var/log", "/"])
                                                )
                                            }
                                        )
                                    ),
                                }
                            ),
                            max_size=2,
                        )
                    ),
                    "ephemeralContainers": maybe(st.lists(containers, max_size=1)),
                },
            )
        ),
    }
)
requests = st.fixed_dictionaries(
    {
        "uid": maybe(st.text(min_size=1, max_size=10)),
        "operation": maybe(st.sampled_from(["CREATE", "UPDATE", "DELETE", "CONNECT"])),
        "resource": maybe(
            st.fixed_dictionaries(
                {
                    "group": maybe(st.sampled_from(["", "apps"])),
                    "resource": maybe(st.sampled_from(["pods", "configmaps", "deployments"])),
                }
            )
        ),
        "userInfo": maybe(
            st.fixed_dictionaries({"username": maybe(st.sampled_from([TENANT, SCHEDULER, ""]))})
        ),
    },
    optional={
        "subResource": maybe(st.sampled_from(["", "status", "ephemeralcontainers"])),
        "namespace": maybe(st.sampled_from(["team", "kube-system", ""])),
        "name": maybe(st.sampled_from(["p", "gpufrac-env-abc-app", ""])),
        "object": st.one_of(pods, junk),
        "oldObject": st.one_of(pods, junk),
    },
)
# Valid pods under every operation, user and endpoint: the webhook's ordinary traffic, patched or not.
ordinary = st.builds(
    lambda obj, operation, user, namespace: review(
        obj, operation=operation, user=user, namespace=namespace, old=obj if operation == "UPDATE" else None
    ),
    share_pods(),
    st.sampled_from(["CREATE", "UPDATE"]),
    st.sampled_from([TENANT, SCHEDULER]),
    st.sampled_from(["team", "kube-system"]),
)
bodies = st.one_of(
    st.binary(max_size=300),
    ordinary.map(lambda value: json.dumps(value).encode()),
    json_values.map(lambda value: json.dumps(value).encode()),
    st.fixed_dictionaries(
        {
            "apiVersion": st.just(exchange.API_VERSION),
            "kind": st.just("AdmissionReview"),
            "request": maybe(requests),
        }
    ).map(lambda value: json.dumps(value).encode()),
)


def expected_uid(body: bytes) -> str:
    try:
        request = json.loads(body)["request"]
        uid = request["uid"]
    except (ValueError, TypeError, KeyError, IndexError, RecursionError):
        return ""
    return uid if isinstance(uid, str) else ""


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies, endpoint=st.sampled_from(server.ENDPOINTS))
async def test_fuzz_every_body_gets_a_well_formed_review(client: Client, body: bytes, endpoint: str) -> None:
    answer = await post(client, endpoint, body)
    assert set(answer) == {"apiVersion", "kind", "response"}
    assert (answer["apiVersion"], answer["kind"]) == (exchange.API_VERSION, "AdmissionReview")
    response = answer["response"]
    assert response["uid"] == expected_uid(body)
    assert isinstance(response["allowed"], bool)
    event("patched" if "patch" in response else "allowed" if response["allowed"] else "denied")
    if not response["allowed"]:
        status = response["status"]
        assert status["code"] in (400, 403) and isinstance(status["message"], str) and status["message"]
    if "patch" in response:
        assert endpoint == "mutate" and response["patchType"] == "JSONPatch"
        obj = json.loads(body)["request"]["object"]
        apply_patch(obj, json.loads(base64.b64decode(response["patch"])))


async def test_a_large_review_is_decided_in_a_worker_and_answered_like_a_small_one(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[bool] = []
    decide = admission.decide

    def watched(*args: Any, **kwargs: Any) -> exchange.Decision:
        seen.append(threading.current_thread() is threading.main_thread())
        return decide(*args, **kwargs)

    monkeypatch.setattr(admission, "decide", watched)
    thief = pod({})
    container(thief)["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    small = (await post(client, "validate", review(thief)))["response"]
    container(thief)["args"] = ["x" * server.INLINE_BYTES]
    large = (await post(client, "validate", review(thief)))["response"]
    assert seen == [True, False]
    assert large == small and large["allowed"] is False


async def test_the_path_says_the_tier_and_the_plain_one_is_the_untrusted(client: Client) -> None:
    sm = pod({"gpu-fraction": "0.5", "nvidia.com/container.app.gpu-compute.mode": "sm-sharing"})
    untrusted = (await post(client, "validate", review(sm)))["response"]
    trusted = (await post(client, "validate/trusted", review(sm)))["response"]
    assert untrusted["allowed"] is False and "is not trusted" in untrusted["status"]["message"]
    assert trusted["allowed"] is True
    assert (await post(client, "mutate/trusted", review(sm)))["response"]["allowed"] is True


def _values(node: object) -> int:
    """The values in a parsed JSON document, keys included."""
    if isinstance(node, dict):
        return 1 + sum(1 + _values(child) for child in node.values())
    if isinstance(node, list):
        return 1 + sum(_values(child) for child in node)
    return 1


@given(document=json_values)
def test_the_values_counted_are_at_least_those_parsed(document: Any) -> None:
    for compact in (True, False):
        separators = (",", ":") if compact else (", ", ": ")
        body = json.dumps(document, separators=separators).encode()
        assert exchange.json_values(body) >= _values(json.loads(body))


def test_commas_inside_strings_are_not_values() -> None:
    """A ConfigMap of CSV under the 1 MiB an object may hold has a million commas; its update carries it
    twice (object and oldObject), and was refused as a review of too many values."""
    csv = "\n".join(",".join("0" for _ in range(100)) for _ in range(5100))  # 1,020,000 bytes
    old = configmap("thresholds", namespace="team") | {"data": {"table.csv": csv}}
    new = copy.deepcopy(old)
    new["metadata"]["labels"] = {"app": "x"}
    body = json.dumps(review(new, operation="UPDATE", resource="configmaps", old=old, name="thresholds"))
    assert exchange.json_values(body.encode()) < 100
    escaped = r'{"a\\": "b\", c", "d": [1, 2]}'  # a string ending in a backslash, one holding a quote
    assert exchange.json_values(escaped.encode()) == _values(json.loads(escaped))


def test_a_string_never_closed_is_read_in_one_pass() -> None:
    """Matched only up to a closing quote, a string never closed made every later quote start a scan to the
    end of the body: a 64 KiB body of escaped quotes took seconds, decided on the event loop. It is now one
    match to the end (so one value), as the parse that follows refuses it."""
    assert exchange.json_values(b'"' + b'\\"' * 32_000) == 1
    assert exchange.json_values(b'{"a": [1, 2], "b": "x, y') == 7  # the comma in the open string is not one
