"""Dealing a trace to tenants (`sim.tenants.deal`): the same seed deals the same way, queues get pods in
proportion to their traffic phase by phase, gangs are drawn apart from queues, the cluster part is whole
nodes."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from gpufrac.cluster.model import GpuSpec, NodeSpec
from gpufrac.errors import UserError
from gpufrac.sim.tenants import config, deal
from gpufrac.sim.trace import Trace, TracePod


def rules(traffic: dict[str, Any], **tables: dict[str, Any]) -> config.TenantsConfig:
    queues = [{"name": name, "traffic": weight} for name, weight in traffic.items()]
    return config.parse({"queues": queues, **tables}, Path("t.toml"))


def trace(pods: int, *, gpu_every: int = 1, nodes: int = 4) -> Trace:
    """`pods` pods a second apart, every `gpu_every`-th with one whole GPU, the rest CPU-only."""
    return Trace(
        "t",
        tuple(
            NodeSpec(f"n{i}", 8000, 8192, tuple(GpuSpec(g, f"n{i}-{g}", "T4", 16000) for g in range(i + 1)))
            for i in range(nodes)
        ),
        tuple(
            TracePod(
                f"p{i:05d}",
                100,
                100,
                int(i % gpu_every == 0),
                1000 * int(i % gpu_every == 0),
                None,
                i,
                i + 50,
            )
            for i in range(pods)
        ),
    )


def test_the_same_seed_deals_the_same_and_another_seed_otherwise() -> None:
    split = rules({"a": 1, "b": 1, "c": 2}, gangs={"fraction": 0.2, "size": 2}, cluster={"gpus": 4})
    first, again, other = (deal.deal(trace(400), split, seed) for seed in (7, 7, 8))
    assert first == again
    assert [pod.queue for pod in first.pods] != [pod.queue for pod in other.pods]


def test_queues_get_pods_in_proportion_to_their_traffic() -> None:
    dealt = deal.deal(trace(20_000), rules({"a": 1, "b": 3}), seed=1)
    counts = Counter(pod.queue for pod in dealt.pods)
    assert counts["b"] / len(dealt.pods) == pytest.approx(0.75, abs=0.02)


def test_phases_cut_the_pods_in_creation_order_into_equal_runs() -> None:
    dealt = deal.deal(trace(3000), rules({"a": [1, 0, 1], "b": [0, 1, 1]}), seed=3)
    queues = [pod.queue for pod in dealt.pods]  # in arrival order
    assert set(queues[:1000]) == {"a"} and set(queues[1000:2000]) == {"b"}
    assert Counter(queues[2000:])["a"] == pytest.approx(500, abs=80)


def test_gangs_are_gpu_pods_made_identical_members_and_leave_the_queues_alone() -> None:
    plain = deal.deal(trace(2000, gpu_every=2), rules({"a": 1, "b": 1}), seed=5)
    ganged = deal.deal(
        trace(2000, gpu_every=2), rules({"a": 1, "b": 1}, gangs={"fraction": 0.1, "size": 3}), 5
    )
    members: dict[str, list[deal.TenantPod]] = {}
    for pod in ganged.pods:
        if pod.gang is not None:
            members.setdefault(pod.gang, []).append(pod)
    assert len(members) == pytest.approx(100, abs=30)  # 10% of the 1,000 GPU pods
    for name, gang in members.items():
        assert [pod.demand.name for pod in gang] == [f"{name}-m0", f"{name}-m1", f"{name}-m2"]
        assert len({(pod.queue, pod.arrival, pod.duration, pod.demand.whole) for pod in gang}) == 1
        assert gang[0].demand.whole_gpus == 1
    # A gang's pod keeps the queue it was dealt without gangs: gang draws are a stream of their own.
    alone = {pod.demand.name: pod.queue for pod in plain.pods}
    assert all(alone[pod.gang or pod.demand.name] == pod.queue for pod in ganged.pods)


def test_a_pod_runs_its_trace_duration_and_one_without_a_deletion_time_to_the_end() -> None:
    pods = (TracePod("a", 1, 1, 1, 1000, None, 10.0, 40.0), TracePod("b", 1, 1, 1, 1000, None, 20.0, None))
    dealt = deal.deal(Trace("t", trace(1).nodes, pods), rules({"q": 1}), seed=0)
    assert [(pod.arrival, pod.duration) for pod in dealt.pods] == [(10.0, 30.0), (20.0, 20.0)]


def test_part_of_the_cluster_is_whole_nodes_reaching_the_gpus_asked() -> None:
    dealt = deal.deal(trace(10, nodes=6), rules({"q": 1}, cluster={"gpus": 7}), seed=2)
    held = sum(len(node.gpus) for node in dealt.nodes)
    assert held >= 7 and held - len(dealt.nodes[-1].gpus) < 7  # the last node taken crossed the line
    with pytest.raises(UserError, match=r"cluster.gpus = 99: the trace's cluster has 21 GPUs"):
        deal.deal(trace(10, nodes=6), rules({"q": 1}, cluster={"gpus": 99}), seed=2)


def test_a_pod_without_a_creation_time_is_refused() -> None:
    pods = (TracePod("a", 1, 1, 1, 1000, None, None, None),)
    with pytest.raises(UserError, match="pod a has no creation_time: the tenant replay needs"):
        deal.deal(Trace("t", trace(1).nodes, pods), rules({"q": 1}), seed=0)
