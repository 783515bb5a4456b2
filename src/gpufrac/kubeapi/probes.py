"""The HTTP routes every long-running gpufrac server answers: `/metrics`, `/healthz` and `/readyz`, and how
its server runs (`app_runner`).

One definition for the scheduler and the webhook, so a probe in the chart means the same thing for both.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


class _ProtocolErrorsOnOneLine(logging.Filter):
    """A request aiohttp cannot parse (a garbage request line, a bad header, a line over its limit) is the
    client's mistake, already answered 400; aiohttp logs it as an error with a traceback, which reads as a
    bug of ours. It becomes one warning line here. Any other error, a bug in a handler among them, keeps
    its traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, HttpProcessingError):
            # aiohttp points at the bad byte with a caret on a line of its own: on one line it points nowhere
            detail = " ".join(line.strip() for line in error.message.splitlines() if line.strip(" ^"))
            record.msg, record.args = "%s: answered %d, %s", (record.getMessage(), error.code, detail)
            record.exc_info, record.exc_text = None, None
            if record.levelno > logging.WARNING:
                record.levelno, record.levelname = logging.WARNING, logging.getLevelName(logging.WARNING)
        return True


# For `app_runner`: aiohttp's own `aiohttp.server` is left as it is.
SERVER_LOG = logging.getLogger("gpufrac.http")
SERVER_LOG.addFilter(_ProtocolErrorsOnOneLine())

# A connection that sends nothing, or stops inside a request's headers, is closed after this long; aiohttp
# keeps one for an hour, so that a client could hold thousands open with a few bytes each. Longer than the
# 90 s the apiserver's Go client keeps an idle connection, so that it always closes first: a review it sent
# on a connection the server was closing would fail, and a POST is not sent again.
IDLE_SECONDS = 120.0


def app_runner(app: web.Application, **options: Any) -> web.AppRunner:
    """`web.AppRunner` as every gpufrac server runs one: protocol errors logged on one line (`SERVER_LOG`),
    and stalled connections closed after `IDLE_SECONDS`."""
    return web.AppRunner(app, logger=SERVER_LOG, keepalive_timeout=IDLE_SECONDS, **options)


def add_probe_routes(
    app: web.Application, registry: CollectorRegistry, *, ready: Callable[[], bool] | None = None
) -> None:
    """`GET /metrics` from `registry`, `/healthz`, and `/readyz` for a component that has to sync first."""

    async def serve_metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    app.router.add_get("/metrics", serve_metrics)
    app.router.add_get("/healthz", healthz)
    if ready is not None:
        is_ready = ready

        async def readyz(_: web.Request) -> web.Response:
            return (
                web.Response(text="ok\n") if is_ready() else web.Response(status=503, text="not synced yet\n")
            )

        app.router.add_get("/readyz", readyz)
