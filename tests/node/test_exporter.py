"""The agent's /metrics."""

from __future__ import annotations

import socket
import threading
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpufrac.contract.node_inventory import Enforcement
from gpufrac.node import exporter as exporter_module
from gpufrac.node.exporter import Exporter, GpuView, Observation
from gpufrac.node.nvml import MIB
from gpufrac.node.watchdog import Container, Gpu, PodRef, Usage

APP = Container(PodRef("ns", "web", "uid"), "app", ("GPU-0",), request_mib=1024, limit_mib=2048)
CAPPED = Container(PodRef("ns", "mps", "uid2"), "app", ("GPU-1",), 1024, 2048, True, compute_percent=30)


def _observation() -> Observation:
    return Observation(
        usages=(Usage(APP, Gpu(0, "GPU-0"), 1500 * MIB, (), 12), Usage(CAPPED, Gpu(1, "GPU-1"), 0, (), 45)),
        gpus=(
            GpuView(0, "GPU-0", True, Enforcement.WATCHDOG, utilization=0.25),
            GpuView(1, "GPU-1", False, Enforcement.NONE),
        ),
        node_level=Enforcement.WATCHDOG,
        mps={"sm-sharing": False},
    )


def test_per_share_and_per_gpu_series() -> None:
    exporter = Exporter()
    exporter.observe(_observation())
    exporter.breaches.labels("GPUMemoryLimitExceeded").inc()
    exporter.actions.labels("kill").inc()
    samples = _samples(exporter.text())
    share = {"namespace": "ns", "pod": "web", "container": "app", "gpu": "0", "uuid": "GPU-0"}
    assert samples["gpufrac_share_memory_used_bytes", _key(share)] == 1500 * MIB
    assert samples["gpufrac_share_memory_request_bytes", _key(share)] == 1024 * MIB
    assert samples["gpufrac_share_memory_limit_bytes", _key(share)] == 2048 * MIB
    assert samples["gpufrac_share_compute_used_percent", _key(share)] == 12
    assert samples["gpufrac_share_compute_cap_percent", _key(share)] == 100  # no cap: all the SMs
    capped = {"namespace": "ns", "pod": "mps", "container": "app", "gpu": "1", "uuid": "GPU-1"}
    assert samples["gpufrac_share_compute_used_percent", _key(capped)] == 45  # over its cap: reported only
    assert samples["gpufrac_share_compute_cap_percent", _key(capped)] == 30
    gpu0, gpu1 = {"gpu": "0", "uuid": "GPU-0"}, {"gpu": "1", "uuid": "GPU-1"}
    assert samples["gpufrac_gpu_utilization_ratio", _key(gpu0)] == 0.25
    assert ("gpufrac_gpu_utilization_ratio", _key(gpu1)) not in samples  # unknown is absent, not zero
    assert samples["gpufrac_gpu_healthy", _key(gpu1)] == 0
    assert samples["gpufrac_gpu_enforcement", _key({**gpu0, "level": "watchdog"})] == 1
    assert samples["gpufrac_gpu_enforcement", _key({**gpu0, "level": "mps"})] == 0
    assert samples["gpufrac_node_enforcement", _key({"level": "watchdog"})] == 1
    assert samples["gpufrac_mps_daemon_up", _key({"daemon": "sm-sharing"})] == 0
    assert samples["gpufrac_watchdog_breaches_total", _key({"reason": "GPUMemoryLimitExceeded"})] == 1
    assert samples["gpufrac_watchdog_actions_total", _key({"action": "kill"})] == 1


def _key(labels: dict[str, str]) -> frozenset[tuple[str, str]]:
    return frozenset(labels.items())


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (sample.name, _key(sample.labels)): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_an_ended_share_disappears_at_once() -> None:
    exporter = Exporter()
    exporter.observe(_observation())
    exporter.observe(Observation())
    assert "gpufrac_share_memory_used_bytes{" not in exporter.text()


def test_served_over_http() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    exporter = Exporter()
    exporter.observe(_observation())
    exporter.serve(port, address="127.0.0.1")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert b"gpufrac_share_memory_limit_bytes" in response.read()


def test_idle_connections_hold_few_threads_and_not_for_ever(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(exporter_module, "SCRAPE_SECONDS", 0.2)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    Exporter().serve(port, address="127.0.0.1")
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(4 * exporter_module.SCRAPE_THREADS)]
    try:
        # Accepted in order, so the idle connections were all taken before this scrape is answered.
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
            assert response.status == 200
        serving = [t for t in threading.enumerate() if t.name.endswith("(process_request_thread)")]
        assert len(serving) <= exporter_module.SCRAPE_THREADS
    finally:
        for connection in idle:
            connection.close()


def _trickle(connection: socket.socket, closed: threading.Event) -> None:
    """Send a request a header byte at a time, each well within the time a single read may take, until the
    server closes the connection."""
    connection.settimeout(0.05)
    try:
        connection.sendall(b"GET /metrics HTTP/1.1\r\n")
        while True:
            connection.sendall(b"X")
            try:
                if not connection.recv(1024):
                    break
            except TimeoutError:
                continue
    except OSError:
        pass  # reset: closed too
    closed.set()


def test_a_client_trickling_its_request_loses_its_connection_at_the_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The deadline is for the whole connection: clients taking every slot, each sending a byte more often
    than a read may wait, are cut off, and a scrape behind them is answered."""
    monkeypatch.setattr(exporter_module, "SCRAPE_SECONDS", 0.5)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    Exporter().serve(port, address="127.0.0.1")
    tricklers = [socket.create_connection(("127.0.0.1", port)) for _ in range(exporter_module.SCRAPE_THREADS)]
    closed = [threading.Event() for _ in tricklers]
    threads = [
        threading.Thread(target=_trickle, args=pair, daemon=True)
        for pair in zip(tricklers, closed, strict=True)
    ]
    for thread in threads:
        thread.start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
            assert response.status == 200
        assert all(event.wait(timeout=30) for event in closed)
    finally:
        for connection in tricklers:
            connection.close()


# Each is sent whole and read whole before the answer, so that the server closes no connection with bytes
# left unread, which would reset it before the client reads the answer.
MALFORMED_HTTP = {
    "a request line over the limit": (b"GET /" + b"a" * (65_537 - 5), b"HTTP/1.0 414"),
    "a header line over the limit": (b"GET /metrics HTTP/1.1\r\nX: " + b"a" * (65_537 - 3), b"HTTP/1.0 431"),
    "too many headers": (b"GET /metrics HTTP/1.1\r\n" + b"X: y\r\n" * 101, b"HTTP/1.0 431"),
    "a version that is no number": (b"GET /metrics HTTP/x.y\r\n", b"Error code: 400"),
}


@pytest.mark.parametrize(("data", "status"), MALFORMED_HTTP.values(), ids=MALFORMED_HTTP.keys())
def test_malformed_http_is_answered_without_a_traceback(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture, data: bytes, status: bytes
) -> None:
    """The agent's server is the standard library's, not aiohttp's: this holds it to the same rule as the
    webhook's, that a client's bad request is never a traceback."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    Exporter().serve(port, address="127.0.0.1")
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(data)
        answer = connection.makefile("rb").read()  # the server closes the connection after an error
    assert status in answer
    assert "Traceback" not in capsys.readouterr().err
    assert not [record for record in caplog.records if record.exc_info]
