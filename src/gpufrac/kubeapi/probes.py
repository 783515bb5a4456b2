"""The HTTP routes every long-running gpufrac server answers: `/metrics`, `/healthz` and `/readyz`.

One definition for the scheduler and the webhook, so a probe in the chart means the same thing for both.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


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
