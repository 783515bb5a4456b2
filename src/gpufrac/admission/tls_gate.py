"""The webhook's listener: TCP connections accepted while fewer than `MAX_CONNECTIONS` are open, each then
secured with TLS and handed to aiohttp.

asyncio's own TLS server gives every accepted connection a 256 KiB buffer before a byte is read, so a pod
that opened a thousand connections and sent nothing took 300 MiB of the webhook: past the chart's 256 MiB
it was killed, and every pod it guards was refused while it restarted. Here a connection is counted from
its accept; past the cap it is closed before TLS starts, and one whose handshake does not finish within
`HANDSHAKE_SECONDS` is dropped. The apiserver's connections already open go on.
"""

from __future__ import annotations

import asyncio
import logging
import ssl

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
        self.securing: set[asyncio.Task[None]] = set()
        self.refused = 0

    def __call__(self) -> asyncio.Protocol:
        return _Accepted(self)

    def full(self) -> bool:
        return len(self.securing) + len(self.server.connections) >= self.most

    def close(self) -> None:
        """Drop the handshakes under way (the connections handed to aiohttp are its runner's to close)."""
        for task in self.securing:
            task.cancel()


class _Accepted(asyncio.Protocol):
    """A connection from its accept until aiohttp has it. What arrives between the end of the handshake and
    the hand-over (the first request, often in the same packet) is kept and given to aiohttp after it."""

    def __init__(self, gate: TlsGate) -> None:
        self.gate = gate
        self.early: list[bytes] = []
        self.ended = False
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        if self.gate.full():
            self.gate.refused += 1
            if self.gate.refused == 1 or self.gate.refused % 1000 == 0:
                log.warning(
                    "%d connection(s) refused: %d open, the most the webhook keeps",
                    self.gate.refused,
                    self.gate.most,
                )
            transport.abort()
            return
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
            transport.abort()
            return
        except asyncio.CancelledError:  # the server is stopping
            transport.abort()
            raise
        if secured is None or self.lost:
            transport.abort()
            return
        handler = self.gate.server()
        secured.set_protocol(handler)
        handler.connection_made(secured)
        for data in self.early:
            handler.data_received(data)
        if self.ended:
            handler.eof_received()

    def data_received(self, data: bytes) -> None:
        self.early.append(data)

    def eof_received(self) -> bool:
        self.ended = True
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
