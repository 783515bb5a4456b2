"""The webhook's listener (`admission.tls_gate`): a flood of connections that send nothing cannot take the
webhook's memory (each used to hold 256 KiB from its accept), handshakes that never finish are dropped,
and a request that arrives with the end of the handshake is not lost."""

from __future__ import annotations

import asyncio
import socket
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gpufrac.admission import tls_gate

from .reviews import pod, review
from .test_server import serving


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


async def closed_by_server(sock: socket.socket, within: float) -> bool:
    """Whether the server closes `sock` (an end of file, or a reset) within `within` seconds."""
    loop = asyncio.get_running_loop()
    try:
        return await asyncio.wait_for(loop.sock_recv(sock, 1), within) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


async def validated(url: str, trust: ssl.SSLContext, *, source: str = "127.0.0.1") -> bool:
    """Whether a review of a plain pod, sent over TLS from address `source`, is answered allowed."""
    connector = aiohttp.TCPConnector(local_addr=(source, 0))
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.post(f"{url}/validate", json=review(pod({})), ssl=trust) as response,
    ):
        return bool((await response.json())["response"]["allowed"])


async def raw_connection(port: int) -> socket.socket:
    sock = socket.socket()
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return sock


async def secured_connection(port: int, trust: ssl.SSLContext) -> asyncio.StreamWriter:
    """A connection whose handshake is done, that then sends nothing."""
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=trust, server_hostname="localhost")
    return writer


async def test_a_peer_that_fills_the_webhook_only_displaces_its_own_connections(tmp_path: Path) -> None:
    """One address holding every slot: its next connection takes the place of its own oldest, another
    address's (the apiserver's, the kubelet's probe) the next oldest, and the server closes the rest as it
    stops."""
    async with serving(tmp_path) as (url, trust):
        held = [await raw_connection(port_of(url)) for _ in range(tls_gate.MAX_CONNECTIONS)]
        await asyncio.sleep(0.2)  # every one accepted and counted
        extra = await raw_connection(port_of(url))
        assert await closed_by_server(held[0], 5.0)
        assert not await closed_by_server(extra, 0.2) and not await closed_by_server(held[-1], 0.2)
        assert await validated(url, trust, source="127.0.0.2")
        assert await closed_by_server(held[1], 5.0)
    assert await closed_by_server(held[-1], 5.0)
    for sock in [*held, extra]:
        sock.close()


async def test_connections_idle_after_their_handshake_do_not_keep_others_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tls_gate, "HANDSHAKE_SECONDS", 0.3)
    async with serving(tmp_path) as (url, trust):
        held = [await secured_connection(port_of(url), trust) for _ in range(tls_gate.MAX_CONNECTIONS)]
        await asyncio.sleep(0.6)  # past the handshake timeout: they are served connections now
        assert await validated(url, trust, source="127.0.0.2")
        for writer in held:
            writer.close()


async def test_a_handshake_that_never_finishes_is_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tls_gate, "HANDSHAKE_SECONDS", 0.3)
    async with serving(tmp_path) as (url, _):
        silent = await raw_connection(port_of(url))
        assert await closed_by_server(silent, 5.0)
        silent.close()


async def test_a_request_that_arrives_with_the_end_of_the_handshake_is_answered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hand-over to aiohttp is held back until the request is in: its bytes reach the gate first."""
    start_tls = asyncio.BaseEventLoop.start_tls

    async def slow_start_tls(self: Any, *args: Any, **kwargs: Any) -> Any:
        secured = await start_tls(self, *args, **kwargs)
        await asyncio.sleep(0.3)
        return secured

    monkeypatch.setattr(asyncio.BaseEventLoop, "start_tls", slow_start_tls)
    async with serving(tmp_path) as (url, trust):
        assert await validated(url, trust)
