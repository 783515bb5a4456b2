"""The agent's `/metrics`: per share (pod, container, GPU) memory used, request and limit in bytes, and the
percentage of the GPU's SMs used against its compute cap; per GPU utilization, health and enforcement level;
MPS daemons up; findings and actions totals.

The per-share and per-GPU series come from the last interval's observation through a collector of our own,
so a share that ended disappears at once instead of lingering as a stale gauge. The registry is private:
nothing the process imports can add series to it.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, Counter, generate_latest, make_wsgi_app
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

from gpufrac.contract import FULL_COMPUTE
from gpufrac.contract.node_inventory import Enforcement
from gpufrac.node.nvml import MIB
from gpufrac.node.watchdog import Usage

# `/metrics` is served by a thread per connection; any pod can reach the port, so at most this many
# connections are served at once (the rest wait to be accepted) and each has this long, in all, to send its
# request and take its answer. Without them every idle connection kept a thread for as long as it stayed
# open, and enough of them would have run the node out of threads and process ids. The time is for the
# whole connection, not each read: a client sending a byte now and then would otherwise keep its slot for
# ever, and four of them every scrape out.
SCRAPE_THREADS = 4
SCRAPE_SECONDS = 10.0


@dataclass(frozen=True)
class GpuView:
    index: int
    uuid: str
    healthy: bool
    level: Enforcement
    utilization: float | None = None


@dataclass(frozen=True)
class Observation:
    usages: tuple[Usage, ...] = ()
    gpus: tuple[GpuView, ...] = ()
    node_level: Enforcement = Enforcement.NONE
    mps: Mapping[str, bool] = field(default_factory=dict)


class Exporter:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._latest = Observation()
        self.breaches = Counter(
            "gpufrac_watchdog_breaches",
            "Findings handled, each once: a share over its limit, or a GPU process without a contract.",
            ["reason"],
            registry=self.registry,
        )
        self.actions = Counter(
            "gpufrac_watchdog_actions",
            "Actions the watchdog took on findings: kill, evict or report.",
            ["action"],
            registry=self.registry,
        )
        self.registry.register(_Latest(self))

    def observe(self, observation: Observation) -> None:
        self._latest = observation

    @property
    def latest(self) -> Observation:
        return self._latest

    def text(self) -> str:
        return generate_latest(self.registry).decode()

    def serve(self, port: int, *, address: str = "0.0.0.0") -> None:
        server = make_server(
            address, port, make_wsgi_app(self.registry), _BoundedServer, handler_class=_QuietHandler
        )
        threading.Thread(target=server.serve_forever, name="gpufrac-metrics", daemon=True).start()


class _Latest(Collector):
    def __init__(self, exporter: Exporter) -> None:
        self._exporter = exporter

    def collect(self) -> Iterator[Metric]:
        seen = self._exporter.latest
        share_labels = ["namespace", "pod", "container", "gpu", "uuid"]
        used = GaugeMetricFamily(
            "gpufrac_share_memory_used_bytes", "GPU memory a share uses.", labels=share_labels
        )
        request = GaugeMetricFamily(
            "gpufrac_share_memory_request_bytes", "GPU memory guaranteed to a share.", labels=share_labels
        )
        limit = GaugeMetricFamily(
            "gpufrac_share_memory_limit_bytes", "GPU memory a share may use at most.", labels=share_labels
        )
        compute_used = GaugeMetricFamily(
            "gpufrac_share_compute_used_percent",
            "Percentage of the GPU's SMs a share's processes kept busy, from NVML's per-process samples.",
            labels=share_labels,
        )
        compute_cap = GaugeMetricFamily(
            "gpufrac_share_compute_cap_percent",
            "Percentage of the GPU's SMs a share may use: its compute cap, 100 without one.",
            labels=share_labels,
        )
        for usage in seen.usages:
            c = usage.container
            values = [c.pod.namespace, c.pod.name, c.name, str(usage.gpu.index), usage.gpu.uuid]
            used.add_metric(values, usage.used_bytes)
            request.add_metric(values, (c.request_mib or 0) * MIB)
            limit.add_metric(values, (c.limit_mib or 0) * MIB)
            compute_used.add_metric(values, usage.sm_percent)
            compute_cap.add_metric(values, FULL_COMPUTE if c.compute_percent is None else c.compute_percent)
        yield from (used, request, limit, compute_used, compute_cap)

        gpu_labels = ["gpu", "uuid"]
        utilization = GaugeMetricFamily(
            "gpufrac_gpu_utilization_ratio",
            "GPU utilization over NVML's last sample period.",
            labels=gpu_labels,
        )
        healthy = GaugeMetricFamily(
            "gpufrac_gpu_healthy", "1 if NVML reads the GPU, else 0.", labels=gpu_labels
        )
        level = GaugeMetricFamily(
            "gpufrac_gpu_enforcement",
            "1 for the level at which memory limits hold on the GPU: native, mps, watchdog or none.",
            labels=[*gpu_labels, "level"],
        )
        for gpu in seen.gpus:
            ids = [str(gpu.index), gpu.uuid]
            if gpu.utilization is not None:
                utilization.add_metric(ids, gpu.utilization)
            healthy.add_metric(ids, 1 if gpu.healthy else 0)
            for each in Enforcement:
                level.add_metric([*ids, each.value], 1 if each is gpu.level else 0)
        node = GaugeMetricFamily(
            "gpufrac_node_enforcement", "1 for the node's enforcement level.", labels=["level"]
        )
        for each in Enforcement:
            node.add_metric([each.value], 1 if each is seen.node_level else 0)
        mps = GaugeMetricFamily(
            "gpufrac_mps_daemon_up", "1 if the MPS control daemon answers.", labels=["daemon"]
        )
        for name, up in sorted(seen.mps.items()):
            mps.add_metric([name], 1 if up else 0)
        yield from (utilization, healthy, level, node, mps)


class _QuietHandler(WSGIRequestHandler):
    """No log line per scrape (as prometheus_client's own handler), and a deadline for each connection: when
    it passes, the socket is shut down, which ends whatever read or write the handler is blocked in."""

    def setup(self) -> None:
        super().setup()
        seconds = SCRAPE_SECONDS  # read per connection, so that a test may shorten it
        self.connection.settimeout(seconds)  # no single read or write outlasts the deadline either
        self._deadline = threading.Timer(seconds, self._cut)
        self._deadline.daemon = True
        self._deadline.start()

    def finish(self) -> None:
        self._deadline.cancel()
        super().finish()

    def _cut(self) -> None:
        with contextlib.suppress(OSError):  # closed already
            self.connection.shutdown(socket.SHUT_RDWR)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _BoundedServer(ThreadingWSGIServer):
    """prometheus_client's server, its threads counted: at most `SCRAPE_THREADS` at once."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._slots = threading.BoundedSemaphore(SCRAPE_THREADS)

    def process_request(self, request: Any, client_address: Any) -> None:
        self._slots.acquire()  # the accepting thread waits here while all are busy
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that timed out or went away is no error worth a traceback on stderr."""
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)
