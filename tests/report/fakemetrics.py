"""A fake node agent /metrics (or Prometheus API): one HTTP server in a thread, answering fixed bodies."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import BinaryIO
from urllib.parse import urlsplit


def share_line(pod: str, used_bytes: int, *, gpu: str = "0", uuid: str = "", namespace: str = "ml") -> str:
    labels = f'namespace="{namespace}",pod="{pod}",container="main",gpu="{gpu}",uuid="{uuid or gpu}"'
    return f"gpufrac_share_memory_used_bytes{{{labels}}} {used_bytes}"


AGENT_HEADER = """# HELP gpufrac_share_memory_used_bytes GPU memory a share uses.
# TYPE gpufrac_share_memory_used_bytes gauge
"""
COUNTERS = """# HELP gpufrac_watchdog_breaches_total Findings handled.
# TYPE gpufrac_watchdog_breaches_total counter
gpufrac_watchdog_breaches_total{reason="GPUMemoryLimitExceeded"} 2.0
# HELP gpufrac_watchdog_actions_total Actions.
# TYPE gpufrac_watchdog_actions_total counter
gpufrac_watchdog_actions_total{action="report"} 2.0
"""


def agent_body(*lines: str) -> str:
    return AGENT_HEADER + "".join(f"{line}\n" for line in lines) + COUNTERS


@contextlib.contextmanager
def serving(bodies: Mapping[str, str | bytes | Callable[[BinaryIO], None]]) -> Iterator[str]:
    """Serve `bodies` by path (a query string is ignored except as `path?query=...` keys); 404 elsewhere.
    A callable body writes the whole answer itself, status line and headers included, as slowly as it likes.
    Yields the base URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            body = bodies.get(self.path, bodies.get(parts.path))
            if body is None:
                self.send_error(404)
                return
            if callable(body):  # the whole answer, status line and headers included
                body(self.wfile)
                return
            data = body.encode() if isinstance(body, str) else body
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
