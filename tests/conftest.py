"""Fixtures every part of the suite may use."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from hypothesis import settings

# Property tests judge what code does, never how long it takes: Hypothesis's default 200 ms deadline per
# example is a wall-clock assertion, which a busy 2-core machine fails now and then.
settings.register_profile("gpufrac", deadline=None)
settings.load_profile("gpufrac")


@pytest.fixture(
    params=[
        (404, "text/html", b"<html></html>"),
        (404, None, b"<html></html>"),
        (200, "text/html", b"<html></html>"),
        (200, "application/json", b"[1, 2]"),
        (404, "application/json", b'"no such path"'),
        (500, "application/json", b"Internal Server Error"),
    ],
    ids=["404-html", "404-bare", "200-html", "200-json-array", "404-json-string", "500-not-json"],
)
def not_kubernetes(request: pytest.FixtureRequest) -> Iterator[str]:
    """A web server that is not an API server (a wrong port, a proxy's page, another service's JSON API):
    its URL."""
    status, content_type, body = request.param

    class Answer(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status)
            if content_type:
                self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
