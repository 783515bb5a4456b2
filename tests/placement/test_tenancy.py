"""What a queue holds and asks (`placement.tenancy`), and the reclaim rule worked out by hand: a queue may
reclaim only within its quota, only the resources it has a quota of, and only from a queue whose surplus
over its fair share covers the victim."""

from __future__ import annotations

from gpufrac.cluster.state import ClusterState
from gpufrac.contract.queues import Entitlement, QueueSpec, Resource
from gpufrac.placement import tenancy

from ..cluster.builders import GPU_MIB, node, share_at, share_pod, whole_at, whole_pod

GPUS, MEMORY = Resource.GPUS, Resource.GPU_MEMORY


def test_a_placement_counts_whole_gpus_and_shares_memory_and_the_part_of_their_gpus() -> None:
    state = ClusterState([node("n0", 2)])
    assert tenancy.held(whole_at("w", "n0", (0, 1)), state) == {
        MEMORY: 0.0,
        GPUS: 2.0,
        Resource.CPU: 0.0,
        Resource.MEMORY: 0.0,
    }
    # A share on two GPUs holds its memory on each, and that part of each GPU (as fractions count in KAI).
    share = share_at("s", "n0", (0, 1), GPU_MIB // 4, cpu=500, mem=1024)
    assert tenancy.held(share, state) == {
        MEMORY: GPU_MIB / 2,
        GPUS: 0.5,
        Resource.CPU: 500.0,
        Resource.MEMORY: 1024.0,
    }
    # On a node the state does not know, its GPU's size is unknown: its memory counts, no part of a GPU.
    assert tenancy.held(share_at("s", "gone", (0,), 4000), state)[GPUS] == 0.0


def test_a_pending_share_is_resolved_on_the_reference_gpu() -> None:
    asked = tenancy.asked(share_pod("s", 250, devices=2, cpu=100), reference_gpu_mib=32_000)
    assert asked == {MEMORY: 16_000.0, GPUS: 0.5, Resource.CPU: 100.0, Resource.MEMORY: 0.0}
    assert tenancy.asked(whole_pod("w", 3), 32_000)[GPUS] == 3.0
    assert tenancy.asked(share_pod("s", 250), 0)[GPUS] == 0.0  # no GPU in the cluster: no part of one


def test_capacity_counts_active_nodes_only() -> None:
    state = ClusterState([node("n0", 2), node("n1", 1, cpu=8000)])
    state.remove_node("n1")
    assert tenancy.capacity(state) == {
        MEMORY: 2.0 * GPU_MIB,
        GPUS: 2.0,
        Resource.CPU: 64_000.0,
        Resource.MEMORY: 262_144.0,
    }


def queue(**quotas: int) -> QueueSpec:
    return QueueSpec("q", resources={Resource(name): Entitlement(quota) for name, quota in quotas.items()})


SCARCE = set(Resource)


def test_a_queue_reclaims_only_within_its_quota() -> None:
    spec = queue(gpus=4)
    assert tenancy.reclaiming(spec, {GPUS: 3.0}, {GPUS: 1.0, Resource.CPU: 100.0}, SCARCE) == {GPUS}
    assert tenancy.reclaiming(spec, {GPUS: 3.0}, {GPUS: 2.0}, SCARCE) == set()  # past the quota with the pod


def test_a_queue_reclaims_only_resources_it_has_a_quota_of() -> None:
    spec = queue(gpus=4)
    assert tenancy.reclaiming(spec, {}, {MEMORY: 8000.0}, SCARCE) == set()
    both = queue(gpus=4, gpuMemory=16_000)
    assert tenancy.reclaiming(both, {MEMORY: 8000.0}, {MEMORY: 8000.0, GPUS: 1.0}, SCARCE) == {MEMORY, GPUS}
    assert tenancy.reclaiming(both, {MEMORY: 8001.0}, {MEMORY: 8000.0, GPUS: 1.0}, SCARCE) == set()


def test_a_queue_reclaims_only_resources_the_queues_ask_more_of_than_the_cluster_has() -> None:
    spec = queue(gpus=4, cpu=8000)
    capacity = {GPUS: 2.0, Resource.CPU: 64_000.0}
    demand = {"a": {GPUS: 2.0, Resource.CPU: 2000.0}, "b": {GPUS: 1.0, Resource.CPU: 1000.0}}
    scarce = tenancy.contested(capacity, demand)
    assert scarce == {GPUS}  # 3 GPUs asked of 2; CPU to spare, so every queue's share of it is its demand
    assert tenancy.reclaiming(spec, {}, {GPUS: 1.0, Resource.CPU: 1000.0}, scarce) == {GPUS}
    assert tenancy.contested(capacity, {"a": {GPUS: 2.0}}) == set()  # it fits: waiting is for packing
    assert tenancy.reclaiming(spec, {}, {GPUS: 1.0}, set()) == set()


def test_a_pod_never_evicted_holds_only_what_its_queue_is_guaranteed() -> None:
    spec = queue(gpus=2, cpu=4000)
    assert tenancy.unguaranteed(spec, {GPUS: 1.0}, {GPUS: 1.0, Resource.CPU: 500.0}) is None
    assert tenancy.unguaranteed(spec, {GPUS: 1.5}, {GPUS: 1.0}) is GPUS  # past the quota with the pod
    assert tenancy.unguaranteed(spec, {Resource.CPU: 3800.0}, {Resource.CPU: 500.0}) is Resource.CPU
    assert tenancy.unguaranteed(queue(), {}, {Resource.CPU: 500.0}) is None  # no GPUs: no quota needed
    assert tenancy.unguaranteed(queue(), {}, {GPUS: 0.5, MEMORY: 8000.0}) is GPUS  # no GPU quota at all
    memory_only = queue(gpuMemory=16_000)  # a share is held to the GPU quota its queue has
    assert tenancy.unguaranteed(memory_only, {MEMORY: 8000.0}, {GPUS: 0.5, MEMORY: 8000.0}) is None
    assert tenancy.unguaranteed(memory_only, {MEMORY: 8001.0}, {GPUS: 0.5, MEMORY: 8000.0}) is MEMORY


def test_a_victim_is_offered_only_from_a_surplus_over_the_fair_share() -> None:
    usage, share = {GPUS: 5.0, MEMORY: 1000.0}, {GPUS: 3.0, MEMORY: 0.0}
    assert tenancy.surplus_covers(usage, share, {GPUS: 2.0}, {GPUS})
    assert not tenancy.surplus_covers(usage, share, {GPUS: 3.0}, {GPUS})
    assert tenancy.surplus_covers(usage, share, {GPUS: 3.0}, {MEMORY})  # judged in contested resources only


def test_over_share_is_over_in_any_resource() -> None:
    assert tenancy.over_share({GPUS: 2.0, MEMORY: 1.0}, {GPUS: 4.0, MEMORY: 0.5})
    assert not tenancy.over_share({GPUS: 4.0}, {GPUS: 4.0})
    assert not tenancy.over_share({}, {})
