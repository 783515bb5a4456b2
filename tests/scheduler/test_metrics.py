"""The scheduler's Prometheus exposition and its /metrics, /healthz and /readyz endpoints."""

from __future__ import annotations

from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpufrac.cluster.model import Assignment, GpuSpec, NodeSpec, Placement
from gpufrac.cluster.state import ClusterState
from gpufrac.contract.model import ComputeMode
from gpufrac.scheduler.metrics import SchedulerMetrics, http_app

MIB = 2**20


def small_state() -> ClusterState:
    gpus = (GpuSpec(0, "GPU-a", "T4", 16_000), GpuSpec(1, "GPU-b", "T4", 16_000))
    state = ClusterState([NodeSpec("n1", 8000, 32_768, gpus), NodeSpec("gone", 8000, 32_768, gpus)])
    share = Assignment("main", (0,), 4000, 6000, ComputeMode.TIME_SLICING)
    state.apply(Placement("team/p", "n1", assignments=(share,)))
    state.remove_node("gone")
    return state


def samples(metrics: SchedulerMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(metrics.registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_exposition_counts_attempts_and_reads_gpu_memory_from_the_state() -> None:
    state = small_state()
    metrics = SchedulerMetrics(lambda: state)
    metrics.attempts.labels("scheduled").inc(3)
    metrics.attempts.labels("unschedulable").inc()
    metrics.pending.set(2)
    found = samples(metrics)
    assert found["gpufrac_scheduler_attempts_total", (("result", "scheduled"),)] == 3
    assert found["gpufrac_scheduler_attempts_total", (("result", "unschedulable"),)] == 1
    assert found["gpufrac_scheduler_pending_pods", ()] == 2
    memory = {
        (name, dict(labels)["gpu"]): value
        for (name, labels), value in found.items()
        if name.startswith("gpufrac_gpu_memory")
    }
    assert memory == {
        ("gpufrac_gpu_memory_allocated_bytes", "GPU-a"): 4000 * MIB,
        ("gpufrac_gpu_memory_allocated_bytes", "GPU-b"): 0,
        ("gpufrac_gpu_memory_free_bytes", "GPU-a"): 12_000 * MIB,
        ("gpufrac_gpu_memory_free_bytes", "GPU-b"): 16_000 * MIB,
    }
    assert {dict(labels)["node"] for (name, labels) in found if name.startswith("gpufrac_gpu")} == {"n1"}


def test_gpu_gauges_follow_the_state_at_scrape_time() -> None:
    state = small_state()
    metrics = SchedulerMetrics(lambda: state)
    state.release("team/p")
    found = samples(metrics)
    assert found["gpufrac_gpu_memory_free_bytes", (("gpu", "GPU-a"), ("node", "n1"))] == 16_000 * MIB


def test_each_scheduler_has_its_own_registry() -> None:
    first, second = SchedulerMetrics(small_state), SchedulerMetrics(small_state)
    first.attempts.labels("error").inc()
    assert second.registry.get_sample_value("gpufrac_scheduler_attempts_total", {"result": "error"}) is None


async def test_http_endpoints() -> None:
    synced = {"ready": False}
    metrics = SchedulerMetrics(small_state)
    metrics.attempts.labels("scheduled").inc()
    async with TestClient(TestServer(http_app(metrics, ready=lambda: synced["ready"]))) as client:
        health = await client.get("/healthz")
        assert (health.status, await health.text()) == (200, "ok\n")
        assert (await client.get("/readyz")).status == 503
        synced["ready"] = True
        assert (await client.get("/readyz")).status == 200
        scrape = await client.get("/metrics")
        assert scrape.status == 200
        assert scrape.headers["Content-Type"].startswith("text/plain")
        assert 'gpufrac_scheduler_attempts_total{result="scheduled"} 1.0' in await scrape.text()
        assert (await client.get("/nothing")).status == 404


def test_the_leader_gauge_follows_whether_the_replica_schedules() -> None:
    leading = [False]
    metrics = SchedulerMetrics(small_state, leader=lambda: leading[0])
    assert samples(metrics)[("gpufrac_scheduler_leader", ())] == 0
    leading[0] = True
    assert samples(metrics)[("gpufrac_scheduler_leader", ())] == 1
    assert (
        samples(SchedulerMetrics(small_state))[("gpufrac_scheduler_leader", ())] == 1
    )  # no election: it leads
