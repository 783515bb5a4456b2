"""The scheduler's Prometheus metrics and its small HTTP server (/metrics, /healthz, /readyz).

Each scheduler owns a registry, so tests run several in one process without clashing. GPU memory gauges
are read from `ClusterState` at scrape time rather than kept in step with it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from aiohttp import web
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gpufrac.cluster.state import ClusterState
from gpufrac.kubeapi.probes import add_probe_routes

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class _GpuMemory(Collector):
    def __init__(self, state: Callable[[], ClusterState]) -> None:
        self._state = state

    def collect(self) -> Iterator[GaugeMetricFamily]:
        state = self._state()
        allocated = GaugeMetricFamily(
            "gpufrac_gpu_memory_allocated_bytes",
            "GPU memory requested by placed shares",
            labels=["node", "gpu"],
        )
        free = GaugeMetricFamily(
            "gpufrac_gpu_memory_free_bytes", "GPU memory not yet requested", labels=["node", "gpu"]
        )
        for row, name in enumerate(state.names):
            if not state.active[row]:
                continue
            for gpu in range(int(state.gpu_count[row])):
                labels = [name, state.uuids[row][gpu]]
                memory, left = int(state.gpu_mem[row, gpu]), int(state.gpu_free[row, gpu])
                allocated.add_metric(labels, (memory - left) * 2**20)
                free.add_metric(labels, left * 2**20)
        yield allocated
        yield free


QueueFigures = tuple[
    Mapping[str, Mapping[Any, float]], Mapping[str, Mapping[Any, float]]
]  # queue -> resource -> amount


class _Queues(Collector):
    """Each tenant queue's fair share and use, per resource, as the scheduler last computed them."""

    def __init__(self, figures: Callable[[], QueueFigures]) -> None:
        self._figures = figures

    def collect(self) -> Iterator[GaugeMetricFamily]:
        shares, usage = self._figures()
        for name, helptext, table in (
            ("gpufrac_queue_fair_share", "A queue's fair share, in the resource's unit", shares),
            ("gpufrac_queue_usage", "What a queue's pods hold, in the resource's unit", usage),
        ):
            family = GaugeMetricFamily(
                name, f"{helptext} (MiB, millicores or GPUs)", labels=["queue", "resource"]
            )
            for queue, amounts in sorted(table.items()):
                for resource, amount in sorted(amounts.items()):
                    family.add_metric([queue, str(resource)], amount)
            yield family


class SchedulerMetrics:
    def __init__(
        self,
        state: Callable[[], ClusterState],
        *,
        leader: Callable[[], bool] = lambda: True,
        misfits: Callable[[], int] = lambda: 0,
        queues: Callable[[], QueueFigures] | None = None,
    ) -> None:
        self.registry = CollectorRegistry()
        self.attempts = Counter(
            "gpufrac_scheduler_attempts", "Scheduling attempts by result", ["result"], registry=self.registry
        )
        self.decision_seconds = Histogram(
            "gpufrac_scheduler_decision_seconds",
            "Engine time per pod",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.binding_seconds = Histogram(
            "gpufrac_scheduler_binding_seconds",
            "ConfigMap, annotations and Binding per pod",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.evictions = Counter(
            "gpufrac_scheduler_evictions",
            "Pods the scheduler evicted to make room for a pending pod, by why (move: defragmentation; "
            "preempt: a higher priority in its queue; reclaim: a queue below its quota) and outcome "
            "(evicted; refused: a PodDisruptionBudget; failed)",
            ["why", "outcome"],
            registry=self.registry,
        )
        self.pending = Gauge(
            "gpufrac_scheduler_pending_pods", "Pods waiting to be scheduled", registry=self.registry
        )
        self.leader = Gauge(
            "gpufrac_scheduler_leader",
            "1 while this replica schedules (holds the Lease)",
            registry=self.registry,
        )
        self.leader.set_function(lambda: float(leader()))
        self.invalid_objects = Counter(
            "gpufrac_scheduler_invalid_objects",
            "Pods and nodes the scheduler skipped, unreadable or unaccountable (each once; see their Events)",
            ["kind", "reason"],
            registry=self.registry,
        )
        self.misfits = Gauge(
            "gpufrac_scheduler_unaccounted_pods",
            "Bound pods their node cannot hold as their annotations say; such a node takes no new pod",
            registry=self.registry,
        )
        self.misfits.set_function(lambda: float(misfits()))
        self.registry.register(_GpuMemory(state))
        if queues is not None:
            self.registry.register(_Queues(queues))


def http_app(metrics: SchedulerMetrics, *, ready: Callable[[], bool]) -> web.Application:
    app = web.Application()
    add_probe_routes(app, metrics.registry, ready=ready)
    return app
