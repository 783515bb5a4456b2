"""`gpufrac webhook`: the HTTPS server around `admission`, with its metrics and the log of every denial.

The server is the edge: it reads bodies, draws the random env ConfigMap names, times and counts, logs and
serves TLS. Every decision is `admission`'s. Whatever arrives, `/mutate` and `/validate` answer HTTP 200
with a well-formed AdmissionReview: a body that cannot be read, and even a bug in a rule, become a denial
(the webhook fails closed, like its `failurePolicy: Fail`), so the apiserver shows the tenant a reason
rather than "an error on the server".
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import ssl
import time
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import lightkube
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram

from gpufrac import admission
from gpufrac.admission import exchange, settings
from gpufrac.admission.tls_gate import TlsGate
from gpufrac.contract import keys
from gpufrac.contract.queues import QueueSpec
from gpufrac.errors import UserError
from gpufrac.kubeapi.client import async_client
from gpufrac.kubeapi.custom import Index, queue_index
from gpufrac.kubeapi.probes import add_probe_routes, app_runner
from gpufrac.stopping import stop_on_signals

log = logging.getLogger("gpufrac.webhook")

# An AdmissionReview holds the object and the old one, each at most the apiserver's 3 MiB request limit;
# a bigger body is answered as unreadable, and denied.
MAX_BODY_BYTES = 8 * 1024 * 1024
# A body still arriving this long after its headers belongs to no live review (the apiserver gives up on a
# webhook after at most 30 s): it is answered as unreadable, so that a client trickling bytes cannot hold a
# connection and up to `MAX_BODY_BYTES` of buffer for ever.
BODY_READ_SECONDS = 30.0
# A review bigger than this is read and decided in a worker thread, so that the event loop keeps answering
# the others while it runs (every rule is linear in the pod, but a 6 MiB pod still takes a while); smaller
# ones, nearly all, are decided inline, which is quicker than a hand-off.
INLINE_BYTES = 64 * 1024
# Worker threads for big reviews: one, since more would only queue for the same interpreter lock while
# each held a parsed review (up to `exchange.MAX_JSON_VALUES`, about 60 MiB) in memory at once.
WORKERS = 1
# Reviews over `INLINE_BYTES` (or of no stated length) read or decided at once. Each holds its body until
# it is answered, up to `MAX_BODY_BYTES` twice over while it is read (aiohttp's buffer of it, then the
# bytes joined), so 4 hold at most 64 MiB: a quarter of the 256 MiB the chart gives the webhook
# (`webhook.resources`), the rest being the process's own (about 50 MiB) and the reviews being decided,
# several times their body once parsed. Without a bound, slow clients each sending 8 MiB could hold any
# multiple of it. Small reviews, nearly all, take no slot: a client trickling large bodies cannot hold
# them up, and until its body is read aiohttp buffers under 1 MiB of it.
LARGE_REVIEWS = 4
# How long a large review waits for a slot before it is refused, unread: a moment, so that one arriving
# as another ends is taken, and well within the apiserver's timeout for the webhook (the chart's 5 s).
SLOT_WAIT_SECONDS = 1.0
CERT_RELOAD_SECONDS = 30.0
ENDPOINTS = ("mutate", "validate")


def new_configmap_name() -> str:
    """A fresh env ConfigMap name: 64 random bits, so no pod can guess another's before it is made."""
    return f"{keys.ENV_CONFIGMAP_PREFIX}{secrets.token_hex(8)}"


class Metrics:
    """The webhook's Prometheus metrics, in a registry of its own (tests make one per app)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.reviews = Counter(
            "gpufrac_webhook_reviews",
            "AdmissionReviews answered, by endpoint and outcome (allowed, patched, denied).",
            ["endpoint", "outcome"],
            registry=registry,
        )
        self.denials = Counter(
            "gpufrac_webhook_denials",
            "AdmissionReviews denied, by endpoint and the rule broken.",
            ["endpoint", "rule"],
            registry=registry,
        )
        self.seconds = Histogram(
            "gpufrac_webhook_review_seconds",
            "Time from a review's body read to its answer, by endpoint.",
            ["endpoint"],
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
            registry=registry,
        )


@dataclass
class _Handlers:
    policy: settings.Policy
    metrics: Metrics
    configmap_name: Callable[[], str]
    workers: ThreadPoolExecutor
    slots: asyncio.Semaphore  # `LARGE_REVIEWS`
    queues: Index[QueueSpec] | None = None  # the Queue objects, when the server watches them

    async def mutate(self, request: web.Request) -> web.Response:
        return await self._review(request, "mutate", trusted_namespace=False)

    async def validate(self, request: web.Request) -> web.Response:
        return await self._review(request, "validate", trusted_namespace=False)

    async def mutate_trusted(self, request: web.Request) -> web.Response:
        return await self._review(request, "mutate", trusted_namespace=True)

    async def validate_trusted(self, request: web.Request) -> web.Response:
        return await self._review(request, "validate", trusted_namespace=True)

    async def _review(self, http: web.Request, endpoint: str, *, trusted_namespace: bool) -> web.Response:
        async with self._slot(http) as taken:
            if not taken:  # unread, so its uid is unknown, as an unreadable body's
                refused = exchange.busy(LARGE_REVIEWS)
                return self._answered(endpoint, None, refused, _reply("", refused))
            body = await _read_body(http)
            started = time.perf_counter()
            name = self.configmap_name()
            known = dict(self.queues.specs) if self.queues is not None else None
            if len(body) > INLINE_BYTES:
                loop = asyncio.get_running_loop()
                request, decision, reply = await loop.run_in_executor(
                    self.workers, _answer, body, endpoint, self.policy, name, trusted_namespace, known
                )
            else:
                request, decision, reply = _answer(
                    body, endpoint, self.policy, name, trusted_namespace, known
                )
            self.metrics.seconds.labels(endpoint).observe(time.perf_counter() - started)
        return self._answered(endpoint, request, decision, reply)

    @contextlib.asynccontextmanager
    async def _slot(self, http: web.Request) -> AsyncIterator[bool]:
        """Whether a slot came free within `SLOT_WAIT_SECONDS`, for a body that may be large. It is held until
        the review is answered, so that a body read and waiting for a worker counts too."""
        if http.content_length is not None and http.content_length <= INLINE_BYTES:
            yield True
            return
        try:
            async with asyncio.timeout(SLOT_WAIT_SECONDS):
                await self.slots.acquire()
        except TimeoutError:
            yield False
            return
        try:
            yield True
        finally:
            self.slots.release()

    def _answered(
        self, endpoint: str, request: exchange.Request | None, decision: exchange.Decision, reply: bytes
    ) -> web.Response:
        outcome = "denied" if not decision.allowed else "patched" if decision.patch else "allowed"
        self.metrics.reviews.labels(endpoint, outcome).inc()
        if not decision.allowed:
            self.metrics.denials.labels(endpoint, decision.rule).inc()
            _log_denial(endpoint, request, decision)
        return web.Response(body=reply, content_type="application/json")


async def _read_body(http: web.Request) -> bytes:
    """The request's body, or none (denied as unreadable) when it is over the limit, aiohttp cannot read it
    (such as a corrupt gzip, where a runner inflates bodies; `serve`'s does not) or it is not all sent in
    time."""
    try:
        async with asyncio.timeout(BODY_READ_SECONDS):
            return await http.read()
    except (web.HTTPRequestEntityTooLarge, web.RequestPayloadError, TimeoutError):
        return b""


def _answer(
    body: bytes,
    endpoint: str,
    policy: settings.Policy,
    configmap_name: str,
    trusted_namespace: bool,
    queues: Mapping[str, QueueSpec] | None,
) -> tuple[exchange.Request | None, exchange.Decision, bytes]:
    """The review read, decided and answered: pure but for the log of a bug, so it may run in a thread."""
    request = None
    try:
        request = exchange.read_review(body)
    except exchange.MalformedReview as error:
        decision = exchange.malformed(error)
        uid = error.uid
    else:
        uid = request.uid
        try:
            decision = admission.decide(
                request,
                endpoint=endpoint,
                policy=policy,
                configmap_name=configmap_name,
                trusted_namespace=trusted_namespace,
                queues=queues,
            )
        except Exception:  # a bug in a rule must still get an answer, and a closed door
            log.exception("%s: error deciding %s", endpoint, request.uid)
            decision = exchange.Decision(
                False,
                "internal error in the gpufrac webhook; its log has the details",
                "internal",
                code=500,
            )
    return request, decision, _reply(uid, decision)


def _reply(uid: str, decision: exchange.Decision) -> bytes:
    return json.dumps(exchange.review_response(uid, decision)).encode()


def _log_denial(endpoint: str, request: exchange.Request | None, decision: exchange.Decision) -> None:
    if request is None:
        log.warning(
            "%s denied a review it could not read (rule %s): %s", endpoint, decision.rule, decision.message
        )
        return
    log.warning(
        "%s denied %s %s %s for user %r (rule %s): %s",
        endpoint,
        request.operation,
        request.resource + (f"/{request.sub_resource}" if request.sub_resource else ""),
        request.target,
        request.user,
        decision.rule,
        decision.message,
    )


def build_app(
    policy: settings.Policy,
    *,
    registry: CollectorRegistry | None = None,
    configmap_name: Callable[[], str] = new_configmap_name,
    queues: Index[QueueSpec] | None = None,
) -> web.Application:
    """The aiohttp application: `POST /mutate` and `/validate` (the untrusted tier), `/mutate/trusted` and
    `/validate/trusted` (namespaces labelled `settings.TRUST_LABEL`), `GET /healthz`, `GET /metrics`."""
    workers = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="gpufrac-review")
    metrics = Metrics(registry or CollectorRegistry())
    handlers = _Handlers(policy, metrics, configmap_name, workers, asyncio.Semaphore(LARGE_REVIEWS), queues)
    app = web.Application(client_max_size=MAX_BODY_BYTES)

    async def stop_workers(_: web.Application) -> AsyncIterator[None]:
        yield
        workers.shutdown(wait=False, cancel_futures=True)

    app.cleanup_ctx.append(stop_workers)
    app.add_routes(
        [
            web.post("/mutate", handlers.mutate),
            web.post("/validate", handlers.validate),
            web.post("/mutate/trusted", handlers.mutate_trusted),
            web.post("/validate/trusted", handlers.validate_trusted),
        ]
    )
    add_probe_routes(app, handlers.metrics.registry)
    return app


def tls_context(cert: Path, key: Path) -> ssl.SSLContext:
    """A server context for the certificate and key; TLS 1.2 at least, as the apiserver speaks."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        _load_chain(context, cert, key)
    except (OSError, ssl.SSLError) as error:
        raise UserError(
            f"--tls-cert {cert} / --tls-key {key}: cannot load them ({error}); pass a PEM certificate and "
            "the PEM key it was made for"
        ) from None
    return context


def _load_chain(context: ssl.SSLContext, cert: Path, key: Path) -> None:
    """The certificate and key into `context`; a path there that is not a file is refused first, since
    OpenSSL opens it blocking: a pipe (a FIFO, a process substitution) waited for a writer for ever, on the
    event loop and deaf to SIGTERM."""
    for path in (cert, key):
        if path.exists() and not path.is_file():  # a missing one is OpenSSL's to name
            raise OSError(f"{path} is not a file")
    context.load_cert_chain(cert, key)


async def _reload_certificates(context: ssl.SSLContext, cert: Path, key: Path) -> None:
    """Load the certificate again when its files change (cert-manager renews it in the mounted Secret);
    new connections get the new one, open ones keep theirs."""

    def stamp() -> tuple[float, float]:
        return cert.stat().st_mtime, key.stat().st_mtime

    seen = stamp()
    while True:
        await asyncio.sleep(CERT_RELOAD_SECONDS)
        try:
            now = stamp()
            if now != seen:
                _load_chain(context, cert, key)
                seen = now
                log.info("reloaded the TLS certificate from %s", cert)
        except (OSError, ssl.SSLError) as error:  # half-written during a renewal: try again next round
            log.warning("could not reload the TLS certificate from %s: %s", cert, error)


async def serve(
    policy: settings.Policy,
    *,
    tls_cert: Path,
    tls_key: Path,
    host: str,
    port: int,
    stop: asyncio.Event,
    listening: Callable[[str, int], None] | None = None,
    registry: CollectorRegistry | None = None,
    queue_client: lightkube.AsyncClient | None = None,
) -> None:
    """Serve over HTTPS until `stop` is set; `listening(host, port)` is called once it accepts. With a
    `queue_client`, Queue objects are watched, so that a new one is checked against the others."""
    context = tls_context(tls_cert, tls_key)
    queues = queue_index() if queue_client is not None else None
    app = build_app(policy, registry=registry, queues=queues)
    # The apiserver sends reviews uncompressed, so no body is inflated: aiohttp would otherwise inflate a
    # `Content-Encoding: gzip` body on the event loop, and drain the rest of one refused over the limit, so
    # that a 2 MiB gzip of zeros stalled every other review for seconds. Compressed, a body is not JSON.
    runner = app_runner(app, access_log=None, handle_signals=False, auto_decompress=False)
    await runner.setup()
    assert runner.server is not None  # made by `setup`
    gate = TlsGate(runner.server, context)
    watching = asyncio.create_task(queues.watch(queue_client)) if queues and queue_client else None
    listener: asyncio.Server | None = None
    try:
        try:
            listener = await asyncio.get_running_loop().create_server(gate, host, port)
        except OSError as error:
            raise UserError(
                f"--host {host} --port {port}: cannot listen ({error}); "
                "give an address of this machine and a free port"
            ) from None
        for sock in listener.sockets:
            address = sock.getsockname()
            (listening or _print_address)(address[0], address[1])
        reload = asyncio.create_task(_reload_certificates(context, tls_cert, tls_key))
        await stop.wait()
        reload.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reload
    finally:
        if listener is not None:
            listener.close()
        gate.close()
        if watching is not None:
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching
        await runner.cleanup()


def _print_address(host: str, port: int) -> None:
    # Printed, not only logged, so that a person or a test running `--port 0` learns the port.
    print(f"gpufrac webhook: serving on https://{host}:{port}", flush=True)


def run(
    policy: settings.Policy,
    *,
    tls_cert: Path,
    tls_key: Path,
    host: str,
    port: int,
    queue_config: lightkube.KubeConfig | None = None,
) -> None:
    """Serve until SIGTERM or SIGINT; the CLI's entry point. With `queue_config`, watch Queue objects."""

    async def main() -> None:
        client = async_client(queue_config, field_manager="gpufrac-webhook") if queue_config else None
        try:
            await serve(
                policy,
                tls_cert=tls_cert,
                tls_key=tls_key,
                host=host,
                port=port,
                stop=stop_on_signals(),
                queue_client=client,
            )
        finally:
            if client is not None:
                await client.close()

    asyncio.run(main())
