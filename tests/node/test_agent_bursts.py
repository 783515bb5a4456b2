"""The agent acts on a share bursting into a neighbour's guarantee by its mode, once, with an Event that
says whose guarantee it protected."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpufrac.node.agent import Agent, Settings
from gpufrac.node.nvml import FakeBackend
from gpufrac.node.watchdog import Kind, Mode
from gpufrac.testing.fakehost import FakeHost, RecordingKiller, container_id

from .fake_kube import FakeNodeClient
from .test_watchdog import bound_pod, share


def burst(tmp_path: Path, mode: Mode) -> tuple[Agent, FakeNodeClient, RecordingKiller]:
    """A 16 GiB GPU (15872 MiB allocatable) with two shares of 7936 MiB guaranteed: `a` (priority 0) uses
    12000 MiB and `b` (priority 10) 2000, so 1872 MiB are free where `b` may still claim 5936."""
    host = FakeHost(tmp_path / "host")
    host.add_gpus(1, memory_mib=16384)
    pods = []
    for n, (name, priority) in enumerate((("a", 0), ("b", 10)), start=1):
        pod = bound_pod(name, share("app", host.uuid(0), request=7936, limit=15872), {"app": n})
        pod["spec"]["priority"] = priority
        pods.append(pod)
        host.add_process(100 + n, container=container_id(n))
    host.write({0: [(101, 12000), (102, 2000)]})
    node: dict[str, Any] = {"metadata": {"name": "n1", "labels": {}, "annotations": {}}, "status": {}}
    client = FakeNodeClient(node, pods)
    killer = RecordingKiller()
    settings = Settings(node_name="n1", mode=mode, proc_root=host.proc)
    return Agent(settings, client=client, nvml=FakeBackend(host.nvml_file), killer=killer), client, killer


@pytest.mark.parametrize(
    ("mode", "outcome"),
    [
        (Mode.KILL, "Killed processes (pid, outcome): 101 killed"),
        (Mode.EVICT, "Evicted pod ns/a"),
        (Mode.REPORT, "Reported"),
    ],
)
async def test_a_burst_into_a_guarantee_is_acted_on_once_by_mode(
    tmp_path: Path, mode: Mode, outcome: str
) -> None:
    agent, client, killer = burst(tmp_path, mode)
    report = await agent.tick()
    (handled,) = report.handled
    assert (handled.finding.kind, handled.action, handled.outcome) == (Kind.BURST, mode.value, outcome)
    events = [e for e in client.events if type(e).__name__ == "Event"]
    (event,) = events
    assert event.reason == "GPUBurstReclaimed"
    assert event.involvedObject.name == "a"
    assert event.message == (
        f"{outcome}: container app of pod ns/a (priority 0) uses 12000 MiB on GPU 0 "
        "(GPU-00000000-0000-4000-8000-000000000000), 4064 MiB over its request of 7936 MiB, with "
        "1872 MiB free on the GPU: reclaimed to keep the 7936 MiB guaranteed to container app of pod ns/b "
        f"(mode {mode})"
    )
    assert killer.calls == ([101] if mode is Mode.KILL else [])
    assert len(client.events) == (2 if mode is Mode.EVICT else 1)  # the eviction, then the Event
    assert (await agent.tick()).handled == []  # once per finding
    assert 'gpufrac_watchdog_breaches_total{reason="GPUBurstReclaimed"} 1.0' in agent.exporter.text()


async def test_a_share_on_a_gpu_nvml_cannot_read_has_no_usage_rather_than_none_used(tmp_path: Path) -> None:
    """A GPU whose calls fail (fallen off the bus) lists no processes: its shares' use is unknown, and
    /metrics must not say they use nothing while the GPU's health says it cannot be read."""
    agent, _, _ = burst(tmp_path, Mode.KILL)
    host = FakeHost(tmp_path / "host")
    host.add_gpus(1, memory_mib=16384)
    host.write(errors={0: "GPU is lost"})
    report = await agent.tick()
    assert report.usages == () and agent.exporter.latest.usages == ()
    assert "gpufrac_share_memory_used_bytes{" not in agent.exporter.text()
    assert 'gpufrac_gpu_healthy{gpu="0",uuid="GPU-00000000-0000-4000-8000-000000000000"} 0.0' in (
        agent.exporter.text()
    )


@pytest.mark.parametrize(("own", "sent"), [(86_400, 30), (10, None), (None, None)])
async def test_a_pod_evicted_for_its_gpu_use_gets_at_most_thirty_seconds_of_grace(
    tmp_path: Path, own: int | None, sent: int | None
) -> None:
    """Until its grace period ends its processes go on taking the memory promised to its neighbour: a pod
    asking for a day of it, deaf to SIGTERM, kept it a day. A shorter one is its own."""
    agent, client, _ = burst(tmp_path, Mode.EVICT)
    if own is not None:
        client.pods[0]["spec"]["terminationGracePeriodSeconds"] = own
    await agent.tick()
    (evicted,) = [e for e in client.events if type(e).__name__ == "_Eviction"]
    assert evicted.to_dict().get("deleteOptions", {}).get("gracePeriodSeconds") == sent


@pytest.mark.parametrize(("deletion_grace", "sent"), [(86_400, [30]), (20, [])])
async def test_a_pod_its_tenant_deletes_slowly_is_evicted_to_go_sooner(
    tmp_path: Path, deletion_grace: int, sent: list[int]
) -> None:
    """Deleted by its tenant with a day of grace, a pod taking its neighbour's guaranteed memory counted as
    going, and was left to take it a day; its deletion is shortened to 30 s. One going sooner is left be."""
    agent, client, _ = burst(tmp_path, Mode.EVICT)
    client.pods[0]["metadata"]["deletionTimestamp"] = "2024-05-01T13:00:00Z"
    client.pods[0]["metadata"]["deletionGracePeriodSeconds"] = deletion_grace
    await agent.tick()
    evictions = [e.to_dict() for e in client.events if type(e).__name__ == "_Eviction"]
    assert [e["deleteOptions"]["gracePeriodSeconds"] for e in evictions] == sent
