"""Every strategy on traces small enough to work out by hand; each answer is derived in the comments.

The traces run on nodes of one 16 GB GPU (T4) with 8 cores, so one pod's choice of node never blocks
another's except through the GPU, and the answers hold for any arrival order; each test runs three seeds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from . import traces
from .traces import HALVES, cpu_only, share, whole

SEEDS = (1, 7, 42)


@pytest.fixture(params=SEEDS)
def seed(request: pytest.FixtureRequest) -> int:
    return int(request.param)


def run(
    tmp_path: Path,
    pods: list[traces.Pod],
    seed: int,
    *,
    cluster: dict[str, int] | None = None,
    **settings: object,
) -> dict[str, dict]:
    """Each strategy's summary row for these pods on `cluster` (see `traces.write`) with one seed."""
    files = traces.write(tmp_path, pods, **(cluster or {}))
    return traces.plan(files, seeds=(seed,), timed=False, **settings)["strategies"]


def test_whole_gpu_rounds_every_share_up_to_a_gpu(tmp_path: Path, seed: int) -> None:
    # a-d are half GPUs, each rounded up to a GPU of its own, and e is whole: 5 GPUs, nodes of one GPU.
    row = run(tmp_path, HALVES, seed, strategies=("whole-gpu",))["whole-gpu"]
    assert (row["gpus_needed"], row["nodes_needed"], row["bound"]) == (5, 5, "GPU")
    # Everything bought is allocated, but half of each of a-d's GPUs backs no request: 4 × 0.5 of 5 GPUs.
    assert row["allocation_ratio"] == 100
    assert row["stranded_percent"] == 40
    assert row["stranded_gb"] == 32  # 4 × 8000 MiB, nominal GB
    assert (row["blast_radius_max"], row["blast_radius_mean"], row["tenants_per_busy_gpu"]) == (1, 1, 1)
    assert row["pods_per_gpu"] == 1 and row["sm_share"] is None and row["oversubscribed_pods"] == 0


@pytest.mark.parametrize(
    ("replicas", "gpus", "oversubscribed"),
    [
        # Two replicas a GPU: a-d take a replica each, two GPUs, and e keeps a whole GPU: 3.
        (2, 3, 0),
        # Four replicas: a-d fit on one GPU, e on another: 2 GPUs; each half-GPU pod asks for more than
        # the quarter its replica holds, so all four oversubscribe.
        (4, 2, 4),
    ],
)
def test_time_slicing_replicas_give_one_replica_whatever_is_asked(
    tmp_path: Path, seed: int, replicas: int, gpus: int, oversubscribed: int
) -> None:
    row = run(tmp_path, HALVES, seed, strategies=("time-slicing-replicas",), replicas=replicas)[
        "time-slicing-replicas"
    ]
    assert (row["gpus_needed"], row["oversubscribed_pods"]) == (gpus, oversubscribed)
    assert row["allocation_ratio"] == 100
    # With four replicas a pod's request is backed only up to its replica, and those fill the GPU.
    assert row["stranded_percent"] == 0
    assert row["blast_radius_max"] == 1


def test_oversubscription_counts_only_requests_above_a_replica(tmp_path: Path, seed: int) -> None:
    # Replicas of a quarter: 0.25 fits its replica, 0.26 and 0.9 do not. Four replicas on one GPU.
    pods = [share("small", 250), share("over", 260), share("big", 900), share("tiny", 10)]
    row = run(tmp_path, pods, seed, strategies=("time-slicing-replicas",), replicas=4)[
        "time-slicing-replicas"
    ]
    assert (row["gpus_needed"], row["oversubscribed_pods"]) == (1, 2)


def test_mig_without_mig_capable_gpus_is_whole_gpu(tmp_path: Path, seed: int) -> None:
    rows = run(tmp_path, HALVES, seed, strategies=("whole-gpu", "mig"))
    for key in ("gpus_needed", "nodes_needed", "allocation_ratio", "stranded_percent", "pods_per_gpu"):
        assert rows["mig"][key] == rows["whole-gpu"][key]


def test_mig_on_a100_rounds_to_profiles(tmp_path: Path, seed: int) -> None:
    # On A100-40GB a half GPU is exactly 3g.20gb (4 of 8 slices): a-d pair up on two GPUs, e takes 7g.40gb.
    row = run(tmp_path, HALVES, seed, strategies=("mig",), gpu_model="A100-40GB")["mig"]
    assert row["gpus_needed"] == 3 and row["stranded_percent"] == 0 and row["blast_radius_max"] == 1


def test_mig_rounding_strands_what_the_profile_adds(tmp_path: Path, seed: int) -> None:
    # On A100-40GB: 0.3 rounds up to 3g.20gb (0.5) and 0.2 to 1g.10gb (0.25); they share one GPU (slices
    # 4-7 and two of 0-3). Requested 0.5 of that GPU, so half of its 40 GB backs nothing: 20 GB, 50%.
    pods = [share("c", 300), share("d", 200)]
    row = run(tmp_path, pods, seed, strategies=("mig",), gpu_model="A100-40GB")["mig"]
    assert row["gpus_needed"] == 1
    assert row["allocated_gpus"] == 0.75
    assert (row["stranded_gb"], row["stranded_percent"]) == (20, 50)


def test_mig_slots_hold_fewer_than_memory_would(tmp_path: Path, seed: int) -> None:
    # Eight eighths: gpufrac fractions fill one GPU's memory exactly, but a 1g.5gb may start only at
    # slices 0-6, so MIG holds seven per GPU and needs a second one.
    pods = [share(f"p{i}", 125) for i in range(8)]
    rows = run(tmp_path, pods, seed, strategies=("mig", "fractions-time-slicing"), gpu_model="A100-40GB")
    assert rows["mig"]["gpus_needed"] == 2
    assert rows["fractions-time-slicing"]["gpus_needed"] == 1


def test_fractions_pack_memory_exactly(tmp_path: Path, seed: int) -> None:
    # Two halves fill a GPU: a-d on two GPUs, e on a third. Nothing is rounded up or left beside a tenant.
    rows = run(tmp_path, HALVES, seed, strategies=("fractions-time-slicing", "fractions-sm-sharing"))
    for row in rows.values():
        assert (row["gpus_needed"], row["allocation_ratio"], row["stranded_percent"]) == (3, 100, 0)
        assert row["pods_per_gpu"] == pytest.approx(5 / 3, abs=1e-4)
        assert row["tenants_per_busy_gpu"] == pytest.approx(5 / 3, abs=1e-4)
    # Time-slicing pods are each their own fault domain.
    assert rows["fractions-time-slicing"]["blast_radius_max"] == 1
    assert rows["fractions-time-slicing"]["sm_share"] is None
    # sm-sharing: two GPUs of two pods each share one fault domain each; e is alone. Domains 2, 2, 1.
    sm = rows["fractions-sm-sharing"]
    assert (sm["blast_radius_max"], sm["blast_radius_mean"]) == (2, pytest.approx(5 / 3, abs=1e-4))
    assert sm["sm_share"] == 0.5


@pytest.mark.parametrize(
    ("trusted_share", "gpus", "blast_max", "blast_mean"),
    [
        # Nobody trusted: time-slicing, as above.
        (0.0, 3, 1, 1.0),
        # Two of four trusted: they pair on one sm-sharing GPU, the untrusted two on a time-slicing one;
        # domains: the trusted pair, then c, d and e alone: 2, 1, 1, 1.
        (0.5, 3, 2, 1.25),
        # One trusted: its GPU is sm-sharing, so no untrusted half may join it; the three untrusted need
        # two GPUs: 1 + 2 + e = 4 GPUs, every pod alone.
        (0.25, 4, 1, 1.0),
        # Everyone trusted: sm-sharing, as above.
        (1.0, 3, 2, 5 / 3),
    ],
)
def test_fractions_mixed_keeps_one_mode_per_gpu(
    tmp_path: Path, seed: int, trusted_share: float, gpus: int, blast_max: int, blast_mean: float
) -> None:
    # One tenant: only the modes keep pods apart here (test_command.py counts what tenants cost).
    row = run(
        tmp_path, HALVES, seed, strategies=("fractions-mixed",), trusted_share=trusted_share, fault_domains=1
    )["fractions-mixed"]
    assert (row["gpus_needed"], row["blast_radius_max"]) == (gpus, blast_max)
    assert row["blast_radius_mean"] == pytest.approx(blast_mean, abs=1e-4)


def test_cpu_bound_workload_says_so(tmp_path: Path, seed: int) -> None:
    # Nodes of 2 GPUs and 4 cores; each pod wants a quarter GPU and 3 cores, so a node holds one pod:
    # 5 pods need 5 nodes, 10 GPUs, though their GPU memory would fit on two GPUs.
    pods = [share(f"p{i}", 250, cpu=3000) for i in range(5)]
    row = run(tmp_path, pods, seed, strategies=("fractions-time-slicing",), cluster={"gpus": 2, "cpu": 4000})[
        "fractions-time-slicing"
    ]
    assert (row["gpus_needed"], row["nodes_needed"], row["bound"]) == (10, 5, "CPU")
    assert row["busy_gpus"] == 5


def test_a_cluster_too_small_grows_with_copies_of_its_nodes(tmp_path: Path, seed: int) -> None:
    # Twelve whole-GPU pods on a node list of three one-GPU nodes: twelve nodes, copies included.
    pods = [whole(f"w{i}") for i in range(12)] + [cpu_only("c")]
    row = run(tmp_path, pods, seed, strategies=("whole-gpu",), cluster={"nodes": 3})["whole-gpu"]
    assert (row["gpus_needed"], row["nodes_needed"]) == (12, 12)


def test_multi_gpu_pods_need_a_node_with_that_many_free(tmp_path: Path, seed: int) -> None:
    # Nodes of 4 GPUs. Two pods of 3 whole GPUs cannot share a node (6 > 4): 2 nodes, 8 GPUs bought,
    # 6 busy; a half-GPU pod fits beside either. Under whole-gpu it takes one of the spare GPUs.
    pods = [whole("x", 3), whole("y", 3), share("h", 500)]
    rows = run(tmp_path, pods, seed, strategies=("whole-gpu", "fractions-sm-sharing"), cluster={"gpus": 4})
    for row in rows.values():
        assert (row["gpus_needed"], row["nodes_needed"]) == (8, 2)
    assert rows["whole-gpu"]["busy_gpus"] == 7
