"""The report's figures from hand-made pods, nodes and samples."""

from __future__ import annotations

import pytest

from gpufrac.report.analysis import MIB, NOT_MEASURED, ShareSample, Source, Usage, figures

from .pods import node, pod

NODES = [node("n1", gpus=2), node("n2", gpus=4)]


@pytest.mark.parametrize(
    ("pods", "in_use", "without_sharing", "histogram"),
    [
        ([], 0, 0, {}),
        # two halves on one GPU: one GPU in use, two with whole GPUs
        ([pod("a", share=("0",)), pod("b", share=("0",))], 1, 2, {2: 1}),
        # a share on two devices takes two whole GPUs; a whole-GPU pod is the same either way
        ([pod("a", share=("0", "1")), pod("b", whole=("2",), node="n2")], 3, 3, {1: 3}),
        # whole GPUs the device plugin gave (no devices written): counted, not in the co-tenancy table
        ([pod("a", share=("0",)), pod("b", whole_count=2, node="n2")], 3, 3, {1: 1}),
        # finished pods, unbound pods, reservations and pods without GPUs hold nothing
        (
            [
                pod("done", share=("0",), phase="Succeeded"),
                pod("failed", whole=("1",), phase="Failed"),
                pod("unbound", share=("0",), node=""),
                pod("gpufrac-reservation-x", whole_count=1, labels={"gpufrac.io/reservation": "true"}),
                pod("cpu"),
            ],
            0,
            0,
            {},
        ),
        # four quarters on one GPU, a half on another
        ([pod(f"q{i}", share=("0",)) for i in range(4)] + [pod("h", share=("1",))], 2, 5, {1: 1, 4: 1}),
    ],
)
def test_densification(pods: list, in_use: int, without_sharing: int, histogram: dict[int, int]) -> None:
    result = figures(NODES, pods, Usage())
    assert (result.in_use, result.without_sharing, result.tenants_histogram()) == (
        in_use,
        without_sharing,
        histogram,
    )
    assert result.cluster_gpus == 6
    assert result.saved == without_sharing - in_use


def sample(name: str, used_mib: float, gpu: str = "0", uuid: str = "GPU-x") -> ShareSample:
    return ShareSample(f"ml/{name}", "main", uuid, gpu, used_mib * MIB)


@pytest.mark.parametrize(
    ("samples", "status", "used"),
    [
        ((), NOT_MEASURED, None),
        ((sample("a", 0),), "within", 0.0),  # no process yet: the agent reports zero, which is measured
        ((sample("a", 4096),), "within", 4096.0),
        ((sample("a", 5000),), "burst", 5000.0),
        ((sample("a", 8193),), "breach", 8193.0),
        ((sample("a", 5000, gpu="1"),), NOT_MEASURED, None),  # another GPU's reading
        ((sample("b", 5000),), NOT_MEASURED, None),  # another pod's
    ],
)
def test_each_share_is_measured_only_by_its_own_sample(
    samples: tuple, status: str, used: float | None
) -> None:
    [share] = figures(NODES, [pod("a", share=("0",))], Usage(samples)).shares
    assert (share.status, share.used_mib, share.request_mib, share.limit_mib) == (status, used, 4096, 8192)


def test_a_sample_matches_a_device_by_uuid_too() -> None:
    pods = [pod("a", share=("GPU-a", "GPU-b"))]
    result = figures(NODES, pods, Usage((sample("a", 100, gpu="7", uuid="GPU-b"),)))
    assert [(share.gpu, share.used_mib) for share in result.shares] == [("GPU-a", None), ("GPU-b", 100.0)]


def test_a_pod_whose_contract_cannot_be_read_is_set_aside_with_why() -> None:
    broken = pod("broken", share=("0",))
    broken["metadata"]["annotations"]["nvidia.com/container.main.gpu-memory.request"] = "lots"
    moved = pod("moved", share=("0",))
    moved["metadata"]["annotations"]["gpufrac.io/bound-uid"] = "uid-other"
    result = figures(NODES, [broken, moved, pod("ok", share=("1",))], Usage())
    assert [name for name, _ in result.skipped] == ["ml/broken", "ml/moved"]
    assert "gpu-memory.request" in result.skipped[0][1]
    assert result.in_use == 1


def test_usage_adds_up_over_sources() -> None:
    first = Usage((sample("a", 1),), {"GPUMemoryLimitExceeded": 1}, {"kill": 1}, (Source("u1"),))
    second = Usage((), {"GPUMemoryLimitExceeded": 2}, {}, (Source("u2", "refused"),))
    total = first + second
    assert total.breaches == {"GPUMemoryLimitExceeded": 3} and total.actions == {"kill": 1}
    assert [source.url for source in total.sources] == ["u1", "u2"]
    assert total.counters_read and not second.counters_read


def test_the_nodes_gpus_come_from_the_agents_list_before_the_labels() -> None:
    listed = '[{"index": 0, "uuid": "GPU-a", "model": "m", "memory_mib": 1024, "healthy": true}]'
    nodes = [
        node("n1", gpus=8, **{"gpufrac.io/gpus": listed}),
        node("n2", gpus=3, **{"gpufrac.io/gpus": "x"}),
    ]
    assert figures(nodes, [], Usage()).cluster_gpus == 4
