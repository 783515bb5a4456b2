"""The webhook's listener: TCP connections accepted up to `MAX_CONNECTIONS` open at once, each then secured
with TLS and served by aiohttp.

asyncio's own TLS server gives every accepted connection a 256 KiB buffer before a byte is read, so a pod
that opened a thousand connections and sent nothing took 300 MiB of the webhook: past the chart's 256 MiB
it was killed, and every pod it guards was refused while it restarted. Here a connection is counted from
its accept to its close, and a handshake that does not finish within `HANDSHAKE_SECONDS` is dropped.

A full webhook must still take the apiserver's next connection (and the kubelet's probe), or whoever holds
the slots holds admission. So at the cap the connection that goes is the oldest of the peer (address) that
holds the most: one pod opening connections by the hundred only ever displaces its own, while the
apiserver, which keeps a few, always gets in (and were it the one holding the most, its oldest, most likely
idle, would go rather than its newest be refused).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections import Counter

from aiohttp import web

log = logging.getLogger("gpufrac.webhook")

# Connections open at once, those still in their TLS handshake included: some 300 KiB each, so these hold
# under 40 MiB of the chart's 256. The apiserver sends a review at a time on a connection, each answered in
# a millisecond or two, so it keeps far fewer open.
MAX_CONNECTIONS = 128
# Longer than any client on a live network needs, far shorter than asyncio's 60 s.
HANDSHAKE_SECONDS = 10.0
# Errors of a handshake that did not finish: the peer went, sent no TLS, or took too long.
HANDSHAKE_ERRORS = (OSError, ssl.SSLError, ConnectionError, TimeoutError)


class TlsGate:
    """A protocol factory for `loop.create_server` (without `ssl`): see the module."""

    def __init__(self, server: web.Server, context: ssl.SSLContext, *, most: int = MAX_CONNECTIONS) -> None:
        self.server, self.context, self.most = server, context, most
        self.open: dict[_Connection, None] = {}  # oldest first
        self.securing: set[asyncio.Task[None]] = set()  # held, as the loop holds tasks only weakly
        self.per_peer: Counter[str] = Counter()
        self.closing = False
        self.turned = 0  # connections closed at the cap

    def __call__(self) -> asyncio.Protocol:
        return _Connection(self)

    def admit(self, connection: _Connection) -> bool:
        """Count `connection` in, displacing another if the webhook is full; False to refuse it (stopping)."""
        if self.closing:
            return False
        if len(self.open) >= self.most:
            heaviest = max(self.per_peer.values())
            victim = next(other for other in self.open if self.per_peer[other.peer] == heaviest)
            self.turned += 1
            if self.turned == 1 or self.turned % 1000 == 0:
                log.warning(
                    "%d connection(s) closed to let others in: %d open, the most the webhook keeps, %d of "
                    "them from %s",
                    *(self.turned, self.most, heaviest, victim.peer),
                )
            victim.drop()
        self.open[connection] = None
        self.per_peer[connection.peer] += 1
        return True

    def forget(self, connection: _Connection) -> None:
        if connection in self.open:
            del self.open[connection]
            self.per_peer[connection.peer] -= 1
            if not self.per_peer[connection.peer]:
                del self.per_peer[connection.peer]

    def close(self) -> None:
        """Drop the connections still in their handshake, and take no more (those served are the runner's
        to close)."""
        self.closing = True
        for connection in list(self.open):
            if connection.handler is None:
                connection.drop()


class _Connection(asyncio.Protocol):
    """One connection from its accept to its close: secured, then relaying to aiohttp's handler what its
    transport tells, so that the gate learns of its close. What arrives between the end of the handshake and
    the hand-over (the first request, often in the same packet) is kept and given to the handler after."""

    def __init__(self, gate: TlsGate) -> None:
        self.gate = gate
        self.peer = ""
        self.raw: asyncio.Transport | None = None
        self.secured: asyncio.Transport | None = None
        self.handler: web.RequestHandler | None = None
        self.early: list[bytes] = []
        self.ended = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        address = transport.get_extra_info("peername")
        self.peer = str(address[0]) if isinstance(address, tuple) and address else ""
        if not self.gate.admit(self):
            transport.abort()
            return
        self.raw = transport
        transport.pause_reading()  # the ClientHello waits in the socket until TLS takes over
        task = asyncio.get_running_loop().create_task(self._secure(transport))
        self.gate.securing.add(task)
        task.add_done_callback(self.gate.securing.discard)

    async def _secure(self, transport: asyncio.Transport) -> None:
        loop = asyncio.get_running_loop()
        try:
            secured = await loop.start_tls(
                transport, self, self.gate.context, server_side=True, ssl_handshake_timeout=HANDSHAKE_SECONDS
            )
        except HANDSHAKE_ERRORS:
            secured = None
        if secured is None or secured.is_closing() or self.gate.closing or self not in self.gate.open:
            self.drop()
            return
        self.secured, self.handler = secured, self.gate.server()
        self.handler.connection_made(secured)
        for data in self.early:
            self.handler.data_received(data)
        if self.ended:
            self.handler.eof_received()

    def drop(self) -> None:
        transport = self.secured or self.raw
        if transport is not None:
            transport.abort()
        self.gate.forget(self)

    def data_received(self, data: bytes) -> None:
        if self.handler is None:
            self.early.append(data)
        else:
            self.handler.data_received(data)

    def eof_received(self) -> None:
        if self.handler is None:
            self.ended = True
        else:
            self.handler.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.gate.forget(self)
        if self.handler is not None:
            self.handler.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.handler is not None:
            self.handler.pause_writing()

    def resume_writing(self) -> None:
        if self.handler is not None:
            self.handler.resume_writing()
